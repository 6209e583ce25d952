/*
 * decode.cuh - inference with a key/value cache on the GPU: the CUDA twin of llmc/cpu/decode.h,
 * used by ./generate_gpu. The forward pass of llmc/cuda/cudamodel.cuh for new tokens only (B = 1),
 * each attending to the keys and values kept from earlier positions, with the trainer's kernels
 * (encoder, LayerNorm and the fused residual + LayerNorm, cuBLASLt matmuls, GELU) and one of its
 * own: attention_decode, a single query row per (token, head) over the cache.
 *
 * attention_decode, for n new queries at positions [pos, pos + n):
 *   s[u] = q . k_u / sqrt(HS), u <= pos + i;  a = softmax(s);  out = sum_u a[u] v_u
 * in fp32 whatever T (inputs converted, the output rounded to T). One block per (query, head):
 * threads stride over the keys for the scores (kept in fp32 scratch), block-reduce the max and
 * the sum, then stride over the head's channels for the weighted sum, in key order.
 *
 * Shapes: qkv (n, (NH + 2 NKV) HS) of the new tokens: [q (NH heads) | k (NKV) | v (NKV)];
 * kv (maxT, 2 NKV HS) per layer: per position its keys then its values (NKV heads each, head g
 * at [g*HS, (g+1)*HS)), the CPU's layout for NKV = NH; query head h reads key/value head
 * h / (NH / NKV) (grouped-query attention: the cache holds each group's head once);
 * scores (n, NH, maxT) fp32; out (n, C). Any head size (the cache path has no tiles).
 */
#ifndef LLMC_CUDA_DECODE_CUH
#define LLMC_CUDA_DECODE_CUH

#include "llmc/cuda/cudamodel.cuh"
#include "llmc/cuda/residual.cuh"

enum { DECODE_ATT_THREADS = 128 };

template <class T>
static __global__ void attention_decode_kernel(T *out, float *scores, const T *qkv, const T *kv, int pos, int C, int NH,
                                               int NKV, int max_len) {
    __shared__ float red[32];
    const int h = blockIdx.x, i = blockIdx.y, HS = C / NH, t = pos + i;
    const int KV = 2 * NKV * HS, kcol = h / (NH / NKV) * HS, vcol = NKV * HS + kcol; /* in a cache row */
    const float scale = 1.0f / sqrtf((float)HS);
    const T *q = qkv + (size_t)i * (C + KV) + h * HS;
    float *s = scores + ((size_t)i * NH + h) * max_len;
    float local_max = -INFINITY;
    for (int u = threadIdx.x; u <= t; u += blockDim.x) {
        const T *k = kv + (size_t)u * KV + kcol;
        float dot = 0.0f;
        for (int j = 0; j < HS; j++) dot += to_float(q[j]) * to_float(k[j]);
        dot *= scale;
        s[u] = dot;
        local_max = fmaxf(local_max, dot);
    }
    const float maxval = block_max(local_max, red);
    float local_sum = 0.0f;
    for (int u = threadIdx.x; u <= t; u += blockDim.x) {
        float e = expf(s[u] - maxval);
        s[u] = e;
        local_sum += e;
    }
    const float inv = 1.0f / block_sum(local_sum, red); /* its barriers also order the s[] writes */
    for (int j = threadIdx.x; j < HS; j += blockDim.x) {
        float acc = 0.0f;
        for (int u = 0; u <= t; u++) acc += s[u] * inv * to_float(kv[(size_t)u * KV + vcol + j]);
        out[(size_t)i * C + h * HS + j] = from_float<T>(acc);
    }
}

/* out (n, C) = attention of the n new queries in qkv over kv[0 .. pos + n) (see top). */
template <class T>
void attention_decode(T *out, float *scores, const T *qkv, const T *kv, int pos, int n, int C, int NH, int NKV,
                      int max_len, cudaStream_t stream) {
    llmcCheck(n > 0 && pos >= 0 && pos + n <= max_len && C % NH == 0 && NKV > 0 && NH % NKV == 0,
              "attention_decode: bad sizes");
    attention_decode_kernel<<<dim3(NH, n), DECODE_ATT_THREADS, 0, stream>>>(out, scores, qkv, kv, pos, C, NH, NKV,
                                                                            max_len);
    kernelCheck();
}

