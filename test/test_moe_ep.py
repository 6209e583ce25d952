#!/usr/bin/env python3
"""Expert parallelism (issue 24 item 5, -ep N) on ./train_gpt_cpu, ranks on loopback.

A 2-layer Mixtral (E 4, top-2, C 64, F 96, GQA, V 256) written by dev/reference/train_mixtral.py,
6 fp32 steps of 256 tokens (B 2, T 32), each run against one process accumulating the same tokens
per step (-d): train losses and grad norms within 1e-5 relative, final models within 1e-4:
- -ep 2 on 2 ranks (mpirun), the same model bytes twice;
- -ep 2 with 2-way data parallelism on 4 ranks at -z 0, 1 and 2 (mpirun; -z 1 and 2 equal -z 0 bit for bit);
- -ep 2 on 4 ranks over -pi tcp (no MPI: a shell of processes), as mpirun's within float order;
- the log's a2a_bytes (> 0, this rank's bytes sent in the exchanges) and a2a_ms on every step;
- checkpoints are the whole Mixtral: an -ep 2 run's checkpoint resumed by one process (-ep 1), and one
  process's resumed by -ep 2 on 2 ranks, reproduce the uninterrupted runs (losses, final model);
- --plan -ep 2 prints each rank's parameters (the shared tensors + E/2 experts, in closed form) and the
  all-to-all buffers' dropless bound R = N B T min(K, E/N) rows;
- bad inputs are clear errors (exit 1, no run file written): E % N != 0, N not dividing the processes, -ep
  on a dense model, -ep 2 with one process, -ep 2 with -z 3, -ep 0 / -ep x.
Prints PASS:/FAIL: lines; exits non-zero on any failure. Run from the repository root.
"""
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from testlib import LOOPBACK_MPI, expect_error, failed_count, report, write_shard  # noqa: E402

TRAINER = os.environ.get("TRAINER", "./train_gpt_cpu")
PY = "/usr/bin/python3"
L, C, NH, NKV, F, E, K, V, MAXT = 2, 64, 4, 2, 96, 4, 2, 256, 64
B, T, STEPS = 2, 32, 6
LOSS_RTOL, PARAM_ATOL = 1e-5, 1e-4
ENV = {**os.environ, **LOOPBACK_MPI, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "passive"}


def run(cmd, timeout=120):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)


