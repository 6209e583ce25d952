/* cast.cu - kernel lab for llmc/cuda/cast.cuh: checks cast_copy fp32 -> bf16/fp16 (round to
 * nearest even, including ties, subnormals, +-0, +-inf, NaN and overflow) and back (exact)
 * against the toolkit's host conversions, which are the reference (there is no llmc/cpu twin:
 * the CPU trainer has no 16-bit storage), then times each direction.
 * Usage: build/dev/cuda/cast [--small] [--n n] [--reps R]
 *   default n = 124475904 (the GPT-2 124M parameter count); --small: n = 100003. */
#include "dev/cuda/common_lab.h"
#include "llmc/cuda/cast.cuh"

/* Bit patterns that stress rounding, placed at the front of the input. */
static size_t special_values(float *x, size_t n) {
    const uint32_t bits[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, /* 0, -0, inf, -inf, NaN */
        0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu,             /* bf16 ties to even, just above/below a tie */
        0x3f801000u, 0x3f803000u, 0x3f801001u,                           /* fp16 ties */
        0x7f7fffffu, 0x477ff000u, 0x477fefffu, 0x47800000u,              /* max float (bf16 -> inf), fp16 overflow edge */
        0x00000001u, 0x00800000u, 0x33800000u, 0x33000001u, 0x387fc000u, /* subnormals, fp16 subnormal edge */
        0xc0490fdbu, 0x3eaaaaabu,                                        /* -pi, 1/3 */
    };
    size_t k = sizeof bits / sizeof bits[0];
    if (k > n) k = n;
    for (size_t i = 0; i < k; i++) memcpy(&x[i], &bits[i], 4);
    return k;
}

/* Bit-exact compare of a device array of U with the reference; any NaN matches any NaN (the
 * payload of a converted NaN is not part of the contract, and host and device differ there). */
template <class U> static void check_bits(const char *name, const U *d, const U *ref, size_t n) {
    U *got = (U *)mallocCheck(n * sizeof(U), "cast download");
    cudaCheck(cudaMemcpy(got, d, n * sizeof(U), cudaMemcpyDeviceToHost));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &ref[i], sizeof(U)) != 0 && !(isnan(to_float(got[i])) && isnan(to_float(ref[i]))) &&
            bad++ == 0)
            first = i;
    test_report(bad == 0, name, "%zu of %zu elements differ in their bits; first at [%zu]: got %.9g, want %.9g", bad, n,
                first, n ? (double)to_float(got[first]) : 0.0, n ? (double)to_float(ref[first]) : 0.0);
    free(got);
}

template <class T> static void lab_cast(const LabDevice *dev, const LabOptions *opt, const float *x, size_t n) {
    const char *tn = StorageInfo<T>::name;
    char name[128];
    float *d_x = lab_alloc<float>(n), *d_back = lab_alloc<float>(n);
    T *d_t = lab_alloc<T>(n);
    cudaCheck(cudaMemcpy(d_x, x, n * sizeof(float), cudaMemcpyHostToDevice));
    T *ref = (T *)mallocCheck(n * sizeof(T), "cast reference");
    float *back = lab_host_floats(n);
    for (size_t i = 0; i < n; i++) back[i] = to_float(ref[i] = from_float<T>(x[i])); /* host RNE */
    cast_copy(d_t, d_x, n, 0);
    snprintf(name, sizeof name, "cast_copy fp32 -> %s n=%zu (bit-exact)", tn, n);
    check_bits(name, d_t, ref, n);
    cast_copy(d_back, d_t, n, 0);
    snprintf(name, sizeof name, "cast_copy %s -> fp32 (bit-exact)", tn);
    check_bits(name, d_back, back, n);
    cast_copy(d_t, d_x, 0, 0); /* n = 0 is a no-op, not an error */
    float to = lab_time_ms([&] { cast_copy(d_t, d_x, n, 0); }, opt->reps);
    float from = lab_time_ms([&] { cast_copy(d_back, d_t, n, 0); }, opt->reps);
    const double bytes = (double)n * (4 + sizeof(T));
    snprintf(name, sizeof name, "cast_copy fp32 -> %s", tn);
    lab_report_bandwidth(dev, name, bytes, to);
    snprintf(name, sizeof name, "cast_copy %s -> fp32", tn);
    lab_report_bandwidth(dev, name, bytes, from);
    free(ref), free(back);
    lab_free(d_x, d_back, d_t);
}

int main(int argc, char **argv) {
    int n = 124475904;
    LabSize sizes[] = {{"n", &n, 100003, "elements"}};
    auto [dev, opt, r] =
        lab_begin(argc, argv, "Checks and times llmc/cuda/cast.cuh against the toolkit's host conversions.", sizes, 1, 6);
    float *x = lab_host_normal(&r, n, 0.0f, 1.0f);
    /* scales from 2^-30 to 2^30, and the special values up front */
    for (size_t i = 0; i < (size_t)n; i++) x[i] = ldexpf(x[i], (int)(rng_u32(&r) % 61) - 30);
    size_t k = special_values(x, n);
    printf("(%zu special bit patterns first, then normals scaled by 2^-30 .. 2^30)\n", k);
    lab_cast<__nv_bfloat16>(&dev, &opt, x, n);
    lab_cast<__half>(&dev, &opt, x, n);
    free(x);
    return test_exit_code();
}