/* kv[pos + i] = (k, v) of qkv row i, for i < n: the new tokens' keys and values (KV = 2 NKV HS
 * per row) into the cache. */
template <class T> static __global__ void kv_append_kernel(T *kv, const T *qkv, int pos, int n, int C, int KV) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)n * KV) return;
    size_t i = idx / KV, c = idx % KV;
    kv[(pos + i) * KV + c] = qkv[i * (C + KV) + C + c];
}

/* The cache and one layer's scratch rows for up to max_chunk new tokens, all in T but the
 * LayerNorm statistics and the attention scores (fp32). */
typedef struct {
    CudaModel *model;
    int len, max_len, max_chunk;
    void *kv;                                       /* (L, maxT, 2 NKV HS) */
    void *residual, *ln, *qkv, *atty, *proj, *fch, *fch_gelu, *logits; /* rows of C, C, C + 2 NKV HS, C, C, F, F; Vp */
    float *mean, *rstd, *scores;
    int *d_tokens;
    void *memory;
    float *host_logits; /* the last token's logits, V floats (model's host_logits) */
} CudaDecoder;

/* Puts the model's parameters on the device (once) and allocates the cache. */
inline void cuda_decoder_init(CudaDecoder *d, CudaModel *m, int max_chunk) {
    const ModelConfig *cfg = &m->cfg;
    const size_t C = cfg->channels, F = cfg->ffn_hidden, L = cfg->num_layers, T = cfg->max_seq_len;
    const size_t NH = cfg->num_heads, n = (size_t)max_chunk, elem = precision_bytes(m->precision);
    const size_t KV = 2 * (size_t)cfg->num_kv_heads * (C / NH); /* a cache row: keys, values */
    if (cfg->channels % cfg->num_heads != 0) llmc_die("channels %d are not a multiple of the %d heads", cfg->channels, cfg->num_heads);
    memset(d, 0, sizeof *d);
    d->model = m;
    d->max_len = cfg->max_seq_len;
    d->max_chunk = max_chunk;
    cudamodel_sync_from_host(m);
    /* sizes in bytes, each rounded up to 256 (cuBLASLt and the 16-byte kernels like alignment) */
    size_t sizes[] = {L * T * KV * elem, n * C * elem, n * C * elem, n * (C + KV) * elem, n * C * elem,
                      n * C * elem, n * F * elem, n * F * elem, (size_t)cfg->padded_vocab_size * elem,
                      n * sizeof(float), n * sizeof(float), n * NH * T * sizeof(float), n * sizeof(int)};
    void **ptrs[] = {&d->kv, &d->residual, &d->ln, &d->qkv, &d->atty, &d->proj, &d->fch, &d->fch_gelu, &d->logits,
                     (void **)&d->mean, (void **)&d->rstd, (void **)&d->scores, (void **)&d->d_tokens};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += (sizes[i] + 255) & ~(size_t)255;
    d->memory = devalloc_malloc(m->ctx->alloc, MEM_ACTIVATIONS, total); /* the decoder's cache and activations */
    char *p = (char *)d->memory;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *ptrs[i] = p;
        p += (sizes[i] + 255) & ~(size_t)255;
    }
    d->host_logits = m->host_logits;
}

inline void cuda_decoder_free(CudaDecoder *d) {
    devalloc_free(d->model->ctx->alloc, d->memory);
    memset(d, 0, sizeof *d);
}

