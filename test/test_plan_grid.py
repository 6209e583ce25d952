#!/usr/bin/env python3
"""The plan, right at every shape (issue 26 item 5): ./train_gpt_cpu's planned step peak against the
measured VmHWM, on a grid of GPT-2 and Llama shapes (depths 4-8 here, d12 in test_plan.py; B 1-16,
T 64-256 (a larger T only grows accounted arenas), every -r, one and two threads), each within
0.95-1.05. A shape of the caller's: test/test_plan_grid.py MODEL B T R THREADS.

Planned is --plan's step peak, from the trainer's own line after its first step ("planned peak
P MiB ... runtime overhead O MiB (VmRSS at start)"): every class the trainer allocates (checked
equal to the plan byte for byte), the dataloader's buffers and the sgemm's own (blas_packing: the
part of OpenBLAS's buffer it touches, or the built-in sgemm's packed copies). Measured is the
process's peak RSS over two steps (wait4's ru_maxrss: VmHWM at exit) less O, the runtime's fixed
overhead (the loader, libc, OpenBLAS's code and tables, read by a constructor before main): two
steps, because a transient that the first step's forward frees before the moments are first
touched (the built-in sgemm's copies) coincides with them only from the second step on. Each shape
runs without checkpoint or validation. Prints one line per shape, PASS:/FAIL:, and exits non-zero
when a shape is outside the band.
"""
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile

TRAINER = os.environ.get("LLMC_TEST_TRAINER", "./train_gpt_cpu")
LOW, HIGH = 0.95, 1.05

# (model, B, T, -r, threads): small enough for a loaded 2-core machine, chosen so that the sgemm's
# buffer lands in each of its regimes (K' = BT below Q, between Q and 2Q, capped at Q; one thread)
GRID = [
    ("d4", 1, 64, 0, 2), ("d4", 16, 64, 1, 2), ("d6", 2, 256, 2, 2), ("d8", 1, 64, 1, 2),
    ("d4", 2, 128, 0, 1), ("llama3:d2", 4, 64, 0, 2), ("llama3:d2", 1, 256, 0, 1),
]


def write_shard(path, n, seed):
    rng = random.Random(seed)
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, n
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header) + struct.pack(f"<{n}H", *(rng.randrange(50257) for _ in range(n))))


def main():
    if len(sys.argv) > 1:  # e.g. "d4 16 256 0 2": one shape of the caller's
        m, b, t, r, th = sys.argv[1:6]
        grid = [(m, int(b), int(t), int(r), int(th))]
    else:
        grid = GRID
    tmp = tempfile.mkdtemp(prefix="llmc_test_plan_grid_")
    shard = os.path.join(tmp, "train.bin")
    write_shard(shard, 2 * 16 * 1024 + 1, 1)
    failures = 0
    for model, B, T, r, threads in grid:
        args = ["-i", shard, "-j", shard, "-e", model, "-b", str(B), "-t", str(T), "-r", str(r), "--threads", str(threads),
                "-x", "2", "-v", "0", "-s", "0"]
        with tempfile.TemporaryFile("w+") as out:
            child = subprocess.Popen([TRAINER] + args, stdout=out, stderr=subprocess.STDOUT, text=True)
            _, status, usage = os.wait4(child.pid, 0)
            child.returncode = os.waitstatus_to_exitcode(status)
            out.seek(0)
            text = out.read()
        m = re.search(r"memory: planned peak ([\d.]+) MiB; measured VmHWM [\d.]+ MiB = runtime overhead ([\d.]+) MiB", text)
        name = f"{model} -b {B} -t {T} -r {r} --threads {threads}"
        if child.returncode != 0 or not m:
            print(f"FAIL: {name}: rc {child.returncode}, no planned/measured line: {text[-600:]}")
            failures += 1
            continue
        planned, base = map(float, m.groups())
        hwm = usage.ru_maxrss / 1024.0  # KiB
        ratio = planned / (hwm - base)
        ok = LOW <= ratio <= HIGH
        print(f"{'PASS' if ok else 'FAIL'}: {name}: planned {planned:.1f} MiB / measured {hwm - base:.1f} MiB "
              f"(peak RSS {hwm:.1f} less {base:.1f} at start) = {ratio:.4f}{'' if ok else f', outside {LOW}-{HIGH}'}")
        failures += not ok
        sys.stdout.flush()
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'FAILED' if failures else 'all passed'}: test_plan_grid ({failures} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
