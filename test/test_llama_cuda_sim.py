#!/usr/bin/env python3
"""A Llama 3 through ./train_gpt's whole loop in the cudasim harness (issue 11; no GPU): a small
llmc Llama file written here (L 2, C 64, NH 4, NKV 2, F 128, V 512, untied head, RoPE theta 500000).

- fp32: train_gpt's first 3 losses equal train_gpt_cpu's from the same file and data to 1e-5
  relative (the summation orders differ; the model-level checks are test_gpt's Llama section);
- bf16, 3 steps with a checkpoint and --save-hf 1: the checkpoint is llmc's Llama file and the HF
  directory a LlamaForCausalLM; train_gpt_cpu resumes it to step 5, train_gpt (fp32) to step 6;
- --offload optimizer (the loop's CPU AdamW) gives the device optimizer's losses and final
  parameters bit for bit (fp32), as for GPT-2; --cuda-graph 1 too; --optim-state int8 trains;
- under mpirun -np 2 (a build with MPI: cudasim's NCCL), -z 1 (sharded m, v, master) writes the
  same model and state bits as -z 0 in bf16, as for GPT-2; -z 2 and -z 3 on 2 ranks x B 1 equal one
  process x B 2 in fp32 (losses 1e-5 relative, weights 1e-4 absolute);
- --plan -e llama3.2-1b prints the CUDA plan with the CPU plan's parameter count, nothing built;
- --memory-budget prices the CUDA Llama's plan: between the -b 8 and -b 4 plans it chooses a -b
  whose plan fits (-r not searched, and said so), with the same -d; that run's measured device use
  is within the budget and its fp32 losses equal the unconstrained run's (1e-5 relative); on a
  (simulated) device smaller than the plan the same search runs with its free memory;
  --plan --memory-budget on llama3.1-8b (far beyond this machine) against closed forms of its
  parameter count and model-state classes, the plan of the chosen -b, and the next larger -b;
  a budget nothing fits is an error naming --memory-budget and the smallest peak.
"""
import re
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
from testlib import all_built, check_losses_match, failures, report, same_bytes, write_shard  # noqa: E402
from testlib import log_losses as losses  # noqa: E402

SIM = "build/cudasim/train_gpt"
CPU = "./train_gpt_cpu"
L, C, NH, NKV, F, V, MAXT = 2, 64, 4, 2, 128, 512, 64


def run(cmd, **extra_env):
    env = dict(os.environ, OMP_WAIT_POLICY="passive", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               **extra_env)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def llama_file(path, seed=7):
    """llmc's Llama checkpoint (llmc/models/llama.h): int32 header[256], then the table's tensors in fp32."""
    h = [0] * 256
    h[0:12] = [20261130, 1, 1, MAXT, V, V, L, NH, NKV, C, F, 0]
    hs = C // NH
    qkv = (NH + 2 * NKV) * hs
    rng = np.random.default_rng(seed)
    shapes = [("wte", V * C, 0.02), ("ln1w", L * C, None), ("qkvw", L * qkv * C, 0.02), ("attprojw", L * C * C, 0.01),
              ("ln2w", L * C, None), ("fcw", L * 2 * F * C, 0.02), ("fcprojw", L * C * F, 0.01), ("lnfw", C, None),
              ("lm_head", V * C, 0.02)]
    parts = [np.ones(n, np.float32) if std is None else rng.normal(0, std, n).astype(np.float32) for _, n, std in shapes]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *h))
        f.seek(16 * 4)
        f.write(struct.pack("<5f", 1e-5, 500000.0, 0.0, 0.0, 0.0))
        f.seek(1024)
        for p in parts:
            f.write(p.tobytes())


def same_file(tmp, run_a, run_b, name):
    """Do both runs have the file, byte for byte the same?"""
    return same_bytes(os.path.join(tmp, run_a, name), os.path.join(tmp, run_b, name))


def plan_json(args):
    p = run([SIM, "--plan", "--json", *args])
    try:
        return json.loads(p.stdout), p
    except ValueError:
        return {}, p


