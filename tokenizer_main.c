/*
 * tokenizer_main.c - the ./tokenizer tool: encode, decode, shards, export.
 *
 *   ./tokenizer encode IN OUT.bin       IN's tokens (no EOT added) as one data shard
 *   ./tokenizer decode IN.bin           a shard's text to stdout
 *   ./tokenizer shards -o PREFIX IN...  text / JSONL documents -> training shards
 *   ./tokenizer export OUT.bin          llm.c's tokenizer file (for decoding samples)
 *
 * Parallel encoding: the input is cut into jobs of about JOB_BYTES at points where cutting
 * cannot change the tokens (document boundaries, or a lone '\n' between two printable ASCII
 * characters: the regex always ends a piece there), jobs are encoded by -j threads (one
 * TokenizerContext each) a batch at a time, and the results are appended in input order.
 * So the output does not depend on -j.
 */
#include "llmc/core/check.h"
#include "llmc/data/evalfile.h"
#include "llmc/data/shard.h"
#include "llmc/data/tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <dirent.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { JOB_BYTES = 1 << 20, JOBS_PER_THREAD = 4 };

/* ---- options: one table drives parsing and --help ----------------------------------- */

typedef struct {
    const char *tokenizer;  /* directory with encoder.json + vocab.bpe, or a tokenizer .bin */
    long long threads;
    const char *prefix;
    long long shard_tokens;
    long long val_tokens;   /* 0: the first shard is the validation shard */
    long long token_bytes;  /* 0: 2 if the vocab fits in uint16, else 4 */
    const char *format;     /* auto, text, jsonl */
    const char *doc_split;  /* none, blank-lines */
    const char *field;
    long long no_index;
    long long quiet;
    long long skip_bad_lines;
    long long overwrite;
    const char *pattern;       /* a tiktoken rank file's pre-tokenizer: gpt2, cl100k, llama3 */
    const char *pattern_regex; /* ... or a PCRE2 pattern */
    const char *specials;      /* its special tokens: llama3, cl100k, none or NAME=ID,... */
    const char *delimiter;     /* the special token put before each document */
    long long allow_special;   /* encode: special tokens' text becomes the special token */
} Options;

typedef enum { FLAG_INT, FLAG_STR, FLAG_BOOL } FlagKind;

typedef struct {
    const char *name, *alias;
    FlagKind kind;
    size_t offset; /* into Options */
    long long min, max;
    const char *help;
} Flag;

#define OPT(f) offsetof(Options, f)
static const Flag FLAG_TOKENIZER = {"--tokenizer", "-t", FLAG_STR, OPT(tokenizer), 0, 0,
                                    "encoder.json+vocab.bpe directory, llm.c tokenizer .bin, or a tiktoken rank file "
                                    "(with --pattern) (default: found)"};
static const Flag FLAG_PATTERN = {"--pattern", NULL, FLAG_STR, OPT(pattern), 0, 0,
                                  "tiktoken rank file: built-in pre-tokenizer pattern llama3, cl100k or gpt2"};
static const Flag FLAG_PATTERN_REGEX = {"--pattern-regex", NULL, FLAG_STR, OPT(pattern_regex), 0, 0,
                                        "tiktoken rank file: a custom pre-tokenizer pattern (PCRE2 syntax)"};
static const Flag FLAG_SPECIALS = {"--specials", NULL, FLAG_STR, OPT(specials), 0, 0,
                                   "tiktoken rank file: special tokens: llama3, cl100k or gpt2 (their sets, numbered "
                                   "after the N ranks as in those vocabularies), none, or NAME=ID,NAME=ID,... "
                                   "(default: --pattern's set, else none)"};
static const Flag FLAG_DELIMITER = {"--delimiter", NULL, FLAG_STR, OPT(delimiter), 0, 0,
                                    "tiktoken rank file: the special token before each document (default: llama3 "
                                    "<|begin_of_text|>, cl100k <|endoftext|>, else the first)"};
static const Flag FLAG_THREADS = {"--threads", "-j", FLAG_INT, OPT(threads), 1, 1024, "encoding threads"};
static const Flag FLAG_QUIET = {"--quiet", "-q", FLAG_BOOL, OPT(quiet), 0, 1, "no progress line"};
static const Flag FLAG_TOKEN_BYTES = {"--token-bytes", NULL, FLAG_INT, OPT(token_bytes), 0, 4,
                                      "2 (uint16 shard) or 4 (uint32); 0 = 4 only if the vocab exceeds 65536"};
static const Flag SHARD_FLAGS[] = {
    {"--out-prefix", "-o", FLAG_STR, OPT(prefix), 0, 0, "output files PREFIX_{val,train}_NNNNNN.bin (required)"},
    {"--shard-tokens", "-s", FLAG_INT, OPT(shard_tokens), 1, 2147483647LL, "tokens per shard"},
    {"--val-tokens", "-v", FLAG_INT, OPT(val_tokens), 0, 2147483647LL,
     "tokens in the validation shard; 0 = the whole first shard"},
    {"--format", "-f", FLAG_STR, OPT(format), 0, 0, "auto (.jsonl/.json -> jsonl, else text), text or jsonl"},
    {"--doc-split", NULL, FLAG_STR, OPT(doc_split), 0, 0,
     "text inputs: none (a file is a document) or blank-lines (split at \"\\n\\n\", kept at the end)"},
    {"--text-field", NULL, FLAG_STR, OPT(field), 0, 0, "JSONL: the field holding each document's text"},
    {"--no-index", NULL, FLAG_BOOL, OPT(no_index), 0, 1,
     "name the files PREFIX_val.bin and PREFIX_train.bin (at most one train shard)"},
    {"--skip-bad-lines", NULL, FLAG_BOOL, OPT(skip_bad_lines), 0, 1,
     "JSONL: skip lines that are not an object with the text field (counted, first one reported) instead of stopping"},
    {"--overwrite", NULL, FLAG_BOOL, OPT(overwrite), 0, 1,
     "remove the shards an earlier run left under PREFIX first (without it they are an error)"},
};

typedef struct {
    const char *name, *args, *about;
    int min_pos, max_pos; /* positional arguments; max -1 = any number */
} Command;

static void print_help(const Command *cmd, const Flag *const *flags, int nflags, const Options *o) {
    printf("usage: ./tokenizer %s [options] %s\n%s\noptions:\n", cmd->name, cmd->args, cmd->about);
    for (int i = 0; i < nflags; i++) {
        const Flag *f = flags[i];
        const char *base = (const char *)o + f->offset;
        char def[128];
        if (f->kind == FLAG_STR) snprintf(def, sizeof def, "%s", *(const char *const *)base ? *(const char *const *)base : "(none)");
        else snprintf(def, sizeof def, "%lld", *(const long long *)base);
        printf("  %-15s %-3s %s [%s]\n", f->name, f->alias ? f->alias : "", f->help, def);
    }
    printf("  %-15s %-3s this help\n", "--help", "-h");
}

static void parse_int_flag(const Flag *f, const char *v, long long *dst) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno) llmc_die("flag %s: '%s' is not an integer", f->name, v);
    if (x < f->min || x > f->max) llmc_die("flag %s: %lld is outside [%lld, %lld]", f->name, x, f->min, f->max);
    *dst = x;
}

