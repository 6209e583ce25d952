/*
 * cudasim.h - compile idiomatic CUDA C++ with g++ and run its kernels on the CPU.
 *
 * A .cu file is first passed through test/cudasim/cu2cpp.py, which rewrites the three things
 * that are not C++ (kernel<<<...>>>(...) launches, __shared__ declarations, extern __shared__
 * dynamic shared memory) into calls declared here and puts `#include "cudasim.h"` first.
 * Everything else - the CUDA runtime API, bf16/fp16 types, vector types, cuBLAS(Lt), NCCL -
 * compiles against NVIDIA's real host headers, so signatures are exactly the toolkit's; the
 * implementations live in test/cudasim/runtime.cpp, blas.cpp and nccl.cpp (no libcudart).
 *
 * Execution model (see README.md): blocks run one after another on the calling thread; the
 * threads of a block are cooperative fibers that switch only inside __syncthreads and warp
 * primitives, so every run is deterministic. Misuse (divergent barriers, shuffles naming absent
 * lanes, shared/global out-of-bounds, use after cudaFree, bad launch configurations) is
 * reported naming kernel, block and thread; kernel bugs end the process with exit status
 * CUDASIM_ERROR_EXIT.
 */
#ifndef CUDASIM_H
#define CUDASIM_H

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#define CUDASIM 1
#define CUDASIM_ERROR_EXIT 70

/* ---- CUDA keywords: execution-space qualifiers mean nothing on the host ------------------- */
#undef __global__
#undef __device__
#undef __host__
#undef __constant__
#undef __managed__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#undef __grid_constant__
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __grid_constant__
/* __shared__ is rewritten by cu2cpp.py; a leftover one (e.g. in a file the translator did not
 * see) must not compile silently into an ordinary local variable. */
#undef __shared__
#define __shared__ CUDASIM_SHARED_NOT_TRANSLATED_run_cu2cpp_py

