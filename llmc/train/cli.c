#include "llmc/train/cli.h"
#include "llmc/core/optstate.h"
#include "llmc/core/check.h"
#include "llmc/dist/dist.h"
#include "llmc/formats/hf.h"
#include "llmc/train/gradcomp.h"
#include "llmc/train/nvme.h"
#include "llmc/train/schedule.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { MAX_GEN_TOKENS = 1 << 20 };

#include "llmc/core/logger.h"

/* F_SWITCH: an int that a bare flag sets to 1 ("--plan"); "--plan=0" gives the value. */
typedef enum { F_INT, F_LLONG, F_ULLONG, F_FLOAT, F_STRING, F_SWITCH } FlagType;

typedef struct {
    const char *short_name, *long_name;
    FlagType type;
    size_t offset, size;  /* member of TrainConfig */
    const char *help;
} Flag;

#define FIELD(m) offsetof(TrainConfig, m), sizeof(((TrainConfig *)0)->m)
static const Flag flags[] = {
    {"-i", "--train-data", F_STRING, FIELD(train_pattern), "training shards (glob pattern)"},
    {"-j", "--val-data", F_STRING, FIELD(val_pattern), "validation shards (glob pattern)"},
    {"-e", "--init", F_STRING, FIELD(init), "model: llm.c checkpoint path, Hugging Face GPT-2 or Llama directory (config.json + safetensors), llmc's or llm.c's Llama 3 file, dN / gpt2:dN for a random GPT-2 of depth N, or llama3:dN / llama3.2-1b / llama3.2-3b / llama3.1-8b for a random Llama 3 (CPU trainer)"},
    {"-o", "--output-dir", F_STRING, FIELD(output_dir), "output directory for log.jsonl and checkpoints ('' = none)"},
    {"-b", "--batch-size", F_INT, FIELD(B), "micro-batch size B per process"},
    {"-t", "--seq-len", F_INT, FIELD(T), "sequence length T (<= the model's maxT)"},
    {"-d", "--total-batch", F_LLONG, FIELD(total_batch), "tokens per optimizer step; 0 = B*T*processes; gradient accumulation = d/(B*T*processes)"},
    {NULL, "--batch-ramp", F_STRING, FIELD(batch_ramp), "TOKENS[:START]: grow the tokens per step linearly from START (default B*T*processes) to -d over the first TOKENS training tokens, in multiples of START (the accumulation count changes, the LR schedule does not); '' = none"},
    {"-x", "--max-steps", F_INT, FIELD(max_steps), "optimizer steps; -1 = one epoch of the training data; 0 = evaluate only (validation loss of the model, no training)"},
    {"-k", "--lr-schedule", F_STRING, FIELD(schedule), "cosine | linear | constant | wsd"},
    {"-l", "--lr", F_FLOAT, FIELD(lr), "peak learning rate"},
    {"-u", "--warmup", F_INT, FIELD(warmup), "linear warmup steps"},
    {"-q", "--final-lr-frac", F_FLOAT, FIELD(final_frac), "final learning rate as a fraction of the peak"},
    {"-c", "--weight-decay", F_FLOAT, FIELD(weight_decay), "AdamW weight decay (2-D weights and embeddings only)"},
    {NULL, "--beta1", F_FLOAT, FIELD(beta1), "AdamW beta1"},
    {NULL, "--beta2", F_FLOAT, FIELD(beta2), "AdamW beta2"},
    {NULL, "--eps", F_FLOAT, FIELD(eps), "AdamW epsilon"},
    {NULL, "--grad-clip", F_FLOAT, FIELD(grad_clip), "clip gradients to this global norm; 0 disables"},
    {"-sl", "--skip-loss-z", F_FLOAT, FIELD(skip_loss_z), "skip the update when the loss z-score exceeds this; 0 = off"},
    {"-sg", "--skip-norm-z", F_FLOAT, FIELD(skip_norm_z), "skip the update when the grad-norm z-score exceeds this; 0 = off"},
    {NULL, "--max-skips", F_INT, FIELD(max_skips), "stop the run (exit 1) after this many consecutive skipped steps; 0 = never"},
    {"-r", "--recompute", F_INT, FIELD(recompute), "activation recompute: 0 none, 1 GELU, 2 GELU+LayerNorm (3 whole block, GPU)"},
    {"-a", "--overfit-batch", F_INT, FIELD(overfit_batch), "1 = train on the first batch only"},
    {NULL, "--shuffle", F_INT, FIELD(shuffle), "1 = permute training samples and shards every epoch"},
    {NULL, "--seed", F_ULLONG, FIELD(seed), "seed for initialisation, shuffling and sampling"},
    {"-v", "--val-every", F_INT, FIELD(val_every), "validate every N steps (and at the end); 0 disables"},
    {"-m", "--val-max-steps", F_INT, FIELD(val_max_steps), "validation batches per evaluation; -1 = all"},
    {"-s", "--sample-every", F_INT, FIELD(sample_every), "print a sample every N steps (and at the end); 0 disables"},
    {"-g", "--gen-tokens", F_INT, FIELD(gen_tokens), "tokens to generate per sample"},
    {"-n", "--checkpoint-every", F_INT, FIELD(ckpt_every), "write a checkpoint every N steps (and at the end); 0 disables"},
    {"-nk", "--checkpoint-keep", F_INT, FIELD(ckpt_keep), "keep only the N newest checkpoints; 0 = keep all"},
    {"-nm", "--checkpoint-major", F_INT, FIELD(ckpt_major), "checkpoints at multiples of N are never deleted; 0 = none"},
    {NULL, "--checkpoint-bf16", F_INT, FIELD(ckpt_bf16), "1 = write model checkpoints as bf16 (llm.c version 5)"},
    {NULL, "--save-hf", F_INT, FIELD(save_hf), "1 = also write each checkpoint as a Hugging Face directory model_NNNNNNNN_hf (config.json + model.safetensors, BF16 with --checkpoint-bf16 1)"},
    {"-y", "--resume", F_INT, FIELD(resume), "1 = resume from the latest complete checkpoint in -o (a new run when -o holds none)"},
    {NULL, "--overwrite", F_INT, FIELD(overwrite), "1 = delete the run in -o (log.jsonl, model_/state_/DONE_ files) and start a new one"},
    {NULL, "--allow-config-change", F_INT, FIELD(allow_config_change), "1 = resume even when flags that change the training math differ from the checkpoint's"},
    {"-h", "--hellaswag", F_INT, FIELD(hellaswag), "1 = multiple-choice evaluation (HellaSwag, llm.c's acc_norm) of --hellaswag-file every -v steps and at the last step; with -x 0 of the model alone"},
    {NULL, "--hellaswag-file", F_STRING, FIELD(hellaswag_file), "-h 1's eval file (llm.c's write_evalfile format); at the default path an absent file is a note and -h 1 is skipped, any other path must exist"},
    {NULL, "--tokenizer", F_STRING, FIELD(tokenizer), "tokenizer for samples: llm.c .bin, a dir with encoder.json+vocab.bpe, or Llama 3's tokenizer.model (or a dir holding it); '' = search (-e's HF dir, then GPT-2's)"},
    {NULL, "--precision", F_STRING, FIELD(precision), "fp32 | bf16 | fp16 (the CPU trainer computes in fp32)"},
    {"-f", "--tf32", F_INT, FIELD(tf32), "GPU: allow TF32 matmuls in fp32 mode"},
    {"-w", "--master-weights", F_INT, FIELD(master_weights), "GPU: keep fp32 master weights"},
    {"-ge", "--gelu-fusion", F_INT, FIELD(gelu_fusion), "GPU: GELU in the matmul epilogue: -1 auto (2 where the MLP width is a multiple of 8, else 0), 0 off, 1 forward, 2 forward+backward"},
    {NULL, "--matmul-algos", F_INT, FIELD(matmul_algos), "GPU: time this many of cuBLASLt's candidate algorithms per matmul shape and keep the fastest; 1 = the heuristic's first"},
    {NULL, "--memory-snapshot", F_STRING, FIELD(memory_snapshot), "GPU: at the end of the run write FILE (rank r > 0: FILE.rank<r>), JSON: every live device allocation (memory class, size, segment and offset, the step and phase it was made in), the allocator's totals and its history (scripts/memory_snapshot.py prints the timeline); '' = none"},
    {NULL, "--cuda-graph", F_INT, FIELD(cuda_graph), "GPU: 1 = capture a training micro-step's forward+backward in a CUDA graph once and replay it (one process, no --offload; untested on a GPU so far); 0 = launch kernel by kernel"},
    {NULL, "--matmul-cache", F_STRING, FIELD(matmul_cache), "GPU: file of the chosen matmul algorithms (read at start, written when a shape is tuned); '' = <-o>/matmul_algos.txt"},
    {"-z", "--zero-stage", F_INT, FIELD(zero_stage), "ZeRO stage: 0, 1 AdamW moments sharded over the ranks, 2 also the gradients, 3 also the parameters (CPU trainer; ./train_gpt: 0, 1)"},
    {"-lg", "--gpu-log-every", F_INT, FIELD(gpu_log_every), "GPU: telemetry line (memory, clocks, temperature, power, throttling) every N steps; 0 or -1 = off"},
    {NULL, "--peak-tflops", F_FLOAT, FIELD(peak_tflops), "GPU: peak TFLOP/s for MFU; 0 = from the device table"},
    {NULL, "--optim-state", F_STRING, FIELD(optim_state), "AdamW moments stored as fp32 | bf16 (round to nearest) | int8 (blocks of 256 with an fp32 scale, quadratic codes); the update is computed in fp32"},
    {NULL, "--offload", F_STRING, FIELD(offload), "none | optimizer: AdamW moments and fp32 master weights in host memory, updated on the CPU (GPU trainer: gradients copied to the host, parameters back; the CPU trainer's optimizer is this host path already)"},
    {NULL, "--plan", F_SWITCH, FIELD(plan), "print the memory plan (every allocation class, the peak) for this configuration (rank -pr of -pn) and exit; allocates no model"},
    {NULL, "--json", F_SWITCH, FIELD(json), "with --plan: print it as one JSON object (peak_bytes, classes)"},
    {NULL, "--memory-budget", F_STRING, FIELD(memory_budget), "memory budget (16G, 1500M, 16GB = 16e9, bytes; CPU: the process, GPU: the device): when the plan exceeds it, train with the cheapest -r/-b/-z that fits (same -d); '' = none"},
    {NULL, "--max-batch", F_SWITCH, FIELD(max_batch), "with --plan --memory-budget: print the largest -b that fits and exit"},
    {NULL, "--threads", F_INT, FIELD(threads), "CPU threads; 0 = all cores"},
    {"-pn", "--num-processes", F_INT, FIELD(num_processes), "processes (mpirun/srun give it; must match them when given; -pi tcp|fs: every process gets it)"},
    {"-pr", "--process-rank", F_INT, FIELD(process_rank), "this process's rank (mpirun/srun give it; -pi tcp|fs: 0 .. -pn - 1, one each)"},
    {"-pg", "--gpus-per-node", F_INT, FIELD(gpus_per_node), "GPUs per node"},
    {"-pi", "--nccl-init", F_STRING, FIELD(nccl_init), "process group (and NCCL id): mpi (mpirun/srun) | tcp (-ps) | fs (-pf); tcp and fs need no MPI"},
    {"-ps", "--server-ip", F_STRING, FIELD(server_ip), "tcp: HOST[:PORT] where rank 0 listens (port 12345 when not given)"},
    {"-pf", "--fs-path", F_STRING, FIELD(fs_path), "fs: a directory every rank sees; rank 0 publishes its address there"},
    {NULL, "--dist-timeout", F_FLOAT, FIELD(dist_timeout), "seconds a rank waits in one collective before it stops naming the ranks that did not arrive (hung or dead); rank 0's own work (checkpoints, samples) does not count"},
    /* LoRA fine-tuning (llmc/models/lora.h) */
    {NULL, "--lora-rank", F_INT, FIELD(lora_rank), "LoRA: train rank-R adapters on a frozen base (CPU trainer); 0 = off, every parameter trains"},
    {NULL, "--lora-alpha", F_FLOAT, FIELD(lora_alpha), "LoRA: alpha; the adapter's output is scaled by alpha/R"},
    {NULL, "--lora-targets", F_STRING, FIELD(lora_targets), "LoRA: comma-separated PEFT module names, suffix-matched (GPT-2: c_attn, c_proj, attn.c_proj, mlp.c_proj, c_fc; Llama: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj) or all-linear; '' = PEFT's default (c_attn; q_proj,v_proj)"},
    {NULL, "--use-rslora", F_INT, FIELD(use_rslora), "LoRA: 1 = rank-stabilised scale alpha/sqrt(R)"},
    {NULL, "--use-dora", F_INT, FIELD(use_dora), "LoRA: 1 = DoRA, a trained magnitude per output row times the normalised W + sBA"},
    {NULL, "--adapter", F_STRING, FIELD(adapter), "LoRA: start from this PEFT adapter directory (adapter_config.json + adapter_model.safetensors); '' = new adapters"},
    {NULL, "--prompt-tokens", F_INT, FIELD(prompt_tokens), "prompt tuning: train P soft token embeddings prepended to every sequence at the input, on a frozen base (CPU trainer; PEFT's PROMPT_TUNING); 0 = off"},
    /* QLoRA: the frozen base quantised (llmc/core/quant.h, llmc/cpu/qbase.h; the CPU trainer) */
    {NULL, "--quantize-base", F_STRING, FIELD(quantize_base), "QLoRA: store the frozen base's block linear weights quantised: nf4 (bitsandbytes' NF4, blocks of 64) | int8 (per output row); embeddings, norms, biases and the head stay fp32; '' = fp32 (with LoRA adapters only)"},
    {NULL, "--double-quant", F_INT, FIELD(double_quant), "QLoRA: 1 = quantise the NF4 absmax values too (8-bit, blocks of 256: bitsandbytes' double quantisation)"},
    /* ---- the optimizer (llmc/train/adafactor.h) ---- */
    {NULL, "--optimizer", F_STRING, FIELD(optimizer), "adamw | adafactor: factored second moments (row and column statistics) for 2-D weights, a fraction of AdamW's state; the -l schedule, -c and --grad-clip apply (./train_gpt: with --offload optimizer)"},
    {NULL, "--adafactor-beta1", F_FLOAT, FIELD(adafactor_beta1), "Adafactor: first-moment decay in [0, 1); 0 = no first moment (HF's beta1=None)"},
    {NULL, "--adafactor-clip", F_FLOAT, FIELD(adafactor_clip), "Adafactor: clip each tensor's update to this RMS (clip_threshold)"},
    {NULL, "--adafactor-decay-rate", F_FLOAT, FIELD(adafactor_decay_rate), "Adafactor: the second moments' decay at step t is 1 - t^rate (rate < 0)"},
    {NULL, "--adafactor-relative-step", F_INT, FIELD(adafactor_relative_step), "Adafactor: 1 = HF's relative step size min(1e-2, 1/sqrt(t)) times max(1e-3, RMS of the tensor) instead of -l and its schedule; 0 = off"},
    /* ---- knowledge distillation (the CPU trainer) ---- */
    {NULL, "--teacher", F_STRING, FIELD(teacher), "distillation: the teacher model (anything -e takes; the same vocabulary as the student), run forward only beside it; the loss is (1-a) CE + a t^2 KL(teacher_t || student_t) per token (CPU trainer); '' = none"},
    {NULL, "--distill-alpha", F_FLOAT, FIELD(distill_alpha), "distillation: a in [0, 1], the weight of the distillation term (0 = plain cross-entropy)"},
    {NULL, "--distill-temperature", F_FLOAT, FIELD(distill_temperature), "distillation: the softmax temperature t > 0 of both distributions"},
    {NULL, "--teacher-quantize", F_STRING, FIELD(teacher_quantize), "distillation: the teacher's storage; '' = fp32 (bf16 and nf4 are not built yet)"},
    /* ---- gradient compression (llmc/train/gradcomp.h) ---- */
    /* ---- model parallelism (issue 25; llmc/dist/layout.h) ---- */
    {"-tp", "--tensor-parallel", F_INT, FIELD(tensor_parallel), "tensor parallelism: ranks per group that split each block's matrices (Megatron: c_attn and c_fc by columns, the c_proj by rows); data-parallel ranks = processes / tp, tp fastest in rank order (./train_gpt_cpu, GPT-2, -z 0/1)"},
    {"-pp", "--pipeline-parallel", F_INT, FIELD(pipeline_parallel), "pipeline parallelism: stages the layers are split into (not built yet: 1)"},
    {"-sp", "--sequence-parallel", F_INT, FIELD(sequence_parallel), "1 = sequence parallelism in the tensor-parallel group (not built yet: 0)"},
    {NULL, "--pipeline-schedule", F_STRING, FIELD(pipeline_schedule), "gpipe | 1f1b | interleaved (with -pp; not built yet)"},
    {NULL, "--pipeline-virtual", F_INT, FIELD(pipeline_virtual), "pipeline stages per rank for --pipeline-schedule interleaved (with -pp; not built yet)"},
    {"-ep", "--expert-parallel", F_INT, FIELD(expert_parallel), "MoE expert parallelism: the experts of each layer split over groups of N ranks, tokens exchanged all-to-all (./train_gpt_cpu, Mixtral, -z 0..2); 1 = every rank holds every expert"},
    {NULL, "--grad-compression", F_STRING, FIELD(grad_compression), "the ranks' gradient sum sent compressed, with an error-feedback residual per rank: none | bf16 | int8 (chunks of 256, an fp32 scale each) | topk:FRAC (the largest FRAC of each bucket, as index + value) | powersgd:RANK (each matrix as rank-RANK factors, warm-started; vectors uncompressed); ./train_gpt_cpu, -z 0/1, several ranks"},
    /* ---- NVMe offload (llmc/train/nvme.h) ---- */
    {NULL, "--offload-device", F_STRING, FIELD(offload_device), "cpu | nvme: where the host AdamW keeps its moments (fp32 or --optim-state's form): nvme = one file per rank under --nvme-path, streamed through a small staging ring each step (io_uring); the same bits as cpu (./train_gpt: with --offload optimizer)"},
    {NULL, "--nvme-path", F_STRING, FIELD(nvme_path), "--offload-device nvme: an existing directory on a fast disk for the files (llmc-optstate-PID-RANK.bin, removed at exit)"},
};
#undef FIELD
enum { NUM_FLAGS = sizeof flags / sizeof flags[0] };