/* Parses argv (after the command name) into o; positional arguments go to pos. */
static int parse_args(const Command *cmd, const Flag *const *flags, int nflags, int argc, char **argv,
                      Options *o, char **pos) {
    int npos = 0;
    for (int i = 0; i < argc; i++) {
        char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            print_help(cmd, flags, nflags, o);
            exit(0);
        }
        if (a[0] != '-' || strcmp(a, "-") == 0) {
            if (cmd->max_pos >= 0 && npos >= cmd->max_pos)
                llmc_die("%s: unexpected argument '%s' (see ./tokenizer %s --help)", cmd->name, a, cmd->name);
            pos[npos++] = a;
            continue;
        }
        char *eq = strchr(a, '=');
        size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
        const Flag *f = NULL;
        for (int k = 0; k < nflags && !f; k++) {
            if ((strlen(flags[k]->name) == nlen && strncmp(flags[k]->name, a, nlen) == 0) ||
                (flags[k]->alias && strlen(flags[k]->alias) == nlen && strncmp(flags[k]->alias, a, nlen) == 0))
                f = flags[k];
        }
        const char *attached = NULL; /* "-j4": a short alias with its value attached */
        for (int k = 0; k < nflags && !f && a[1] != '-' && !eq && strlen(a) > 2; k++) {
            if (flags[k]->alias && flags[k]->kind != FLAG_BOOL && strncmp(flags[k]->alias, a, 2) == 0)
                f = flags[k], attached = a + 2;
        }
        if (!f) llmc_die("%s: unknown flag '%.*s' (see ./tokenizer %s --help)", cmd->name, (int)nlen, a, cmd->name);
        char *base = (char *)o + f->offset;
        if (f->kind == FLAG_BOOL) {
            if (eq) llmc_die("flag %s takes no value", f->name);
            *(long long *)base = 1;
            continue;
        }
        const char *v = attached ? attached : eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) llmc_die("flag %s needs a value", f->name);
        if (f->kind == FLAG_STR) *(const char **)base = v;
        else parse_int_flag(f, v, (long long *)base);
    }
    if (npos < cmd->min_pos)
        llmc_die("%s: expected %s (see ./tokenizer %s --help)", cmd->name, cmd->args, cmd->name);
    return npos;
}

/* Special tokens of --specials: a preset numbered after the n ranks, or NAME=ID,... (in spec). */
static size_t parse_specials(const char *spec, size_t n, TokenizerSpecial *out, char *names, size_t names_len) {
    size_t k = 0;
    if (strcmp(spec, "none") == 0) return 0;
    if (strcmp(spec, "llama3") == 0) /* Llama 3.1's 256: 128000.. after its 128000 ranks */
        return tokenizer_llama3_specials((uint32_t)n, out, names, names_len);
    if (strcmp(spec, "gpt2") == 0) { /* 50256 after GPT-2's 50256 ranks */
        out[0] = (TokenizerSpecial){"<|endoftext|>", (uint32_t)n};
        return 1;
    }
    if (strcmp(spec, "cl100k") == 0) { /* cl100k_base: 100257.. after its 100256 ranks */
        static const char *const name[] = {"<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                                           "<|endofprompt|>"};
        static const unsigned after[] = {1, 2, 3, 4, 20};
        for (; k < 5; k++) out[k] = (TokenizerSpecial){name[k], (uint32_t)(n + after[k])};
        return k;
    }
    if (strlen(spec) + 1 > names_len) llmc_die("flag --specials: too long");
    memcpy(names, spec, strlen(spec) + 1);
    for (char *item = names; item && *item; k++) {
        char *comma = strchr(item, ',');
        if (comma) *comma = 0;
        char *eq = strrchr(item, '='), *end;
        if (k == 1024) llmc_die("flag --specials: more than 1024 special tokens");
        errno = 0;
        unsigned long id = eq ? strtoul(eq + 1, &end, 10) : 0;
        if (!eq || eq == item || !eq[1] || *end || errno || id > UINT32_MAX - 1)
            llmc_die("flag --specials: '%s' is not NAME=ID (or one of llama3, cl100k, none)", item);
        *eq = 0;
        out[k] = (TokenizerSpecial){item, (uint32_t)id};
        item = comma ? comma + 1 : NULL;
    }
    return k;
}

/* The ranks in a tiktoken file: its non-empty lines (validated by the loader). */
static size_t count_ranks(const char *path) {
    FILE *f = fopenCheck(path, "rb");
    size_t n = 0;
    int c, last = '\n';
    while ((c = fgetc(f)) != EOF) {
        if (c == '\n' && last != '\n' && last != '\r') n++;
        last = c;
    }
    if (last != '\n' && last != '\r') n++;
    fclose(f);
    return n;
}

static Tokenizer *load_tiktoken(const Options *o, const char *path) {
    if (!o->pattern == !o->pattern_regex)
        llmc_die("tokenizer '%s' is a tiktoken rank file: give its pre-tokenizer pattern with --pattern (llama3, "
                 "cl100k or gpt2) or --pattern-regex REGEX (one of them)", path);
    const char *pattern = o->pattern_regex;
    if (o->pattern && !(pattern = tokenizer_builtin_pattern(o->pattern)))
        llmc_die("flag --pattern: '%s' is not one of llama3, cl100k, gpt2 (a custom pattern: --pattern-regex)",
                 o->pattern);
    static TokenizerSpecial specials[1024];
    static char names[1 << 16];
    const char *spec = o->specials ? o->specials : o->pattern ? o->pattern : "none";
    size_t ns = parse_specials(spec, count_ranks(path), specials, names, sizeof names);
    const char *delim = o->delimiter;
    if (!delim && ns && strcmp(spec, "llama3") == 0) delim = "<|begin_of_text|>";
    char err[1024];
    Tokenizer *t = tokenizer_load_tiktoken(path, pattern, specials, ns, delim, err, sizeof err);
    if (!t) llmc_die("%s", err);
    return t;
}

static Tokenizer *load_tokenizer(const Options *o, int need_encode) {
    char dir[4096], err[1024];
    const char *path = o->tokenizer;
    if (!path) {
        if (tokenizer_find_default(dir, sizeof dir) != 0)
            llmc_die("no GPT-2 tokenizer files found in $LLMC_DATA_DIR/gpt2, data/gpt2 or ../shared/data/gpt2; "
                     "run 'make data' or pass --tokenizer DIR");
        path = dir;
    }
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) { /* llm.c's file starts with its magic; else tiktoken */
        uint32_t magic = 0;
        FILE *f = fopen(path, "rb");
        if (f && fread(&magic, 4, 1, f) == 1 && magic != TOKENIZER_MAGIC) {
            fclose(f);
            return load_tiktoken(o, path);
        }
        if (f) fclose(f);
    }
    if (o->pattern || o->pattern_regex || o->specials || o->delimiter)
        llmc_die("flags --pattern, --pattern-regex, --specials and --delimiter are for a tiktoken rank file; '%s' is "
                 "GPT-2's files or llm.c's tokenizer file", path);
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    if (!t) llmc_die("%s", err);
    if (need_encode && !tokenizer_can_encode(t))
        llmc_die("tokenizer '%s' is an llm.c tokenizer file: it has no BPE merges, so it can decode but not "
                 "encode; pass --tokenizer DIR with encoder.json + vocab.bpe", path);
    return t;
}

/* ---- input files -------------------------------------------------------------------- */

typedef struct {
    const char *path;
    const char *data; /* the text (a JSONL file's UTF-8 byte order mark skipped) */
    size_t len;
    int jsonl;
    void *map; /* the whole file mapped (map_len bytes), for munmap */
    size_t map_len;
} InputFile;

static void input_open(InputFile *in, const char *path, int jsonl) {
    in->path = path, in->jsonl = jsonl, in->data = "", in->len = 0, in->map = NULL, in->map_len = 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK); /* a FIFO must not block the open: it is refused below */
    if (fd < 0) llmc_die("cannot open input '%s': %s", path, strerror(errno));
    struct stat st = {0};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        llmc_die("input '%s' is %s, not a regular file", path, file_kind_name(st.st_mode));
    in->len = (size_t)st.st_size;
    if (in->len) {
        void *p = mmap(NULL, in->len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) llmc_die("cannot map input '%s': %s", path, strerror(errno));
        madvise(p, in->len, MADV_SEQUENTIAL);
        in->data = p, in->map = p, in->map_len = in->len;
    }
    close(fd);
    /* a byte order mark (EF BB BF, as some editors and exporters write) is not part of line 1's JSON */
    if (jsonl && in->len >= 3 && memcmp(in->data, "\xEF\xBB\xBF", 3) == 0) in->data += 3, in->len -= 3;
}

static void input_close(InputFile *in) {
    if (in->map_len) munmap(in->map, in->map_len);
}