namespace cudasim {

/* The per-fiber / per-block state that threadIdx & co. read. */
struct ThreadCtx {
    uint3 tid;
};
struct BlockCtx {
    uint3 bid;
    dim3 bdim;
    dim3 gdim;
};
extern ThreadCtx *g_thread; /* the running fiber; NULL outside kernels */
extern BlockCtx g_block;

enum WarpOp {
    WOP_SHFL_IDX, WOP_SHFL_UP, WOP_SHFL_DOWN, WOP_SHFL_XOR, WOP_BALLOT, WOP_ANY, WOP_ALL,
    WOP_SYNCWARP, WOP_REDUCE_ADD, WOP_REDUCE_MIN, WOP_REDUCE_MAX, WOP_REDUCE_AND,
    WOP_REDUCE_OR, WOP_REDUCE_XOR, WOP_MATCH_ANY, WOP_COLLECTIVE, WOP_COUNT
};
enum BarrierOp { BAR_PLAIN, BAR_COUNT, BAR_AND, BAR_OR };

namespace detail {
/* Blocks the calling fiber until every thread of the block arrives (at the same call site). */
int barrier(int op, int pred, const char *file, int line);
/* One warp primitive: deposits `size` bytes of `val`, waits for every lane named in `mask`
 * to reach the same primitive, then writes this lane's result (`size` bytes) to `out`.
 * arg: source lane / delta / lane mask; width: shuffle segment width. */
void warp_exchange(int op, unsigned mask, const void *val, size_t size, int arg, int width,
                   void *out, const char *file, int line, bool is_signed);
unsigned active_mask();
/* A warp-collective instruction (mma.sync, ldmatrix; see include/ptx_sim.h): every lane of a
 * whole warp (32 threads) arrives with its own ctx at the same instruction (same fn); the last
 * to arrive calls fn(ctx of lanes 0..31) once, before any lane continues. */
void warp_collective(const char *name, void (*fn)(void *const *ctx), void *ctx, const char *file, int line);
/* cp.async: `bytes` of src are read now, but reach dst only when the calling thread waits for
 * the group they were committed in (cp_async_wait), so a read before the wait sees stale data. */
void cp_async(void *dst, const void *src, size_t bytes, const char *file, int line);
void cp_async_commit();
void cp_async_wait(int pending, const char *file, int line);
void *shared_alloc(const void *key, size_t size, size_t align, const char *name);
void *dynamic_shared();
[[noreturn]] void device_error(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
bool launch_begin(const char *name, const void *kaddr, dim3 grid, dim3 block, size_t smem,
                  cudaStream_t stream, const char *file, int line);
void launch_run(void (*entry)(void *), void *ctx);
void check_aligned(const void *p, size_t align, const char *what, const char *file, int line);
/* Stream capture (cudaStreamBeginCapture .. cudaStreamEndCapture): what an asynchronous operation
 * on `stream` does now. CAPTURE_EXECUTE: run it (no capture, or another stream); CAPTURE_RECORD:
 * hand it to capture_record (it runs at each cudaGraphLaunch, in order); CAPTURE_REFUSED: the
 * error is set (and reported) and the capture is invalidated (the legacy default stream while a
 * capture is active), or it was invalidated before. */
enum CaptureAction { CAPTURE_EXECUTE, CAPTURE_RECORD, CAPTURE_REFUSED };
CaptureAction capture_action(cudaStream_t stream, const char *what, const char *file, int line);
void capture_record(std::function<void()> op);
bool capture_active();
} // namespace detail

/* Statistics of this process's simulated work (printed by the speed test). */
struct Stats {
    unsigned long long launches, blocks, threads, switches, barriers, warp_ops;
    /* host synchronisations: cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize,
     * cudaMemcpy between host and device, cudaMemcpyAsync to or from pageable host memory (the
     * host waits for the copy, as on a GPU) */
    unsigned long long host_syncs;
    unsigned long long graph_launches; /* cudaGraphLaunch calls */
};
Stats stats();

/* Address of a kernel for cudaFuncSetAttribute lookups; nullptr for deduced templates. */
template <class... P> inline const void *kaddr(void (*f)(P...)) {
    return reinterpret_cast<const void *>(f);
}

template <class F> static void invoke_body(void *ctx) { (*static_cast<F *>(ctx))(); }

/* The target of a translated `kernel<<<grid, block, smem, stream>>>(args...)`. `body` calls the
 * kernel with a copy of the evaluated arguments (overload resolution and template deduction
 * happen exactly as in the original call); every thread gets its own copy of the parameters. */
template <class Body, class... A>
void launch(const char *name, const void *kaddr, dim3 grid, dim3 block, size_t smem,
            cudaStream_t stream, const char *file, int line, Body &&body, A &&...args) {
    std::tuple<std::decay_t<A>...> params(std::forward<A>(args)...);
    const detail::CaptureAction action = detail::capture_action(stream, name, file, line);
    if (action == detail::CAPTURE_REFUSED) return;
    if (!detail::launch_begin(name, kaddr, grid, block, smem, stream, file, line)) return;
    if (action == detail::CAPTURE_RECORD) { /* the kernel and its arguments by value, as a graph node */
        detail::capture_record([body = std::decay_t<Body>(body), params, name, kaddr, grid, block, smem, stream, file,
                                line]() mutable {
            if (!detail::launch_begin(name, kaddr, grid, block, smem, stream, file, line)) return;
            auto run = [&]() { std::apply(body, params); };
            detail::launch_run(&invoke_body<decltype(run)>, &run);
        });
        return;
    }
    auto run = [&]() { std::apply(body, params); };
    detail::launch_run(&invoke_body<decltype(run)>, &run);
}

/* Storage of one static `__shared__ T name;` per block (see cu2cpp.py). */
template <class T, int ID> struct SharedTag {
    static char key;
};
template <class T, int ID> char SharedTag<T, ID>::key;
template <class T, int ID> inline T &shared_var(const char *name) {
    return *static_cast<T *>(detail::shared_alloc(&SharedTag<T, ID>::key, sizeof(T), alignof(T), name));
}

template <class T> inline T warp_value_op(int op, unsigned mask, T v, int arg, int width,
                                          const char *file, int line) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 16,
                  "warp shuffles need a trivially copyable value of at most 16 bytes");
    T out;
    detail::warp_exchange(op, mask, &v, sizeof(T), arg, width, &out, file, line,
                          std::is_signed<T>::value);
    return out;
}
} // namespace cudasim

/* ---- the C++ runtime API overloads cuda_runtime.h only declares under nvcc ------------------ */
template <class T>
static inline cudaError_t cudaFuncSetAttribute(T *func, enum cudaFuncAttribute attr, int value) {
    return ::cudaFuncSetAttribute(reinterpret_cast<const void *>(func), attr, value);
}
template <class T>
static inline cudaError_t cudaMemcpyToSymbol(const T &symbol, const void *src, size_t count, size_t offset = 0,
                                             enum cudaMemcpyKind kind = cudaMemcpyHostToDevice) {
    return ::cudaMemcpyToSymbol(static_cast<const void *>(&symbol), src, count, offset, kind);
}
template <class T>
static inline cudaError_t cudaMemcpyFromSymbol(void *dst, const T &symbol, size_t count, size_t offset = 0,
                                               enum cudaMemcpyKind kind = cudaMemcpyDeviceToHost) {
    return ::cudaMemcpyFromSymbol(dst, static_cast<const void *>(&symbol), count, offset, kind);
}

