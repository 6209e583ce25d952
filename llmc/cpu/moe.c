#include "llmc/cpu/moe.h"

#include <math.h>
#include <stddef.h>

void moe_router_forward(float *probs, float *expert, float *weight, int N, int E, int K) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        float *p = probs + (size_t)t * E;
        float maxv = p[0];
        for (int e = 1; e < E; e++) maxv = p[e] > maxv ? p[e] : maxv;
        float sum = 0.0f;
        for (int e = 0; e < E; e++) p[e] = expf(p[e] - maxv), sum += p[e];
        for (int e = 0; e < E; e++) p[e] /= sum;
        /* top-K by repeated selection: strictly greater wins, so ties go to the lower index */
        unsigned char taken[256] = {0};
        float *ex = expert + (size_t)t * K, *w = weight + (size_t)t * K, wsum = 0.0f;
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
            taken[best] = 1;
            ex[j] = (float)best, w[j] = p[best], wsum += p[best];
        }
        for (int j = 0; j < K; j++) w[j] /= wsum;
    }
}

void moe_permute(float *row, float *count, int *offset, const float *expert, int N, int E, int K) {
    for (int e = 0; e <= E; e++) offset[e] = 0;
    for (size_t i = 0; i < (size_t)N * K; i++) offset[(int)expert[i] + 1]++;
    for (int e = 0; e < E; e++) count[e] = (float)offset[e + 1], offset[e + 1] += offset[e];
    /* fill in (token, slot) order: within an expert, tokens come in position order */
    int fill[256];
    for (int e = 0; e < E; e++) fill[e] = offset[e];
    for (size_t i = 0; i < (size_t)N * K; i++) row[i] = (float)fill[(int)expert[i]]++;
}

void moe_gather(float *xg, const float *x, const float *row, int N, int K, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) {
            float *dst = xg + (size_t)row[(size_t)t * K + j] * C;
            const float *src = x + (size_t)t * C;
            for (int c = 0; c < C; c++) dst[c] = src[c];
        }
}

void moe_gather_backward(float *dx, const float *dxg, const float *row, int N, int K, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        float *d = dx + (size_t)t * C;
        for (int c = 0; c < C; c++) d[c] = 0.0f;
        for (int j = 0; j < K; j++) {
            const float *src = dxg + (size_t)row[(size_t)t * K + j] * C;
            for (int c = 0; c < C; c++) d[c] += src[c];
        }
    }
}

void moe_combine_forward(float *out, const float *yg, const float *weight, const float *row, int N, int K, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        float *o = out + (size_t)t * C;
        for (int c = 0; c < C; c++) o[c] = 0.0f;
        for (int j = 0; j < K; j++) {
            const float w = weight[(size_t)t * K + j], *y = yg + (size_t)row[(size_t)t * K + j] * C;
            for (int c = 0; c < C; c++) o[c] += w * y[c];
        }
    }
}

void moe_combine_backward(float *dyg, float *dweight, const float *dout, const float *yg, const float *weight,
                          const float *row, int N, int K, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        const float *d = dout + (size_t)t * C;
        for (int j = 0; j < K; j++) {
            const size_t r = (size_t)row[(size_t)t * K + j];
            const float w = weight[(size_t)t * K + j], *y = yg + r * C;
            float *dy = dyg + r * C, dot = 0.0f;
            for (int c = 0; c < C; c++) dy[c] = w * d[c], dot += d[c] * y[c];
            dweight[(size_t)t * K + j] = dot;
        }
    }
}

void moe_router_backward(float *dlogits, const float *dweight, const float *probs, const float *expert,
                         const float *weight, const float *dprob_extra, int N, int E, int K) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        const float *p = probs + (size_t)t * E, *dw = dweight + (size_t)t * K, *w = weight + (size_t)t * K;
        const float *ex = expert + (size_t)t * K;
        float *dz = dlogits + (size_t)t * E; /* dL/dp first, then through the softmax */
        for (int e = 0; e < E; e++) dz[e] = dprob_extra ? dprob_extra[e] : 0.0f;
        /* w_j = p_j / S over the chosen: dL/dp_m = (dw_m - sum_j dw_j w_j) / S */
        float S = 0.0f, dot = 0.0f;
        for (int j = 0; j < K; j++) S += p[(int)ex[j]], dot += dw[j] * w[j];
        for (int j = 0; j < K; j++) dz[(int)ex[j]] += (dw[j] - dot) / S;
        /* softmax: dz_e = p_e (dp_e - sum_e' p_e' dp_e') */
        float s = 0.0f;
        for (int e = 0; e < E; e++) s += p[e] * dz[e];
        for (int e = 0; e < E; e++) dz[e] = p[e] * (dz[e] - s);
    }
}