void train_config_defaults(TrainConfig *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->train_pattern, sizeof c->train_pattern, "data/tinyshakespeare/tiny_shakespeare_train.bin");
    snprintf(c->val_pattern, sizeof c->val_pattern, "data/tinyshakespeare/tiny_shakespeare_val.bin");
    snprintf(c->hellaswag_file, sizeof c->hellaswag_file, "%s", TRAIN_DEFAULT_HELLASWAG_FILE);
    snprintf(c->init, sizeof c->init, "d4");
    c->B = 4;
    c->T = 1024;
    c->total_batch = 0;
    c->max_steps = -1;
    c->shuffle = 1;
    snprintf(c->schedule, sizeof c->schedule, "cosine");
    c->lr = 3e-4f;
    c->final_frac = 1.0f;
    c->beta1 = 0.9f;
    c->beta2 = 0.95f;
    c->eps = 1e-8f;
    c->grad_clip = 1.0f;
    c->recompute = 1;
    c->max_skips = 50;
    c->seed = 1337;
    c->val_every = 20;
    c->val_max_steps = 20;
    c->sample_every = 20;
    c->gen_tokens = 64;
    snprintf(c->precision, sizeof c->precision, "bf16");
    snprintf(c->optim_state, sizeof c->optim_state, "fp32");
    snprintf(c->offload, sizeof c->offload, "none");
    c->tf32 = 1;
    c->matmul_algos = 8;
    c->master_weights = 1;
    c->gelu_fusion = -1;
    c->gpu_log_every = -1;
    c->num_processes = 1;
    c->gpus_per_node = 8;
    c->dist_timeout = 300.0f;
    /* the optimizer (llmc/train/adafactor.h) */
    snprintf(c->optimizer, sizeof c->optimizer, "adamw");
    c->adafactor_beta1 = 0.0f;
    c->adafactor_clip = 1.0f;
    c->adafactor_decay_rate = -0.8f;
    c->adafactor_relative_step = 0;
    snprintf(c->nccl_init, sizeof c->nccl_init, "mpi");
    c->lora_alpha = 8.0f; /* PEFT's default */
    c->distill_alpha = 0.5f;
    c->distill_temperature = 2.0f;
    snprintf(c->grad_compression, sizeof c->grad_compression, "none"); /* llmc/train/gradcomp.h */
    snprintf(c->offload_device, sizeof c->offload_device, "cpu"); /* llmc/train/nvme.h */
    c->tensor_parallel = 1, c->pipeline_parallel = 1, c->pipeline_virtual = 1; /* (issue 25) */
    c->expert_parallel = 1;                                                    /* (issue 24) */
    snprintf(c->pipeline_schedule, sizeof c->pipeline_schedule, "1f1b");
}

