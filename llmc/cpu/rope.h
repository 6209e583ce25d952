/* rope: rotary position embedding (Llama's convention: channel pairs (2i, 2i+1) of a head rotate
 * together, as complex numbers) applied in place to the q and k heads of a packed qkv tensor
 * (layout as in attention.h: NH query heads, NKV key heads, then NKV value heads, left alone).
 * freqs (T, HS/2, 2) holds cos and sin of t * inv_freq[i], inv_freq[i] = theta^(-2i/HS), with
 * Llama 3.1's frequency scaling when scale_factor > 0 (factor 8, low 1, high 4, original
 * context 8192 for Llama 3.1/3.2): wavelengths 2 pi / f above original/low are divided by
 * factor, below original/high kept, and blended linearly in between.
 * forward:  (x0, x1) <- (x0 cos - x1 sin, x0 sin + x1 cos)
 * backward: the transpose rotation (angle -a) on the gradient, in place.
 * Shapes: qkv, dqkv (B, T, (NH + 2 NKV) HS). */
#ifndef LLMC_CPU_ROPE_H
#define LLMC_CPU_ROPE_H
#ifdef __cplusplus
extern "C" {
#endif
typedef struct {
    float theta;              /* rope_theta: 10000 for GPT-NeoX style, 500000 for Llama 3 */
    float scale_factor;       /* 0: no scaling; Llama 3.1: 8 */
    float low_freq_factor;    /* Llama 3.1: 1 */
    float high_freq_factor;   /* Llama 3.1: 4 */
    int original_max_pos;     /* Llama 3.1: 8192 */
} RopeConfig;
void rope_freqs(float *freqs, int T, int HS, const RopeConfig *rc);
void rope_forward(float *qkv, const float *freqs, int B, int T, int NH, int NKV, int HS);
void rope_backward(float *dqkv, const float *freqs, int B, int T, int NH, int NKV, int HS);
#ifdef __cplusplus
}
#endif
#endif