/* ---- jobs ------------------------------------------------------------------------------ */

typedef struct {
    const InputFile *in;
    size_t start, end;      /* byte range in the input */
    int eot_first;          /* text: an EOT before the range (a file's first document) */
    int doc_split;          /* text: each "\n\n" ends a document; an EOT follows it */
    const char *field;      /* jsonl: the text field */
    size_t first_line;      /* jsonl: 1-based line number of start, for error messages */
    uint32_t eot;
    TokenBuf out;
    char err[512];          /* non-empty: the job failed */
    int skip_bad;           /* jsonl: skip bad lines instead of failing */
    int allow_special;      /* special tokens' text becomes the special token */
    size_t skipped;         /* jsonl: lines skipped */
    char bad[512];          /* jsonl: the first skipped line's file, number and reason */
} Job;

/* Byte length of the White_Space character (the regex's \s) starting at s[p], or 0 if
 * s[p..n) does not start with one. */
static size_t space_len_at(const unsigned char *s, size_t n, size_t p) {
    unsigned char c = s[p];
    if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || c == 0x20;
    unsigned char c1 = p + 1 < n ? s[p + 1] : 0, c2 = p + 2 < n ? s[p + 2] : 0;
    if (c == 0xC2) return (c1 == 0x85 || c1 == 0xA0) ? 2 : 0;                    /* U+0085 U+00A0 */
    if (c == 0xE1) return (c1 == 0x9A && c2 == 0x80) ? 3 : 0;                    /* U+1680 */
    if (c == 0xE2 && c1 == 0x80) return (c2 <= 0x8A || c2 == 0xA8 || c2 == 0xA9 || c2 == 0xAF) ? 3 : 0;
    if (c == 0xE2 && c1 == 0x81) return c2 == 0x9F ? 3 : 0;                      /* U+205F */
    if (c == 0xE3) return (c1 == 0x80 && c2 == 0x80) ? 3 : 0;                    /* U+3000 */
    return 0;
}

/* A cut at p cannot change the tokens if it falls after a lone '\n' between two characters
 * that are not White_Space: the pieces around a non-space character never contain a newline,
 * so the regex ends a piece right before the '\n' and right after it (the newline alone matches
 * either \s+(?!\S) at the cut or \s+ without it), and no alternative looks further than one
 * character past its match. Bytes that are not valid UTF-8 count as non-space characters (each
 * is its own piece). */
static int safe_cut(const char *s, size_t n, size_t p) {
    const unsigned char *u = (const unsigned char *)s;
    if (p < 2 || p >= n || u[p - 1] != '\n' || space_len_at(u, n, p)) return 0;
    size_t q = p - 2; /* the start of the character that ends at p - 2 */
    while (q > 0 && p - 2 - q < 3 && (u[q] & 0xC0) == 0x80) q--;
    return space_len_at(u, p - 1, q) != p - 1 - q;
}

/* End of the text job that starts at `start`. With doc_split, prefers ending right after a
 * blank-line separator, counted as Python's str.split("\n\n") counts them from `start`
 * (where no separator is pending); otherwise (or in a very long document) a safe cut. */
static size_t text_job_end(const char *s, size_t n, size_t start, int doc_split) {
    if (n - start <= 2 * (size_t)JOB_BYTES) return n;
    size_t target = start + JOB_BYTES;
    if (doc_split) {
        size_t limit = start + 4 * (size_t)JOB_BYTES < n ? start + 4 * (size_t)JOB_BYTES : n;
        const char *q = memmem(s + target, limit - target, "\n\n", 2);
        if (q) {
            size_t run = (size_t)(q - s);
            while (run > start && s[run - 1] == '\n') run--;
            size_t len = 0;
            while (run + len < n && s[run + len] == '\n') len++;
            size_t cut = run + (len / 2) * 2;
            if (cut < n) return cut;
        }
    }
    for (size_t p = target; p + 1 < n;) {
        const char *nl = memchr(s + p, '\n', n - 1 - p);
        if (!nl) break;
        p = (size_t)(nl - s) + 1;
        if (safe_cut(s, n, p)) return p;
    }
    return n;
}

static size_t jsonl_job_end(const char *s, size_t n, size_t start) {
    if (n - start <= 2 * (size_t)JOB_BYTES) return n;
    const char *nl = memchr(s + start + JOB_BYTES, '\n', n - start - JOB_BYTES);
    return nl ? (size_t)(nl - s) + 1 : n;
}

static int encode_range(TokenizerContext *ctx, Job *j, const char *p, size_t len) {
    if (j->allow_special) return tokenizer_encode_special(ctx, p, len, &j->out, j->err, sizeof j->err);
    return tokenizer_encode(ctx, p, len, &j->out, j->err, sizeof j->err);
}

static void run_text_job(TokenizerContext *ctx, Job *j) {
    const char *s = j->in->data + j->start;
    size_t n = j->end - j->start, p = 0;
    if (j->eot_first) token_buf_push(&j->out, j->eot);
    while (j->doc_split && p < n) {
        const char *q = memmem(s + p, n - p, "\n\n", 2);
        if (!q) break;
        size_t doc_end = (size_t)(q - s) + 2;
        if (encode_range(ctx, j, s + p, doc_end - p) != 0) return;
        token_buf_push(&j->out, j->eot);
        p = doc_end;
    }
    if (p < n) encode_range(ctx, j, s + p, n - p);
}

/* Skips one JSON value starting at s[i]; returns the index after it, or 0 if malformed. */
static size_t json_skip_value(const char *s, size_t n, size_t i, int depth) {
    char *tmp = NULL;
    size_t tmpcap = 0, tmplen;
    if (i >= n || depth > 64) return 0;
    if (s[i] == '"') {
        for (size_t k = i + 1; k < n; k++) {
            if (s[k] == '\\') k++;
            else if (s[k] == '"') return k + 1;
        }
        return 0;
    }
    if (s[i] == '{' || s[i] == '[') {
        char close = s[i] == '{' ? '}' : ']';
        i++;
        for (int first = 1;; first = 0) {
            while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r')) i++;
            if (i < n && s[i] == close && first) return i + 1;
            if (close == '}') {
                size_t used = json_decode_string(s + i, n - i, &tmp, &tmpcap, &tmplen);
                free(tmp), tmp = NULL, tmpcap = 0;
                if (!used) return 0;
                i += used;
                while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r')) i++;
                if (i >= n || s[i] != ':') return 0;
                i++;
                while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r')) i++;
            }
            i = json_skip_value(s, n, i, depth + 1);
            if (!i) return 0;
            while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r')) i++;
            if (i < n && s[i] == ',') {
                i++;
                continue;
            }
            if (i < n && s[i] == close) return i + 1;
            return 0;
        }
    }
    size_t k = i; /* number, true, false, null */
    while (k < n && (strchr("+-.0123456789eEtruefalsn", s[k]) != NULL) && s[k]) k++;
    return k > i ? k : 0;
}

/* Finds the top-level string field `field` of the JSON object in line[0..n) and decodes it.
 * Returns 1 found, 0 absent, -1 malformed. */
static int json_get_field(const char *line, size_t n, const char *field, char **out, size_t *cap, size_t *len) {
    size_t i = 0, flen = strlen(field);
    char *key = NULL;
    size_t keycap = 0, keylen;
    int found = 0;
#define SKIP_WS() while (i < n && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) i++
    SKIP_WS();
    if (i >= n || line[i] != '{') goto bad;
    i++;
    SKIP_WS();
    if (i < n && line[i] == '}') i = n; /* empty object */
    while (i < n) {
        size_t used = json_decode_string(line + i, n - i, &key, &keycap, &keylen);
        if (!used) goto bad;
        i += used;
        SKIP_WS();
        if (i >= n || line[i] != ':') goto bad;
        i++;
        SKIP_WS();
        if (!found && keylen == flen && memcmp(key, field, flen) == 0 && i < n && line[i] == '"') {
            used = json_decode_string(line + i, n - i, out, cap, len);
            if (!used) goto bad;
            i += used, found = 1;
        } else {
            i = json_skip_value(line, n, i, 0);
            if (!i) goto bad;
        }
        SKIP_WS();
        if (i < n && line[i] == ',') {
            i++;
            SKIP_WS();
            continue;
        }
        if (i < n && line[i] == '}') {
            i++;
            SKIP_WS();
            if (i != n) goto bad;
            break;
        }
        goto bad;
    }
#undef SKIP_WS
    free(key);
    return found;
bad:
    free(key);
    return -1;
}

