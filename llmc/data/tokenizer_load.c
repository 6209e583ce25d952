/*
 * tokenizer_load.c - where a Tokenizer comes from (see tokenizer.h for the contract): llm.c's
 * tokenizer file, GPT-2's encoder.json + vocab.bpe (a directory of them), tiktoken rank files
 * (base64 token, rank) and Llama 3's tokenizer.model with its special tokens; the default search,
 * and llm.c's file written back (tokenizer_save_llmc). Each loader fills the token bytes and hands
 * the table building to tokenizer.c (tokenizer_build_encode_tables).
 */
#include "llmc/core/atomicfile.h"
#include "llmc/data/tokenizer.h"
#include "llmc/data/tokenizer_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- files ------------------------------------------------------------------------------ */

/* Reads a whole file; NULL with a reason on failure. */
static unsigned char *read_file(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen_regular(path, err, errlen); /* a FIFO or device would block or never end */
    if (!f) return NULL;
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        tokenizer_set_err(err, errlen, "cannot stat '%s': %s", path, strerror(errno));
        fclose(f);
        return NULL;
    }
    size_t n = (size_t)st.st_size;
    unsigned char *buf = malloc(n + 1);
    if (!buf) llmc_die("out of memory reading '%s' (%zu bytes)", path, n);
    if (fread(buf, 1, n, f) != n) {
        tokenizer_set_err(err, errlen, "cannot read '%s': %s", path, ferror(f) ? strerror(errno) : "short read");
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}

/* ---- JSON strings ------------------------------------------------------------------- */

static size_t utf8_put(unsigned char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

static int hex4(const char *s, uint32_t *v) {
    uint32_t x = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        x <<= 4;
        if (c >= '0' && c <= '9') x |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') x |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') x |= (uint32_t)(c - 'A' + 10);
        else return 0;
    }
    *v = x;
    return 1;
}

size_t json_decode_string(const char *s, size_t len, char **out, size_t *outcap, size_t *outlen) {
    if (len == 0 || s[0] != '"') return 0;
    /* the output is never longer than the input */
    if (*outcap < len) {
        char *p = realloc(*out, len);
        if (!p) llmc_die("out of memory decoding a %zu-byte JSON string", len);
        *out = p, *outcap = len;
    }
    unsigned char *o = (unsigned char *)*out;
    size_t i = 1, w = 0;
    while (i < len) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') {
            *outlen = w;
            return i + 1;
        }
        if (c < 0x20) return 0; /* raw control characters are not allowed in JSON strings */
        if (c != '\\') {
            o[w++] = c, i++;
            continue;
        }
        if (i + 1 >= len) return 0;
        char e = s[i + 1];
        i += 2;
        switch (e) {
        case '"': o[w++] = '"'; break;
        case '\\': o[w++] = '\\'; break;
        case '/': o[w++] = '/'; break;
        case 'b': o[w++] = '\b'; break;
        case 'f': o[w++] = '\f'; break;
        case 'n': o[w++] = '\n'; break;
        case 'r': o[w++] = '\r'; break;
        case 't': o[w++] = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (i + 4 > len || !hex4(s + i, &cp)) return 0;
            i += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (i + 6 <= len && s[i] == '\\' && s[i + 1] == 'u' && hex4(s + i + 2, &lo) &&
                    lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    i += 6;
                } else {
                    cp = 0xFFFD;
                }
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                cp = 0xFFFD;
            }
            w += utf8_put(o + w, cp);
            break;
        }
        default: return 0;
        }
    }
    return 0; /* no closing quote */
}

/* ---- GPT-2's byte alphabet ---------------------------------------------------------- */

/* GPT-2 stores token bytes as printable characters: bytes 33..126, 161..172, 174..255 stand
 * for themselves, the other 68 bytes map to U+0100.. in increasing byte order. The same
 * order (printable first) gives the ranks of the 256 single-byte tokens. */
static int byte_is_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

static void gpt2_alphabet(uint32_t byte_to_cp[256], int cp_to_byte[324], uint32_t byte_rank[256]) {
    int n = 0, r = 0;
    for (int i = 0; i < 324; i++) cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        byte_to_cp[b] = byte_is_printable(b) ? (uint32_t)b : (uint32_t)(256 + n++);
        cp_to_byte[byte_to_cp[b]] = b;
        if (byte_is_printable(b)) byte_rank[b] = (uint32_t)r++;
    }
    for (int b = 0; b < 256; b++)
        if (!byte_is_printable(b)) byte_rank[b] = (uint32_t)r++;
}