template <class T> void cuda_decoder_forward_t(CudaDecoder *d, int n) {
    CudaModel *m = d->model;
    const ModelConfig *cfg = &m->cfg;
    const int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, F = cfg->ffn_hidden;
    const int Vp = cfg->padded_vocab_size, pos = d->len, NKV = cfg->num_kv_heads, KV = 2 * NKV * (C / NH);
    const ParameterTensors *p = &m->params;
    const CudaContext *ctx = m->ctx;
    cudaStream_t s = ctx->stream;
    T *res = (T *)d->residual, *ln = (T *)d->ln, *qkv = (T *)d->qkv, *atty = (T *)d->atty, *proj = (T *)d->proj;
    T *fch = (T *)d->fch, *fch_gelu = (T *)d->fch_gelu;
    /* encoded = wte[token] + wpe[pos + i]: the trainer's encoder from position pos on */
    encoder_forward(res, d->d_tokens, (T *)p->wte, (T *)p->wpe + (size_t)pos * C, 1, n, C, s);
    layernorm_forward(ln, d->mean, d->rstd, res, (T *)p->ln1w, (T *)p->ln1b, n, C, s);
    for (int l = 0; l < L; l++) {
        T *kv = (T *)d->kv + (size_t)l * d->max_len * KV;
        matmul_forward(qkv, ln, LLMC_LAYER(T, p->qkvw, l, 3 * C * C), LLMC_LAYER(T, p->qkvb, l, 3 * C), n, C, 3 * C, ctx);
        kv_append_kernel<<<ceil_div((long long)n * KV, 256), 256, 0, s>>>(kv, qkv, pos, n, C, KV);
        kernelCheck();
        attention_decode(atty, d->scores, qkv, kv, pos, n, C, NH, NKV, d->max_len, s);
        matmul_forward(proj, atty, LLMC_LAYER(T, p->attprojw, l, C * C), LLMC_LAYER(T, p->attprojb, l, C), n, C, C, ctx);
        fused_residual_layernorm_forward(res, ln, d->mean, d->rstd, res, proj, LLMC_LAYER(T, p->ln2w, l, C),
                                         LLMC_LAYER(T, p->ln2b, l, C), n, C, s);
        matmul_forward(fch, ln, LLMC_LAYER(T, p->fcw, l, (size_t)F * C), LLMC_LAYER(T, p->fcb, l, F), n, C, F, ctx);
        gelu_forward(fch_gelu, fch, (size_t)n * F, s);
        matmul_forward(proj, fch_gelu, LLMC_LAYER(T, p->fcprojw, l, (size_t)C * F), LLMC_LAYER(T, p->fcprojb, l, C), n, F, C, ctx);
        /* residual += proj, then the next LayerNorm: ln1 of layer l + 1, or the final one */
        const T *w = l + 1 < L ? LLMC_LAYER(T, p->ln1w, l + 1, C) : (T *)p->lnfw;
        const T *b = l + 1 < L ? LLMC_LAYER(T, p->ln1b, l + 1, C) : (T *)p->lnfb;
        fused_residual_layernorm_forward(res, ln, d->mean, d->rstd, res, proj, w, b, n, C, s);
    }
    /* logits of the last new token only: what sampling needs */
    matmul_forward((T *)d->logits, ln + (size_t)(n - 1) * C, (T *)p->wte, (const T *)NULL, 1, C, Vp, ctx);
    T *stage = (T *)m->h_staging;
    cudaCheck(cudaMemcpyAsync(stage, d->logits, (size_t)Vp * sizeof(T), cudaMemcpyDeviceToHost, s));
    cudaCheck(cudaStreamSynchronize(s));
    for (int i = 0; i < Vp; i++) d->host_logits[i] = to_float(stage[i]);
}

/* Runs tokens[0..n) at positions [len, len + n), appends their keys and values, and returns the
 * last one's logits (Vp floats, host, valid until the next call). 1 <= n <= max_chunk and
 * len + n <= maxT, or it dies with a message. */
inline const float *cuda_decoder_forward(CudaDecoder *d, const int *tokens, int n) {
    const ModelConfig *cfg = &d->model->cfg;
    if (n < 1 || n > d->max_chunk) llmc_die("cuda_decoder_forward: %d tokens, expected 1..%d", n, d->max_chunk);
    if (d->len + n > d->max_len)
        llmc_die("the sequence would reach %d tokens, beyond the model's context of %d (maxT)", d->len + n, d->max_len);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= cfg->vocab_size)
            llmc_die("token id %d is outside the vocabulary [0, %d)", tokens[i], cfg->vocab_size);
    cudaCheck(cudaMemcpyAsync(d->d_tokens, tokens, (size_t)n * sizeof(int), cudaMemcpyHostToDevice, d->model->ctx->stream));
    with_storage_type(d->model->precision, [&](auto tag) { cuda_decoder_forward_t<decltype(tag)>(d, n); });
    d->len += n;
    return d->host_logits;
}

#endif
