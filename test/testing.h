/*
 * testing.h - the tiny reporting protocol every C test binary uses.
 *
 * Each check prints "PASS: name" or "FAIL: name: reason"; test_exit_code() is what main
 * returns: non-zero if anything failed. test/run_tests.sh counts these lines.
 * Comparisons use |a - b| <= atol + rtol * |b| (b = the reference); NaN/Inf always fail.
 */
#ifndef LLMC_TESTING_H
#define LLMC_TESTING_H

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

static int test_failures = 0;
static int test_passes = 0;

static inline void test_report(int ok, const char *name, const char *fmt, ...) {
    if (ok) {
        printf("PASS: %s\n", name);
        test_passes++;
        return;
    }
    printf("FAIL: %s: ", name);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    if (getenv("LLMC_TEST_FAIL_FAST")) exit(1); /* a planted bug's first failure is enough */
    test_failures++;
}

/* Compares n floats; reports one PASS/FAIL line for the whole tensor with the worst element. */
static inline int test_close(const char *name, const float *got, const float *ref, size_t n,
                      double atol, double rtol) {
    size_t worst = 0, bad = 0;
    double worst_excess = -1.0, max_abs = 0.0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i], d = fabs(g - r);
        double tol = atol + rtol * fabs(r);
        if (!isfinite(g) || !isfinite(r)) d = INFINITY;
        if (d > max_abs) max_abs = d;
        if (d > tol) bad++;
        if (d - tol > worst_excess) worst_excess = d - tol, worst = i;
    }
    test_report(bad == 0, name,
                "%zu of %zu elements out of tolerance (atol %g, rtol %g); worst at [%zu]: got %.9g, ref %.9g",
                bad, n, atol, rtol, worst, n ? got[worst] : 0.0, n ? ref[worst] : 0.0);
    if (bad == 0) printf("      (%zu elements, max |diff| %.3g)\n", n, max_abs);
    return bad == 0;
}

static inline int test_exit_code(void) {
    printf("(checks: %d ok, %d not ok)\n", test_passes, test_failures);
    return test_failures ? 1 : 0;
}

#endif