def check_budget(tmp, model, shard):
    """--memory-budget with a Llama: the tiny file (trained), then llama3.1-8b (planned only)."""
    cfg = ["-e", model, "-t", "32", "-d", "512", "--precision", "fp32"]
    peak = {b: plan_json(cfg + ["-b", str(b)])[0].get("peak_bytes", 0) for b in (8, 4)}
    budget = (peak[8] + peak[4]) // 2  # -b 8 does not fit, -b 4 does (bytes: a plain number is a size)
    got, p = plan_json(cfg + ["-b", "8", "--memory-budget", str(budget)])
    report(peak[4] < budget < peak[8] and got.get("peak_bytes", budget + 1) <= budget and got.get("B", 8) < 8
           and got.get("recompute") == 0 and got.get("total_batch") == 512
           and "-r not searched: the CUDA Llama has -r 0 only" in p.stderr,
           f"train_gpt --plan --memory-budget {budget} -e <Llama> -b 8 (plan {peak[8]} bytes): a -b whose plan fits, "
           "-d 512 kept, -r 0 (said not searched)", f"{peak} {dict((k, got.get(k)) for k in ('B', 'peak_bytes'))}: {p.stderr[-400:]}")
    train = ["-e", model, "-i", shard, "-t", "32", "-d", "512", "-b", "8", "-v", "0", "-s", "0", "-x", "2", "--precision", "fp32"]
    fit = run([SIM, *train, "--memory-budget", str(budget), "-o", os.path.join(tmp, "fit")])
    ref = run([SIM, *train, "-o", os.path.join(tmp, "ref")])
    chose = re.search(r"chose -r 0, -b (\d+), -z 0, --offload none, -d 512", fit.stdout)
    measured = re.search(r"measured \(cudaMemGetInfo\) ([0-9.]+) MiB", fit.stdout)
    a, b = losses(os.path.join(tmp, "fit")), losses(os.path.join(tmp, "ref"))
    ok = fit.returncode == 0 and ref.returncode == 0 and chose and int(chose.group(1)) == got.get("B")
    ok = ok and measured and float(measured.group(1)) * 1048576 <= budget and sorted(a) == sorted(b) == [1, 2]
    report(ok and all(abs(a[s] - b[s]) <= 1e-5 * abs(b[s]) for s in a),
           "train_gpt (harness) -e <Llama> --memory-budget: trains the chosen -b, measured device use within the budget, "
           "fp32 losses equal the unconstrained run's (1e-5 relative)",
           f"{a} vs {b}: {(fit.stdout + fit.stderr)[-800:]}")

    # a device smaller than the -b 8 plan (cudasim's): the same search with its free memory as the budget
    device_mb = budget // 1048576
    p = run([SIM, *train[:-4], "-x", "1", "--precision", "fp32", "-o", os.path.join(tmp, "small")],
            CUDASIM_DEVICE_MEMORY_MB=str(device_mb))
    report(peak[4] < device_mb * 1048576 < peak[8] and p.returncode == 0
           and "the plan exceeds the device's free memory" in p.stdout and re.search(r"chose -r 0, -b [1-4],", p.stdout)
           and sorted(losses(os.path.join(tmp, "small"))) == [1],
           f"train_gpt (harness) -e <Llama> on a {device_mb} MiB device (plan {peak[8]} bytes): searched with its free "
           "memory and trained", (p.stdout + p.stderr)[-800:])

    # llama3.1-8b, bf16 with fp32 master weights: closed forms for the chosen -b
    V, C, Lr, NH, NKV, F = 128256, 4096, 32, 32, 8, 14336
    N = 2 * V * C + C + Lr * (2 * C + (NH + 2 * NKV) * (C // NH) * C + C * C + 3 * F * C)  # untied head
    big = ["-e", "llama3.1-8b", "-b", "16", "-t", "2048", "-d", "32768"]
    for size in ("140G", "80G"):  # the first fits by -b alone, the second needs --offload optimizer too
        budget = int(size[:-1]) << 30
        got, p = plan_json(big + ["--memory-budget", size])
        B, off = got.get("B", 0), got.get("offload", 0)
        same, _ = plan_json(big[:2] + ["-b", str(B), "-t", "2048", "-d", "32768"] + (["--offload", "optimizer"] if off else []))
        larger, _ = plan_json(big[:2] + ["-b", str(2 * B), "-t", "2048", "-d", "32768"] + (["--offload", "optimizer"] if off else []))
        cls = got.get("classes", {})
        want = {"parameters": 2 * N, "gradients": 2 * N, "master_weights": 0 if off else 4 * N,
                "adamw_m": 0 if off else 4 * N, "adamw_v": 0 if off else 4 * N}
        report(p.returncode == 0 and got.get("parameters") == N and all(cls.get(k) == v for k, v in want.items())
               and B >= 1 and got.get("total_batch") == 32768 and got.get("peak_bytes", budget + 1) <= budget
               and same.get("peak_bytes") == got.get("peak_bytes") and larger.get("peak_bytes", 0) > budget,
               f"train_gpt --plan --memory-budget {size} -e llama3.1-8b -b 16 -t 2048: {N} parameters and the model "
               f"states in closed form for the chosen -b {B} (offload {off}), its plan's peak within the budget, -b {2 * B} over it",
               f"{dict((k, got.get(k)) for k in ('parameters', 'B', 'peak_bytes'))} vs {want} {cls}: {p.stderr[-400:]}")

    p = run([SIM, "--plan", *cfg, "-b", "8", "--memory-budget", "1M"])
    report(p.returncode == 1 and re.search(r"error: --memory-budget 0\.001 GiB: nothing fits; .* smallest peak found is "
                                           r"[0-9.]+ GiB \(-r 0, -b 1, .*-r not searched", p.stderr),
           "train_gpt --plan --memory-budget 1M -e <Llama>: exit 1 naming --memory-budget and the smallest peak",
           f"exit {p.returncode}: {p.stderr[-400:]}")


def main():
    if not all_built(SIM, CPU):
        return 1
    tmp = tempfile.mkdtemp(prefix="llmc_llama_sim_")
    try:
        model, shard = os.path.join(tmp, "llama.bin"), os.path.join(tmp, "train.bin")
        llama_file(model)
        rng = np.random.default_rng(3)
        write_shard(shard, [int(t) for t in rng.integers(0, V, 20000)])
        common = ["-i", shard, "-b", "2", "-t", "32", "-v", "0", "-s", "0"]

        # fp32: the CUDA backend's losses are the CPU trainer's
        sim32, cpu32 = os.path.join(tmp, "sim32"), os.path.join(tmp, "cpu32")
        p_sim = run([SIM, "-e", model, *common, "-x", "3", "--precision", "fp32", "-o", sim32])
        p_cpu = run([CPU, "-e", model, *common, "-x", "3", "-o", cpu32])
        check_losses_match("train_gpt (harness) -e <Llama file> fp32: the 3 losses equal train_gpt_cpu's to 1e-5 relative",
                           [(p_sim, sim32), (p_cpu, cpu32)], [1, 2, 3], 1e-5, "CUDA Llama 3 fp32")

        # bf16 + checkpoint + HF directory, then resumes across the trainers
        out = os.path.join(tmp, "out")
        p = run([SIM, "-e", model, *common, "-x", "3", "-n", "3", "--save-hf", "1", "-o", out])
        ckpt = os.path.join(out, "model_00000003.bin")
        magic = struct.unpack("<i", open(ckpt, "rb").read(4))[0] if os.path.exists(ckpt) else None
        cfg_path = os.path.join(out, "model_00000003_hf", "config.json")
        arch = json.load(open(cfg_path)).get("architectures") if os.path.exists(cfg_path) else None
        l3 = losses(out)
        ok = p.returncode == 0 and sorted(l3) == [1, 2, 3] and all(np.isfinite(list(l3.values())))
        ok = ok and "holds no tokenizer files (the run did not start from a Hugging Face directory (-e))" in p.stdout
        report(ok and magic == 20261130 and arch == ["LlamaForCausalLM"],
               "train_gpt (harness) Llama bf16: 3 steps, llmc Llama checkpoint and --save-hf LlamaForCausalLM (no "
               "tokenizer files to copy: said so)",
               f"exit {p.returncode}, losses {l3}, magic {magic}, architectures {arch}: {(p.stdout + p.stderr)[-800:]}")
        p = run([CPU, "-e", model, *common, "-x", "5", "-n", "5", "-y", "1", "--allow-config-change", "1", "-o", out])
        l5 = losses(out)
        report(p.returncode == 0 and 4 in l5 and 5 in l5 and all(np.isfinite(list(l5.values()))),
               "train_gpt_cpu resumes train_gpt's Llama checkpoint (steps 4-5)", (p.stdout + p.stderr)[-800:])
        p = run([SIM, "-e", model, *common, "-x", "6", "-n", "6", "-y", "1", "--precision", "fp32",
                 "--allow-config-change", "1", "-o", out])
        l6 = losses(out)
        report(p.returncode == 0 and 6 in l6 and np.isfinite(l6[6]) and "resum" in p.stdout.lower(),
               "train_gpt (harness) fp32 resumes train_gpt_cpu's Llama checkpoint (step 6)", (p.stdout + p.stderr)[-800:])

        # --offload optimizer == the device optimizer (fp32, bits)
        p = run([SIM, "-e", model, *common, "-x", "3", "-n", "3", "--precision", "fp32", "--offload", "optimizer",
                 "-o", os.path.join(tmp, "off")])
        ref_run = run([SIM, "-e", model, *common, "-x", "3", "-n", "3", "--precision", "fp32", "-o", os.path.join(tmp, "dev")])
        a, b = losses(os.path.join(tmp, "off")), losses(os.path.join(tmp, "dev"))
        same = same_file(tmp, "off", "dev", "model_00000003.bin")
        report(p.returncode == 0 and ref_run.returncode == 0 and len(a) == 3 and a == b and same,
               "train_gpt (harness) Llama --offload optimizer: losses and final parameters bit-identical to the device optimizer",
               f"{a} vs {b}: {(p.stdout + p.stderr)[-600:]}")

        # --cuda-graph 1 (the trunk and the layers' backward replayed as one graph) == kernel by kernel (fp32, bits)
        p = run([SIM, "-e", model, *common, "-x", "3", "-n", "3", "--precision", "fp32", "--cuda-graph", "1",
                 "-o", os.path.join(tmp, "graph")])
        a = losses(os.path.join(tmp, "graph"))
        report(p.returncode == 0 and len(a) == 3 and a == b and same_file(tmp, "graph", "dev", "model_00000003.bin")
               and "CUDA graph: 1 capture(s)" in p.stdout,
               "train_gpt (harness) Llama --cuda-graph 1: losses and final parameters bit-identical to kernel-by-kernel launches",
               f"{a} vs {b}: {(p.stdout + p.stderr)[-600:]}")

        p = run([SIM, "-e", model, *common, "-x", "2", "--optim-state", "int8", "-o", os.path.join(tmp, "int8")])
        a = losses(os.path.join(tmp, "int8"))
        report(p.returncode == 0 and sorted(a) == [1, 2] and all(np.isfinite(list(a.values()))) and "AdamW m (int8" in p.stdout,
               "train_gpt (harness) Llama --optim-state int8 trains (compact device moments)", (p.stdout + p.stderr)[-600:])

        # -z 1 == -z 0 on 2 ranks (bf16, fp32 master weights): the same model and state bits
        if shutil.which("mpirun"):
            ok = True
            for z in ("0", "1"):
                p = run(["mpirun", "--oversubscribe", "-np", "2", SIM, "-e", model, *common, "-x", "2", "-n", "2",
                         "-z", z, "-o", os.path.join(tmp, "z" + z)])
                ok = ok and p.returncode == 0 and "processes: 2 ranks" in p.stdout and ("AdamW m (fp32, shard)" in p.stdout) == (z == "1")
                if p.returncode != 0 or "processes: 2 ranks" not in p.stdout:
                    print((p.stdout + p.stderr)[-600:])
            files = ["model_00000002.bin", "state_00000002_00000.bin"]
            report(ok and all(same_file(tmp, "z0", "z1", f) for f in files),
                   "train_gpt (harness) Llama under mpirun -np 2: -z 1 == -z 0 (model and state bits, bf16)")
            # -z 2 (gradients reduced layer by layer from two packed slots into the shard), fp32: 2 ranks x B 1
            # with 2 accumulation steps == one process x B 2 (losses rel 1e-5, weights 1e-4 abs: only the order
            # of float additions differs, as in test/cudasim/test_train_gpt_ranks.py)
            z2 = [*common[:common.index("-b")], "-t", "32", "-v", "0", "-s", "0", "-d", "128", "--precision", "fp32", "-x", "2",
                  "-n", "2"]
            p_one = run([SIM, "-e", model, *z2, "-b", "2", "-o", os.path.join(tmp, "z2_one")])
            for z in ("2", "3"):  # -z 3: each layer's parameters gathered into a slot before its forward and backward
                p = run(["mpirun", "--oversubscribe", "-np", "2", SIM, "-e", model, *z2, "-b", "1", "-z", z,
                         "-o", os.path.join(tmp, "z%s_two" % z)])
                a, b = losses(os.path.join(tmp, "z2_one")), losses(os.path.join(tmp, "z%s_two" % z))
                rel = max(abs(a[s] - b[s]) / abs(a[s]) for s in a) if a and sorted(a) == sorted(b) else float("inf")
                w = [os.path.join(tmp, d, "model_00000002.bin") for d in ("z2_one", "z%s_two" % z)]
                wa, wb = [np.fromfile(f, np.float32, offset=1024) if os.path.exists(f) else None for f in w]
                pd = float(np.max(np.abs(wa - wb))) if wa is not None and wb is not None and wa.size == wb.size else float("inf")
                table = "gradients (outer + 2 layer slots)" in p.stdout and (z == "2" or "params gathered" in p.stdout)
                report(p_one.returncode == 0 and p.returncode == 0 and table and rel <= 1e-5 and pd <= 1e-4,
                       f"train_gpt (harness) Llama -z {z} under mpirun -np 2 (x B 1, 2 accumulation steps) == one process "
                       f"x B 2, fp32 (losses rel {rel:.2g}, weights abs {pd:.2g}; the table shows the slots)",
                       (p.stdout + p.stderr)[-600:])
        else:
            print("SKIP: train_gpt (harness) Llama -z 1 on 2 ranks: no mpirun")

        # --plan: the CUDA plan of a released shape, its parameter count the CPU plan's
        plan = ["--plan", "--json", "-e", "llama3.2-1b", "-b", "4", "-t", "1024"]
        p, q = run([SIM, *plan]), run([CPU, *plan])
        try:
            g, c = json.loads(p.stdout), json.loads(q.stdout)
        except ValueError as e:
            g, c = {}, {"error": str(e)}
        acts = g.get("activations", {})
        report(p.returncode == 0 and g.get("device") == "GPU" and g.get("parameters") == c.get("parameters") == 1235814400
               and "fch_swiglu" in str(acts) and "ln1_rstd" in str(acts),
               "train_gpt --plan -e llama3.2-1b: the CUDA Llama plan (its activation table), 1235814400 parameters as the CPU plan's",
               f"{g.get('parameters')} vs {c.get('parameters')}: {(p.stdout + p.stderr)[-600:]}")

        check_budget(tmp, model, shard)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures() else 0


if __name__ == "__main__":
    sys.exit(main())
