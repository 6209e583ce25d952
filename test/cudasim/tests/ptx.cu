// ptx.cu - hand-worked tests of the PTX instructions llmc/cuda/ptx.cuh wraps (cudasim emulates
// them in include/ptx_sim.h). Each expectation below is written from the PTX ISA's fragment
// tables, independently of the emulation: groupID g = lane / 4, threadID_in_group t = lane % 4.
// Plain CUDA: `make cudasim-nvcc-check` compiles it with nvcc -arch=sm_90 as well.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/cuda/ptx.cuh"
#include "test/testing.h"

// ---- mma.m16n8k16: one warp; A (16x16) and B (16x8) come in row-major from global memory and
// are put into registers by the documented layout; D (4 floats per lane) goes out per lane.
template <class T>
__global__ void mma_kernel(float *d, const unsigned short *a, const unsigned short *b, const float *c) {
    const int l = threadIdx.x, g = l / 4, t = l % 4;
    auto A = [&](int r, int k) { return (unsigned)a[r * 16 + k] | (unsigned)a[r * 16 + k + 1] << 16; };
    auto B = [&](int k, int n) { return (unsigned)b[k * 8 + n] | (unsigned)b[(k + 1) * 8 + n] << 16; };
    unsigned ra[4] = {A(g, 2 * t), A(g + 8, 2 * t), A(g, 2 * t + 8), A(g + 8, 2 * t + 8)};
    unsigned rb[2] = {B(2 * t, g), B(2 * t + 8, g)};
    float acc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
    ptx_mma_m16n8k16<T>(acc, ra, rb);
    for (int i = 0; i < 4; i++) d[l * 4 + i] = acc[i];
}

template <class T> static unsigned short bits(float v) {
    unsigned short u;
    if constexpr (std::is_same<T, __half>::value) {
        __half h = __float2half(v);
        memcpy(&u, &h, 2);
    } else {
        __nv_bfloat16 h = __float2bfloat16(v);
        memcpy(&u, &h, 2);
    }
    return u;
}

