#!/usr/bin/env python3
"""--optimizer adafactor (issue 26 item 6) against the PyTorch reference dev/reference/adafactor.py.

- a tiny GPT-2 (no first moment, weight decay) and Llama 3 (--adafactor-beta1 0.9, weight decay; and
  --adafactor-relative-step 1): the trainer's 10-step loss trajectory and final parameters equal the
  reference's in fp32 (every step on the reference's batch, constant lr); a run with another decay
  rate does not (the comparison can fail); the reference against transformers' Adafactor (4.36.2, in
  test_lora's build/pyref);
- checkpoints: 5 steps then -y 1 to 10 gives the uninterrupted run's losses, model and state byte
  for byte (with and without the first moment); the state file says Adafactor ([30] = 2); resuming
  with the other --optimizer is a clear error either way (also with --allow-config-change 1);
- 2 ranks (mpirun): -z 0 and -z 1 (state sharded by whole matrices) write the same bytes and
  equal 1 rank within float reordering; a 2-rank -z 1 checkpoint resumes at -z 0 bit-exactly;
- bad flag values and combinations are clear errors naming the flag;
- --plan: Adafactor's state bytes in closed form (GPT-2 124M: row + column statistics for the
  matrices, full statistics for the vectors; with beta1 the first moment), a fraction of AdamW's,
  and the -z 1 shards of 2 ranks add up to it;
- ./train_gpt in the cudasim harness (when built): --offload optimizer trains with the host
  Adafactor (the CPU trainer's losses), without it a clear error.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "dev", "reference"))
from testlib import LOOPBACK_MPI, expect_error, failed_count, report  # noqa: E402

PY = "/usr/bin/python3"
TRAINER = "./train_gpt_cpu"
SIM = "build/cudasim/train_gpt"
B, T, STEPS = 4, 32, 10
ENV = {**os.environ, "OMP_NUM_THREADS": "1", **LOOPBACK_MPI}
# fp32, 10 steps: the trainer and the reference sum in other orders; the observed differences are
# ~1e-5 of the loss and ~1e-3 of a tensor's largest change, these bounds a few times that
LOSS_ATOL = 2e-4
PARAM_RTOL = 5e-3

CASES = {  # name: (arch, lr, reference flags, trainer flags)
    "GPT-2": ("gpt2", 1e-3, [], []),
    "Llama 3, beta1 0.9": ("llama3", 1e-2, ["--beta1", "0.9"], ["--adafactor-beta1", "0.9"]),
    "Llama 3, relative step": ("llama3", 1e-2, ["--relative-step", "1"], ["--adafactor-relative-step", "1"]),
}


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV, **kw)


def train_cmd(init, shard, lr, extra=(), steps=STEPS, outdir=None, trainer=TRAINER):
    cmd = [trainer, "-e", init, "-i", shard, "-j", shard, "-b", str(B), "-t", str(T), "-x", str(steps), "-k",
           "constant", "-l", str(lr), "-c", "0.1", "--shuffle", "0", "-v", "0", "-s", "0", "-r", "0",
           "--optimizer", "adafactor"]
    if trainer == TRAINER:
        cmd += ["--threads", "1"]
    return cmd + (["-o", outdir] if outdir else []) + list(extra)


def log_steps(outdir):
    with open(os.path.join(outdir, "log.jsonl")) as f:
        return {r["step"]: r for r in map(json.loads, f) if "train_loss" in r}


def model_params(path):
    return np.frombuffer(open(path, "rb").read(), "<f4", offset=1024)


def same_bytes(a, b):
    return open(a, "rb").read() == open(b, "rb").read()


def tensor_table(arch):
    """(name, shape) of the reference's table for the test models (train_gpt2.py / train_llama3.py)."""
    import train_gpt2 as ref
    if arch == "gpt2":
        cfg = ref.Config(max_seq_len=64, vocab_size=1000, padded_vocab=ref.padded_vocab_size(1000), n_layer=2,
                         n_head=4, channels=64).validate()
        return [(n, s) for n, s, _, _ in ref.param_table(cfg)]
    import train_llama3 as ll
    return [(n, s) for n, s, _, _ in ll.param_table(ll.LlamaConfig(64, 1000, 2, 4, 2, 64, 256))]


