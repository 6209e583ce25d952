/* sass_kernels.cu - the memory-bound ops' host wrappers instantiated for every storage type, so
 * test/test_sass.sh can read their machine code (cuobjdump) and ptxas's resource report without
 * compiling a whole trainer (with ./generate_gpu's attention_decode, for the spill check). Compiled only by that test; never linked or run. */
#include "llmc/cuda/adamw.cuh"
#include "llmc/cuda/cast.cuh"
#include "llmc/cuda/classifier.cuh"
#include "llmc/cuda/decode.cuh"
#include "llmc/cuda/encoder.cuh"
#include "llmc/cuda/gelu.cuh"
#include "llmc/cuda/layernorm.cuh"
#include "llmc/cuda/residual.cuh"

#define LLMC_SASS_INSTANTIATE(T)                                                           \
    template void gelu_forward<T>(T *, const T *, size_t, cudaStream_t);                  \
    template void gelu_backward<T>(T *, const T *, const T *, size_t, cudaStream_t);      \
    template void residual_forward<T>(T *, const T *, const T *, size_t, cudaStream_t);   \
    template void cast_copy<T, float>(T *, const float *, size_t, cudaStream_t);          \
    template void layernorm_backward<T>(T *, T *, T *, const T *, const T *, const T *, const float *, const float *, \
                                        int, int, float *, cudaStream_t);                          \
    template void fused_classifier<T>(T *, float *, const int *, float, int, int, int, int, cudaStream_t); \
    template void attention_decode<T>(T *, float *, const T *, const T *, int, int, int, int, int, int, cudaStream_t); \
    template void encoder_forward<T>(T *, const int *, const T *, const T *, int, int, int, cudaStream_t);    \
    template void encoder_backward<T>(T *, T *, const T *, const EncoderBuckets *, int, int, int, cudaStream_t); \
    template void layernorm_forward<T>(T *, float *, float *, const T *, const T *, const T *, int, int, cudaStream_t); \
    template void fused_residual_layernorm_forward<T>(T *, T *, float *, float *, const T *, const T *, const T *,      \
                                                      const T *, int, int, cudaStream_t);                            \
    template void layernorm_recompute<T>(T *, const T *, const float *, const float *, const T *, const T *, int, int, \
                                         cudaStream_t);                                                              \
    template void adamw_update<T>(T *, float *, const T *, float *, float *, size_t, float, float, float, float, float, \
                                  int, float, uint64_t, cudaStream_t, size_t);                                       \
    template void global_norm_squared<T>(float *, const T *, size_t, float *, cudaStream_t);                         \
    template void adamw_update_compact<T>(T *, float *, const T *, void *, void *, int, size_t, const OptSegments *,   \
                                          float, float, float, float, int, float, uint64_t, cudaStream_t, size_t);
LLMC_SASS_INSTANTIATE(float)
LLMC_SASS_INSTANTIATE(__nv_bfloat16)
LLMC_SASS_INSTANTIATE(__half)
template void cast_copy<float, __nv_bfloat16>(float *, const __nv_bfloat16 *, size_t, cudaStream_t);
template void cast_copy<float, __half>(float *, const __half *, size_t, cudaStream_t);

/* the FlashAttention-2-class kernels (attention_fa2.cuh): HMMA, LDSM and LDGSTS, no spills */
#include "llmc/cuda/attention.cuh"
template void attention_forward_fa2<__nv_bfloat16>(__nv_bfloat16 *, float *, const __nv_bfloat16 *, int, int, int, int,
                                                   int, cudaStream_t);
template void attention_forward_fa2<__half>(__half *, float *, const __half *, int, int, int, int, int, cudaStream_t);
template void attention_backward_fa2<__nv_bfloat16>(__nv_bfloat16 *, const __nv_bfloat16 *, const __nv_bfloat16 *,
                                                    const __nv_bfloat16 *, const float *, int, int, int, int, int,
                                                    float *, cudaStream_t);
template void attention_backward_fa2<__half>(__half *, const __half *, const __half *, const __half *, const float *,
                                             int, int, int, int, int, float *, cudaStream_t);

/* the Llama ops: RMSNorm forward (plain and fused with the residual add: one kernel16) and its
 * one-pass backward (1..4 packs per lane), SwiGLU forward and backward, RoPE */
#include "llmc/cuda/rmsnorm.cuh"
#include "llmc/cuda/rope.cuh"
#include "llmc/cuda/swiglu.cuh"
#define LLMC_SASS_LLAMA(T)                                                                                         \
    template void fused_residual_rmsnorm_forward<T>(T *, T *, float *, const T *, const T *, const T *, int, int,   \
                                                    float, cudaStream_t);                                          \
    template void rmsnorm_backward<T>(T *, T *, const T *, const T *, const T *, const float *, int, int, float *,   \
                                      cudaStream_t);                                                               \
    template void swiglu_forward<T>(T *, const T *, int, int, cudaStream_t);                                       \
    template void swiglu_backward<T>(T *, const T *, const T *, int, int, cudaStream_t);                           \
    template void rope_forward<T>(T *, const float *, int, int, int, int, int, cudaStream_t);
LLMC_SASS_LLAMA(float)
LLMC_SASS_LLAMA(__nv_bfloat16)
LLMC_SASS_LLAMA(__half)
