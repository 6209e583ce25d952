#!/usr/bin/env python3
"""test_distill.py - knowledge distillation on ./train_gpt_cpu (--teacher, issue 23 item 6) against
dev/reference/distill.py (PyTorch, fp32).

Tiny llm.c GPT-2 files written here (seeded, V 96): a student (L 2, C 32) and a teacher of another
size (L 3, C 48, its final LayerNorm scaled up so that its distribution is far from the student's and
the distillation term matters), one batch (-a 1), a 0.7, t 2:
  - full student: step 1's loss, cross-entropy and KL (train_loss, train_ce, train_kd) equal the
    reference's; every gradient, through a one-step update that is linear in it (AdamW's step 1 with
    -l = --eps = 1000: p0 - p1 = 1000 g / (|g| + 1000)); a 10-step trajectory (the three series, then
    the trained weights);
  - LoRA student (--adapter, B != 0 so that the gradients reach A): step 1's adapter gradients
    (LLMC_LORA_DUMP_GRADS), the 10-step trajectory and the trained adapter;
  - --distill-alpha 0 trains bit for bit as plain training does (losses, norms, the model file);
  - a run resumed from step 5 (-y 1) writes the model file of a run that never stopped; a resume
    with another teacher (other weights under the same name: its CRC; another name; none) is refused;
  - a Llama teacher (an HF directory of the same vocabulary) teaches a GPT-2 student, and a GPT-2
    teacher a Llama student (alpha 0: its plain training bit for bit);
  - gradient accumulation and 2 ranks at -z 3 give one process's losses and terms;
  - --memory-budget prices the teacher (its activations for the -b it chooses);
  - --plan and the startup print show the teacher (its parameters and activations in the plan).
Bad inputs are clear errors that leave no run directory: --distill-alpha outside [0, 1], a
temperature <= 0, NaN or beyond [0.001, 1000], a teacher of another vocabulary (a file or a
descriptor; naming both models and sizes), a missing teacher file, a teacher whose maxT is below -t,
--distill-alpha without --teacher, --teacher-quantize, and --teacher on ./train_gpt (the CUDA
trainer, when built).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "dev", "reference"))
import testlib  # noqa: E402
from testlib import report  # noqa: E402

CPU = os.path.join(ROOT, "train_gpt_cpu")
REFERENCE = os.path.join(ROOT, "dev", "reference", "distill.py")
V, B, T, STEPS = 96, 2, 32, 10
ALPHA, TEMP, LR, WD = 0.7, 2.0, 1e-3, 0.1


def make_models(w):
    import torch
    import train_gpt2 as g
    import hf_tiny
    for name, L, C, seed, vocab, maxT in [("student", 2, 32, 1, V, 64), ("teacher", 3, 48, 2, V, 64),
                                          ("teacher_other", 3, 48, 3, V, 64), ("teacher_v80", 2, 32, 4, 80, 64),
                                          ("teacher_short", 2, 32, 6, V, 16)]:
        cfg = g.Config(maxT, vocab, g.padded_vocab_size(vocab), L, 4, C)
        t = g.init_tensors(cfg, seed)
        if name.startswith("teacher"):
            t["lnfw"] = t["lnfw"] * 40.0  # (a confident teacher: logits far from the student's)
        g.save_model(os.path.join(w, f"{name}.bin"), cfg, t)
    lt = hf_tiny.llama_tensors(seed=5)
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        lt[k] = np.ascontiguousarray(lt[k][:V] * 40.0)
    hf_tiny.write_llama(os.path.join(w, "llama_teacher"), config=hf_tiny.llama_config(vocab_size=V), tensors=lt)
    del torch


def run(args, env=None, expect_ok=True, prog=CPU):
    p = subprocess.run([prog] + args, capture_output=True, text=True, env=env)
    if expect_ok and p.returncode != 0:
        raise RuntimeError(f"{prog} {' '.join(args)} failed:\n{(p.stdout + p.stderr)[-3000:]}")
    return p


def train_args(w, out, steps, *more, teacher="teacher.bin"):
    args = ["-e", os.path.join(w, "student.bin"), "-i", os.path.join(w, "data.bin"), "-j", os.path.join(w, "data.bin"),
            "-b", str(B), "-t", str(T), "-x", str(steps), "-a", "1", "--shuffle", "0", "-k", "constant", "-u", "0",
            "-l", str(LR), "-c", str(WD), "--grad-clip", "0", "-v", "0", "-s", "0", "-o", out, "--threads", "1"]
    if teacher:
        args += ["--teacher", os.path.join(w, teacher), "--distill-alpha", str(ALPHA), "--distill-temperature", str(TEMP)]
    return args + list(more)


def reference(w, out, steps, *more):
    p = subprocess.run([sys.executable, REFERENCE, "--student", os.path.join(w, "student.bin"), "--teacher",
                        os.path.join(w, "teacher.bin"), "--data", os.path.join(w, "data.bin"), "-b", str(B), "-t",
                        str(T), "-x", str(steps), "--alpha", str(ALPHA), "--temperature", str(TEMP), "-l", str(LR),
                        "-c", str(WD), "--out", out] + list(more), capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="2"))
    if p.returncode != 0:
        raise RuntimeError(f"the reference failed: {p.stderr[-3000:]}")
    import distill
    res = json.load(open(os.path.join(out, "result.json")))
    grads, _ = distill.read_safetensors(os.path.join(out, "grads.safetensors"))
    final, _ = distill.read_safetensors(os.path.join(out, "final.safetensors"))
    return res, {k: v.numpy() for k, v in grads.items()}, {k: v.numpy() for k, v in final.items()}


def close(a, b, rtol, atol):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return False, float("inf")
    err = np.abs(a - b) - atol - rtol * np.abs(b)
    return bool(np.all(err <= 0)), float(np.max(np.abs(a - b))) if a.size else 0.0


def series(out, key):
    d = testlib.log_losses(out, key)
    return [d[s] for s in sorted(d)]


def model_tensors(path):
    import train_gpt2 as g
    _, t, _ = g.load_model(path)
    return {k: v.numpy() for k, v in t.items()}


def compare_tensors(name, mine, ref, rtol, atol_frac):
    bad = []
    for k in sorted(ref):
        scale = float(np.max(np.abs(ref[k]))) or 1.0
        ok, err = close(mine[k], ref[k], rtol, atol_frac * scale) if k in mine else (False, float("inf"))
        if not ok:
            bad.append(f"{k}: max |diff| {err:.3g} (max |ref| {scale:.3g})")
    report(not bad and sorted(mine) == sorted(ref), name, f"{len(ref)} tensors; " + "; ".join(bad[:4]))


def check_steps(name, out, res):
    """Step 1's three values and the 10-step series against the reference's."""
    mine = {k: series(out, f"train_{k}" if k != "loss" else "train_loss") for k in ("loss", "ce", "kd")}
    for k in ("loss", "ce", "kd"):
        ok, _ = close(mine[k][:1], res[k][:1], 1e-5, 1e-7)
        report(ok, f"{name}_step1_{k}", f"llmc {mine[k][:1]} reference {res[k][:1]}")
    report(res["kd"][0] > 0.05 and res["ce"][0] > 0.5, f"{name}_both_terms_matter",
           f"reference ce {res['ce'][0]}, kd {res['kd'][0]}")
    for k in ("loss", "ce", "kd"):
        ok, err = close(mine[k], res[k], 1e-4, 1e-6)
        report(ok and len(mine[k]) == STEPS, f"{name}_trajectory_{STEPS}_steps_{k}",
               f"max |diff| {err:.3g}; llmc {mine[k][:2]}...{mine[k][-1:]} reference {res[k][:2]}...{res[k][-1:]}")
    report(res["loss"][-1] < res["loss"][0], f"{name}_trains", f"reference losses {res['loss'][0]} -> {res['loss'][-1]}")


def check_full(w):
    ref = os.path.join(w, "ref_full")
    res, _, final = reference(w, ref, STEPS)
    out = os.path.join(w, "full")
    p = run(train_args(w, out, STEPS))
    check_steps("full", out, res)
    # (AdamW moves each element by about lr a step whatever its gradient's size: where the gradient is
    # near zero (attention's biases) fp32's rounding moves it differently, up to ~1e-3 of the tensor's range)
    compare_tensors("full_trained_weights", model_tensors(os.path.join(out, f"model_{STEPS:08d}.bin")), final, 1e-3, 1e-3)
    report("teacher: " in p.stdout and "accounted = the plan" in p.stdout, "startup_print_shows_teacher",
           p.stdout[-1500:])
    # every gradient: AdamW's first step with -l = --eps = 1000 moves p by 1000 g / (|g| + 1000)
    _, grads, _ = reference(w, os.path.join(w, "ref_grad"), 1)
    out1 = os.path.join(w, "full_grad")
    run(train_args(w, out1, 1, "-l", "1000", "--eps", "1000", "-c", "0"))
    p0, p1 = model_tensors(os.path.join(w, "student.bin")), model_tensors(os.path.join(out1, "model_00000001.bin"))
    moved = {k: p0[k].astype(np.float64) - p1[k] for k in p0}
    expect = {k: 1000.0 * g / (np.abs(g) + 1000.0) for k, g in grads.items()}
    compare_tensors("full_every_gradient", moved, expect, 1e-3, 1e-3)


def check_lora(w):
    import distill
    import torch
    # the adapter llmc initialises (A Kaiming-uniform, B 0: -l 0 keeps it), then B != 0
    init = os.path.join(w, "lora_init")
    run(train_args(w, init, 1, "--lora-rank", "4", "--lora-targets", "c_attn,c_proj,c_fc", "-l", "0", teacher=""))
    src, adapter = os.path.join(init, "adapter_00000001"), os.path.join(w, "adapter")
    os.makedirs(adapter)
    shutil.copy(os.path.join(src, "adapter_config.json"), adapter)
    t, meta = distill.read_safetensors(os.path.join(src, "adapter_model.safetensors"))
    gen = torch.Generator().manual_seed(9)
    t = {k: (torch.randn(v.shape, generator=gen) * 0.3 if "lora_B" in k else v) for k, v in t.items()}
    distill.write_safetensors(os.path.join(adapter, "adapter_model.safetensors"), t, meta)

    res, grads, final = reference(w, os.path.join(w, "ref_lora"), STEPS, "--adapter", adapter)
    out, gdir = os.path.join(w, "lora"), os.path.join(w, "lora_grads")
    run(train_args(w, out, STEPS, "--adapter", adapter), env=dict(os.environ, LLMC_LORA_DUMP_GRADS=gdir))
    check_steps("lora", out, res)
    mine, _ = distill.read_safetensors(os.path.join(gdir, "adapter_model.safetensors"))
    report(all(np.any(grads[k]) for k in grads if "lora_A" in k), "lora_gradients_reach_A", "")
    compare_tensors("lora_every_adapter_gradient", {k: v.numpy() for k, v in mine.items()}, grads, 1e-3, 1e-4)
    trained, _ = distill.read_safetensors(os.path.join(out, f"adapter_{STEPS:08d}", "adapter_model.safetensors"))
    compare_tensors("lora_trained_adapter", {k: v.numpy() for k, v in trained.items()}, final, 1e-3, 1e-4)


def check_alpha0_and_resume(w):
    plain, zero = os.path.join(w, "plain"), os.path.join(w, "alpha0")
    run(train_args(w, plain, 3, teacher=""))
    run(train_args(w, zero, 3, "--teacher", os.path.join(w, "teacher.bin"), "--distill-alpha", "0", teacher=""))
    same = all(series(plain, k) == series(zero, k) and series(plain, k) for k in ("train_loss", "grad_norm"))
    report(same and testlib.same_bytes(os.path.join(plain, "model_00000003.bin"), os.path.join(zero, "model_00000003.bin")),
           "alpha0_is_plain_training_bit_for_bit", f"plain {series(plain, 'train_loss')} alpha 0 {series(zero, 'train_loss')}")

    straight, res = os.path.join(w, "straight"), os.path.join(w, "resumed")
    args = train_args(w, straight, STEPS, "-n", "5")
    del args[args.index("-a"):args.index("-a") + 2]  # (the data in order: -y 1 continues at step 6's batch)
    run(args)
    os.makedirs(res)
    for f in ("model_00000005.bin", "state_00000005_00000.bin", "DONE_00000005"):
        shutil.copy(os.path.join(straight, f), res)
    args[args.index("-o") + 1] = res
    p = run(args + ["-y", "1"])
    report("resumed from step 5" in p.stdout and testlib.same_bytes(os.path.join(straight, f"model_{STEPS:08d}.bin"),
                                                                    os.path.join(res, f"model_{STEPS:08d}.bin")),
           "resume_bit_exact", p.stdout[-800:])
    done = open(os.path.join(straight, "DONE_00000005")).read()
    report("--teacher-crc32 " in done and "--teacher " in done, "done_records_the_teacher", done[-600:])
    # the same teacher name with other weights: its CRC; another teacher: --teacher's value; none: refused
    moved = os.path.join(w, "moved")
    shutil.copytree(res, moved)
    for f in os.listdir(moved):
        if f"{STEPS:08d}" in f:
            os.remove(os.path.join(moved, f))
    keep = os.path.join(w, "teacher_kept.bin")
    shutil.copy(os.path.join(w, "teacher.bin"), keep)
    shutil.copy(os.path.join(w, "teacher_other.bin"), os.path.join(w, "teacher.bin"))
    try:
        args[args.index("-o") + 1] = moved
        before = sorted(os.listdir(moved))
        testlib.expect_error("resume_teacher_other_weights", run(args + ["-y", "1"], expect_ok=False), "crc32")
        other = list(args)
        other[other.index("--teacher") + 1] = os.path.join(w, "teacher_other.bin")
        testlib.expect_error("resume_other_teacher", run(other + ["-y", "1"], expect_ok=False), "--teacher")
        t = args.index("--teacher")
        testlib.expect_error("resume_without_teacher", run(args[:t] + args[t + 6:] + ["-y", "1"], expect_ok=False),
                             "--teacher")
        report(sorted(os.listdir(moved)) == before, "refused_resume_leaves_the_run", f"{before} -> {os.listdir(moved)}")
    finally:
        shutil.copy(keep, os.path.join(w, "teacher.bin"))


def check_llama_teacher_and_plan(w):
    out = os.path.join(w, "llama_taught")
    run(train_args(w, out, 2, teacher="llama_teacher"))
    kd = series(out, "train_kd")
    report(len(kd) == 2 and all(np.isfinite(kd)) and kd[0] > 0, "llama_teacher_gpt2_student", f"train_kd {kd}")
    # a Llama student (its logits through the same classifier): alpha 0 is its plain training bit for bit
    lstudent = ["-e", os.path.join(w, "llama_teacher")]
    lp, lz, lk = (os.path.join(w, n) for n in ("llama_plain", "llama_alpha0", "llama_taught_by_gpt2"))
    run(train_args(w, lp, 3, *lstudent, teacher=""))
    run(train_args(w, lz, 3, *lstudent, "--teacher", os.path.join(w, "student.bin"), "--distill-alpha", "0", teacher=""))
    run(train_args(w, lk, 3, *lstudent, "--teacher", os.path.join(w, "student.bin"), teacher=""))
    same = all(series(lp, k) == series(lz, k) and series(lp, k) for k in ("train_loss", "grad_norm"))
    kd = series(lk, "train_kd")
    report(same and len(kd) == 3 and all(np.isfinite(kd)) and series(lk, "train_loss") != series(lp, "train_loss"),
           "llama_student", f"plain {series(lp, 'train_loss')}, alpha 0 {series(lz, 'train_loss')}, taught kd {kd}")
    base = ["-e", os.path.join(w, "student.bin"), "-b", str(B), "-t", str(T), "--plan", "--json"]
    plain = json.loads(run(base).stdout)
    taught = json.loads(run(base + ["--teacher", os.path.join(w, "teacher.bin")]).stdout)
    import train_gpt2 as g
    cfg, _, _ = g.load_model(os.path.join(w, "teacher.bin"))
    tparams = 4 * g.num_params(cfg)
    dp = taught["classes"]["parameters"] - plain["classes"]["parameters"]
    da = taught["classes"]["activations"] - plain["classes"]["activations"]
    report(dp == tparams and da > 0 and taught["peak_bytes"] >= plain["peak_bytes"] + dp + da, "plan_counts_teacher",
           f"parameters +{dp} (teacher {tparams}), activations +{da}, peak {plain['peak_bytes']} -> {taught['peak_bytes']}")
    p = run(base[:-1] + ["--teacher", os.path.join(w, "teacher.bin")])
    report("teacher: " in p.stdout and "forward only" in p.stdout, "plan_prints_teacher", p.stdout[-600:])


def check_composes(w):
    """Gradient accumulation and 2 ranks (-pi tcp, -z 3: the student's parameters sharded; each rank runs
    the whole teacher on its rows): the same -d's losses and both terms as one process without accumulation."""
    outs = {}
    for name, launch, more in [("one", [CPU], ["-b", str(2 * B)]), ("accum", [CPU], ["-b", str(B // 2)]),
                               ("ranks_z3", ["scripts/run_dist.sh", "local", "2", "--pi", "tcp"], ["-z", "3"])]:
        out = os.path.join(w, f"compose_{name}")
        args = train_args(w, out, 4, "-d", str(2 * B * T), *more)
        del args[args.index("-a"):args.index("-a") + 2]
        p = subprocess.run(launch + args, capture_output=True, text=True, cwd=ROOT, timeout=300)
        if p.returncode != 0:
            report(False, f"compose_{name}_runs", (p.stdout + p.stderr)[-1500:])
            return
        outs[name] = out
    for name in ("accum", "ranks_z3"):
        for k in ("train_loss", "train_ce", "train_kd"):
            ok, err = close(series(outs[name], k), series(outs["one"], k), 1e-5, 1e-7)
            report(ok and len(series(outs[name], k)) == 4, f"compose_{name}_{k}", f"max |diff| {err:.3g}")


def check_budget(w):
    """--memory-budget between -b 16's peak and -b 8's: the search chooses -b 8 (2 accumulation steps) with the
    teacher in its prices, and the run's allocation (the teacher's activations for the chosen -b) is the plan."""
    base = ["-e", os.path.join(w, "student.bin"), "--teacher", os.path.join(w, "teacher.bin"), "-t", "64", "-d", "1024"]
    peak = {b: json.loads(run(base + ["-b", str(b), "--plan", "--json"]).stdout)["peak_bytes"] for b in (8, 16)}
    p = run(base + ["-b", "16", "--plan", "--memory-budget", "1G"])  # "fits (peak X GiB)": with the process's start
    fits = [l for l in p.stdout.splitlines() if "fits (peak" in l]
    whole16 = float(fits[0].split("fits (peak ")[1].split()[0]) * 2 ** 30 if fits else 0.0
    budget = int(whole16 - (peak[16] - peak[8]) / 2)
    out = os.path.join(w, "budget")
    args = train_args(w, out, 2, "-t", "64", "-d", "1024", "-b", "16", "--memory-budget", str(budget))
    del args[args.index("-a"):args.index("-a") + 2]
    p = run(args, expect_ok=False)
    report(p.returncode == 0 and "-b 8," in p.stdout and "accounted = the plan" in p.stdout and len(series(out, "train_kd")) == 2,
           "memory_budget_with_teacher", f"budget {budget}: {(p.stdout + p.stderr)[-1200:]}")


def check_errors(w):
    args = train_args(w, os.path.join(w, "never"), 2)
    t = args.index("--teacher")

    def expect(name, a, pattern, prog=CPU):
        testlib.expect_error(name, run(a, expect_ok=False, prog=prog), pattern)
        report(not os.path.exists(os.path.join(w, "never")), f"{name}_leaves_no_run_directory", "")
        shutil.rmtree(os.path.join(w, "never"), ignore_errors=True)

    def with_flag(flag, value):
        a = list(args)
        a[a.index(flag) + 1] = value
        return a
    expect("alpha_above_1", with_flag("--distill-alpha", "1.5"), "--distill-alpha must be in [0, 1]")
    expect("alpha_negative", with_flag("--distill-alpha", "-0.1"), "--distill-alpha must be in [0, 1]")
    expect("temperature_zero", with_flag("--distill-temperature", "0"), "--distill-temperature must be positive")
    expect("temperature_negative", with_flag("--distill-temperature", "-1"), "--distill-temperature must be positive")
    expect("temperature_huge", with_flag("--distill-temperature", "1e30"), "--distill-temperature must be positive")
    expect("temperature_nan", with_flag("--distill-temperature", "nan"), "--distill-temperature")
    v80 = os.path.join(w, "teacher_v80.bin")
    expect("vocabulary_mismatch", with_flag("--teacher", v80), f"--teacher {v80} has a vocabulary of 80 tokens, the "
           f"student -e {os.path.join(w, 'student.bin')} has 96")
    expect("descriptor_vocabulary_mismatch", with_flag("--teacher", "d1"), "--teacher d1 has a vocabulary of 50257 tokens")
    expect("teacher_maxT_below_T", with_flag("--teacher", os.path.join(w, "teacher_short.bin")),
           "its maximum sequence length is 16, below -t 32")
    expect("missing_teacher", with_flag("--teacher", os.path.join(w, "nope.bin")), "nope.bin: no such file")
    expect("alpha_without_teacher", args[:t] + args[t + 2:], "need --teacher")
    expect("teacher_quantize_not_built", args + ["--teacher-quantize", "nf4"], "not built yet")
    cuda = next((p for p in [os.path.join(ROOT, "build", "cudasim", "train_gpt"), os.path.join(ROOT, "train_gpt")]
                 if os.access(p, os.X_OK)), None)
    if cuda:
        expect("cuda_not_built_yet", args, "--teacher is not built for ./train_gpt yet", prog=cuda)
    else:
        print("note: no ./train_gpt or build/cudasim/train_gpt built: the CUDA refusal is not checked")


def main():
    if not testlib.all_built(CPU):
        return 1
    w = tempfile.mkdtemp(prefix="llmc_distill.")
    try:
        make_models(w)
        import random
        rng = random.Random(7)
        testlib.write_shard(os.path.join(w, "data.bin"), [rng.randrange(V) for _ in range(4096)])
        for check in (check_full, check_lora, check_alpha0_and_resume, check_llama_teacher_and_plan, check_composes,
                      check_budget, check_errors):
            try:
                check(w)
            except Exception as e:  # noqa: BLE001 (a crashed check is a failed one, the others still run)
                import traceback
                report(False, check.__name__, (str(e) + traceback.format_exc())[-2500:])
    finally:
        shutil.rmtree(w, ignore_errors=True) if not os.environ.get("LLMC_KEEP") else print("kept", w)
    return 1 if testlib.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