static void run_jsonl_job(TokenizerContext *ctx, Job *j) {
    const char *s = j->in->data;
    size_t p = j->start, lineno = j->first_line;
    char *text = NULL;
    size_t cap = 0, len;
    for (; p < j->end; lineno++) {
        const char *nl = memchr(s + p, '\n', j->end - p);
        size_t e = nl ? (size_t)(nl - s) : j->end;
        size_t k = p;
        while (k < e && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r')) k++;
        if (k < e) {
            int rc = json_get_field(s + p, e - p, j->field, &text, &cap, &len);
            if (rc <= 0) {
                const char *why = rc < 0 ? "not a valid JSON object" : "no string field with the text";
                if (!j->skip_bad) {
                    snprintf(j->err, sizeof j->err, "'%s' line %zu: %s (--skip-bad-lines skips such lines)",
                             j->in->path, lineno, why);
                    break;
                }
                if (j->skipped++ == 0) snprintf(j->bad, sizeof j->bad, "'%s' line %zu: %s", j->in->path, lineno, why);
                p = e + 1;
                continue;
            }
            token_buf_push(&j->out, j->eot);
            if (encode_range(ctx, j, text, len) != 0) break;
        }
        p = e + 1;
    }
    free(text);
}

typedef struct {
    Job *jobs;
    size_t njobs;
    atomic_size_t next;
    TokenizerContext **ctx;
} Batch;

typedef struct {
    Batch *b;
    int thread;
} Worker;

static void *worker_main(void *arg) {
    Worker *w = arg;
    Batch *b = w->b;
    for (;;) {
        size_t i = atomic_fetch_add(&b->next, 1);
        if (i >= b->njobs) break;
        Job *j = &b->jobs[i];
        if (j->in->jsonl) run_jsonl_job(b->ctx[w->thread], j);
        else run_text_job(b->ctx[w->thread], j);
    }
    return NULL;
}

static void run_batch(Batch *b, int nthreads) {
    pthread_t tids[1024];
    Worker w[1024];
    atomic_store(&b->next, 0);
    int n = (size_t)nthreads < b->njobs ? nthreads : (int)b->njobs;
    for (int t = 1; t < n; t++) {
        w[t].b = b, w[t].thread = t;
        if (pthread_create(&tids[t], NULL, worker_main, &w[t]) != 0) llmc_die("cannot start encoding thread %d", t);
    }
    w[0].b = b, w[0].thread = 0;
    worker_main(&w[0]);
    for (int t = 1; t < n; t++) pthread_join(tids[t], NULL);
}

/* ---- progress ------------------------------------------------------------------------ */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    double t0, last;
    size_t total_bytes, done_bytes, tokens;
    int quiet, tty;
} Progress;

static void progress_show(Progress *p, int final, int shards) {
    double t = now_s();
    if (p->quiet || (!final && (!p->tty || t - p->last < 0.5))) return;
    p->last = t;
    double el = t - p->t0, rate = el > 0 ? (double)p->done_bytes / el : 0;
    double eta = rate > 0 ? (double)(p->total_bytes - p->done_bytes) / rate : 0;
    fprintf(stderr, "%s%.1f/%.1f MB (%.0f%%)  %.1f MB/s  %s %d:%02d  %zu tokens  %d shard%s%s",
            p->tty ? "\r" : "", p->done_bytes / 1e6, p->total_bytes / 1e6,
            p->total_bytes ? 100.0 * (double)p->done_bytes / (double)p->total_bytes : 100.0, rate / 1e6,
            final ? "took" : "ETA", (int)((final ? el : eta) / 60), (int)(final ? el : eta) % 60, p->tokens, shards,
            shards == 1 ? "" : "s", final ? "\n" : "  ");
    fflush(stderr);
}

/* ---- the encoding pipeline ---------------------------------------------------------------- */

typedef void (*TokenSink)(void *sink, const uint32_t *ids, size_t n);

typedef struct {
    const Tokenizer *tok;
    int nthreads;
    TokenizerContext **ctx;
    Progress progress;
    int *shards_written; /* for the progress line */
    int skip_bad;        /* --skip-bad-lines */
    int allow_special;   /* encode --allow-special */
    size_t skipped;      /* JSONL lines skipped, and the first of them */
    char first_bad[512];
} Pipeline;

/* Encodes every input in order, handing each job's tokens to sink. text_eot: an EOT before
 * each text file (shards) or not (encode). */
static void encode_inputs(Pipeline *pl, InputFile *ins, int nin, int text_eot, int doc_split, const char *field,
                          TokenSink sink, void *sink_arg) {
    size_t cap = (size_t)pl->nthreads * JOBS_PER_THREAD;
    Batch b = {.jobs = callocCheck(cap, sizeof(Job), "jobs"), .ctx = pl->ctx};
    for (int f = 0; f < nin; f++) {
        InputFile *in = &ins[f];
        size_t pos = 0, line = 1;
        int first = 1;
        while (first || pos < in->len) {
            b.njobs = 0;
            while (b.njobs < cap && (first || pos < in->len)) {
                Job *j = &b.jobs[b.njobs++];
                size_t end = in->jsonl ? jsonl_job_end(in->data, in->len, pos)
                                       : text_job_end(in->data, in->len, pos, doc_split);
                TokenBuf keep = j->out;
                memset(j, 0, sizeof *j);
                j->out = keep, j->out.n = 0;
                j->in = in, j->start = pos, j->end = end, j->eot = tokenizer_eot(pl->tok);
                j->eot_first = first && text_eot, j->doc_split = doc_split, j->field = field, j->first_line = line;
                j->skip_bad = pl->skip_bad, j->allow_special = pl->allow_special;
                if (in->jsonl) {
                    for (const char *q = in->data + pos; (q = memchr(q, '\n', (size_t)(in->data + end - q))); q++) line++;
                }
                pos = end, first = 0;
            }
            run_batch(&b, pl->nthreads);
            for (size_t i = 0; i < b.njobs; i++) {
                Job *j = &b.jobs[i];
                if (j->err[0]) llmc_die("%s", j->err);
                if (j->skipped && !pl->skipped) snprintf(pl->first_bad, sizeof pl->first_bad, "%s", j->bad);
                pl->skipped += j->skipped;
                sink(sink_arg, j->out.ids, j->out.n);
                pl->progress.done_bytes += j->end - j->start;
                pl->progress.tokens += j->out.n;
            }
            progress_show(&pl->progress, 0, pl->shards_written ? *pl->shards_written : 0);
        }
    }
    for (size_t i = 0; i < cap; i++) token_buf_free(&b.jobs[i].out);
    free(b.jobs);
}

static void pipeline_init(Pipeline *pl, const Tokenizer *tok, const Options *o, InputFile *ins, int nin) {
    memset(pl, 0, sizeof *pl);
    pl->tok = tok;
    pl->nthreads = (int)o->threads;
    pl->ctx = callocCheck((size_t)pl->nthreads, sizeof *pl->ctx, "contexts");
    char err[512];
    for (int t = 0; t < pl->nthreads; t++) {
        pl->ctx[t] = tokenizer_context_new(tok, err, sizeof err);
        if (!pl->ctx[t]) llmc_die("%s", err);
    }
    pl->progress.t0 = pl->progress.last = now_s();
    pl->progress.quiet = (int)o->quiet;
    pl->skip_bad = (int)o->skip_bad_lines;
    pl->progress.tty = isatty(2);
    for (int f = 0; f < nin; f++) pl->progress.total_bytes += ins[f].len;
}

