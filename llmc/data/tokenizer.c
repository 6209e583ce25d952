/*
 * tokenizer.c - GPT-2 byte-level BPE (see tokenizer.h for the contract).
 *
 * Tables built at load time (all read-only afterwards, shared by every thread):
 *   token bytes: blob + offsets, id -> bytes (decode; tokenizer file export)
 *   vocab map:   bytes -> id for every mergeable token (not the EOT special token)
 *   pair map:    (left id, right id) -> id of the token whose bytes are their concatenation.
 *                tiktoken merges any adjacent pair whose concatenation is a token, ranked by
 *                that token's id (for GPT-2 rank == id: checked against vocab.bpe at load),
 *                so the map is built from every split point of every token, not only from
 *                the 50,000 listed merges.
 * Per thread (TokenizerContext): PCRE2 match data + JIT stack, BPE scratch, a word cache.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "llmc/data/tokenizer.h"
#include "llmc/core/atomicfile.h"
#include "llmc/core/check.h"

#include <errno.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NO_TOKEN UINT32_MAX

/* GPT-2's pre-tokenisation pattern. \s is spelled out as the Unicode White_Space property
 * (what tiktoken's Rust regex uses; PCRE2's UCP \s differs at U+0085 and U+180E).
 * Possessive quantifiers only where backtracking can never change the match. */
#define WS "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}" \
           "\\x{202F}\\x{205F}\\x{3000}"
/* Letters and numbers that Unicode added after 14.0 (PCRE2 10.42's tables) and that tiktoken's
 * regex already classifies as \p{L} / \p{N}: found by test/test_tokenizer.py's sweep over
 * every code point. Harmless with a newer PCRE2 (the class only repeats them). */
#define NEW_L \
    "\\x{1C89}-\\x{1C8A}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}\\x{105C0}-\\x{105F3}" \
    "\\x{10D4A}-\\x{10D65}\\x{10D6F}-\\x{10D85}\\x{10EC2}-\\x{10EC4}\\x{1123F}-\\x{11240}" \
    "\\x{11380}-\\x{11389}\\x{1138B}\\x{1138E}\\x{11390}-\\x{113B5}\\x{113B7}\\x{113D1}" \
    "\\x{113D3}\\x{11BC0}-\\x{11BE0}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}" \
    "\\x{1342F}\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}\\x{16100}-\\x{1611D}" \
    "\\x{16D40}-\\x{16D6C}\\x{18CFF}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}" \
    "\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}\\x{2B739}" \
    "\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}"
#define NEW_N \
    "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11F50}-\\x{11F59}" \
    "\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}\\x{1CCF0}-\\x{1CCF9}\\x{1D2C0}-\\x{1D2D3}" \
    "\\x{1E4F0}-\\x{1E4F9}\\x{1E5F1}-\\x{1E5FA}"
#define LETTER "\\p{L}" NEW_L
#define NUMBER "\\p{N}" NEW_N
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?[" LETTER "]++| ?[" NUMBER "]++| ?[^" WS LETTER NUMBER "]++"
    "|[" WS "]+(?![^" WS "])|[" WS "]++";

/* cl100k_base's pattern as tiktoken 0.14 spells it ($ as \z: PCRE2's $ also matches before a
 * final newline, Rust's only at the end) and Llama 3's (Meta's tokenizer.py), with the same
 * spelled-out classes as GPT-2's. */
static const char CL100K_PATTERN[] =
    "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n" LETTER NUMBER "]?+[" LETTER "]++|[" NUMBER "]{1,3}+"
    "| ?[^" WS LETTER NUMBER "]++[\\r\\n]*+|[" WS "]++\\z|[" WS "]*[\\r\\n]|[" WS "]+(?![^" WS "])|[" WS "]";
static const char LLAMA3_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n" LETTER NUMBER "]?[" LETTER "]+|[" NUMBER "]{1,3}"
    "| ?[^" WS LETTER NUMBER "]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+";

const char *tokenizer_builtin_pattern(const char *name) {
    if (strcmp(name, "gpt2") == 0) return GPT2_PATTERN;
    if (strcmp(name, "cl100k") == 0) return CL100K_PATTERN;
    if (strcmp(name, "llama3") == 0) return LLAMA3_PATTERN;
    return NULL;
}

enum { CACHE_MAX_PIECE = 128, CACHE_MIN_SLOTS = 1 << 15, CACHE_MAX_SLOTS = 1 << 20 };

typedef struct {
    uint64_t key;   /* left id << 32 | right id */
    uint32_t value; /* merged id; NO_TOKEN marks an empty slot */
} PairSlot;

