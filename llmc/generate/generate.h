/*
 * generate.h - the one front end of ./generate (CPU, generate.c) and ./generate_gpu (CUDA,
 * generate.cu): flags, prompt, tokenizer, sampling and output live here; a GenerateBackend
 * holds the model and runs the KV-cache forward (llmc/cpu/decode.h, llmc/cuda/decode.cuh), as
 * the trainers share llmc/train/train.c behind a TrainBackend.
 */
#ifndef LLMC_GENERATE_H
#define LLMC_GENERATE_H

#include <stddef.h>
#include <stdio.h>

#include "llmc/models/gpt2.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *init;      /* -e */
    const char *prompt;    /* --prompt; NULL = read stdin */
    const char *tokenizer; /* --tokenizer; NULL = look in the usual places */
    const char *precision; /* --precision; NULL = the backend's default */
    int gen_tokens;        /* -g */
    float temperature;     /* --temperature; 0 = greedy */
    int top_k;             /* --top-k; 0 = off */
    float top_p;           /* --top-p; 1 = off */
    unsigned long long seed;
    int threads;           /* --threads; 0 = all cores */
    const char *adapter;   /* --adapter: a PEFT LoRA adapter directory applied unmerged; NULL = none */
    const char *quantize_base; /* --quantize-base nf4|int8: the block linear weights quantised after loading; NULL = fp32 */
    int double_quant;      /* --double-quant 1: NF4's absmax values quantised too */
} GenConfig;

/* Prompt tokens per forward call: a backend's forward takes 1..GENERATE_CHUNK tokens. */
enum { GENERATE_CHUNK = 64 };

typedef struct {
    const char *program;       /* "./generate", for messages */
    const char *precisions;    /* the --precision values accepted, for --help */
    void *self;
    /* Builds the model of g->init (a checkpoint or dN, initialised with g->seed) in g->precision;
     * fills cfg and *num_parameters and a one-line description (device, precision). Dies with
     * an error naming the flag on bad input. Called with stdout redirected to stderr. */
    void (*load)(void *self, const GenConfig *g, ModelConfig *cfg, size_t *num_parameters, char *desc, size_t len);
    /* Runs tokens[0..n) at the next n positions, caching their keys and values; returns the last
     * token's logits (at least V floats, host memory, valid until the next call). */
    const float *(*forward)(void *self, const int *tokens, int n);
    void (*free)(void *self);
} GenerateBackend;

/* The whole program: parse argv, load, encode the prompt, generate, print. Returns the exit status. */
int generate_main(int argc, char **argv, const GenerateBackend *be);

#ifdef __cplusplus
}
#endif
#endif
