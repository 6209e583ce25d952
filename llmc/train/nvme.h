/*
 * nvme.h - the AdamW moments on disk (--offload-device nvme --nvme-path DIR): one file per rank,
 * DIR/llmc-optstate-PID-RANK.bin, created for the run and removed when it exits (normally, on an
 * error: atexit, and on SIGINT/SIGTERM: a handler that unlinks it and re-raises the signal).
 *
 * The file holds this rank's shard of m and v (k elements, stored as --optim-state says) cut into
 * chunks of nvme_chunk_floats() elements (a multiple of OPTSTATE_BLOCK, so that an int8 block
 * never straddles two chunks). Chunk c is one contiguous region of nvme_slot_bytes(): its m as
 * optstate.h stores a moment of that chunk's count elements, then its v, each padded to 4096
 * bytes (O_DIRECT's alignment). A chunk's bytes are those of the in-memory moments' elements
 * [c0, c0 + count) with the block index counted from c0: the update computes the same bits.
 *
 * The step streams the chunks through a ring of NVME_RING_SLOTS slots (the only host memory:
 * class nvme_ring): the read of chunk c + 1 and the write of chunk c - 1 are in flight (io_uring,
 * liburing; O_DIRECT where the filesystem takes it, else buffered with a one-line note) while
 * chunk c is updated. A failed or short read or write (ENOSPC, EIO) is an error naming
 * --nvme-path; the file is then removed and nothing else in DIR is touched.
 */
#ifndef LLMC_TRAIN_NVME_H
#define LLMC_TRAIN_NVME_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { NVME_RING_SLOTS = 3, NVME_ALIGN = 4096 };

typedef struct NvmeStore NvmeStore;

/* Elements per chunk: 1 Mi (8 MiB of fp32 m + v per slot); LLMC_TEST_NVME_CHUNK=N (a multiple of
 * 4096) sets it for the tests, so that a tiny model has several chunks. */
size_t nvme_chunk_floats(void);
/* The plan's and nvme_open's one rule: bytes of one ring slot, of the ring, of the file for a
 * shard of k elements stored as state (optstate.h's OptStateType). */
size_t nvme_slot_bytes(int state);
size_t nvme_ring_bytes(int state);
size_t nvme_file_bytes(size_t k, int state);

/* Dies with an `error: flag --nvme-path ...` line unless dir is an existing writable directory. */
void nvme_check_dir(const char *dir);
/* Checks DIR (exists, a directory, writable, free space >= the file: statvfs), creates the file
 * (zeros: the moments' initial value) and the ring (accounted as class nvme_ring). Dies with an
 * `error: flag --nvme-path ...` line on any failure, leaving DIR as it was. */
NvmeStore *nvme_open(const char *dir, int rank, size_t k, int state);
void nvme_close(NvmeStore *s); /* removes the file, frees the ring */

/* One pass over the chunks in order: fn(ctx, c0, count, m, v) with m, v the chunk's moments in
 * the ring (optstate.h's storage of count elements, block 0 = element c0) to update in place;
 * each chunk is written back after fn returns. */
typedef void (*NvmeChunkFn)(void *ctx, size_t c0, size_t count, void *m, void *v);
void nvme_stream(NvmeStore *s, NvmeChunkFn fn, void *ctx);
/* Elements [offset, offset + count) of m (is_v 0) or v, decoded to fp32 into x (a checkpoint). */
void nvme_read(NvmeStore *s, int is_v, size_t offset, size_t count, float *x);
/* The whole shard (k floats of each) encoded into the file (a resume). */
void nvme_write_all(NvmeStore *s, const float *m, const float *v);
/* The I/O of the passes since the last call: MB/s read and written over the passes' wall time
 * (0 when none ran). */
void nvme_take_rates(NvmeStore *s, double *read_MBps, double *write_MBps);
void nvme_print(const NvmeStore *s, FILE *out);
const char *nvme_path(const NvmeStore *s);

#ifdef __cplusplus
}
#endif
#endif
