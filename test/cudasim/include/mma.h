/*
 * mma.h (cudasim shim) - CUDA's warp matrix API (nvcuda::wmma) for the shapes and types this
 * project uses: m16n16k16 with __half or __nv_bfloat16 inputs and a float accumulator.
 * Shadows the toolkit header because -I test/cudasim/include comes before the CUDA include
 * directory.
 *
 * On the GPU a fragment is spread over the 32 lanes of a warp in an unspecified layout; code
 * that is correct for every layout only fills, loads, stores, multiplies, and applies the same
 * operation to every element x[i]. Here every lane holds the whole matrix (num_elements is the
 * matrix size, elements in row-major order), which is one of the layouts such code must accept.
 *
 * Semantics that match the hardware's contract and what they catch:
 *   - load_matrix_sync / store_matrix_sync need a 256-bit aligned pointer and a leading
 *     dimension that is a multiple of 16 bytes; anything else is reported (the GPU faults or
 *     returns garbage).
 *   - the calls do not synchronise the warp. A lane loads the whole matrix when it reaches the
 *     call, and stores only its share of the elements (those with index % 32 == lane), so a
 *     missing __syncwarp() between lanes writing shared memory and a load, or between a store
 *     and lanes reading the stored elements, reads stale data and fails the test instead of
 *     passing by luck.
 *   - mma_sync: d = a * b + c with fp32 accumulation in k order (products of 16-bit values are
 *     exact in fp32). The tensor cores' internal summation order and rounding are unspecified,
 *     so results agree with a GPU to fp32 rounding, not bit for bit.
 *   - blocks whose size is not a multiple of 32 are reported (warp-wide calls need full warps).
 */
#ifndef CUDASIM_MMA_H
#define CUDASIM_MMA_H

#include "cudasim.h"

namespace nvcuda {
namespace wmma {

struct row_major;
struct col_major;
struct matrix_a;
struct matrix_b;
struct accumulator;
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
template <class Use, int M, int N, int K> struct dims;
template <int M, int N, int K> struct dims<matrix_a, M, N, K> { static constexpr int rows = M, cols = K; };
template <int M, int N, int K> struct dims<matrix_b, M, N, K> { static constexpr int rows = K, cols = N; };
template <int M, int N, int K> struct dims<accumulator, M, N, K> { static constexpr int rows = M, cols = N; };

template <class T> inline float to_f(T v) { return static_cast<float>(v); }
template <> inline float to_f<__half>(__half v) { return __half2float(v); }
template <> inline float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

inline void check_warp_call(const char *what, const void *p, size_t elem, unsigned ldm, const char *file, int line) {
    unsigned threads = blockDim.x * blockDim.y * blockDim.z;
    if (threads % 32)
        ::cudasim::detail::device_error(file, line, "%s in a block of %u threads: warp-wide matrix calls need whole warps",
                                        what, threads);
    ::cudasim::detail::check_aligned(p, 32, what, file, line);
    if ((ldm * elem) % 16)
        ::cudasim::detail::device_error(file, line, "%s: leading dimension %u elements of %zu bytes is not a multiple "
                                        "of 16 bytes", what, ldm, elem);
}
inline unsigned lane() {
    return ((threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x) % 32;
}
} // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void> class fragment {
    static_assert(M == 16 && N == 16 && K == 16, "cudasim's wmma supports m16n16k16 only");

  public:
    typedef T element_type;
    typedef T storage_element_type;
    static constexpr int rows = detail::dims<Use, M, N, K>::rows, cols = detail::dims<Use, M, N, K>::cols;
    static constexpr int num_elements = rows * cols;
    T x[num_elements]; /* row-major, the whole matrix in every lane */
};

template <class Use, int M, int N, int K, class T, class L>
inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, const T &v) {
    for (int i = 0; i < f.num_elements; i++) f.x[i] = v;
}

/* matrix_a / matrix_b: the layout is part of the fragment type. */
template <class Use, int M, int N, int K, class T, class L>
inline void load_matrix_sync(fragment<Use, M, N, K, T, L> &f, const T *p, unsigned ldm, CUDASIM_SITE) {
    static_assert(std::is_same<L, row_major>::value || std::is_same<L, col_major>::value,
                  "matrix_a/matrix_b fragments name row_major or col_major");
    detail::check_warp_call("wmma::load_matrix_sync", p, sizeof(T), ldm, cudasim_file, cudasim_line);
    const bool row = std::is_same<L, row_major>::value;
    for (int r = 0; r < f.rows; r++)
        for (int c = 0; c < f.cols; c++) f.x[r * f.cols + c] = row ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
}

/* accumulator: the layout is an argument. */
template <int M, int N, int K>
inline void load_matrix_sync(fragment<accumulator, M, N, K, float> &f, const float *p, unsigned ldm, layout_t layout,
                             CUDASIM_SITE) {
    detail::check_warp_call("wmma::load_matrix_sync", p, sizeof(float), ldm, cudasim_file, cudasim_line);
    for (int r = 0; r < f.rows; r++)
        for (int c = 0; c < f.cols; c++)
            f.x[r * f.cols + c] = layout == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
}

template <int M, int N, int K>
inline void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float> &f, unsigned ldm, layout_t layout,
                              CUDASIM_SITE) {
    detail::check_warp_call("wmma::store_matrix_sync", p, sizeof(float), ldm, cudasim_file, cudasim_line);
    for (int i = (int)detail::lane(); i < f.num_elements; i += 32) {
        int r = i / f.cols, c = i % f.cols;
        (layout == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]) = f.x[i];
    }
}

template <int M, int N, int K, class TA, class LA, class TB, class LB>
inline void mma_sync(fragment<accumulator, M, N, K, float> &d, const fragment<matrix_a, M, N, K, TA, LA> &a,
                     const fragment<matrix_b, M, N, K, TB, LB> &b, const fragment<accumulator, M, N, K, float> &c,
                     bool satf = false) {
    static_assert(std::is_same<TA, TB>::value, "wmma::mma_sync: a and b must have the same element type");
    static_assert(std::is_same<TA, __half>::value || std::is_same<TA, __nv_bfloat16>::value,
                  "cudasim's wmma multiplies __half or __nv_bfloat16 fragments");
    (void)satf;
    float out[M * N];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = c.x[i * N + j];
            for (int k = 0; k < K; k++) acc = fmaf(detail::to_f(a.x[i * K + k]), detail::to_f(b.x[k * N + j]), acc);
            out[i * N + j] = acc;
        }
    for (int i = 0; i < M * N; i++) d.x[i] = out[i];
}

} // namespace wmma
} // namespace nvcuda

#endif /* CUDASIM_MMA_H */
