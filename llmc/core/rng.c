#include "llmc/core/rng.h"

#include <math.h>

uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

void rng_seed(Rng *r, uint64_t seed) {
    r->state = splitmix64(seed);
    if (r->state == 0) r->state = 0x9E3779B97F4A7C15ull; /* xorshift must not start at 0 */
}

uint32_t rng_u32(Rng *r) {
    r->state ^= r->state >> 12;
    r->state ^= r->state << 25;
    r->state ^= r->state >> 27;
    return (uint32_t)((r->state * 0x2545F4914F6CDD1Dull) >> 32);
}

float rng_f32(Rng *r) { return (rng_u32(r) >> 8) / 16777216.0f; }

void rng_normal(Rng *r, float *out, size_t n, float mean, float std) {
    const double two_pi = 6.283185307179586;
    for (size_t i = 0; i < n; i += 2) {
        double u1 = (rng_u32(r) + 1.0) / 4294967297.0; /* (0, 1]: log is finite */
        double u2 = rng_u32(r) / 4294967296.0;
        double radius = sqrt(-2.0 * log(u1));
        out[i] = (float)(mean + std * radius * cos(two_pi * u2));
        if (i + 1 < n) out[i + 1] = (float)(mean + std * radius * sin(two_pi * u2));
    }
}