struct Tokenizer {
    size_t vocab_size;
    uint32_t eot;
    unsigned char *blob;   /* all token bytes back to back */
    size_t *offsets;       /* (vocab_size + 1) offsets into blob */
    int can_encode;        /* the tables below exist only when 1 */
    uint32_t byte_token[256];
    uint32_t *vocab_slots; /* id + 1 per slot, 0 = empty */
    size_t vocab_mask;
    PairSlot *pair_slots;
    size_t pair_mask;
    pcre2_code *re;
    int jit;               /* 1 if re was JIT-compiled */
    unsigned char *special; /* (vocab_size) 1 = a special token (or an unused id): never made by BPE; NULL = only eot */
    uint32_t *special_ids;  /* the special tokens, longest name first, for tokenizer_encode_special */
    size_t nspecial;
};

typedef struct {
    uint32_t id, len;      /* len 0: merged into its left neighbour */
    int32_t prev, next;    /* neighbours by index, -1 at the ends */
} BpeSym;

typedef struct {
    uint32_t rank, pos;    /* merged token id; index of the left symbol */
    uint32_t left_len, right_len; /* lengths when pushed: a mismatch means stale */
} BpeCand;

typedef struct {
    uint64_t hash;
    uint32_t key_off, key_len; /* key_len 0 = empty */
    uint32_t val_off, val_n;
} CacheSlot;

struct TokenizerContext {
    const Tokenizer *tok;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    BpeSym *syms;
    BpeCand *heap;
    size_t scratch_cap;     /* capacity of syms and heap, in entries */
    TokenBuf piece_ids;     /* BPE output of one piece */
    CacheSlot *cache;
    size_t cache_mask, cache_used;
    unsigned char *cache_keys;
    size_t keys_len, keys_cap;
    uint32_t *cache_vals;
    size_t vals_len, vals_cap;
};

/* ---- small helpers ------------------------------------------------------------------ */

static void set_err(char *err, size_t errlen, const char *fmt, ...) LLMC_PRINTF(3, 4);
static void set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 29;
        p += 8, n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0x94d049bb133111ebull;
    return h ^ (h >> 32);
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static size_t pow2_at_least(size_t n) {
    size_t p = 1;
    while (p < n) p <<= 1;
    return p;
}

void token_buf_push(TokenBuf *buf, uint32_t id) {
    if (buf->n == buf->cap) {
        size_t cap = buf->cap ? buf->cap * 2 : 1024;
        uint32_t *ids = realloc(buf->ids, cap * sizeof *ids);
        if (!ids) llmc_die("out of memory growing a token buffer to %zu tokens", cap);
        buf->ids = ids, buf->cap = cap;
    }
    buf->ids[buf->n++] = id;
}

void token_buf_free(TokenBuf *buf) {
    free(buf->ids);
    buf->ids = NULL, buf->n = buf->cap = 0;
}

/* Reads a whole file; NULL with a reason on failure. */
static unsigned char *read_file(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen_regular(path, err, errlen); /* a FIFO or device would block or never end */
    if (!f) return NULL;
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        set_err(err, errlen, "cannot stat '%s': %s", path, strerror(errno));
        fclose(f);
        return NULL;
    }
    size_t n = (size_t)st.st_size;
    unsigned char *buf = malloc(n + 1);
    if (!buf) llmc_die("out of memory reading '%s' (%zu bytes)", path, n);
    if (fread(buf, 1, n, f) != n) {
        set_err(err, errlen, "cannot read '%s': %s", path, ferror(f) ? strerror(errno) : "short read");
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}

/* ---- UTF-8 and JSON ----------------------------------------------------------------- */

/* Length of the longest valid UTF-8 prefix of s[0..n) (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF). */
static size_t utf8_valid_prefix(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c == 0xE0) need = 2, lo = 0xA0;
        else if (c == 0xED) need = 2, hi = 0x9F;
        else if (c >= 0xE1 && c <= 0xEF) need = 2;
        else if (c == 0xF0) need = 3, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3) need = 3;
        else if (c == 0xF4) need = 3, hi = 0x8F;
        else return i;
        if (i + need >= n) return i; /* truncated sequence */
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += need + 1;
    }
    return n;
}

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

/* Decodes one UTF-8 code point (input already validated); returns its length. */
static size_t utf8_get(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (len > n) len = n;
    uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < len; k++) v = (v << 6) | (s[k] & 0x3F);
    *cp = v;
    return len;
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
    if (utf8_valid_prefix(s, *n) != *n) return -1;
    while (i < *n) {
        uint32_t cp;
        i += utf8_get(s + i, *n - i, &cp);
        if (cp >= 324 || cp_to_byte[cp] < 0) return -1;
        s[w++] = (unsigned char)cp_to_byte[cp];
    }
    *n = w;
    return 0;
}

