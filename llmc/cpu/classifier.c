#include "classifier.h"

#include <math.h>
#include <stddef.h>

void fused_classifier(float *logits, float *losses, const int *targets, float dloss, int N, int V, int Vp,
                      int write_dlogits) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *z = logits + (size_t)i * Vp;
        float maxval = -INFINITY;
        for (int v = 0; v < V; v++) maxval = z[v] > maxval ? z[v] : maxval;
        float sum = 0.0f;
        for (int v = 0; v < V; v++) sum += expf(z[v] - maxval);
        int y = targets[i];
        losses[i] = logf(sum) + maxval - z[y];
        if (!write_dlogits) continue;
        float inv = 1.0f / sum;
        for (int v = 0; v < V; v++) z[v] = expf(z[v] - maxval) * inv * dloss;
        z[y] -= dloss;
        for (int v = V; v < Vp; v++) z[v] = 0.0f;
    }
}
