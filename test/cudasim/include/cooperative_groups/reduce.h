/* cooperative_groups/reduce.h (cudasim shim) - cg::reduce with cg::plus/less/greater/bit ops.
 * reduce(tile, v, op): log2(N) shfl_xor steps; every lane of the tile returns the result. */
#ifndef CUDASIM_COOPERATIVE_GROUPS_REDUCE_H
#define CUDASIM_COOPERATIVE_GROUPS_REDUCE_H

#include "test/cudasim/include/cooperative_groups.h"

namespace cooperative_groups {

template <class T> struct plus { T operator()(T a, T b) const { return a + b; } };
template <class T> struct less { T operator()(T a, T b) const { return b < a ? b : a; } };
template <class T> struct greater { T operator()(T a, T b) const { return a < b ? b : a; } };
template <class T> struct bit_and { T operator()(T a, T b) const { return a & b; } };
template <class T> struct bit_or { T operator()(T a, T b) const { return a | b; } };
template <class T> struct bit_xor { T operator()(T a, T b) const { return a ^ b; } };

template <unsigned N, class P, class T, class Op>
T reduce(const thread_block_tile<N, P> &g, T v, Op op, CUDASIM_SITE) {
    for (unsigned m = N / 2; m > 0; m /= 2) v = op(v, g.shfl_xor(v, m, cudasim_file, cudasim_line));
    return v;
}

} // namespace cooperative_groups

#endif