static void format_value(const Flag *f, const TrainConfig *c, char *buf, size_t len) {
    const char *p = (const char *)c + f->offset;
    switch (f->type) {
    case F_INT:
    case F_SWITCH: snprintf(buf, len, "%d", *(const int *)p); break;
    case F_LLONG: snprintf(buf, len, "%lld", *(const long long *)p); break;
    case F_ULLONG: snprintf(buf, len, "%llu", *(const unsigned long long *)p); break;
    case F_FLOAT: {
        char exact[32];
        format_float_roundtrip(exact, *(const float *)p);
        snprintf(buf, len, "%s", exact);
        break;
    }
    case F_STRING: snprintf(buf, len, "%s", p[0] ? p : "''"); break;
    }
}

/* Flag groups by long name (the table's rows stay one line each). */
static int in_list(const Flag *f, const char *const *list) {
    for (; *list; list++)
        if (strcmp(f->long_name, *list) == 0) return 1;
    return 0;
}
/* Changing one of these on resume changes the math of the steps already scheduled. */
static const char *const math_flags[] = {
    "--train-data", "--init", "--seq-len", "--total-batch", "--batch-ramp", "--max-steps", "--overfit-batch",
    "--shuffle", "--seed", "--lr-schedule", "--lr", "--warmup", "--final-lr-frac", "--weight-decay", "--beta1",
    "--beta2", "--eps", "--grad-clip", "--skip-loss-z", "--skip-norm-z", "--precision", "--tf32",
    "--master-weights", "--gelu-fusion", "--optim-state", "--lora-rank", "--lora-alpha", "--lora-targets",
    "--use-rslora", "--adapter", "--optimizer", "--adafactor-beta1", "--adafactor-clip", "--adafactor-decay-rate",
    "--adafactor-relative-step", "--use-dora", "--teacher", "--distill-alpha", "--distill-temperature",
    "--teacher-quantize", "--grad-compression", "--quantize-base", "--double-quant", "--prompt-tokens", NULL};
/* (-b, -pn and -z are not among them: a step's data is fixed by -d alone, see dataloader.h, and
 * the optimizer state is saved whole, so a run resumes with another split of the same step) */
/* What a run does, not what it is: never compared on resume. */
static const char *const action_flags[] = {"--resume", "--overwrite", "--allow-config-change", "--plan", "--json", "--max-batch", NULL};
/* Flags added after the run files were fixed (test/test_layout_identity.sh): train_config_to_text
 * writes them only when they differ from the default, so the DONE files of runs without them stay
 * as they were (a resume reads an absent line as the default). */
static const char *const later_flags[] = {"--hellaswag-file", "--batch-ramp", "--lora-rank", "--lora-alpha", "--lora-targets",
                                          "--use-rslora", "--adapter", "--optimizer", "--adafactor-beta1", "--adafactor-clip",
                                          "--adafactor-decay-rate", "--adafactor-relative-step", "--use-dora", "--teacher",
                                          "--distill-alpha", "--distill-temperature", "--teacher-quantize",
                                          "--grad-compression", "--offload-device", "--nvme-path", "--tensor-parallel",
                                          "--pipeline-parallel", "--sequence-parallel", "--pipeline-schedule",
                                          "--pipeline-virtual", "--expert-parallel", "--quantize-base", "--double-quant",
                                          "--prompt-tokens", "--memory-snapshot", NULL};