def mpirun(np_, args):
    return run(["mpirun", "--oversubscribe", "-np", str(np_), TRAINER] + args) if np_ > 1 else run([TRAINER] + args)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def tcp_run(np_, args):
    """np_ processes joined by -pi tcp (no launcher); rank 0's CompletedProcess-like (rc, out)"""
    port = free_port()
    procs = [subprocess.Popen([TRAINER] + args + ["-pn", str(np_), "-pr", str(r), "-pi", "tcp", "-ps", f"127.0.0.1:{port}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV) for r in range(np_)]
    outs = [p.communicate(timeout=120) for p in procs]
    return max(p.returncode for p in procs), outs[0][0] + outs[0][1]


def records(out):
    with open(os.path.join(out, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def steps(out, key):
    return {r["step"]: r[key] for r in records(out) if key in r and "train_loss" in r}


def model(path):
    return np.fromfile(path, dtype="<f4", offset=1024)


def rel(a, b):
    """largest relative difference of two {step: value} maps (inf when the steps differ)"""
    if sorted(a) != sorted(b) or not a:
        return float("inf")
    return max(abs(a[s] - b[s]) / abs(b[s]) for s in a)


def agree(name, out, ref, final):
    """out's losses and grad norms within LOSS_RTOL of ref's, final models within PARAM_ATOL"""
    try:
        ld = max(rel(steps(out, "train_loss"), steps(ref, "train_loss")), rel(steps(out, "grad_norm"), steps(ref, "grad_norm")))
        a, b = model(os.path.join(out, final)), model(os.path.join(ref, final))
        pd = float(np.abs(a - b).max()) if a.shape == b.shape else float("inf")
    except OSError as e:
        return report(False, name, str(e))
    return report(ld <= LOSS_RTOL and pd <= PARAM_ATOL,
                  f"{name}: losses and grad norms (rel {LOSS_RTOL}; largest {ld:.1e}) and the final model (abs {PARAM_ATOL}; "
                  f"largest {pd:.1e}) follow one process's", "")


def main():
    tmp = tempfile.mkdtemp(prefix="llmc_moe_ep_")
    try:
        m = os.path.join(tmp, "mixtral.bin")
        p = run([PY, "dev/reference/train_mixtral.py", "--save-model", m, "--depth", str(L), "--channels", str(C), "--heads",
                 str(NH), "--kv-heads", str(NKV), "--ffn", str(F), "--experts", str(E), "--top-k", str(K), "--vocab", str(V),
                 "--max-seq-len", str(MAXT), "--steps", "0"])
        if p.returncode != 0:
            sys.exit(f"the reference failed: {p.stderr[-1500:]}")
        rng = random.Random(5)
        pattern = [rng.randrange(V) for _ in range(41)]
        shard = os.path.join(tmp, "train.bin")
        write_shard(shard, [pattern[i % 41] if rng.random() < 0.7 else rng.randrange(V) for i in range(12000)])
        base = ["-e", m, "-i", shard, "-j", shard, "-b", str(B), "-t", str(T), "-x", str(STEPS), "-v", "0", "-s", "0",
                "--threads", "1", "-l", "2e-3", "-k", "constant", "-c", "0.1", "--seed", "3", "-n", "3"]
        final = f"model_{STEPS:08d}.bin"
        out = lambda name: os.path.join(tmp, name)  # noqa: E731

        def train(np_, name, extra, d):
            q = mpirun(np_, base + ["-d", str(d), "-o", out(name)] + extra)
            if q.returncode != 0:
                print(f"{name}: exit {q.returncode}: {(q.stdout + q.stderr)[-1500:]}")
            return q

        for np_, d in ((1, 128), (1, 256)):
            train(np_, f"one{d}", [], d)
        train(2, "ep2", ["-ep", "2"], 128)
        agree("-ep 2 on 2 ranks (mpirun)", out("ep2"), out("one128"), final)
        train(2, "ep2_again", ["-ep", "2"], 128)
        a, b = (os.path.join(out(d), final) for d in ("ep2", "ep2_again"))
        report(os.path.exists(a) and os.path.exists(b) and open(a, "rb").read() == open(b, "rb").read(),
               "-ep 2 on 2 ranks: the same bits run to run (the exchange's orders are fixed)")
        for z in ("0", "1", "2"):
            train(4, f"ep2dp2_z{z}", ["-ep", "2", "-z", z], 256)
            agree(f"-ep 2 x 2-way data parallelism on 4 ranks at -z {z} (mpirun)", out(f"ep2dp2_z{z}"), out("one256"), final)
        for z, what in (("1", "moments"), ("2", "moments and gradients")):
            a, b = (os.path.join(out(f"ep2dp2_z{q}"), final) for q in ("0", z))
            report(os.path.exists(a) and os.path.exists(b) and open(a, "rb").read() == open(b, "rb").read(),
                   f"-ep 2 on 4 ranks: -z {z} ({what} sharded, the experts' over their 2 replicas) writes -z 0's model "
                   "byte for byte")
        rc, text = tcp_run(4, base + ["-d", "256", "-o", out("tcp"), "-ep", "2"])
        if rc != 0:
            print(f"tcp: exit {rc}: {text[-1500:]}")
        agree("-ep 2 on 4 ranks over -pi tcp", out("tcp"), out("one256"), final)
        # the log: a2a bytes and time of every step
        try:
            recs = [r for r in records(out("ep2")) if "train_loss" in r]
            ok = len(recs) == STEPS and all(r.get("a2a_bytes", 0) > 0 and "a2a_ms" in r for r in recs)
            detail = str(recs[:1])
        except OSError as e:
            ok, detail = False, str(e)
        report(ok, "-ep 2: every step's log record has a2a_bytes (> 0) and a2a_ms", detail[-400:])
        # resume across -ep: the checkpoint of step 3 continued with the other layout
        for src, np_, extra, d, what in (("ep2", 1, [], 128, "an -ep 2 checkpoint resumed by one process (-ep 1)"),
                                         ("one128", 2, ["-ep", "2"], 128, "one process's checkpoint resumed by -ep 2 on 2 ranks")):
            part = out(f"resume_{src}")
            shutil.rmtree(part, ignore_errors=True)
            if os.path.isdir(out(src)):
                shutil.copytree(out(src), part)
                for f in os.listdir(part):
                    if f"{STEPS:08d}" in f:
                        os.remove(os.path.join(part, f))
            q = mpirun(np_, base + ["-d", str(d), "-o", part, "-y", "1"] + extra)
            if q.returncode != 0 or "resumed from step 3" not in q.stdout:
                print(f"resume {src}: exit {q.returncode}: {(q.stdout + q.stderr)[-1500:]}")
            agree(what, part, out(src), final)
        # --plan: this rank's parameters and the exchange buffers
        q = run([TRAINER, "--plan", "-e", m, "-b", str(B), "-t", str(T), "-pn", "2", "-ep", "2"])
        vp, qkv = (V + 127) // 128 * 128, (NH + 2 * NKV) * (C // NH)
        shared = 2 * vp * C + C + L * (2 * C + qkv * C + C * C + E * C)
        experts = L * E * 3 * F * C
        want = f"per rank {shared + experts // 2} parameters = {experts // 2} expert (of {experts}) + {shared} shared"
        rows = f"R = {2 * B * T * min(K, E // 2)} rows a layer"
        report(q.returncode == 0 and want in q.stdout and rows in q.stdout,
               "--plan -ep 2: each rank's parameters (shared + E/2 experts) and the all-to-all bound R = N B T min(K, E/N)",
               (q.stdout + q.stderr)[-800:])
        # bad inputs: clear errors, no run directory
        short = base[:-2] + ["-x", "1"]

        def bad(name, np_, extra, pattern):
            o = out("bad")
            shutil.rmtree(o, ignore_errors=True)
            q = mpirun(np_, short + ["-o", o] + extra)
            left = sorted(os.listdir(o)) if os.path.isdir(o) else []
            expect_error(name, q, pattern) and report(left in ([], [".llmc.lock"]), f"{name}: no run file written "
                                                      "(at most -o's lock, as every early error)", str(left))

        bad("-ep 3 with 4 experts: a clear error naming both", 1, ["-ep", "3"],
            "-ep 3: the 4 experts of -e " + m + " do not split evenly over 3 ranks")
        bad("-ep 2 on 3 processes: a clear error", 3, ["-ep", "2"], "-ep 2 does not divide the 3 processes")
        bad("-ep 2 with one process: a clear error", 1, ["-ep", "2"], "-ep 2 with one process: expert parallelism needs")
        bad("-ep 2 on a dense model (-e d4, GPT-2): a clear error", 1, ["-ep", "2", "-e", "d4"],
            "-e d4 is a dense GPT-2 model (no experts)")
        bad("-ep 2 with -z 3: a clear error", 1, ["-ep", "2", "-z", "3"], "-ep 2 with -z 3: expert parallelism shards")
        bad("-ep 0: a clear error", 1, ["-ep", "0"], "flag -ep (--expert-parallel) must be between 1 and 256, got 0")
        bad("--expert-parallel=x: a clear error", 1, ["--expert-parallel=x"],
            "flag --expert-parallel=x expects an integer, got 'x'")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return failed_count()


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
