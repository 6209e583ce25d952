/*
 * fuzz_state_file.c - our training-state files (llmc/formats/modelfile.c: state_file_load), and the
 * data-loader position inside them (dataloader_set_state), the way `-y 1` resumes.
 *
 * The parameter count the loader expects is the file's own when the file could hold it (so
 * the fuzzer reaches the moments), else what the file's size implies. Promises checked: a bad
 * file is a clean error; an accepted file has exactly 1024 + 8 * numel bytes and its moments
 * load as stored; an accepted loader position gives a batch of in-vocabulary tokens.
 */
#include "llmc/formats/statefile.h"
#include "llmc/data/dataloader.h"
#include "llmc/data/shard.h"
#include "test/fuzz/fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, T = 8, VOCAB = 50257, SHARD_TOKENS = 1000 };

typedef struct {
    const char *path, *shard;
    const uint8_t *data;
    size_t size;
} Input;

static void resume(void *arg) {
    const Input *in = arg;
    size_t expect = in->size > 1024 ? (in->size - 1024) / 8 : 1;
    if (in->size >= 1024) {
        uint64_t own;
        memcpy(&own, in->data + 12, 8); /* header[3..4], little-endian like the file */
        if (own <= (in->size - 1024) / 8) expect = (size_t)own;
    }
    float *m = malloc(expect * sizeof(float) + 1), *v = malloc(expect * sizeof(float) + 1);
    TrainState st;
    state_file_load(in->path, &st, m, v, expect);
    const size_t gc = 4 * ((size_t)st.gc_ranks * st.gc_floats + st.gc_shared); /* version 4: the residuals */
    if (st.numel != expect || in->size != 1024 + 8 * expect + gc)
        fuzz_fail("accepted a %zu-byte state of %zu parameters (expected %zu)", in->size, st.numel, expect);
    free(st.gc_data);
    if (memcmp(m, in->data + 1024, 4 * expect) || memcmp(v, in->data + 1024 + 4 * expect, 4 * expect))
        fuzz_fail("AdamW moments were not loaded as stored");
    free(m);
    free(v);

    DataLoader *dl = dataloader_open(in->shard, B, T, 0, 1, 1, 7, VOCAB, 0);
    DataLoaderState ds;
    memcpy(&ds, st.loader, sizeof ds);
    dataloader_set_state(dl, &ds);
    int32_t inputs[B * T], targets[B * T];
    dataloader_next(dl, inputs, targets);
    for (int i = 0; i < B * T; i++)
        if (inputs[i] < 0 || inputs[i] >= VOCAB || targets[i] < 0 || targets[i] >= VOCAB)
            fuzz_fail("a batch after resuming holds token %d / %d", inputs[i], targets[i]);
    dataloader_close(dl);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char shard[4200];
    if (!shard[0]) {
        static uint32_t tokens[SHARD_TOKENS];
        for (int i = 0; i < SHARD_TOKENS; i++) tokens[i] = (uint32_t)(i * 7919 % VOCAB);
        snprintf(shard, sizeof shard, "%s/train.bin", fuzz_tmpdir());
        shard_write(shard, tokens, SHARD_TOKENS, 2);
    }
    char path[4200];
    fuzz_write_file("state.bin", data, size, path, sizeof path);
    Input in = {path, shard, data, size};
    fuzz_call(resume, &in);
    return 0;
}