static void pipeline_free(Pipeline *pl) {
    for (int t = 0; t < pl->nthreads; t++) tokenizer_context_free(pl->ctx[t]);
    free(pl->ctx);
}

static int resolve_token_bytes(const Options *o, const Tokenizer *t) {
    if (o->token_bytes == 0) return tokenizer_vocab_size(t) > 65536 ? 4 : 2;
    if (o->token_bytes != 2 && o->token_bytes != 4) llmc_die("flag --token-bytes: must be 0, 2 or 4");
    if (o->token_bytes == 2 && tokenizer_vocab_size(t) > 65536)
        llmc_die("flag --token-bytes 2: the vocab has %zu tokens, more than uint16 holds", tokenizer_vocab_size(t));
    return (int)o->token_bytes;
}

/* ---- commands ----------------------------------------------------------------------- */

static void sink_append(void *arg, const uint32_t *ids, size_t n) {
    TokenBuf *buf = arg;
    for (size_t i = 0; i < n; i++) token_buf_push(buf, ids[i]);
}

static int cmd_encode(int argc, char **argv, Options *o) {
    static const Command cmd = {"encode", "IN OUT.bin",
                                "Encodes the text file IN (no EOT added) into the data shard OUT.bin.", 2, 2};
    static const Flag allow = {"--allow-special", NULL, FLAG_BOOL, OPT(allow_special), 0, 1,
                               "tiktoken rank file: the text of a special token becomes that token"};
    const Flag *flags[] = {&FLAG_TOKENIZER, &FLAG_THREADS, &FLAG_TOKEN_BYTES, &FLAG_QUIET, &FLAG_PATTERN,
                           &FLAG_PATTERN_REGEX, &FLAG_SPECIALS, &FLAG_DELIMITER, &allow};
    char *pos[2];
    parse_args(&cmd, flags, 9, argc, argv, o, pos);
    Tokenizer *t = load_tokenizer(o, 1);
    int token_bytes = resolve_token_bytes(o, t);
    InputFile in;
    input_open(&in, pos[0], 0);
    Pipeline pl;
    pipeline_init(&pl, t, o, &in, 1);
    pl.allow_special = (int)o->allow_special;
    TokenBuf all = {0};
    encode_inputs(&pl, &in, 1, 0, 0, NULL, sink_append, &all);
    shard_write(pos[1], all.ids, all.n, token_bytes);
    progress_show(&pl.progress, 1, 1);
    token_buf_free(&all);
    pipeline_free(&pl);
    input_close(&in);
    tokenizer_free(t);
    return 0;
}

static int cmd_decode(int argc, char **argv, Options *o) {
    static const Command cmd = {"decode", "IN.bin", "Writes the text of the data shard IN.bin to stdout.", 1, 1};
    const Flag *flags[] = {&FLAG_TOKENIZER, &FLAG_PATTERN, &FLAG_PATTERN_REGEX, &FLAG_SPECIALS, &FLAG_DELIMITER};
    char *pos[1];
    parse_args(&cmd, flags, 5, argc, argv, o, pos);
    Tokenizer *t = load_tokenizer(o, 0);
    ShardInfo info;
    char err[1024];
    if (shard_read_header(pos[0], &info, err, sizeof err) != 0) llmc_die("%s", err);
    FILE *f = fopenCheck(pos[0], "rb");
    if (fseek(f, SHARD_HEADER_BYTES, SEEK_SET) != 0) llmc_die("cannot seek in '%s'", pos[0]);
    enum { CHUNK = 1 << 16 };
    unsigned char *raw = mallocCheck((size_t)CHUNK * 4, "decode buffer");
    for (size_t done = 0; done < info.ntok;) {
        size_t n = info.ntok - done < CHUNK ? info.ntok - done : CHUNK;
        freadCheck(raw, (size_t)info.token_bytes, n, f, pos[0]);
        for (size_t i = 0; i < n; i++) {
            uint32_t id;
            if (info.token_bytes == 2) {
                uint16_t v;
                memcpy(&v, raw + 2 * i, 2);
                id = v;
            } else {
                memcpy(&id, raw + 4 * i, 4);
            }
            size_t len;
            const unsigned char *bytes = tokenizer_token_bytes(t, id, &len);
            if (!bytes)
                llmc_die("'%s': token %zu is id %u, outside the vocab of %zu", pos[0], done + i, id,
                         tokenizer_vocab_size(t));
            if (fwrite(bytes, 1, len, stdout) != len) llmc_die("writing to stdout failed: %s", strerror(errno));
        }
        done += n;
    }
    if (fflush(stdout) != 0) llmc_die("writing to stdout failed: %s", strerror(errno));
    free(raw);
    fclose(f);
    tokenizer_free(t);
    return 0;
}

static int cmd_export(int argc, char **argv, Options *o) {
    static const Command cmd = {"export", "OUT.bin",
                                "Writes llm.c's tokenizer file (version 2, with the EOT id) to OUT.bin.", 1, 1};
    const Flag *flags[] = {&FLAG_TOKENIZER, &FLAG_PATTERN, &FLAG_PATTERN_REGEX, &FLAG_SPECIALS, &FLAG_DELIMITER};
    char *pos[1], err[1024];
    parse_args(&cmd, flags, 5, argc, argv, o, pos);
    Tokenizer *t = load_tokenizer(o, 0);
    if (tokenizer_save_llmc(t, pos[0], err, sizeof err) != 0) llmc_die("%s", err);
    tokenizer_free(t);
    return 0;
}

/* Shard writer: the first shard is validation (val_tokens of them, or shard_tokens). */
typedef struct {
    const Options *o;
    int token_bytes;
    TokenBuf cur;
    size_t cur_limit;
    int index;
    size_t total;
} ShardSink;

static void clear_old_shards(const char *prefix, int overwrite, int remove);

/* ---- staged shards: written as "<shard>.tmp.<pid>", renamed into place at the end -------------
 * A dataset appears only whole: until every input is encoded and the last shard written, the
 * shards are staged under names no glob of shards matches (nor clear_old_shards), and a run that
 * stops on any error (a bad JSONL line in a later input, a full disk, ...) removes them at exit,
 * or on SIGINT, SIGTERM or SIGHUP before it dies of the signal (SIGXFSZ, a file size limit, is
 * ignored: the write fails and reports it). Only a kill -9 can leave staged files behind, and
 * those do not look like a dataset. The list is appended to only after a node is complete, so
 * that the signal handler can walk it. */
typedef struct Staged {
    struct Staged *next;
    char *final, *tmp, *partial; /* the shard's name; its staging name; shard_write's temporary file of that */
} Staged;
static Staged *staged_head, **staged_tail = &staged_head;
static volatile sig_atomic_t staged_committed;

static void staged_unlink_all(void) {
    for (Staged *s = staged_head; s && !staged_committed; s = s->next) unlink(s->tmp), unlink(s->partial);
}

static void staged_free(void) {
    for (Staged *s = staged_head, *next; s; s = next) next = s->next, free(s);
    staged_head = NULL, staged_tail = &staged_head;
}

static void staged_remove_at_exit(void) {
    staged_unlink_all();
    staged_free();
}