/* GPT-2 alphabet text -> raw bytes, in place. Returns -1 on a character outside it. */
static int alphabet_to_bytes(unsigned char *s, size_t *n, const int cp_to_byte[324]) {
    size_t i = 0, w = 0;
    if (tokenizer_utf8_valid_prefix(s, *n) != *n) return -1;
    while (i < *n) {
        uint32_t cp;
        i += tokenizer_utf8_get(s + i, *n - i, &cp);
        if (cp >= 324 || cp_to_byte[cp] < 0) return -1;
        s[w++] = (unsigned char)cp_to_byte[cp];
    }
    *n = w;
    return 0;
}

/* ---- loading ------------------------------------------------------------------------ */

static Tokenizer *tokenizer_alloc(size_t vocab_size) {
    Tokenizer *t = callocCheck(1, sizeof *t, "tokenizer");
    t->vocab_size = vocab_size;
    t->offsets = callocCheck(vocab_size + 1, sizeof *t->offsets, "token offsets");
    return t;
}

/* A loader's end: its file's buffer freed; t when ok, else t freed and NULL. */
static Tokenizer *loader_end(unsigned char *buf, Tokenizer *t, int ok) {
    free(buf);
    if (ok) return t;
    tokenizer_free(t);
    return NULL;
}

/* A file of another tokenizer format, named in err (returns 1), or 0: a sentencepiece model
 * (protobuf: a ModelProto whose first field is a SentencePiece message, whose first is its piece
 * string: bytes 0x0A, a varint length, 0x0A) or a JSON file (an HF tokenizer.json). */
static size_t varint(const unsigned char *buf, size_t n, size_t *i) {
    size_t v = 0;
    for (int shift = 0; *i < n && shift < 35; shift += 7) {
        unsigned char b = buf[(*i)++];
        v |= (size_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) return v;
    }
    return 0;
}

