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
  same model and state bits as -z 0 in bf16, as for GPT-2;
- --plan -e llama3.2-1b prints the CUDA plan with the CPU plan's parameter count, nothing built;
- --memory-budget with a Llama is an error naming the flag (exit 1).
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
from testlib import failures, report, write_shard  # noqa: E402

SIM = "build/cudasim/train_gpt"
CPU = "./train_gpt_cpu"
L, C, NH, NKV, F, V, MAXT = 2, 64, 4, 2, 128, 512, 64


def run(cmd):
    env = dict(os.environ, OMP_WAIT_POLICY="passive", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def llama_file(path, seed=7):
    """llmc's Llama checkpoint (llmc/llama.h): int32 header[256], then the table's tensors in fp32."""
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


def losses(outdir):
    path = os.path.join(outdir, "log.jsonl")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {r["step"]: r["train_loss"] for r in map(json.loads, f) if "train_loss" in r}


def same_file(tmp, run_a, run_b, name):
    """Do both runs have the file, byte for byte the same?"""
    a, b = os.path.join(tmp, run_a, name), os.path.join(tmp, run_b, name)
    return os.path.exists(a) and os.path.exists(b) and open(a, "rb").read() == open(b, "rb").read()


def main():
    for exe in (SIM, CPU):
        if not os.access(exe, os.X_OK):
            report(False, f"{exe} is built", "build it first")
            return 1
    tmp = tempfile.mkdtemp(prefix="llmc_llama_sim_")
    try:
        model, shard = os.path.join(tmp, "llama.bin"), os.path.join(tmp, "train.bin")
        llama_file(model)
        rng = np.random.default_rng(3)
        write_shard(shard, [int(t) for t in rng.integers(0, V, 20000)])
        common = ["-i", shard, "-b", "2", "-t", "32", "-v", "0", "-s", "0"]

        # fp32: the CUDA backend's losses are the CPU trainer's
        p_sim = run([SIM, "-e", model, *common, "-x", "3", "--precision", "fp32", "-o", os.path.join(tmp, "sim32")])
        p_cpu = run([CPU, "-e", model, *common, "-x", "3", "-o", os.path.join(tmp, "cpu32")])
        a, b = losses(os.path.join(tmp, "sim32")), losses(os.path.join(tmp, "cpu32"))
        ok = p_sim.returncode == 0 and p_cpu.returncode == 0 and sorted(a) == [1, 2, 3] and sorted(b) == [1, 2, 3]
        ok = ok and all(abs(a[s] - b[s]) <= 1e-5 * abs(b[s]) for s in a) and "CUDA Llama 3 fp32" in p_sim.stdout
        report(ok, "train_gpt (harness) -e <Llama file> fp32: the 3 losses equal train_gpt_cpu's to 1e-5 relative",
               f"sim {a} vs cpu {b}: {(p_sim.stdout + p_sim.stderr)[-800:]}")

        # bf16 + checkpoint + HF directory, then resumes across the trainers
        out = os.path.join(tmp, "out")
        p = run([SIM, "-e", model, *common, "-x", "3", "-n", "3", "--save-hf", "1", "-o", out])
        ckpt = os.path.join(out, "model_00000003.bin")
        magic = struct.unpack("<i", open(ckpt, "rb").read(4))[0] if os.path.exists(ckpt) else None
        cfg_path = os.path.join(out, "model_00000003_hf", "config.json")
        arch = json.load(open(cfg_path)).get("architectures") if os.path.exists(cfg_path) else None
        l3 = losses(out)
        ok = p.returncode == 0 and sorted(l3) == [1, 2, 3] and all(np.isfinite(list(l3.values())))
        report(ok and magic == 20261130 and arch == ["LlamaForCausalLM"],
               "train_gpt (harness) Llama bf16: 3 steps, llmc Llama checkpoint and --save-hf LlamaForCausalLM",
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

        # flags a Llama on CUDA does not take
        for flags, word in ((["--memory-budget", "1G"], "--memory-budget"),):
            p = run([SIM, "-e", model, *common, "-x", "1", *flags, "-o", os.path.join(tmp, "bad")])
            report(p.returncode == 1 and "error:" in p.stderr and word in p.stderr,
                   f"train_gpt -e <Llama> {' '.join(flags)}: exit 1 naming the flag", f"exit {p.returncode}: {p.stderr[-400:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures() else 0


if __name__ == "__main__":
    sys.exit(main())
