/*
 * cooperative_groups.h (cudasim shim) - the subset of CUDA cooperative groups that kernels in
 * this project use, built on cudasim's barrier and warp primitives. Shadows the toolkit header
 * because -I test/cudasim/include comes before the CUDA include directory.
 *   thread_block: this_thread_block(), sync(), thread_rank(), size()/num_threads(),
 *                 group_index(), thread_index(), dim_threads()
 *   thread_block_tile<N> (N = 1..32, power of two) from tiled_partition<N>(block):
 *                 sync(), thread_rank(), size()/num_threads(), meta_group_rank(),
 *                 meta_group_size(), shfl, shfl_up, shfl_down, shfl_xor, any, all, ballot
 * cg::reduce (cooperative_groups/reduce.h) combines with a shfl_xor butterfly, so every lane of
 * the tile gets a result; for float the summation order may differ from the hardware's.
 */
#ifndef CUDASIM_COOPERATIVE_GROUPS_H
#define CUDASIM_COOPERATIVE_GROUPS_H

#include "cudasim.h"

namespace cooperative_groups {

class thread_block {
  public:
    void sync(CUDASIM_SITE) const { __syncthreads(cudasim_file, cudasim_line); }
    unsigned long long thread_rank() const {
        return (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    }
    unsigned long long size() const { return (unsigned long long)blockDim.x * blockDim.y * blockDim.z; }
    unsigned long long num_threads() const { return size(); }
    dim3 group_index() const { return dim3(blockIdx.x, blockIdx.y, blockIdx.z); }
    dim3 thread_index() const { return dim3(threadIdx.x, threadIdx.y, threadIdx.z); }
    dim3 dim_threads() const { return blockDim; }
    dim3 group_dim() const { return blockDim; }
};

inline thread_block this_thread_block() { return thread_block(); }
inline void sync(const thread_block &g, CUDASIM_SITE) { g.sync(cudasim_file, cudasim_line); }

template <unsigned N, class Parent = void> class thread_block_tile {
    static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "tile size must be a power of two <= 32");

  public:
    thread_block_tile() = default;
    template <class Q> thread_block_tile(const thread_block_tile<N, Q> &) {}
    /* lanes of this tile within the warp */
    unsigned mask() const {
        unsigned lane = (unsigned)(rank_in_block() % 32);
        unsigned base = lane / N * N;
        return (N == 32 ? 0xffffffffu : ((1u << N) - 1u)) << base;
    }
    void sync(CUDASIM_SITE) const { __syncwarp(mask(), cudasim_file, cudasim_line); }
    unsigned long long thread_rank() const { return rank_in_block() % N; }
    unsigned long long size() const { return N; }
    unsigned long long num_threads() const { return N; }
    unsigned long long meta_group_rank() const { return rank_in_block() / N; }
    unsigned long long meta_group_size() const {
        unsigned long long t = (unsigned long long)blockDim.x * blockDim.y * blockDim.z;
        return (t + N - 1) / N;
    }
    template <class T> T shfl(T v, int src, CUDASIM_SITE) const {
        return __shfl_sync(mask(), v, src, N, cudasim_file, cudasim_line);
    }
    template <class T> T shfl_down(T v, unsigned d, CUDASIM_SITE) const {
        return __shfl_down_sync(mask(), v, d, N, cudasim_file, cudasim_line);
    }
    template <class T> T shfl_up(T v, unsigned d, CUDASIM_SITE) const {
        return __shfl_up_sync(mask(), v, d, N, cudasim_file, cudasim_line);
    }
    template <class T> T shfl_xor(T v, unsigned m, CUDASIM_SITE) const {
        return __shfl_xor_sync(mask(), v, (int)m, N, cudasim_file, cudasim_line);
    }
    int any(int p, CUDASIM_SITE) const { return __any_sync(mask(), p, cudasim_file, cudasim_line); }
    int all(int p, CUDASIM_SITE) const { return __all_sync(mask(), p, cudasim_file, cudasim_line); }
    unsigned ballot(int p, CUDASIM_SITE) const {
        unsigned lane = (unsigned)(rank_in_block() % 32);
        return __ballot_sync(mask(), p, cudasim_file, cudasim_line) >> (lane / N * N);
    }

  private:
    static unsigned long long rank_in_block() {
        return (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    }
};

template <unsigned N> thread_block_tile<N, thread_block> tiled_partition(const thread_block &) {
    return thread_block_tile<N, thread_block>();
}
template <unsigned N, class P> inline void sync(const thread_block_tile<N, P> &g, CUDASIM_SITE) {
    g.sync(cudasim_file, cudasim_line);
}

} // namespace cooperative_groups

#endif
