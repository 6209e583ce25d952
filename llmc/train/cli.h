/*
 * cli.h - the training configuration and the one flag table that drives parsing, --help
 * (with live defaults) and the startup print of the resolved configuration.
 * Flags are llm.c's short flags (with llm.c's meanings) plus long aliases; values follow as
 * the next argument ("-b 4", "--batch-size 4") or after '=' for long flags ("--batch-size=4").
 * Numbers are parsed strictly; an unknown flag, a missing or malformed value is an error.
 */
#ifndef LLMC_CLI_H
#define LLMC_CLI_H

#include <stddef.h>
#include <stdio.h>

#include "llmc/dist/dist.h"
#include "llmc/core/logger.h"

#ifdef __cplusplus
extern "C" {
#endif

/* llm.c's place for HellaSwag's validation file (dev/data/hellaswag.py writes it there) */
#define TRAIN_DEFAULT_HELLASWAG_FILE "dev/data/hellaswag/hellaswag_val.bin"

typedef struct {
    /* data and model */
    char train_pattern[1024];   /* -i */
    char val_pattern[1024];     /* -j */
    char init[1024];            /* -e: checkpoint path or dN */
    char output_dir[1024];      /* -o */
    char tokenizer[1024];       /* --tokenizer */
    int B, T;                   /* -b -t */
    long long total_batch;      /* -d, tokens; 0 = B*T*processes */
    char batch_ramp[64];        /* --batch-ramp TOKENS[:START] ('' = none): schedule.h */
    int max_steps;              /* -x; -1 = one epoch */
    int shuffle;                /* --shuffle */
    int overfit_batch;          /* -a */
    /* optimisation */
    char schedule[32];          /* -k */
    float lr;                   /* -l */
    int warmup;                 /* -u */
    float final_frac;           /* -q */
    float weight_decay;         /* -c */
    float beta1, beta2, eps;    /* --beta1 --beta2 --eps */
    float grad_clip;            /* --grad-clip; 0 disables */
    float skip_loss_z, skip_norm_z; /* -sl -sg */
    int max_skips;              /* --max-skips: stop after this many consecutive skipped steps; 0 = never */
    int recompute;              /* -r */
    unsigned long long seed;    /* --seed */
    /* evaluation, sampling, checkpoints */
    int val_every, val_max_steps;      /* -v -m */
    int sample_every, gen_tokens;      /* -s -g */
    int ckpt_every, ckpt_keep, ckpt_major; /* -n -nk -nm */
    int ckpt_bf16;                     /* --checkpoint-bf16 */
    int save_hf;                       /* --save-hf: also write each checkpoint as an HF directory */
    int resume;                        /* -y */
    int overwrite;                     /* --overwrite: delete an old run's files in -o first */
    int allow_config_change;           /* --allow-config-change: resume with changed math */
    int hellaswag;                     /* -h: multiple-choice evaluation with validation (llmc/train/eval.h) */
    char hellaswag_file[1024];         /* --hellaswag-file: its eval file (llm.c's format) */
    /* precision and GPU */
    char precision[16];         /* --precision */
    int tf32, master_weights, gelu_fusion; /* -f -w -ge */
    int matmul_algos;           /* --matmul-algos: cuBLASLt candidates timed per shape */
    int cuda_graph;             /* --cuda-graph: 1 = a training micro-step replayed from a CUDA graph */
    char matmul_cache[1024];    /* --matmul-cache; '' = <-o>/matmul_algos.txt with -o */
    char memory_snapshot[1024]; /* --memory-snapshot FILE: the device allocator's snapshot at the end of the run ('' = none) */
    int zero_stage;             /* -z */
    int gpu_log_every;          /* -lg; 0 or -1 = off */
    float peak_tflops;          /* --peak-tflops */
    int threads;                /* --threads, CPU; 0 = all cores */
    int plan, json;             /* --plan [--json]: print the memory plan and exit */
    char memory_budget[32];     /* --memory-budget SIZE ('' = none): llmc/train/budget.h */
    int max_batch;              /* --plan --memory-budget SIZE --max-batch: the largest B that fits */
    char optim_state[8];        /* --optim-state: fp32 | bf16 | int8 (llmc/core/optstate.h) */
    char offload[16];           /* --offload: none | optimizer */
    /* processes */
    int num_processes, process_rank, gpus_per_node; /* -pn -pr -pg */
    char nccl_init[16], server_ip[256], fs_path[1024]; /* -pi -ps -pf */
    float dist_timeout;         /* --dist-timeout: the collective watchdog's deadline, seconds */
    /* fine-tuning with LoRA adapters (llmc/models/lora.h; the CPU trainer) */
    int lora_rank;              /* --lora-rank R; 0 = no adapters: every parameter trains */
    float lora_alpha;           /* --lora-alpha */
    char lora_targets[256];     /* --lora-targets: PEFT's module names; '' = PEFT's default */
    int use_rslora;             /* --use-rslora: scale alpha/sqrt(R) instead of alpha/R */
    int use_dora;               /* --use-dora: DoRA, a trained magnitude per output row (llmc/models/lora.h) */
    char adapter[1024];         /* --adapter DIR: start from a PEFT adapter directory ('' = new adapters) */
    int prompt_tokens;          /* --prompt-tokens P: prompt tuning, P soft tokens at the input (llmc/models/lora.h); 0 = off */
    char quantize_base[16];     /* --quantize-base: '' (fp32) | nf4 | int8: the frozen base quantised (QLoRA) */
    int double_quant;           /* --double-quant: 1 = NF4's absmax values quantised too */
    /* the optimizer (llmc/train/adafactor.h) */
    char optimizer[16];         /* --optimizer: adamw | adafactor */
    float adafactor_beta1;      /* --adafactor-beta1: 0 = no first moment */
    float adafactor_clip;       /* --adafactor-clip: the update's RMS clip threshold */
    float adafactor_decay_rate; /* --adafactor-decay-rate: beta2 at step t = 1 - t^rate */
    int adafactor_relative_step; /* --adafactor-relative-step: 1 = HF's relative step and parameter scale */
    /* knowledge distillation (the CPU trainer): loss = (1-a) CE + a t^2 KL(teacher_t || student_t) */
    char teacher[1024];         /* --teacher MODEL ('' = none): anything -e takes, forward only */
    float distill_alpha;        /* --distill-alpha a in [0, 1] */
    float distill_temperature;  /* --distill-temperature t > 0 */
    char teacher_quantize[16];  /* --teacher-quantize: '' (fp32) only, for now */
    unsigned teacher_crc;       /* not a flag: the CRC-32 of the teacher's fp32 parameters as loaded (set by the
                                 * trainer; saved with each checkpoint as "--teacher-crc32", compared on resume) */
    int has_teacher_crc;
    /* gradient compression (llmc/train/gradcomp.h) */
    char grad_compression[32];  /* --grad-compression: none | bf16 | int8 | topk:FRAC | powersgd:RANK */
    /* MoE expert parallelism (issue 24; llmc/cpu/moe_ep.h; a run resumes on any -ep) */
    int expert_parallel;        /* -ep / --expert-parallel N: the experts over N ranks; 1: none */
    /* NVMe offload (llmc/train/nvme.h) */
    char offload_device[8];     /* --offload-device: cpu | nvme (the AdamW moments in files under --nvme-path) */
    char nvme_path[1024];       /* --nvme-path DIR */
    /* model parallelism (issue 25; llmc/dist/layout.h): processes = tp x pp x data-parallel ranks */
    int tensor_parallel;        /* -tp: ranks per tensor-parallel group (1 = none) */
    int pipeline_parallel;      /* -pp: pipeline stages (1 = none; more: not built yet) */
    int sequence_parallel;      /* -sp: 1 = sequence parallelism in the tp group (not built yet) */
    char pipeline_schedule[16]; /* --pipeline-schedule: gpipe | 1f1b | interleaved */
    int pipeline_virtual;       /* --pipeline-virtual: stages per rank (interleaved) */
} TrainConfig;

void train_config_defaults(TrainConfig *cfg);
/* Parses argv into cfg (after defaults). Prints help and exits 0 on --help; dies with a
 * message naming the flag on any error. Checks what can be checked without the model. */
void train_config_parse(TrainConfig *cfg, int argc, char **argv, const char *program);
/* The startup print: the flags that differ from the defaults first, then the others on a few
 * lines; gpu 0 leaves out the GPU-only flags, one process leaves out the multi-process ones. */
/* The process-group flags (-pn -pr -pi -ps -pf --dist-timeout) for dist_init. */
DistFlags train_config_dist_flags(const TrainConfig *cfg);
void train_config_print(const TrainConfig *cfg, int gpu, FILE *out);
void train_config_help(const TrainConfig *defaults, const char *program, FILE *out);

/* The configuration as text, one "--long-name value" line per flag in table order, floats with
 * the fewest digits that read back exactly (saved with each checkpoint). Returns the length
 * (truncated to len-1 like snprintf). */
size_t train_config_to_text(const TrainConfig *cfg, char *buf, size_t len);
/* Applies such text on top of cfg; lines naming flags this build does not know are ignored. */
void train_config_from_text(TrainConfig *cfg, const char *text);
/* Resume: prints every flag whose value differs between the configuration the checkpoint was
 * written with and this run's (where names the checkpoint). Differences that change the math
 * of the steps already scheduled (schedule, optimizer, model, batch, data, precision) are an
 * error naming each flag with both values, unless now->allow_config_change. */
void train_config_compare(const TrainConfig *saved, const TrainConfig *now, const char *where, FILE *out);

/* The log's config record: every flag as a field of a "config" object (keys are the long names
 * without dashes, '-' as '_'), values typed as in the table. */
void train_config_log(const TrainConfig *cfg, Logger *lg);

/* SIZE of --memory-budget: bytes, or a number with K, M, G or T (powers of 1024, an optional
 * trailing B or iB: 16G, 1500M, 1.5GiB). Returns 0 for ''; dies naming the flag otherwise. */
size_t cli_memory_budget_bytes(const char *s);

#ifdef __cplusplus
}
#endif
#endif
