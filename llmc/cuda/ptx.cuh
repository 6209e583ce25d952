/*
 * ptx.cuh - the few PTX instructions the FlashAttention-2-class kernel (attention_fa2.cuh) uses,
 * as small inline functions: real inline asm under nvcc (sm_80+), cudasim's lane-by-lane
 * emulation from the documented fragment layouts on the CPU (test/cudasim/include/ptx_sim.h,
 * whose head comment spells the layouts out).
 *
 *   ptx_mma_m16n8k16<T>(acc, a, b)   acc (16x8 fp32, 4 per lane) += A (16x16, 4 .b32 regs) *
 *                                    B (16x8, 2 .b32 regs); T = __nv_bfloat16 or __half;
 *                                    mma.sync.aligned.m16n8k16.row.col.f32.T.T.f32
 *   ptx_ldmatrix<N, TRANS>(r, row)   ldmatrix.sync.aligned.m8n8.xN[.trans].shared.b16: lane i
 *                                    gives the 16-byte aligned shared address of row i%8 of
 *                                    matrix i/8; r[j] = matrix j's elements for this lane
 *   ptx_cp_async16(dst, src)         cp.async.cg.shared.global, 16 bytes (both 16-byte aligned)
 *   ptx_cp_async_commit()            cp.async.commit_group
 *   ptx_cp_async_wait<N>()           cp.async.wait_group N: all but the N newest groups landed
 * pack2<T>(lo, hi) packs two floats into one .b32 register of two 16-bit values (lo in the low
 * half), the form an accumulator takes to become the next product's A operand.
 */
#ifndef LLMC_CUDA_PTX_CUH
#define LLMC_CUDA_PTX_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#ifdef CUDASIM
#include <ptx_sim.h>
#endif

template <class T> __device__ inline unsigned pack2(float lo, float hi) {
    static_assert(std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value, "16-bit types only");
    unsigned short l, h;
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        __nv_bfloat16 a = __float2bfloat16(lo), b = __float2bfloat16(hi);
        l = *reinterpret_cast<unsigned short *>(&a), h = *reinterpret_cast<unsigned short *>(&b);
    } else {
        __half a = __float2half(lo), b = __float2half(hi);
        l = *reinterpret_cast<unsigned short *>(&a), h = *reinterpret_cast<unsigned short *>(&b);
    }
    return (unsigned)l | (unsigned)h << 16;
}

#ifdef CUDASIM

template <class T> inline void ptx_mma_m16n8k16(float (&acc)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                                const char *f = __builtin_FILE(), int l = __builtin_LINE()) {
    ::cudasim::ptx::mma_m16n8k16<T>(acc, a, b, acc, f, l);
}
template <int N, bool TRANS>
inline void ptx_ldmatrix(unsigned (&r)[N], const void *row, const char *f = __builtin_FILE(), int l = __builtin_LINE()) {
    ::cudasim::ptx::ldmatrix<N, TRANS>(r, row, f, l);
}
inline void ptx_cp_async16(void *dst, const void *src, const char *f = __builtin_FILE(), int l = __builtin_LINE()) {
    ::cudasim::detail::cp_async(dst, src, 16, f, l);
}
inline void ptx_cp_async_commit() { ::cudasim::detail::cp_async_commit(); }
template <int N> inline void ptx_cp_async_wait(const char *f = __builtin_FILE(), int l = __builtin_LINE()) {
    ::cudasim::detail::cp_async_wait(N, f, l);
}

#else

__device__ inline unsigned ptx_smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

template <class T>
__device__ __forceinline__ void ptx_mma_m16n8k16(float (&acc)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        static_assert(std::is_same<T, __half>::value, "mma.m16n8k16 multiplies bf16 or f16");
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
}

template <int N, bool TRANS> __device__ __forceinline__ void ptx_ldmatrix(unsigned (&r)[N], const void *row) {
    const unsigned a = ptx_smem_addr(row);
    if constexpr (N == 1 && !TRANS) asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(a));
    else if constexpr (N == 1) asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(a));
    else if constexpr (N == 2 && !TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
    else if constexpr (N == 2)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
    else if constexpr (N == 4 && !TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else {
        static_assert(N == 4, "ldmatrix loads 1, 2 or 4 matrices");
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    }
}

__device__ __forceinline__ void ptx_cp_async16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(ptx_smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void ptx_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void ptx_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif

#endif
