#!/usr/bin/env python3
"""Data parallelism of ./train_gpt_cpu under mpirun (issue 10), on loopback with tiny models.

Covers: P ranks with micro-batch B against one process with P*B and one with accumulation P,
for -z 0, 1, 2 and 3 (and 3 ranks, whose shards do not divide the parameter count; accumulation
into the -z 2/3 gradient shard); per-rank bytes of every sharded class as printed and as allocated
(the log's mem_by_class), no full-size gradient buffer at -z 2/3; resume with another rank count
(2->1, 1->2, 2->3 into -z 3, 4 -> 2 at -z 3; bit-exact 2->2); a rank killed with SIGKILL; a rank
that hangs (the collective watchdog names it within --dist-timeout); ranks started with different
flags; a build without MPI asked for 2 processes. Without mpirun (-pi tcp | fs, the build without
MPI, scripts/run_dist.sh local N --pi): 2 ranks bit-identical to mpirun's at -z 0, 1, 2, 3 ranks
at -z 3 equal within the tolerance; a rank killed or hung named by every other rank; different
flags; a stale rendezvous file; bad -ps / -pf; ranks that disagree on -pn or share a -pr.
Prints PASS:/FAIL: lines; exits non-zero on any failure. Run from the repository root.

Tolerances (float reordering only: the same math, sums taken in another order):
  losses: relative 1e-5 (a loss is a mean over a few thousand fp32 log-probabilities; reordering
          moves it by a few ulps, ~1e-7 relative).
  parameters: absolute 1e-4 after 10 AdamW steps at lr 1e-3. AdamW moves a weight by at most
          ~lr per step (m/sqrt(v) is about +-1), so 10 steps move it at most ~1e-2; a gradient
          that differs in its last bits changes m/sqrt(v) by as much where the gradient is tiny
          against eps, so 1% of the largest possible movement bounds reordering, while any real
          difference (wrong data, scale or reduction) moves many weights by ~lr per step.
"""
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import LOOPBACK_MPI, failures, kill_a_rank, report, write_shard  # noqa: E402

TRAINER = "./train_gpt_cpu"
NOMPI = "build/test/train_gpt_cpu_nompi"
ENV = {**os.environ, **LOOPBACK_MPI}
LOSS_RTOL = 1e-5
PARAM_ATOL = 1e-4
def mpirun(np, args, trainer=TRAINER, timeout=300):
    cmd = ["mpirun", "--oversubscribe", "-np", str(np), trainer] + args if np else [trainer] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
    return p


