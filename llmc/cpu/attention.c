#include "llmc/cpu/attention.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"

/* Offsets within one position's packed row: query head h, key and value head g. */
#define Q_AT(h) ((size_t)(h) * HS)
#define K_AT(g) ((size_t)NH * HS + (size_t)(g) * HS)
#define V_AT(g) ((size_t)(NH + NKV) * HS + (size_t)(g) * HS)

void attention_row(float *out, float *att, const float *q, const float *k, const float *v, size_t stride, int t, int HS,
                   float scale) {
    float maxval = -INFINITY;
    for (int u = 0; u <= t; u++) {
        const float *ku = k + (size_t)u * stride;
        float s = 0.0f;
        for (int i = 0; i < HS; i++) s += q[i] * ku[i];
        s *= scale;
        att[u] = s;
        if (s > maxval) maxval = s;
    }
    float sum = 0.0f;
    for (int u = 0; u <= t; u++) {
        att[u] = expf(att[u] - maxval);
        sum += att[u];
    }
    float inv = 1.0f / sum;
    for (int u = 0; u <= t; u++) att[u] *= inv;
    for (int i = 0; i < HS; i++) out[i] = 0.0f;
    for (int u = 0; u <= t; u++) {
        const float *vu = v + (size_t)u * stride;
        for (int i = 0; i < HS; i++) out[i] += att[u] * vu[i];
    }
}

void attention_forward(float *out, float *att, const float *inp, int B, int T, int NH, int NKV, int HS) {
    const size_t QKV = (size_t)(NH + 2 * NKV) * HS, C = (size_t)NH * HS;
    const int group = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HS);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const int g = h / group;
            for (int t = 0; t < T; t++) {
                const float *q = inp + ((size_t)b * T + t) * QKV + Q_AT(h);
                const float *k = inp + (size_t)b * T * QKV + K_AT(g), *v = inp + (size_t)b * T * QKV + V_AT(g);
                float *a = att + (((size_t)b * NH + h) * T + t) * T;
                attention_row(out + ((size_t)b * T + t) * C + Q_AT(h), a, q, k, v, QKV, t, HS, scale);
                for (int u = t + 1; u < T; u++) a[u] = 0.0f;
            }
        }
    }
}

void attention_backward(float *dinp, const float *dout, const float *inp, const float *att,
                        int B, int T, int NH, int NKV, int HS) {
    const size_t QKV = (size_t)(NH + 2 * NKV) * HS, C = (size_t)NH * HS;
    const int group = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HS);
    memset(dinp, 0, (size_t)B * T * QKV * sizeof(float));
#pragma omp parallel
    {
        float *datt = (float *)mallocCheck((size_t)T * sizeof(float), "attention backward row");
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++) {
            for (int g = 0; g < NKV; g++) {
                /* the group's query heads in order: each adds into the shared dk, dv */
                for (int h = g * group; h < (g + 1) * group; h++) {
                    for (int t = 0; t < T; t++) {
                        const float *a = att + (((size_t)b * NH + h) * T + t) * T;
                        const float *d = dout + ((size_t)b * T + t) * C + Q_AT(h);
                        const float *q = inp + ((size_t)b * T + t) * QKV + Q_AT(h);
                        float *dq = dinp + ((size_t)b * T + t) * QKV + Q_AT(h);
                        /* out[t] = sum_u att[t,u] v_u */
                        float dot = 0.0f;
                        for (int u = 0; u <= t; u++) {
                            const float *v = inp + ((size_t)b * T + u) * QKV + V_AT(g);
                            float *dv = dinp + ((size_t)b * T + u) * QKV + V_AT(g);
                            float s = 0.0f;
                            for (int i = 0; i < HS; i++) {
                                s += d[i] * v[i];
                                dv[i] += a[u] * d[i];
                            }
                            datt[u] = s;
                            dot += a[u] * s;
                        }
                        /* att = softmax(s): ds = att * (datt - sum(att * datt)); s = q.k * scale */
                        for (int u = 0; u <= t; u++) {
                            const float *k = inp + ((size_t)b * T + u) * QKV + K_AT(g);
                            float *dk = dinp + ((size_t)b * T + u) * QKV + K_AT(g);
                            float ds = a[u] * (datt[u] - dot) * scale;
                            for (int i = 0; i < HS; i++) {
                                dq[i] += ds * k[i];
                                dk[i] += ds * q[i];
                            }
                        }
                    }
                }
            }
        }
        free(datt);
    }
}