static const char *const gpu_flags[] = {"--precision", "--tf32", "--master-weights", "--gelu-fusion", "--matmul-algos", "--matmul-cache",
                                        "--gpu-log-every", "--peak-tflops", "--cuda-graph", "--memory-snapshot", NULL};
static const char *const multiprocess_flags[] = {"--process-rank", "--gpus-per-node", "--nccl-init",
                                                 "--server-ip", "--fs-path", "--zero-stage", "--dist-timeout",
                                                 "--grad-compression", "--offload-device", "--nvme-path", NULL};

static void flag_label(const Flag *f, char *buf, size_t len) {
    if (f->short_name) snprintf(buf, len, "%s (%s)", f->short_name, f->long_name);
    else snprintf(buf, len, "%s", f->long_name);
}

void train_config_help(const TrainConfig *defaults, const char *program, FILE *out) {
    fprintf(out, "usage: %s [flags]\n\nFlags take a value: '-b 4', '--batch-size 4' or '--batch-size=4' (--plan, --json and --max-batch need none).\n\n", program);
    for (int i = 0; i < NUM_FLAGS; i++) {
        char val[1100];
        format_value(&flags[i], defaults, val, sizeof val);
        fprintf(out, "  %-4s %-20s %s (default: %s)\n", flags[i].short_name ? flags[i].short_name : "",
                flags[i].long_name, flags[i].help, val);
    }
    fprintf(out, "  %-4s %-20s %s\n", "", "--help", "print this help and exit");
}

/* Appends "name value" to a line of the startup print, wrapping at about 100 columns. */
static void print_item(FILE *out, int *col, const char *indent, const char *name, const char *value) {
    int w = (int)(strlen(name) + 1 + strlen(value));
    if (*col > (int)strlen(indent) && *col + 2 + w > 100) {
        fprintf(out, "\n%s", indent);
        *col = (int)strlen(indent);
    } else if (*col > (int)strlen(indent)) {
        fputs("  ", out);
        *col += 2;
    }
    fprintf(out, "%s %s", name, value);
    *col += w;
}

/* A flag of a feature the run does not use (evaluation, Adafactor, distillation, adapters): its
 * default is left out of the startup print's "defaults" lines. */
static int feature_off(const Flag *f, const TrainConfig *c) {
    const char *n = f->long_name;
    if (strcmp(n, "--hellaswag") == 0 || strcmp(n, "--hellaswag-file") == 0) return !c->hellaswag;
    if (strncmp(n, "--adafactor-", 12) == 0 || strcmp(n, "--optimizer") == 0) return strcmp(c->optimizer, "adafactor") != 0;
    if (strncmp(n, "--distill-", 10) == 0 || strncmp(n, "--teacher", 9) == 0) return !c->teacher[0];
    if (strncmp(n, "--lora-", 7) == 0 || strcmp(n, "--use-rslora") == 0 || strcmp(n, "--use-dora") == 0 ||
        strcmp(n, "--adapter") == 0 || strcmp(n, "--quantize-base") == 0 || strcmp(n, "--double-quant") == 0)
        return c->lora_rank == 0 && !c->adapter[0];
    if (strcmp(n, "--prompt-tokens") == 0) return !c->prompt_tokens;
    if (strcmp(n, "--offload-device") == 0 || strcmp(n, "--nvme-path") == 0) return strcmp(c->offload_device, "nvme") != 0;
    if (strcmp(n, "--tensor-parallel") == 0 || strncmp(n, "--pipeline-", 11) == 0 || strcmp(n, "--sequence-parallel") == 0)
        return c->tensor_parallel == 1 && c->pipeline_parallel == 1;
    if (strcmp(n, "--expert-parallel") == 0) return c->expert_parallel == 1;
    return 0;
}

void train_config_print(const TrainConfig *c, int gpu, FILE *out) {
    TrainConfig d;
    train_config_defaults(&d);
    for (int pass = 0; pass < 2; pass++) {
        const char *head = pass == 0 ? "configuration: " : "defaults:      ";
        const char *indent = "               ";
        int col = 0, any = 0;
        for (int i = 0; i < NUM_FLAGS; i++) {
            const Flag *f = &flags[i];
            char val[1100], def[1100];
            format_value(f, c, val, sizeof val);
            format_value(f, &d, def, sizeof def);
            int differs = strcmp(val, def) != 0;
            if (differs != (pass == 0)) continue;
            if (pass == 1 && (in_list(f, action_flags) || (!gpu && in_list(f, gpu_flags)) ||
                              (c->num_processes == 1 && in_list(f, multiprocess_flags)) ||
                              (gpu && strcmp(f->long_name, "--threads") == 0) || feature_off(f, c)))
                continue;
            if (pass == 0 && !gpu && strcmp(f->long_name, "--precision") == 0) continue; /* always fp32 */
            if (!any) {
                fputs(head, out);
                col = (int)strlen(head);
                any = 1;
            }
            print_item(out, &col, indent, f->short_name ? f->short_name : f->long_name, val);
        }
        if (any) fputc('\n', out);
    }
}

size_t train_config_to_text(const TrainConfig *c, char *buf, size_t len) {
    TrainConfig defaults;
    train_config_defaults(&defaults);
    size_t n = 0;
    if (len) buf[0] = '\0';
    for (int i = 0; i < NUM_FLAGS; i++) {
        char val[1100];
        format_value(&flags[i], c, val, sizeof val);
        if (in_list(&flags[i], later_flags)) {
            char def[1100];
            format_value(&flags[i], &defaults, def, sizeof def);
            if (strcmp(val, def) == 0) continue;
        }
        if (flags[i].type == F_STRING) snprintf(val, sizeof val, "%s", (const char *)c + flags[i].offset);
        int k = snprintf(n < len ? buf + n : NULL, n < len ? len - n : 0, "%s %s\n", flags[i].long_name, val);
        if (k > 0) n += (size_t)k;
    }
    if (c->teacher[0] && c->has_teacher_crc) { /* (distillation: the teacher's weights, which --teacher only names) */
        int k = snprintf(n < len ? buf + n : NULL, n < len ? len - n : 0, "--teacher-crc32 %08x\n", c->teacher_crc);
        if (k > 0) n += (size_t)k;
    }
    return n;
}

static void set_value(const Flag *f, TrainConfig *c, const char *flagname, const char *value);
static const Flag *find_flag(const char *arg, size_t len);

void train_config_from_text(TrainConfig *c, const char *text) {
    while (*text) {
        const char *eol = strchr(text, '\n');
        size_t n = eol ? (size_t)(eol - text) : strlen(text);
        char line[1200];
        if (n < sizeof line) {
            memcpy(line, text, n);
            line[n] = '\0';
            char *sp = strchr(line, ' ');
            const Flag *f = sp ? find_flag(line, (size_t)(sp - line)) : NULL;
            if (f) {
                *sp = '\0';
                set_value(f, c, line, sp + 1);
            } else if (sp && strncmp(line, "--teacher-crc32 ", 16) == 0) {
                c->teacher_crc = (unsigned)strtoul(sp + 1, NULL, 16);
                c->has_teacher_crc = 1;
            }
        }
        text += n + (eol ? 1 : 0);
    }
}

void train_config_compare(const TrainConfig *saved, const TrainConfig *now, const char *where, FILE *out) {
    char blocked[4096] = "";
    size_t nb = 0;
    int shown = 0;
    for (int i = 0; i < NUM_FLAGS; i++) {
        const Flag *f = &flags[i];
        if (in_list(f, action_flags)) continue;
        char a[1100], b[1100], label[64];
        format_value(f, saved, a, sizeof a);
        format_value(f, now, b, sizeof b);
        if (strcmp(a, b) == 0) continue;
        flag_label(f, label, sizeof label);
        int math = in_list(f, math_flags);
        if (!shown++) fprintf(out, "resume: flags that differ from the configuration saved with %s:\n", where);
        fprintf(out, "  %-24s %s -> %s%s\n", label, a, b, math ? "  (changes the training math)" : "");
        if (math && nb < sizeof blocked) {
            int k = snprintf(blocked + nb, sizeof blocked - nb, "%s%s %s (saved) -> %s (now)", nb ? ", " : "", label, a, b);
            if (k > 0) nb += (size_t)k;
        }
    }
    if (saved->has_teacher_crc && now->has_teacher_crc && saved->teacher_crc != now->teacher_crc &&
        strcmp(saved->teacher, now->teacher) == 0 && !now->allow_config_change)
        llmc_die("cannot resume from %s: its run distilled from --teacher %s with parameters of crc32 %08x, this run's "
                 "teacher under that name has crc32 %08x (other weights: the distillation term changes). Resume with the "
                 "saved teacher, or pass --allow-config-change 1", where, now->teacher, saved->teacher_crc, now->teacher_crc);
    if (!shown) fprintf(out, "resume: the configuration equals the one saved with %s\n", where);
    fflush(out);
    if (nb && !now->allow_config_change)
        llmc_die("cannot resume from %s with changed flags that change the training math: %s. "
                 "Resume with the saved values, or pass --allow-config-change 1 to continue with the new ones",
                 where, blocked);
}