/* ---- built-in variables ------------------------------------------------------------------ */
#define threadIdx (static_cast<const uint3 &>(::cudasim::g_thread->tid))
#define blockIdx (static_cast<const uint3 &>(::cudasim::g_block.bid))
#define blockDim (static_cast<const dim3 &>(::cudasim::g_block.bdim))
#define gridDim (static_cast<const dim3 &>(::cudasim::g_block.gdim))
static constexpr int warpSize = 32;

/* ---- synchronisation ---------------------------------------------------------------------- */
#define CUDASIM_SITE const char *cudasim_file = __builtin_FILE(), int cudasim_line = __builtin_LINE()
inline void __syncthreads(CUDASIM_SITE) {
    ::cudasim::detail::barrier(::cudasim::BAR_PLAIN, 0, cudasim_file, cudasim_line);
}
inline int __syncthreads_count(int p, CUDASIM_SITE) {
    return ::cudasim::detail::barrier(::cudasim::BAR_COUNT, p != 0, cudasim_file, cudasim_line);
}
inline int __syncthreads_and(int p, CUDASIM_SITE) {
    return ::cudasim::detail::barrier(::cudasim::BAR_AND, p != 0, cudasim_file, cudasim_line);
}
inline int __syncthreads_or(int p, CUDASIM_SITE) {
    return ::cudasim::detail::barrier(::cudasim::BAR_OR, p != 0, cudasim_file, cudasim_line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, CUDASIM_SITE) {
    int dummy = 0;
    ::cudasim::detail::warp_exchange(::cudasim::WOP_SYNCWARP, mask, &dummy, sizeof dummy, 0, 32,
                                     &dummy, cudasim_file, cudasim_line, false);
}
/* No memory-ordering model: fibers never run concurrently, so fences only stop the compiler. */
inline void __threadfence() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

/* ---- warp primitives ---------------------------------------------------------------------- */
template <class T> inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = 32, CUDASIM_SITE) {
    return ::cudasim::warp_value_op(::cudasim::WOP_SHFL_IDX, mask, var, srcLane, width, cudasim_file, cudasim_line);
}
template <class T> inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32, CUDASIM_SITE) {
    return ::cudasim::warp_value_op(::cudasim::WOP_SHFL_UP, mask, var, (int)delta, width, cudasim_file, cudasim_line);
}
template <class T> inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32, CUDASIM_SITE) {
    return ::cudasim::warp_value_op(::cudasim::WOP_SHFL_DOWN, mask, var, (int)delta, width, cudasim_file, cudasim_line);
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = 32, CUDASIM_SITE) {
    return ::cudasim::warp_value_op(::cudasim::WOP_SHFL_XOR, mask, var, laneMask, width, cudasim_file, cudasim_line);
}
inline unsigned __ballot_sync(unsigned mask, int pred, CUDASIM_SITE) {
    return ::cudasim::warp_value_op(::cudasim::WOP_BALLOT, mask, (unsigned)(pred != 0), 0, 32, cudasim_file, cudasim_line);
}
inline int __any_sync(unsigned mask, int pred, CUDASIM_SITE) {
    return ::cudasim::warp_value_op(::cudasim::WOP_ANY, mask, (int)(pred != 0), 0, 32, cudasim_file, cudasim_line);
}
inline int __all_sync(unsigned mask, int pred, CUDASIM_SITE) {
    return ::cudasim::warp_value_op(::cudasim::WOP_ALL, mask, (int)(pred != 0), 0, 32, cudasim_file, cudasim_line);
}
inline unsigned __match_any_sync(unsigned mask, unsigned v, CUDASIM_SITE) {
    return ::cudasim::warp_value_op(::cudasim::WOP_MATCH_ANY, mask, v, 0, 32, cudasim_file, cudasim_line);
}
#define CUDASIM_WARP_REDUCE(name, op)                                                              \
    inline unsigned name(unsigned mask, unsigned v, CUDASIM_SITE) {                                \
        return ::cudasim::warp_value_op(op, mask, v, 0, 32, cudasim_file, cudasim_line);          \
    }                                                                                              \
    inline int name(unsigned mask, int v, CUDASIM_SITE) {                                          \
        return ::cudasim::warp_value_op(op, mask, v, 0, 32, cudasim_file, cudasim_line);          \
    }
