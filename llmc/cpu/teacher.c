/*
 * teacher.c (CPU) - the distillation teacher (teacher.h).
 */
#include "llmc/cpu/teacher.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llmc/core/check.h"
#include "llmc/core/sumfile.h"
#include "llmc/cpu/classifier.h"
#include "llmc/models/gpt2.h"

void teacher_resolve(Teacher *t, const char *name, float alpha, float temperature, const ArchConfig *student,
                     const char *student_name, int T) {
    memset(t, 0, sizeof *t);
    t->name = name, t->alpha = alpha, t->temperature = temperature;
    ArchConfig probe;
    ModelConfig desc;
    if (!model_arch_explicit(name, &probe) && model_config_from_descriptor(&desc, name) != 0 && access(name, F_OK) != 0)
        llmc_die("--teacher %s: no such file or directory (a model file, an HF directory or a descriptor such as d2, as -e "
                 "takes)", name);
    const ModelArch *arch = model_arch_for_init(name, &t->arch);
    t->cpu = cpu_arch_for(arch);
    if (!t->cpu) llmc_die("--teacher %s is a %s model: the CPU trainer has no block sequence for it", name, arch->display);
    const ModelConfig *tc = arch_config_base(&t->arch), *sc = arch_config_base((ArchConfig *)student);
    if (tc->vocab_size != sc->vocab_size)
        llmc_die("--teacher %s has a vocabulary of %d tokens, the student -e %s has %d: distillation compares the two "
                 "distributions token by token and needs the same vocabulary", name, tc->vocab_size, student_name,
                 sc->vocab_size);
    if (T > tc->max_seq_len)
        llmc_die("--teacher %s: its maximum sequence length is %d, below -t %d (the teacher reads every position the "
                 "student does)", name, tc->max_seq_len, T);
}

void teacher_load(Teacher *t, unsigned long long seed, int B, int T) {
    t->model = callocCheck(1, t->cpu->model_size, "teacher model");
    t->cpu->build(t->model, &t->arch);
    CpuModelParts parts = t->cpu->parts(t->model);
    t->arch.arch->load_init(t->name, &t->arch, *parts.params, parts.num_parameters, seed);
    t->crc = sumfile_crc_update(0, *parts.params, parts.num_parameters * sizeof(float));
    t->cpu->allocate(t->model, B, T, 0, 0);
    t->B = B, t->T = T;
}

void teacher_plan(const Teacher *t, int B, int T, MemPlan *p, MemPlan *own) {
    MemPlan tp;
    mem_plan_init(&tp, "CPU");
    t->cpu->plan(&t->arch, B, T, 0, 0, &tp);
    p->host[MEM_PARAMETERS] += tp.host[MEM_PARAMETERS];
    p->host[MEM_ACTIVATIONS] += tp.host[MEM_ACTIVATIONS];
    if (tp.host[MEM_BLAS_PACKING] > p->host[MEM_BLAS_PACKING]) p->host[MEM_BLAS_PACKING] = tp.host[MEM_BLAS_PACKING];
    if (own) *own = tp;
}

void teacher_print(const Teacher *t, int B, int T, FILE *out) {
    MemPlan p, tp;
    mem_plan_init(&p, "CPU");
    teacher_plan(t, B, T, &p, &tp);
    const double MiB = 1048576.0;
    fprintf(out, "teacher: %s (%s, %zu parameters, frozen, forward only): parameters %.2f MiB, activations %.2f MiB "
                 "beside the student's (in the plan's classes); distillation alpha %g, temperature %g\n",
            t->name, t->arch.arch->display, tp.num_parameters, tp.host[MEM_PARAMETERS] / MiB,
            tp.host[MEM_ACTIVATIONS] / MiB, (double)t->alpha, (double)t->temperature);
}

float teacher_distill_forward(Teacher *t, const CpuArch *student, void *model, const int *inputs, const int *targets,
                              int B, int T, float dloss) {
    const int N = B * T;
    const ModelConfig *cfg = student->parts(model).cfg;
    for (int i = 0; i < N; i++) /* (the student's forward checks the inputs) */
        if (targets[i] < 0 || targets[i] >= cfg->vocab_size)
            llmc_die("token id %d at position %d is outside the vocabulary [0, %d)", targets[i], i, cfg->vocab_size);
    t->cpu->forward(t->model, inputs, NULL, B, T, 0.0f);
    student->forward(model, inputs, NULL, B, T, 0.0f);
    /* the logits activation becomes dlogits, as a forward with targets leaves it for the backward */
    float *logits = (float *)student->logits(model), *losses = (float *)student->losses(model);
    double ce, kd;
    distill_classifier(logits, losses, targets, t->cpu->logits(t->model), t->cpu->parts(t->model).cfg->padded_vocab_size,
                       t->alpha, t->temperature, dloss, N, cfg->vocab_size, cfg->padded_vocab_size, &ce, &kd);
    t->ce_sum += ce / N;
    t->kd_sum += kd / N;
    float sum = 0.0f; /* (as the forward with targets sums its losses) */
    for (int i = 0; i < N; i++) sum += losses[i];
    return sum / N;
}

void teacher_clear_sums(Teacher *t) { t->ce_sum = t->kd_sum = 0.0; }

void teacher_free(Teacher *t) {
    if (t->model) t->cpu->free(t->model);
    free(t->model);
    t->model = NULL;
}
