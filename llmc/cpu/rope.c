#include "llmc/cpu/rope.h"

#include <math.h>
#include <stddef.h>

void rope_freqs(float *freqs, int T, int HS, const RopeConfig *rc) {
    const double pi = 3.14159265358979323846;
    for (int i = 0; i < HS / 2; i++) {
        double f = pow((double)rc->theta, -2.0 * i / HS);
        if (rc->scale_factor > 0) {
            double wavelen = 2.0 * pi / f;
            double low_wavelen = rc->original_max_pos / (double)rc->low_freq_factor;
            double high_wavelen = rc->original_max_pos / (double)rc->high_freq_factor;
            if (wavelen > low_wavelen) {
                f /= rc->scale_factor;
            } else if (wavelen >= high_wavelen) {
                double smooth = (rc->original_max_pos / wavelen - rc->low_freq_factor) /
                                (rc->high_freq_factor - rc->low_freq_factor);
                f = (1.0 - smooth) * f / rc->scale_factor + smooth * f;
            }
        }
        for (int t = 0; t < T; t++) {
            freqs[((size_t)t * (HS / 2) + i) * 2] = (float)cos(t * f);
            freqs[((size_t)t * (HS / 2) + i) * 2 + 1] = (float)sin(t * f);
        }
    }
}

/* Rotates the q and k heads of every position by sign * angle. */
static void rope_rotate(float *qkv, const float *freqs, int B, int T, int NH, int NKV, int HS, float sign) {
    const size_t QKV = (size_t)(NH + 2 * NKV) * HS;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float *row = qkv + ((size_t)b * T + t) * QKV;
            const float *cs = freqs + (size_t)t * HS;
            for (int h = 0; h < NH + NKV; h++) { /* the q heads, then the k heads */
                float *x = row + (size_t)h * HS;
                for (int i = 0; i < HS / 2; i++) {
                    float c = cs[2 * i], s = sign * cs[2 * i + 1], x0 = x[2 * i], x1 = x[2 * i + 1];
                    x[2 * i] = x0 * c - x1 * s;
                    x[2 * i + 1] = x0 * s + x1 * c;
                }
            }
        }
    }
}

void rope_forward(float *qkv, const float *freqs, int B, int T, int NH, int NKV, int HS) {
    rope_rotate(qkv, freqs, B, T, NH, NKV, HS, 1.0f);
}

void rope_backward(float *dqkv, const float *freqs, int B, int T, int NH, int NKV, int HS) {
    rope_rotate(dqkv, freqs, B, T, NH, NKV, HS, -1.0f);
}
