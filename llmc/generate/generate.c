/*
 * generate.c - the front end shared by ./generate (CPU) and ./generate_gpu (CUDA): continue a
 * prompt with a trained model.
 *
 *   ./generate -e out/run1/model_00005000.bin --prompt "The king" -g 100 --temperature 0.8
 *   echo "The king" | ./generate -e model.bin --temperature 0
 *
 * stdout gets the prompt and its continuation as text, byte for byte, and nothing else;
 * everything else (what was loaded, speed) goes to stderr. Generation stops after -g tokens,
 * at end-of-text (not printed; with Llama 3's tokenizer <|end_of_text|> or <|eot_id|>, and the
 * prompt starts with <|begin_of_text|>), or when the sequence fills the model's context (maxT).
 * Decoding runs the model on new tokens only, against a key/value cache (the backend's).
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llmc/generate/generate.h"

#include "llmc/core/check.h"
#include "llmc/core/rng.h"
#include "llmc/generate/sampler.h"
#include "llmc/data/tokenizer.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static void usage(FILE *out, const GenerateBackend *be) {
    fprintf(out,
            "usage: %s -e MODEL [--prompt TEXT] [flags]   (no --prompt: the prompt is read from stdin)\n\n"
            "  -e PATH              model: an llm.c checkpoint (model_*.bin), a Hugging Face GPT-2 directory\n"
            "                       (config.json + safetensors), or dN for a random GPT-2 of depth N; ./generate\n"
            "                       also takes a Llama 3 (llmc's or llm.c's file, an HF Llama directory, llama3:dN)\n"
            "  --prompt TEXT        text to continue; empty: start from end-of-text\n"
            "  -g N                 tokens to generate (default: 256); stops earlier at end-of-text or maxT\n"
            "  --temperature X      0 = greedy (argmax); else sample softmax(logits / X) (default: 1)\n"
            "  --top-k N            sample among the N most likely tokens; 0 = all (default: 0)\n"
            "  --top-p X            sample among the most likely tokens holding probability X; 1 = all (default: 1)\n"
            "  --seed N             sampling (and dN initialisation) seed (default: 1337)\n"
            "  --tokenizer PATH     GPT-2's: a directory with encoder.json + vocab.bpe (needed to encode a prompt),\n"
            "                       or llm.c's tokenizer file (decode only); Llama 3's: its tiktoken rank file\n"
            "                       (tokenizer.model), or a directory holding tokenizer.model or original/tokenizer.model\n"
            "                       (an HF Llama directory). Default: -e's directory when it holds tokenizer.model or\n"
            "                       original/tokenizer.model, else $LLMC_DATA_DIR/gpt2, data/gpt2, ../shared/data/gpt2,\n"
            "                       then data/gpt2_tokenizer.bin. Its vocabulary must be the model's: a Llama without\n"
            "                       its tokenizer is an error (nothing is generated).\n"
            "                       With Llama 3's tokenizer the prompt is <|begin_of_text|> then the text (special\n"
            "                       tokens' names in it, e.g. <|start_header_id|>, become those tokens), and generation\n"
            "                       stops at <|end_of_text|> or <|eot_id|>\n"
            "  --precision P        %s\n"
            "  --threads N          CPU threads; 0 = all cores (default: 0)\n"
            "  --adapter DIR        a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors)\n"
            "                       applied unmerged on -e, the base it was trained on, or a prompt-tuning one (its\n"
            "                       soft tokens before the prompt; ./generate)\n"
            "  --quantize-base M    nf4 | int8: the block linear weights quantised after loading (QLoRA's formats:\n"
            "                       post-training quantised inference, with or without --adapter; ./generate)\n"
            "  --double-quant 1     with nf4: the absmax values quantised too (bitsandbytes' double quantisation)\n"
            "  --help               print this help and exit\n",
            be->program, be->precisions);
}

static long long parse_integer(const char *flag, const char *v, long long lo, long long hi) {
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno) llmc_die("flag %s expects an integer, got '%s'", flag, v);
    if (x < lo || x > hi) llmc_die("flag %s must be between %lld and %lld, got %lld", flag, lo, hi, x);
    return x;
}

static float parse_number(const char *flag, const char *v) {
    char *end = NULL;
    errno = 0;
    float x = strtof(v, &end);
    if (errno == ERANGE && fabsf(x) < 1.0f) errno = 0; /* an underflow (1e-40): the nearest float, like a literal */
    if (errno == ERANGE && end != v && !*end)
        llmc_die("flag %s: '%s' is out of range (a float's largest magnitude is about 3.4e38)", flag, v);
    if (end == v || *end || errno || !isfinite(x)) llmc_die("flag %s expects a number, got '%s'", flag, v);
    return x;
}