def compare(arch, got, want, start):
    """Per tensor, the largest difference against the largest change the reference made. GPT-2's
    qkvb is held to a looser bound: the gradient of its k third is zero in exact arithmetic (the
    softmax does not see a bias added to every key), so it is float noise whose sign Adafactor's
    normalised update follows (+-lr a step, in any two implementations): that third is left out,
    and since the unit's RMS clipping sums over it the q and v thirds differ by a few percent.
    Returns the tensors out of bounds."""
    bad, o = [], 0
    for name, shape in tensor_table(arch):
        n = int(np.prod(shape))
        a, b, z = (x[o:o + n].reshape(shape).copy() for x in (got, want, start))
        o += n
        rtol = PARAM_RTOL
        if name == "qkvb":
            C = shape[1] // 3
            a[:, C:2 * C] = b[:, C:2 * C]
            rtol = 0.1
        diff, change = float(np.abs(a - b).max()), float(np.abs(b - z).max())
        if diff > rtol * change + 1e-7:
            bad.append((name, diff, change))
    return bad


def reference(tmp, name, arch, lr, flags):
    model, shard, out = (os.path.join(tmp, f"{name}.{ext}") for ext in ("bin", "shard", "npz"))
    p = run([PY, "dev/reference/adafactor.py", "--arch", arch, "--lr", str(lr), "--weight-decay", "0.1",
             "--batch-size", str(B), "--seq-len", str(T), "--steps", str(STEPS), "--save-model", model,
             "--save-shard", shard, "--out", out] + flags)
    if p.returncode != 0:
        sys.exit(f"reference failed: {p.stderr[-2000:]}")
    return model, shard, np.load(out)


def trajectories(tmp):
    """The cases against the reference; returns {name: (model, shard, lr, trainer flags, run dir)}."""
    runs = {}
    for i, (name, (arch, lr, rflags, tflags)) in enumerate(CASES.items()):
        model, shard, ref = reference(tmp, f"ref{i}", arch, lr, rflags)
        out = os.path.join(tmp, f"run{i}")
        p = run(train_cmd(model, shard, lr, tflags + ["-n", "5"], outdir=out))
        if not report(p.returncode == 0, f"{name}: train_gpt_cpu --optimizer adafactor runs", (p.stdout + p.stderr)[-1500:]):
            continue
        runs[name] = (model, shard, lr, tflags, out)
        steps = log_steps(out)
        got = np.array([steps[s]["train_loss"] for s in range(1, STEPS + 1)])
        worst = float(np.abs(got - ref["losses"]).max())
        report(worst <= LOSS_ATOL, f"{name}: the 10-step loss trajectory equals the reference's (fp32)",
               f"largest difference {worst:.3g}: got {got.tolist()}, reference {ref['losses'].tolist()}")
        final = model_params(os.path.join(out, f"model_{STEPS:08d}.bin"))
        bad = compare(arch, final, ref["params"], model_params(model))
        report(not bad, f"{name}: the parameters after 10 steps equal the reference's (fp32)",
               f"(tensor, largest difference, largest change): {bad[:4]}")
        if i == 0:  # the comparison can fail: another decay rate is another optimizer
            other = os.path.join(tmp, "other_rate")
            p = run(train_cmd(model, shard, lr, tflags + ["--adafactor-decay-rate", "-0.7"], outdir=other))
            diverged = p.returncode == 0 and compare(arch, model_params(os.path.join(other, f"model_{STEPS:08d}.bin")),
                                                     ref["params"], model_params(model))
            report(bool(diverged), f"{name}: --adafactor-decay-rate -0.7 does not match the reference (-0.8): the "
                                   "comparison tells optimizers apart", (p.stdout + p.stderr)[-800:])
    return runs


def against_transformers():
    """The reference's Adafactor against transformers' on random tensors (a 2-D and a 1-D one, 5
    steps, beta1 None and 0.9, weight decay; relative step with parameter scale): transformers
    4.36.2 from test_lora's build/pyref."""
    import test_lora  # its reference libraries: transformers 4.36.2 in build/pyref, installed when missing
    if not test_lora.ensure_pyref():
        return  # reported as a FAIL by ensure_pyref
    sys.path.insert(0, test_lora.PYREF)
    import torch
    from transformers.optimization import Adafactor as HF
    import adafactor as mine
    gen = torch.Generator().manual_seed(5)
    for beta1, relative in ((None, False), (0.9, False), (None, True)):
        ps = [torch.randn(12, 7, generator=gen), torch.randn(9, generator=gen)]
        hp = [torch.nn.Parameter(p.clone()) for p in ps]
        lr = None if relative else 1e-2
        hf = HF(hp, lr=lr, beta1=beta1, weight_decay=0.1, relative_step=relative, scale_parameter=relative,
                warmup_init=False)
        ours = mine.Adafactor(lr, beta1=beta1, weight_decay=0.1, relative_step=relative, scale_parameter=relative)
        op = [p.clone() for p in ps]
        for _ in range(5):
            gs = [torch.randn(p.shape, generator=gen) for p in ps]
            for p, g in zip(hp, gs):
                p.grad = g.clone()
            hf.step()
            ours.step([(p, g, True) for p, g in zip(op, gs)])
        diff = max(float((a - b.detach()).abs().max()) for a, b in zip(op, hp))
        report(diff < 1e-6, f"the reference's Adafactor equals transformers' (beta1 {beta1}, relative step {relative})",
               f"difference {diff}")


