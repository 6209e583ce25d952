/*
 * safetensors.h - Hugging Face's safetensors files: read (F32, BF16, F16 into fp32) and write
 * (F32 or BF16); one file, or a sharded set listed by its model.safetensors.index.json.
 *
 * A file is: u64 N (little-endian), N bytes of JSON header, then the data section. The header is
 * one object: "__metadata__" (optional: an object of string values) and, per tensor,
 *   "NAME": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}
 * with begin/end in bytes from the start of the data section. Nothing is trusted before it is
 * checked (safetensors_parse_header): N against the file size and a 100 MB cap, the JSON itself
 * (one object, only spaces after it), each entry's fields and types, integers exact (at most
 * 2^53), dtype known, shape product x dtype size = end - begin without overflow, offsets inside
 * the data section, tensors neither overlapping nor leaving holes (they tile the data section
 * exactly, as the format requires: a truncated file or one with stray bytes is an error), no
 * name twice. Every error names the file and the tensor.
 *
 * An index (model.safetensors.index.json) is {"metadata": {...}, "weight_map": {"NAME":
 * "FILE", ...}}: FILE is a plain name in the same directory; each name must be found in the file
 * it maps to, and every tensor of those files must be in the map, once.
 *
 * Data are little-endian, as on every machine this builds for (llm.c's files assume the same).
 */
#ifndef LLMC_SAFETENSORS_H
#define LLMC_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The format's dtypes (bytes per element in safetensors_dtype_size). Only F32, BF16 and F16 are
 * read into fp32; the others are understood (their sizes checked) but not converted. */
typedef enum {
    ST_BOOL, ST_U8, ST_I8, ST_F8_E5M2, ST_F8_E4M3, ST_I16, ST_U16, ST_F16, ST_BF16, ST_I32, ST_U32, ST_F32,
    ST_F64, ST_I64, ST_U64, ST_NUM_DTYPES
} StDtype;

enum { ST_MAX_DIMS = 8, ST_MAX_HEADER = 100 << 20 };

typedef struct {
    char *name;
    int dtype; /* StDtype */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end; /* bytes from the start of its file's data section */
    int file;            /* index into Safetensors.files */
} StTensor;

typedef struct {
    char *path;
    uint64_t data_start; /* 8 + N */
    uint64_t size;       /* the whole file, bytes */
} StFile;

typedef struct {
    StFile *files;
    int num_files;
    StTensor *tensors;
    int num_tensors;
} Safetensors;

const char *safetensors_dtype_name(int dtype);
size_t safetensors_dtype_size(int dtype);
uint64_t safetensors_numel(const StTensor *t);

/* Parses and checks a header: json (len bytes, not NUL-terminated) of a file whose data section
 * holds data_size bytes. Returns 0 with *out (malloc'd, free with safetensors_free_tensors) and
 * *n set, or -1 with a one-line message naming file and the tensor in err. Never exits. */
int safetensors_parse_header(const char *json, size_t len, uint64_t data_size, const char *file, StTensor **out,
                             int *n, char *err, size_t errlen);
void safetensors_free_tensors(StTensor *t, int n);

/* One .safetensors file; dies (error: ..., exit 1) naming the file and tensor on anything wrong. */
Safetensors *safetensors_open_file(const char *path);
/* dir/model.safetensors, or else the shards named by dir/model.safetensors.index.json. */
Safetensors *safetensors_open_dir(const char *dir);
void safetensors_close(Safetensors *st);
/* The tensor of that name, or NULL. */
const StTensor *safetensors_find(const Safetensors *st, const char *name);
/* Reads tensor t as fp32 into dst (safetensors_numel(t) floats); dies if its dtype is not F32,
 * BF16 or F16, or if the file no longer holds it. */
void safetensors_read_f32(const Safetensors *st, const StTensor *t, float *dst);

/* One tensor to write: `data` holds it in row-major order of `shape`, or, with transpose set (2-D
 * only), the (shape[1], shape[0]) matrix whose transpose is written. */
typedef struct {
    const char *name;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const float *data;
    int transpose;
} StWriteTensor;

/* Writes the tensors (in this order, contiguous) as dtype ST_F32 or ST_BF16 (round to nearest
 * even) to path, atomically (llmc/core/atomicfile.h), with "__metadata__" {"format": "pt"} (what
 * transformers expects). Returns the file's CRC-32 (zlib) and sets *bytes to its size. */
uint32_t safetensors_write(const char *path, const StWriteTensor *tensors, int n, int dtype, uint64_t *bytes);
/* The same with more "__metadata__" entries: meta_kv is key, value, key, value, ..., NULL. */
uint32_t safetensors_write_meta(const char *path, const StWriteTensor *tensors, int n, int dtype, const char *const *meta_kv,
                                uint64_t *bytes);

#ifdef __cplusplus
}
#endif
#endif
