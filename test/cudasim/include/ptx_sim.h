/*
 * ptx_sim.h (cudasim) - the PTX instructions llmc/cuda/ptx.cuh wraps, emulated lane by lane from
 * the fragment layouts of NVIDIA's PTX ISA, so a kernel written against the real register
 * layouts computes the same values here (and a wrong fragment index computes wrong ones).
 *
 *   mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32   (D = A B + C)
 *     groupID g = lane / 4, threadID_in_group t = lane % 4; a .b32 register holds 2 halves, the
 *     lower column (or row, for B) in the low 16 bits.
 *     A (16 x 16, 4 regs): a0 (row g, cols 2t, 2t+1), a1 (row g+8, same cols),
 *                          a2 (row g, cols 2t+8, 2t+9), a3 (row g+8, cols 2t+8, 2t+9)
 *     B (16 x 8, 2 regs):  b0 (rows 2t, 2t+1, col g), b1 (rows 2t+8, 2t+9, col g)
 *     C, D (16 x 8, 4 f32): c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8, same cols)
 *     Products of 16-bit values are exact in fp32; the sum runs in k order in fp32 (the tensor
 *     cores' order and rounding are unspecified: agreement with a GPU is to fp32 rounding).
 *   ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16
 *     lane i supplies the (16-byte aligned) address of row i % 8 of matrix i / 8 (lanes past the
 *     matrices used are ignored); register j of lane l receives matrix j's row l / 4, columns
 *     2 (l % 4) and 2 (l % 4) + 1 - or with .trans, column l / 4 of rows 2 (l % 4), 2 (l % 4) + 1.
 *     All rows are read when the last lane arrives, before any lane continues (.sync.aligned).
 *   cp.async.cg.shared.global [dst], [src], 16; cp.async.commit_group; cp.async.wait_group N
 *     the source is read at issue; the 16 bytes land in shared memory only when the issuing
 *     thread's wait_group retires their group (runtime.cpp keeps a queue per thread), so a read
 *     before the wait sees the old contents. Both addresses must be 16-byte aligned and the
 *     destination in the block's shared memory; a thread that exits with copies pending is
 *     reported.
 * The warp-wide instructions need all 32 lanes at the same instruction (a partial or divergent
 * warp is reported, as for wmma).
 */
#ifndef CUDASIM_PTX_SIM_H
#define CUDASIM_PTX_SIM_H

#include "cudasim.h"

namespace cudasim {
namespace ptx {

inline float half_bits_to_float(unsigned short h, bool bf16) {
    if (bf16) {
        __nv_bfloat16_raw r;
        r.x = h;
        return __bfloat162float(__nv_bfloat16(r));
    }
    __half_raw r;
    r.x = h;
    return __half2float(__half(r));
}
/* element `hi` (0: low 16 bits, 1: high) of a .b32 register */
inline float elem(unsigned reg, int hi, bool bf16) { return half_bits_to_float((unsigned short)(reg >> (16 * hi)), bf16); }

struct MmaLane {
    unsigned a[4], b[2];
    float c[4], d[4];
};

template <bool BF16> inline void mma_m16n8k16_all(void *const *ctx) {
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        const MmaLane &x = *static_cast<const MmaLane *>(ctx[l]);
        const int g = l / 4, t = l % 4;
        for (int e = 0; e < 2; e++) {
            A[g][2 * t + e] = elem(x.a[0], e, BF16);
            A[g + 8][2 * t + e] = elem(x.a[1], e, BF16);
            A[g][2 * t + 8 + e] = elem(x.a[2], e, BF16);
            A[g + 8][2 * t + 8 + e] = elem(x.a[3], e, BF16);
            B[2 * t + e][g] = elem(x.b[0], e, BF16);
            B[2 * t + 8 + e][g] = elem(x.b[1], e, BF16);
        }
    }
    for (int l = 0; l < 32; l++) {
        MmaLane &x = *static_cast<MmaLane *>(ctx[l]);
        const int g = l / 4, t = l % 4;
        for (int i = 0; i < 4; i++) {
            const int row = g + (i / 2) * 8, col = 2 * t + i % 2;
            float acc = x.c[i];
            for (int k = 0; k < 16; k++) acc = fmaf(A[row][k], B[k][col], acc);
            x.d[i] = acc;
        }
    }
}

/* d = a b + c for one warp; T is __nv_bfloat16 or __half */
template <class T>
inline void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], const float (&c)[4],
                         CUDASIM_SITE) {
    static_assert(std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value,
                  "mma.m16n8k16 multiplies bf16 or f16");
    MmaLane x;
    memcpy(x.a, a, sizeof x.a), memcpy(x.b, b, sizeof x.b), memcpy(x.c, c, sizeof x.c);
    detail::warp_collective(std::is_same<T, __half>::value ? "mma.sync.m16n8k16.f32.f16" : "mma.sync.m16n8k16.f32.bf16",
                            &mma_m16n8k16_all<std::is_same<T, __nv_bfloat16>::value>, &x, cudasim_file, cudasim_line);
    memcpy(d, x.d, sizeof x.d);
}

struct LdmLane {
    const unsigned char *row;
    unsigned r[4];
    const char *file;
    int line;
};

template <int N, bool TRANS> inline void ldmatrix_all(void *const *ctx) {
    for (int l = 0; l < 32; l++) {
        LdmLane &x = *static_cast<LdmLane *>(ctx[l]);
        for (int j = 0; j < N; j++) {
            unsigned short lo, hi;
            if (!TRANS) { /* row l/4 of matrix j, columns 2(l%4), 2(l%4)+1 */
                const unsigned char *p = static_cast<LdmLane *>(ctx[j * 8 + l / 4])->row + (l % 4) * 4;
                memcpy(&lo, p, 2), memcpy(&hi, p + 2, 2);
            } else { /* column l/4 of rows 2(l%4) and 2(l%4)+1 */
                const unsigned char *r0 = static_cast<LdmLane *>(ctx[j * 8 + 2 * (l % 4)])->row;
                const unsigned char *r1 = static_cast<LdmLane *>(ctx[j * 8 + 2 * (l % 4) + 1])->row;
                memcpy(&lo, r0 + (l / 4) * 2, 2), memcpy(&hi, r1 + (l / 4) * 2, 2);
            }
            x.r[j] = (unsigned)lo | (unsigned)hi << 16;
        }
    }
}

/* N = 1, 2 or 4 8x8 matrices of 16-bit elements; row: this lane's row address (lanes < 8N) */
template <int N, bool TRANS> inline void ldmatrix(unsigned (&r)[N], const void *row, CUDASIM_SITE) {
    static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
    const int lane = (int)(((threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x) % 32);
    if (lane < 8 * N) detail::check_aligned(row, 16, "ldmatrix row address", cudasim_file, cudasim_line);
    LdmLane x;
    x.row = static_cast<const unsigned char *>(row), x.file = cudasim_file, x.line = cudasim_line;
    static const char *names[2][3] = {{"ldmatrix.m8n8.x1", "ldmatrix.m8n8.x2", "ldmatrix.m8n8.x4"},
                                      {"ldmatrix.m8n8.x1.trans", "ldmatrix.m8n8.x2.trans", "ldmatrix.m8n8.x4.trans"}};
    detail::warp_collective(names[TRANS][N == 1 ? 0 : N == 2 ? 1 : 2], &ldmatrix_all<N, TRANS>, &x, cudasim_file,
                            cudasim_line);
    for (int j = 0; j < N; j++) r[j] = x.r[j];
}

} // namespace ptx
} // namespace cudasim

#endif /* CUDASIM_PTX_SIM_H */
