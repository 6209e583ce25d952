/*
 * safetensors.c - see safetensors.h. The JSON is parsed by cJSON (Debian: libcjson-dev); every
 * cJSON tree is freed before an error is reported, so an error exit never holds one.
 */
#include "llmc/formats/safetensors.h"

#if LLMC_HAVE_CJSON
#include "llmc/core/atomicfile.h"
#include "llmc/core/check.h"
#include "llmc/core/dtype.h"
#include "llmc/core/sumfile.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const struct {
    const char *name;
    size_t size;
} dtypes[ST_NUM_DTYPES] = {
    [ST_BOOL] = {"BOOL", 1}, [ST_U8] = {"U8", 1},       [ST_I8] = {"I8", 1},         [ST_F8_E5M2] = {"F8_E5M2", 1},
    [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_I16] = {"I16", 2}, [ST_U16] = {"U16", 2},   [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2}, [ST_I32] = {"I32", 4},     [ST_U32] = {"U32", 4},       [ST_F32] = {"F32", 4},
    [ST_F64] = {"F64", 8},   [ST_I64] = {"I64", 8},     [ST_U64] = {"U64", 8},
};

const char *safetensors_dtype_name(int dtype) { return dtype >= 0 && dtype < ST_NUM_DTYPES ? dtypes[dtype].name : "?"; }
size_t safetensors_dtype_size(int dtype) { return dtype >= 0 && dtype < ST_NUM_DTYPES ? dtypes[dtype].size : 0; }

uint64_t safetensors_numel(const StTensor *t) {
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d]; /* checked against overflow when parsed */
    return n;
}

/* An exact non-negative integer (JSON numbers are doubles here: at most 2^53). */
static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d > 9007199254740992.0 || d != floor(d)) return -1;
    *out = (uint64_t)d;
    return 0;
}

void safetensors_free_tensors(StTensor *t, int n) {
    for (int i = 0; t && i < n; i++) free(t[i].name);
    free(t);
}

