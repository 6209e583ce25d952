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
#ifdef __cplusplus
}
#endif
#endif