void train_config_log(const TrainConfig *c, Logger *lg) {
    log_object_begin(lg, "config");
    for (int i = 0; i < NUM_FLAGS; i++) {
        const Flag *f = &flags[i];
        char key[64];
        snprintf(key, sizeof key, "%s", f->long_name + 2);
        for (char *k = key; *k; k++)
            if (*k == '-') *k = '_';
        const char *p = (const char *)c + f->offset;
        switch (f->type) {
        case F_INT:
        case F_SWITCH: log_int(lg, key, *(const int *)p); break;
        case F_LLONG: log_int(lg, key, *(const long long *)p); break;
        case F_ULLONG: {
            unsigned long long v = *(const unsigned long long *)p;
            if (v <= (unsigned long long)LLONG_MAX) log_int(lg, key, (long long)v);
            else {
                char buf[32];
                snprintf(buf, sizeof buf, "%llu", v);
                log_string(lg, key, buf);
            }
            break;
        }
        case F_FLOAT: log_float(lg, key, *(const float *)p); break;
        case F_STRING: log_string(lg, key, p); break;
        }
    }
    log_object_end(lg);
}

static const Flag *find_flag(const char *arg, size_t len) {
    for (int i = 0; i < NUM_FLAGS; i++) {
        const char *names[2] = {flags[i].short_name, flags[i].long_name};
        for (int k = 0; k < 2; k++)
            if (names[k] && strlen(names[k]) == len && strncmp(names[k], arg, len) == 0) return &flags[i];
    }
    return NULL;
}

static void set_value(const Flag *f, TrainConfig *c, const char *flagname, const char *value) {
    char *p = (char *)c + f->offset, *end = NULL;
    errno = 0;
    switch (f->type) {
    case F_INT:
    case F_SWITCH: {
        long v = strtol(value, &end, 10);
        if (end == value || *end || errno || v < INT_MIN || v > INT_MAX)
            llmc_die("flag %s expects an integer, got '%s'", flagname, value);
        *(int *)p = (int)v;
        break;
    }
    case F_LLONG: {
        long long v = strtoll(value, &end, 10);
        if (end == value || *end || errno) llmc_die("flag %s expects an integer, got '%s'", flagname, value);
        *(long long *)p = v;
        break;
    }
    case F_ULLONG: {
        if (value[0] == '-') llmc_die("flag %s expects a non-negative integer, got '%s'", flagname, value);
        unsigned long long v = strtoull(value, &end, 10);
        if (end == value || *end || errno) llmc_die("flag %s expects an integer, got '%s'", flagname, value);
        *(unsigned long long *)p = v;
        break;
    }
    case F_FLOAT: {
        /* decimal only, like the integer flags: strtof alone would take hex ("0x1p3"), "inf", "nan" */
        float v = strpbrk(value, "xXpP") ? NAN : strtof(value, &end);
        if (errno == ERANGE && fabsf(v) < 1.0f) errno = 0; /* an underflow (1e-40): the nearest float, like a literal */
        if (errno == ERANGE && end != value && !*end)
            llmc_die("flag %s: '%s' is out of range (a float's largest magnitude is about 3.4e38)", flagname, value);
        if (!isfinite(v) || end == value || *end || errno)
            llmc_die("flag %s expects a number, got '%s'", flagname, value);
        *(float *)p = v;
        break;
    }
    case F_STRING:
        if (strlen(value) >= f->size) llmc_die("flag %s: value longer than %zu characters", flagname, f->size - 1);
        memcpy(p, value, strlen(value) + 1);
        break;
    }
}

static void check_positive(const char *flag, long long v) {
    if (v <= 0) llmc_die("flag %s must be positive, got %lld", flag, v);
}
static void check_range(const char *flag, long long v, long long lo, long long hi) {
    if (v < lo || v > hi) llmc_die("flag %s must be between %lld and %lld, got %lld", flag, lo, hi, v);
}

/* Checks that need only the flags (the model-dependent ones happen at setup). */
/* --teacher and its knobs (the teacher's file and vocabulary are checked at setup) */
static void validate_distill(const TrainConfig *c) {
    if (!(c->distill_alpha >= 0.0f && c->distill_alpha <= 1.0f))
        llmc_die("flag --distill-alpha must be in [0, 1] (the distillation term's weight), got %g", (double)c->distill_alpha);
    /* (beyond these the tempered logits or t^2 overflow fp32 for ordinary logits) */
    if (!(c->distill_temperature >= 1e-3f && c->distill_temperature <= 1e3f))
        llmc_die("flag --distill-temperature must be positive (from 0.001 to 1000), got %g", (double)c->distill_temperature);
    if (!c->teacher[0] && (c->distill_alpha != 0.5f || c->distill_temperature != 2.0f || c->teacher_quantize[0]))
        llmc_die("flags --distill-alpha, --distill-temperature and --teacher-quantize need --teacher MODEL (distillation)");
    if (c->teacher_quantize[0] && strcmp(c->teacher_quantize, "bf16") && strcmp(c->teacher_quantize, "nf4"))
        llmc_die("flag --teacher-quantize: unknown value '%s' ('' = fp32; bf16 and nf4 are not built yet)", c->teacher_quantize);
    if (c->teacher_quantize[0])
        llmc_die("flag --teacher-quantize %s is not built yet: the teacher runs in fp32 (leave --teacher-quantize out)",
                 c->teacher_quantize);
}

/* QLoRA: --quantize-base and --double-quant (the model's shapes are checked at setup, llmc/cpu/qbase.h) */
static void validate_quantize_base(const TrainConfig *c) {
    const char *q = c->quantize_base;
    check_range("--double-quant", c->double_quant, 0, 1);
    if (q[0] && strcmp(q, "nf4") && strcmp(q, "int8"))
        llmc_die("flag --quantize-base: unknown mode '%s' (nf4, int8; '' = the fp32 base)", q);
    if (c->double_quant && strcmp(q, "nf4"))
        llmc_die("flag --double-quant 1 is for --quantize-base nf4 only (it quantises NF4's absmax values), got "
                 "--quantize-base '%s'", q);
    if (q[0] && !c->lora_rank && !c->adapter[0])
        llmc_die("flag --quantize-base %s needs LoRA adapters (--lora-rank R or --adapter DIR): the quantised base is "
                 "frozen, only adapters train on it", q);
    if (q[0] && c->use_dora)
        llmc_die("flags --quantize-base %s and --use-dora 1: DoRA on a quantised base is not built yet (its row norms "
                 "read the fp32 weights)", q);
}

/* --grad-compression (llmc/train/gradcomp.h) and what it is built with */
static void validate_grad_compression(const TrainConfig *c) {
    GradCompSpec gc;
    char gc_err[256];
    if (gradcomp_parse(c->grad_compression, &gc, gc_err, sizeof gc_err) != 0) llmc_die("flag --grad-compression: %s", gc_err);
    if (gc.kind == GC_POWERSGD && (c->lora_rank > 0 || c->adapter[0]))
        llmc_die("flag --grad-compression %s with LoRA adapters is not built yet (the adapters' matrices are not "
                 "factored); give int8, bf16 or topk:FRAC", c->grad_compression);
    if (gc.kind != GC_NONE && c->zero_stage >= 2)
        llmc_die("flags --grad-compression %s and -z %d: compression is built for -z 0 and 1 (one all-reduce of the whole "
                 "gradient); -z 2/3 reduce-scatter each bucket during the backward, uncompressed. Give -z 0 or 1, or "
                 "--grad-compression none", c->grad_compression, c->zero_stage);
    if (gc.kind != GC_NONE && strcmp(c->optimizer, "adamw"))
        llmc_die("flag --grad-compression %s with --optimizer %s is not built yet (the host AdamW's reduction has it)",
                 c->grad_compression, c->optimizer);
    if (gc.kind != GC_NONE && c->memory_budget[0])
        llmc_die("flag --grad-compression %s with --memory-budget is not built yet (its search would try -z 2/3); give "
                 "-b/-r/-z yourself", c->grad_compression);
}

