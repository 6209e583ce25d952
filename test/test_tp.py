#!/usr/bin/env python3
"""Tensor parallelism of ./train_gpt_cpu (issue 25, first slice: -tp N for GPT-2), ranks on loopback.

A tiny GPT-2 (L 2, NH 4, C 64, V 180 padded to Vp 256, written here) trains 6 steps of the same tokens per step
(-d = 8 sequences) as one process with -b 8 and as:
  tp2 on 2 ranks (-b 8), tp4 on 4 ranks (-b 8), tp2 x dp2 on 4 ranks (-b 4, -z 0 and -z 1),
  tp2 on 2 ranks without mpirun (-pi tcp, the build without MPI);
each follows the one process's loss trajectory within 1e-5 relative and ends with parameters within
float reordering (the one model file rank 0 writes, in the usual format); the replicated tensors'
gradients are checked bit-identical over the tp ranks after every backward (LLMC_TEST_TP_CHECK).
The vocabulary-parallel wte and LM head: each rank holds Vp/tp rows of wte (the padding straddles tp2's
rank 1 and fills tp4's rank 3: the cross-entropy must skip it), the per-position sample of the text
generated during training (-s, -g) is the one process's (the logits row gathered over the group).
Checkpoints: a tp2 run stopped at step 3 and resumed at tp2 is bit-identical to the uninterrupted
run (model and state files, losses); resumed as one process and as tp2 x dp2 it follows the
uninterrupted run within the tolerance (the state holds the whole model's m and v: any layout); the
one process's checkpoint resumed at tp2 follows the one process's run.
--plan -tp 2: the per-rank parameter and activation bytes, equal to what a tp2 rank allocates; the
parameters are the whole count less (1 - 1/tp) of the split tensors' (wte among them) and the logits
(B, T, Vp/tp).
Bad layouts and flags: a clear error (exit 1, nothing written): processes not divisible by tp, NH not
divisible by tp, Vp not divisible by tp (258 at -tp 4), a Llama with -tp 2, -pp 2, -sp 1, --pipeline-schedule, -z 2 with -tp, ./train_gpt -tp 2.
(4*C not divisible by tp cannot happen for a GPT-2 whose NH divides: C = NH * HS.)
Prints PASS:/FAIL: lines; exits non-zero on any failure. Run from the repository root.

Tolerances as test/test_dist.py's: losses relative 1e-5; parameters absolute 1e-4 after 6 AdamW steps
at lr 1e-3 (a real difference moves many weights by ~lr per step).
"""
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import LOOPBACK_MPI, failures, report, write_shard  # noqa: E402
from testlib import log_losses, log_records, model_floats, rel_loss_diff  # noqa: E402

TRAINER = "./train_gpt_cpu"
NOMPI = "build/test/train_gpt_cpu_nompi"
SIM = "build/cudasim/train_gpt"
ENV = {**os.environ, **LOOPBACK_MPI, "LLMC_TEST_TP_CHECK": "1", "OMP_NUM_THREADS": "1"}
LOSS_RTOL = 1e-5
PARAM_ATOL = 1e-4
L, NH, C, V, VP, MAXT = 2, 4, 64, 180, 256, 32


def split_floats(vp=VP):
    """The floats of the tensors -tp splits (llmc/models/gpt2.h's split column: wte, c_attn, c_fc, both c_proj weights)."""
    F = 4 * C
    return vp * C + L * (3 * C * C + 3 * C + C * C + F * C + F + C * F)