def read_log(outdir):
    with open(os.path.join(outdir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def losses(outdir, key="train_loss"):
    return {r["step"]: r[key] for r in read_log(outdir) if key in r}


def params(path):
    with open(path, "rb") as f:
        f.seek(1024)
        data = f.read()
    return struct.unpack(f"<{len(data) // 4}f", data)


def loss_diff(a, b):
    """largest relative loss difference over the steps both logs have, or None when the steps differ"""
    if sorted(a) != sorted(b) or not a:
        return None
    return max(abs(a[s] - b[s]) / abs(b[s]) for s in a)


def inf_if_none(d):
    """a loss_diff for max(): steps that differ (None) count as infinitely far; an exact match stays 0"""
    return float("inf") if d is None else d


def param_diff(pa, pb):
    if len(pa) != len(pb):
        return float("inf")
    return max(abs(x - y) for x, y in zip(pa, pb))


def shard_bytes(p, out, z, numel, ranks, outer, layer):
    """-z z (2 or 3) on `ranks` ranks (p: the run, out: its directory): (printed, got, bad). printed:
    the startup printed rank 0's shard of m, the reduced gradient and (-z 3) the parameters,
    ceil(numel / ranks) floats; got: the log's mem_by_class records (rank 0's accounting allocator);
    bad: per record, the classes that differ from the plan in closed form: m, v, the gradient shard
    (and -z 3 the parameters) that shard, the gradients the outer bucket plus one layer's (outer,
    layer: bytes), the -z 3 gather buffers the outer bucket plus two layers'."""
    shard = (numel + ranks - 1) // ranks * 4
    printed = (f"AdamW m {shard} bytes" in p.stdout and f"reduced gradient {shard} bytes" in p.stdout and
               f"parameters {shard if z == 3 else 4 * numel} bytes" in p.stdout)
    want = {"adamw_m": shard, "adamw_v": shard, "gradient_shard": shard, "gradients": outer + layer,
            "parameters": shard if z == 3 else 4 * numel}
    if z == 3:
        want["parameter_gather"] = outer + 2 * layer
    got = [r["mem_by_class"] for r in read_log(out) if "train_loss" in r]
    return printed, got, [{k: (g.get(k), v) for k, v in want.items() if g.get(k) != v} for g in got]


def train(tmp, name, np, args):
    out = os.path.join(tmp, name)
    p = mpirun(np, args + ["-o", out])
    if p.returncode != 0:
        print(p.stdout[-2000:])
        print(p.stderr[-2000:])
    return p, out


def free_port():
    """A TCP port nobody listens on now (the OS's pick)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(np, pi, args, trainer=NOMPI, env=None, timeout=300):
    """scripts/run_dist.sh local NP --pi PI: NP processes started without mpirun."""
    env = {**ENV, "TRAINER": trainer, "PORT": str(free_port()), **(env or {})}
    return subprocess.run(["scripts/run_dist.sh", "local", str(np), "--pi", pi] + args, capture_output=True, text=True,
                          timeout=timeout, env=env)


def whole_error_lines(tmp, base):
    """3 ranks fail at once on one stderr (a -i that matches nothing, read by every rank): each
    rank's message is one whole line 'error: rank N: ...' (llmc_die: one write(), the rank
    first), none cut into by another's."""
    import re
    missing = os.path.join(tmp, "no_such_data_" + "x" * 200 + ".bin")
    p = launch(3, "tcp", ["-i", missing] + base[2:-2] + ["-b", "4", "-x", "2", "-o", os.path.join(tmp, "pi_no_data")],
               timeout=120)
    line = re.compile(r"error: rank (\d): no data shard matches '" + re.escape(missing) + r"'; check the path [^:]+$")
    lines = p.stderr.splitlines()
    ranks = sorted(int(m.group(1)) for m in map(line.match, lines) if m)
    report(p.returncode == 1 and ranks == [0, 1, 2] and len(lines) == 3,
           "-pi tcp, 3 ranks fail at once (-i matches nothing): stderr is 3 whole lines, 'error: rank N: ...' for N 0, 1, 2",
           f"exit {p.returncode}: {p.stderr[-900:]}")


def sending_fault(tmp, base):
    """A peer dies while rank 0 is only sending to it: rank 2 exits as the first broadcast begins
    (LLMC_TEST_EXIT_BEFORE, llmc/dist/dist_tcp.c; rank 0 waits for its connection to close, so the
    timing is fixed). Rank 0 must name rank 2 (it named its first connection, rank 1, before
    7afdd60) and tell rank 1. Every fatal line on the shared stderr is whole: one write() each,
    "error: rank N: " first (llmc_die, llmc/core/check.c)."""
    import re
    out = os.path.join(tmp, "pi_sending")
    p = launch(3, "tcp", base[:-2] + ["-b", "4", "-x", "2", "-o", out], env={"LLMC_TEST_EXIT_BEFORE": "2:broadcast"},
               timeout=120)
    head = r"error: rank (\d): the broadcast \(collective #\d+\) over -pi tcp/fs failed: rank 2 closed its connection " \
           r"\(it died, or stopped on an error of its own\)"
    whole = {0: re.compile(head + r"$"), 1: re.compile(head + r" \(reported by rank 0\)$")}
    lines = [ln for ln in p.stderr.splitlines() if "error" in ln]
    ranks = [int(m.group(1)) for m in (re.match(head, ln) for ln in lines) if m]
    parsed = sorted(ranks) == [0, 1] and all(whole[r].match(ln) for r, ln in zip(ranks, lines)) and len(lines) == 2
    report(p.returncode != 0 and parsed and "LLMC_TEST_EXIT_BEFORE: exiting as the broadcast begins" in p.stderr,
           "-pi tcp, 3 ranks, rank 2 exits as rank 0 broadcasts (rank 0 only sending): ranks 0 and 1 name rank 2, "
           "each in one whole line 'error: rank N: ...'", f"exit {p.returncode}: {p.stderr[-800:]}")


def pi_tests(tmp, base, toks, final):
    """-pi tcp | fs: 2 ranks equal mpirun's 2 ranks bit for bit (with 2 ranks every sum has one
    order: r0 + r1 == r1 + r0), faults named on every rank, bad flags named."""
    import re
    for pi, z in (("fs", "0"), ("tcp", "1"), ("fs", "2")):
        out, ref = os.path.join(tmp, f"pi_{pi}_z{z}"), os.path.join(tmp, f"p2_z{z}")
        p = launch(2, pi, base + ["-b", "6", "-z", z, "-o", out])
        ok = p.returncode == 0 and f"ranks started by -pi {pi}" in p.stdout and os.path.exists(os.path.join(ref, final))
        same = ok and all(losses(out, k) == losses(ref, k) for k in ("train_loss", "val_loss", "grad_norm")) and \
            open(os.path.join(out, final), "rb").read() == open(os.path.join(ref, final), "rb").read()
        comm = ok and all(r.get("comm_bytes", 0) > 0 for r in read_log(out) if "train_loss" in r)
        report(same and comm, f"2 ranks over -pi {pi} (a build without MPI, no mpirun), -z {z}: losses, grad norms and the "
               "final model bit-identical to mpirun -np 2; comm bytes logged", f"exit {p.returncode}: {p.stderr[-500:]}")

    # 3 ranks at -z 3: uneven shards and the nonblocking parameter gathers; rank 0 sums in rank
    # order, MPI in its own: equal within the reordering tolerance
    out, ref = os.path.join(tmp, "pi_fs_p3_z3"), os.path.join(tmp, "p3_z3")
    p = launch(3, "fs", base + ["-b", "4", "-z", "3", "-o", out])
    if p.returncode != 0 or not os.path.exists(os.path.join(ref, final)):
        report(False, "3 ranks over -pi fs, -z 3: trains", f"exit {p.returncode}: {p.stderr[-500:]}")
    else:
        diffs = [loss_diff(losses(out, k), losses(ref, k)) for k in ("train_loss", "val_loss", "grad_norm")]
        ld = float("inf") if None in diffs else max(diffs)
        pd = param_diff(params(os.path.join(out, final)), params(os.path.join(ref, final)))
        report(ld <= LOSS_RTOL and pd <= PARAM_ATOL, f"3 ranks over -pi fs, -z 3 (uneven shards): losses and grad norms (rel "
               f"{LOSS_RTOL}; largest {ld:.1e}) and final parameters (abs {PARAM_ATOL}; largest {pd:.1e}) equal mpirun -np 3's",
               f"{ld} {pd}")

    # a rank killed (rank 2: not rank 0's first connection): rank 0 names it at once and tells
    # rank 1, which names it too
    out = os.path.join(tmp, "pi_killed")
    problem, rc, text, took = kill_a_rank(["scripts/run_dist.sh", "local", "3", "--pi", "fs"] + base[:-2] +
                                          ["-b", "4", "-x", "100000", "-o", out], 3, out, {**ENV, "TRAINER": NOMPI},
                                          timeout=60, start_timeout=60, which=2)
    # (the ranks' stderr lines may interleave: each message is matched on its own)
    named0 = re.search(r"rank 0: the [^:]+? over -pi tcp/fs failed: rank 2 closed its connection", text)
    named1 = re.search(r"rank 1: the [^:]+? over -pi tcp/fs failed: rank 2 closed its connection \(it died, or stopped on "
                       r"an error of its own\) \(reported by rank 0\)", text)
    report(problem is None and rc == 1 and named0 and named1,
           f"-pi fs, 3 ranks, rank 2 killed with SIGKILL: ranks 0 and 1 exit 1 naming rank 2 ({took:.1f} s)",
           problem or f"exit {rc}: {text[-600:]}")

    sending_fault(tmp, base)
    whole_error_lines(tmp, base)

    # a rank that hangs (rank 2 sleeps 3 s before step 3's reduction): --dist-timeout 1.5 names it
    # on ranks 0 and 1
    t0 = time.time()
    p = launch(3, "tcp", base[:-2] + ["-b", "4", "-x", "5", "--dist-timeout", "1.5", "-o", os.path.join(tmp, "pi_hung")],
               env={"LLMC_TEST_HANG": "2:3:3"}, timeout=120)
    took = time.time() - t0
    named0 = re.search(r"rank 0: the [^:]+? over -pi tcp/fs failed: rank 2 moved no data within --dist-timeout", p.stderr)
    named1 = re.search(r"rank 1: the [^:]+? over -pi tcp/fs failed: rank 2 moved no data within --dist-timeout \(hung, "
                       r"stopped or dead\) \(reported by rank 0\)", p.stderr)
    report(p.returncode == 1 and named0 and named1 and "step     2/5" in p.stdout,
           f"-pi tcp, 3 ranks, rank 2 hangs: ranks 0 and 1 exit 1 naming it after --dist-timeout 1.5 ({took:.1f} s in all)",
           f"exit {p.returncode}: {p.stderr[-600:]}")

    # ranks started with different flags: the startup check works over TCP too
    rv = tempfile.mkdtemp(dir=tmp)
    args = base + ["-b", "6", "-x", "1", "-pi", "fs", "-pf", rv, "-pn", "2"]
    p1 = subprocess.Popen([NOMPI] + args + ["-pr", "1", "-l", "2e-3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p0 = subprocess.run([NOMPI] + args + ["-pr", "0"], capture_output=True, text=True, timeout=120)
    _, err1 = p1.communicate(timeout=120)
    report(p0.returncode != 0 and p1.returncode != 0 and "rank 1 was started differently from rank 0" in err1 and "lr" in err1,
           "-pi fs, ranks started with different flags: a startup error naming the rank and the flag", err1[-400:])

    # a stale rendezvous file (an earlier run's, its rank 0 gone) does not mislead the next run:
    # rank 1 starts first and reads it, fails to connect, reads again once rank 0 replaced it
    with open(os.path.join(rv, "llmc-rendezvous-default"), "w") as f:
        f.write(f"llmc-rendezvous 1\nhost 127.0.0.1\nport {free_port()}\ntoken 0123\nranks 2\n")
    args = base + ["-b", "6", "-x", "1", "-pi", "fs", "-pf", rv, "-pn", "2"]
    p1 = subprocess.Popen([NOMPI] + args + ["-pr", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    p0 = subprocess.run([NOMPI] + args + ["-pr", "0"], capture_output=True, text=True, timeout=120)
    _, err1 = p1.communicate(timeout=120)
    report(p0.returncode == 0 and p1.returncode == 0 and "step     1/1" in p0.stdout and not os.listdir(rv),
           "-pi fs: a stale rendezvous file is read again until rank 0 replaces it; none is left after the start",
           f"{p0.stderr[-300:]} {err1[-300:]} {os.listdir(rv)}")

    # ranks that disagree on -pn, or two processes with one -pr: rank 0 and the newcomer stop naming it
    one = base + ["-b", "6", "-x", "1", "--dist-timeout", "20", "-pi", "tcp"]
    for ranks, what, want in (([(2, 0), (3, 1)], "a rank started with another -pn", "-pn"),
                              ([(3, 0), (3, 1), (3, 1)], "two processes with one -pr", "-pr")):
        port, t0 = free_port(), time.time()
        procs = [subprocess.Popen([NOMPI] + one + ["-ps", f"127.0.0.1:{port}", "-pn", str(n), "-pr", str(r)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n, r in ranks]
        errs = [pr.communicate(timeout=60)[1] for pr in procs]
        took = time.time() - t0
        named = procs[0].returncode == 1 and want in errs[0] and \
            any(pr.returncode == 1 and want in e for pr, e in zip(procs[1:], errs[1:]))
        report(named and took < 15, f"-pi tcp, {what}: rank 0 and that rank exit 1 naming {want} ({took:.1f} s)",
               " | ".join(e[-200:] for e in errs))

    # bad flags: named, at once or within --dist-timeout
    one = base + ["-b", "6", "-x", "1", "-pn", "2", "--dist-timeout", "1"]
    dead = free_port()
    for extra, want, what in ((["-pi", "tcp", "-pr", "1"], "-ps", "-pi tcp without -ps"),
                              (["-pi", "tcp", "-ps", f"127.0.0.1:{dead}", "-pr", "1"], "could not reach rank 0 at -ps",
                               "-pi tcp, nobody listening at -ps"),
                              (["-pi", "tcp", "-ps", "127.0.0.1:99999", "-pr", "1"], "-ps", "-pi tcp, -ps with a bad port"),
                              (["-pi", "fs", "-pf", os.path.join(tmp, "no_such_dir"), "-pr", "1"], "-pf", "-pi fs, -pf not a directory"),
                              (["-pi", "fs", "-pf", rv, "-pr", "1"], "found no rank 0 through -pf", "-pi fs, no rank 0"),
                              (["-pi", "fs", "-pf", rv, "-pr", "2"], "-pr", "-pi fs, -pr out of range")):
        t0 = time.time()
        p = subprocess.run([NOMPI] + one + extra, capture_output=True, text=True, timeout=60)
        took = time.time() - t0
        report(p.returncode == 1 and "error:" in p.stderr and want in p.stderr and took < 10,
               f"{what}: exit 1 with an error naming it ({took:.1f} s)", f"exit {p.returncode}: {p.stderr[-300:]}")


def main():
    if not shutil.which("mpirun") or not shutil.which("mpicc"):
        report(False, "OpenMPI is installed (mpirun, mpicc)", "apt-get install openmpi-bin libopenmpi-dev, then make")
        return 1
    tmp = tempfile.mkdtemp(prefix="llmc_test_dist_")
    rng = random.Random(4321)
    pattern = [rng.randrange(50257) for _ in range(97)]
    toks = [pattern[i % 97] if rng.random() < 0.8 else rng.randrange(50257) for i in range(12000)]
    tr, va = os.path.join(tmp, "train.bin"), os.path.join(tmp, "val.bin")
    write_shard(tr, toks[:10000])
    write_shard(va, toks[10000:])
    # 12 sequences of 16 tokens per step: splits over 1, 2, 3 and 4 ranks
    base = ["-i", tr, "-j", va, "-e", "d2", "-t", "16", "-d", "192", "-l", "1e-3", "-u", "2", "-v", "5", "-m", "2",
            "-s", "0", "--seed", "7", "--threads", "1", "-x", "10"]
    final = "model_00000010.bin"

    # --- P ranks x B == 1 process x P*B == 1 process with accumulation ----------------------
    p, ref = train(tmp, "p1_b12", 0, base + ["-b", "12"])
    report(p.returncode == 0, "one process, -b 12: trains", p.stderr[-300:])
    ref_loss, ref_par = losses(ref), params(os.path.join(ref, final))
    ref_norm, ref_val = losses(ref, "grad_norm"), losses(ref, "val_loss")
    # (the validation batches are B*ranks sequences: the same as -b 12's only where that is 12)
    runs = [("p1_b6_accum2", 0, ["-b", "6"], "one process with accumulation 2 (-b 6)", False),
            ("p2_z0", 2, ["-b", "6", "-z", "0"], "2 ranks x -b 6, -z 0", True),
            ("p2_z1", 2, ["-b", "6", "-z", "1"], "2 ranks x -b 6, -z 1", True),
            ("p2_z2", 2, ["-b", "6", "-z", "2"], "2 ranks x -b 6, -z 2", True),
            ("p3_z1", 3, ["-b", "4", "-z", "1"], "3 ranks x -b 4, -z 1 (shards do not divide the parameters)", True),
            ("p3_z2", 3, ["-b", "2", "-z", "2"], "3 ranks x -b 2 with accumulation 2, -z 2 (shards do not divide the parameters)", False),
            ("p3_z3", 3, ["-b", "4", "-z", "3"], "3 ranks x -b 4, -z 3 (shards do not divide the parameters)", True),
            # (also the 4 -> 2 resume's source: a checkpoint at step 5)
            ("p4_z3_accum", 4, ["-b", "1", "-z", "3", "-n", "5"], "4 ranks x -b 1 with accumulation 3, -z 3", False)]
    for name, np, extra, what, same_val in runs:
        p, out = train(tmp, name, np, base + extra)
        if p.returncode != 0:
            report(False, f"{what}: trains", p.stderr[-500:])
            continue
        # the gradient norm too: AdamW hides a wrongly scaled gradient, the norm does not
        keys = (("train_loss", ref_loss), ("grad_norm", ref_norm)) + ((("val_loss", ref_val),) if same_val else ())
        ld = max(inf_if_none(loss_diff(losses(out, k), want)) for k, want in keys)
        report(ld <= LOSS_RTOL, f"{what}: {'train/val' if same_val else 'train'} losses and grad norms equal one process with -b 12 (rel {LOSS_RTOL}; "
               f"largest {ld:.1e})", f"largest relative difference {ld}")
        pd = param_diff(params(os.path.join(out, final)), ref_par)
        report(pd <= PARAM_ATOL, f"{what}: final parameters equal one process with -b 12 (abs {PARAM_ATOL}; largest {pd:.1e})",
               f"largest difference {pd}")
        if np:
            log = read_log(out)
            steps = [r for r in log if "train_loss" in r]
            report(all(r.get("comm_bytes", 0) > 0 and "comm_ms" in r for r in steps) and "ranks started by mpirun" in p.stdout,
                   f"{what}: the log has per-step communication time and bytes")
        if name in ("p3_z2", "p3_z3"):
            # per-rank bytes of the sharded classes: ceil(numel / 3) floats each (rank 0's), as printed
            # and as allocated (log.jsonl: rank 0's accounting allocator); the gradients live only in
            # the shard and two buckets (wte, wpe, lnf; one layer), the -z 3 parameters in the shard
            # and the gather buffers (the outer bucket, two layers)
            z, numel = int(name[-1]), len(ref_par)
            C, L = 128, 2  # d2
            outer, layer = 4 * (50304 * C + 1024 * C + 2 * C), 4 * (12 * C * C + 13 * C)
            printed, got, bad = shard_bytes(p, out, z, numel, 3, outer, layer)
            report(printed and got and not any(bad) and L * layer + outer == 4 * numel,
                   f"-z {z} on 3 ranks: per-rank bytes printed and allocated: m, v, gradient shard{', parameters' if z == 3 else ''} "
                   f"ceil(numel / 3) floats, gradients two buckets (no full-size buffer)",
                   f"{[l for l in p.stdout.splitlines() if l.startswith('optimizer')]} {bad[:1]}")
        if name == "p2_z0":
            files = sorted(os.listdir(out))
            report(not any(f.startswith("state_") and not f.endswith("_00000.bin") for f in files),
                   "2 ranks: one checkpoint for the run (rank 0's files only)", files)

    # --- -x 0 (evaluation only): the ranks' mean equals one process over the same batches -----
    ev = ["-i", tr, "-j", va, "-e", os.path.join(ref, final), "-t", "16", "-v", "1", "-m", "2", "-x", "0", "--threads", "1"]
    p1, p2 = mpirun(0, ev + ["-b", "12"]), mpirun(2, ev + ["-b", "6"])
    v1 = [l for l in p1.stdout.splitlines() if l.startswith("val loss")]
    v2 = [l for l in p2.stdout.splitlines() if l.startswith("val loss")]
    vd = abs(float(v1[0].split()[2]) - float(v2[0].split()[2])) / float(v1[0].split()[2]) if v1 and v2 else None
    report(p2.returncode == 0 and vd is not None and vd <= LOSS_RTOL,
           f"-x 0 on 2 ranks x -b 6: the validation loss equals one process with -b 12 (rel {LOSS_RTOL})",
           f"{v1} vs {v2}: {p2.stderr[-300:]}")

    # --- resume with another rank count ---------------------------------------------------------
    def resume(src, name, np, extra, zero):
        out = os.path.join(tmp, name)
        shutil.copytree(src, out)
        for f in os.listdir(out):  # back to the checkpoint at step 5
            if "00000010" in f:
                os.remove(os.path.join(out, f))
        p = mpirun(np, base + extra + ["-z", zero, "-n", "5", "-o", out, "-y", "1"])
        return p, out

    p, u2 = train(tmp, "u2", 2, base + ["-b", "6", "-z", "1", "-n", "5"])
    report(p.returncode == 0, "2 ranks with a checkpoint at step 5: trains", p.stderr[-300:])
    p, u1 = train(tmp, "u1", 0, base + ["-b", "12", "-n", "5"])
    u2_loss, u2_par = losses(u2), params(os.path.join(u2, final))
    u1_loss, u1_par = losses(u1), params(os.path.join(u1, final))
    u4 = os.path.join(tmp, "p4_z3_accum")  # 4 ranks x -b 1, -z 3, a checkpoint at step 5
    u4_loss, u4_par = losses(u4), params(os.path.join(u4, final))
    cases = [(u2, "r2to2", 2, ["-b", "6"], "1", u2_loss, u2_par, "2 -> 2 ranks (-z 1)", True),
             (u2, "r2to1", 0, ["-b", "12"], "0", u2_loss, u2_par, "2 ranks (-z 1) -> 1 process", False),
             (u2, "r2to3", 3, ["-b", "4"], "3", u2_loss, u2_par, "2 ranks (-z 1) -> 3 ranks (-z 3)", False),
             (u4, "r4to2", 2, ["-b", "6"], "3", u4_loss, u4_par, "4 ranks (-z 3) -> 2 ranks (-z 3)", False),
             (u1, "r1to2", 2, ["-b", "6"], "2", u1_loss, u1_par, "1 process -> 2 ranks (-z 2)", False)]
    for src, name, np, extra, zero, want_loss, want_par, what, exact in cases:
        p, out = resume(src, name, np, extra, zero)
        if p.returncode != 0 or "resumed from step 5" not in p.stdout:
            report(False, f"resume {what}: resumes from step 5", p.stdout[-500:] + p.stderr[-500:])
            continue
        got = losses(out)
        if exact:
            same = open(os.path.join(out, final), "rb").read() == open(os.path.join(src, final), "rb").read()
            report(same and got == want_loss, f"resume {what}: bit-exact (losses and final model)", f"model same {same}")
            continue
        ld = loss_diff(got, want_loss)
        report(ld is not None and ld <= LOSS_RTOL, f"resume {what}: losses equal the uninterrupted run's (rel {LOSS_RTOL}; "
               f"largest {ld:.1e})" if ld is not None else f"resume {what}: losses", f"largest relative difference {ld}")
        pd = param_diff(params(os.path.join(out, final)), want_par)
        report(pd <= PARAM_ATOL, f"resume {what}: final parameters equal the uninterrupted run's (abs {PARAM_ATOL}; "
               f"largest {pd:.1e})", f"largest difference {pd}")

    # --- state files of version 2 (before data parallelism: the data position counted micro-batches)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from hardening_util import state_rewrite
    for b, ok in ((12, True), (6, False)):
        out = os.path.join(tmp, f"v2_b{b}")
        shutil.copytree(u1, out)
        for f in os.listdir(out):
            if "00000010" in f:
                os.remove(os.path.join(out, f))
        def to_v2(h, b=b):
            h[1], h[5] = 2, b  # written by an older llmc with -b b (accumulation 12 / b)
        state_rewrite(os.path.join(out, "state_00000005_00000.bin"), to_v2)
        p = mpirun(0, base + ["-b", str(b), "-n", "5", "-o", out, "-y", "1"])
        if ok:
            same = p.returncode == 0 and open(os.path.join(out, final), "rb").read() == open(os.path.join(u1, final), "rb").read()
            report(same, "a version-2 state without accumulation resumes (bit-exact)", p.stderr[-300:])
        else:
            report(p.returncode == 1 and "version 2" in p.stderr and "micro-batches" in p.stderr,
                   "a version-2 state written with accumulation: a clear error (its data position counts micro-batches)",
                   f"exit {p.returncode}: {p.stderr[-300:]}")

    # --- faults -------------------------------------------------------------------------------
    out = os.path.join(tmp, "killed")
    problem, rc, text, took = kill_a_rank(["mpirun", "--oversubscribe", "-np", "3", TRAINER] + base[:-2] + ["-b", "4", "-x", "100000", "-o", out],
                                          3, out, ENV, timeout=60, start_timeout=60)
    report(problem is None and rc != 0 and "signal 9" in text,
           f"a rank killed with SIGKILL: the others exit non-zero within 60 s with a message ({took:.1f} s)",
           problem or f"exit {rc}: {text[-400:]}")

    # a rank that hangs (LLMC_TEST_HANG: rank 1 sleeps before step 3's reduction): the collective
    # watchdog (--dist-timeout 5) makes the others exit non-zero naming it
    t0 = time.time()
    try:
        p = subprocess.run(["mpirun", "--oversubscribe", "-np", "3", TRAINER] + base[:-2] + ["-b", "4", "-x", "5", "--dist-timeout", "5",
                           "-o", os.path.join(tmp, "hung")], capture_output=True, text=True, timeout=60,
                           env={**ENV, "LLMC_TEST_HANG": "1:3"})
        took = time.time() - t0
        report(p.returncode != 0 and "rank 1 did not answer" in p.stderr and "--dist-timeout 5" in p.stderr and "step     2/5" in p.stdout,
               f"a rank that hangs: the others exit non-zero within 60 s naming it ({took:.1f} s)", f"exit {p.returncode}: {p.stderr[-600:]}")
    except subprocess.TimeoutExpired:
        report(False, "a rank that hangs: the others exit within 60 s", "still running after 60 s (no watchdog)")

    args = base + ["-b", "6", "-x", "2"]
    p = subprocess.run(["mpirun", "--oversubscribe", "-np", "1", TRAINER] + args + [":", "-np", "1", TRAINER] + args[:-4] + ["-l", "2e-3"] + args[-4:],
                       capture_output=True, text=True, timeout=120, env=ENV)
    report(p.returncode != 0 and "rank 1 was started differently from rank 0" in p.stderr and "lr" in p.stderr,
           "ranks started with different flags: a startup error naming the rank and the flag", p.stderr[-600:])
    bad = os.path.join(tmp, "other.bin")
    write_shard(bad, toks[:9000])
    p = subprocess.run(["mpirun", "--oversubscribe", "-np", "1", TRAINER] + args + [":", "-np", "1", TRAINER, "-i", bad] + args[2:],
                       capture_output=True, text=True, timeout=120, env=ENV)
    report(p.returncode != 0 and "rank 1 was started differently" in p.stderr and ("train-data" in p.stderr or "training data" in p.stderr),
           "ranks started with different training data: a startup error naming it", p.stderr[-600:])

    p = mpirun(0, base + ["-b", "6", "-pn", "2"])
    report(p.returncode == 1 and "mpirun -np 2" in p.stderr, "-pn 2 without a launcher: says how to start the ranks",
           p.stderr[-300:])

    # ./train_gpt under mpirun (through cudasim): test/cudasim/test_train_gpt_ranks.py

    # --- without mpirun: -pi tcp | fs (llmc/dist/dist_tcp.c), in the build without MPI ---------------
    pi_tests(tmp, base, toks, final)

    # --- a build without MPI --------------------------------------------------------------------
    out = os.path.join(tmp, "nompi")
    p = mpirun(0, base + ["-b", "6", "-pn", "2", "-o", out], trainer=NOMPI)
    report(p.returncode == 1 and "built without MPI" in p.stderr and "libopenmpi-dev" in p.stderr and not os.path.exists(out),
           "a build without MPI asked for -pn 2: a clear error saying how to build with MPI", p.stderr[-300:])
    p = mpirun(2, base + ["-b", "6", "-o", out], trainer=NOMPI)
    report(p.returncode != 0 and "built without MPI" in p.stderr and not os.path.exists(out),
           "a build without MPI started by mpirun -np 2: a clear error on each rank", p.stderr[-300:])

    shutil.rmtree(tmp, ignore_errors=True)
    print(f"{failures()} failure(s)")
    return 1 if failures() else 0


if __name__ == "__main__":
    sys.exit(main())