/* One header entry "name": {"dtype", "shape", "data_offsets"} into t (name not yet set). */
static int parse_entry(const cJSON *e, StTensor *t, uint64_t data_size, const char *file, char *err, size_t errlen) {
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return errf(err, errlen, "safetensors file '%s': tensor '%.200s' is not an object with dtype, shape and "
                    "data_offsets", file, name);
    const cJSON *dtype = NULL, *shape = NULL, *offsets = NULL, *f;
    cJSON_ArrayForEach(f, e) {
        const cJSON **slot = strcmp(f->string, "dtype") == 0 ? &dtype : strcmp(f->string, "shape") == 0 ? &shape
                             : strcmp(f->string, "data_offsets") == 0 ? &offsets : NULL;
        if (!slot)
            return errf(err, errlen, "safetensors file '%s': tensor '%.200s' has an unknown field '%.100s' (a tensor "
                        "has dtype, shape and data_offsets)", file, name, f->string);
        if (*slot)
            return errf(err, errlen, "safetensors file '%s': tensor '%.200s' has field '%s' twice", file, name, f->string);
        *slot = f;
    }
    if (!dtype || !shape || !offsets)
        return errf(err, errlen, "safetensors file '%s': tensor '%.200s' lacks its %s", file, name,
                    !dtype ? "dtype" : !shape ? "shape" : "data_offsets");
    if (!cJSON_IsString(dtype))
        return errf(err, errlen, "safetensors file '%s': tensor '%.200s': dtype is not a string", file, name);
    t->dtype = -1;
    for (int d = 0; d < ST_NUM_DTYPES; d++)
        if (strcmp(dtype->valuestring, dtypes[d].name) == 0) t->dtype = d;
    if (t->dtype < 0)
        return errf(err, errlen, "safetensors file '%s': tensor '%.200s' has unknown dtype '%.40s' (known: BOOL, U8, "
                    "I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64)", file, name,
                    dtype->valuestring);
    int ndim = cJSON_IsArray(shape) ? cJSON_GetArraySize(shape) : -1;
    if (ndim < 0 || ndim > ST_MAX_DIMS)
        return errf(err, errlen, "safetensors file '%s': tensor '%.200s': shape is %s", file, name,
                    ndim < 0 ? "not an array" : "an array of more than 8 dimensions");
    t->ndim = ndim;
    uint64_t numel = 1;
    int d = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, shape) {
        uint64_t dim;
        if (json_uint(v, &dim) != 0)
            return errf(err, errlen, "safetensors file '%s': tensor '%.200s': shape[%d] is not a non-negative integer "
                        "(at most 2^53)", file, name, d);
        t->shape[d++] = (int64_t)dim;
        if (__builtin_mul_overflow(numel, dim, &numel))
            return errf(err, errlen, "safetensors file '%s': tensor '%.200s': its shape's element count overflows "
                        "64 bits", file, name);
    }
    uint64_t bytes;
    if (__builtin_mul_overflow(numel, (uint64_t)dtypes[t->dtype].size, &bytes))
        return errf(err, errlen, "safetensors file '%s': tensor '%.200s': its size in bytes overflows 64 bits", file, name);
    if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2 || json_uint(offsets->child, &t->begin) != 0 ||
        json_uint(offsets->child->next, &t->end) != 0)
        return errf(err, errlen, "safetensors file '%s': tensor '%.200s': data_offsets is not a pair of non-negative "
                    "integers [begin, end]", file, name);
    if (t->begin > t->end)
        return errf(err, errlen, "safetensors file '%s': tensor '%.200s': data_offsets [%llu, %llu] end before they "
                    "begin", file, name, (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end - t->begin != bytes)
        return errf(err, errlen, "safetensors file '%s': tensor '%.200s': data_offsets [%llu, %llu] span %llu bytes, "
                    "but its shape and dtype (%s) need %llu", file, name, (unsigned long long)t->begin,
                    (unsigned long long)t->end, (unsigned long long)(t->end - t->begin), dtypes[t->dtype].name,
                    (unsigned long long)bytes);
    if (t->end > data_size)
        return errf(err, errlen, "safetensors file '%s': tensor '%.200s': data_offsets [%llu, %llu] reach past the "
                    "data section's %llu bytes: the file is truncated", file, name, (unsigned long long)t->begin,
                    (unsigned long long)t->end, (unsigned long long)data_size);
    return 0;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const StTensor *)a)->name, ((const StTensor *)b)->name);
}
static int by_offsets(const void *a, const void *b, void *tensors) {
    const StTensor *x = &((const StTensor *)tensors)[*(const int *)a], *y = &((const StTensor *)tensors)[*(const int *)b];
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* The tensors (sorted by name) must have distinct names and tile [0, data_size) exactly. */
static int check_layout(StTensor *t, int n, uint64_t data_size, const char *file, char *err, size_t errlen) {
    for (int i = 1; i < n; i++)
        if (strcmp(t[i - 1].name, t[i].name) == 0)
            return errf(err, errlen, "safetensors file '%s': tensor '%.200s' appears twice in the header", file, t[i].name);
    int *order = (int *)mallocCheck((size_t)(n ? n : 1) * sizeof(int), "safetensors layout check");
    for (int i = 0; i < n; i++) order[i] = i;
    qsort_r(order, (size_t)n, sizeof(int), by_offsets, t);
    uint64_t at = 0;
    int rc = 0;
    for (int k = 0; k < n && rc == 0; k++) {
        const StTensor *x = &t[order[k]];
        if (x->begin < at)
            rc = errf(err, errlen, "safetensors file '%s': tensors '%.200s' and '%.200s' overlap (data_offsets [%llu, "
                      "%llu] and [%llu, %llu])", file, t[order[k - 1]].name, x->name,
                      (unsigned long long)t[order[k - 1]].begin, (unsigned long long)t[order[k - 1]].end,
                      (unsigned long long)x->begin, (unsigned long long)x->end);
        else if (x->begin > at)
            rc = errf(err, errlen, "safetensors file '%s': bytes [%llu, %llu] of the data section, before tensor "
                      "'%.200s', belong to no tensor", file, (unsigned long long)at, (unsigned long long)x->begin,
                      x->name);
        at = x->end;
    }
    free(order);
    if (rc == 0 && at != data_size)
        rc = errf(err, errlen, "safetensors file '%s': its data section has %llu bytes after the last tensor, which "
                  "belong to no tensor", file, (unsigned long long)(data_size - at));
    return rc;
}

int safetensors_parse_header(const char *json, size_t len, uint64_t data_size, const char *file, StTensor **out,
                             int *n, char *err, size_t errlen) {
    *out = NULL;
    *n = 0;
    if (len < 2 || json[0] != '{')
        return errf(err, errlen, "safetensors file '%s': the header does not start with a JSON object ('{')", file);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t at = end && end >= json && end <= json + len ? (size_t)(end - json) : 0;
        return errf(err, errlen, "safetensors file '%s': the header is not valid JSON (near byte %zu of %zu)", file, at,
                    len);
    }
    for (const char *p = end; p < json + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            return errf(err, errlen, "safetensors file '%s': the header has bytes other than spaces after its JSON "
                        "object (at byte %zu of %zu)", file, (size_t)(p - json), len);
        }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return errf(err, errlen, "safetensors file '%s': the header is not a JSON object", file);
    }
    int count = 0, metadata = 0, rc = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) count++;
    StTensor *t = (StTensor *)calloc((size_t)(count ? count : 1), sizeof(StTensor));
    if (!t) {
        cJSON_Delete(root);
        return errf(err, errlen, "safetensors file '%s': out of memory for %d header entries", file, count);
    }
    int k = 0;
    cJSON_ArrayForEach(e, root) {
        if (strcmp(e->string, "__metadata__") == 0) {
            const cJSON *m, *values = NULL;
            if (metadata++) rc = errf(err, errlen, "safetensors file '%s': __metadata__ appears twice", file);
            else if (!cJSON_IsObject(e)) rc = errf(err, errlen, "safetensors file '%s': __metadata__ is not an object", file);
            else values = e;
            cJSON_ArrayForEach(m, values) {
                if (!cJSON_IsString(m)) {
                    rc = errf(err, errlen, "safetensors file '%s': __metadata__ value '%.100s' is not a string", file,
                              m->string);
                    break;
                }
            }
        } else {
            rc = parse_entry(e, &t[k], data_size, file, err, errlen);
            if (rc == 0) t[k].name = strdup(e->string);
            if (rc == 0 && !t[k].name) rc = errf(err, errlen, "safetensors file '%s': out of memory", file);
            if (rc == 0) k++;
        }
        if (rc) break;
    }
    cJSON_Delete(root);
    if (rc == 0) {
        qsort(t, (size_t)k, sizeof *t, by_name);
        rc = check_layout(t, k, data_size, file, err, errlen);
    }
    if (rc) {
        safetensors_free_tensors(t, k);
        return -1;
    }
    *out = t;
    *n = k;
    return 0;
}