static void parse_args(GenConfig *g, int argc, char **argv, const GenerateBackend *be) {
    *g = (GenConfig){NULL, NULL, NULL, NULL, 256, 1.0f, 0, 1.0f, 1337, 0, NULL, NULL, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0) {
            usage(stdout, be);
            exit(0);
        }
        if (i + 1 >= argc) llmc_die("flag %s needs a value (see %s --help)", a, be->program);
        const char *v = argv[++i];
        if (strcmp(a, "-e") == 0) g->init = v;
        else if (strcmp(a, "--prompt") == 0) g->prompt = v;
        else if (strcmp(a, "--tokenizer") == 0) g->tokenizer = v;
        else if (strcmp(a, "--precision") == 0) g->precision = v;
        else if (strcmp(a, "-g") == 0) g->gen_tokens = (int)parse_integer(a, v, 0, INT_MAX);
        else if (strcmp(a, "--top-k") == 0) g->top_k = (int)parse_integer(a, v, 0, INT_MAX);
        else if (strcmp(a, "--seed") == 0) g->seed = (unsigned long long)parse_integer(a, v, 0, LLONG_MAX);
        else if (strcmp(a, "--threads") == 0) g->threads = (int)parse_integer(a, v, 0, 4096);
        else if (strcmp(a, "--adapter") == 0) g->adapter = v;
        else if (strcmp(a, "--quantize-base") == 0) g->quantize_base = v;
        else if (strcmp(a, "--double-quant") == 0) g->double_quant = (int)parse_integer(a, v, 0, 1);
        else if (strcmp(a, "--temperature") == 0) {
            g->temperature = parse_number(a, v);
            if (g->temperature < 0.0f) llmc_die("flag --temperature must be >= 0, got '%s'", v);
        } else if (strcmp(a, "--top-p") == 0) {
            g->top_p = parse_number(a, v);
            if (!(g->top_p > 0.0f && g->top_p <= 1.0f)) llmc_die("flag --top-p must be in (0, 1], got '%s'", v);
        } else llmc_die("unknown flag '%s' (see %s --help)", a, be->program);
    }
    if (!g->init) llmc_die("flag -e is required: the model to generate with (a model_*.bin checkpoint or dN)");
    if (g->quantize_base && strcmp(g->quantize_base, "nf4") && strcmp(g->quantize_base, "int8"))
        llmc_die("flag --quantize-base: unknown mode '%s' (nf4, int8)", g->quantize_base);
    if (g->double_quant && !(g->quantize_base && strcmp(g->quantize_base, "nf4") == 0))
        llmc_die("flag --double-quant 1 is for --quantize-base nf4 only");
}

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = (char *)mallocCheck(cap, "prompt");
    for (;;) {
        n += fread(buf + n, 1, cap - n, f);
        if (ferror(f)) llmc_die("cannot read the prompt from stdin: %s", strerror(errno));
        if (feof(f)) break;
        cap *= 2;
        buf = (char *)realloc(buf, cap);
        if (!buf) llmc_die("out of memory reading the prompt from stdin");
    }
    *len = n;
    return buf;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The tokenizer to use: --tokenizer, else Llama 3's in -e's directory, else the GPT-2 directory
 * (encodes), else llm.c's file. */
