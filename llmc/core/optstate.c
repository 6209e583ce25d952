#include "llmc/core/optstate.h"
#include "llmc/core/check.h"

#include <string.h>

int optstate_parse(const char *name) {
    static const char *const names[] = {"fp32", "bf16", "int8"};
    for (int i = 0; i < 3; i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

const char *optstate_name(int type) { return type == OPTSTATE_BF16 ? "bf16" : type == OPTSTATE_INT8 ? "int8" : "fp32"; }

size_t optstate_bytes(size_t k, int type) {
    if (type == OPTSTATE_BF16) return k * sizeof(uint16_t);
    if (type == OPTSTATE_INT8) return optstate_blocks(k) * sizeof(float) + k;
    return k * sizeof(float);
}

/* int8 layout: the scales (one float per block), then the codes */
static float *q8_scales(const void *state) { return (float *)state; }
static uint8_t *q8_codes(const void *state, size_t k) { return (uint8_t *)state + optstate_blocks(k) * sizeof(float); }

void optstate_load_block(const void *state, int type, int is_v, size_t k, size_t block, float *x) {
    const size_t j0 = block * OPTSTATE_BLOCK, count = k - j0 < OPTSTATE_BLOCK ? k - j0 : OPTSTATE_BLOCK;
    if (type == OPTSTATE_FP32) {
        memcpy(x, (const float *)state + j0, count * sizeof(float));
    } else if (type == OPTSTATE_BF16) {
        const uint16_t *s = (const uint16_t *)state + j0;
        for (size_t j = 0; j < count; j++) x[j] = bf16_to_float(s[j]);
    } else {
        const float a = q8_scales(state)[block];
        const uint8_t *q = q8_codes(state, k) + j0;
        if (is_v)
            for (size_t j = 0; j < count; j++) x[j] = optstate_q8v_decode(q[j], a);
        else
            for (size_t j = 0; j < count; j++) x[j] = optstate_q8m_decode((int8_t)q[j], a);
    }
}

void optstate_store_block(void *state, int type, int is_v, size_t k, size_t block, const float *x) {
    const size_t j0 = block * OPTSTATE_BLOCK, count = k - j0 < OPTSTATE_BLOCK ? k - j0 : OPTSTATE_BLOCK;
    if (type == OPTSTATE_FP32) {
        memcpy((float *)state + j0, x, count * sizeof(float));
    } else if (type == OPTSTATE_BF16) {
        uint16_t *s = (uint16_t *)state + j0;
        for (size_t j = 0; j < count; j++) s[j] = float_to_bf16(x[j]);
    } else {
        float a = 0.0f;
        for (size_t j = 0; j < count; j++) {
            float t = optstate_q8_scale_term(x[j], is_v);
            a = t > a ? t : a;
        }
        q8_scales(state)[block] = a;
        uint8_t *q = q8_codes(state, k) + j0;
        if (is_v)
            for (size_t j = 0; j < count; j++) q[j] = optstate_q8v_encode(x[j], a);
        else
            for (size_t j = 0; j < count; j++) q[j] = (uint8_t)optstate_q8m_encode(x[j], a);
    }
}

void optstate_decode(const void *state, int type, int is_v, size_t k, float *x) {
    const long long nb = (long long)optstate_blocks(k);
#pragma omp parallel for schedule(static)
    for (long long b = 0; b < nb; b++) optstate_load_block(state, type, is_v, k, (size_t)b, x + (size_t)b * OPTSTATE_BLOCK);
}

void optstate_encode(void *state, int type, int is_v, size_t k, const float *x) {
    const long long nb = (long long)optstate_blocks(k);
#pragma omp parallel for schedule(static)
    for (long long b = 0; b < nb; b++) optstate_store_block(state, type, is_v, k, (size_t)b, x + (size_t)b * OPTSTATE_BLOCK);
}

void optstate_segments(OptSegments *s, const TensorSpec *specs, int nspecs, size_t lo, size_t hi, float weight_decay) {
    memset(s, 0, sizeof *s);
    for (int i = 0; i < nspecs; i++) {
        size_t a = specs[i].offset > lo ? specs[i].offset : lo;
        size_t b = specs[i].offset + specs[i].numel < hi ? specs[i].offset + specs[i].numel : hi;
        if (a >= b) continue;
        if (s->count == OPTSTATE_MAX_SEGMENTS) llmc_die("optstate_segments: more than %d parameter tensors", OPTSTATE_MAX_SEGMENTS);
        s->end[s->count] = b - lo;
        s->decay[s->count] = specs[i].decay ? weight_decay : 0.0f;
        s->count++;
    }
}

void optstate_to_bf16(uint16_t *dst, const float *src, size_t n) {
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)n; i++) dst[i] = float_to_bf16(src[i]);
}

void optstate_from_bf16(float *dst, const uint16_t *src, size_t n) {
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)n; i++) dst[i] = bf16_to_float(src[i]);
}
