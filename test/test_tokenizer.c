/*
 * test_tokenizer.c - unit tests of llmc/tokenizer.{h,c} that need no Python.
 * (Token-for-token agreement with tiktoken is test/test_tokenizer.py.)
 *
 * Usage: build/test/test_tokenizer [SEED]   (random inputs come from SEED, printed; default 1337)
 */
#include "llmc/data/tokenizer.h"
#include "test/testing.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t rng_state;
static uint32_t rng_next(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

/* Concatenates the bytes of ids; returns a malloc'd buffer and its length. */
static unsigned char *decode_all(const Tokenizer *t, const TokenBuf *b, size_t *len) {
    size_t n = 0, cap = 64;
    unsigned char *out = malloc(cap);
    for (size_t i = 0; i < b->n; i++) {
        size_t l;
        const unsigned char *p = tokenizer_token_bytes(t, b->ids[i], &l);
        if (!p) {
            free(out);
            return NULL;
        }
        while (n + l > cap) out = realloc(out, cap *= 2);
        memcpy(out + n, p, l);
        n += l;
    }
    *len = n;
    return out;
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) {
        printf("cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
}

static void test_load_errors(const char *tmpdir) {
    char err[512], path[600];
    Tokenizer *t = tokenizer_load("/nonexistent/tok.bin", err, sizeof err);
    test_report(!t && strstr(err, "/nonexistent/tok.bin"), "load_missing_file_names_it", "err='%s'", err);

    uint32_t h[256] = {0};
    h[0] = 12345, h[1] = 2, h[2] = 3, h[3] = 2;
    snprintf(path, sizeof path, "%s/badmagic.bin", tmpdir);
    write_bytes(path, h, sizeof h);
    t = tokenizer_load(path, err, sizeof err);
    test_report(!t && strstr(err, "magic") && strstr(err, path), "load_wrong_magic", "err='%s'", err);

    h[0] = TOKENIZER_MAGIC, h[1] = 3;
    write_bytes(path, h, sizeof h);
    t = tokenizer_load(path, err, sizeof err);
    test_report(!t && strstr(err, "version"), "load_wrong_version", "err='%s'", err);

    unsigned char buf[1024 + 6];
    h[1] = 2;
    memcpy(buf, h, sizeof h);
    memcpy(buf + 1024, "\x01" "a" "\x01" "b" "\x05" "c", 6); /* third token claims 5 bytes, has 1 */
    snprintf(path, sizeof path, "%s/trunc.bin", tmpdir);
    write_bytes(path, buf, sizeof buf);
    t = tokenizer_load(path, err, sizeof err);
    test_report(!t && strstr(err, "truncated"), "load_truncated", "err='%s'", err);
    write_bytes(path, buf, 500);
    t = tokenizer_load(path, err, sizeof err);
    test_report(!t && strstr(err, "header"), "load_short_header", "err='%s'", err);

    snprintf(path, sizeof path, "%s/emptydir", tmpdir);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", path);
    if (system(cmd) != 0) printf("mkdir failed\n");
    t = tokenizer_load(path, err, sizeof err);
    test_report(!t && strstr(err, "encoder.json"), "load_dir_without_files", "err='%s'", err);
}

static void test_json_strings(void) {
    struct {
        const char *in, *out;
        size_t out_len, used;
    } cases[] = {
        {"\"a\\\"b\\\\c\\/\\n\\t\"x", "a\"b\\c/\n\t", 8, 15},
        {"\"\\u00e9\\u20AC\"", "\xc3\xa9\xe2\x82\xac", 5, 14},
        {"\"\\ud83d\\ude00!\"", "\xf0\x9f\x98\x80!", 5, 15},      /* surrogate pair -> U+1F600 */
        {"\"\\ud83dx\"", "\xef\xbf\xbdx", 4, 9},                  /* lone high surrogate -> U+FFFD */
        {"\"\\ude00\"", "\xef\xbf\xbd", 3, 8},                    /* lone low surrogate */
        {"\"raw \xe2\x82\xac\"", "raw \xe2\x82\xac", 7, 9},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL, name[64];
        size_t cap = 0, len = 0;
        size_t used = json_decode_string(cases[i].in, strlen(cases[i].in), &out, &cap, &len);
        snprintf(name, sizeof name, "json_string_%zu", i);
        test_report(used == cases[i].used && len == cases[i].out_len && memcmp(out, cases[i].out, len) == 0, name,
                    "used %zu (want %zu), len %zu (want %zu)", used, cases[i].used, len, cases[i].out_len);
        free(out);
    }
    const char *bad[] = {"\"abc", "\"\\x\"", "\"\\u12\"", "\"a\nb\"", "abc"};
    int all_bad = 1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out = NULL;
        size_t cap = 0, len = 0;
        if (json_decode_string(bad[i], strlen(bad[i]), &out, &cap, &len) != 0) all_bad = 0;
        free(out);
    }
    test_report(all_bad, "json_string_malformed_rejected", "a malformed string was accepted");
}

typedef struct {
    const Tokenizer *tok;
    const char *text;
    size_t len;
    TokenBuf out;
    int rc;
} ThreadArg;

static void *encode_thread(void *p) {
    ThreadArg *a = p;
    char err[256];
    TokenizerContext *c = tokenizer_context_new(a->tok, err, sizeof err);
    a->rc = c ? 0 : -1;
    for (int rep = 0; rep < 3 && c; rep++) { /* repeat: the word cache is warm the second time */
        a->out.n = 0;
        a->rc |= tokenizer_encode(c, a->text, a->len, &a->out, err, sizeof err);
    }
    tokenizer_context_free(c);
    return NULL;
}

int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 1337;
    rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
    printf("seed %llu (rerun: build/test/test_tokenizer %llu)\n", (unsigned long long)seed, (unsigned long long)seed);
    char tmpdir[] = "/tmp/llmc_test_tokenizer_XXXXXX";
    if (!mkdtemp(tmpdir)) {
        printf("FAIL: mkdtemp\n");
        return 1;
    }
    char dir[4096], err[1024], path[4200];
    if (tokenizer_find_default(dir, sizeof dir) != 0) {
        test_report(0, "find_default", "no GPT-2 files found (data/gpt2 or ../shared/data/gpt2)");
        return test_exit_code();
    }
    Tokenizer *t = tokenizer_load(dir, err, sizeof err);
    test_report(t != NULL, "load_gpt2_dir", "%s", err);
    if (!t) return test_exit_code();
    size_t len;
    const unsigned char *eot = tokenizer_token_bytes(t, tokenizer_eot(t), &len);
    test_report(tokenizer_vocab_size(t) == 50257 && tokenizer_eot(t) == 50256 && len == 13 &&
                    memcmp(eot, "<|endoftext|>", 13) == 0,
                "gpt2_sizes_and_eot", "vocab %zu eot %u", tokenizer_vocab_size(t), tokenizer_eot(t));
    test_report(tokenizer_token_bytes(t, 50257, &len) == NULL, "token_bytes_out_of_range", "non-NULL");
    test_report(tokenizer_can_encode(t), "dir_can_encode", "cannot encode");

    /* llm.c tokenizer file: same bytes for every id, decode only */
    snprintf(path, sizeof path, "%s/tok.bin", tmpdir);
    test_report(tokenizer_save_llmc(t, path, err, sizeof err) == 0, "save_llmc", "%s", err);
    Tokenizer *tb = tokenizer_load(path, err, sizeof err);
    test_report(tb != NULL, "load_llmc_file", "%s", err);
    if (tb) {
        size_t bad = 0;
        for (uint32_t id = 0; id < tokenizer_vocab_size(t); id++) {
            size_t la, lb;
            const unsigned char *a = tokenizer_token_bytes(t, id, &la), *b = tokenizer_token_bytes(tb, id, &lb);
            if (!b || la != lb || memcmp(a, b, la)) bad++;
        }
        test_report(bad == 0 && tokenizer_vocab_size(tb) == tokenizer_vocab_size(t) && tokenizer_eot(tb) == tokenizer_eot(t),
                    "llmc_file_round_trip", "%zu tokens differ", bad);
        err[0] = 0;
        TokenizerContext *c = tokenizer_context_new(tb, err, sizeof err);
        test_report(!c && !tokenizer_can_encode(tb) && strstr(err, "merges"), "llmc_file_refuses_encode",
                    "err='%s'", err);
        tokenizer_context_free(c);
        tokenizer_free(tb);
    }

    /* random bytes (mostly invalid UTF-8, some ASCII and multi-byte) round trip */
    TokenizerContext *c = tokenizer_context_new(t, err, sizeof err);
    int rt_ok = c != NULL;
    for (int trial = 0; trial < 200 && rt_ok; trial++) {
        size_t n = rng_next() % 300;
        unsigned char buf[300];
        for (size_t i = 0; i < n; i++) {
            uint32_t r = rng_next();
            buf[i] = (r & 3) == 0 ? (unsigned char)(r >> 8) : (r & 3) == 1 ? " \n\t'aZ9"[(r >> 8) % 7]
                                                           : (unsigned char)(0x80 + ((r >> 8) % 0x75));
        }
        TokenBuf out = {0};
        size_t dl = 0;
        rt_ok = tokenizer_encode(c, (const char *)buf, n, &out, err, sizeof err) == 0;
        unsigned char *dec = rt_ok ? decode_all(t, &out, &dl) : NULL;
        if (!dec || dl != n || memcmp(dec, buf, n) != 0) {
            rt_ok = 0;
            printf("      round trip failed at trial %d (%zu bytes)\n", trial, n);
        }
        free(dec);
        token_buf_free(&out);
    }
    test_report(rt_ok, "random_bytes_round_trip", "decode(encode(x)) != x");

    /* concurrent encoding: 4 threads, own contexts, same result as one thread */
    size_t tlen = 1 << 18;
    char *text = malloc(tlen);
    const char *words[] = {"the ", "The", " 's", "'ll ", "  ", "\n\n", "\t", "123", "45 ", "\xc3\xa9t\xc3\xa9 ",
                           "\xe4\xb8\xad\xe6\x96\x87", "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd", "!!", "x", "\xff",
                           "antidisestablishmentarianism"};
    for (size_t i = 0; i < tlen;) {
        const char *w = words[rng_next() % (sizeof words / sizeof words[0])];
        for (size_t k = 0; w[k] && i < tlen; k++) text[i++] = w[k];
    }
    TokenBuf ref = {0};
    int ok = c && tokenizer_encode(c, text, tlen, &ref, err, sizeof err) == 0;
    ThreadArg args[4];
    pthread_t tids[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (ThreadArg){t, text, tlen, {0}, 0};
        pthread_create(&tids[i], NULL, encode_thread, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(tids[i], NULL);
        ok = ok && args[i].rc == 0 && args[i].out.n == ref.n &&
             memcmp(args[i].out.ids, ref.ids, ref.n * sizeof *ref.ids) == 0;
        token_buf_free(&args[i].out);
    }
    test_report(ok && ref.n > 0, "threads_agree", "a thread's tokens differ from the single-thread result");
    size_t dl;
    unsigned char *dec = decode_all(t, &ref, &dl);
    test_report(dec && dl == tlen && memcmp(dec, text, tlen) == 0, "mixed_text_round_trip", "decode(encode(x)) != x");
    free(dec);
    token_buf_free(&ref);
    free(text);
    tokenizer_context_free(c);

    test_load_errors(tmpdir);
    test_json_strings();

    /* $LLMC_DATA_DIR/gpt2 comes first */
    char cmd[9000], absdir[4096];
    if (!realpath(dir, absdir)) snprintf(absdir, sizeof absdir, "%s", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/env/gpt2 && ln -sf %.4000s/encoder.json %.4000s/vocab.bpe %s/env/gpt2/",
             tmpdir, absdir, absdir, tmpdir);
    int sys_ok = system(cmd) == 0;
    snprintf(path, sizeof path, "%s/env", tmpdir);
    setenv("LLMC_DATA_DIR", path, 1);
    char found[4096];
    snprintf(path, sizeof path, "%s/env/gpt2", tmpdir);
    test_report(sys_ok && tokenizer_find_default(found, sizeof found) == 0 && strcmp(found, path) == 0,
                "find_default_prefers_env", "found '%s', want '%s'", found, path);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) printf("      (could not remove %s)\n", tmpdir);
    tokenizer_free(t);
    return test_exit_code();
}