static int other_format(const char *path, const unsigned char *buf, size_t n, char *err, size_t errlen) {
    size_t i = 1, piece = 0, inner = 0;
    if (n > 4 && buf[0] == 0x0A) {
        piece = varint(buf, n, &i); /* the SentencePiece message's length */
        if (i < n && buf[i] == 0x0A) i++, inner = varint(buf, n, &i) + 2; /* its piece string, with its tag */
    }
    if (piece > 0 && inner > 2 && inner <= piece && i + piece - 2 <= n) {
        tokenizer_set_err(err, errlen, "'%s' is a sentencepiece model (the tokenizer.model of Llama 2 and earlier "
                          "models), which llmc does not support: it reads Llama 3's tokenizer.model (a tiktoken rank "
                          "file), GPT-2's encoder.json + vocab.bpe and llm.c's tokenizer file", path);
        return 1;
    }
    for (i = 0; i < n && (buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\r' || buf[i] == '\t'); i++) {}
    if (i < n && buf[i] == '{') {
        tokenizer_set_err(err, errlen, "'%s' is a JSON file (a Hugging Face tokenizer.json?), which llmc does not read: "
                          "give the directory holding Llama 3's tokenizer.model (or original/tokenizer.model), a "
                          "tiktoken rank file, a directory with GPT-2's encoder.json + vocab.bpe, or llm.c's tokenizer "
                          "file", path);
        return 1;
    }
    return 0;
}

/* llm.c's tokenizer file: uint32 header[256], then per token a length byte and the bytes. */
static Tokenizer *load_llmc_file(const char *path, char *err, size_t errlen) {
    size_t n;
    unsigned char *buf = read_file(path, &n, err, errlen);
    if (!buf) return NULL;
    Tokenizer *t = NULL;
    uint32_t h[TOKENIZER_HEADER_INTS];
    if (other_format(path, buf, n, err, errlen)) goto fail;
    if (n < sizeof h) {
        tokenizer_set_err(err, errlen, "tokenizer file '%s' is %zu bytes, shorter than its 1024-byte header", path, n);
        goto fail;
    }
    memcpy(h, buf, sizeof h);
    if (h[0] != TOKENIZER_MAGIC) {
        tokenizer_set_err(err, errlen, "'%s' is not a tokenizer file: magic %u, expected %u", path, h[0],
                          (unsigned)TOKENIZER_MAGIC);
        goto fail;
    }
    if (h[1] != 1 && h[1] != 2) {
        tokenizer_set_err(err, errlen, "tokenizer file '%s' has version %u; only 1 and 2 exist", path, h[1]);
        goto fail;
    }
    if (h[2] == 0 || h[2] > (1u << 24)) {
        tokenizer_set_err(err, errlen, "tokenizer file '%s' has an implausible vocab size %u", path, h[2]);
        goto fail;
    }
    t = tokenizer_alloc(h[2]);
    t->eot = h[1] == 2 ? h[3] : 50256; /* version 1 predates the field; GPT-2's EOT */
    if (t->eot >= t->vocab_size) {
        tokenizer_set_err(err, errlen, "tokenizer file '%s': EOT id %u is outside the vocab of %u", path, t->eot, h[2]);
        goto fail;
    }
    size_t pos = sizeof h, total = 0;
    for (size_t id = 0; id < t->vocab_size; id++) {
        if (pos >= n || buf[pos] == 0 || pos + 1 + buf[pos] > n) {
            tokenizer_set_err(err, errlen,
                              "tokenizer file '%s' is truncated or corrupt at token %zu of %zu (offset %zu)", path, id,
                              t->vocab_size, pos);
            goto fail;
        }
        total += buf[pos];
        pos += 1 + buf[pos];
    }
    if (pos != n) {
        tokenizer_set_err(err, errlen, "tokenizer file '%s' has %zu unexpected bytes after its last token", path,
                          n - pos);
        goto fail;
    }
    t->blob = mallocCheck(total ? total : 1, "token bytes");
    pos = sizeof h, total = 0;
    for (size_t id = 0; id < t->vocab_size; id++) {
        memcpy(t->blob + total, buf + pos + 1, buf[pos]);
        total += buf[pos];
        pos += 1 + buf[pos];
        t->offsets[id + 1] = total;
    }
    return loader_end(buf, t, 1);
fail:
    return loader_end(buf, t, 0);
}

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

/* encoder.json: {"token in GPT-2's alphabet": id, ...}. Fills t's token bytes. */
static Tokenizer *load_encoder_json(const char *path, const int cp_to_byte[324], char *err, size_t errlen) {
    size_t n;
    char *buf = (char *)read_file(path, &n, err, errlen);
    if (!buf) return NULL;
    const char *p = buf, *end = buf + n;
    size_t count = 0, cap = 65536;
    char **keys = mallocCheck(cap * sizeof *keys, "encoder.json keys");
    size_t *lens = mallocCheck(cap * sizeof *lens, "encoder.json keys");
    long *ids = mallocCheck(cap * sizeof *ids, "encoder.json ids");
    char *s = NULL;
    size_t scap = 0, slen;
    Tokenizer *t = NULL;
    p = skip_ws(p, end);
    if (p == end || *p++ != '{') goto syntax;
    for (;;) {
        p = skip_ws(p, end);
        if (p < end && *p == '}' && count == 0) {
            p++;
            break;
        }
        size_t used = json_decode_string(p, (size_t)(end - p), &s, &scap, &slen);
        if (!used) goto syntax;
        p = skip_ws(p + used, end);
        if (p == end || *p++ != ':') goto syntax;
        p = skip_ws(p, end);
        char *num_end;
        errno = 0;
        long id = strtol(p, &num_end, 10);
        if (num_end == p || errno || id < 0 || id >= (1L << 24)) goto syntax;
        p = num_end;
        if (count == cap) {
            cap *= 2;
            keys = realloc(keys, cap * sizeof *keys);
            lens = realloc(lens, cap * sizeof *lens);
            ids = realloc(ids, cap * sizeof *ids);
            if (!keys || !lens || !ids) llmc_die("out of memory reading '%s'", path);
        }
        keys[count] = mallocCheck(slen ? slen : 1, "encoder.json key");
        memcpy(keys[count], s, slen);
        lens[count] = slen;
        ids[count++] = id;
        p = skip_ws(p, end);
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        if (p < end && *p == '}') {
            p++;
            break;
        }
        goto syntax;
    }
    if (skip_ws(p, end) != end) goto syntax;
    t = tokenizer_alloc(count);
    t->eot = NO_TOKEN;
    size_t *len_by_id = callocCheck(count, sizeof *len_by_id, "token lengths");
    char **key_by_id = callocCheck(count, sizeof *key_by_id, "token keys");
    for (size_t i = 0; i < count; i++) {
        if ((size_t)ids[i] >= count || key_by_id[ids[i]]) {
            tokenizer_set_err(err, errlen, "'%s': ids must be 0..%zu, each once; id %ld is %s", path, count - 1, ids[i],
                              (size_t)ids[i] >= count ? "out of range" : "repeated");
            goto fail_ids;
        }
        key_by_id[ids[i]] = keys[i];
        if (lens[i] == 13 && memcmp(keys[i], "<|endoftext|>", 13) == 0) {
            t->eot = (uint32_t)ids[i];
        } else if (lens[i] == 0 || alphabet_to_bytes((unsigned char *)keys[i], &lens[i], cp_to_byte) != 0) {
            tokenizer_set_err(err, errlen, "'%s': token %ld is empty or has a character outside GPT-2's byte alphabet",
                              path, ids[i]);
            goto fail_ids;
        }
        len_by_id[ids[i]] = lens[i];
    }
    if (t->eot == NO_TOKEN) {
        tokenizer_set_err(err, errlen, "'%s' has no <|endoftext|> token", path);
        goto fail_ids;
    }
    size_t total = 0;
    for (size_t id = 0; id < count; id++) t->offsets[id + 1] = total += len_by_id[id];
    t->blob = mallocCheck(total, "token bytes");
    for (size_t id = 0; id < count; id++) memcpy(t->blob + t->offsets[id], key_by_id[id], len_by_id[id]);
    free(len_by_id);
    free(key_by_id);
    goto done;
fail_ids:
    free(len_by_id);
    free(key_by_id);
    tokenizer_free(t);
    t = NULL;
    goto done;
syntax:
    tokenizer_set_err(err, errlen, "'%s' is not a JSON object of \"token\": id pairs (syntax error at byte %zu)", path,
                      (size_t)(p - buf));
done:
    for (size_t i = 0; i < count; i++) free(keys[i]);
    free(keys);
    free(lens);
    free(ids);
    free(s);
    free(buf);
    return t;
}

/* vocab.bpe: "#version" line, then one merge "A B" per line. As tiktoken does, checks that
 * the single bytes followed by the merges, in file order, give exactly encoder.json's ids:
 * that is what makes "rank == token id" true, which encoding relies on. */
static int check_vocab_bpe(const Tokenizer *t, const char *path, const int cp_to_byte[324],
                           const uint32_t byte_rank[256], char *err, size_t errlen) {
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        if (tokenizer_vocab_lookup(t, &c, 1) != byte_rank[b]) {
            tokenizer_set_err(err, errlen, "encoder.json next to '%s' does not give byte 0x%02x the id %u", path, b,
                              byte_rank[b]);
            return -1;
        }
    }
    size_t n;
    char *buf = (char *)read_file(path, &n, err, errlen);
    if (!buf) return -1;
    char *line = buf, *end = buf + n;
    size_t lineno = 0, rank = 256;
    int rc = 0;
    while (line < end) {
        char *nl = memchr(line, '\n', (size_t)(end - line));
        if (!nl) nl = end;
        size_t len = (size_t)(nl - line);
        lineno++;
        if (lineno == 1 || len == 0) { /* the "#version: 0.2" line; blank lines */
            line = nl + 1;
            continue;
        }
        char *sp = memchr(line, ' ', len);
        if (!sp || sp == line || sp == nl - 1 || memchr(sp + 1, ' ', (size_t)(nl - sp - 1))) {
            tokenizer_set_err(err, errlen, "'%s' line %zu is not a merge \"A B\"", path, lineno);
            rc = -1;
            break;
        }
        size_t la = (size_t)(sp - line), lb = (size_t)(nl - sp - 1);
        if (alphabet_to_bytes((unsigned char *)line, &la, cp_to_byte) != 0 ||
            alphabet_to_bytes((unsigned char *)sp + 1, &lb, cp_to_byte) != 0) {
            tokenizer_set_err(err, errlen, "'%s' line %zu has a character outside GPT-2's byte alphabet", path, lineno);
            rc = -1;
            break;
        }
        memmove(line + la, sp + 1, lb);
        uint32_t id = tokenizer_vocab_lookup(t, (unsigned char *)line, la + lb);
        if (id != rank) {
            tokenizer_set_err(err, errlen, "'%s' line %zu: merge number %zu should be token %zu but encoder.json %s",
                              path, lineno, rank - 256, rank, id == NO_TOKEN ? "lacks it" : "gives another id");
            rc = -1;
            break;
        }
        rank++;
        line = nl + 1;
    }
    if (rc == 0 && rank + 1 != t->vocab_size) {
        tokenizer_set_err(err, errlen, "'%s' has %zu merges but encoder.json has %zu tokens (expected merges + 257)",
                          path, rank - 256, t->vocab_size);
        rc = -1;
    }
    free(buf);
    return rc;
}

static Tokenizer *load_gpt2_dir(const char *dir, char *err, size_t errlen) {
    uint32_t byte_to_cp[256], byte_rank[256];
    int cp_to_byte[324];
    gpt2_alphabet(byte_to_cp, cp_to_byte, byte_rank);
    char enc_path[4096], bpe_path[4096];
    snprintf(enc_path, sizeof enc_path, "%s/encoder.json", dir);
    snprintf(bpe_path, sizeof bpe_path, "%s/vocab.bpe", dir);
    Tokenizer *t = load_encoder_json(enc_path, cp_to_byte, err, errlen);
    if (!t) return NULL;
    char why[512];
    if (tokenizer_build_encode_tables(t, tokenizer_builtin_pattern("gpt2"), why, sizeof why) != 0) {
        tokenizer_set_err(err, errlen, "'%s': %s", enc_path, why);
        tokenizer_free(t);
        return NULL;
    }
    if (check_vocab_bpe(t, bpe_path, cp_to_byte, byte_rank, err, errlen) != 0) {
        tokenizer_free(t);
        return NULL;
    }
    return t;
}

/* ---- tiktoken rank files -------------------------------------------------------------- */

static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Standard base64 with padding, strictly: s[0..n) -> out (at least 3n/4 bytes). -1 if malformed. */
static long b64_decode(const unsigned char *s, size_t n, unsigned char *out) {
    if (n == 0 || n % 4) return -1;
    size_t w = 0;
    for (size_t i = 0; i < n; i += 4) {
        int pad = (s[i + 3] == '=') + (s[i + 2] == '=' && s[i + 3] == '=');
        if (pad && i + 4 != n) return -1;
        int v[4];
        for (int k = 0; k < 4 - pad; k++)
            if ((v[k] = b64_value(s[i + k])) < 0) return -1;
        uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (pad < 2 ? (uint32_t)v[2] << 6 : 0) |
                     (pad < 1 ? (uint32_t)v[3] : 0);
        out[w++] = (unsigned char)(x >> 16);
        if (pad < 2) out[w++] = (unsigned char)(x >> 8);
        if (pad < 1) out[w++] = (unsigned char)x;
        if ((pad == 2 && (x & 0xFFFF)) || (pad == 1 && (x & 0xFF))) return -1; /* non-canonical trailing bits */
    }
    return (long)w;
}

/* The line starting at *next in buf[0..n): returns its start, its length without "\n" or "\r\n"
 * in *len, and moves *next past it. */
static size_t next_line(const unsigned char *buf, size_t n, size_t *next, size_t *len) {
    size_t i = *next, e = i;
    while (e < n && buf[e] != '\n') e++;
    *len = e - i - (e > i && buf[e - 1] == '\r');
    *next = e + 1;
    return i;
}

Tokenizer *tokenizer_load_tiktoken(const char *path, const char *pattern, const TokenizerSpecial *specials,
                                   size_t nspecial, const char *delimiter, char *err, size_t errlen) {
    size_t n;
    unsigned char *buf = read_file(path, &n, err, errlen);
    if (!buf) return NULL;
    Tokenizer *t = NULL;
    /* pass 1: count lines, find the highest rank */
    size_t nranks = 0, max_rank = 0, line = 0;
    for (size_t next = 0, i, len; next < n;) {
        i = next_line(buf, n, &next, &len);
        line++;
        if (len) {
            const unsigned char *sp = memchr(buf + i, ' ', len);
            char *end;
            errno = 0;
            unsigned long long r = sp ? strtoull((const char *)sp + 1, &end, 10) : 0;
            if (!sp || sp == buf + i || sp + 1 == buf + i + len || !(sp[1] >= '0' && sp[1] <= '9') || errno ||
                (const unsigned char *)end != buf + i + len) {
                tokenizer_set_err(err, errlen, "tiktoken rank file '%s', line %zu: expected 'BASE64TOKEN RANK'", path,
                                  line);
                goto fail;
            }
            if (r >= (1u << 24)) {
                tokenizer_set_err(err, errlen, "tiktoken rank file '%s', line %zu: rank %llu is implausibly large",
                                  path, line, r);
                goto fail;
            }
            nranks++;
            if (r > max_rank) max_rank = r;
        }
    }
    if (nranks == 0) {
        tokenizer_set_err(err, errlen, "tiktoken rank file '%s' has no tokens", path);
        goto fail;
    }
    if (max_rank + 1 != nranks) {
        tokenizer_set_err(err, errlen,
                          "tiktoken rank file '%s': %zu tokens but ranks up to %zu: ranks must be 0..%zu, each once",
                          path, nranks, max_rank, nranks - 1);
        goto fail;
    }
    size_t vocab = nranks;
    for (size_t k = 0; k < nspecial; k++) {
        if (!specials[k].name[0] || strlen(specials[k].name) > 255) {
            tokenizer_set_err(err, errlen, "special token %zu: its name must be 1 to 255 bytes", k);
            goto fail;
        }
        if (specials[k].id < nranks) {
            tokenizer_set_err(err, errlen,
                              "special token '%s' has id %u, which is a rank of '%s' (0..%zu): special ids must "
                              "come after the ranks",
                              specials[k].name, specials[k].id, path, nranks - 1);
            goto fail;
        }
        for (size_t j = 0; j < k; j++)
            if (specials[j].id == specials[k].id || strcmp(specials[j].name, specials[k].name) == 0) {
                tokenizer_set_err(err, errlen, "special tokens '%s' and '%s' have the same %s", specials[j].name,
                                  specials[k].name, specials[j].id == specials[k].id ? "id" : "name");
                goto fail;
            }
        if ((size_t)specials[k].id + 1 > vocab) vocab = (size_t)specials[k].id + 1;
    }
    t = tokenizer_alloc(vocab);
    t->special = callocCheck(vocab, 1, "special token flags");
    size_t *lens = callocCheck(vocab, sizeof *lens, "token lengths");
    unsigned char **starts = callocCheck(vocab, sizeof *starts, "token starts");
    unsigned char *bytes = mallocCheck(n + 1, "token bytes"); /* decoded tokens are shorter than their base64 */
    size_t used = 0;
    line = 0;
    for (size_t next = 0, i, len; next < n;) { /* pass 2: decode */
        i = next_line(buf, n, &next, &len);
        line++;
        if (len) {
            const unsigned char *sp = memchr(buf + i, ' ', len);
            size_t r = (size_t)strtoull((const char *)sp + 1, NULL, 10);
            long dl = b64_decode(buf + i, (size_t)(sp - (buf + i)), bytes + used);
            if (dl <= 0 || starts[r]) {
                int w = (int)(sp - (buf + i) > 40 ? 40 : sp - (buf + i));
                if (dl <= 0)
                    tokenizer_set_err(err, errlen,
                                      "tiktoken rank file '%s', line %zu: token '%.*s' is not valid base64", path, line,
                                      w, (const char *)buf + i);
                else
                    tokenizer_set_err(err, errlen, "tiktoken rank file '%s', line %zu: rank %zu appears twice", path,
                                      line, r);
                free(lens), free(starts), free(bytes);
                goto fail;
            }
            starts[r] = bytes + used, lens[r] = (size_t)dl;
            used += (size_t)dl;
        }
    }
    for (size_t k = 0; k < nspecial; k++) {
        t->special[specials[k].id] = 2;
        lens[specials[k].id] = strlen(specials[k].name);
    }
    size_t total = used;
    for (size_t k = 0; k < nspecial; k++) total += lens[specials[k].id];
    t->blob = mallocCheck(total ? total : 1, "token bytes");
    size_t off = 0;
    for (size_t id = 0; id < vocab; id++) {
        if (id >= nranks && !t->special[id]) t->special[id] = 1; /* an id no token uses */
        const unsigned char *src = starts[id];
        for (size_t k = 0; k < nspecial && !src; k++)
            if (specials[k].id == id) src = (const unsigned char *)specials[k].name;
        if (lens[id]) memcpy(t->blob + off, src, lens[id]);
        off += lens[id];
        t->offsets[id + 1] = off;
    }
    free(lens), free(starts), free(bytes);
    /* the specials, longest name first (a longer name wins where two start at the same byte) */
    t->nspecial = nspecial;
    t->special_ids = mallocCheck((nspecial ? nspecial : 1) * sizeof *t->special_ids, "special tokens");
    for (size_t k = 0; k < nspecial; k++) {
        size_t j = k;
        uint32_t id = specials[k].id;
        size_t len = strlen(specials[k].name);
        while (j > 0 && t->offsets[t->special_ids[j - 1] + 1] - t->offsets[t->special_ids[j - 1]] < len) {
            t->special_ids[j] = t->special_ids[j - 1];
            j--;
        }
        t->special_ids[j] = id;
    }
    t->eot = NO_TOKEN;
    for (size_t k = 0; k < nspecial; k++)
        if (delimiter && strcmp(specials[k].name, delimiter) == 0) t->eot = specials[k].id;
    if (delimiter && t->eot == NO_TOKEN) {
        tokenizer_set_err(err, errlen, "the document delimiter '%s' is not one of the %zu special tokens", delimiter,
                          nspecial);
        goto fail;
    }
    if (!delimiter) t->eot = nspecial ? specials[0].id : (uint32_t)vocab; /* vocab: none */
    char why[512];
    if (tokenizer_build_encode_tables(t, pattern, why, sizeof why) != 0) {
        tokenizer_set_err(err, errlen, "tiktoken rank file '%s': %s", path, why);
        goto fail;
    }
    return loader_end(buf, t, 1);
fail:
    return loader_end(buf, t, 0);
}

size_t tokenizer_llama3_specials(uint32_t first_id, TokenizerSpecial out[TOKENIZER_LLAMA3_NSPECIAL], char *names,
                                 size_t names_len) {
    static const char *const named[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                                        "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                                        "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                                        "<|python_tag|>"};
    enum { NAMED = sizeof named / sizeof named[0] };
    size_t used = 0;
    for (size_t k = 0; k < TOKENIZER_LLAMA3_NSPECIAL; k++) {
        char *name = names + used;
        int w = k < NAMED ? snprintf(name, names_len - used, "%s", named[k])
                          : snprintf(name, names_len - used, "<|reserved_special_token_%zu|>", k - NAMED + 2);
        if (w < 0 || (size_t)w + 1 > names_len - used) llmc_die("tokenizer_llama3_specials: %zu bytes for the names", names_len);
        used += (size_t)w + 1;
        out[k] = (TokenizerSpecial){name, first_id + (uint32_t)k};
    }
    return TOKENIZER_LLAMA3_NSPECIAL;
}

Tokenizer *tokenizer_load_llama3(const char *path, char *err, size_t errlen) {
    size_t n;
    unsigned char *buf = read_file(path, &n, err, errlen);
    if (!buf) return NULL;
    if (other_format(path, buf, n, err, errlen)) {
        free(buf);
        return NULL;
    }
    size_t ranks = 0; /* its non-empty lines (the loader checks each) */
    for (size_t next = 0, len; next < n;) {
        next_line(buf, n, &next, &len);
        ranks += len > 0;
    }
    free(buf);
    if (ranks > UINT32_MAX - TOKENIZER_LLAMA3_NSPECIAL) ranks = 0; /* the loader says what is wrong */
    TokenizerSpecial specials[TOKENIZER_LLAMA3_NSPECIAL];
    char names[TOKENIZER_LLAMA3_NSPECIAL * 40];
    tokenizer_llama3_specials((uint32_t)ranks, specials, names, sizeof names);
    return tokenizer_load_tiktoken(path, tokenizer_builtin_pattern("llama3"), specials, TOKENIZER_LLAMA3_NSPECIAL,
                                   "<|begin_of_text|>", err, errlen);
}

int tokenizer_find_llama3(const char *dir, char *out, size_t outlen) {
    static const char *const names[] = {"tokenizer.model", "original/tokenizer.model"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        struct stat st; /* lstat: what is there, even a FIFO or a symbolic link loop (its loader says what) */
        if ((size_t)snprintf(out, outlen, "%s/%s", dir, names[i]) < outlen && lstat(out, &st) == 0) return 0;
    }
    return -1;
}

/* Does the regular file at path start like a tiktoken rank file ("BASE64 RANK" line)? */
static int looks_like_rank_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    unsigned char buf[512];
    size_t n = fread(buf, 1, sizeof buf, f), i = 0;
    fclose(f);
    while (i < n && (b64_value(buf[i]) >= 0 || buf[i] == '=')) i++;
    if (i == 0 || i == n || buf[i] != ' ') return 0;
    size_t digits = ++i;
    while (i < n && buf[i] >= '0' && buf[i] <= '9') i++;
    return i > digits && (i == n || buf[i] == '\n' || buf[i] == '\r');
}

