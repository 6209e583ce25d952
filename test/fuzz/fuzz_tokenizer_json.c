/*
 * fuzz_tokenizer_json.c - OpenAI's GPT-2 tokenizer files (llmc/data/tokenizer.c: tokenizer_load of a
 * directory holding encoder.json and vocab.bpe; json_decode_string), as `--tokenizer DIR` and
 * `./tokenizer encode` read them.
 *
 * The input is encoder.json, a NUL byte, then vocab.bpe (no NUL: vocab.bpe is empty). Promises
 * checked: bad files are an error return naming a file (never an exit or a crash); JSON string
 * decoding never consumes more than it was given nor writes more bytes than it consumed; an
 * accepted pair encodes text that decodes back to the same bytes.
 */
#include "llmc/data/tokenizer.h"
#include "test/fuzz/fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void check_json_string(const uint8_t *data, size_t size) {
    char *out = NULL;
    size_t cap = 0, len = 0;
    size_t used = json_decode_string((const char *)data, size, &out, &cap, &len);
    if (used > size || (used && (data[0] != '"' || data[used - 1] != '"' || used < 2)))
        fuzz_fail("json_decode_string consumed %zu of %zu bytes", used, size);
    if (used && len > used) fuzz_fail("json_decode_string made %zu bytes from %zu", len, used);
    free(out);
}

static void check_round_trip(const Tokenizer *t, const char *text, size_t n) {
    char err[4400];
    TokenizerContext *ctx = tokenizer_context_new(t, err, sizeof err);
    if (!ctx) fuzz_fail("no encoding context for a tokenizer that can encode: %s", err);
    TokenBuf ids = {0};
    if (tokenizer_encode(ctx, text, n, &ids, err, sizeof err) != 0) fuzz_fail("encoding failed: %s", err);
    size_t pos = 0, len;
    for (size_t i = 0; i < ids.n; i++) {
        const unsigned char *b = tokenizer_token_bytes(t, ids.ids[i], &len);
        if (!b || pos + len > n || memcmp(b, text + pos, len)) fuzz_fail("token %zu (id %u) does not decode to the text", i, ids.ids[i]);
        pos += len;
    }
    if (pos != n) fuzz_fail("the tokens decode to %zu of %zu bytes", pos, n);
    token_buf_free(&ids);
    tokenizer_context_free(ctx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check_json_string(data, size);

    static char dir[4200];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s/gpt2", fuzz_tmpdir());
        if (mkdir(dir, 0700) != 0) fuzz_fail("cannot create '%s'", dir);
    }
    const uint8_t *nul = memchr(data, 0, size);
    size_t json_len = nul ? (size_t)(nul - data) : size;
    char path[4400], err[8192];
    fuzz_write_file("gpt2/encoder.json", data, json_len, path, sizeof path);
    fuzz_write_file("gpt2/vocab.bpe", nul ? nul + 1 : data, nul ? size - json_len - 1 : 0, path, sizeof path);

    Tokenizer *t = tokenizer_load(dir, err, sizeof err);
    if (!t) {
        if (!strstr(err, dir)) fuzz_fail("error names no file of '%s': %s", dir, err);
        return 0;
    }
    if (tokenizer_eot(t) >= tokenizer_vocab_size(t)) fuzz_fail("EOT %u outside the vocabulary", tokenizer_eot(t));
    if (!tokenizer_can_encode(t)) fuzz_fail("encoder.json + vocab.bpe loaded without merges");
    static const char sample[] = "Hello there, it's 2024!  \xff\xfe caf\xc3\xa9 \n\n ok";
    check_round_trip(t, sample, sizeof sample - 1);
    check_round_trip(t, (const char *)data, json_len);
    tokenizer_free(t);
    return 0;
}