def resume(tmp, runs):
    for name, (model, shard, lr, tflags, out) in runs.items():
        if "relative" in name:
            continue
        out2 = os.path.join(tmp, "resume_" + os.path.basename(out))
        shutil.copytree(out, out2)
        for f in ("DONE_00000010", "model_00000010.bin", "model_00000010.bin.sum", "state_00000010_00000.bin"):
            os.remove(os.path.join(out2, f))
        p = run(train_cmd(model, shard, lr, tflags + ["-n", "5", "-y", "1"], outdir=out2))
        ok = p.returncode == 0 and "resumed from step 5" in p.stdout
        if ok:
            a, b = log_steps(out), log_steps(out2)
            ok = all(a[s]["train_loss"] == b[s]["train_loss"] for s in range(6, STEPS + 1))
            ok = ok and all(same_bytes(os.path.join(out, f), os.path.join(out2, f))
                            for f in ("model_00000010.bin", "state_00000010_00000.bin"))
        report(ok, f"{name}: 5 steps, then -y 1 to 10: the uninterrupted run's losses, model and state byte for byte",
               (p.stdout + p.stderr)[-1500:])
        state = open(os.path.join(out, "state_00000005_00000.bin"), "rb").read(1024)
        report(struct.unpack("<256i", state)[30] == 2, f"{name}: the state file says Adafactor (header [30] = 2)")
    # the other optimizer's state: a clear error either way, --allow-config-change or not
    if not runs:
        report(False, "resume checks: no trainer run to resume")
        return
    name = next(iter(runs))
    model, shard, lr, tflags, out = runs[name]
    for allow in ([], ["--allow-config-change", "1"]):
        d = os.path.join(tmp, f"to_adamw{len(allow)}")
        shutil.copytree(out, d)
        os.remove(os.path.join(d, "DONE_00000010"))
        cmd = [c for c in train_cmd(model, shard, lr, ["-y", "1"] + allow, outdir=d) if c not in ("--optimizer", "adafactor")]
        want = "--optimizer adafactor" if allow else "--optimizer"
        expect_error(f"an Adafactor checkpoint resumed with --optimizer adamw{' --allow-config-change 1' if allow else ''}: "
                     "a clear error", run(cmd), want)
    d = os.path.join(tmp, "adamw_run")
    cmd = [c for c in train_cmd(model, shard, lr, ["-n", "5"], steps=5, outdir=d) if c not in ("--optimizer", "adafactor")]
    p = run(cmd)
    report(p.returncode == 0, "an AdamW run for the next check", (p.stdout + p.stderr)[-600:])
    expect_error("an AdamW checkpoint resumed with --optimizer adafactor --allow-config-change 1: a clear error",
                 run(train_cmd(model, shard, lr, ["-y", "1", "--allow-config-change", "1"], outdir=d)),
                 "holds the state of --optimizer adamw")


