#!/usr/bin/env python3
"""The memory plan (issue 14): ./train_gpt_cpu --plan [--json], measured against the allocation.

Covers: --plan on shapes this machine could never allocate (GPT-2 1.5B, B 16, T 1024, 8 ranks,
-z 1/2/3) equals closed-form GPT-2 counts written here; --plan reads only a checkpoint's header and
touches no run directory; a grid of real runs where the trainer's own check (allocated bytes ==
plan, class by class; it dies otherwise) passes and the accounted total equals the --plan JSON;
planned step peak / measured VmHWM (less the start-up RSS) within 2% for d12; per-step memory in
the step line and log.jsonl; the leak check fires on a planted leak (LLMC_TEST_LEAK) naming the
class and stays quiet otherwise; bad flags. Prints PASS:/FAIL:; exits non-zero on any failure.
"""
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile

TRAINER = os.environ.get("LLMC_TEST_TRAINER", "./train_gpt_cpu")
failures = 0
ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self,tcp"}


def report(ok, name, detail=""):
    global failures
    print(("PASS: " if ok else "FAIL: ") + name + ("" if ok else f": {detail}"))
    failures += not ok
    sys.stdout.flush()


def run(args, env=None, np=0):
    cmd = (["mpirun", "--oversubscribe", "-np", str(np)] if np else []) + [TRAINER] + args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**ENV, **(env or {})})


def plan_json(args):
    p = run(["--plan", "--json"] + args)
    if p.returncode != 0:
        return None, p.stderr
    return json.loads(p.stdout), p.stderr


def gpt2_closed_form(L, C, NH, B, T, r, Vp=50304, maxT=1024):
    """GPT-2's counts: parameters Vp*C + maxT*C + L*(12C^2 + 13C) + 2C; activations (floats) by
    the CPU layout: per layer ln1, atty, residual2, ln2, residual3 (BTC each), qkv 3BTC, fch 4BTC,
    att B*NH*T^2, four norm stats BT; -r 1 keeps one layer of fch_gelu (4BTC), -r 2 one of ln1 and
    ln2 too; plus encoded, lnf (BTC), lnf stats and losses (3BT), logits BT*Vp."""
    N = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C
    BT = B * T
    per_layer = (5 * C + 3 * C + 4 * C) * BT + B * NH * T * T + 4 * BT + (4 * C * BT if r < 1 else 0)
    if r >= 2:
        per_layer -= 2 * C * BT
    once = 2 * C * BT + 3 * BT + BT * Vp + (4 * C * BT if r >= 1 else 0) + (2 * C * BT if r >= 2 else 0)
    acts = L * per_layer + once
    scratch = BT * (2 * C + 2 * 4 * C)
    return N, acts, scratch


def write_shard(path, n, seed):
    rng = random.Random(seed)
    toks = [rng.randrange(50257) for _ in range(n)]
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, n
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header) + struct.pack(f"<{n}H", *toks))


