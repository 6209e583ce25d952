#!/usr/bin/env python3
"""test_cuda_graph_sim.py - ./train_gpt's micro-step through the cudasim harness (no GPU): the host
synchronisations per step, and --cuda-graph 1 (llmc/cuda/graph.cuh) against --cuda-graph 0.

A tiny fp32 model (V 256, 2 layers) trains 4 steps of 2 accumulated micro-steps:
- the host waits at most accumulation + 3 times per step (cudasim's counter, LLMC_COUNT_SYNCS=1:
  one wait per micro-step for its pinned staging buffer, then the step's loss, the gradient norm
  and the end of the update); before the loss stayed on the device it was 6 per micro-step + 3;
- --cuda-graph 1 captures once and replays the rest of the micro-steps, with losses, norms and
  weights bit-identical to --cuda-graph 0 (the same kernels run), and a run resumed from its
  step-2 checkpoint continues bit-identically; bf16 and fp16 (2 steps) are bit-identical too, and
  so is fp16 with the loss scale halved mid-run (captured again for the new scale);
- --cuda-graph 1 with --offload optimizer says it is not used and trains; --cuda-graph 2 is an error.
Usage: test/test_cuda_graph_sim.py [build/cudasim/train_gpt]"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hardening_util import write_model, write_shard  # noqa: E402

SIM = sys.argv[1] if len(sys.argv) > 1 else "build/cudasim/train_gpt"
ACCUM, STEPS = 2, 4
failed = 0


def report(ok, name, detail=""):
    global failed
    print(f"PASS: {name}" if ok else f"FAIL: {name}: {detail}")
    failed += not ok


def run(args, env_extra=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive", **(env_extra or {}))
    p = subprocess.run([SIM] + args, capture_output=True, text=True, env=env, timeout=300)
    return p.returncode, p.stdout + p.stderr


def series(run_dir):
    path = os.path.join(run_dir, "log.jsonl")
    if not os.path.exists(path):
        return []
    return [(r["step"], r["train_loss"], r["grad_norm"]) for r in map(json.loads, open(path)) if "train_loss" in r]


def read(path):
    return open(path, "rb").read() if os.path.exists(path) else None


def main():
    if not os.access(SIM, os.X_OK):
        print(f"FAIL: build {SIM} first")
        return 1
    W = tempfile.mkdtemp(prefix="llmc_graph.")
    try:
        model, data = os.path.join(W, "model.bin"), os.path.join(W, "train.bin")
        write_model(model, maxT=64, V=256, L=2, NH=2, C=64, Vp=256)
        write_shard(data, [(i * 37 + i // 7) % 256 for i in range(4096)])
        B, T = 2, 16
        common = ["-e", model, "-i", data, "-b", str(B), "-t", str(T), "-d", str(B * T * ACCUM), "-v", "0", "-s", "0",
                  "-x", str(STEPS), "-n", "2", "--precision", "fp32"]
        runs = {}
        for g in (0, 1):
            out_dir = os.path.join(W, f"g{g}")
            rc, out = run(common + ["-o", out_dir, "--cuda-graph", str(g)], {"LLMC_COUNT_SYNCS": "1"})
            runs[g] = (rc, out, out_dir)
            report(rc == 0 and len(series(out_dir)) == STEPS, f"train_gpt (harness) --cuda-graph {g} trains {STEPS} steps",
                   f"exit {rc}: {out[-600:]}")

        # host waits per step
        for g in (0, 1):
            counts = [int(c) for c in re.findall(r"^host syncs: (\d+) in this step$", runs[g][1], re.M)]
            bound = ACCUM + 3
            report(len(counts) == STEPS and all(c <= bound for c in counts),
                   f"--cuda-graph {g}: the host waits at most {bound} times per step of {ACCUM} micro-steps "
                   f"(counted: {counts})", f"counts {counts}")

        # the graph: captured once, replayed for every micro-step after the first
        m = re.search(r"^CUDA graph: (\d+) capture\(s\), (\d+) launch\(es\) for (\d+) micro-steps$", runs[1][1], re.M)
        micro = STEPS * ACCUM
        report(m is not None and (int(m.group(1)), int(m.group(2)), int(m.group(3))) == (1, micro - 1, micro)
               and "CUDA graph" in re.search(r"^backend: .*$", runs[1][1], re.M).group(0),
               f"--cuda-graph 1: one capture, {micro - 1} graph launches for {micro} micro-steps",
               m.group(0) if m else runs[1][1][-400:])
        report("CUDA graph:" not in runs[0][1], "--cuda-graph 0 launches no graph")
        s0, s1 = series(runs[0][2]), series(runs[1][2])
        last = f"model_{STEPS:08d}.bin"
        same_weights = read(os.path.join(runs[0][2], last)) is not None and \
            read(os.path.join(runs[0][2], last)) == read(os.path.join(runs[1][2], last))
        report(len(s0) == STEPS and s0 == s1 and same_weights,
               "--cuda-graph 1 is bit-identical to --cuda-graph 0 in fp32 (losses, norms, final weights)",
               f"{s0} vs {s1}, weights equal: {same_weights}")

        # resume the graph run from its step-2 checkpoint
        part = os.path.join(W, "part")
        shutil.copytree(runs[1][2], part)
        for name in os.listdir(part):
            if re.search(rf"_{STEPS:08d}", name):
                os.remove(os.path.join(part, name))
        rc, out = run(common + ["-o", part, "-y", "1", "--cuda-graph", "1"])
        sp = series(part)
        report(rc == 0 and sp == s1 and read(os.path.join(part, last)) == read(os.path.join(runs[1][2], last)),
               "--cuda-graph 1 resumed from the step-2 checkpoint continues bit-identically",
               f"exit {rc}: {sp} vs {s1}: {out[-400:]}")

        # bf16 and fp16 (master weights, stochastic rounding, the loss scale baked into the graph): bits too
        for prec in ("bf16", "fp16"):
            dirs = [os.path.join(W, f"{prec}_g{g}") for g in (0, 1)]
            outs = [run(common[:-6] + ["-x", "2", "--precision", prec, "-o", d, "--cuda-graph", str(g)])
                    for g, d in zip((0, 1), dirs)]
            a, b = series(dirs[0]), series(dirs[1])
            w = [read(os.path.join(d, "model_00000002.bin")) for d in dirs]
            report(all(rc == 0 for rc, _ in outs) and len(a) == 2 and a == b and w[0] is not None and w[0] == w[1],
                   f"--cuda-graph 1 is bit-identical to --cuda-graph 0 in {prec} (losses, norms, weights)",
                   f"{a} vs {b}: {outs[1][1][-300:]}")

        # fp16 with the loss scale changing mid-run: step 2's gradients made non-finite
        # (LLMC_TEST_INF_RANK=0:2, train_gpt.cu) skip it and halve the scale; the graph bakes dloss
        # (accumulation x the scale) in, so it must be captured again for each new value: the
        # first scale, step 2's infinite weight, the halved scale (3 captures). Losses, norms, the
        # logged scales, the skipped step, the final scale and weights: bit-identical to --cuda-graph 0.
        env = {"LLMC_TEST_INF_RANK": "0:2", "LLMC_TEST_ALL_RANKS_STDOUT": "1"}
        dirs = [os.path.join(W, f"fp16_scale_g{g}") for g in (0, 1)]
        outs = [run(common[:-2] + ["--precision", "fp16", "-o", d, "--cuda-graph", str(g)], env) for g, d in zip((0, 1), dirs)]
        keys = ("step", "train_loss", "grad_norm", "loss_scale", "skipped", "skipped_steps")
        logs = [[{k: r.get(k) for k in keys} for r in map(json.loads, open(os.path.join(d, "log.jsonl"))) if "train_loss" in r]
                if os.path.exists(os.path.join(d, "log.jsonl")) else [] for d in dirs]
        summary = [re.findall(r"^rank 0: parameters crc32 \w+ \| loss scale \S+ \(skipped (\d+)\)$", o, re.M) for _, o in outs]
        lines = [re.findall(r"^rank 0: parameters crc32 .*$", o, re.M) for _, o in outs]
        skipped = [[r["step"] for r in lg if r["skipped"]] for lg in logs]
        m = re.search(r"^CUDA graph: (\d+) capture\(s\)", outs[1][1], re.M)
        w = [read(os.path.join(d, last)) for d in dirs]
        scales = [r["loss_scale"] for r in logs[0]]
        report(all(rc == 0 for rc, _ in outs) and summary[0] == ["1"] and lines[0] == lines[1] and skipped[0] == [2]
               and len(set(scales)) == 2 and scales[1] == scales[0] / 2
               and skipped[1] == [2] and len(logs[0]) >= STEPS and logs[0] == logs[1] and w[0] is not None and w[0] == w[1]
               and m is not None and int(m.group(1)) == 3,
               "fp16, the loss scale halved at step 2 (LLMC_TEST_INF_RANK=0:2): --cuda-graph 1 captures again (3 captures) "
               "and is bit-identical to --cuda-graph 0 (losses, norms, loss scales, the skipped step, weights)",
               f"{lines} skipped {skipped} {m.group(0) if m else None}: {logs[0][:5]} vs {logs[1][:5]}: {outs[1][1][-400:]}")

        # configurations it is not built for: a note, and the run trains kernel by kernel
        rc, out = run(common[:-6] + ["-x", "1", "--cuda-graph", "1", "--offload", "optimizer", "--precision", "fp32"])
        report(rc == 0 and "note: --cuda-graph 1 is not used with --offload optimizer" in out and "CUDA graph:" not in out,
               "--cuda-graph 1 with --offload optimizer: a note, then kernel-by-kernel launches", f"exit {rc}: {out[-400:]}")
        rc, out = run(["-e", model, "-i", data, "--cuda-graph", "2"])
        report(rc == 1 and re.search(r"error: .*--cuda-graph", out) is not None, "--cuda-graph 2 exits 1 naming the flag",
               f"exit {rc}: {out[-300:]}")
    finally:
        shutil.rmtree(W, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