template <class T> static void test_mma(const char *tn) {
    unsigned short *a, *b;
    float *c, *d;
    cudaMallocManaged(&a, 256 * 2), cudaMallocManaged(&b, 128 * 2), cudaMallocManaged(&c, 128 * 4);
    cudaMallocManaged(&d, 128 * 4);
    char name[160];
    // A = identity, B[k][n] = 8k + n, C = 1000: D[r][n] = 8r + n + 1000 (all exact). Lane l's
    // d[i] is row g + 8 (i / 2), column 2t + i % 2.
    for (int r = 0; r < 16; r++)
        for (int k = 0; k < 16; k++) a[r * 16 + k] = bits<T>(r == k ? 1.0f : 0.0f);
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 8; n++) b[k * 8 + n] = bits<T>((float)(8 * k + n));
    for (int i = 0; i < 128; i++) c[i] = 1000.0f;
    mma_kernel<T><<<1, 32>>>(d, a, b, c);
    cudaDeviceSynchronize();
    int bad = 0;
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < 4; i++) {
            int row = l / 4 + 8 * (i / 2), col = 2 * (l % 4) + i % 2;
            if (d[l * 4 + i] != (float)(8 * row + col + 1000)) bad++;
        }
    snprintf(name, sizeof name, "mma.m16n8k16 %s: I * B + 1000 lands row g+8(i/2), col 2t+i%%2 in every lane", tn);
    test_report(bad == 0, name, "%d of 128 accumulator elements wrong", bad);
    // single 1s: A[r][k] = 1, B[k][n] = 1 (every k, r, n in a sweep): D is 1 at (r, n) only
    bad = 0;
    for (int i = 0; i < 128; i++) c[i] = 0.0f;
    const int picks[][3] = {{0, 0, 0}, {3, 9, 5}, {8, 1, 7}, {15, 15, 2}, {10, 6, 1}, {7, 12, 6}};
    for (const auto &p : picks) {
        for (int i = 0; i < 256; i++) a[i] = bits<T>(0.0f);
        for (int i = 0; i < 128; i++) b[i] = bits<T>(0.0f);
        a[p[0] * 16 + p[1]] = bits<T>(1.0f), b[p[1] * 8 + p[2]] = bits<T>(1.0f);
        mma_kernel<T><<<1, 32>>>(d, a, b, c);
        cudaDeviceSynchronize();
        for (int l = 0; l < 32; l++)
            for (int i = 0; i < 4; i++) {
                int row = l / 4 + 8 * (i / 2), col = 2 * (l % 4) + i % 2;
                if (d[l * 4 + i] != (row == p[0] && col == p[2] ? 1.0f : 0.0f)) bad++;
            }
    }
    snprintf(name, sizeof name, "mma.m16n8k16 %s: single 1s in A (r,k) and B (k,n) give D = 1 at (r,n) only", tn);
    test_report(bad == 0, name, "%d wrong elements over 6 placements", bad);
    // a general product against the host: D = A B + C, small integers (exact)
    float ref[128];
    for (int i = 0; i < 256; i++) a[i] = bits<T>((float)((i * 7) % 5 - 2));
    for (int i = 0; i < 128; i++) b[i] = bits<T>((float)((i * 3) % 7 - 3)), c[i] = (float)(i % 9);
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            float s = c[r * 8 + n];
            for (int k = 0; k < 16; k++) s += (float)((r * 16 + k) * 7 % 5 - 2) * (float)((k * 8 + n) * 3 % 7 - 3);
            ref[r * 8 + n] = s;
        }
    mma_kernel<T><<<1, 32>>>(d, a, b, c);
    cudaDeviceSynchronize();
    bad = 0;
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < 4; i++)
            if (d[l * 4 + i] != ref[(l / 4 + 8 * (i / 2)) * 8 + 2 * (l % 4) + i % 2]) bad++;
    snprintf(name, sizeof name, "mma.m16n8k16 %s: integer A B + C equals the host's", tn);
    test_report(bad == 0, name, "%d of 128 wrong", bad);
    cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(d);
}

// ---- ldmatrix: 4 matrices of 8x8 16-bit values m*64 + 8r + c in shared memory (row stride 24
// elements = 48 bytes: 16-byte aligned rows, not contiguous); lane i points at row i%8 of
// matrix i/8, except that the row order within each matrix is reversed when `rev` (the address
// decides, not the lane).
template <int N, bool TRANS> __global__ void ldmatrix_kernel(unsigned *out, int rev) {
    __shared__ __align__(16) unsigned short s[4 * 8 * 24];
    for (int i = threadIdx.x; i < 4 * 8 * 24; i += 32) {
        int m = i / 192, r = i % 192 / 24, c = i % 24;
        s[i] = c < 8 ? (unsigned short)(m * 64 + 8 * r + c) : 0xFFFF;
    }
    __syncthreads();
    const int l = threadIdx.x, m = (l / 8) % N, r = rev ? 7 - l % 8 : l % 8;
    unsigned reg[N];
    ptx_ldmatrix<N, TRANS>(reg, s + (m * 8 + r) * 24);
    for (int j = 0; j < N; j++) out[l * 4 + j] = reg[j];
}

template <int N, bool TRANS> static void test_ldmatrix() {
    unsigned *out;
    cudaMallocManaged(&out, 32 * 4 * 4);
    for (int rev = 0; rev < 2; rev++) {
        ldmatrix_kernel<N, TRANS><<<1, 32>>>(out, rev);
        cudaDeviceSynchronize();
        int bad = 0;
        for (int l = 0; l < 32; l++)
            for (int j = 0; j < N; j++) {
                // matrix j's element (row, col) is j*64 + 8 row' + col, row' the stored row that
                // lane j*8 + row pointed at
                auto at = [&](int row, int col) { return (unsigned)(j * 64 + 8 * (rev ? 7 - row : row) + col); };
                unsigned lo = TRANS ? at(2 * (l % 4), l / 4) : at(l / 4, 2 * (l % 4));
                unsigned hi = TRANS ? at(2 * (l % 4) + 1, l / 4) : at(l / 4, 2 * (l % 4) + 1);
                if (out[l * 4 + j] != (lo | hi << 16)) bad++;
            }
        char name[160];
        snprintf(name, sizeof name, "ldmatrix.x%d%s%s: lane l reg j holds matrix j's %s", N, TRANS ? ".trans" : "",
                 rev ? " (rows given in reverse)" : "",
                 TRANS ? "column l/4, rows 2(l%4) and 2(l%4)+1" : "row l/4, columns 2(l%4) and 2(l%4)+1");
        test_report(bad == 0, name, "%d of %d registers wrong", bad, 32 * N);
    }
    cudaFree(out);
}

