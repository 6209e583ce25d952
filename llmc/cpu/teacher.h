/*
 * teacher.h (CPU) - knowledge distillation's teacher (./train_gpt_cpu --teacher): a frozen model of
 * any architecture with a CPU block sequence (arch.h), resolved from a name as -e resolves one (a
 * model file, an HF directory, a descriptor), run forward only beside the student in the same
 * process, and the micro-step that distils it into the student:
 *   per token, loss = (1 - alpha) CE(s, y) + alpha t^2 KL(softmax(r / t) || softmax(s / t))
 * (s the student's logits, r the teacher's; classifier.h's distill_classifier computes it and its
 * gradient into the student's dlogits). The teacher has parameters and activations for (B, T), no
 * gradients; it is never saved (crc records its parameters, for a resume's check).
 */
#ifndef LLMC_CPU_TEACHER_H
#define LLMC_CPU_TEACHER_H

#include <stdint.h>
#include <stdio.h>

#include "llmc/core/mem.h"
#include "llmc/cpu/arch.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *name;       /* as given (--teacher) */
    ArchConfig arch;        /* its architecture and config */
    const CpuArch *cpu;     /* its CPU entry */
    void *model;            /* the built model (teacher_load; NULL before) */
    int B, T;               /* its activations' batch (teacher_load) */
    uint32_t crc;           /* the CRC-32 of its fp32 parameters as loaded */
    float alpha, temperature;
    double ce_sum, kd_sum;  /* the micro-steps' mean CE and KL since teacher_clear_sums */
} Teacher;

/* t for name (alpha, temperature: the loss's); dies naming --teacher when there is no such model,
 * the CPU has no block sequence for it, its vocabulary is not the student's (named student_name, of
 * config student) or its maximum sequence length is below T. Allocates nothing. */
void teacher_resolve(Teacher *t, const char *name, float alpha, float temperature, const ArchConfig *student,
                     const char *student_name, int T);
/* Builds the teacher, loads its parameters (a descriptor's from seed), records their CRC and
 * allocates its forward's activations for (B, T). */
void teacher_load(Teacher *t, unsigned long long seed, int B, int T);
/* Adds the teacher's parameters and activations for (B, T) to p (and the sgemm's buffer, when its
 * largest matmul needs more); own (may be NULL) gets the teacher's plan alone. */
void teacher_plan(const Teacher *t, int B, int T, MemPlan *p, MemPlan *own);
/* The teacher's line under a memory table (the startup print, --plan). */
void teacher_print(const Teacher *t, int B, int T, FILE *out);
/* One micro-batch: the teacher's logits, the student's (student, model: its entry and built
 * model), the loss above for each of the B*T positions, its gradient times dloss (one position's
 * weight) left in the student's dlogits for its backward, which must follow. Returns the mean loss;
 * ce_sum and kd_sum gain the mean CE and KL. */
float teacher_distill_forward(Teacher *t, const CpuArch *student, void *model, const int *inputs, const int *targets,
                              int B, int T, float dloss);
void teacher_clear_sums(Teacher *t);
void teacher_free(Teacher *t);

#ifdef __cplusplus
}
#endif
#endif
