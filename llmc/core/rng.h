/* rng.h - small deterministic random numbers (no global state).
 * xorshift64* for the stream; splitmix64 to derive independent seeds; Box-Muller normals. */
#ifndef LLMC_RNG_H
#define LLMC_RNG_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
typedef struct {
    uint64_t state;
} Rng;
uint64_t splitmix64(uint64_t x);
void rng_seed(Rng *r, uint64_t seed);           /* any seed, including 0 */
uint32_t rng_u32(Rng *r);
float rng_f32(Rng *r);                          /* uniform in [0, 1) */
void rng_normal(Rng *r, float *out, size_t n, float mean, float std);
#ifdef __cplusplus
}
#endif
#endif
