/*
 * dtype.h - number formats shared by files, optimizer states and kernels: fp32 <-> bf16. One
 * __host__ __device__ implementation (LLMC_HD) for the model and HF files (llmc/formats/),
 * the compact AdamW states (optstate.h) and the CUDA kernels that include it.
 *
 * bf16 is fp32's top 16 bits: encoding rounds to nearest, ties to even; a NaN stays a quiet NaN;
 * decoding is exact.
 */
#ifndef LLMC_CORE_DTYPE_H
#define LLMC_CORE_DTYPE_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define LLMC_HD __host__ __device__
#else
#define LLMC_HD
#endif

/* The bits of a float and back (memcpy: host and device alike). */
LLMC_HD static inline uint32_t float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
LLMC_HD static inline float bits_float(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

LLMC_HD static inline uint16_t float_to_bf16(float x) {
    uint32_t u = float_bits(x);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu)) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}
LLMC_HD static inline float bf16_to_float(uint16_t b) { return bits_float((uint32_t)b << 16); }

#endif
