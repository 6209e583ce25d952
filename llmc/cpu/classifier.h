/* fused classifier: softmax + cross-entropy (+ dlogits) in one pass, over the real vocab.
 * For each row i of logits (N, Vp), only the first V columns take part:
 *   lse = log(sum_v exp(logits[i,v]));  losses[i] = lse - logits[i, targets[i]]
 * With write_dlogits, logits is overwritten in place by the gradient of dloss * losses[i]:
 *   logits[i,v] = dloss * (softmax[i,v] - [v == targets[i]]) for v < V, 0 for V <= v < Vp
 * Shapes: logits (N, Vp); losses (N); targets (N), each in [0, V). */
#ifndef LLMC_CPU_CLASSIFIER_H
#define LLMC_CPU_CLASSIFIER_H
#ifdef __cplusplus
extern "C" {
#endif
void fused_classifier(float *logits, float *losses, const int *targets, float dloss, int N, int V, int Vp,
                      int write_dlogits);
/* Knowledge distillation (--teacher): per position i, with p = softmax(z), q = softmax(z / t) and
 * r = softmax(teacher / t) over the V real columns,
 *   ce[i] = lse(z) - z[y],  kd[i] = KL(r || q) = sum_v r_v (log r_v - log q_v),
 *   losses[i] = (1 - alpha) ce[i] + alpha t^2 kd[i];
 * logits is overwritten by the gradient of dloss * losses[i]:
 *   logits[i,v] = dloss (1 - alpha) (p_v - [v == y]) + dloss alpha t (q_v - r_v), 0 for V <= v < Vp
 * (d kd / d z = (q - r) / t). With alpha 0 the gradient and losses are fused_classifier's bit for
 * bit. teacher (N, teacher_stride) is the teacher's logits (teacher_stride >= V); ce_sum and kd_sum
 * get the sums of ce[i] and kd[i] (double). */
void distill_classifier(float *logits, float *losses, const int *targets, const float *teacher, int teacher_stride,
                        float alpha, float temperature, float dloss, int N, int V, int Vp, double *ce_sum, double *kd_sum);
#ifdef __cplusplus
}
#endif
#endif