// ---- cp.async: data lands at the wait that retires its group, not at issue.
// obs[tid*7 + ...]: slot 0 before any wait, after wait_group 1 (slot 0, slot 1), after
// wait_group 0 (slot 1), an uncommitted copy after wait_group 0, then after commit + wait 0;
// a copy followed by an empty group, after wait_group 1 (empty groups count).
__global__ void cp_async_kernel(int *obs, const int4 *src) {
    __shared__ int4 s[3 * 32];
    const int i = threadIdx.x;
    s[i] = s[32 + i] = s[64 + i] = make_int4(-1, -1, -1, -1);
    ptx_cp_async16(&s[i], &src[i]);
    obs[i * 7 + 0] = s[i].x; /* -1: not landed */
    ptx_cp_async_commit();
    ptx_cp_async16(&s[32 + i], &src[32 + i]);
    ptx_cp_async_commit();
    ptx_cp_async_wait<1>();
    obs[i * 7 + 1] = s[i].x;      /* group 0 landed */
    obs[i * 7 + 2] = s[32 + i].x; /* group 1 still pending: -1 */
    ptx_cp_async_wait<0>();
    obs[i * 7 + 3] = s[32 + i].w;
    ptx_cp_async16(&s[64 + i], &src[64 + i]);
    ptx_cp_async_wait<0>();
    obs[i * 7 + 4] = s[64 + i].x; /* never committed: still -1 */
    ptx_cp_async_commit();
    ptx_cp_async_wait<0>();
    obs[i * 7 + 5] = s[64 + i].y;
    s[i] = make_int4(-1, -1, -1, -1);
    ptx_cp_async16(&s[i], &src[i]);
    ptx_cp_async_commit();
    ptx_cp_async_commit(); /* an empty group: wait_group 1 may leave only it pending */
    ptx_cp_async_wait<1>();
    obs[i * 7 + 6] = s[i].z;
}

static void test_cp_async() {
    int4 *src;
    int *obs;
    cudaMallocManaged(&src, 96 * sizeof(int4)), cudaMallocManaged(&obs, 32 * 7 * 4);
    for (int i = 0; i < 96; i++) src[i] = make_int4(100 + i, 200 + i, 300 + i, 400 + i);
    cp_async_kernel<<<1, 32>>>(obs, src);
    cudaDeviceSynchronize();
    int bad = 0;
    for (int i = 0; i < 32; i++) {
        const int want[6] = {-1, 100 + i, -1, 400 + 32 + i, -1, 200 + 64 + i};
        for (int k = 0; k < 6; k++) bad += obs[i * 7 + k] != want[k];
    }
    test_report(bad == 0, "cp.async: data lands at the wait_group retiring its group (not at issue; uncommitted copies wait for a commit; empty groups count)",
                "%d of 224 observations wrong", bad);
    cudaFree(src), cudaFree(obs);
}

int main() {
    test_mma<__nv_bfloat16>("bf16");
    test_mma<__half>("f16");
    test_ldmatrix<1, false>();
    test_ldmatrix<2, false>();
    test_ldmatrix<4, false>();
    test_ldmatrix<1, true>();
    test_ldmatrix<2, true>();
    test_ldmatrix<4, true>();
    test_cp_async();
    return test_exit_code();
}