def write_model(path, seed=3, vp=VP):
    """A random GPT-2 in llm.c's format, tensors in llmc/models/gpt2.h's order (gains 1, biases 0; the
    padded rows of wte zero)."""
    rng = random.Random(seed)
    normal = lambda n, sd=0.02: [rng.gauss(0.0, sd) for _ in range(n)]  # noqa: E731
    ones, zeros = (lambda n: [1.0] * n), (lambda n: [0.0] * n)
    F, rs = 4 * C, 0.02 / (2 * L) ** 0.5
    vals = (normal(V * C) + zeros((vp - V) * C) + normal(MAXT * C) + ones(L * C) + zeros(L * C) + normal(L * 3 * C * C) + zeros(L * 3 * C) +
            normal(L * C * C, rs) + zeros(L * C) + ones(L * C) + zeros(L * C) + normal(L * F * C) + zeros(L * F) +
            normal(L * C * F, rs) + zeros(L * C) + ones(C) + zeros(C))
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *([20240326, 3, MAXT, V, L, NH, C, vp] + [0] * 248)))
        f.write(struct.pack(f"<{len(vals)}f", *vals))


def run(np, args, trainer=TRAINER, timeout=120):
    cmd = (["mpirun", "--oversubscribe", "-np", str(np), trainer] if np else [trainer]) + args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_tcp(np, args, timeout=120):
    env = {**ENV, "TRAINER": NOMPI, "PORT": str(free_port())}
    return subprocess.run(["scripts/run_dist.sh", "local", str(np), "--pi", "tcp"] + args, capture_output=True,
                          text=True, timeout=timeout, env=env)


def samples(stdout):
    """The texts generated during training (-s, -g): the lines between 'generating:' and the closing '---'."""
    out, lines = [], stdout.splitlines()
    for i, line in enumerate(lines):
        if line == "generating:" and i + 2 < len(lines):
            out.append(lines[i + 2])
    return out


def param_diff(a, b):
    return float("inf") if len(a) != len(b) else max(abs(x - y) for x, y in zip(a, b))


def read(path):
    with open(path, "rb") as f:
        return f.read()