static void staged_on_signal(int sig) { /* unlink() and raise() only: async-signal-safe */
    staged_unlink_all();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Records a shard about to be written under final; returns its staging name. */
static const char *staged_add(const char *final) {
    static int registered;
    if (!registered) {
        registered = 1;
        atexit(staged_remove_at_exit);
        signal(SIGINT, staged_on_signal), signal(SIGTERM, staged_on_signal), signal(SIGHUP, staged_on_signal);
    }
    char tmp[4300], partial[4400];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", final, (long)getpid());
    snprintf(partial, sizeof partial, "%s.tmp.%ld", tmp, (long)getpid()); /* atomic_open's name for tmp */
    size_t a = strlen(final) + 1, b = strlen(tmp) + 1, c = strlen(partial) + 1;
    Staged *s = mallocCheck(sizeof *s + a + b + c, "the list of shards written");
    s->next = NULL;
    s->final = memcpy((char *)(s + 1), final, a);
    s->tmp = memcpy(s->final + a, tmp, b);
    s->partial = memcpy(s->tmp + b, partial, c);
    *staged_tail = s; /* published complete */
    staged_tail = &s->next;
    return s->tmp;
}

/* Takes back the last shard staged (the validation shard of a corpus too small to split). */
static void staged_drop_last(void) {
    Staged **p = &staged_head;
    if (!*p) return;
    while ((*p)->next) p = &(*p)->next;
    Staged *last = *p;
    *p = NULL, staged_tail = p;
    unlink(last->tmp);
    free(last);
}

/* The dataset is complete: --overwrite's old shards go now (not before: a failed run keeps them),
 * then every staged shard takes its name. */
static void staged_commit(const Options *o) {
    if (o->overwrite) clear_old_shards(o->prefix, 1, 1);
    for (Staged *s = staged_head; s; s = s->next)
        if (rename(s->tmp, s->final) != 0) {
            int e = errno;
            for (Staged *r = staged_head; r != s; r = r->next) unlink(r->final); /* ours: no part of a dataset stays */
            llmc_die("cannot rename '%s' to '%s': %s", s->tmp, s->final, strerror(e));
        }
    staged_committed = 1;
}

static void shard_flush(ShardSink *s) {
    char path[4200];
    const char *split = s->index == 0 ? "val" : "train";
    if (s->o->no_index) {
        if (s->index > 1)
            llmc_die("--no-index: more than one train shard is needed; raise --shard-tokens (now %lld)",
                     s->o->shard_tokens);
        snprintf(path, sizeof path, "%s_%s.bin", s->o->prefix, split);
    } else {
        snprintf(path, sizeof path, "%s_%s_%06d.bin", s->o->prefix, split, s->index);
    }
    shard_write(staged_add(path), s->cur.ids, s->cur.n, s->token_bytes);
    s->total += s->cur.n;
    s->cur.n = 0;
    s->index++;
    s->cur_limit = (size_t)s->o->shard_tokens;
}

static void sink_shards(void *arg, const uint32_t *ids, size_t n) {
    ShardSink *s = arg;
    for (size_t i = 0; i < n; i++) {
        token_buf_push(&s->cur, ids[i]);
        if (s->cur.n == s->cur_limit) shard_flush(s);
    }
}

/* ---- the output prefix: its directory, and shards an earlier run left there ------------------ */

/* mkdir -p of the directory part of prefix ("data/mydata/my" -> data/mydata). */
static void make_prefix_dir(const char *prefix) {
    char path[4096];
    snprintf(path, sizeof path, "%s", prefix);
    char *slash = strrchr(path, '/');
    if (!slash || slash == path) return;
    *slash = '\0';
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            llmc_die("--out-prefix %s: cannot create directory '%s': %s", prefix, path, strerror(errno));
        *p = saved;
        if (!saved) break;
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) llmc_die("--out-prefix %s: '%s' is not a directory", prefix, path);
}

/* 1 if name is one of our shards for base (the prefix's file part): base_{val,train}_NNNNNN.bin
 * (six or more digits) or base_{val,train}.bin. */
static int is_prefix_shard(const char *name, const char *base) {
    size_t n = strlen(base);
    if (strncmp(name, base, n) != 0) return 0;
    const char *r = name + n;
    if (strncmp(r, "_val", 4) == 0) r += 4;
    else if (strncmp(r, "_train", 6) == 0) r += 6;
    else return 0;
    if (strcmp(r, ".bin") == 0) return 1;
    if (*r++ != '_') return 0;
    int digits = 0;
    while (*r >= '0' && *r <= '9') r++, digits++;
    return digits >= 6 && strcmp(r, ".bin") == 0;
}

/* Shards of an earlier run under this prefix would be read by training together with the new
 * ones (a glob matches both). remove 0: dies if there are any, unless overwrite (--overwrite);
 * remove 1: removes them (called when the new dataset is complete, by staged_commit, so that a run
 * that fails at any point leaves the old shards in place). */
static void clear_old_shards(const char *prefix, int overwrite, int remove) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", prefix);
    char *slash = strrchr(dir, '/');
    const char *base = prefix;
    if (slash) {
        base = prefix + (slash - dir) + 1;
        if (slash == dir) slash[1] = '\0';
        else *slash = '\0';
    } else {
        snprintf(dir, sizeof dir, ".");
    }
    DIR *d = opendir(dir);
    if (!d) llmc_die("--out-prefix %s: cannot read directory '%s': %s", prefix, dir, strerror(errno));
    size_t found = 0;
    char first[4400] = "";
    for (struct dirent *e; (e = readdir(d));) {
        if (!is_prefix_shard(e->d_name, base)) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (found++ == 0) snprintf(first, sizeof first, "%s", path);
        if (remove && unlink(path) != 0) llmc_die("--overwrite: cannot remove '%s': %s", path, strerror(errno));
    }
    closedir(d);
    if (!found || (overwrite && !remove)) return;
    if (!overwrite)
        llmc_die("--out-prefix %s: %zu shard file(s) of an earlier run exist (e.g. '%s'); training would read them "
                 "with the new ones. Remove them, choose another prefix, or pass --overwrite to replace them",
                 prefix, found, first);
    fprintf(stderr, "removed %zu shard file(s) of an earlier run under '%s' (--overwrite)\n", found, prefix);
}

/* Called when the input has ended, before the last flush. The validation shard comes first, so a
 * corpus that does not reach past it would leave nothing for training. Explicit --val-tokens: an
 * error (its message in err, for the caller to report after freeing). Default (the first shard is validation): when the whole corpus fits in that one shard,
 * its first tenth becomes validation and the rest training. */