/* ---- lookup tables ------------------------------------------------------------------ */

static uint32_t vocab_lookup_h(const Tokenizer *t, const unsigned char *p, size_t n, uint64_t h) {
    for (size_t s = h & t->vocab_mask;; s = (s + 1) & t->vocab_mask) {
        uint32_t v = t->vocab_slots[s];
        if (v == 0) return NO_TOKEN;
        size_t len = t->offsets[v] - t->offsets[v - 1];
        if (len == n && memcmp(t->blob + t->offsets[v - 1], p, n) == 0) return v - 1;
    }
}

static uint32_t vocab_lookup(const Tokenizer *t, const unsigned char *p, size_t n) {
    return vocab_lookup_h(t, p, n, hash_bytes(p, n));
}

static uint32_t pair_lookup(const Tokenizer *t, uint32_t a, uint32_t b) {
    uint64_t key = (uint64_t)a << 32 | b;
    for (size_t s = hash_u64(key) & t->pair_mask;; s = (s + 1) & t->pair_mask) {
        if (t->pair_slots[s].value == NO_TOKEN) return NO_TOKEN;
        if (t->pair_slots[s].key == key) return t->pair_slots[s].value;
    }
}

/* Builds the vocab map, pair map and byte tokens from the token bytes. */
static int is_special(const Tokenizer *t, uint32_t id) { return t->special ? t->special[id] : id == t->eot; }

static int build_encode_tables(Tokenizer *t, const char *pattern, char *err, size_t errlen) {
    t->vocab_mask = pow2_at_least(t->vocab_size * 2 + 16) - 1;
    t->vocab_slots = callocCheck(t->vocab_mask + 1, sizeof *t->vocab_slots, "vocab map");
    for (uint32_t id = 0; id < t->vocab_size; id++) {
        if (is_special(t, id)) continue; /* never produced by BPE */
        const unsigned char *p = t->blob + t->offsets[id];
        size_t n = t->offsets[id + 1] - t->offsets[id];
        uint64_t h = hash_bytes(p, n);
        if (vocab_lookup_h(t, p, n, h) != NO_TOKEN) {
            set_err(err, errlen, "token %u duplicates the bytes of another token", id);
            return -1;
        }
        size_t s = h & t->vocab_mask;
        while (t->vocab_slots[s]) s = (s + 1) & t->vocab_mask;
        t->vocab_slots[s] = id + 1;
    }
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        t->byte_token[b] = vocab_lookup(t, &c, 1);
        if (t->byte_token[b] == NO_TOKEN) {
            set_err(err, errlen, "the vocabulary has no token for byte 0x%02x", b);
            return -1;
        }
    }
    /* every split of every token into two tokens is a possible merge */
    size_t cap = 1 << 16, npairs = 0;
    uint64_t *keys = mallocCheck(cap * sizeof *keys, "pair list");
    uint32_t *vals = mallocCheck(cap * sizeof *vals, "pair list");
    for (uint32_t id = 0; id < t->vocab_size; id++) {
        if (is_special(t, id)) continue;
        const unsigned char *p = t->blob + t->offsets[id];
        size_t n = t->offsets[id + 1] - t->offsets[id];
        for (size_t k = 1; k < n; k++) {
            uint32_t a = vocab_lookup(t, p, k), b = vocab_lookup(t, p + k, n - k);
            if (a == NO_TOKEN || b == NO_TOKEN) continue;
            if (npairs == cap) {
                cap *= 2;
                keys = realloc(keys, cap * sizeof *keys);
                vals = realloc(vals, cap * sizeof *vals);
                if (!keys || !vals) llmc_die("out of memory building the BPE pair map");
            }
            keys[npairs] = (uint64_t)a << 32 | b, vals[npairs] = id, npairs++;
        }
    }
    t->pair_mask = pow2_at_least(npairs * 2 + 16) - 1;
    t->pair_slots = mallocCheck((t->pair_mask + 1) * sizeof *t->pair_slots, "pair map");
    for (size_t s = 0; s <= t->pair_mask; s++) t->pair_slots[s].value = NO_TOKEN;
    for (size_t i = 0; i < npairs; i++) {
        size_t s = hash_u64(keys[i]) & t->pair_mask;
        while (t->pair_slots[s].value != NO_TOKEN) s = (s + 1) & t->pair_mask;
        t->pair_slots[s].key = keys[i], t->pair_slots[s].value = vals[i];
    }
    free(keys);
    free(vals);

    int code;
    PCRE2_SIZE at;
    t->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, &code, &at, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        set_err(err, errlen, "PCRE2 cannot compile the pre-tokenizer pattern at offset %zu: %s", (size_t)at, msg);
        return -1;
    }
    t->jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
    t->can_encode = 1;
    return 0;
}

