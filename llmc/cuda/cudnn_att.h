/*
 * cudnn_att.h - causal self-attention through cuDNN's fused SDPA (its flash attention), the
 * optional alternative to our own kernels in llmc/cuda/attention.cuh for bf16 and fp16 storage.
 * Built only with `make USE_CUDNN=1` (mk/cudnn.mk); the implementation is llmc/cuda/cudnn_att.cpp,
 * a separate object so the cudnn_frontend headers are compiled once. This header is plain C++
 * and pulls in no cuDNN header.
 *
 * Same tensors, same meaning and same argument order as attention_forward / attention_backward:
 *   inp (B, T, (NH + 2 NKV) HS) holds [q (NH heads) | k (NKV heads) | v (NKV heads)] per
 *   position, HS = C/NH; query head h reads key/value head h / (NH/NKV) (grouped-query
 *   attention: cuDNN's SDPA takes K and V with NKV heads as they are; GPT-2: NKV = NH, 3C)
 *   out, dout (B, T, C); dinp (as inp); lse (B, NH, T) fp32
 *   s[t,u] = q_t . k_u / sqrt(HS) for u <= t;  out_t = sum_u softmax_u(s[t, 0..t]) v_u
 *   lse[b,h,t] = log(sum_{u<=t} exp(s[t,u]))   (natural log, scaled scores: exactly our kernels'
 *                                               saved statistic, so either backward accepts
 *                                               either forward's lse)
 * The backward overwrites every element of dinp (dq, dk, dv), as attention_backward does, and
 * needs no scratch argument (cuDNN's workspace is kept here).
 * is_fp16: 0 = __nv_bfloat16 storage, 1 = __half storage. fp32 storage has no cuDNN path.
 *
 * Preconditions (checked on every call; a violation exits with a message and a HINT):
 *   B, T, C, NH > 0, C % NH == 0, NKV > 0 dividing NH, HS = C/NH a multiple of 8 and at most 256 (cuDNN's SDPA
 *   support; GPT-2: 64); inp, out, dout, dinp and lse 16-byte aligned (cuDNN's vector loads:
 *   with HS % 8 == 0 the k and v views at inp + C and inp + 2C stay aligned; a per-layer lse
 *   slice at l*B*NH*T floats is aligned when B*NH*T is a multiple of 4).
 * Needs an sm_80 or newer GPU and cuDNN 9 (developed against 9.19 with cudnn_frontend 1.32; the
 * frontend refuses T = 1 with a causal mask before cuDNN 9.10). Whatever cuDNN itself rejects
 * for a shape is reported at the first call for that shape.
 *
 * State: one cuDNN handle (created on the first call, on the current device), one workspace
 * grown to the largest graph's need, and the built graphs cached per (B, T, C, NH, dtype,
 * forward/backward). The first call for a new shape builds its graph (slow: heuristics and
 * plan compilation); later calls only execute it. Not thread-safe: call from one host thread,
 * and keep the calls ordered (one stream, or synchronised): all graphs share the workspace.
 * The backward uses cuDNN's deterministic algorithm (bit-reproducible runs, as our kernels).
 */
#ifndef LLMC_CUDA_CUDNN_ATT_H
#define LLMC_CUDA_CUDNN_ATT_H

#include <stddef.h>

#include <cuda_runtime.h>

/* out (B, T, C), lse (B, NH, T) <- inp (B, T, (NH + 2 NKV) HS); stream-ordered on `stream`. */
void attention_forward_cudnn(void *out, float *lse, const void *inp, int B, int T, int C, int NH, int NKV, int is_fp16,
                             cudaStream_t stream);

/* dinp (as inp) = d(attention)/d(inp) . dout (overwrites), from the forward's inp, out, lse. */
void attention_backward_cudnn(void *dinp, const void *dout, const void *inp, const void *out, const float *lse, int B,
                              int T, int C, int NH, int NKV, int is_fp16, cudaStream_t stream);

/* Builds the forward and backward graphs for this shape now and grows the workspace to fit, so
 * that the first training step is not slow and the workspace can be counted in the memory
 * table before training starts. Optional: the first call of each op does the same. */
void cudnn_att_prepare(int B, int T, int C, int NH, int NKV, int is_fp16);

/* Bytes of device memory the cuDNN workspace holds now (0 before the first graph is built). */
size_t cudnn_att_workspace_bytes(void);

/* Where the workspace comes from: alloc(ctx, bytes) and release(ctx, p) (./train_gpt: the device
 * allocator, llmc/cuda/devalloc.cuh, class cudnn_workspace); cudaMalloc / cudaFree until set.
 * Set it before the first graph is built (a workspace is released the way it was allocated). */
void cudnn_att_set_allocator(void *(*alloc)(void *ctx, size_t bytes), void (*release)(void *ctx, void *p), void *ctx);

/* Frees the graphs, the workspace and the handle. Safe to call when nothing was created; the
 * next call of an op starts over. */
void cudnn_att_destroy(void);

#endif
