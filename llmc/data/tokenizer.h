/*
 * tokenizer.h - GPT-2 byte-level BPE: load, encode, decode, save.
 *
 * Sources a Tokenizer can be loaded from:
 *  - a directory holding encoder.json + vocab.bpe (OpenAI's GPT-2 release): decode and encode;
 *  - llm.c's tokenizer file (magic 20240328, version 1 or 2): decode only, because that file
 *    stores the token bytes but no merges;
 *  - a tiktoken rank file (tokenizer_load_tiktoken); tokenizer_load takes it as Llama 3's.
 *
 * Encoding reproduces tiktoken's "gpt2" encode_ordinary token for token on valid UTF-8:
 *  1. pre-tokenisation with GPT-2's pattern
 *       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *     (PCRE2, UTF + UCP, JIT when available; \s is spelled out as Unicode White_Space, which
 *     is what tiktoken's regex engine uses);
 *  2. a piece that is itself a token becomes that token; otherwise byte-level BPE: start
 *     from one token per byte and repeatedly merge the adjacent pair whose concatenated bytes
 *     form the lowest-id token (leftmost on ties), in O(n log n) with a heap.
 * Bytes that are not valid UTF-8 (which tiktoken, working on Python str, cannot take) are
 * kept losslessly: the regex runs separately on each maximal valid UTF-8 run, and every
 * invalid byte becomes its own single-byte token. decode(encode(x)) == x for any bytes x.
 *
 * Threads: a loaded Tokenizer is immutable and may be shared. Encoding needs a
 * TokenizerContext (regex match state + word cache), one per thread.
 */
#ifndef LLMC_TOKENIZER_H
#define LLMC_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TOKENIZER_MAGIC 20240328
#define TOKENIZER_HEADER_INTS 256

typedef struct Tokenizer Tokenizer;
typedef struct TokenizerContext TokenizerContext;

/* A growable array of token ids; zero-initialise, append with the encode call, free with
 * token_buf_free. */
typedef struct {
    uint32_t *ids;
    size_t n;    /* ids in use */
    size_t cap;  /* ids allocated */
} TokenBuf;

/* Loads from a directory (Llama 3's: tokenizer_find_llama3 finds its tokenizer.model; else GPT-2's
 * encoder.json + vocab.bpe), a tiktoken rank file (its first line "BASE64 RANK": Llama 3's,
 * tokenizer_load_llama3) or an llm.c tokenizer file. On failure returns NULL and writes a one-line
 * reason naming the file into err; a sentencepiece model (Llama 2's tokenizer.model) and a JSON
 * file (an HF tokenizer.json) are named as such (neither is read). */
Tokenizer *tokenizer_load(const char *path, char *err, size_t errlen);
void tokenizer_free(Tokenizer *tok);

/* A special token of a tiktoken-format tokenizer: its text and id. */
typedef struct {
    const char *name;
    uint32_t id;
} TokenizerSpecial;

/* Loads a tiktoken rank file (one "BASE64BYTES RANK" per line, ranks 0..n-1 each once; the
 * token's id is its rank, as in tiktoken) with a pre-tokenizer pattern (PCRE2 syntax, e.g.
 * tokenizer_builtin_pattern("llama3")) and special tokens (ids >= n; ids below the largest that
 * no token uses stay unused). delimiter names the special token that tokenizer_eot() returns
 * (what ./tokenizer shards puts before each document); NULL: the first special token.
 * Encoding then equals tiktoken's Encoding(pat_str, mergeable_ranks, special_tokens):
 * tokenizer_encode is encode_ordinary, tokenizer_encode_special is encode(allowed_special="all").
 * On failure (malformed line, bad base64, a repeated or missing rank, duplicate token bytes, a
 * special id among the ranks, a bad pattern) returns NULL with a reason naming the file/line. */
Tokenizer *tokenizer_load_tiktoken(const char *path, const char *pattern, const TokenizerSpecial *specials,
                                   size_t nspecial, const char *delimiter, char *err, size_t errlen);

/* Llama 3's special tokens as Meta's tokenizer.py (Llama 3.1) defines them: 256 ids from first_id
 * (128000 after Llama 3's 128000 ranks): <|begin_of_text|>, <|end_of_text|>,
 * <|reserved_special_token_0|>, <|reserved_special_token_1|>, <|finetune_right_pad_id|>,
 * <|step_id|>, <|start_header_id|>, <|end_header_id|>, <|eom_id|>, <|eot_id|>, <|python_tag|>,
 * then <|reserved_special_token_2|> .. <|reserved_special_token_246|>. The names are written
 * into names (at least 256 * 40 bytes). Returns TOKENIZER_LLAMA3_NSPECIAL. */
