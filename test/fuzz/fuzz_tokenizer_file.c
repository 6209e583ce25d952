/*
 * fuzz_tokenizer_file.c - llm.c tokenizer files (llmc/data/tokenizer.c: tokenizer_load of a file,
 * then tokenizer_save_llmc), as `--tokenizer FILE` and `./tokenizer decode` read them.
 *
 * Promises checked: a bad file is an error return naming the file (never an exit or a crash);
 * an accepted file's tokens are exactly the length-prefixed strings after its header; saving
 * and loading again gives the same vocabulary and EOT.
 */
#include "llmc/data/tokenizer.h"
#include "test/fuzz/fuzz.h"

#include <stdio.h>
#include <string.h>

static void check_tokens(const Tokenizer *t, const uint8_t *data, size_t size) {
    size_t pos = TOKENIZER_HEADER_INTS * 4, len;
    for (uint32_t id = 0; id < tokenizer_vocab_size(t); id++) {
        const unsigned char *bytes = tokenizer_token_bytes(t, id, &len);
        if (!bytes || pos >= size || len != data[pos] || pos + 1 + len > size || memcmp(bytes, data + pos + 1, len))
            fuzz_fail("token %u is not the file's string at offset %zu", id, pos);
        pos += 1 + len;
    }
    if (pos != size) fuzz_fail("accepted a file with %zu bytes after its last token", size - pos);
    if (tokenizer_token_bytes(t, (uint32_t)tokenizer_vocab_size(t), &len))
        fuzz_fail("an id past the vocabulary has bytes");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[4200], copy[4200], err[8192];
    fuzz_write_file("tokenizer.bin", data, size, path, sizeof path);
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    if (!t) {
        if (!strstr(err, path)) fuzz_fail("error does not name the file: %s", err);
        return 0;
    }
    if (tokenizer_eot(t) >= tokenizer_vocab_size(t)) fuzz_fail("EOT %u outside the vocabulary", tokenizer_eot(t));
    if (tokenizer_can_encode(t)) fuzz_fail("a tokenizer file (no merges) claims it can encode");
    check_tokens(t, data, size);

    snprintf(copy, sizeof copy, "%s/saved.bin", fuzz_tmpdir());
    if (tokenizer_save_llmc(t, copy, err, sizeof err) != 0) fuzz_fail("saving a loaded tokenizer failed: %s", err);
    Tokenizer *again = tokenizer_load(copy, err, sizeof err);
    if (!again) fuzz_fail("a saved tokenizer does not load: %s", err);
    if (tokenizer_vocab_size(again) != tokenizer_vocab_size(t) || tokenizer_eot(again) != tokenizer_eot(t))
        fuzz_fail("saving and loading changed the vocabulary size or EOT");
    for (uint32_t id = 0; id < tokenizer_vocab_size(t); id++) {
        size_t la, lb;
        const unsigned char *a = tokenizer_token_bytes(t, id, &la), *b = tokenizer_token_bytes(again, id, &lb);
        if (la != lb || memcmp(a, b, la)) fuzz_fail("saving and loading changed token %u", id);
    }
    tokenizer_free(again);
    tokenizer_free(t);
    return 0;
}