CUDASIM_WARP_REDUCE(__reduce_add_sync, ::cudasim::WOP_REDUCE_ADD)
CUDASIM_WARP_REDUCE(__reduce_min_sync, ::cudasim::WOP_REDUCE_MIN)
CUDASIM_WARP_REDUCE(__reduce_max_sync, ::cudasim::WOP_REDUCE_MAX)
#undef CUDASIM_WARP_REDUCE
inline unsigned __reduce_and_sync(unsigned mask, unsigned v, CUDASIM_SITE) {
    return ::cudasim::warp_value_op(::cudasim::WOP_REDUCE_AND, mask, v, 0, 32, cudasim_file, cudasim_line);
}
inline unsigned __reduce_or_sync(unsigned mask, unsigned v, CUDASIM_SITE) {
    return ::cudasim::warp_value_op(::cudasim::WOP_REDUCE_OR, mask, v, 0, 32, cudasim_file, cudasim_line);
}
inline unsigned __reduce_xor_sync(unsigned mask, unsigned v, CUDASIM_SITE) {
    return ::cudasim::warp_value_op(::cudasim::WOP_REDUCE_XOR, mask, v, 0, 32, cudasim_file, cudasim_line);
}
/* The lanes of this warp that have not exited (there is no divergence tracking). */
inline unsigned __activemask() { return ::cudasim::detail::active_mask(); }

