#include "sampler.h"

#include <math.h>

int sample_softmax(const float *logits, int V, float coin) {
    float maxval = -INFINITY;
    for (int i = 0; i < V; i++) maxval = logits[i] > maxval ? logits[i] : maxval;
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - maxval);
    double target = coin * sum, cdf = 0.0;
    for (int i = 0; i < V; i++) {
        cdf += exp((double)logits[i] - maxval);
        if (target < cdf) return i;
    }
    return V - 1; /* coin * sum rounded up to the total */
}