static void split_small_corpus(ShardSink *s, char *err, size_t errlen) {
    int train_empty = s->index == 0 || (s->index == 1 && s->cur.n == 0);
    if (!train_empty) return;
    size_t total = s->total + s->cur.n;
    if (s->o->val_tokens || s->index == 1) {
        if (s->index == 1) staged_drop_last(); /* the validation shard was staged by this run: take it back */
        snprintf(err, errlen, "the corpus has %zu tokens, not more than the validation part (%s %lld), so nothing would be "
                 "left for training; lower --val-tokens (e.g. to %zu, a tenth)", total,
                 s->o->val_tokens ? "--val-tokens" : "the first shard, --shard-tokens",
                 s->o->val_tokens ? s->o->val_tokens : s->o->shard_tokens, total / 10 ? total / 10 : 1);
        return;
    }
    if (total < 2) {
        snprintf(err, errlen, "the corpus has %zu token(s): too few to split into validation and training", total);
        return;
    }
    size_t nval = total / 10 ? total / 10 : 1;
    fprintf(stderr, "note: the corpus (%zu tokens) fits in one shard: its first %zu tokens (a tenth) are validation, "
            "the rest training (--val-tokens N sets the split)\n", total, nval);
    TokenBuf all = s->cur;
    s->cur = (TokenBuf){0};
    for (size_t i = 0; i < nval; i++) token_buf_push(&s->cur, all.ids[i]);
    shard_flush(s);
    for (size_t i = nval; i < total; i++) token_buf_push(&s->cur, all.ids[i]);
    token_buf_free(&all);
}

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int cmd_shards(int argc, char **argv, Options *o) {
    static const Command cmd = {
        "shards", "INPUT...",
        "Tokenizes documents into llm.c data shards: an EOT before every document; the first shard\n"
        "(or the first --val-tokens tokens) is validation, PREFIX_val_000000.bin; then PREFIX_train_NNNNNN.bin.\n"
        "A text file is one document (or many, with --doc-split blank-lines); a JSONL line is one.",
        1, -1};
    const Flag *flags[20] = {&FLAG_TOKENIZER, &FLAG_THREADS, &FLAG_TOKEN_BYTES, &FLAG_QUIET,
                             &FLAG_PATTERN, &FLAG_PATTERN_REGEX, &FLAG_SPECIALS, &FLAG_DELIMITER};
    int nflags = 8;
    for (size_t i = 0; i < sizeof SHARD_FLAGS / sizeof SHARD_FLAGS[0]; i++) flags[nflags++] = &SHARD_FLAGS[i];
    char **pos = mallocCheck((size_t)argc * sizeof *pos + 1, "arguments");
    int nin = parse_args(&cmd, flags, nflags, argc, argv, o, pos);
    if (!o->prefix) llmc_die("shards: --out-prefix PREFIX is required (see ./tokenizer shards --help)");
    int doc_split = strcmp(o->doc_split, "blank-lines") == 0;
    if (!doc_split && strcmp(o->doc_split, "none") != 0)
        llmc_die("flag --doc-split: '%s' is not one of none, blank-lines", o->doc_split);
    if (strcmp(o->format, "auto") && strcmp(o->format, "text") && strcmp(o->format, "jsonl"))
        llmc_die("flag --format: '%s' is not one of auto, text, jsonl", o->format);
    Tokenizer *t = load_tokenizer(o, 1);
    if (tokenizer_eot(t) >= tokenizer_vocab_size(t))
        llmc_die("shards: the tokenizer has no special token to put before each document: give --specials");
    make_prefix_dir(o->prefix);
    clear_old_shards(o->prefix, (int)o->overwrite, 0);
    ShardSink sink = {.o = o, .token_bytes = resolve_token_bytes(o, t)};
    sink.cur_limit = (size_t)(o->val_tokens ? o->val_tokens : o->shard_tokens);
    InputFile *ins = callocCheck((size_t)nin, sizeof *ins, "inputs");
    for (int i = 0; i < nin; i++) {
        int jsonl = strcmp(o->format, "jsonl") == 0 ||
                    (strcmp(o->format, "auto") == 0 && (has_suffix(pos[i], ".jsonl") || has_suffix(pos[i], ".json")));
        input_open(&ins[i], pos[i], jsonl);
    }
    Pipeline pl;
    pipeline_init(&pl, t, o, ins, nin);
    pl.shards_written = &sink.index;
    encode_inputs(&pl, ins, nin, 1, doc_split, o->field, sink_shards, &sink);
    char err[1024] = "";
    split_small_corpus(&sink, err, sizeof err);
    if (!err[0]) {
        if (sink.cur.n) shard_flush(&sink);
        staged_commit(o);
        progress_show(&pl.progress, 1, sink.index);
        if (pl.skipped)
            fprintf(stderr, "warning: skipped %zu bad JSONL line(s) (--skip-bad-lines); the first: %s\n", pl.skipped,
                    pl.first_bad);
    }
    token_buf_free(&sink.cur);
    pipeline_free(&pl);
    for (int i = 0; i < nin; i++) input_close(&ins[i]);
    free(ins);
    free(pos);
    tokenizer_free(t);
    if (err[0]) llmc_die("%s", err); /* after everything is freed: the sanitizer pass checks this path for leaks */
    return 0;
}

/* ---- evalfile: multiple-choice JSONL -> llm.c's eval file -------------------------------- */
enum { EVAL_MAX_ENDINGS = 16 };
typedef struct {
    char *ctx, *ctx_a, *ctx_b, *endings[EVAL_MAX_ENDINGS];
    size_t ctx_len, ctx_a_len, ctx_b_len, ending_len[EVAL_MAX_ENDINGS];
    size_t ctx_cap, ctx_a_cap, ctx_b_cap, ending_cap[EVAL_MAX_ENDINGS];
    int has_ctx, has_ctx_a, has_ctx_b, nendings, label;
} EvalLine;

/* One JSONL line {"ctx": ..., "endings": [...], "label": k} (or HellaSwag's ctx_a / ctx_b; other
 * fields ignored; label a number or a string of digits) into e. Returns NULL or why not. */
static const char *eval_parse_line(const char *s, size_t n, EvalLine *e) {
    size_t i = 0;
    char *key = NULL, *num = NULL;
    size_t keycap = 0, keylen, numcap = 0, numlen;
    const char *why = "not a valid JSON object";
    int has_label = 0, has_endings = 0;
    e->has_ctx = e->has_ctx_a = e->has_ctx_b = 0, e->nendings = 0, e->label = -1;
#define WS() while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r')) i++
    WS();
    if (i >= n || s[i] != '{') goto out;
    i++;
    WS();
    while (i < n && s[i] != '}') {
        size_t used = json_decode_string(s + i, n - i, &key, &keycap, &keylen);
        if (!used) goto out;
        i += used;
        WS();
        if (i >= n || s[i] != ':') goto out;
        i++;
        WS();
        char **str = NULL;
        size_t *len = NULL, *cap = NULL;
        int *flag = NULL;
        if (keylen == 3 && memcmp(key, "ctx", 3) == 0) str = &e->ctx, len = &e->ctx_len, cap = &e->ctx_cap, flag = &e->has_ctx;
        if (keylen == 5 && memcmp(key, "ctx_a", 5) == 0) str = &e->ctx_a, len = &e->ctx_a_len, cap = &e->ctx_a_cap, flag = &e->has_ctx_a;
        if (keylen == 5 && memcmp(key, "ctx_b", 5) == 0) str = &e->ctx_b, len = &e->ctx_b_len, cap = &e->ctx_b_cap, flag = &e->has_ctx_b;
        if (str) {
            if (i >= n || s[i] != '"' || !(used = json_decode_string(s + i, n - i, str, cap, len))) {
                why = "a context field is not a string";
                goto out;
            }
            i += used, *flag = 1;
        } else if (keylen == 7 && memcmp(key, "endings", 7) == 0) {
            if (i >= n || s[i] != '[') {
                why = "\"endings\" is not an array of strings";
                goto out;
            }
            i++, has_endings = 1, e->nendings = 0;
            WS();
            while (i < n && s[i] != ']') {
                int k = e->nendings;
                if (k == EVAL_MAX_ENDINGS || s[i] != '"' ||
                    !(used = json_decode_string(s + i, n - i, &e->endings[k], &e->ending_cap[k], &e->ending_len[k]))) {
                    why = k == EVAL_MAX_ENDINGS ? "more than 16 endings" : "\"endings\" is not an array of strings";
                    goto out;
                }
                i += used, e->nendings++;
                WS();
                if (i < n && s[i] == ',') i++;
                else if (i >= n || s[i] != ']') goto out;
                WS();
            }
            if (i >= n) goto out;
            i++;
        } else if (keylen == 5 && memcmp(key, "label", 5) == 0) {
            const char *v = s + i;
            size_t vl;
            if (i < n && s[i] == '"') {
                if (!(used = json_decode_string(s + i, n - i, &num, &numcap, &numlen))) goto out;
                v = num, vl = numlen, i += used;
            } else {
                size_t end = json_skip_value(s, n, i, 0);
                if (!end) goto out;
                vl = end - i, i = end;
            }
            long long lab = 0;
            size_t d = 0;
            for (; d < vl && d < 10 && v[d] >= '0' && v[d] <= '9'; d++) lab = lab * 10 + (v[d] - '0');
            if (d == 0 || d != vl) {
                why = "\"label\" is not a non-negative integer";
                goto out;
            }
            e->label = (int)lab, has_label = 1;
        } else {
            size_t end = json_skip_value(s, n, i, 0);
            if (!end) goto out;
            i = end;
        }
        WS();
        if (i < n && s[i] == ',') {
            i++;
            WS();
        } else if (i >= n || s[i] != '}') goto out;
    }
    if (i >= n) goto out;
    i++;
    WS();
    if (i != n) goto out;
#undef WS
    why = !e->has_ctx && !e->has_ctx_a ? "no \"ctx\" (or \"ctx_a\") string"
          : !has_endings                ? "no \"endings\" array"
          : !has_label                  ? "no \"label\""
                                        : NULL;
out:
    free(key), free(num);
    return why;
}

static char *grow_text(char *p, size_t n) {
    char *q = (char *)realloc(p, n);
    if (!q) llmc_die("out of memory: a line of %zu bytes", n);
    return q;
}