def ranks(tmp, runs):
    name = "Llama 3, beta1 0.9"
    if name not in runs or not shutil.which("mpirun"):
        print("SKIP: 2 ranks (no mpirun)" if name in runs else "SKIP: 2 ranks (no Llama run)")
        return
    model, shard, lr, tflags, one = runs[name]
    dirs = {}
    for z in ("0", "1"):
        d = dirs[z] = os.path.join(tmp, f"ranks_z{z}")
        cmd = ["mpirun", "--oversubscribe", "-np", "2"] + [c for c in train_cmd(model, shard, lr, tflags + ["-n", "5", "-z", z],
                                                                                  outdir=d)]
        cmd[cmd.index("-b") + 1] = str(B // 2)
        p = run(cmd)
        if not report(p.returncode == 0, f"2 ranks -z {z} run", (p.stdout + p.stderr)[-1500:]):
            return
        if z == "1":
            report("state sharded by whole units" in p.stdout and "Adafactor" in p.stdout,
                   "-z 1: the startup print names Adafactor's state sharded by whole units", p.stdout[-1500:])
    same = all(same_bytes(os.path.join(dirs["0"], f), os.path.join(dirs["1"], f))
               for f in ("model_00000010.bin", "state_00000010_00000.bin", "state_00000005_00000.bin"))
    report(same, "2 ranks: -z 0 and -z 1 write the same model and state bytes")
    a, b = log_steps(one), log_steps(dirs["1"])
    worst = max(abs(a[s]["train_loss"] - b[s]["train_loss"]) for s in range(1, STEPS + 1))
    diff = float(np.abs(model_params(os.path.join(one, "model_00000010.bin")) -
                        model_params(os.path.join(dirs["1"], "model_00000010.bin"))).max())
    report(worst <= LOSS_ATOL and diff < 1e-4, "2 ranks -z 1 equal 1 rank within float reordering",
           f"loss {worst:.3g}, parameters {diff:.3g}")
    # the -z 1 checkpoint of step 5 (gathered from the ranks' units) resumed at -z 0: the same steps
    d = os.path.join(tmp, "ranks_resume")
    shutil.copytree(dirs["1"], d)
    for f in ("DONE_00000010", "model_00000010.bin", "model_00000010.bin.sum", "state_00000010_00000.bin"):
        os.remove(os.path.join(d, f))
    cmd = ["mpirun", "--oversubscribe", "-np", "2"] + train_cmd(model, shard, lr, tflags + ["-n", "5", "-z", "0", "-y", "1"],
                                                                 outdir=d)
    cmd[cmd.index("-b") + 1] = str(B // 2)
    p = run(cmd)
    ok = p.returncode == 0 and same_bytes(os.path.join(d, "model_00000010.bin"), os.path.join(dirs["1"], "model_00000010.bin"))
    report(ok, "2 ranks: the -z 1 checkpoint of step 5 resumed at -z 0 gives the -z 1 run's model byte for byte",
           (p.stdout + p.stderr)[-1500:])


def bad_flags(tmp, shard):
    base = [TRAINER, "-e", "d1", "-i", shard, "-j", shard, "-b", "1", "-t", "16", "-x", "1", "-v", "0", "-s", "0"]
    for extra, pattern in [
            (["--optimizer", "sgd"], "--optimizer"),
            (["--optimizer", "adafactor", "--adafactor-beta1", "1"], "--adafactor-beta1"),
            (["--optimizer", "adafactor", "--adafactor-beta1", "-0.5"], "--adafactor-beta1"),
            (["--optimizer", "adafactor", "--adafactor-clip", "0"], "--adafactor-clip"),
            (["--optimizer", "adafactor", "--adafactor-clip", "nan"], "--adafactor-clip"),
            (["--optimizer", "adafactor", "--adafactor-decay-rate", "0.5"], "--adafactor-decay-rate"),
            (["--optimizer", "adafactor", "--adafactor-relative-step", "2"], "--adafactor-relative-step"),
            (["--adafactor-beta1", "0.9"], "--optimizer adafactor"),
            (["--optimizer", "adafactor", "-z", "2"], "-z 2"),
            (["--optimizer", "adafactor", "--optim-state", "int8"], "--optim-state"),
            (["--optimizer", "adafactor", "--memory-budget", "1G"], "--memory-budget"),
            (["--optimizer", "adafactor", "--beta2", "0.99"], "--adafactor-decay-rate"),
            (["--optimizer", "adafactor", "--lora-rank", "4"], "--lora-rank")]:
        expect_error(f"{' '.join(extra)}: a clear error naming the flag", run(base + extra), pattern)


def plan():
    """GPT-2 124M (d12): Vp 50304, C 768, L 12, maxT 1024, F 3072."""
    Vp, C, L, maxT, F = 50304, 768, 12, 1024, 3072
    stats = (Vp + C) + (maxT + C) + L * (2 * C + (3 * C + C) + 3 * C + (C + C) + C + 2 * C + (F + C) + F + (C + F) + C) + 2 * C
    base = [TRAINER, "-e", "d12", "-b", "4", "-t", "1024", "--plan", "--json"]
    got = {}
    for label, extra in (("adamw", []), ("adafactor", ["--optimizer", "adafactor"]),
                         ("beta1", ["--optimizer", "adafactor", "--adafactor-beta1", "0.9"])):
        p = run(base + extra)
        if not report(p.returncode == 0, f"--plan --json ({label}) runs", (p.stdout + p.stderr)[-600:]):
            return
        got[label] = json.loads(p.stdout)
    n = got["adamw"]["parameters"]
    c = got["adafactor"]["classes"]
    ok = c["adamw_v"] == 4 * stats and c["adamw_m"] == 0
    ok = ok and got["beta1"]["classes"]["adamw_m"] == 4 * n and got["beta1"]["classes"]["adamw_v"] == 4 * stats
    saved = got["adamw"]["peak_bytes"] - got["adafactor"]["peak_bytes"]
    ok = ok and saved == 8 * n - 4 * stats
    report(ok, f"--plan: Adafactor's statistics for GPT-2 124M are {4 * stats} bytes in closed form ({100 * stats / (2 * n):.2f}% "
               "of AdamW's m + v), the first moment 4 bytes a parameter with beta1, the peak lower by the difference",
           f"classes {c}, beta1 {got['beta1']['classes']}, peaks {got['adamw']['peak_bytes']} {got['adafactor']['peak_bytes']}")
    p = run([TRAINER, "-e", "d12", "-b", "4", "-t", "1024", "--plan", "--optimizer", "adafactor"])
    report(p.returncode == 0 and "optimizer: Adafactor: second-moment statistics" in p.stdout and "of AdamW's m + v" in p.stdout,
           "--plan (text) says what Adafactor's classes hold against AdamW's bytes", p.stdout[-800:])
    parts = []
    for r in (0, 1):
        p = run(base + ["--optimizer", "adafactor", "-z", "1", "-pn", "2", "-pr", str(r)])
        parts.append(json.loads(p.stdout)["classes"]["adamw_v"] if p.returncode == 0 else -1)
    report(sum(parts) == 4 * stats and min(parts) > 0, "--plan -z 1 on 2 ranks: the ranks' statistics (whole units) add up "
                                                       "to the whole", f"ranks {parts}, whole {4 * stats}")


def cudasim(tmp, runs):
    if not os.access(SIM, os.X_OK):
        print(f"SKIP: {SIM} not built (make build/cudasim/train_gpt)")
        return
    name = "GPT-2"
    if name not in runs:
        return
    model, shard, lr, tflags, out = runs[name]
    d = os.path.join(tmp, "sim")
    p = run(train_cmd(model, shard, lr, tflags + ["--offload", "optimizer", "--precision", "fp32"], steps=3, outdir=d,
                      trainer=SIM))
    ok = p.returncode == 0 and "Adafactor" in p.stdout
    if ok:
        a, b = log_steps(out), log_steps(d)
        ok = all(abs(a[s]["train_loss"] - b[s]["train_loss"]) <= LOSS_ATOL for s in (1, 2, 3))
    report(ok, "./train_gpt (cudasim) --offload optimizer --optimizer adafactor: the CPU trainer's losses", (p.stdout + p.stderr)[-1500:])
    if shutil.which("mpirun"):  # 2 ranks through cudasim's NCCL: -z 1 (whole units) writes -z 0's bytes
        dirs = []
        for z in ("0", "1"):
            dirs.append(os.path.join(tmp, f"sim_ranks{z}"))
            cmd = ["mpirun", "--oversubscribe", "-np", "2"] + train_cmd(
                model, shard, lr, tflags + ["--offload", "optimizer", "--precision", "fp32", "-z", z], steps=2,
                outdir=dirs[-1], trainer=SIM)
            cmd[cmd.index("-b") + 1] = str(B // 2)
            p = run(cmd)
            if p.returncode != 0:
                break
        ok = p.returncode == 0 and all(same_bytes(os.path.join(dirs[0], f), os.path.join(dirs[1], f))
                                       for f in ("model_00000002.bin", "state_00000002_00000.bin"))
        report(ok, "./train_gpt (cudasim), 2 ranks --offload optimizer: -z 1 writes -z 0's model and state bytes",
               (p.stdout + p.stderr)[-1500:])
    expect_error("./train_gpt (cudasim) --optimizer adafactor without --offload optimizer: a clear error",
                 run(train_cmd(model, shard, lr, ["--precision", "fp32"], steps=1, trainer=SIM)), "--offload optimizer")


def main():
    tmp = tempfile.mkdtemp(prefix="llmc_adafactor_")
    try:
        runs = trajectories(tmp)
        against_transformers()
        resume(tmp, runs)
        ranks(tmp, runs)
        bad_flags(tmp, next(iter(runs.values()))[1] if runs else os.path.join(tmp, "none"))
        plan()
        cudasim(tmp, runs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return failed_count()


if __name__ == "__main__":
    sys.exit(main())
