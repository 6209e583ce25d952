/*
 * fuzz_tokenizer_encode.c - encoding arbitrary bytes (llmc/data/tokenizer.c: tokenizer_encode), as
 * `./tokenizer encode` and `./tokenizer shards` do with any input text.
 *
 * The tokenizer: the directory in $LLMC_FUZZ_TOKENIZER, else GPT-2's files where
 * tokenizer_find_default finds them (data/gpt2, ../shared/data/gpt2), else the tiny vocabulary
 * in test/fuzz/mini_gpt2 (run from the repository root). Promises checked: any bytes encode
 * without error; the ids are in the vocabulary and never the EOT (ordinary text); the tokens
 * decode to exactly the input; encoding the same bytes again (now through the word cache)
 * gives the same ids.
 */
#include "llmc/data/tokenizer.h"
#include "test/fuzz/fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static Tokenizer *tok;
static TokenizerContext *ctx;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char dir[4096], err[8192];
    const char *env = getenv("LLMC_FUZZ_TOKENIZER");
    if (env && env[0]) snprintf(dir, sizeof dir, "%s", env);
    else if (tokenizer_find_default(dir, sizeof dir) != 0) snprintf(dir, sizeof dir, "test/fuzz/mini_gpt2");
    tok = tokenizer_load(dir, err, sizeof err);
    if (!tok) fuzz_fail("cannot load the tokenizer: %s", err);
    ctx = tokenizer_context_new(tok, err, sizeof err);
    if (!ctx) fuzz_fail("'%s' cannot encode: %s", dir, err);
    fprintf(stderr, "fuzz_tokenizer_encode: tokenizer %s (%zu tokens)\n", dir, tokenizer_vocab_size(tok));
    return 0;
}

static void encode(const uint8_t *data, size_t size, TokenBuf *ids) {
    char err[4400];
    if (tokenizer_encode(ctx, (const char *)data, size, ids, err, sizeof err) != 0)
        fuzz_fail("encoding %zu bytes failed: %s", size, err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    TokenBuf ids = {0}, again = {0};
    encode(data, size, &ids);
    size_t pos = 0, len;
    for (size_t i = 0; i < ids.n; i++) {
        if (ids.ids[i] == tokenizer_eot(tok)) fuzz_fail("ordinary text encoded to the EOT at token %zu", i);
        const unsigned char *b = tokenizer_token_bytes(tok, ids.ids[i], &len);
        if (!b) fuzz_fail("token %zu has id %u, outside the vocabulary", i, ids.ids[i]);
        if (pos + len > size || memcmp(b, data + pos, len)) fuzz_fail("token %zu (id %u) is not the input at byte %zu", i, ids.ids[i], pos);
        pos += len;
    }
    if (pos != size) fuzz_fail("the tokens decode to %zu of %zu bytes", pos, size);
    encode(data, size, &again);
    if (again.n != ids.n || (ids.n && memcmp(again.ids, ids.ids, ids.n * sizeof *ids.ids)))
        fuzz_fail("encoding the same %zu bytes twice gave different ids", size);
    token_buf_free(&ids);
    token_buf_free(&again);
    return 0;
}