def main():
    if not shutil.which("mpirun"):
        print("SKIP: no mpirun")
        return 0
    tmp = tempfile.mkdtemp(prefix="llmc_tp_")
    try:
        rng = random.Random(11)
        pattern = [rng.randrange(V) for _ in range(53)]
        toks = [pattern[i % 53] if rng.random() < 0.8 else rng.randrange(V) for i in range(6000)]
        tr, va, model = (os.path.join(tmp, n) for n in ("train.bin", "val.bin", "tiny.bin"))
        write_shard(tr, toks[:5000])
        write_shard(va, toks[5000:])
        write_model(model)
        T = 16
        base = ["-i", tr, "-j", va, "-e", model, "-t", str(T), "-d", str(8 * T), "-l", "1e-3", "-u", "2", "-v", "3",
                "-m", "1", "-s", "3", "-g", "4", "--seed", "5", "--threads", "1", "-x", "6", "-n", "3"]
        final = "model_00000006.bin"

        def train(name, np, extra, launcher=run):
            out = os.path.join(tmp, name)
            p = launcher(np, base + extra + ["-o", out])
            return p, out

        p, ref = train("one", 0, ["-b", "8"])
        report(p.returncode == 0, "one process, -b 8: trains", p.stderr[-400:])
        if p.returncode != 0:
            return 1
        ref_loss, ref_par, ref_norm = log_losses(ref), model_floats(os.path.join(ref, final)), log_losses(ref, "grad_norm")
        ref_samples = samples(p.stdout)
        report(len(ref_samples) == 2, "one process: generates a text at steps 3 and 6 (-s 3)", p.stdout[-300:])

        layouts = [("tp2", 2, ["-b", "8", "-tp", "2"], run, "tp2 on 2 ranks"),
                   ("tp4", 4, ["-b", "8", "-tp", "4"], run, "tp4 on 4 ranks"),
                   ("tp2dp2", 4, ["-b", "4", "-tp", "2", "-z", "0"], run, "tp2 x dp2 on 4 ranks, -z 0"),
                   ("tp2dp2z1", 4, ["-b", "4", "-tp", "2", "-z", "1"], run, "tp2 x dp2 on 4 ranks, -z 1"),
                   ("tp2accum", 2, ["-b", "4", "-tp", "2"], run, "tp2 on 2 ranks with 2 accumulation steps (-b 4)"),
                   ("tp2r2", 2, ["-b", "8", "-tp", "2", "-r", "2"], run, "tp2 on 2 ranks, -r 2 (layernorms recomputed)"),
                   ("tp2tcp", 2, ["-b", "8", "-tp", "2"], launch_tcp, "tp2 on 2 ranks over -pi tcp (no mpirun)")]
        outs = {}
        for name, np, extra, launcher, what in layouts:
            p, out = train(name, np, extra, launcher)
            outs[name] = out
            ok = p.returncode == 0
            report(ok, f"{what}: trains", (p.stdout + p.stderr)[-600:])
            if not ok:
                continue
            ld, pd = rel_loss_diff(log_losses(out), ref_loss), param_diff(model_floats(os.path.join(out, final)), ref_par)
            nd = rel_loss_diff(log_losses(out, "grad_norm"), ref_norm)
            report(nd <= LOSS_RTOL, f"{what}: the gradient norm (every element once) follows one process's within "
                   f"{LOSS_RTOL} relative", f"largest relative difference {nd:.3g}")
            report(ld <= LOSS_RTOL, f"{what}: the loss trajectory follows one process's within {LOSS_RTOL} relative",
                   f"largest relative difference {ld:.3g}")
            report(pd <= PARAM_ATOL, f"{what}: the final model file (written by rank 0, whole) equals one process's "
                   f"within {PARAM_ATOL}", f"largest difference {pd:.3g}")
            report("bit-identical on the" in p.stderr and "tensor-parallel ranks" in p.stderr,
                   f"{what}: the replicated tensors' gradients are bit-identical over the tp ranks", p.stderr[-300:])
            comm = [rec.get("comm_bytes", 0) for rec in log_records(out) if "train_loss" in rec]
            report(comm and min(comm) > 0, f"{what}: the step records count the groups' communication", str(comm))
            if name == "tp2":
                report("tensor parallel: rank 0 of 2 holds" in p.stdout, "tp2: the memory print names the rank's part",
                       p.stdout[-500:])
                report(f"wte's vocabulary rows 0..{VP // 2 - 1}" in p.stdout and "and the logits" in p.stdout,
                       "tp2: the memory print says rank 0 holds the first half of wte's rows and its part of the logits",
                       p.stdout[-500:])
            if name in ("tp2", "tp4", "tp2dp2"):
                report(samples(p.stdout) == ref_samples, f"{what}: the texts generated during training are the one "
                       "process's (each position's logits gathered over the vocabulary slices)",
                       f"{samples(p.stdout)} vs {ref_samples}")

        # --- -x 0 (evaluation only) at tp2: the one process's validation loss --------------------------
        ev = ["-i", tr, "-j", va, "-e", os.path.join(ref, final), "-t", str(T), "-b", "4", "-v", "1", "-m", "2",
              "--threads", "1", "-x", "0"]
        vals = []
        for np, extra in ((0, []), (2, ["-tp", "2"])):
            p = run(np, ev + extra)
            got = [float(line.split()[2]) for line in p.stdout.splitlines() if line.startswith("val loss ")]
            vals.append(got[0] if p.returncode == 0 and got else None)
        report(None not in vals and abs(vals[0] - vals[1]) <= LOSS_RTOL * abs(vals[0]),
               "-x 0 at tp2: the validation loss of one process", str(vals))

        # --- the rank order: tp fastest (world rank w is tp rank w % 2 of data-parallel rank w / 2) -------
        p = subprocess.run(["mpirun", "--oversubscribe", "--tag-output", "-np", "4", TRAINER] + base[:-4] +
                           ["-x", "1", "-b", "4", "-tp", "2", "-v", "0", "-s", "0"], capture_output=True, text=True,
                           timeout=120, env={**ENV, "LLMC_TEST_ALL_RANKS_STDOUT": "1"})
        said = {}
        for line in p.stdout.splitlines():
            if "tensor parallel: rank " in line and line.startswith("["):
                w = int(line[1:].split("]")[0].split(",")[1])
                said[w] = int(line.split("tensor parallel: rank ")[1].split()[0])
        report(p.returncode == 0 and said == {0: 0, 1: 1, 2: 0, 3: 1},
               "4 ranks at -tp 2: world rank w is tensor-parallel rank w % 2 (tp fastest, as Megatron)",
               f"rc {p.returncode}, tp rank by world rank {said}: {p.stderr[-300:]}")

        # --- resume: the same layout bit-exact, another layout within the tolerance ---------------------
        outs["one"] = ref
        if os.path.isdir(outs.get("tp2", "")):
            for name, src, np, extra, what in [("same", "tp2", 2, ["-b", "8", "-tp", "2"], "tp2 -> tp2"),
                                               ("to_one", "tp2", 0, ["-b", "8"], "tp2 -> one process"),
                                               ("to_tp2dp2", "tp2", 4, ["-b", "4", "-tp", "2"], "tp2 -> tp2 x dp2"),
                                               ("from_one", "one", 2, ["-b", "8", "-tp", "2"], "one process -> tp2")]:
                d = os.path.join(tmp, "resume_" + name)  # the run as it was after its step-3 checkpoint
                shutil.copytree(outs[src], d)
                for f in ("DONE_00000006", final, final + ".sum", "state_00000006_00000.bin"):
                    os.remove(os.path.join(d, f))
                p = run(np, base + extra + ["-o", d, "-y", "1"])
                if not report(p.returncode == 0 and "resumed from step 3" in p.stdout, f"resume {what}: continues from step 3",
                              (p.stdout + p.stderr)[-500:]):
                    continue
                full = outs[src]
                if name == "same":
                    same = read(os.path.join(d, final)) == read(os.path.join(full, final)) and \
                        read(os.path.join(d, "state_00000006_00000.bin")) == read(os.path.join(full, "state_00000006_00000.bin"))
                    la, lb = log_losses(d), log_losses(full)
                    report(same and all(la[s] == lb[s] for s in (4, 5, 6)),
                           f"resume {what}: model, state and losses of steps 4-6 bit-identical to the uninterrupted run")
                else:
                    la = {s: v for s, v in log_losses(d).items() if s > 3}
                    lb = {s: v for s, v in log_losses(full).items() if s > 3}
                    ld, pd = rel_loss_diff(la, lb), param_diff(model_floats(os.path.join(d, final)), model_floats(os.path.join(full, final)))
                    report(ld <= LOSS_RTOL and pd <= PARAM_ATOL,
                           f"resume {what}: follows the uninterrupted run (the state holds the whole m, v)",
                           f"loss {ld:.3g}, parameters {pd:.3g}")

        # --- --plan -tp 2: one rank's bytes, as a tp2 rank allocates them -------------------------------
        plan = lambda extra: run(0, base[:-2] + ["-b", "8", "--plan", "--json"] + extra)  # noqa: E731
        p1, p2 = plan([]), plan(["-tp", "2", "-pn", "2"])
        ok = p1.returncode == 0 and p2.returncode == 0
        report(ok, "--plan -tp 2 -pn 2: prints a plan", (p1.stderr + p2.stderr)[-300:])
        if ok and os.path.isdir(outs.get("tp2", "")):
            c1, c2 = json.loads(p1.stdout)["classes"], json.loads(p2.stdout)["classes"]
            get = lambda c, k: c[k]["bytes"] if isinstance(c[k], dict) else c[k]  # noqa: E731
            alloc = next(r["mem_by_class"] for r in log_records(outs["tp2"]) if "mem_by_class" in r)
            for k in ("parameters", "activations"):
                report(get(c2, k) < get(c1, k) and get(c2, k) == alloc.get(k),
                       f"--plan -tp 2: per-rank {k} bytes below one process's and equal to a tp2 rank's allocation",
                       f"plan {get(c2, k)}, one process {get(c1, k)}, allocated {alloc.get(k)}")
            want = get(c1, "parameters") - split_floats() // 2 * 4
            report(get(c2, "parameters") == want, "--plan -tp 2: per-rank parameters are the whole less half of the split "
                   "tensors' (wte's vocabulary rows among them)", f"plan {get(c2, 'parameters')}, expected {want}")
        for tp in (2, 4):
            p = plan(["-tp", str(tp), "-pn", str(tp)])
            got = json.loads(p.stdout)["activations"].get("logits") if p.returncode == 0 else None
            report(got == 8 * T * VP // tp * 4, f"--plan -tp {tp}: the per-rank logits are (B, T, Vp/tp)",
                   f"plan {got}, expected {8 * T * VP // tp * 4}: {p.stderr[-200:]}")

        # --- bad layouts and flags: a clear error, exit 1, no run directory -----------------------------
        llama_init = ["-e", "llama3:d1"]
        odd_vp = os.path.join(tmp, "vp258.bin")
        write_model(odd_vp, vp=258)
        bad = [(3, ["-b", "8", "-tp", "2"], "do not divide into tensor-parallel groups", "3 processes with -tp 2"),
               (0, ["-b", "8", "-tp", "2"], "1 process does not divide", "one process with -tp 2"),
               (3, ["-b", "8", "-tp", "3"], "4 attention heads (NH) do not divide by -tp 3", "NH 4 with -tp 3"),
               (4, ["-b", "8", "-tp", "4", "-e", odd_vp], "padded vocabulary Vp 258 does not divide by -tp 4",
                "Vp 258 with -tp 4"),
               (2, ["-b", "8", "-tp", "2"] + llama_init, "tensor parallelism is built for GPT-2 only", "a Llama with -tp 2"),
               (0, ["-b", "8", "-pp", "2"], "pipeline parallelism is not built yet", "-pp 2"),
               (0, ["-b", "8", "-sp", "1"], "sequence parallelism is not built yet", "-sp 1"),
               (0, ["-b", "8", "--pipeline-schedule", "gpipe"], "pipeline schedules are not built yet", "--pipeline-schedule gpipe"),
               (0, ["-b", "8", "--pipeline-schedule", "zb"], "unknown schedule 'zb'", "--pipeline-schedule zb"),
               (0, ["-b", "8", "-tp", "2", "-z", "2"], "-z 2 and 3 (use -z 0 or 1)", "-tp 2 -z 2"),
               (0, ["-b", "8", "-tp", "2", "--plan"], "give the processes of the run, -pn", "--plan -tp 2 without -pn")]
        for i, (np, extra, want, what) in enumerate(bad):
            out = os.path.join(tmp, f"bad{i}")
            p = run(np, base + extra + ["-o", out])  # (a later -e wins)
            report(p.returncode != 0 and "error: " in p.stderr and want in p.stderr and not os.path.exists(os.path.join(out, "log.jsonl")),
                   f"{what}: a clear error ({want})", f"rc {p.returncode}: {p.stderr[-300:]}")
        # the two tp ranks started with different -l (each holds its own part: only the flags can be compared)
        out = os.path.join(tmp, "unlike")
        args = base + ["-b", "8", "-tp", "2", "-o", out]
        lr = args.index("-l") + 1
        other = args[:lr] + ["2e-3"] + args[lr + 1:]
        p = subprocess.run(["mpirun", "--oversubscribe", "-np", "1", TRAINER] + args + [":", "-np", "1", TRAINER] + other,
                           capture_output=True, text=True, timeout=120, env=ENV)
        report(p.returncode != 0 and "was started differently from rank 0" in p.stderr and "--lr" in p.stderr,
               "tp2 ranks started with different -l: a clear error naming the flag", p.stderr[-400:])
        if os.path.exists(SIM):
            p = subprocess.run([SIM] + base + ["-b", "8", "-tp", "2", "-o", os.path.join(tmp, "sim")], capture_output=True,
                               text=True, timeout=60, env=ENV)
            report(p.returncode == 1 and "tensor parallelism is not built yet for ./train_gpt" in p.stderr,
                   "./train_gpt -tp 2: a clear error (not built yet)", p.stderr[-300:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures() else 0


if __name__ == "__main__":
    sys.exit(main())
