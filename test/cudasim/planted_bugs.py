#!/usr/bin/env python3
"""planted_bugs.py BINARY - runs each planted bug of tests/planted.cu in a child process and
checks that cudasim stopped it: exit status CUDASIM_ERROR_EXIT (70) and a report naming the
kernel, block and (where the bug is a thread's) thread. A check PASSES when the bug is caught."""
import re
import subprocess
import sys

ERROR_EXIT = 70
# mode -> regexes the report must contain
CASES = {
    "early_return_barrier": [r"kernel 'early_return_barrier_kernel'", r"block \(0,0,0\) thread \(5,0,0\)",
                             r"returned from the kernel while thread \(0,0,0\) waits at __syncthreads"],
    "divergent_barrier": [r"kernel 'divergent_barrier_kernel'", r"thread \(16,0,0\)", r"divergent barriers",
                          r"planted\.cu:\d+"],
    "shfl_exited_lane": [r"kernel 'shfl_exited_lane_kernel'", r"thread \(\d+,0,0\)", r"names lane 7",
                         r"returned from the kernel"],
    "shfl_partial_warp": [r"kernel 'shfl_partial_warp_kernel'", r"thread \(32,0,0\) \[warp 1 lane 0\]",
                          r"do not exist: the block has 48 threads"],
    "shfl_mismatch": [r"kernel 'shfl_mismatch_kernel'", r"thread \(\d+,0,0\)", r"__shfl_xor_sync",
                      r"__ballot_sync"],
    "barrier_vs_shuffle": [r"kernel 'barrier_vs_shuffle_deadlock_kernel'", r"deadlock",
                           r"thread \(1,0,0\) \[warp 0 lane 1\] waits at __shfl_sync",
                           r"lane 0 named in the mask waits at __syncthreads"],
    "shared_oob": [r"kernel 'shared_oob_kernel'", r"block \(0,0,0\) thread \(31,0,0\)",
                   r"past the end of buf \(planted\.cu:\d+\)"],
    "global_oob_write": [r"kernel 'global_oob_write_kernel'", r"block \(2,0,0\) thread \(0,0,0\)",
                         r"out-of-bounds write", r"0 bytes past the end of a 256-byte cudaMalloc"],
    "global_oob_write_canary": [r"kernel 'global_oob_write_kernel'", r"written out of bounds",
                                r"byte 0 past the end of the 40-byte cudaMalloc"],
    "global_oob_read": [r"kernel 'global_oob_read_kernel'", r"block \(1,0,0\) thread \(31,0,0\)",
                        r"out-of-bounds read", r"past the end of a 256-byte"],
    "use_after_free": [r"kernel 'read_kernel'", r"thread \(0,0,0\)", r"use after free",
                       r"released by cudaFree"],
    "misaligned_float4": [r"kernel 'misaligned_float4_kernel'", r"thread \(0,0,0\)", r"misaligned address",
                          r"16-byte alignment"],
    "wmma_misaligned": [r"kernel 'wmma_misuse_kernel'", r"thread \(0,0,0\)", r"misaligned address",
                        r"wmma::load_matrix_sync", r"32-byte alignment"],
    "wmma_bad_ldm": [r"kernel 'wmma_misuse_kernel'", r"thread \(0,0,0\)", r"leading dimension 12 elements",
                     r"not a multiple of 16 bytes"],
    "wmma_partial_warp": [r"kernel 'wmma_misuse_kernel'", r"block of 16 threads", r"whole warps"],
    "ldmatrix_misaligned": [r"kernel 'ptx_misuse_kernel'", r"thread \(3,0,0\)", r"misaligned address",
                            r"ldmatrix row address", r"16-byte alignment"],
    "mma_partial_warp": [r"kernel 'ptx_misuse_kernel'", r"mma\.sync\.m16n8k16\.f32\.f16", r"warp of 16 threads",
                         r"needs all 32 lanes"],
    "cp_async_misaligned": [r"kernel 'ptx_misuse_kernel'", r"thread \(\d+,0,0\)", r"cp\.async global source",
                            r"16-byte alignment"],
    "cp_async_no_wait": [r"kernel 'ptx_misuse_kernel'", r"thread \(\d+,0,0\)", r"1 cp\.async copies not waited for"],
}


def main():
    if len(sys.argv) != 2:
        print("usage: planted_bugs.py BINARY")
        return 2
    failures = 0
    for mode, patterns in CASES.items():
        p = subprocess.run([sys.argv[1], mode], capture_output=True, text=True, timeout=60)
        report = p.stderr
        missing = [pat for pat in patterns if not re.search(pat, report)]
        name = "planted bug detected: " + mode
        if p.returncode != ERROR_EXIT:
            print("FAIL: %s: exit status %d (want %d); stdout %r stderr %r" % (name, p.returncode, ERROR_EXIT, p.stdout, report))
            failures += 1
        elif missing:
            print("FAIL: %s: report lacks %s; report was:\n%s" % (name, missing, report))
            failures += 1
        else:
            print("PASS: " + name)
            print("      " + report.strip().replace("\n", "\n      ").split("\n      HINT")[0][:400])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