/* --offload-device and --nvme-path (llmc/train/nvme.h); the directory itself is checked here (it
 * must exist: nothing is created in it but the run's files) and again when the files are made */
static void validate_offload_device(const TrainConfig *c) {
    if (strcmp(c->offload_device, "cpu") && strcmp(c->offload_device, "nvme"))
        llmc_die("flag --offload-device: unknown value '%s' (cpu, nvme)", c->offload_device);
    const int nvme = strcmp(c->offload_device, "nvme") == 0;
    if (!nvme && c->nvme_path[0]) llmc_die("flag --nvme-path goes with --offload-device nvme (the optimizer state on disk)");
    if (!nvme) return;
    if (!c->nvme_path[0]) llmc_die("flag --offload-device nvme needs --nvme-path DIR (a directory for the optimizer state files)");
    if (strcmp(c->optimizer, "adamw"))
        llmc_die("flag --offload-device nvme with --optimizer %s is not built yet (the host AdamW's moments stream from "
                 "disk); give --optimizer adamw or --offload-device cpu", c->optimizer);
    if (c->memory_budget[0])
        llmc_die("flag --offload-device nvme with --memory-budget is not built yet (its search does not price the disk); "
                 "give -b/-r/-z yourself (--plan shows the ring and the file)");
    if (!c->plan) nvme_check_dir(c->nvme_path);
}

/* --memory-snapshot FILE: checked before the run, so that a bad path costs no training: its
 * directory must exist and FILE must not be a directory (atomicfile.h writes it at the end). */
static void validate_memory_snapshot(const TrainConfig *c) {
    const char *path = c->memory_snapshot;
    if (!path[0] || c->plan) return;
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        llmc_die("flag --memory-snapshot: '%s' exists and is not a regular file (give a file path)", path);
    if (stat(path, &st) == 0 && st.st_size > 0) { /* only an earlier snapshot is replaced, never another file */
        static const char magic[] = "{\"format\": \"llmc-memory-snapshot\"";
        char head[sizeof magic] = "";
        FILE *f = fopen(path, "rb");
        size_t n = f ? fread(head, 1, sizeof magic - 1, f) : 0;
        if (f) fclose(f);
        if (n != sizeof magic - 1 || memcmp(head, magic, n) != 0)
            llmc_die("flag --memory-snapshot: '%s' exists and is not a memory snapshot; it would be overwritten (give "
                     "a new path, or remove the file)", path);
    }
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        llmc_die("flag --memory-snapshot: the directory '%s' of '%s' does not exist (create it first)", dir, path);
    if (access(dir, W_OK) != 0) llmc_die("flag --memory-snapshot: the directory '%s' of '%s' is not writable", dir, path);
}

/* -tp, -pp, -sp and the pipeline's schedule (issue 25: tensor parallelism is built, the rest not yet) */
static void validate_layout(const TrainConfig *c) {
    check_range("-tp (--tensor-parallel)", c->tensor_parallel, 1, 4096);
    check_range("-pp (--pipeline-parallel)", c->pipeline_parallel, 1, 4096);
    check_range("-sp (--sequence-parallel)", c->sequence_parallel, 0, 1);
    check_range("--pipeline-virtual", c->pipeline_virtual, 1, 4096);
    if (strcmp(c->pipeline_schedule, "gpipe") && strcmp(c->pipeline_schedule, "1f1b") && strcmp(c->pipeline_schedule, "interleaved"))
        llmc_die("flag --pipeline-schedule: unknown schedule '%s' (gpipe, 1f1b, interleaved)", c->pipeline_schedule);
    if (c->pipeline_parallel > 1)
        llmc_die("flag -pp %d (--pipeline-parallel): pipeline parallelism is not built yet (give -pp 1; tensor "
                 "parallelism -tp is)", c->pipeline_parallel);
    if (strcmp(c->pipeline_schedule, "1f1b") || c->pipeline_virtual != 1)
        llmc_die("flag %s: pipeline schedules are not built yet (pipeline parallelism -pp is not)",
                 strcmp(c->pipeline_schedule, "1f1b") ? "--pipeline-schedule" : "--pipeline-virtual");
    if (c->sequence_parallel)
        llmc_die("flag -sp 1 (--sequence-parallel): sequence parallelism is not built yet (give -sp 0; -tp runs without it)");
    const int tp = c->tensor_parallel;
    if (tp == 1) return;
    if (c->num_processes > 1 && c->num_processes % tp != 0)
        llmc_die("flag -tp %d: the %d processes (-pn) do not divide into tensor-parallel groups of %d (the data-parallel "
                 "size is processes / tp)", tp, c->num_processes, tp);
    const char *what = c->zero_stage > 1 ? "-z 2 and 3 (use -z 0 or 1)"
                       : c->lora_rank > 0 || c->adapter[0] ? "LoRA adapters (--lora-rank, --adapter)"
                       : c->teacher[0] ? "distillation (--teacher)"
                       : strcmp(c->grad_compression, "none") ? "--grad-compression"
                       : strcmp(c->optimizer, "adamw") ? "--optimizer adafactor"
                       : strcmp(c->optim_state, "fp32") ? "--optim-state bf16/int8 (use fp32)"
                       : strcmp(c->offload, "none") ? "--offload"
                       : strcmp(c->offload_device, "cpu") ? "--offload-device nvme"
                       : c->expert_parallel > 1 ? "-ep (--expert-parallel)"
                       : c->memory_budget[0] ? "--memory-budget" : NULL;
    if (what) llmc_die("flag -tp %d with %s is not built yet", tp, what);
}