/* ---- opening files ------------------------------------------------------------------------- */
static FILE *open_regular_or_die(const char *path, const char *what) {
    char err[4400];
    FILE *f = fopen_regular(path, err, sizeof err);
    if (!f) llmc_die("%s: %s", what, err);
    return f;
}

static uint64_t file_bytes(FILE *f) {
    struct stat st;
    return fstat(fileno(f), &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* Reads and checks one file's header; fills file and returns its tensors (sorted by name). */
static StTensor *read_header(const char *path, StFile *file, int *n) {
    FILE *f = open_regular_or_die(path, "safetensors file");
    uint64_t size = file_bytes(f);
    unsigned char le[8];
    if (size < 8 || fread(le, 1, 8, f) != 8)
        llmc_die("safetensors file '%s' is %llu bytes: too short for one (an 8-byte header length comes first)", path,
                 (unsigned long long)size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | le[i];
    if (hlen > ST_MAX_HEADER)
        llmc_die("safetensors file '%s': header length %llu exceeds the format's 100 MB limit (not a safetensors file, "
                 "or a damaged one)", path, (unsigned long long)hlen);
    if (hlen > size - 8)
        llmc_die("safetensors file '%s': header length %llu runs past the end of the file (%llu bytes): the file is "
                 "truncated or not a safetensors file", path, (unsigned long long)hlen, (unsigned long long)size);
    char *json = (char *)mallocCheck(hlen ? hlen : 1, "safetensors header");
    if (fread(json, 1, hlen, f) != hlen) llmc_die("safetensors file '%s': cannot read its header", path);
    fclose(f);
    StTensor *t;
    char err[1024];
    int rc = safetensors_parse_header(json, hlen, size - 8 - hlen, path, &t, n, err, sizeof err);
    free(json);
    if (rc != 0) llmc_die("%s", err);
    file->path = strdup(path);
    if (!file->path) llmc_die("out of memory");
    file->data_start = 8 + hlen;
    file->size = size;
    return t;
}

Safetensors *safetensors_open_file(const char *path) {
    Safetensors *st = (Safetensors *)callocCheck(1, sizeof *st, "safetensors");
    st->files = (StFile *)callocCheck(1, sizeof(StFile), "safetensors files");
    st->num_files = 1;
    st->tensors = read_header(path, &st->files[0], &st->num_tensors);
    return st;
}

void safetensors_close(Safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->num_files; i++) free(st->files[i].path);
    free(st->files);
    safetensors_free_tensors(st->tensors, st->num_tensors);
    free(st);
}

const StTensor *safetensors_find(const Safetensors *st, const char *name) {
    StTensor key = {.name = (char *)name};
    return (const StTensor *)bsearch(&key, st->tensors, (size_t)st->num_tensors, sizeof key, by_name);
}

/* ---- sharded sets ---------------------------------------------------------------------------- */
typedef struct {
    char *name, *file;
} MapEntry;

static int map_by_name(const void *a, const void *b) {
    return strcmp(((const MapEntry *)a)->name, ((const MapEntry *)b)->name);
}

static void free_map(MapEntry *map, int n) {
    for (int i = 0; i < n; i++) free(map[i].name), free(map[i].file);
    free(map);
}

/* The index's weight_map, sorted by tensor name. Dies naming the index on anything wrong. */
static MapEntry *read_index(const char *index, int *n) {
    FILE *f = open_regular_or_die(index, "safetensors index");
    uint64_t size = file_bytes(f);
    if (size > ST_MAX_HEADER) llmc_die("safetensors index '%s' is %llu bytes, over 100 MB", index, (unsigned long long)size);
    char *text = (char *)mallocCheck(size ? size : 1, "safetensors index");
    if (fread(text, 1, size, f) != size) llmc_die("cannot read safetensors index '%s'", index);
    fclose(f);
    cJSON *root = cJSON_ParseWithLength(text, size);
    free(text);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    char err[1024] = "";
    if (!root) snprintf(err, sizeof err, "is not valid JSON");
    else if (!cJSON_IsObject(wm)) snprintf(err, sizeof err, "has no \"weight_map\" object");
    int count = 0;
    const cJSON *e;
    if (!err[0]) cJSON_ArrayForEach(e, wm) count++;
    MapEntry *map = (MapEntry *)callocCheck((size_t)(count ? count : 1), sizeof(MapEntry), "safetensors index");
    int k = 0;
    if (!err[0])
        cJSON_ArrayForEach(e, wm) {
            const char *v = cJSON_IsString(e) ? e->valuestring : NULL;
            if (!v || !v[0] || strchr(v, '/') || strcmp(v, ".") == 0 || strcmp(v, "..") == 0) {
                snprintf(err, sizeof err, "maps tensor '%.200s' to %s%.200s%s, not the name of a file beside it",
                         e->string, v ? "'" : "", v ? v : "a non-string", v ? "'" : "");
                break;
            }
            map[k].name = strdup(e->string);
            map[k].file = strdup(v);
            if (!map[k].name || !map[k].file) llmc_die("out of memory");
            k++;
        }
    cJSON_Delete(root);
    if (err[0]) llmc_die("safetensors index '%s' %s", index, err);
    if (k == 0) llmc_die("safetensors index '%s' has an empty weight_map", index);
    qsort(map, (size_t)k, sizeof *map, map_by_name);
    for (int i = 1; i < k; i++)
        if (strcmp(map[i - 1].name, map[i].name) == 0)
            llmc_die("safetensors index '%s' lists tensor '%.200s' twice in its weight_map", index, map[i].name);
    *n = k;
    return map;
}

static Safetensors *open_sharded(const char *dir, const char *index) {
    int nmap;
    MapEntry *map = read_index(index, &nmap);
    Safetensors *st = (Safetensors *)callocCheck(1, sizeof *st, "safetensors");
    st->files = (StFile *)callocCheck((size_t)nmap, sizeof(StFile), "safetensors files");
    for (int i = 0; i < nmap; i++) {
        int known = 0;
        for (int j = 0; j < st->num_files && !known; j++) known = strcmp(strrchr(st->files[j].path, '/') + 1, map[i].file) == 0;
        if (known) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, map[i].file);
        int n;
        StFile *file = &st->files[st->num_files];
        StTensor *t = read_header(path, file, &n);
        for (int j = 0; j < n; j++) {
            MapEntry key = {.name = t[j].name}, *m = (MapEntry *)bsearch(&key, map, (size_t)nmap, sizeof key, map_by_name);
            if (!m)
                llmc_die("safetensors file '%s' holds tensor '%.200s', which the index '%s' does not list", path,
                         t[j].name, index);
            if (strcmp(m->file, map[i].file) != 0)
                llmc_die("safetensors file '%s' holds tensor '%.200s', which the index '%s' maps to '%s'", path,
                         t[j].name, index, m->file);
            t[j].file = st->num_files;
        }
        st->tensors = (StTensor *)realloc(st->tensors, (size_t)(st->num_tensors + n) * sizeof(StTensor));
        if (!st->tensors) llmc_die("out of memory");
        memcpy(st->tensors + st->num_tensors, t, (size_t)n * sizeof(StTensor));
        free(t);
        st->num_tensors += n;
        st->num_files++;
    }
    qsort(st->tensors, (size_t)st->num_tensors, sizeof(StTensor), by_name);
    /* each shard's tensors were matched to the map: what remains is a map entry no shard holds */
    for (int i = 0; i < nmap; i++)
        if (!safetensors_find(st, map[i].name))
            llmc_die("safetensors index '%s' maps tensor '%.200s' to '%s/%s', which does not hold it", index,
                     map[i].name, dir, map[i].file);
    free_map(map, nmap);
    return st;
}

Safetensors *safetensors_open_dir(const char *dir) {
    char single[4400], index[4400];
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    struct stat sb;
    /* lstat: a name that is there but cannot be read (a symbolic link loop, a FIFO) is opened, and
     * its reader says what is wrong with it, instead of calling the directory empty */
    if (lstat(single, &sb) == 0) return safetensors_open_file(single);
    if (lstat(index, &sb) == 0) return open_sharded(dir, index);
    char other[4400];
    snprintf(other, sizeof other, "%s/pytorch_model.bin", dir);
    llmc_die("'%s' holds neither model.safetensors nor model.safetensors.index.json%s", dir,
             lstat(other, &sb) == 0 ? " (pytorch_model.bin is not read: save the model as safetensors)" : "");
}

/* ---- reading and writing data -------------------------------------------------------------- */
static float f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, u;
    if (exp == 0) {
        float x = (float)man * 0x1p-24f; /* zero or subnormal: man * 2^-24, exact in fp32 */
        memcpy(&u, &x, 4);
        u |= sign;
    } else if (exp == 31) {
        u = sign | 0x7F800000u | (man << 13); /* inf, NaN */
    } else {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float x;
    memcpy(&x, &u, 4);
    return x;
}

void safetensors_read_f32(const Safetensors *st, const StTensor *t, float *dst) {
    const StFile *file = &st->files[t->file];
    if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16)
        llmc_die("safetensors file '%s': tensor '%.200s' has dtype %s; only F32, BF16 and F16 can be read", file->path,
                 t->name, dtypes[t->dtype].name);
    FILE *f = open_regular_or_die(file->path, "safetensors file");
    uint64_t numel = safetensors_numel(t);
    size_t esize = dtypes[t->dtype].size;
    int ok = file_bytes(f) == file->size && fseeko(f, (off_t)(file->data_start + t->begin), SEEK_SET) == 0;
    if (ok && t->dtype == ST_F32) {
        ok = fread(dst, 4, numel, f) == numel;
    } else if (ok) {
        enum { CHUNK = 1 << 16 };
        uint16_t *buf = (uint16_t *)mallocCheck(CHUNK * sizeof(uint16_t), "safetensors read buffer");
        for (uint64_t i = 0; ok && i < numel; i += CHUNK) {
            size_t n = numel - i < CHUNK ? (size_t)(numel - i) : CHUNK;
            ok = fread(buf, esize, n, f) == n;
            for (size_t j = 0; ok && j < n; j++) dst[i + j] = t->dtype == ST_BF16 ? bf16_to_float(buf[j]) : f16_to_float(buf[j]);
        }
        free(buf);
    }
    fclose(f);
    if (!ok)
        llmc_die("safetensors file '%s' changed since it was opened (reading tensor '%.200s' failed): the file is "
                 "being rewritten or was truncated", file->path, t->name);
}

