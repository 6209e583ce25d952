/*
 * tokenizer.c - GPT-2 byte-level BPE: encoding and decoding (see tokenizer.h for the contract;
 * tokenizer_load.c reads the four sources and builds a Tokenizer's tables through
 * tokenizer_build_encode_tables, here).
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
#include "llmc/data/tokenizer.h"
#include "llmc/data/tokenizer_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


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

void tokenizer_set_err(char *err, size_t errlen, const char *fmt, ...) {
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

/* ---- UTF-8 -------------------------------------------------------------------------- */

/* Length of the longest valid UTF-8 prefix of s[0..n) (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF). */
size_t tokenizer_utf8_valid_prefix(const unsigned char *s, size_t n) {
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

/* Decodes one UTF-8 code point (input already validated); returns its length. */
size_t tokenizer_utf8_get(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (len > n) len = n;
    uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < len; k++) v = (v << 6) | (s[k] & 0x3F);
    *cp = v;
    return len;
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

uint32_t tokenizer_vocab_lookup(const Tokenizer *t, const unsigned char *p, size_t n) {
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

int tokenizer_build_encode_tables(Tokenizer *t, const char *pattern, char *err, size_t errlen) {
    t->vocab_mask = pow2_at_least(t->vocab_size * 2 + 16) - 1;
    t->vocab_slots = callocCheck(t->vocab_mask + 1, sizeof *t->vocab_slots, "vocab map");
    for (uint32_t id = 0; id < t->vocab_size; id++) {
        if (is_special(t, id)) continue; /* never produced by BPE */
        const unsigned char *p = t->blob + t->offsets[id];
        size_t n = t->offsets[id + 1] - t->offsets[id];
        uint64_t h = hash_bytes(p, n);
        if (vocab_lookup_h(t, p, n, h) != NO_TOKEN) {
            tokenizer_set_err(err, errlen, "token %u duplicates the bytes of another token", id);
            return -1;
        }
        size_t s = h & t->vocab_mask;
        while (t->vocab_slots[s]) s = (s + 1) & t->vocab_mask;
        t->vocab_slots[s] = id + 1;
    }
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        t->byte_token[b] = tokenizer_vocab_lookup(t, &c, 1);
        if (t->byte_token[b] == NO_TOKEN) {
            tokenizer_set_err(err, errlen, "the vocabulary has no token for byte 0x%02x", b);
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
            uint32_t a = tokenizer_vocab_lookup(t, p, k), b = tokenizer_vocab_lookup(t, p + k, n - k);
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
        tokenizer_set_err(err, errlen, "PCRE2 cannot compile the pre-tokenizer pattern at offset %zu: %s", (size_t)at,
                          msg);
        return -1;
    }
    t->jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
    t->can_encode = 1;
    return 0;
}

uint32_t tokenizer_special_id(const Tokenizer *t, const char *name) {
    size_t len = strlen(name);
    for (size_t k = 0; k < t->nspecial; k++) {
        uint32_t id = t->special_ids[k];
        if (t->offsets[id + 1] - t->offsets[id] == len && memcmp(t->blob + t->offsets[id], name, len) == 0) return id;
    }
    return NO_TOKEN;
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

size_t tokenizer_vocab_size(const Tokenizer *t) { return t->vocab_size; }
uint32_t tokenizer_eot(const Tokenizer *t) { return t->eot; }
int tokenizer_can_encode(const Tokenizer *t) { return t->can_encode; }

const unsigned char *tokenizer_token_bytes(const Tokenizer *t, uint32_t id, size_t *len) {
    if (id >= t->vocab_size) return NULL;
    *len = t->offsets[id + 1] - t->offsets[id];
    return t->blob + t->offsets[id];
}

/* ---- encoding ----------------------------------------------------------------------- */

TokenizerContext *tokenizer_context_new(const Tokenizer *t, char *err, size_t errlen) {
    if (!t->can_encode) {
        tokenizer_set_err(err, errlen,
                          "this tokenizer was loaded from an llm.c tokenizer file, which has no BPE merges: "
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
            end = off + tokenizer_utf8_get(s + off, n - off, &cp);
        } else {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            tokenizer_set_err(err, errlen, "pre-tokenisation failed at byte %zu: %s", off, (char *)msg);
            return -1;
        }
        if (end <= off) {
            tokenizer_set_err(err, errlen, "pre-tokenisation made no progress at byte %zu", off);
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
        size_t v = tokenizer_utf8_valid_prefix(s + i, len - i);
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