static void validate(const TrainConfig *c) {
    check_positive("-b (--batch-size)", c->B);
    check_positive("-t (--seq-len)", c->T);
    /* sizes are checked in 64 bits before any int product is formed from them */
    if ((long long)c->B * c->T * (c->num_processes > 0 ? c->num_processes : 1) > INT_MAX)
        llmc_die("flags -b %d -t %d (x %d processes): B*T*processes must be at most %d tokens", c->B, c->T,
                 c->num_processes, INT_MAX);
    long long ramp_tokens, ramp_start;
    if (c->batch_ramp[0] && batch_ramp_parse(c->batch_ramp, &ramp_tokens, &ramp_start) != 0)
        llmc_die("flag --batch-ramp expects TOKENS or TOKENS:START (positive integers), got '%s'", c->batch_ramp);
    if (c->batch_ramp[0] && c->overfit_batch) llmc_die("flags --batch-ramp and -a 1 (one batch, overfit) do not go together");
    if (c->max_steps == INT_MAX) llmc_die("flag -x (--max-steps) must be below %d", INT_MAX);
    if (c->gen_tokens > MAX_GEN_TOKENS)
        llmc_die("flag -g (--gen-tokens) must be at most %d, got %d", MAX_GEN_TOKENS, c->gen_tokens);
    if (c->max_skips < 0) llmc_die("flag --max-skips must be >= 0 (0 = never stop), got %d", c->max_skips);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus > 0 && c->threads > cpus)
        llmc_die("flag --threads %d exceeds the %ld CPUs of this machine (0 = all of them)", c->threads, cpus);
    if (c->total_batch < 0) llmc_die("flag -d (--total-batch) must be >= 0, got %lld", c->total_batch);
    if (c->max_steps < -1) llmc_die("flag -x (--max-steps) must be positive, -1 or 0, got %d", c->max_steps);
    if (lr_schedule_parse(c->schedule) < 0)
        llmc_die("flag -k (--lr-schedule): unknown schedule '%s' (cosine, linear, constant, wsd)", c->schedule);
    if (c->lr < 0) llmc_die("flag -l (--lr) must be >= 0, got %g", (double)c->lr);
    if (c->warmup < 0) llmc_die("flag -u (--warmup) must be >= 0, got %d", c->warmup);
    if (c->final_frac < 0 || c->final_frac > 1) llmc_die("flag -q (--final-lr-frac) must be in [0, 1], got %g", (double)c->final_frac);
    if (c->weight_decay < 0) llmc_die("flag -c (--weight-decay) must be >= 0, got %g", (double)c->weight_decay);
    if (!(c->beta1 >= 0 && c->beta1 < 1)) llmc_die("flag --beta1 must be in [0, 1), got %g", (double)c->beta1);
    if (!(c->beta2 >= 0 && c->beta2 < 1)) llmc_die("flag --beta2 must be in [0, 1), got %g", (double)c->beta2);
    if (!(c->eps > 0)) llmc_die("flag --eps must be positive, got %g", (double)c->eps);
    if (c->grad_clip < 0) llmc_die("flag --grad-clip must be >= 0 (0 disables), got %g", (double)c->grad_clip);
    if (c->skip_loss_z < 0 || c->skip_norm_z < 0) llmc_die("flags -sl/-sg must be >= 0 (0 disables)");
    check_range("-r (--recompute)", c->recompute, 0, 3);
    check_range("-a (--overfit-batch)", c->overfit_batch, 0, 1);
    check_range("--shuffle", c->shuffle, 0, 1);
    if (c->val_every < 0) llmc_die("flag -v (--val-every) must be >= 0 (0 disables), got %d", c->val_every);
    if (c->val_max_steps == 0 || c->val_max_steps < -1) llmc_die("flag -m (--val-max-steps) must be positive or -1, got %d", c->val_max_steps);
    if (c->sample_every < 0) llmc_die("flag -s (--sample-every) must be >= 0 (0 disables), got %d", c->sample_every);
    if (c->gen_tokens < 1) llmc_die("flag -g (--gen-tokens) must be positive, got %d", c->gen_tokens);
    if (c->ckpt_every < 0 || c->ckpt_keep < 0 || c->ckpt_major < 0) llmc_die("flags -n, -nk, -nm must be >= 0");
    check_range("--checkpoint-bf16", c->ckpt_bf16, 0, 1);
    check_range("--save-hf", c->save_hf, 0, 1);
    if (c->save_hf && !LLMC_HAVE_CJSON)
        llmc_die("--save-hf 1: this build has no Hugging Face support (cJSON was not found: apt-get install "
                 "libcjson-dev, then make)");
    check_range("-y (--resume)", c->resume, 0, 1);
    check_range("--overwrite", c->overwrite, 0, 1);
    check_range("--allow-config-change", c->allow_config_change, 0, 1);
    check_range("--plan", c->plan, 0, 1);
    check_range("--json", c->json, 0, 1);
    if (c->json && !c->plan) llmc_die("flag --json goes with --plan (print the memory plan as JSON)");
    cli_memory_budget_bytes(c->memory_budget); /* dies naming the flag */
    check_range("--max-batch", c->max_batch, 0, 1);
    if (c->max_batch && (!c->plan || !c->memory_budget[0]))
        llmc_die("flag --max-batch goes with --plan --memory-budget SIZE (print the largest -b that fits)");
    if (c->overwrite && c->resume)
        llmc_die("flags -y 1 (resume the run in -o) and --overwrite 1 (delete it and start anew) contradict each other; give one");
    if (c->overwrite && !c->output_dir[0]) llmc_die("flag --overwrite 1 needs an output directory (-o)");
    if (c->resume && !c->output_dir[0]) llmc_die("flag -y 1 (resume) needs an output directory (-o) to resume from");
    if (c->ckpt_every && !c->output_dir[0]) llmc_die("flag -n %d (checkpoints) needs an output directory (-o)", c->ckpt_every);
    check_range("-h (--hellaswag)", c->hellaswag, 0, 1);
    if (c->hellaswag && !c->hellaswag_file[0]) llmc_die("flag -h 1 needs an eval file (--hellaswag-file PATH)");
    if (strcmp(c->precision, "fp32") && strcmp(c->precision, "bf16") && strcmp(c->precision, "fp16"))
        llmc_die("flag --precision: unknown precision '%s' (fp32, bf16, fp16)", c->precision);
    if (optstate_parse(c->optim_state) < 0)
        llmc_die("flag --optim-state: unknown optimizer state type '%s' (fp32, bf16, int8)", c->optim_state);
    if (strcmp(c->offload, "none") && strcmp(c->offload, "optimizer"))
        llmc_die("flag --offload: unknown value '%s' (none, optimizer)", c->offload);
    check_range("-f (--tf32)", c->tf32, 0, 1);
    check_range("-w (--master-weights)", c->master_weights, 0, 1);
    check_range("-ge (--gelu-fusion)", c->gelu_fusion, -1, 2);
    check_range("--matmul-algos", c->matmul_algos, 1, 64);
    check_range("--cuda-graph", c->cuda_graph, 0, 1);
    /* LoRA: the model-dependent checks (rank against the modules, targets) happen at setup */
    if (c->lora_rank < 0) llmc_die("flag --lora-rank must be >= 1 (0 = no adapters), got %d", c->lora_rank);
    if (!(c->lora_alpha > 0.0f)) llmc_die("flag --lora-alpha must be positive, got %g", (double)c->lora_alpha);
    check_range("--use-rslora", c->use_rslora, 0, 1);
    check_range("--use-dora", c->use_dora, 0, 1);
    if (!c->lora_rank && !c->adapter[0] && (c->lora_targets[0] || c->use_rslora || c->use_dora))
        llmc_die("flags --lora-targets, --use-rslora and --use-dora need --lora-rank R (or --adapter DIR): LoRA adapters");
    check_range("-z (--zero-stage)", c->zero_stage, 0, 3);
    if (c->gpu_log_every < -1)
        llmc_die("flag -lg (--gpu-log-every) must be a step count >= 1, or 0 or -1 (off), got %d", c->gpu_log_every);
    if (c->peak_tflops < 0) llmc_die("flag --peak-tflops must be >= 0");
    if (c->threads < 0) llmc_die("flag --threads must be >= 0 (0 = all cores), got %d", c->threads);
    check_positive("-pn (--num-processes)", c->num_processes);
    /* under a launcher (mpirun, srun) the rank and size are its: dist_init compares -pr with them */
    if (dist_launcher_size() > 1 && c->num_processes == 1) check_range("-pr (--process-rank)", c->process_rank, 0, INT_MAX);
    else check_range("-pr (--process-rank)", c->process_rank, 0, c->num_processes - 1);
    check_positive("-pg (--gpus-per-node)", c->gpus_per_node);
    if (!(c->dist_timeout > 0.0f)) llmc_die("flag --dist-timeout must be a number of seconds > 0, got %g", (double)c->dist_timeout);
    /* the optimizer (llmc/train/adafactor.h) */
    if (strcmp(c->optimizer, "adamw") && strcmp(c->optimizer, "adafactor"))
        llmc_die("flag --optimizer: unknown optimizer '%s' (adamw, adafactor)", c->optimizer);
    if (!(c->adafactor_beta1 >= 0 && c->adafactor_beta1 < 1))
        llmc_die("flag --adafactor-beta1 must be in [0, 1) (0 = no first moment), got %g", (double)c->adafactor_beta1);
    if (!(c->adafactor_clip > 0) || !isfinite(c->adafactor_clip))
        llmc_die("flag --adafactor-clip must be a positive RMS, got %g", (double)c->adafactor_clip);
    if (!(c->adafactor_decay_rate < 0) || !isfinite(c->adafactor_decay_rate))
        llmc_die("flag --adafactor-decay-rate must be negative (beta2 at step t = 1 - t^rate), got %g", (double)c->adafactor_decay_rate);
    check_range("--adafactor-relative-step", c->adafactor_relative_step, 0, 1);
    if (strcmp(c->optimizer, "adafactor") == 0) {
        if (c->zero_stage > 1)
            llmc_die("flag -z %d: --optimizer adafactor shards its state at -z 1 (by whole matrices) at most; -z 2 and 3 "
                     "are not built for it (use -z 0 or 1, or --optimizer adamw)", c->zero_stage);
        if (strcmp(c->optim_state, "fp32"))
            llmc_die("flag --optim-state %s is AdamW's: --optimizer adafactor keeps its statistics in fp32 (give "
                     "--optim-state fp32)", c->optim_state);
        if (c->lora_rank > 0 || c->adapter[0])
            llmc_die("flag %s with --optimizer adafactor is not built yet (the adapters' shapes are not factored); "
                     "train LoRA adapters with --optimizer adamw", c->lora_rank > 0 ? "--lora-rank" : "--adapter");
        if (c->beta1 != 0.9f || c->beta2 != 0.95f || c->eps != 1e-8f)
            llmc_die("flags --beta1/--beta2/--eps are AdamW's: --optimizer adafactor has --adafactor-beta1 (its first "
                     "moment) and --adafactor-decay-rate (its second moments' decay) instead");
        if (c->memory_budget[0])
            llmc_die("flag --memory-budget with --optimizer adafactor is not built yet (its search would try -z 2/3); "
                     "give -b/-r/-z yourself (--plan shows Adafactor's bytes)");
    } else if (c->adafactor_beta1 != 0.0f || c->adafactor_clip != 1.0f || c->adafactor_decay_rate != -0.8f ||
               c->adafactor_relative_step != 0)
        llmc_die("flags --adafactor-*: they set Adafactor, but the optimizer is --optimizer %s (give --optimizer adafactor)",
                 c->optimizer);
    validate_distill(c);
    validate_quantize_base(c);
    validate_grad_compression(c);
    validate_offload_device(c);
    validate_memory_snapshot(c);
    validate_layout(c);
    if (strcmp(c->nccl_init, "mpi") && strcmp(c->nccl_init, "tcp") && strcmp(c->nccl_init, "fs"))
        llmc_die("flag -pi (--nccl-init): unknown method '%s' (mpi, tcp, fs)", c->nccl_init);
    if (strcmp(c->nccl_init, "tcp") == 0 && !c->server_ip[0])
        llmc_die("flag -pi tcp needs -ps (--server-ip) HOST[:PORT]: the address rank 0 listens on and the other ranks connect to");
    if (strcmp(c->nccl_init, "fs") == 0) {
        struct stat st;
        if (!c->fs_path[0])
            llmc_die("flag -pi fs needs -pf (--fs-path) DIR: a directory every rank sees, where rank 0 publishes its address");
        int e = stat(c->fs_path, &st) != 0 ? errno : 0;
        if (e || !S_ISDIR(st.st_mode))
            llmc_die("flag -pf (--fs-path): '%s' is not a directory (%s); create it on a filesystem every rank sees", c->fs_path,
                     e ? strerror(e) : "not a directory");
    }
}