/* ---- shared memory, loads and stores ------------------------------------------------------ */
namespace cudasim {
template <class T> struct same_type { typedef T type; };
}
/* Cache-hinted loads/stores are plain accesses; they check the alignment the GPU requires. */
#define CUDASIM_LOAD(name)                                                                        \
    template <class T> inline T name(const T *p, CUDASIM_SITE) {                                  \
        ::cudasim::detail::check_aligned(p, alignof(T), #name, cudasim_file, cudasim_line);       \
        return *p;                                                                                \
    }
CUDASIM_LOAD(__ldg)
CUDASIM_LOAD(__ldcg)
CUDASIM_LOAD(__ldca)
CUDASIM_LOAD(__ldcs)
CUDASIM_LOAD(__ldlu)
CUDASIM_LOAD(__ldcv)
#undef CUDASIM_LOAD
#define CUDASIM_STORE(name)                                                                       \
    template <class T>                                                                            \
    inline void name(T *p, typename ::cudasim::same_type<T>::type v, CUDASIM_SITE) {              \
        ::cudasim::detail::check_aligned(p, alignof(T), #name, cudasim_file, cudasim_line);       \
        *p = v;                                                                                   \
    }
CUDASIM_STORE(__stcg)
CUDASIM_STORE(__stcs)
CUDASIM_STORE(__stwb)
CUDASIM_STORE(__stwt)
#undef CUDASIM_STORE

/* ---- atomics: fibers never interleave inside one, so read-modify-write is exact ----------- */
#define CUDASIM_ATOMIC2(name, T, expr)                                                            \
    inline T name(T *addr, T val) {                                                               \
        T old = *addr;                                                                            \
        *addr = (expr);                                                                           \
        return old;                                                                               \
    }
#define CUDASIM_ATOMIC_INTS(name, expr)                                                           \
    CUDASIM_ATOMIC2(name, int, expr)                                                              \
    CUDASIM_ATOMIC2(name, unsigned int, expr)                                                     \
    CUDASIM_ATOMIC2(name, unsigned long long, expr)                                               \
    CUDASIM_ATOMIC2(name, long long, expr)
CUDASIM_ATOMIC_INTS(atomicAdd, old + val)
CUDASIM_ATOMIC2(atomicAdd, float, old + val)
CUDASIM_ATOMIC2(atomicAdd, double, old + val)
CUDASIM_ATOMIC2(atomicAdd, __half, __float2half(__half2float(old) + __half2float(val)))
CUDASIM_ATOMIC2(atomicAdd, __nv_bfloat16, __float2bfloat16(__bfloat162float(old) + __bfloat162float(val)))
CUDASIM_ATOMIC2(atomicAdd, __half2, __halves2half2(__float2half(__half2float(old.x) + __half2float(val.x)), __float2half(__half2float(old.y) + __half2float(val.y))))
CUDASIM_ATOMIC2(atomicAdd, __nv_bfloat162, __halves2bfloat162(__float2bfloat16(__bfloat162float(old.x) + __bfloat162float(val.x)), __float2bfloat16(__bfloat162float(old.y) + __bfloat162float(val.y))))
CUDASIM_ATOMIC2(atomicSub, int, old - val)
CUDASIM_ATOMIC2(atomicSub, unsigned int, old - val)
CUDASIM_ATOMIC_INTS(atomicExch, val)
CUDASIM_ATOMIC2(atomicExch, float, val)
CUDASIM_ATOMIC_INTS(atomicMax, old > val ? old : val)
CUDASIM_ATOMIC_INTS(atomicMin, old < val ? old : val)
CUDASIM_ATOMIC_INTS(atomicAnd, old & val)
CUDASIM_ATOMIC_INTS(atomicOr, old | val)
CUDASIM_ATOMIC_INTS(atomicXor, old ^ val)
CUDASIM_ATOMIC2(atomicInc, unsigned int, old >= val ? 0u : old + 1u)
CUDASIM_ATOMIC2(atomicDec, unsigned int, (old == 0u || old > val) ? val : old - 1u)
#undef CUDASIM_ATOMIC_INTS
#undef CUDASIM_ATOMIC2
#define CUDASIM_ATOMIC_CAS(T)                                                                     \
    inline T atomicCAS(T *addr, T compare, T val) {                                               \
        T old = *addr;                                                                            \
        if (old == compare) *addr = val;                                                          \
        return old;                                                                               \
    }
CUDASIM_ATOMIC_CAS(int)
CUDASIM_ATOMIC_CAS(unsigned int)
CUDASIM_ATOMIC_CAS(unsigned long long)
CUDASIM_ATOMIC_CAS(unsigned short)
#undef CUDASIM_ATOMIC_CAS

/* ---- math intrinsics: the fast (__xxx) forms are computed exactly, not approximated ------- */
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return exp10f(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline void __sincosf(float x, float *s, float *c) { *s = sinf(x), *c = cosf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float __frsqrt_rn(float a) { return 1.0f / sqrtf(a); }
inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
inline double rsqrt(double a) { return 1.0 / sqrt(a); }
inline float __saturatef(float a) { return a < 0.0f ? 0.0f : (a > 1.0f ? 1.0f : (a == a ? a : 0.0f)); }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float f) { int x; memcpy(&x, &f, 4); return x; }
inline float __uint_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned x; memcpy(&x, &f, 4); return x; }
inline double __longlong_as_double(long long x) { double d; memcpy(&d, &x, 8); return d; }
inline long long __double_as_longlong(double d) { long long x; memcpy(&x, &d, 8); return x; }
inline int __float2int_rn(float f) { return (int)nearbyintf(f); }
inline int __float2int_rz(float f) { return (int)f; }
inline int __float2int_rd(float f) { return (int)floorf(f); }
inline int __float2int_ru(float f) { return (int)ceilf(f); }
inline unsigned __float2uint_rn(float f) { return (unsigned)nearbyintf(f); }
inline float __int2float_rn(int i) { return (float)i; }
inline float __double2float_rn(double d) { return (float)d; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline int __mul24(int a, int b) { return (int)((long long)((a << 8) >> 8) * ((b << 8) >> 8)); }
inline long long clock64() {
    static long long ticks = 0;
    return ++ticks;
}

/* CUDA's host/device min/max overload set (non-templates, so std::min stays unambiguous). */
#define CUDASIM_MINMAX(A, B, R)                                                                   \
    inline R min(A a, B b) { return (R)a < (R)b ? (R)a : (R)b; }                                  \
    inline R max(A a, B b) { return (R)a > (R)b ? (R)a : (R)b; }
CUDASIM_MINMAX(int, int, int)
CUDASIM_MINMAX(unsigned int, unsigned int, unsigned int)
CUDASIM_MINMAX(int, unsigned int, unsigned int)
CUDASIM_MINMAX(unsigned int, int, unsigned int)
CUDASIM_MINMAX(long, long, long)
CUDASIM_MINMAX(unsigned long, unsigned long, unsigned long)
CUDASIM_MINMAX(long long, long long, long long)
CUDASIM_MINMAX(unsigned long long, unsigned long long, unsigned long long)
CUDASIM_MINMAX(long long, unsigned long long, unsigned long long)
CUDASIM_MINMAX(unsigned long long, long long, unsigned long long)
#undef CUDASIM_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline double min(float a, double b) { return fmin(a, b); }
inline double max(float a, double b) { return fmax(a, b); }
inline double min(double a, float b) { return fmin(a, b); }
inline double max(double a, float b) { return fmax(a, b); }

/* Aligned packed access, e.g. cudasim_load<float4>(ptr): checks alignment like the GPU would. */
template <class V, class T> inline V cudasim_load(const T *p, CUDASIM_SITE) {
    ::cudasim::detail::check_aligned(p, alignof(V), "packed load", cudasim_file, cudasim_line);
    V v;
    memcpy(&v, p, sizeof v);
    return v;
}

#endif /* CUDASIM_H */
