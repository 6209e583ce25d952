#!/usr/bin/env python3
"""The MLP test architecture through ./train_gpt's whole loop in the cudasim harness (issue 21: the
CUDA runtime trains it through its table entry, mlp_cuda_arch, with no edit of the runtime):

- fp32, -e mlp:d2: train_gpt's first 3 losses equal train_gpt_cpu's from the same seed and data to
  1e-5 relative (the summation orders differ; the model-level checks are test_mlp_cuda's), and the
  backend name says "CUDA MLP fp32";
- bf16, 3 steps with a checkpoint: train_gpt_cpu resumes it to step 5 (the MLP's own file), and
  train_gpt (fp32) the CPU's to step 6 (-y 1: the architecture found once the run directory resolves);
- --cuda-graph 1 (the trunk and the layers' backward replayed as one graph) and --offload optimizer
  (the loop's CPU AdamW) give the same losses and final parameters bit for bit as kernel-by-kernel
  launches with the device optimizer (fp32); fp16 trains, its losses within 5% of the CPU's;
- --plan -e mlp:d2 -r 1 -ge 1: the CUDA plan of its table at -r 0 (the MLP has -r 0 only and no
  GELU); a run with -r 1 -ge 1 notes both and trains at -r 0.
Exits non-zero on any failure.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from testlib import all_built, check_losses_match, failures, report, write_shard  # noqa: E402
from testlib import log_losses as losses, same_bytes as same_file  # noqa: E402

SIM = "build/cudasim/train_gpt"
CPU = "./train_gpt_cpu"
V = 50257  # mlp:dN's vocabulary (GPT-2's tokenizer)


def run(cmd, **extra_env):
    env = dict(os.environ, OMP_WAIT_POLICY="passive", **extra_env)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def main():
    if not all_built(SIM, CPU):
        return 1
    tmp = tempfile.mkdtemp(prefix="llmc_mlp_sim_")
    try:
        shard = os.path.join(tmp, "train.bin")
        rng = np.random.default_rng(5)
        write_shard(shard, [int(t) for t in rng.integers(0, V, 20000)])
        common = ["-e", "mlp:d2", "-i", shard, "-b", "2", "-t", "32", "-v", "0", "-s", "0"]

        # fp32: the CUDA backend's losses are the CPU trainer's
        sim32, cpu32 = os.path.join(tmp, "sim32"), os.path.join(tmp, "cpu32")
        p_sim = run([SIM, *common, "-x", "3", "-n", "3", "--precision", "fp32", "-o", sim32])
        p_cpu = run([CPU, *common, "-x", "3", "-o", cpu32])
        a, b = check_losses_match("train_gpt (harness) -e mlp:d2 fp32: the 3 losses equal train_gpt_cpu's to 1e-5 relative "
                                  "('CUDA MLP fp32')", [(p_sim, sim32), (p_cpu, cpu32)], [1, 2, 3], 1e-5, "CUDA MLP fp32")

        # bf16 with a checkpoint, resumed by the CPU trainer
        out = os.path.join(tmp, "bf16")
        p = run([SIM, *common, "-x", "3", "-n", "3", "-o", out])
        l3 = losses(out)
        ok = p.returncode == 0 and sorted(l3) == [1, 2, 3] and all(np.isfinite(list(l3.values())))
        report(ok and os.path.exists(os.path.join(out, "model_00000003.bin")),
               "train_gpt (harness) -e mlp:d2 bf16: 3 steps and a checkpoint", (p.stdout + p.stderr)[-800:])
        p = run([CPU, *common, "-x", "5", "-n", "5", "-y", "1", "--allow-config-change", "1", "-o", out])
        l5 = losses(out)
        report(p.returncode == 0 and "resumed from step 3" in p.stdout and 4 in l5 and 5 in l5
               and all(np.isfinite(list(l5.values()))),
               "train_gpt_cpu resumes train_gpt's MLP checkpoint (steps 4-5)", (p.stdout + p.stderr)[-800:])
        p = run([SIM, *common, "-x", "6", "-n", "6", "-y", "1", "--precision", "fp32", "--allow-config-change", "1", "-o", out])
        l6 = losses(out)
        report(p.returncode == 0 and "resumed from step 5" in p.stdout and "CUDA MLP fp32" in p.stdout and 6 in l6
               and np.isfinite(l6[6]), "train_gpt (harness) fp32 resumes train_gpt_cpu's MLP checkpoint from the run directory (step 6)",
               (p.stdout + p.stderr)[-800:])

        # --cuda-graph 1 == kernel by kernel (fp32, bits)
        graph = os.path.join(tmp, "graph")
        p = run([SIM, *common, "-x", "3", "-n", "3", "--precision", "fp32", "--cuda-graph", "1", "-o", graph])
        g = losses(graph)
        report(p.returncode == 0 and len(g) == 3 and g == a and "CUDA graph: 1 capture(s)" in p.stdout
               and same_file(os.path.join(graph, "model_00000003.bin"), os.path.join(sim32, "model_00000003.bin")),
               "train_gpt (harness) -e mlp:d2 --cuda-graph 1: losses and final parameters bit-identical to kernel-by-kernel launches",
               f"{g} vs {a}: {(p.stdout + p.stderr)[-600:]}")

        # --offload optimizer (the loop's CPU AdamW) == the device optimizer (fp32, bits; without clipping:
        # the host's and the device's gradient norms differ in rounding); fp16 (loss scaling) trains
        off, dev = os.path.join(tmp, "off"), os.path.join(tmp, "dev")
        noclip = [*common, "-x", "3", "-n", "3", "--precision", "fp32", "--grad-clip", "0"]
        p = run([SIM, *noclip, "--offload", "optimizer", "-o", off])
        ref_run = run([SIM, *noclip, "-o", dev])
        o, d = losses(off), losses(dev)
        report(p.returncode == 0 and ref_run.returncode == 0 and len(o) == 3 and o == d
               and same_file(os.path.join(off, "model_00000003.bin"), os.path.join(dev, "model_00000003.bin")),
               "train_gpt (harness) -e mlp:d2 --offload optimizer: losses and final parameters bit-identical to the device optimizer",
               f"{o} vs {d}: {(p.stdout + p.stderr)[-600:]}")
        p = run([SIM, *common, "-x", "3", "--precision", "fp16", "-o", os.path.join(tmp, "fp16")])
        h = losses(os.path.join(tmp, "fp16"))
        report(p.returncode == 0 and sorted(h) == [1, 2, 3] and all(abs(h[s] - b[s]) <= 0.05 * abs(b[s]) for s in h),
               "train_gpt (harness) -e mlp:d2 fp16: 3 steps, losses within 5% of the CPU trainer's",
               f"{h} vs {b}: {(p.stdout + p.stderr)[-600:]}")

        # --plan: the CUDA plan of the MLP's table at -r 0; a run notes -r and -ge and runs -r 0
        p = run([SIM, "--plan", "-e", "mlp:d2", "-b", "2", "-t", "32", "-r", "1", "-ge", "1"])
        report(p.returncode == 0 and re.search(r"^memory plan \(GPU.*B 2, T 32, -r 0", p.stdout, re.M)
               and re.search(r"logits .*\(head_rows, Vp\)", p.stdout),
               "train_gpt --plan -e mlp:d2 -r 1 -ge 1: the CUDA plan of its table at -r 0", (p.stdout + p.stderr)[-800:])
        p = run([SIM, *common, "-x", "1", "--precision", "fp32", "-r", "1", "-ge", "1"])
        report(p.returncode == 0 and "note: -r 1: the CUDA MLP keeps every activation" in p.stdout
               and "note: -ge 1: a MLP has no GELU" in p.stdout and "recompute 0" in p.stdout,
               "train_gpt (harness) -e mlp:d2 -r 1 -ge 1: both flags noted, trained at -r 0", (p.stdout + p.stderr)[-800:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures() else 0


if __name__ == "__main__":
    sys.exit(main())
