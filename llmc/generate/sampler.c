#include "llmc/generate/sampler.h"

#include <math.h>
#include <stdlib.h>

#include "llmc/core/check.h"

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

typedef struct {
    float logit;
    int id;
} Candidate;

/* descending logit; equal logits by ascending id, so the order is total and deterministic */
static int by_logit_desc(const void *a, const void *b) {
    const Candidate *x = (const Candidate *)a, *y = (const Candidate *)b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id - y->id;
}

int sample_filtered(const float *logits, int V, float temperature, int top_k, float top_p, float coin) {
    if (temperature <= 0.0f) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    Candidate *c = (Candidate *)mallocCheck((size_t)V * sizeof *c, "sampling candidates");
    for (int i = 0; i < V; i++) c[i] = (Candidate){logits[i], i};
    qsort(c, (size_t)V, sizeof *c, by_logit_desc);
    int n = top_k > 0 && top_k < V ? top_k : V;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp(((double)c[i].logit - c[0].logit) / temperature);
    if (top_p < 1.0f) { /* keep the shortest prefix whose probability reaches top_p */
        double cdf = 0.0;
        for (int i = 0; i < n; i++) {
            cdf += exp(((double)c[i].logit - c[0].logit) / temperature);
            if (cdf >= top_p * sum) {
                n = i + 1;
                sum = cdf;
                break;
            }
        }
    }
    double target = coin * sum, cdf = 0.0;
    int pick = c[n - 1].id; /* coin * sum rounded up to the total */
    for (int i = 0; i < n; i++) {
        cdf += exp(((double)c[i].logit - c[0].logit) / temperature);
        if (target < cdf) {
            pick = c[i].id;
            break;
        }
    }
    free(c);
    return pick;
}