#define TOKENIZER_LLAMA3_NSPECIAL 256
size_t tokenizer_llama3_specials(uint32_t first_id, TokenizerSpecial out[TOKENIZER_LLAMA3_NSPECIAL], char *names,
                                 size_t names_len);
/* Llama 3's tokenizer: a tiktoken rank file (Llama 3's tokenizer.model is one) with the llama3
 * pattern and Llama 3's special tokens numbered after its ranks; tokenizer_eot() is
 * <|begin_of_text|> (what ./tokenizer shards puts before each document). NULL with a reason
 * naming the file on failure (as tokenizer_load_tiktoken). */
Tokenizer *tokenizer_load_llama3(const char *path, char *err, size_t errlen);
/* Llama 3's tokenizer in dir: dir/tokenizer.model, or dir/original/tokenizer.model (where an HF
 * Llama 3 directory keeps it). Returns 0 with the file in out, or -1 if neither exists. A name
 * that is there but is no readable file (a FIFO, a directory, a symbolic link loop) is found too:
 * its loader then says what is wrong with it, instead of another tokenizer being used. */
int tokenizer_find_llama3(const char *dir, char *out, size_t outlen);
/* The id of the special token called name (tokenizer_load_tiktoken's), or UINT32_MAX if none. */
uint32_t tokenizer_special_id(const Tokenizer *tok, const char *name);

/* The built-in pre-tokenizer patterns by name: "gpt2", "cl100k" (cl100k_base) and "llama3";
 * NULL for another name. */
const char *tokenizer_builtin_pattern(const char *name);

/* Finds a directory with the GPT-2 files: $LLMC_DATA_DIR/gpt2, data/gpt2, ../shared/data/gpt2
 * (in that order). Returns 0 and the directory in out, or -1 if none has both files. */
int tokenizer_find_default(char *out, size_t outlen);

size_t tokenizer_vocab_size(const Tokenizer *tok);
uint32_t tokenizer_eot(const Tokenizer *tok);
/* 1 if this tokenizer has merges (was loaded from encoder.json + vocab.bpe). */
int tokenizer_can_encode(const Tokenizer *tok);
/* The raw bytes of token id (not NUL-terminated); NULL if id is out of range. */
const unsigned char *tokenizer_token_bytes(const Tokenizer *tok, uint32_t id, size_t *len);

/* Writes llm.c's version-2 tokenizer file atomically. Returns 0, or -1 with a reason in err. */
int tokenizer_save_llmc(const Tokenizer *tok, const char *path, char *err, size_t errlen);

/* Per-thread encoding state. Returns NULL with a reason in err if tok cannot encode. */
TokenizerContext *tokenizer_context_new(const Tokenizer *tok, char *err, size_t errlen);
void tokenizer_context_free(TokenizerContext *ctx);

/* Appends the tokens of text[0..len) to out (no EOT is added). Returns 0, or -1 with a
 * reason in err (out then holds an unspecified prefix). */
int tokenizer_encode(TokenizerContext *ctx, const char *text, size_t len, TokenBuf *out,
                     char *err, size_t errlen);

/* As tokenizer_encode, but the text of a special token (tokenizer_load_tiktoken) becomes that
 * token wherever it appears (the longest name where two start at the same byte). */
int tokenizer_encode_special(TokenizerContext *ctx, const char *text, size_t len, TokenBuf *out,
                             char *err, size_t errlen);

void token_buf_push(TokenBuf *buf, uint32_t id);
void token_buf_free(TokenBuf *buf);

/* Decodes the JSON string literal starting at s[0] == '"' within s[0..len). Writes its UTF-8
 * bytes to *out (malloc'd, grown as needed; *outcap its capacity) and their count to *outlen.
 * \uXXXX escapes and surrogate pairs are decoded; a lone surrogate becomes U+FFFD.
 * Returns the number of input bytes consumed (including both quotes), or 0 if malformed. */
size_t json_decode_string(const char *s, size_t len, char **out, size_t *outcap, size_t *outlen);

#ifdef __cplusplus
}
#endif
#endif /* LLMC_TOKENIZER_H */
