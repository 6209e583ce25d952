#include "llmc/cpu/swiglu.h"

#include <math.h>
#include <stddef.h>

void swiglu_forward(float *out, const float *inp, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *gate = inp + (size_t)i * 2 * F, *up = gate + F;
        float *o = out + (size_t)i * F;
        for (int j = 0; j < F; j++) o[j] = gate[j] / (1.0f + expf(-gate[j])) * up[j];
    }
}

void swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *gate = inp + (size_t)i * 2 * F, *up = gate + F, *d = dout + (size_t)i * F;
        float *dgate = dinp + (size_t)i * 2 * F, *dup = dgate + F;
        for (int j = 0; j < F; j++) {
            float sig = 1.0f / (1.0f + expf(-gate[j])), silu = gate[j] * sig;
            dgate[j] = d[j] * up[j] * sig * (1.0f + gate[j] * (1.0f - sig));
            dup[j] = d[j] * silu;
        }
    }
}
