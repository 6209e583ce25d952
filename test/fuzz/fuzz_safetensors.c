/*
 * fuzz_safetensors.c - safetensors files (llmc/formats/safetensors.c: safetensors_open_file, which reads
 * the 8-byte header length and parses the JSON header with safetensors_parse_header, then
 * safetensors_read_f32 of every F32/BF16/F16 tensor), as -e DIR and ./hf_convert read them.
 *
 * Promises checked: a bad file is a clean error (exit 1, through fuzz_call); in a file that is
 * accepted the header length fits the file, names are distinct and sorted (safetensors_find finds
 * each), every tensor's shape x dtype size is its byte span, and the spans tile the data section
 * exactly; every readable tensor loads as its stored bytes (BF16 widened, F16 converted exactly:
 * checked against an independent conversion through the exponent).
 */
#include "llmc/formats/safetensors.h"
#include "test/fuzz/fuzz.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float half_value(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
    float v = exp == 0 ? ldexpf((float)man, -24) : exp == 31 ? (man ? NAN : INFINITY) : ldexpf((float)(man | 1024), exp - 25);
    return sign ? -v : v;
}

static void load(void *arg) {
    const FuzzFile *in = arg;
    Safetensors *st = safetensors_open_file(in->path);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | in->data[i];
    if (st->num_files != 1 || st->files[0].data_start != 8 + hlen || st->files[0].size != in->size || 8 + hlen > in->size)
        fuzz_fail("accepted a %zu-byte file with header length %llu", in->size, (unsigned long long)hlen);
    const uint64_t data_size = in->size - 8 - hlen, base = 8 + hlen;
    uint64_t covered = 0;
    for (int i = 0; i < st->num_tensors; i++) {
        const StTensor *t = &st->tensors[i];
        if (i > 0 && strcmp(st->tensors[i - 1].name, t->name) >= 0) fuzz_fail("names not distinct and sorted");
        if (safetensors_find(st, t->name) != t) fuzz_fail("safetensors_find misses '%s'", t->name);
        if (t->end > data_size || t->begin > t->end) fuzz_fail("tensor '%s' outside the data section", t->name);
        if ((t->end - t->begin) != safetensors_numel(t) * safetensors_dtype_size(t->dtype))
            fuzz_fail("tensor '%s': span != shape x dtype size", t->name);
        covered += t->end - t->begin;
    }
    if (covered != data_size) fuzz_fail("tensors cover %llu of %llu data bytes", (unsigned long long)covered,
                                        (unsigned long long)data_size);
    for (int i = 0; i < st->num_tensors; i++) {
        const StTensor *t = &st->tensors[i];
        if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16) continue;
        uint64_t n = safetensors_numel(t);
        float *x = malloc((size_t)n * sizeof(float) + 1);
        safetensors_read_f32(st, t, x);
        const uint8_t *p = in->data + base + t->begin;
        for (uint64_t j = 0; j < n; j++) {
            float want;
            if (t->dtype == ST_F32) {
                memcpy(&want, p + 4 * j, 4);
            } else {
                uint16_t h;
                memcpy(&h, p + 2 * j, 2);
                uint32_t u = (uint32_t)h << 16;
                if (t->dtype == ST_BF16) memcpy(&want, &u, 4);
                else want = half_value(h);
            }
            if (memcmp(&want, &x[j], 4) != 0 && !(isnan(want) && isnan(x[j])))
                fuzz_fail("tensor '%s' element %llu was not loaded as stored", t->name, (unsigned long long)j);
        }
        free(x);
    }
    safetensors_close(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fuzz_file_target("model.safetensors", data, size, load);
}
