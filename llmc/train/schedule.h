/* schedule.h - learning-rate schedules. step is 0-based; total_steps the run's length.
 * All start with a linear warmup: lr = peak * (step + 1) / warmup for step < warmup.
 * After it, with min = peak * final_frac and p = (step - warmup) / (total - warmup - 1) in [0, 1]
 * (so the last step runs at exactly min; llm.c divides by total - warmup, so its last step
 * stays above min; when a single step follows the warmup, p = 0: it runs at the peak):
 *   cosine:   min + (peak - min) * 0.5 * (1 + cos(pi p))
 *   linear:   peak - (peak - min) * p
 *   constant: peak
 *   wsd:      peak until the last 20% of the steps, then min + (peak - min) * (1 - sqrt(q)),
 *             q going from 0 to 1 over that cooldown ("warmup-stable-decay"). */
#ifndef LLMC_SCHEDULE_H
#define LLMC_SCHEDULE_H
#ifdef __cplusplus
extern "C" {
#endif
typedef enum { LR_COSINE, LR_LINEAR, LR_CONSTANT, LR_WSD } LrSchedule;
int lr_schedule_parse(const char *name);   /* an LrSchedule, or -1 */
const char *lr_schedule_name(int kind);
float lr_at(int kind, int step, int total_steps, int warmup, float peak, float final_frac);

/* --batch-ramp TOKENS[:START] (GPT-3's batch-size warmup): the tokens of the step that begins after
 * `seen` training tokens: while seen < ramp, start + (full - start) * seen / ramp rounded down to a
 * multiple of start (so at least start); from then on full. full must be a multiple of start. */
long long batch_ramp_step_tokens(long long ramp, long long start, long long full, long long seen);
/* "TOKENS" or "TOKENS:START" (positive integers); *start = 0 when not given. Returns 0, or -1. */
int batch_ramp_parse(const char *text, long long *tokens, long long *start);
#ifdef __cplusplus
}
#endif
#endif
