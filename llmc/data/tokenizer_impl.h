/*
 * tokenizer_impl.h - private to llmc/data/tokenizer.c (encoding, decoding, the lookup tables) and
 * llmc/data/tokenizer_load.c (the four sources a tokenizer loads from, and the llm.c file it
 * saves): the opaque Tokenizer struct and the helpers both halves use. Not for other files.
 * (It includes no tokenizer.h, so that each .c including both makes no include loop.)
 */
#ifndef LLMC_DATA_TOKENIZER_IMPL_H
#define LLMC_DATA_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "llmc/core/check.h"

#define NO_TOKEN UINT32_MAX
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

/* A formatted reason into err[errlen] (nothing when err is NULL or errlen 0). */
void tokenizer_set_err(char *err, size_t errlen, const char *fmt, ...) LLMC_PRINTF(3, 4);

/* Length of the longest valid UTF-8 prefix of s[0..n) (RFC 3629: no overlongs, no surrogates,
 * nothing above U+10FFFF). */
size_t tokenizer_utf8_valid_prefix(const unsigned char *s, size_t n);
/* Decodes one UTF-8 code point of s[0..n) (already validated) into *cp; returns its length. */
size_t tokenizer_utf8_get(const unsigned char *s, size_t n, uint32_t *cp);

/* The mergeable token whose bytes are p[0..n), or NO_TOKEN; needs the encode tables. */
uint32_t tokenizer_vocab_lookup(const struct Tokenizer *t, const unsigned char *p, size_t n);
/* After a loader filled t's token bytes (and special marks): the vocab and pair maps, byte tokens
 * and the compiled pre-tokenisation pattern; sets can_encode. 0, or -1 with a reason in err. */
int tokenizer_build_encode_tables(struct Tokenizer *t, const char *pattern, char *err, size_t errlen);

#endif