/* ---- loading ------------------------------------------------------------------------ */

static Tokenizer *tokenizer_alloc(size_t vocab_size) {
    Tokenizer *t = callocCheck(1, sizeof *t, "tokenizer");
    t->vocab_size = vocab_size;
    t->offsets = callocCheck(vocab_size + 1, sizeof *t->offsets, "token offsets");
    return t;
}

/* llm.c's tokenizer file: uint32 header[256], then per token a length byte and the bytes. */
static Tokenizer *load_llmc_file(const char *path, char *err, size_t errlen) {
    size_t n;
    unsigned char *buf = read_file(path, &n, err, errlen);
    if (!buf) return NULL;
    Tokenizer *t = NULL;
    uint32_t h[TOKENIZER_HEADER_INTS];
    if (n < sizeof h) {
        set_err(err, errlen, "tokenizer file '%s' is %zu bytes, shorter than its 1024-byte header", path, n);
        goto fail;
    }
    memcpy(h, buf, sizeof h);
    if (h[0] != TOKENIZER_MAGIC) {
        set_err(err, errlen, "'%s' is not a tokenizer file: magic %u, expected %u", path, h[0],
                (unsigned)TOKENIZER_MAGIC);
        goto fail;
    }
    if (h[1] != 1 && h[1] != 2) {
        set_err(err, errlen, "tokenizer file '%s' has version %u; only 1 and 2 exist", path, h[1]);
        goto fail;
    }
    if (h[2] == 0 || h[2] > (1u << 24)) {
        set_err(err, errlen, "tokenizer file '%s' has an implausible vocab size %u", path, h[2]);
        goto fail;
    }
    t = tokenizer_alloc(h[2]);
    t->eot = h[1] == 2 ? h[3] : 50256; /* version 1 predates the field; GPT-2's EOT */
    if (t->eot >= t->vocab_size) {
        set_err(err, errlen, "tokenizer file '%s': EOT id %u is outside the vocab of %u", path, t->eot, h[2]);
        goto fail;
    }
    size_t pos = sizeof h, total = 0;
    for (size_t id = 0; id < t->vocab_size; id++) {
        if (pos >= n || buf[pos] == 0 || pos + 1 + buf[pos] > n) {
            set_err(err, errlen, "tokenizer file '%s' is truncated or corrupt at token %zu of %zu (offset %zu)",
                    path, id, t->vocab_size, pos);
            goto fail;
        }
        total += buf[pos];
        pos += 1 + buf[pos];
    }
    if (pos != n) {
        set_err(err, errlen, "tokenizer file '%s' has %zu unexpected bytes after its last token", path, n - pos);
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
    free(buf);
    return t;
fail:
    free(buf);
    tokenizer_free(t);
    return NULL;
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
            set_err(err, errlen, "'%s': ids must be 0..%zu, each once; id %ld is %s", path, count - 1, ids[i],
                    (size_t)ids[i] >= count ? "out of range" : "repeated");
            goto fail_ids;
        }
        key_by_id[ids[i]] = keys[i];
        if (lens[i] == 13 && memcmp(keys[i], "<|endoftext|>", 13) == 0) {
            t->eot = (uint32_t)ids[i];
        } else if (lens[i] == 0 || alphabet_to_bytes((unsigned char *)keys[i], &lens[i], cp_to_byte) != 0) {
            set_err(err, errlen, "'%s': token %ld is empty or has a character outside GPT-2's byte alphabet",
                    path, ids[i]);
            goto fail_ids;
        }
        len_by_id[ids[i]] = lens[i];
    }
    if (t->eot == NO_TOKEN) {
        set_err(err, errlen, "'%s' has no <|endoftext|> token", path);
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
    set_err(err, errlen, "'%s' is not a JSON object of \"token\": id pairs (syntax error at byte %zu)", path,
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
        if (vocab_lookup(t, &c, 1) != byte_rank[b]) {
            set_err(err, errlen, "encoder.json next to '%s' does not give byte 0x%02x the id %u", path, b,
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
            set_err(err, errlen, "'%s' line %zu is not a merge \"A B\"", path, lineno);
            rc = -1;
            break;
        }
        size_t la = (size_t)(sp - line), lb = (size_t)(nl - sp - 1);
        if (alphabet_to_bytes((unsigned char *)line, &la, cp_to_byte) != 0 ||
            alphabet_to_bytes((unsigned char *)sp + 1, &lb, cp_to_byte) != 0) {
            set_err(err, errlen, "'%s' line %zu has a character outside GPT-2's byte alphabet", path, lineno);
            rc = -1;
            break;
        }
        memmove(line + la, sp + 1, lb);
        uint32_t id = vocab_lookup(t, (unsigned char *)line, la + lb);
        if (id != rank) {
            set_err(err, errlen, "'%s' line %zu: merge number %zu should be token %zu but encoder.json %s", path,
                    lineno, rank - 256, rank, id == NO_TOKEN ? "lacks it" : "gives another id");
            rc = -1;
            break;
        }
        rank++;
        line = nl + 1;
    }
    if (rc == 0 && rank + 1 != t->vocab_size) {
        set_err(err, errlen, "'%s' has %zu merges but encoder.json has %zu tokens (expected merges + 257)", path,
                rank - 256, t->vocab_size);
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
    if (build_encode_tables(t, GPT2_PATTERN, why, sizeof why) != 0) {
        set_err(err, errlen, "'%s': %s", enc_path, why);
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
                set_err(err, errlen, "tiktoken rank file '%s', line %zu: expected 'BASE64TOKEN RANK'", path, line);
                goto fail;
            }
            if (r >= (1u << 24)) {
                set_err(err, errlen, "tiktoken rank file '%s', line %zu: rank %llu is implausibly large", path, line, r);
                goto fail;
            }
            nranks++;
            if (r > max_rank) max_rank = r;
        }
    }
    if (nranks == 0) {
        set_err(err, errlen, "tiktoken rank file '%s' has no tokens", path);
        goto fail;
    }
    if (max_rank + 1 != nranks) {
        set_err(err, errlen, "tiktoken rank file '%s': %zu tokens but ranks up to %zu: ranks must be 0..%zu, each once",
                path, nranks, max_rank, nranks - 1);
        goto fail;
    }
    size_t vocab = nranks;
    for (size_t k = 0; k < nspecial; k++) {
        if (!specials[k].name[0] || strlen(specials[k].name) > 255) {
            set_err(err, errlen, "special token %zu: its name must be 1 to 255 bytes", k);
            goto fail;
        }
        if (specials[k].id < nranks) {
            set_err(err, errlen, "special token '%s' has id %u, which is a rank of '%s' (0..%zu): special ids must "
                    "come after the ranks", specials[k].name, specials[k].id, path, nranks - 1);
            goto fail;
        }
        for (size_t j = 0; j < k; j++)
            if (specials[j].id == specials[k].id || strcmp(specials[j].name, specials[k].name) == 0) {
                set_err(err, errlen, "special tokens '%s' and '%s' have the same %s", specials[j].name,
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
                    set_err(err, errlen, "tiktoken rank file '%s', line %zu: token '%.*s' is not valid base64", path,
                            line, w, (const char *)buf + i);
                else
                    set_err(err, errlen, "tiktoken rank file '%s', line %zu: rank %zu appears twice", path, line, r);
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
        set_err(err, errlen, "the document delimiter '%s' is not one of the %zu special tokens", delimiter, nspecial);
        goto fail;
    }
    if (!delimiter) t->eot = nspecial ? specials[0].id : (uint32_t)vocab; /* vocab: none */
    char why[512];
    if (build_encode_tables(t, pattern, why, sizeof why) != 0) {
        set_err(err, errlen, "tiktoken rank file '%s': %s", path, why);
        goto fail;
    }
    free(buf);
    return t;
fail:
    free(buf);
    tokenizer_free(t);
    return NULL;
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
    return tokenizer_load_tiktoken(path, LLAMA3_PATTERN, specials, TOKENIZER_LLAMA3_NSPECIAL, "<|begin_of_text|>", err,
                                   errlen);
}

uint32_t tokenizer_special_id(const Tokenizer *t, const char *name) {
    size_t len = strlen(name);
    for (size_t k = 0; k < t->nspecial; k++) {
        uint32_t id = t->special_ids[k];
        if (t->offsets[id + 1] - t->offsets[id] == len && memcmp(t->blob + t->offsets[id], name, len) == 0) return id;
    }
    return NO_TOKEN;
}

int tokenizer_find_llama3(const char *dir, char *out, size_t outlen) {
    static const char *const names[] = {"tokenizer.model", "original/tokenizer.model"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        struct stat st;
        if ((size_t)snprintf(out, outlen, "%s/%s", dir, names[i]) < outlen && stat(out, &st) == 0 && S_ISREG(st.st_mode))
            return 0;
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
        set_err(err, errlen, "cannot open tokenizer '%s': %s", path, strerror(errno));
        return NULL;
    }
    char model[4200];
    if (S_ISDIR(st.st_mode))
        return tokenizer_find_llama3(path, model, sizeof model) == 0 ? tokenizer_load_llama3(model, err, errlen)
                                                                      : load_gpt2_dir(path, err, errlen);
    if (S_ISREG(st.st_mode) && looks_like_rank_file(path)) return tokenizer_load_llama3(path, err, errlen);
    return load_llmc_file(path, err, errlen);
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    free(t->blob);
    free(t->offsets);
    free(t->vocab_slots);
    free(t->pair_slots);
    free(t->special);
    free(t->special_ids);
    if (t->re) pcre2_code_free(t->re);
    free(t);
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

size_t tokenizer_vocab_size(const Tokenizer *t) { return t->vocab_size; }
uint32_t tokenizer_eot(const Tokenizer *t) { return t->eot; }
int tokenizer_can_encode(const Tokenizer *t) { return t->can_encode; }

const unsigned char *tokenizer_token_bytes(const Tokenizer *t, uint32_t id, size_t *len) {
    if (id >= t->vocab_size) return NULL;
    *len = t->offsets[id + 1] - t->offsets[id];
    return t->blob + t->offsets[id];
}

int tokenizer_save_llmc(const Tokenizer *t, const char *path, char *err, size_t errlen) {
    for (uint32_t id = 0; id < t->vocab_size; id++) {
        size_t n = t->offsets[id + 1] - t->offsets[id];
        if (n == 0 || n > 255) {
            set_err(err, errlen, "cannot write '%s': token %u is %zu bytes; the format allows 1..255", path, id, n);
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

/* ---- encoding ----------------------------------------------------------------------- */

TokenizerContext *tokenizer_context_new(const Tokenizer *t, char *err, size_t errlen) {
    if (!t->can_encode) {
        set_err(err, errlen, "this tokenizer was loaded from an llm.c tokenizer file, which has no BPE merges: "
                             "it can decode but not encode; load the directory with encoder.json + vocab.bpe");
        return NULL;
    }
    TokenizerContext *c = callocCheck(1, sizeof *c, "tokenizer context");
    c->tok = t;
    c->md = pcre2_match_data_create_from_pattern(t->re, NULL);
    c->mctx = pcre2_match_context_create(NULL);
    c->jit_stack = t->jit ? pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL) : NULL;
    if (!c->md || !c->mctx || (t->jit && !c->jit_stack)) llmc_die("out of memory creating PCRE2 match state");
    if (c->jit_stack) pcre2_jit_stack_assign(c->mctx, NULL, c->jit_stack);
    c->cache_mask = CACHE_MIN_SLOTS - 1;
    c->cache = callocCheck(CACHE_MIN_SLOTS, sizeof *c->cache, "word cache");
    return c;
}

void tokenizer_context_free(TokenizerContext *c) {
    if (!c) return;
    pcre2_match_data_free(c->md);
    pcre2_match_context_free(c->mctx);
    if (c->jit_stack) pcre2_jit_stack_free(c->jit_stack);
    free(c->syms);
    free(c->heap);
    token_buf_free(&c->piece_ids);
    free(c->cache);
    free(c->cache_keys);
    free(c->cache_vals);
    free(c);
}

static int cand_less(const BpeCand *a, const BpeCand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(BpeCand *h, size_t *n, BpeCand c) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_less(&c, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = c;
}

static BpeCand heap_pop(BpeCand *h, size_t *n) {
    BpeCand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t kid = 2 * i + 1;
        if (kid >= *n) break;
        if (kid + 1 < *n && cand_less(&h[kid + 1], &h[kid])) kid++;
        if (!cand_less(&h[kid], &last)) break;
        h[i] = h[kid];
        i = kid;
    }
    if (*n) h[i] = last;
    return top;
}

static void push_pair(const Tokenizer *t, BpeCand *heap, size_t *nheap, const BpeSym *syms, int32_t left) {
    int32_t right = syms[left].next;
    if (left < 0 || right < 0) return;
    uint32_t merged = pair_lookup(t, syms[left].id, syms[right].id);
    if (merged == NO_TOKEN) return;
    BpeCand c = {merged, (uint32_t)left, syms[left].len, syms[right].len};
    heap_push(heap, nheap, c);
}

/* Byte-level BPE of one piece (n >= 2) into c->piece_ids: merge the lowest-id pair first,
 * leftmost among equals, exactly as tiktoken's byte_pair_merge. Symbol i starts at byte i;
 * a merge keeps the left index. A heap entry is stale if either side's length changed. */
static void bpe_piece(TokenizerContext *c, const unsigned char *p, size_t n) {
    const Tokenizer *t = c->tok;
    if (n > INT32_MAX) llmc_die("a single pre-token of %zu bytes is too long to encode", n);
    if (n > c->scratch_cap) {
        free(c->syms);
        free(c->heap);
        c->scratch_cap = pow2_at_least(n);
        c->syms = mallocCheck(c->scratch_cap * sizeof *c->syms, "BPE symbols");
        c->heap = mallocCheck(c->scratch_cap * 2 * sizeof *c->heap, "BPE heap");
    }
    BpeSym *syms = c->syms;
    BpeCand *heap = c->heap;
    size_t nheap = 0;
    for (size_t i = 0; i < n; i++) {
        syms[i].id = t->byte_token[p[i]];
        syms[i].len = 1;
        syms[i].prev = (int32_t)i - 1;
        syms[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) push_pair(t, heap, &nheap, syms, (int32_t)i);
    while (nheap) {
        BpeCand e = heap_pop(heap, &nheap);
        BpeSym *l = &syms[e.pos];
        if (l->len != e.left_len || l->next < 0 || syms[l->next].len != e.right_len) continue;
        BpeSym *r = &syms[l->next];
        l->id = e.rank;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (l->next >= 0) syms[l->next].prev = (int32_t)e.pos;
        if (l->prev >= 0) push_pair(t, heap, &nheap, syms, l->prev);
        push_pair(t, heap, &nheap, syms, (int32_t)e.pos);
    }
    c->piece_ids.n = 0;
    for (int32_t i = 0; i >= 0; i = syms[i].next) token_buf_push(&c->piece_ids, syms[i].id);
}

static void cache_clear(TokenizerContext *c) {
    memset(c->cache, 0, (c->cache_mask + 1) * sizeof *c->cache);
    c->cache_used = c->keys_len = c->vals_len = 0;
}

static void cache_insert(TokenizerContext *c, uint64_t h, const unsigned char *p, size_t n,
                         const uint32_t *ids, size_t nids) {
    if ((c->cache_used + 1) * 4 > (c->cache_mask + 1) * 3) {
        size_t slots = c->cache_mask + 1;
        if (slots >= CACHE_MAX_SLOTS) {
            cache_clear(c);
        } else { /* grow and rehash */
            CacheSlot *old = c->cache;
            c->cache_mask = slots * 2 - 1;
            c->cache = callocCheck(slots * 2, sizeof *c->cache, "word cache");
            for (size_t i = 0; i < slots; i++) {
                if (!old[i].key_len) continue;
                size_t s = old[i].hash & c->cache_mask;
                while (c->cache[s].key_len) s = (s + 1) & c->cache_mask;
                c->cache[s] = old[i];
            }
            free(old);
        }
    }
    if (c->keys_len + n > c->keys_cap) {
        c->keys_cap = pow2_at_least(c->keys_len + n + 4096);
        c->cache_keys = realloc(c->cache_keys, c->keys_cap);
        if (!c->cache_keys) llmc_die("out of memory growing the word cache");
    }
    if (c->vals_len + nids > c->vals_cap) {
        c->vals_cap = pow2_at_least(c->vals_len + nids + 1024);
        c->cache_vals = realloc(c->cache_vals, c->vals_cap * sizeof *c->cache_vals);
        if (!c->cache_vals) llmc_die("out of memory growing the word cache");
    }
    size_t s = h & c->cache_mask;
    while (c->cache[s].key_len) s = (s + 1) & c->cache_mask;
    CacheSlot *e = &c->cache[s];
    e->hash = h, e->key_off = (uint32_t)c->keys_len, e->key_len = (uint32_t)n;
    e->val_off = (uint32_t)c->vals_len, e->val_n = (uint32_t)nids;
    memcpy(c->cache_keys + c->keys_len, p, n);
    memcpy(c->cache_vals + c->vals_len, ids, nids * sizeof *ids);
    c->keys_len += n, c->vals_len += nids;
    c->cache_used++;
}

static const CacheSlot *cache_find(const TokenizerContext *c, uint64_t h, const unsigned char *p, size_t n) {
    for (size_t s = h & c->cache_mask;; s = (s + 1) & c->cache_mask) {
        const CacheSlot *e = &c->cache[s];
        if (!e->key_len) return NULL;
        if (e->hash == h && e->key_len == n && memcmp(c->cache_keys + e->key_off, p, n) == 0) return e;
    }
}

/* One pre-token: a whole-token piece maps directly (as in tiktoken), else cache, else BPE. */
static void encode_piece(TokenizerContext *c, const unsigned char *p, size_t n, TokenBuf *out) {
    const Tokenizer *t = c->tok;
    if (n == 1) {
        token_buf_push(out, t->byte_token[p[0]]);
        return;
    }
    uint64_t h = hash_bytes(p, n);
    uint32_t id = vocab_lookup_h(t, p, n, h);
    if (id != NO_TOKEN) {
        token_buf_push(out, id);
        return;
    }
    const CacheSlot *e = n <= CACHE_MAX_PIECE ? cache_find(c, h, p, n) : NULL;
    if (e) {
        for (uint32_t k = 0; k < e->val_n; k++) token_buf_push(out, c->cache_vals[e->val_off + k]);
        return;
    }
    bpe_piece(c, p, n);
    for (size_t k = 0; k < c->piece_ids.n; k++) token_buf_push(out, c->piece_ids.ids[k]);
    if (n <= CACHE_MAX_PIECE) cache_insert(c, h, p, n, c->piece_ids.ids, c->piece_ids.n);
}

/* Pre-tokenises valid UTF-8 s[0..n) with the GPT-2 pattern (anchored at each position). */
static int encode_valid_utf8(TokenizerContext *c, const unsigned char *s, size_t n, TokenBuf *out,
                             char *err, size_t errlen) {
    const Tokenizer *t = c->tok;
    size_t off = 0;
    while (off < n) {
        int rc = t->jit ? pcre2_jit_match(t->re, s, n, off, 0, c->md, c->mctx)
                        : pcre2_match(t->re, s, n, off, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
        size_t end;
        if (rc > 0) {
            end = pcre2_get_ovector_pointer(c->md)[1];
        } else if (rc == PCRE2_ERROR_NOMATCH) {
            uint32_t cp; /* unreachable with this pattern (it covers every character) */
            end = off + utf8_get(s + off, n - off, &cp);
        } else {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            set_err(err, errlen, "pre-tokenisation failed at byte %zu: %s", off, (char *)msg);
            return -1;
        }
        if (end <= off) {
            set_err(err, errlen, "pre-tokenisation made no progress at byte %zu", off);
            return -1;
        }
        encode_piece(c, s + off, end - off, out);
        off = end;
    }
    return 0;
}

int tokenizer_encode(TokenizerContext *c, const char *text, size_t len, TokenBuf *out, char *err, size_t errlen) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        size_t v = utf8_valid_prefix(s + i, len - i);
        if (v && encode_valid_utf8(c, s + i, v, out, err, errlen) != 0) return -1;
        i += v;
        if (i < len) token_buf_push(out, c->tok->byte_token[s[i++]]); /* an invalid byte */
    }
    return 0;
}

/* The special token whose name starts at s[0..n), longest first; NO_TOKEN if none. */
static uint32_t special_at(const Tokenizer *t, const unsigned char *s, size_t n) {
    for (size_t k = 0; k < t->nspecial; k++) {
        uint32_t id = t->special_ids[k];
        size_t len = t->offsets[id + 1] - t->offsets[id];
        if (len <= n && memcmp(s, t->blob + t->offsets[id], len) == 0) return id;
    }
    return NO_TOKEN;
}

int tokenizer_encode_special(TokenizerContext *c, const char *text, size_t len, TokenBuf *out, char *err,
                             size_t errlen) {
    const Tokenizer *t = c->tok;
    unsigned char first[256] = {0}; /* first bytes of the special names */
    for (size_t k = 0; k < t->nspecial; k++) first[t->blob[t->offsets[t->special_ids[k]]]] = 1;
    const unsigned char *s = (const unsigned char *)text;
    size_t start = 0;
    for (size_t i = 0; i < len; i++) {
        if (!first[s[i]]) continue;
        uint32_t id = special_at(t, s + i, len - i);
        if (id == NO_TOKEN) continue;
        if (i > start && tokenizer_encode(c, text + start, i - start, out, err, errlen) != 0) return -1;
        token_buf_push(out, id);
        i += t->offsets[id + 1] - t->offsets[id] - 1;
        start = i + 1;
    }
    return start < len ? tokenizer_encode(c, text + start, len - start, out, err, errlen) : 0;
}
