/*
 * dataloader.h - token batches from llm.c shard files, shared by the CPU and CUDA trainers.
 *
 * Layout (llm.c's). Let BTP = B*T*nproc, the tokens of one global batch. Within a shard of ntok
 * tokens, global batch k (0 <= k < floor((ntok - 1) / BTP)) covers tokens
 * [k*BTP, k*BTP + BTP + 1). Rank r takes the B*T + 1 tokens starting at k*BTP + r*B*T:
 * inputs = the first B*T of them, targets = the last B*T (inputs shifted by one token).
 * The +1 token at the end of a batch is the first token of the next, as in llm.c.
 *
 * Order. An epoch visits every global batch of every shard exactly once.
 *   shuffle = 0: shards in glob order (sorted), batches k = 0, 1, ... within each (llm.c's order).
 *   shuffle = 1: shard order and the batch order within each shard are Fisher-Yates
 *                permutations drawn from a PRNG seeded by (seed, epoch[, shard]) only, so a
 *                position (epoch, shard_pos, batch_pos) is all that is needed to restore it.
 * Every rank must use the same (pattern, B, T, nproc, shuffle, seed): they then walk the same
 * global batches in lock step, each taking its own slice.
 *
 * Data-parallel split (the trainers, llmc/train/train.c). The training loader is opened with one whole
 * optimizer step as its batch (B = d / T sequences, nproc = 1), so the data of step s depends on
 * -d and -t only, never on the number of ranks P or on -b. With accumulation A = d / (B*T*P),
 * sequence j of a step (0 <= j < d / T) goes to micro-step j / (P*B), rank (j / B) % P, row
 * j % B: one process with -b P*B, or with -b B and accumulation P, sees the same sequences in
 * each step as P ranks with -b B. The validation loader keeps the per-rank layout above (global
 * batches of B*T*P tokens, the loss averaged over the ranks).
 *
 * Prefetch. With prefetch = 1 a background pthread prepares the next batch while the caller
 * trains. Results (batches, positions, errors and when they are raised) are identical with
 * prefetch on and off.
 *
 * Errors (bad pattern, bad/short shard, token >= vocab_size, a state that does not fit, a shard
 * truncated while in use) are
 * user errors: "error: ..." naming the file and what is wrong, exit status 1.
 */
#ifndef LLMC_DATALOADER_H
#define LLMC_DATALOADER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct DataLoader DataLoader;

/* pattern: a glob (glob(3), sorted) of shard files; dies with a clear message if nothing
 * matches, a shard is bad (shard_read_header), or a shard is too short for one global batch
 * (B*T*nproc + 1 tokens). vocab_size: every token of every shard is checked here, at open (one
 * read of the data); any token >= vocab_size is an error naming the file and token position.
 * Batches are read with pread: a shard truncated or changed while in use is an error naming it,
 * raised by the dataloader_next call that would return the batch.
 * shuffle: 0 = llm.c's sequential order; 1 = per-epoch permutations (see above).
 * prefetch: 1 = a background thread prepares the next batch. */
DataLoader *dataloader_open(const char *pattern, int B, int T, int rank, int nproc,
                            int shuffle, uint64_t seed, int vocab_size, int prefetch);

/* The same, for a model's vocabulary: vocab_origin (the model file or descriptor, may be NULL)
 * is named in the out-of-vocabulary error, since a damaged model header is as likely a cause
 * as a shard made with another tokenizer. */
DataLoader *dataloader_open_for_model(const char *pattern, int B, int T, int rank, int nproc, int shuffle,
                                      uint64_t seed, int vocab_size, int prefetch, const char *vocab_origin);

/* Fills inputs[B*T] and targets[B*T] with this rank's slice of the next global batch; wraps
 * into the next epoch at the end (reshuffling when shuffle = 1). */
void dataloader_next(DataLoader *dl, int32_t *inputs, int32_t *targets);

/* Back to the first batch of epoch 0; discards any prefetched batch. */
void dataloader_reset(DataLoader *dl);

size_t dataloader_num_tokens(const DataLoader *dl);        /* tokens in all shards */
size_t dataloader_batches_per_epoch(const DataLoader *dl); /* global batches in one epoch */
int dataloader_num_shards(const DataLoader *dl);
/* A CRC-32 of the content of every shard in glob order (each shard's tokens' CRC-32, computed
 * by the vocabulary check's read at open, and its token count): the ranks of a run compare it
 * (train.c), catching the same path with other data on another node or working directory. */
uint32_t dataloader_content_crc(const DataLoader *dl);

/* A position in the batch stream: the NEXT batch dataloader_next will return is batch
 * number batch_pos (in this epoch's order) of the shard_pos-th shard (in this epoch's order)
 * of epoch `epoch`. Always normalised: 0 <= shard_pos < num_shards and batch_pos < the
 * batches of that shard, so a state taken right after the last batch of an epoch reads
 * {epoch + 1, 0, 0}.
 * reserved: get_state writes a fingerprint of the loader's configuration there (see
 * dataloader.c: DL_STATE_MAGIC); set_state checks it when present and ignores all-zero
 * reserved fields, so a state can also be written by hand. Save the struct as a whole. */
typedef struct {
    int64_t epoch, shard_pos, batch_pos, reserved[5];
} DataLoaderState;

void dataloader_get_state(const DataLoader *dl, DataLoaderState *st);
/* Moves to st and discards any prefetched batch; dies with a clear message if st does not fit
 * these shards (out of range, or fingerprint of a different configuration). */
void dataloader_set_state(DataLoader *dl, const DataLoaderState *st);
/* The checks of dataloader_set_state without dying: 0, or -1 with the reason in err. */
int dataloader_check_state(DataLoader *dl, const DataLoaderState *st, char *err, size_t errlen);

/* Milliseconds the last dataloader_next call spent before the batch was in the caller's
 * buffers: waiting for the prefetch thread and copying (prefetch on), or reading and converting
 * the tokens itself (prefetch off). */
double dataloader_last_wait_ms(const DataLoader *dl);

/* Stops and joins the prefetch thread, unmaps the shards, frees dl. NULL is a no-op. */
void dataloader_close(DataLoader *dl);

#ifdef __cplusplus
}
#endif
#endif /* LLMC_DATALOADER_H */