static int cmd_evalfile(int argc, char **argv, Options *o) {
    static const Command cmd = {
        "evalfile", "IN.jsonl OUT.bin",
        "Writes llm.c's multiple-choice eval file (dev/data/data_common.py write_evalfile; -h 1 of the trainers)\n"
        "from JSONL lines {\"ctx\": ..., \"endings\": [4 strings], \"label\": k} (HellaSwag's own lines: \"ctx\", or\n"
        "\"ctx_a\" + \" \" + \"ctx_b\"). Each ending is encoded with a space before it, as llm.c's hellaswag.py\n"
        "does. Version 1 (uint16 words) for a vocabulary of at most 65535 tokens (GPT-2), else 2 (uint32).",
        2, 2};
    static const Flag skip = {"--skip-bad-lines", NULL, FLAG_BOOL, OPT(skip_bad_lines), 0, 1,
                              "skip bad lines (counted, the first reported) instead of stopping at the first"};
    const Flag *flags[] = {&FLAG_TOKENIZER, &FLAG_QUIET, &FLAG_PATTERN, &FLAG_PATTERN_REGEX, &FLAG_SPECIALS, &skip};
    char *pos[2], err[1024];
    parse_args(&cmd, flags, 6, argc, argv, o, pos);
    Tokenizer *t = load_tokenizer(o, 1);
    TokenizerContext *tc = tokenizer_context_new(t, err, sizeof err);
    if (!tc) llmc_die("%s", err);
    InputFile in;
    input_open(&in, pos[0], 1);
    EvalWriter w;
    evalwriter_init(&w, tokenizer_vocab_size(t) > 65535 ? EVALFILE_VERSION_U32 : EVALFILE_VERSION_U16);
    EvalLine e = {0};
    TokenBuf ctx = {0}, ends[EVAL_MAX_ENDINGS] = {{0}};
    char *text = NULL, first_bad[1700] = "";
    size_t textcap = 0, skipped = 0, lineno = 0;
    for (size_t p = 0; p < in.len; p = p + 1) {
        const char *nl = memchr(in.data + p, '\n', in.len - p);
        size_t end = nl ? (size_t)(nl - in.data) : in.len, k = p;
        lineno++;
        while (k < end && (in.data[k] == ' ' || in.data[k] == '\t' || in.data[k] == '\r')) k++;
        const char *why = NULL;
        if (k < end) {
            why = eval_parse_line(in.data + p, end - p, &e);
            if (!why) {
                const char *src = e.has_ctx ? e.ctx : e.ctx_a;
                size_t n = e.has_ctx ? e.ctx_len : e.ctx_a_len, need = n + 2 + (e.has_ctx_b ? e.ctx_b_len : 0);
                if (need > textcap) text = grow_text(text, textcap = need);
                memcpy(text, src, n);
                if (!e.has_ctx && e.has_ctx_b && e.ctx_b_len) text[n++] = ' ', memcpy(text + n, e.ctx_b, e.ctx_b_len), n += e.ctx_b_len;
                ctx.n = 0;
                if (tokenizer_encode(tc, text, n, &ctx, err, sizeof err) != 0) why = err;
                const uint32_t *comps[EVAL_MAX_ENDINGS];
                size_t ncomp[EVAL_MAX_ENDINGS];
                for (int c = 0; c < e.nendings && !why; c++) {
                    if (e.ending_len[c] + 1 > textcap) text = grow_text(text, textcap = e.ending_len[c] + 1);
                    text[0] = ' ';
                    memcpy(text + 1, e.endings[c], e.ending_len[c]);
                    ends[c].n = 0;
                    if (tokenizer_encode(tc, text, e.ending_len[c] + 1, &ends[c], err, sizeof err) != 0) why = err;
                    comps[c] = ends[c].ids, ncomp[c] = ends[c].n;
                }
                if (!why) why = evalwriter_add(&w, e.label, ctx.ids, ctx.n, comps, ncomp, e.nendings);
            }
        }
        if (why) {
            if (!o->skip_bad_lines)
                llmc_die("evalfile: '%s' line %zu: %s (--skip-bad-lines skips such lines)", pos[0], lineno, why);
            if (skipped++ == 0) snprintf(first_bad, sizeof first_bad, "'%s' line %zu: %s", pos[0], lineno, why);
        }
        p = end;
    }
    if (w.num_examples == 0)
        llmc_die("evalfile: '%s' has no examples%s%s", pos[0], skipped ? " that could be written; the first bad line: " : "",
                 first_bad);
    evalwriter_save(&w, pos[1]);
    if (skipped)
        fprintf(stderr, "warning: skipped %zu bad line(s) (--skip-bad-lines); the first: %s\n", skipped, first_bad);
    if (!o->quiet)
        fprintf(stderr, "wrote %d examples to '%s' (eval file version %d, longest example %u bytes)\n", w.num_examples,
                pos[1], w.version, w.longest);
    for (int c = 0; c < EVAL_MAX_ENDINGS; c++) free(e.endings[c]), token_buf_free(&ends[c]);
    free(e.ctx), free(e.ctx_a), free(e.ctx_b), free(text);
    token_buf_free(&ctx);
    evalwriter_free(&w);
    input_close(&in);
    tokenizer_context_free(tc);
    tokenizer_free(t);
    return 0;
}

static int cmd_find_gpt2(int argc, char **argv, Options *o) {
    static const Command cmd = {"find-gpt2", "",
                                "Prints the directory with encoder.json + vocab.bpe that the other commands use by\n"
                                "default ($LLMC_DATA_DIR/gpt2, data/gpt2, ../shared/data/gpt2); exit status 1 if none.", 0, 0};
    char dir[4096];
    parse_args(&cmd, NULL, 0, argc, argv, o, NULL);
    if (tokenizer_find_default(dir, sizeof dir) != 0) {
        fprintf(stderr, "no GPT-2 tokenizer files in $LLMC_DATA_DIR/gpt2, data/gpt2 or ../shared/data/gpt2\n");
        return 1;
    }
    printf("%s\n", dir);
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: ./tokenizer COMMAND [options] ARGS   (./tokenizer COMMAND --help for each)\n"
               "  encode IN OUT.bin     encode a text file into a data shard (no EOT added)\n"
               "  decode IN.bin         write a data shard's text to stdout\n"
               "  shards -o PREFIX IN.. text/JSONL documents -> train/val shards (multi-threaded)\n"
               "  export OUT.bin        write llm.c's tokenizer file\n"
               "  evalfile IN OUT.bin   multiple-choice JSONL (HellaSwag) -> llm.c's eval file (-h 1)\n"
               "  find-gpt2             print the default GPT-2 files directory\n");
}

int main(int argc, char **argv) {
    /* a file size limit (ulimit -f) fails the write with EFBIG, reported and cleaned up, instead
     * of killing the process in the middle of a file */
    signal(SIGXFSZ, SIG_IGN);
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    Options o = {
        .threads = nproc > 0 ? (nproc > 1024 ? 1024 : nproc) : 1,
        .shard_tokens = 100000000,
        .format = "auto",
        .doc_split = "none",
        .field = "text",
    };
    if (argc < 2) {
        usage(stderr);
        return 1;
    }
    const char *c = argv[1];
    if (strcmp(c, "--help") == 0 || strcmp(c, "-h") == 0 || strcmp(c, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(c, "encode") == 0) return cmd_encode(argc - 2, argv + 2, &o);
    if (strcmp(c, "decode") == 0) return cmd_decode(argc - 2, argv + 2, &o);
    if (strcmp(c, "shards") == 0) return cmd_shards(argc - 2, argv + 2, &o);
    if (strcmp(c, "export") == 0) return cmd_export(argc - 2, argv + 2, &o);
    if (strcmp(c, "find-gpt2") == 0) return cmd_find_gpt2(argc - 2, argv + 2, &o);
    if (strcmp(c, "evalfile") == 0) return cmd_evalfile(argc - 2, argv + 2, &o);
    llmc_die("unknown command '%s' (expected encode, decode, shards, export, find-gpt2 or evalfile; see ./tokenizer "
             "--help)", c);
}