def main():
    tmp = tempfile.mkdtemp(prefix="llmc_test_plan_")
    tr, va = os.path.join(tmp, "train.bin"), os.path.join(tmp, "val.bin")
    write_shard(tr, 20000, 1)
    write_shard(va, 3000, 2)

    # --- closed form on sizes this machine could never allocate -------------------------------
    L, C, NH, B, T, P = 48, 1600, 25, 16, 1024, 8
    for z in (0, 1, 2, 3):
        for r in (0, 1, 2):
            out = os.path.join(tmp, f"never_created_{z}_{r}")
            j, err = plan_json(["-e", "d48", "-b", str(B), "-t", str(T), "-pn", str(P), "-z", str(z), "-r", str(r),
                                "-o", out])
            name = f"--plan d48 B {B} T {T} {P} ranks -z {z} -r {r} equals GPT-2's closed form"
            if j is None:
                report(False, name, err)
                continue
            N, acts, scratch = gpt2_closed_form(L, C, NH, B, T, r)
            shard = -(-N // P)  # ceil: rank 0's shard
            # (-z 0: every rank holds the whole fp32 m and v; a checkpoint writes them without a gathered copy)
            # ZeRO-2/3 buckets: the outer one (wte, wpe, lnfw, lnfb) and one layer's tensors
            outer, layer = 50304 * C + 1024 * C + 2 * C, 12 * C * C + 13 * C
            c = j["classes"]
            want = {"parameters": 4 * (shard if z == 3 else N), "gradients": 4 * (outer + layer if z >= 2 else N),
                    "adamw_m": 4 * (shard if z else N), "adamw_v": 4 * (shard if z else N), "gradient_shard": 4 * shard if z >= 2 else 0,
                    "parameter_gather": 4 * (outer + 2 * layer) if z == 3 else 0, "activations": 4 * acts,
                    "backward_scratch": 4 * scratch, "token_buffers": 4 * (2 * B * T + 2 * B * T * P),
                    "checkpoint_gather": 4 * (3 if z == 3 else 2 if z else 0) * N}
            # (blas_packing, OpenBLAS's own buffer, depends on its kernels and the thread count: test_plan_grid.py
            # checks it against the measured peak)
            bad = {k: (c.get(k), v) for k, v in want.items() if c.get(k) != v}
            report(not bad and j["parameters"] == N, name, bad)
            report(j["peak_bytes"] == sum(c.values()) and j["step_peak_bytes"] == j["peak_bytes"] - c["checkpoint_gather"],
                   f"--plan -z {z} -r {r}: peak_bytes = the sum of the classes (checkpoint phase), step peak without it",
                   j)
            report(not os.path.exists(out), f"--plan -z {z} -r {r} creates no run directory")
    p = run(["--plan", "-e", "d48", "-b", "16", "-t", "1024", "-pn", "8", "-z", "1", "-o", os.path.join(tmp, "no_run")])
    report(p.returncode == 0 and re.search(r"peak \d+ bytes .* in checkpoint save", p.stdout) and "att " in p.stdout
           and "activations by tensor" in p.stdout, "--plan (text) names every class, each activation tensor and the peak phase",
           p.stdout[-800:] + p.stderr)

    # --- a checkpoint: only its header is read ------------------------------------------------
    # a real d2 checkpoint's header rewritten to GPT-2 1.5B's shape, the 6 GB of parameters a hole
    # (a sparse file): --plan answers at once and from the header alone
    out = os.path.join(tmp, "ckpt")
    p = run(["-i", tr, "-j", va, "-e", "d2", "-b", "2", "-t", "32", "-x", "1", "-v", "0", "-s", "0", "-o", out])
    model = os.path.join(out, "model_00000001.bin")
    if p.returncode == 0 and os.path.exists(model):
        with open(model, "rb") as f:
            h = list(struct.unpack("<256i", f.read(1024)))
        h[4], h[5], h[6] = 48, 25, 1600
        N, _, _ = gpt2_closed_form(48, 1600, 25, 2, 32, 1)
        big = os.path.join(tmp, "d48_sparse.bin")
        with open(big, "wb") as g:
            g.write(struct.pack("<256i", *h))
            g.truncate(1024 + 4 * N)
        blocks = os.stat(big).st_blocks * 512
        j, err = plan_json(["-e", big, "-b", "2", "-t", "32"])
        report(blocks < 1 << 20 and j is not None and j["parameters"] == N and j["classes"]["parameters"] == 4 * N,
               "--plan -e <checkpoint>: the shape from the header (a sparse 1.5B file)", err)
    else:
        report(False, "a d2 run writes a checkpoint", p.stderr[-500:])

    # --- allocated == plan, for a grid of real runs -------------------------------------------
    grid = [(["-b", "2", "-t", "32", "-r", "0"], 0), (["-b", "1", "-t", "64", "-r", "1"], 0),
            (["-b", "2", "-t", "16", "-r", "2", "-d", "128"], 0), (["-b", "2", "-t", "16", "-z", "1", "-d", "96"], 3),
            (["-b", "2", "-t", "16", "-z", "2", "-d", "96"], 3), (["-b", "2", "-t", "16", "-z", "3", "-d", "96"], 3)]
    have_mpi = shutil.which("mpirun") is not None
    for args, np in grid:
        if np and not have_mpi:
            report(False, f"mpirun for the grid entry {args}", "OpenMPI is not installed")
            continue
        full = ["-i", tr, "-j", va, "-e", "d2", "-x", "1", "-v", "0", "-s", "0", "--threads", "1"] + args
        p = run(full, np=np)
        m = re.findall(r"memory plan: (\d+) bytes accounted = the plan", p.stdout)
        j, err = plan_json(full + (["-pn", str(np)] if np else []))
        planned = j and sum(v for k, v in j["classes"].items() if k not in ("dataloader", "blas_packing", "checkpoint_gather"))
        report(p.returncode == 0 and len(m) >= 1 and int(m[0]) == planned,
               f"allocated == plan class by class ({' '.join(args)}{', %d ranks' % np if np else ''})",
               f"rc {p.returncode} {m} vs {planned} {p.stderr[-400:]}")

    # --- planned vs measured peak RSS (d12) ---------------------------------------------------
    for args in (["-b", "1", "-t", "64", "-r", "1"], ["-b", "2", "-t", "128", "-r", "0"], ["-b", "1", "-t", "128", "-r", "2"]):
        out = os.path.join(tmp, "rss_" + "_".join(args).replace("-", ""))
        p = run(["-i", tr, "-j", va, "-e", "d12", "-x", "1", "-v", "0", "-s", "0", "-o", out, "-n", "0"] + args)
        rec = [r for r in map(json.loads, open(os.path.join(out, "log.jsonl"))) if "mem_planned_over_measured" in r] \
            if p.returncode == 0 else []
        ratio = rec[0]["mem_planned_over_measured"] if rec else None
        print(f"d12 {' '.join(args)}: planned / measured = {ratio}")
        report(ratio is not None and 0.98 <= ratio <= 1.02, f"d12 {' '.join(args)}: planned peak / measured VmHWM within 2%",
               f"{ratio} {p.stdout[-600:]} {p.stderr[-300:]}")

    # --- per-step memory and the leak check ---------------------------------------------------
    base = ["-i", tr, "-j", va, "-e", "d2", "-b", "2", "-t", "32", "-x", "5", "-v", "0", "-s", "0", "--threads", "1"]
    out = os.path.join(tmp, "noleak")
    p = run(base + ["-o", out])
    steps = [l for l in p.stdout.splitlines() if l.startswith("step ")]
    report(p.returncode == 0 and len(steps) == 5 and all(re.search(r"\| mem \d+\.\d+ GiB \(peak \d+\.\d+\)", l) for l in steps)
           and "memory leak" not in p.stdout + p.stderr, "no leak: 5 steps run quietly with 'mem X GiB (peak Y)' in every step line",
           p.stdout[-500:] + p.stderr[-500:])
    log = [r for r in map(json.loads, open(os.path.join(out, "log.jsonl"))) if "train_loss" in r] if p.returncode == 0 else []
    report(len(log) == 5 and all(r["mem_bytes"] == sum(r["mem_by_class"].values()) and r["mem_peak_bytes"] >= r["mem_bytes"]
                                 and r["mem_by_class"]["parameters"] > 0 for r in log),
           "log.jsonl: mem_bytes = the sum of mem_by_class, mem_peak_bytes >= it", log[:1])
    for cls in ("activations", "gradients"):
        p = run(base, env={"LLMC_TEST_LEAK": cls})
        report(p.returncode == 1 and f"memory leak: host memory class '{cls}' grew" in p.stderr
               and "after step 2 to" in p.stderr and "after step 3" in p.stderr,
               f"a planted leak in '{cls}' is named after step 3", p.stderr[-500:])

    # --- the CUDA trainer through cudasim ------------------------------------------------------
    sim = "build/cudasim/train_gpt"
    if not os.path.exists(sim):
        report(False, f"{sim} is built (make {sim})")
    else:
        global TRAINER
        cpu_trainer, TRAINER = TRAINER, sim
        N, _, _ = gpt2_closed_form(48, 1600, 25, 16, 1024, 1)
        for prec, elem, master in (("bf16", 2, 1), ("fp16", 2, 1), ("fp32", 4, 0)):
            j, err = plan_json(["-e", "d48", "-b", "16", "-t", "1024", "--precision", prec, "-o", os.path.join(tmp, "none")])
            c = j["classes"] if j else {}
            want = {"parameters": elem * N, "gradients": elem * N, "master_weights": 4 * N * master, "adamw_m": 4 * N,
                    "adamw_v": 4 * N, "token_buffers": 2 * 4 * 16 * 1024, "workspaces": 32 << 20}
            bad = {k: (c.get(k), v) for k, v in want.items() if c.get(k) != v}
            report(j is not None and not bad and j["device"] == "GPU" and j["peak_bytes"] == sum(
                v for k, v in c.items() if k not in ("dataloader", "checkpoint_gather")) and
                   c["activations"] >= sum(j["activations"].values()),
                   f"cudasim --plan d48 B 16 T 1024 {prec}: GPT-2's closed form, device peak = the sum", bad or err)
        for prec, r in (("fp32", 0), ("bf16", 1), ("fp16", 2), ("bf16", 3)):
            full = ["-i", tr, "-e", "d2", "-b", "2", "-t", "16", "-x", "1", "-v", "0", "-s", "0", "--precision", prec, "-r", str(r)]
            p = run(full)
            m = re.findall(r"memory plan: (\d+) bytes accounted = the plan", p.stdout)
            j, err = plan_json(full)
            planned = j and sum(v for k, v in j["classes"].items() if k not in ("dataloader", "checkpoint_gather"))
            ratio = re.search(r"planned / measured (\d+\.\d+)", p.stdout)
            report(p.returncode == 0 and len(m) == 1 and int(m[0]) == planned and ratio is not None,
                   f"cudasim {prec} -r {r}: device bytes allocated == plan class by class, planned / measured printed",
                   f"rc {p.returncode} {m} vs {planned} {p.stderr[-400:]}")
        TRAINER = cpu_trainer

    # --- float flags (issue 22 item 21): an underflow is a number (the nearest float), an overflow
    # an error saying so, not "expects a number" ----------------------------------------------
    p = run(["--plan", "-e", "d2", "-l", "1e-40"])
    report(p.returncode == 0, "-l 1e-40 (below float's normal range) is a number", p.stderr[-300:])
    p = run(["--plan", "-e", "d2", "-l", "1e39"])
    report(p.returncode == 1 and "error: flag -l: '1e39' is out of range" in p.stderr, "-l 1e39 is an error saying it is out "
           "of range", p.stderr[-300:])

    # --- bad flags ----------------------------------------------------------------------------
    for args, want in ((["--json"], "--json goes with --plan"), (["--plan", "-d", "100"], "-d 100 is not a multiple"),
                       (["--plan", "-e", os.path.join(tmp, "missing.bin")], "missing.bin"),
                       (["--plan=2"], "--plan must be between 0 and 1")):
        p = run(args)
        report(p.returncode == 1 and "error:" in p.stderr and want in p.stderr, f"{' '.join(args)} is a clear error",
               p.stderr[-300:])

    shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'FAILED' if failures else 'all passed'}: test_plan ({failures} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
