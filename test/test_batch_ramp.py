#!/usr/bin/env python3
"""--batch-ramp TOKENS[:START] (issue 27): the tokens per step grow linearly from START to -d over
the first TOKENS training tokens, in multiples of START, by the accumulation count alone.

- each step's tokens (log.jsonl step_tokens) equal the rule computed here independently, on the
  CPU trainer and on ./train_gpt through the cudasim harness (whose losses stay close to the CPU's;
  its 2 ranks equal its 1: the last micro-step of each step, which reduces, moves with the ramp);
- a run resumed from a checkpoint in the middle of the ramp equals the straight run bit for bit
  (losses, grad norms, the final model);
- 2 ranks (mpirun) equal 1 rank with the same START (losses and norms, rel 1e-5);
- the LR schedule is unchanged by the ramp; --plan prices the largest step (-d): the same plan;
- a START that does not fit B*T*processes or -d, a malformed value and -a 1 are clean errors.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from testlib import LOOPBACK_MPI, expect_error, failed_count, report  # noqa: E402

CPU = "./train_gpt_cpu"
SIM = "build/cudasim/train_gpt"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "passive", **LOOPBACK_MPI}
RAMP, START, FULL, STEPS = 1500, 128, 512, 9


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)


def expected_tokens(ramp, start, full, steps):
    """The rule, written independently: step tokens from the tokens seen before the step."""
    out, seen = [], 0
    for _ in range(steps):
        if seen >= ramp:
            t = full
        else:
            t = start + (full - start) * seen // ramp
            t = max(start, min(full, t // start * start))
        out.append(t)
        seen += t
    return out


def records(out):
    return [r for r in (json.loads(l) for l in open(os.path.join(out, "log.jsonl"))) if "train_loss" in r]


def main():
    sim = "--no-sim" not in sys.argv and os.path.exists(SIM)
    data = os.environ.get("LLMC_DATA_DIR", os.path.join(HERE, "..", "..", "shared", "data"))
    tmp = tempfile.mkdtemp(prefix="llmc_ramp.")
    try:
        toks = list(open(os.path.join(data, "tinyshakespeare.txt"), "rb").read()[:40000])
        shard = os.path.join(tmp, "train.bin")
        with open(shard, "wb") as f:
            f.write(struct.pack("<256i", *([20240520, 1, len(toks)] + [0] * 253)))
            f.write(struct.pack(f"<{len(toks)}H", *toks))
        want = expected_tokens(RAMP, START, FULL, STEPS)
        if len(set(want)) < 3:
            sys.exit(f"FAIL: the test's ramp does not ramp: {want}")
        base = ["-e", "d1", "-i", shard, "-j", shard, "-b", "2", "-t", "32", "-d", str(FULL), "-v", "0", "-s", "0",
                "-k", "cosine", "-l", "1e-3", "--batch-ramp", f"{RAMP}:{START}"]
        # ---- tokens per step; the LR schedule as without the ramp ------------------------------
        a = os.path.join(tmp, "a")
        p = run([CPU] + base + ["-x", str(STEPS), "-o", a])
        ra = records(a) if p.returncode == 0 else []
        got = [r.get("step_tokens") for r in ra]
        report(got == want, "CPU: each step's tokens (log step_tokens) follow the ramp", f"got {got}, want {want}; "
               f"{p.stderr[-400:]}")
        plain = os.path.join(tmp, "plain")
        p = run([CPU] + base[:-2] + ["-x", str(STEPS), "-o", plain])
        rp = records(plain) if p.returncode == 0 else []
        report(len(rp) == STEPS and [r["lr"] for r in rp] == [r["lr"] for r in ra] and
               all("step_tokens" not in r for r in rp),
               "the LR schedule is the same with and without the ramp; no step_tokens field without it", p.stderr[-300:])
        # ---- resume in the middle of the ramp == the straight run ------------------------------
        b = os.path.join(tmp, "b")
        p1 = run([CPU] + base + ["-x", "4", "-n", "4", "-o", b])
        p2 = run([CPU] + base + ["-x", str(STEPS), "-o", b, "-y", "1", "--allow-config-change", "1"])
        rb = records(b) if p1.returncode == 0 and p2.returncode == 0 else []
        final = f"model_{STEPS:08d}.bin"
        same_model = rb and open(os.path.join(a, final), "rb").read() == open(os.path.join(b, final), "rb").read()
        report([(r["step"], r["train_loss"], r["grad_norm"], r.get("step_tokens")) for r in rb] ==
               [(r["step"], r["train_loss"], r["grad_norm"], r.get("step_tokens")) for r in ra] and same_model,
               "resumed at step 4 (mid-ramp): losses, norms, step tokens and the final model equal the straight run's",
               f"{p1.stderr[-300:]} {p2.stderr[-300:]}")
        # ---- 2 ranks == 1 ----------------------------------------------------------------------
        c = os.path.join(tmp, "c")
        p = run(["mpirun", "--oversubscribe", "-np", "2", CPU] + base + ["-x", str(STEPS), "-o", c])
        rc = records(c) if p.returncode == 0 else []
        close = len(rc) == STEPS and all(
            x.get("step_tokens") == y.get("step_tokens") and abs(x["train_loss"] - y["train_loss"]) <= 1e-5 * abs(y["train_loss"])
            and abs(x["grad_norm"] - y["grad_norm"]) <= 1e-5 * abs(y["grad_norm"]) for x, y in zip(rc, ra))
        report(close, "mpirun -np 2: step tokens, losses and norms equal one rank's (rel 1e-5)", p.stderr[-500:])
        # ---- the CUDA trainer through the harness ----------------------------------------------
        if sim:
            s = os.path.join(tmp, "s")
            p = run([SIM] + base + ["-x", "6", "--precision", "fp32", "-o", s])
            rs = records(s) if p.returncode == 0 else []
            report([r.get("step_tokens") for r in rs] == want[:6] and all(
                abs(x["train_loss"] - y["train_loss"]) <= 1e-3 * abs(y["train_loss"]) for x, y in zip(rs, ra)),
                "train_gpt (harness, fp32): step tokens follow the ramp, losses within 1e-3 of the CPU's",
                f"{[r.get('step_tokens') for r in rs]} {p.stderr[-400:]}")
            s2 = os.path.join(tmp, "s2")
            p = run(["mpirun", "--oversubscribe", "-np", "2", SIM] + base + ["-x", "6", "--precision", "fp32", "-o", s2])
            r2 = records(s2) if p.returncode == 0 else []
            report(len(r2) == 6 and all(x.get("step_tokens") == y.get("step_tokens") and
                                        abs(x["train_loss"] - y["train_loss"]) <= 1e-5 * abs(y["train_loss"]) and
                                        abs(x["grad_norm"] - y["grad_norm"]) <= 1e-5 * abs(y["grad_norm"]) for x, y in zip(r2, rs)),
                   "train_gpt (harness) under mpirun -np 2: the ramp's steps, losses and norms equal one process's (rel 1e-5)",
                   p.stderr[-500:])
        # ---- --plan: the largest step ----------------------------------------------------------
        p1 = run([CPU] + base + ["-x", str(STEPS), "--plan", "--json"])
        p2 = run([CPU] + base[:-2] + ["-x", str(STEPS), "--plan", "--json"])
        report(p1.returncode == 0 and p1.stdout == p2.stdout and "peak_bytes" in p1.stdout,
               "--plan with --batch-ramp prices the largest step (-d): the plan without the ramp", p1.stderr[-300:])
        # ---- errors ----------------------------------------------------------------------------
        p = run([CPU] + base[:-2] + ["-x", "2", "--batch-ramp", "1000:96"])
        expect_error("--batch-ramp START not a multiple of B*T*processes: an error", p, "must be a multiple of B*T*processes")
        p = run([CPU] + base[:-2] + ["-x", "2", "--batch-ramp", "1000:384"])
        expect_error("--batch-ramp START that does not divide -d: an error", p, "divide -d 512")
        for bad in ("", "x", "100:", ":64", "-5", "100:0", "1e3"):
            if not bad:
                continue
            p = run([CPU] + base[:-2] + ["-x", "2", "--batch-ramp", bad])
            expect_error(f"--batch-ramp '{bad}': an error", p, "flag --batch-ramp expects TOKENS or TOKENS:START")
        p = run([CPU] + base + ["-x", "2", "-a", "1"])
        expect_error("--batch-ramp with -a 1: an error", p, "--batch-ramp and -a 1")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return failed_count()


if __name__ == "__main__":
    sys.exit(main())