static Tokenizer *open_tokenizer(const GenConfig *g, int need_encode, char *path, size_t len) {
    char err[1024];
    if (g->tokenizer) {
        if (!(is_dir(g->tokenizer) && tokenizer_find_llama3(g->tokenizer, path, len) == 0))
            snprintf(path, len, "%s", g->tokenizer);
    } else if (!(is_dir(g->init) && tokenizer_find_llama3(g->init, path, len) == 0) && tokenizer_find_default(path, len) != 0) {
        if (access("data/gpt2_tokenizer.bin", R_OK) != 0)
            llmc_die("no tokenizer found: give --tokenizer PATH (GPT-2: a directory with encoder.json + vocab.bpe, or run "
                     "'make data'; a Llama 3: its tokenizer.model or the HF directory holding it)");
        snprintf(path, len, "data/gpt2_tokenizer.bin");
    }
    Tokenizer *tok = tokenizer_load(path, err, sizeof err);
    if (!tok) llmc_die(g->tokenizer ? "--tokenizer: %s" : "the tokenizer found for -e: %s", err);
    if (need_encode && !tokenizer_can_encode(tok))
        llmc_die("--tokenizer %s can only decode (llm.c's file has no merges); encoding the prompt needs a "
                 "directory with encoder.json + vocab.bpe", path);
    return tok;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void write_token(const Tokenizer *tok, int id) {
    size_t len;
    const unsigned char *bytes = tokenizer_token_bytes(tok, (uint32_t)id, &len);
    if (!bytes) llmc_die("token id %d has no text in the tokenizer", id);
    fwrite(bytes, 1, len, stdout);
    fflush(stdout);
}

int generate_main(int argc, char **argv, const GenerateBackend *be) {
    GenConfig g;
    parse_args(&g, argc, argv, be);
#ifdef _OPENMP
    if (g.threads > 0) omp_set_num_threads(g.threads);
#endif

    size_t prompt_len;
    char *prompt;
    if (g.prompt) {
        prompt_len = strlen(g.prompt);
        prompt = (char *)mallocCheck(prompt_len + 1, "prompt");
        memcpy(prompt, g.prompt, prompt_len + 1);
    } else {
        if (isatty(STDIN_FILENO)) fprintf(stderr, "reading the prompt from stdin (end it with Ctrl-D)\n");
        prompt = read_all(stdin, &prompt_len);
    }

    /* stdout carries only the text: what the loaders print (notes on the checkpoint) goes to stderr */
    fflush(stdout);
    int saved_stdout = dup(STDOUT_FILENO);
    if (saved_stdout < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) llmc_die("cannot redirect stdout: %s", strerror(errno));
    ModelConfig model_cfg;
    size_t num_parameters;
    char desc[512];
    be->load(be->self, &g, &model_cfg, &num_parameters, desc, sizeof desc);
    fflush(stdout);
    if (dup2(saved_stdout, STDOUT_FILENO) < 0) llmc_die("cannot restore stdout: %s", strerror(errno));
    close(saved_stdout);
    const ModelConfig *cfg = &model_cfg;
    char tok_path[1100];
    Tokenizer *tok = open_tokenizer(&g, prompt_len > 0, tok_path, sizeof tok_path);
    if (tokenizer_vocab_size(tok) != (size_t)cfg->vocab_size)
        llmc_die("-e %s has a vocabulary of %d tokens, the tokenizer '%s' %zu: they must match (give the model's own "
                 "tokenizer with --tokenizer; a Llama 3: its tokenizer.model or the HF directory holding it)",
                 g.init, cfg->vocab_size, tok_path, tokenizer_vocab_size(tok));
    /* Llama 3's tokenizer: the prompt starts with <|begin_of_text|>, generation ends at
     * <|end_of_text|> or <|eot_id|>; GPT-2's: both are end-of-text */
    const uint32_t bos = tokenizer_special_id(tok, "<|begin_of_text|>");
    const int llama3 = bos != UINT32_MAX;
    const uint32_t stops[2] = {llama3 ? tokenizer_special_id(tok, "<|end_of_text|>") : tokenizer_eot(tok),
                               llama3 ? tokenizer_special_id(tok, "<|eot_id|>") : tokenizer_eot(tok)};

    /* the prompt's tokens; an empty prompt starts from end-of-text, as training samples do */
    TokenBuf ids = {0};
    if (llama3 || prompt_len == 0) token_buf_push(&ids, llama3 ? bos : tokenizer_eot(tok));
    if (prompt_len > 0) {
        char err[512];
        TokenizerContext *ctx = tokenizer_context_new(tok, err, sizeof err);
        if (!ctx) llmc_die("the tokenizer: %s", err);
        int bad = llama3 ? tokenizer_encode_special(ctx, prompt, prompt_len, &ids, err, sizeof err)
                         : tokenizer_encode(ctx, prompt, prompt_len, &ids, err, sizeof err);
        if (bad) llmc_die("--prompt: %s", err);
        tokenizer_context_free(ctx);
    }
    if (ids.n >= (size_t)cfg->max_seq_len)
        llmc_die("--prompt is %zu tokens; the model's context is %d (maxT), so at most %d fit with room to generate",
                 ids.n, cfg->max_seq_len, cfg->max_seq_len - 1);
    fprintf(stderr, "model: %s: L %d, NH %d, C %d, maxT %d, V %d: %zu parameters\n", g.init, cfg->num_layers,
            cfg->num_heads, cfg->channels, cfg->max_seq_len, cfg->vocab_size, num_parameters);
    fprintf(stderr, "tokenizer: %s\n%s\n", tok_path, desc);
    fprintf(stderr, "prompt: %zu tokens; generating up to %d (temperature %g, top-k %d, top-p %g, seed %llu)\n",
            prompt_len > 0 || llama3 ? ids.n : 0, g.gen_tokens, (double)g.temperature, g.top_k, (double)g.top_p, g.seed);

    fwrite(prompt, 1, prompt_len, stdout);
    fflush(stdout);
    int *seq = (int *)mallocCheck((size_t)cfg->max_seq_len * sizeof(int), "token sequence");
    int n = (int)ids.n;
    for (int i = 0; i < n; i++) seq[i] = (int)ids.ids[i];
    Rng rng;
    rng_seed(&rng, g.seed);

    double t0 = now_s(), t_first = 0.0;
    const float *logits = NULL;
    for (int done = 0; done < n; done += GENERATE_CHUNK)
        logits = be->forward(be->self, seq + done, n - done < GENERATE_CHUNK ? n - done : GENERATE_CHUNK);
    int generated = 0;
    const char *stop = "-g tokens";
    for (;;) {
        if (generated == g.gen_tokens) break;
        if (n == cfg->max_seq_len) {
            stop = "the model's context (maxT)";
            break;
        }
        int next = sample_filtered(logits, cfg->vocab_size, g.temperature, g.top_k, g.top_p, rng_f32(&rng));
        if (generated == 0) t_first = now_s();
        generated++;
        if (next == (int)stops[0] || next == (int)stops[1]) {
            stop = llama3 && next == (int)stops[1] ? "<|eot_id|>" : "end-of-text";
            break;
        }
        write_token(tok, next);
        seq[n++] = next;
        if (n < cfg->max_seq_len) logits = be->forward(be->self, &next, 1);
    }
    double t1 = now_s();
    fprintf(stderr, "\ngenerated %d tokens (stopped at %s): prompt %.3f s, then %.1f tokens/s\n", generated, stop,
            (t_first ? t_first : t1) - t0, generated > 1 ? (generated - 1) / (t1 - t_first) : 0.0);

    free(seq);
    token_buf_free(&ids);
    tokenizer_free(tok);
    be->free(be->self);
    free(prompt);
    return 0;
}