Tokenizer *tokenizer_load(const char *path, char *err, size_t errlen) {
    struct stat st;
    if (stat(path, &st) != 0) {
        const int e = errno;
        FILE *f = lstat(path, &st) == 0 ? fopen_regular(path, err, errlen) : NULL; /* a link: which kind */
        if (f) fclose(f);
        else if (lstat(path, &st) != 0) tokenizer_set_err(err, errlen, "cannot open tokenizer '%s': %s", path, strerror(e));
        return NULL;
    }
    char model[4200];
    const char *base = strrchr(path, '/');
    if (S_ISDIR(st.st_mode) && strcmp(base ? base + 1 : path, "tokenizer.model") == 0) { /* found in an HF directory */
        tokenizer_set_err(err, errlen, "'%s' is a directory, not a tokenizer file", path);
        return NULL;
    }
    if (S_ISDIR(st.st_mode))
        return tokenizer_find_llama3(path, model, sizeof model) == 0 ? tokenizer_load_llama3(model, err, errlen)
                                                                      : load_gpt2_dir(path, err, errlen);
    if (S_ISREG(st.st_mode) && looks_like_rank_file(path)) return tokenizer_load_llama3(path, err, errlen);
    return load_llmc_file(path, err, errlen);
}

int tokenizer_find_default(char *out, size_t outlen) {
    char envdir[2048];
    const char *cands[3];
    int n = 0;
    const char *env = getenv("LLMC_DATA_DIR");
    if (env && *env && (size_t)snprintf(envdir, sizeof envdir, "%s/gpt2", env) < sizeof envdir) cands[n++] = envdir;
    cands[n++] = "data/gpt2";
    cands[n++] = "../shared/data/gpt2";
    for (int i = 0; i < n; i++) {
        char a[4096], b[4096];
        snprintf(a, sizeof a, "%s/encoder.json", cands[i]);
        snprintf(b, sizeof b, "%s/vocab.bpe", cands[i]);
        if (access(a, R_OK) == 0 && access(b, R_OK) == 0 && strlen(cands[i]) < outlen) {
            snprintf(out, outlen, "%s", cands[i]);
            return 0;
        }
    }
    return -1;
}

int tokenizer_save_llmc(const Tokenizer *t, const char *path, char *err, size_t errlen) {
    for (uint32_t id = 0; id < t->vocab_size; id++) {
        size_t n = t->offsets[id + 1] - t->offsets[id];
        if (n == 0 || n > 255) {
            tokenizer_set_err(err, errlen, "cannot write '%s': token %u is %zu bytes; the format allows 1..255", path,
                              id, n);
            return -1;
        }
    }
    uint32_t h[TOKENIZER_HEADER_INTS] = {0};
    h[0] = TOKENIZER_MAGIC, h[1] = 2, h[2] = (uint32_t)t->vocab_size, h[3] = t->eot;
    AtomicFile af;
    atomic_open(&af, path);
    fwriteCheck(h, sizeof h, 1, af.f, af.tmp_path);
    for (uint32_t id = 0; id < t->vocab_size; id++) {
        unsigned char n = (unsigned char)(t->offsets[id + 1] - t->offsets[id]);
        fwriteCheck(&n, 1, 1, af.f, af.tmp_path);
        fwriteCheck(t->blob + t->offsets[id], 1, n, af.f, af.tmp_path);
    }
    atomic_commit(&af);
    return 0;
}