static uint32_t write_bytes(AtomicFile *af, uint32_t crc, const void *p, size_t n) {
    fwriteCheck(p, 1, n, af->f, af->tmp_path);
    return sumfile_crc_update(crc, p, n);
}

uint32_t safetensors_write(const char *path, const StWriteTensor *tensors, int n, int dtype, uint64_t *bytes) {
    return safetensors_write_meta(path, tensors, n, dtype, NULL, bytes);
}

uint32_t safetensors_write_meta(const char *path, const StWriteTensor *tensors, int n, int dtype, const char *const *meta_kv,
                                uint64_t *bytes) {
    llmcCheck(dtype == ST_F32 || dtype == ST_BF16, "safetensors_write writes F32 or BF16");
    const size_t esize = dtypes[dtype].size;
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    for (; meta_kv && meta_kv[0]; meta_kv += 2) cJSON_AddStringToObject(meta, meta_kv[0], meta_kv[1]);
    uint64_t offset = 0, largest = 0;
    for (int i = 0; i < n; i++) {
        const StWriteTensor *w = &tensors[i];
        llmcCheck(w->ndim >= 0 && w->ndim <= ST_MAX_DIMS && (!w->transpose || w->ndim == 2), "tensor rank");
        uint64_t numel = 1;
        for (int d = 0; d < w->ndim; d++) numel *= (uint64_t)w->shape[d];
        cJSON *e = cJSON_AddObjectToObject(root, w->name);
        cJSON_AddStringToObject(e, "dtype", dtypes[dtype].name);
        cJSON *shape = cJSON_AddArrayToObject(e, "shape"), *offsets = cJSON_AddArrayToObject(e, "data_offsets");
        for (int d = 0; d < w->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)w->shape[d]));
        cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)offset));
        offset += numel * esize;
        cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)offset));
        if (numel > largest) largest = numel;
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) llmc_die("out of memory building the header of '%s'", path);
    size_t len = strlen(json), padded = (len + 7) / 8 * 8; /* the data section starts 8-aligned */
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    AtomicFile af;
    atomic_open(&af, path);
    uint32_t crc = write_bytes(&af, 0, le, 8);
    crc = write_bytes(&af, crc, json, len);
    free(json);
    crc = write_bytes(&af, crc, "       ", padded - len);
    float *tbuf = (float *)mallocCheck((size_t)(largest ? largest : 1) * sizeof(float), "safetensors transpose buffer");
    uint16_t *hbuf = dtype == ST_BF16 ? (uint16_t *)mallocCheck((size_t)(largest ? largest : 1) * 2, "bf16 buffer") : NULL;
    for (int i = 0; i < n; i++) {
        const StWriteTensor *w = &tensors[i];
        uint64_t numel = 1;
        for (int d = 0; d < w->ndim; d++) numel *= (uint64_t)w->shape[d];
        const float *src = w->data;
        if (w->transpose) { /* data is (cols, rows): out[r][c] = data[c][r] */
            const size_t rows = (size_t)w->shape[0], cols = (size_t)w->shape[1];
            for (size_t c = 0; c < cols; c++)
                for (size_t r = 0; r < rows; r++) tbuf[r * cols + c] = w->data[c * rows + r];
            src = tbuf;
        }
        if (dtype == ST_F32) {
            crc = write_bytes(&af, crc, src, numel * 4);
        } else {
            for (uint64_t j = 0; j < numel; j++) hbuf[j] = float_to_bf16(src[j]);
            crc = write_bytes(&af, crc, hbuf, numel * 2);
        }
    }
    free(hbuf);
    free(tbuf);
    atomic_commit(&af);
    *bytes = 8 + padded + offset;
    return crc;
}

#endif /* LLMC_HAVE_CJSON */
