#include "llmc/cpu/encoder.h"

#include <stddef.h>

void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        float *o = out + (size_t)bt * C;
        const float *we = wte + (size_t)inp[bt] * C;
        const float *pe = wpe + (size_t)(bt % T) * C;
        for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
    }
}

void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C) {
    /* Channels are independent, so split them across threads; within a channel block the
     * (b, t) order is fixed, which makes the sums deterministic for any thread count. */
    enum { CB = 64 };
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += CB) {
        int c1 = c0 + CB < C ? c0 + CB : C;
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                const float *d = dout + ((size_t)b * T + t) * C;
                float *dwe = dwte + (size_t)inp[b * T + t] * C;
                float *dpe = dwpe + (size_t)t * C;
                for (int c = c0; c < c1; c++) {
                    dwe[c] += d[c];
                    dpe[c] += d[c];
                }
            }
        }
    }
}

void embedding_backward(float *dwte, const float *dout, const int *inp, int N, int C) {
    for (int i = 0; i < N; i++) { /* serial: a token repeated in the batch sums in position order */
        float *row = dwte + (size_t)inp[i] * C;
        for (int j = 0; j < C; j++) row[j] += dout[(size_t)i * C + j];
    }
}
