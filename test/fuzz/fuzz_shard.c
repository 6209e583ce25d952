/*
 * fuzz_shard.c - token shards (llmc/data/shard.c: shard_read_header) and the data loader reading
 * them (llmc/data/dataloader.c: open, batches, position round trip), as `-i`/`-j` read them.
 *
 * The loader's settings come from header[3] (llm.c leaves header[3..255] zero and the loader
 * ignores them), so one input picks B, T, ranks, shuffling and vocab_size as well as the data.
 * Promises checked: shard_read_header accepts exactly the files whose size matches their
 * header, else returns an error naming the file; a bad shard is a clean error; every batch
 * holds in-vocabulary tokens, in order the file's own tokens when not shuffled; a position
 * taken with dataloader_get_state is accepted by dataloader_set_state.
 */
#include "llmc/data/dataloader.h"
#include "llmc/data/shard.h"
#include "test/fuzz/fuzz.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *path;
    const uint8_t *data;
    size_t size;
    ShardInfo info;
} Input;

static void read_batches(void *arg) {
    const Input *in = arg;
    uint32_t k = 0;
    memcpy(&k, in->data + 12, 4);
    int B = 1 + (int)(k & 3), T = 1 + (int)((k >> 2) & 7), nproc = 1 + (int)((k >> 5) & 1);
    int rank = (int)((k >> 6) & 1) % nproc, shuffle = (int)((k >> 7) & 1);
    int vocab = (k >> 8) & 1 ? 50257 : 1 + (int)((k >> 9) & 0xFFFF);
    uint64_t seed = k >> 25;

    DataLoader *dl = dataloader_open(in->path, B, T, rank, nproc, shuffle, seed, vocab, 0);
    size_t bt = (size_t)B * T, batches = dataloader_batches_per_epoch(dl);
    int32_t *inputs = malloc(bt * sizeof(int32_t)), *targets = malloc(bt * sizeof(int32_t));
    for (size_t b = 0; b < batches + 1 && b < 64; b++) {
        dataloader_next(dl, inputs, targets);
        size_t start = (b % batches) * bt * nproc + (size_t)rank * bt;
        for (size_t i = 0; i < bt; i++) {
            if (inputs[i] < 0 || inputs[i] >= vocab || targets[i] < 0 || targets[i] >= vocab)
                fuzz_fail("batch %zu holds token %d / %d with vocab_size %d", b, inputs[i], targets[i], vocab);
            if (shuffle) continue;
            uint32_t want = 0;
            const uint8_t *p = in->data + 1024 + (start + i) * (size_t)in->info.token_bytes;
            memcpy(&want, p, (size_t)in->info.token_bytes);
            if ((uint32_t)inputs[i] != want) fuzz_fail("batch %zu input %zu is %d, the file has %u", b, i, inputs[i], want);
        }
    }
    DataLoaderState st;
    dataloader_get_state(dl, &st);
    dataloader_set_state(dl, &st);
    free(inputs);
    free(targets);
    dataloader_close(dl);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[4200], err[8192];
    fuzz_write_file("shard.bin", data, size, path, sizeof path);
    Input in = {path, data, size, {0, 0}};
    if (shard_read_header(path, &in.info, err, sizeof err) != 0) {
        if (!strstr(err, path)) fuzz_fail("shard error does not name the file: %s", err);
        return 0;
    }
    if (in.info.token_bytes != 2 && in.info.token_bytes != 4)
        fuzz_fail("shard accepted with %d-byte tokens", in.info.token_bytes);
    if (size != 1024 + in.info.ntok * (size_t)in.info.token_bytes)
        fuzz_fail("accepted a %zu-byte shard whose header says %zu tokens", size, in.info.ntok);
    fuzz_call(read_batches, &in);
    return 0;
}