DistFlags train_config_dist_flags(const TrainConfig *c) {
    DistFlags f = {c->num_processes, c->process_rank, c->nccl_init, c->server_ip, c->fs_path, c->dist_timeout};
    return f;
}

static int is_integer(const char *s) {
    char *end;
    errno = 0;
    strtol(s, &end, 10);
    return end != s && *end == '\0' && errno == 0;
}

/* ---- MoE expert parallelism (issue 24 item 5): -ep N / --expert-parallel N ----
 * Not a table row (cli.h). The model-dependent checks (a Mixtral, E % N, N | processes, more than
 * one process) are the trainer's, once the model and the process group are known. */
static void validate_expert_parallel(const TrainConfig *c) {
    const int n = c->expert_parallel;
    check_range("-ep (--expert-parallel)", n, 1, 256);
    if (n == 1) return;
    if (c->zero_stage >= 3)
        llmc_die("-ep %d with -z %d: expert parallelism shards the optimizer up to -z 2 (the experts' moments and "
                 "gradients over their replicas), not the parameters; use -z 0, 1 or 2", n, c->zero_stage);
    if (strcmp(c->optimizer, "adamw") != 0) llmc_die("-ep %d with --optimizer %s: expert parallelism trains with AdamW only", n, c->optimizer);
    if (c->optim_state[0] && strcmp(c->optim_state, "fp32") != 0)
        llmc_die("-ep %d with --optim-state %s: expert parallelism keeps fp32 moments only", n, c->optim_state);
    if (c->grad_compression[0] && strcmp(c->grad_compression, "none") != 0)
        llmc_die("-ep %d with --grad-compression %s: not built for expert parallelism (use --grad-compression none)", n,
                 c->grad_compression);
    if (c->offload[0] && strcmp(c->offload, "none") != 0)
        llmc_die("-ep %d with --offload %s: not built for expert parallelism", n, c->offload);
    if (strcmp(c->offload_device, "cpu") != 0)
        llmc_die("-ep %d with --offload-device %s: not built for expert parallelism", n, c->offload_device);
    if (c->teacher[0]) llmc_die("-ep %d with --teacher: distillation is not built for expert parallelism", n);
    if (c->lora_rank > 0 || c->adapter[0] || c->prompt_tokens)
        llmc_die("-ep %d with adapters (--lora-rank, --prompt-tokens, --adapter): not built for expert parallelism", n);
    if (c->memory_budget[0]) llmc_die("-ep %d with --memory-budget: the budget search does not price expert parallelism yet", n);
}

void train_config_parse(TrainConfig *c, int argc, char **argv, const char *program) {
    TrainConfig defaults = *c;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0) {
            train_config_help(&defaults, program, stdout);
            exit(0);
        }
        if (arg[0] != '-') llmc_die("unexpected argument '%s' (flags start with '-'; see --help)", arg);
        const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        const Flag *f = find_flag(arg, len);
        if (!f) llmc_die("unknown flag '%.*s' (see --help)", (int)len, arg);
        const char *value;
        if (strcmp(arg, "-h") == 0 && (i + 1 >= argc || !is_integer(argv[i + 1])))
            llmc_die("flag -h is llm.c's HellaSwag evaluation and takes a value (-h 0 or -h 1); for help use --help");
        if (eq) {
            value = eq + 1;
        } else if (f->type == F_SWITCH) {
            value = "1";
        } else {
            if (i + 1 >= argc) llmc_die("flag %s needs a value", arg);
            value = argv[++i];
        }
        set_value(f, c, arg, value);
        if (strcmp(f->long_name, "--prompt-tokens") == 0 && c->prompt_tokens < 1) /* (0, the default, is off) */
            llmc_die("flag --prompt-tokens must be >= 1 (the soft tokens to train), got %d", c->prompt_tokens);
    }
    validate(c);
    validate_expert_parallel(c);
    if (c->save_hf && !c->plan) hf_check_save_source(c->init); /* the files --save-hf will copy */
}

size_t cli_memory_budget_bytes(const char *s) {
    if (!s[0]) return 0;
    char *end = NULL;
    /* no sign, no "inf", no hex; out of double's range: 0 (below one byte) or HUGE_VAL, both refused below */
    double v = isdigit((unsigned char)s[0]) ? strtod(s, &end) : NAN;
    if (end && strpbrk(s, "xXpP")) v = NAN;
    /* K, M, G, T and KiB .. TiB are powers of 1024; KB, MB, GB, TB powers of 1000 (as disks say) */
    double unit = 1.0;
    if (end && *end) {
        const char *units = "KMGT", *u = strchr(units, toupper((unsigned char)*end));
        if (u) {
            const int power = (int)(u - units + 1);
            end++;
            if (*end == 'B' || *end == 'b') unit = pow(1000.0, power), end++;
            else {
                unit = ldexp(1.0, 10 * power);
                if (*end == 'i') end++;
                if (*end == 'B' || *end == 'b') end++;
            }
        } else if (*end == 'B' || *end == 'b') {
            end++; /* bytes */
        }
    }
    double bytes = v * unit;
    if (!end || *end || isnan(v) || bytes < 1.0)
        llmc_die("flag --memory-budget expects a size such as 16G, 16GiB, 1500M, 16GB or a byte count (K, M, G, T and "
                 "KiB .. TiB are powers of 1024; KB, MB, GB, TB powers of 1000), got '%s'", s);
    if (!(bytes < 0x1p63))
        llmc_die("flag --memory-budget '%s' is more than 8 EiB (2^63 bytes), the largest budget", s);
    return (size_t)bytes;
}
