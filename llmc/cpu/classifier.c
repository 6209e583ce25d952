#include "llmc/cpu/classifier.h"

#include <math.h>
#include <stddef.h>

void fused_classifier(float *logits, float *losses, const int *targets, float dloss, int N, int V, int Vp,
                      int write_dlogits) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *z = logits + (size_t)i * Vp;
        float maxval = -INFINITY;
        for (int v = 0; v < V; v++) maxval = z[v] > maxval ? z[v] : maxval;
        /* the sum of V ~ 50K exponentials accumulates in double: a float running sum drifts by
         * ~1e-5 relative at GPT-2's vocabulary, more than the GPU's tree reductions, and the
         * reference must be the more accurate of the two (seen on an H200, 2026-11-30) */
        double sum = 0.0;
        for (int v = 0; v < V; v++) sum += expf(z[v] - maxval);
        int y = targets[i];
        losses[i] = (float)log(sum) + maxval - z[y];
        if (!write_dlogits) continue;
        float inv = (float)(1.0 / sum);
        for (int v = 0; v < V; v++) z[v] = expf(z[v] - maxval) * inv * dloss;
        z[y] -= dloss;
        for (int v = V; v < Vp; v++) z[v] = 0.0f;
    }
}
