#!/usr/bin/env python3
"""Llama 3 through ./train_gpt_cpu, ./generate and ./hf_convert (issue 11), against the PyTorch
reference dev/reference/train_llama3.py: a 2-layer Llama (C 64, NH 4, NKV 2 and 1, V 1000).

- the trainer's 10-step loss / grad-norm trajectory from the reference's checkpoint equals the
  reference's (a shard holding exactly the reference's batch, constant lr, its AdamW settings);
- checkpoints and resume: 5 steps, then -y 1 to 10, gives the uninterrupted run's losses and
  final model byte for byte;
- --checkpoint-bf16 1: llmc's Llama file in bf16 is the fp32 weights rounded, reads back as them,
  resumes (rounded weights, fp32 AdamW state), feeds ./hf_convert and ./generate; damaged files
  (truncated, a changed weight against its .sum, a bad dtype) are clear errors;
- llm.c's Llama 3 file (magic 20240803, written here by an independent writer of its layout):
  -e loads it (the same step-1 loss as llmc's file), ./hf_convert llmc <-> llm.c is byte-identical
  both ways in fp32 and bf16, bad files are clear errors;
- recompute -r 1 / -r 2 (with and without LoRA): the -r 0 run's bits, less activation memory as the
  table's levels say;
- --plan for the released shapes by name, without allocating; llama3:d1 trains from random init;
- ./generate runs a Llama (its KV cache is checked against the full forward in test_llama_cpu).
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
from testlib import expect_error, failed_count, report, write_shard  # noqa: E402

PY = "/usr/bin/python3"
TRAINER = "./train_gpt_cpu"
B, T, V, C, L, NH, F, STEPS = 4, 32, 1000, 64, 2, 4, 256, 10


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


def reference(tmp, nkv):
    """The reference's checkpoint and debug state; returns (model path, losses, norms, batch tokens)."""
    model, state = os.path.join(tmp, f"ref{nkv}.bin"), os.path.join(tmp, f"state{nkv}.bin")
    p = run([PY, "dev/reference/train_llama3.py", "--depth", str(L), "--channels", str(C), "--heads", str(NH),
             "--kv-heads", str(nkv), "--max-seq-len", "64", "--vocab", str(V), "--seed", "42", "--batch-size",
             str(B), "--seq-len", str(T), "--steps", str(STEPS), "--rope-original", "8192",
             "--save-model", model, "--debug-state", state])
    if p.returncode != 0:
        sys.exit(f"reference failed: {p.stderr[-2000:]}")
    P = (os.path.getsize(model) - 1024) // 4
    raw = open(state, "rb").read()
    x = np.frombuffer(raw, "<i4", B * T, 1024)
    y = np.frombuffer(raw, "<i4", B * T, 1024 + 4 * B * T)
    off = 1024 + 8 * B * T + 4 * (B * T * V + 1 + P)
    losses = np.frombuffer(raw, "<f4", STEPS, off)
    norms = np.frombuffer(raw, "<f4", STEPS, off + 4 * STEPS)
    return model, losses, norms, list(x) + [int(y[-1])]


def train(tmp, init, shard, extra=(), steps=STEPS, outdir=None):
    return run(train_cmd(init, shard, extra, steps, outdir))


def train_cmd(init, shard, extra=(), steps=STEPS, outdir=None):
    cmd = [TRAINER, "-e", init, "-i", shard, "-j", shard, "-b", str(B), "-t", str(T), "-x", str(steps),
           "-k", "constant", "-l", "1e-3", "-c", "0.1", "--shuffle", "0", "-v", "0", "-s", "0", "-r", "0"]
    if outdir:
        cmd += ["-o", outdir]
    return cmd + list(extra)


def log_steps(outdir):
    with open(os.path.join(outdir, "log.jsonl")) as f:
        return {r["step"]: r for r in map(json.loads, f) if "train_loss" in r}


def llama3_file(path, ref_model, bf16=False, version=None):
    """llm.c's Llama 3 file from the reference's llmc checkpoint: written here from llm.c's layout
    (int32 header, float32 header, wte V rows, ..., c_fc = up, c_fc2 = gate, ..., lm_head V rows)."""
    raw = open(ref_model, "rb").read()
    h = struct.unpack("<256i", raw[:1024])
    Vp, nkv = h[5], h[8]
    QKV = (NH + 2 * nkv) * (C // NH)
    p = np.frombuffer(raw, "<f4", offset=1024)
    shapes = [("wte", Vp * C), ("ln1w", L * C), ("qkvw", L * QKV * C), ("attprojw", L * C * C), ("ln2w", L * C),
              ("fcw", L * 2 * F * C), ("fcprojw", L * C * F), ("lnfw", C), ("lm_head", Vp * C)]
    t, o = {}, 0
    for name, n in shapes:
        t[name] = p[o:o + n]
        o += n
    fcw = t["fcw"].reshape(L, 2, F, C)
    order = [t["wte"][:V * C], t["ln1w"], t["qkvw"], t["attprojw"], t["ln2w"], fcw[:, 1], fcw[:, 0], t["fcprojw"],
             t["lnfw"], t["lm_head"][:V * C]]
    hi = [0] * 256
    hi[:12] = [20240803, version or (5 if bf16 else 3), h[3], V, L, NH, nkv, C, 256, 1, 3, 1]
    hf = [0.0] * 256
    hf[:3] = [1.0, struct.unpack("<f", struct.pack("<i", h[16]))[0], struct.unpack("<f", struct.pack("<i", h[17]))[0]]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hi) + struct.pack("<256f", *hf))
        for a in order:
            a = np.ascontiguousarray(a, dtype="<f4")
            if bf16:  # round to nearest even, as torch's bfloat16
                u = a.view("<u4").astype(np.uint64)
                a = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
            f.write(a.tobytes())


def same_bytes(a, b, skip=0):
    return open(a, "rb").read()[skip:] == open(b, "rb").read()[skip:]


def error_check(name, cmd, pattern):
    expect_error(name, run(cmd), pattern, tail=400)


def main():
    tmp = tempfile.mkdtemp(prefix="llmc_llama_train_")
    try:
        for nkv in (2, 1):
            ref, losses, norms, tokens = reference(tmp, nkv)
            shard = os.path.join(tmp, f"batch{nkv}.bin")
            write_shard(shard, tokens)  # one batch: every step trains on the reference's batch
            out = os.path.join(tmp, f"run{nkv}")
            p = train(tmp, ref, shard, ["-n", "5"], outdir=out)
            if not report(p.returncode == 0, f"NKV {nkv}: train_gpt_cpu -e <reference Llama> runs",
                          p.stdout[-1500:] + p.stderr[-1500:]):
                continue
            steps = log_steps(out)
            got = [(steps[s]["train_loss"], steps[s]["grad_norm"]) for s in range(1, STEPS + 1)]
            bad = [(s + 1, g, (float(losses[s]), float(norms[s]))) for s, g in enumerate(got)
                   if abs(g[0] - losses[s]) > 1e-4 * abs(losses[s]) or abs(g[1] - norms[s]) > 1e-3 * abs(norms[s])]
            report(not bad, f"NKV {nkv}: 10-step loss and grad-norm trajectory equals the PyTorch reference's",
                   f"(step, got, reference): {bad[:3]}")
            if nkv == 1:  # multi-query attention: the trajectory; files and resume do not depend on NKV
                continue
            # resume: the run's directory as it was after step 5, then -y 1 to 10
            out2 = os.path.join(tmp, f"resume{nkv}")
            shutil.copytree(out, out2)
            for name in ("DONE_00000010", "model_00000010.bin", "model_00000010.bin.sum", "state_00000010_00000.bin"):
                os.remove(os.path.join(out2, name))
            p1 = p
            p2 = train(tmp, ref, shard, ["-n", "5", "-y", "1"], outdir=out2)
            ok = p2.returncode == 0 and "resum" in p2.stdout
            if ok:
                resumed = log_steps(out2)
                ok = all(resumed[s]["train_loss"] == steps[s]["train_loss"] for s in range(6, STEPS + 1))
                ok = ok and same_bytes(os.path.join(out, "model_00000010.bin"), os.path.join(out2, "model_00000010.bin"))
            report(ok, f"NKV {nkv}: checkpoint at step 5 and -y 1 resume give the uninterrupted run's losses and "
                       "final model byte for byte", (p1.stdout + p1.stderr + p2.stdout + p2.stderr)[-1500:])

            older_recompute_resume(tmp, ref, shard, out, steps)
            recompute_levels(tmp, ref, shard)
            bf16_checkpoints(tmp, ref, shard, out, steps)

            # llm.c's Llama 3 file, fp32 and bf16
            l3, l3b = os.path.join(tmp, f"l3_{nkv}.bin"), os.path.join(tmp, f"l3b_{nkv}.bin")
            llama3_file(l3, ref)
            llama3_file(l3b, ref, bf16=True)
            p = train(tmp, l3, shard, steps=1, outdir=os.path.join(tmp, f"l3run{nkv}"))
            ok = p.returncode == 0 and log_steps(os.path.join(tmp, f"l3run{nkv}"))[1]["train_loss"] == steps[1]["train_loss"]
            report(ok, f"NKV {nkv}: -e <llm.c Llama 3 file> gives the step-1 loss of llmc's file",
                   (p.stdout + p.stderr)[-1500:])
            conv = [("fp32", l3, ["--format", "llama3"]), ("bf16", l3b, ["--format", "llama3", "--dtype", "bf16"])]
            for kind, original, flags in conv:
                back, again = os.path.join(tmp, f"back_{kind}{nkv}.bin"), os.path.join(tmp, f"again_{kind}{nkv}.bin")
                p1 = run(["./hf_convert", original, back, "--format", "llmc"])
                p2 = run(["./hf_convert", back, again] + flags)
                ok = p1.returncode == 0 and p2.returncode == 0 and same_bytes(original, again)
                report(ok, f"NKV {nkv}: llm.c Llama 3 ({kind}) -> llmc -> llm.c is byte-identical",
                       (p1.stdout + p1.stderr + p2.stdout + p2.stderr)[-800:])
            ours = os.path.join(tmp, f"ours{nkv}.bin")
            p = run(["./hf_convert", ref, ours, "--format", "llama3"])
            p2 = run(["./hf_convert", ours, ours + ".llmc", "--format", "llmc"])
            ok = p.returncode == 0 and same_bytes(ours, l3) and p2.returncode == 0 and same_bytes(ref, ours + ".llmc", 1024)
            report(ok, f"NKV {nkv}: llmc -> llm.c Llama 3 equals the independent writer's file; back: same tensors",
                   (p.stdout + p.stderr + p2.stdout + p2.stderr)[-800:])

        # bad llm.c Llama 3 files: clear errors naming the file
        good = open(os.path.join(tmp, "l3_2.bin"), "rb").read()
        shard = os.path.join(tmp, "batch2.bin")
        for name, edit, pattern in [
                ("truncated", lambda b: b[:-4], "truncated"),
                ("version 4", lambda b: b[:4] + struct.pack("<i", 4) + b[8:], "version 4"),
                ("NH 4 with NKV 3", lambda b: b[:24] + struct.pack("<i", 3) + b[28:], "not divisible"),
                ("use_scaled_rope 2", lambda b: b[:36] + struct.pack("<i", 2) + b[40:], "use_scaled_rope 2")]:
            bad = os.path.join(tmp, "bad_l3.bin")
            open(bad, "wb").write(edit(good))
            error_check(f"llm.c Llama 3 file, {name}: a clear error", [TRAINER, "-e", bad, "-i", shard, "-j", shard,
                        "-b", str(B), "-t", str(T), "-x", "1"], "bad_l3.bin")
        error_check("Llama 3.2's RoPE scaling (factor 32) does not fit llm.c's Llama 3 header",
                    ["./hf_convert", os.path.join(tmp, "bf.bin"), os.path.join(tmp, "y.bin"), "--format", "llama3"]
                    if make_32(tmp) else ["false"], "factor 32")

        # --plan by name: no allocation (8B would need ~120 GiB to train in fp32)
        for name, params in (("llama3.2-1b", 1235814400), ("llama3.2-3b", 3212749824), ("llama3.1-8b", 8030261248)):
            p = run([TRAINER, "-e", name, "--plan", "--json", "-b", "1", "-t", "1024"])
            ok = p.returncode == 0 and json.loads(p.stdout)["parameters"] == params
            report(ok, f"--plan -e {name}: {params} parameters, nothing allocated", (p.stdout + p.stderr)[-600:])
        # llama3:d1 from random init (V 128256, untied head): the first loss is about ln V
        p = run([TRAINER, "-e", "llama3:d1", "-i", shard, "-j", shard, "-b", "1", "-t", "16", "-x", "1", "-v", "0",
                 "-s", "0", "-r", "0"])
        first = [line for line in p.stdout.splitlines() if line.startswith("step     1/")]
        loss = float(first[0].split("loss ")[1].split()[0]) if first else 0.0
        report(p.returncode == 0 and abs(loss - np.log(128256)) < 0.5, "llama3:d1 trains from random init (loss ~ ln V)",
               (p.stdout + p.stderr)[-800:])
        # ./generate: greedy decoding of the reference Llama equals PyTorch's (a decode-only tokenizer
        # file whose token i reads "<i>", end-of-text 999)
        tok = decode_tokenizer(tmp)
        p = run(["./generate", "-e", os.path.join(tmp, "ref2.bin"), "--tokenizer", tok, "--prompt", "", "-g", "20",
                 "--temperature", "0"])
        got = [int(t) for t in p.stdout.replace(">", "").split("<")[1:]]
        want = torch_greedy(os.path.join(tmp, "ref2.bin"), V - 1, 20)
        report(p.returncode == 0 and got == want, "./generate -e <Llama>: greedy tokens equal PyTorch's greedy decoding",
               f"got {got}, PyTorch {want}: {p.stderr[-600:]}")
        # the CUDA generator refuses a Llama with a clear message (its cudasim build, where built); the
        # CUDA trainer trains one (test/test_llama_cuda_sim.py)
        for binary in ("build/cudasim/generate", "./generate_gpu"):
            if os.path.exists(binary):
                error_check(f"{binary} refuses a Llama", [binary, "-e", os.path.join(tmp, "ref2.bin")],
                            "./generate_gpu runs GPT-2 only")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return failed_count()


def recompute_levels(tmp, ref, shard):
    """-r 1 and -r 2 on the CPU Llama (models/llama.h's levels: -r 1 keeps one layer of the SwiGLU
    output and recomputes it in backward, -r 2 also the two RMSNorm outputs): the -r 0 run's losses and
    final model byte for byte, with and without LoRA adapters on every linear layer; --plan's per-tensor
    activation bytes are one layer's where the table's level is at or below -r, the -r 0 bytes elsewhere."""
    recomputed = {1: {"fch_swiglu"}, 2: {"fch_swiglu", "ln1", "ln2"}}
    for lora in ([], ["--lora-rank", "4", "--lora-targets", "all-linear"]):
        what = "LoRA (all-linear)" if lora else "full training"
        outs = {}
        for r in (0, 1, 2):
            outs[r] = os.path.join(tmp, f"recompute{r}{'_lora' if lora else ''}")
            p = train(tmp, ref, shard, ["-r", str(r), "-n", "3"] + lora, steps=3, outdir=outs[r])
            if not report(p.returncode == 0, f"{what}: -r {r} runs on the CPU Llama", (p.stdout + p.stderr)[-1500:]):
                return
        final = ("adapter_00000003", "adapter_model.safetensors") if lora else ("model_00000003.bin",)
        for r in (1, 2):
            same = [log_steps(outs[r])[s]["train_loss"] == log_steps(outs[0])[s]["train_loss"] for s in (1, 2, 3)]
            ok = all(same) and same_bytes(os.path.join(outs[0], *final), os.path.join(outs[r], *final))
            report(ok, f"{what}: -r {r} gives the -r 0 run's losses and final {'adapter' if lora else 'model'} "
                       "byte for byte", f"losses equal per step: {same}")
    plans = {}
    for r in (0, 1, 2):
        p = run([TRAINER, "-e", ref, "-b", str(B), "-t", str(T), "-r", str(r), "--plan", "--json"])
        plans[r] = json.loads(p.stdout)["activations"] if p.returncode == 0 else {}
    for r in (1, 2):
        bad = {k: (v, plans[r].get(k)) for k, v in plans[0].items()
               if plans[r].get(k) != (v // L if k in recomputed[r] else v)}
        report(plans[0] and not bad, f"--plan -r {r}: {', '.join(sorted(recomputed[r]))} planned for one layer, "
               "every other activation as at -r 0", f"(-r 0 bytes, -r {r} bytes): {bad}")


def older_recompute_resume(tmp, ref, shard, run_dir, steps):
    """A Llama run whose saved configuration records -r 1 (the default; older binaries saved it while
    running -r 0): resumed with the same command line (no -r), it continues as the uninterrupted run
    did, with no flag reported as changed (-r changes memory, not the math)."""
    out = os.path.join(tmp, "resume_old_r1")
    shutil.copytree(run_dir, out)
    for name in ("DONE_00000010", "model_00000010.bin", "model_00000010.bin.sum", "state_00000010_00000.bin"):
        os.remove(os.path.join(out, name))
    done = os.path.join(out, "DONE_00000005")
    text = open(done).read()
    # as saved in that directory by an older binary: -r 1, the same -o
    old = text.replace("\n--recompute 0\n", "\n--recompute 1\n")
    old = old.replace(f"\n--output-dir {run_dir}\n", f"\n--output-dir {out}\n")
    with open(done, "w") as f:
        f.write(old)
    cmd = train_cmd(ref, shard, ["-n", "5", "-y", "1"], outdir=out)
    p = run([a for i, a in enumerate(cmd) if a != "-r" and cmd[i - 1] != "-r"])  # the default -r 1
    ok = "--recompute 1" in old and out in old and p.returncode == 0 and "error" not in p.stderr
    ok = ok and "resumed from step 5" in p.stdout and "resume: the configuration equals" in p.stdout
    if ok:
        resumed = log_steps(out)
        ok = all(resumed[s]["train_loss"] == steps[s]["train_loss"] for s in range(6, STEPS + 1))
        ok = ok and same_bytes(os.path.join(run_dir, "model_00000010.bin"), os.path.join(out, "model_00000010.bin"))
    report(ok, "a Llama checkpoint whose saved configuration says -r 1 (an older binary's) resumes with the same "
               "command line: no flag reported as changed, the uninterrupted run's losses and final model",
           "\n".join(ln for ln in (p.stdout + p.stderr).splitlines() if "resum" in ln or "  -" in ln or "error" in ln))


def bf16_round(raw):
    """float32 bytes -> their bfloat16 bytes, rounded to nearest even (as torch's bfloat16)."""
    u = np.frombuffer(raw, "<u4").astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()


def bf16_checkpoints(tmp, ref, shard, fp32_run, fp32_steps):
    """--checkpoint-bf16 1: llmc's Llama file in bf16 (header slot 12 = 1), read back by -e, resume,
    ./hf_convert and ./generate; damaged bf16 files are clear errors."""
    out = os.path.join(tmp, "run_bf16")
    p = train(tmp, ref, shard, ["-n", "5", "--checkpoint-bf16", "1"], outdir=out)
    if not report(p.returncode == 0, "--checkpoint-bf16 1 with a Llama trains and writes checkpoints",
                  (p.stdout + p.stderr)[-1500:]):
        return
    steps = log_steps(out)
    m5, f5 = os.path.join(out, "model_00000005.bin"), os.path.join(fp32_run, "model_00000005.bin")
    b, f = open(m5, "rb").read(), open(f5, "rb").read()
    hb, hf = struct.unpack("<256i", b[:1024]), struct.unpack("<256i", f[:1024])
    ok = all(steps[s]["train_loss"] == fp32_steps[s]["train_loss"] for s in range(1, STEPS + 1))
    ok = ok and hb[12] == 1 and hf[12] == 0 and hb[:12] + hb[13:] == hf[:12] + hf[13:]
    ok = ok and len(b) == 1024 + (len(f) - 1024) // 2 and b[1024:] == bf16_round(f[1024:])
    report(ok, "bf16 Llama checkpoint: header slot 12 = 1, weights = the fp32 run's rounded to nearest even, the "
           "same losses as the fp32-checkpoint run", f"header {hb[:13]} vs {hf[:13]}")
    # the reader: bf16 -> fp32 gives the widened bf16 values; back to bf16 the same bytes
    wide, again = os.path.join(tmp, "bf16_wide.bin"), os.path.join(tmp, "bf16_again.bin")
    p1 = run(["./hf_convert", m5, wide, "--format", "llmc", "--dtype", "fp32"])
    p2 = run(["./hf_convert", wide, again, "--format", "llmc", "--dtype", "bf16"])
    w = open(wide, "rb").read() if p1.returncode == 0 else b""
    widened = (np.frombuffer(b[1024:], "<u2").astype("<u4") << 16).tobytes()
    ok = p1.returncode == 0 and p2.returncode == 0 and w[1024:] == widened and struct.unpack("<i", w[48:52])[0] == 0
    ok = ok and same_bytes(m5, again)
    report(ok, "bf16 Llama checkpoint loads as the rounded weights (-> fp32 -> bf16: the same bytes)",
           (p1.stdout + p1.stderr + p2.stdout + p2.stderr)[-800:])
    # resume from the bf16 checkpoint (as GPT-2's: the bf16 weights, AdamW state in fp32): step 6's loss is
    # the loss of the rounded weights, which a fresh run from the bf16 file measures at its step 1
    res = os.path.join(tmp, "resume_bf16")
    shutil.copytree(out, res)
    for name in ("DONE_00000010", "model_00000010.bin", "model_00000010.bin.sum", "state_00000010_00000.bin"):
        os.remove(os.path.join(res, name))
    p1 = train(tmp, ref, shard, ["-n", "5", "--checkpoint-bf16", "1", "-y", "1"], outdir=res)
    p2 = train(tmp, m5, shard, steps=1, outdir=os.path.join(tmp, "from_bf16"))
    ok = p1.returncode == 0 and "resumed from step 5" in p1.stdout and p2.returncode == 0
    ok = ok and log_steps(res)[6]["train_loss"] == log_steps(os.path.join(tmp, "from_bf16"))[1]["train_loss"]
    ok = ok and struct.unpack("<i", open(os.path.join(res, "model_00000010.bin"), "rb").read()[48:52])[0] == 1
    state = lambda d: open(os.path.join(d, "state_00000005_00000.bin"), "rb").read()  # noqa: E731
    ok = ok and state(out)[1024:] == state(fp32_run)[1024:]  # the same fp32 m and v
    report(ok, "-y 1 resumes from a bf16 Llama checkpoint: its rounded weights and the fp32 AdamW state",
           (p1.stdout + p1.stderr + p2.stdout + p2.stderr)[-1500:])
    # ./generate reads it: the same greedy tokens as from its fp32 widening
    tok = decode_tokenizer(tmp)
    g = [run(["./generate", "-e", e, "--tokenizer", tok, "--prompt", "", "-g", "12", "--temperature", "0"])
         for e in (m5, wide)]
    report(all(x.returncode == 0 for x in g) and g[0].stdout == g[1].stdout and g[0].stdout.count("<") == 12,
           "./generate -e <bf16 Llama checkpoint>: the greedy tokens of its fp32 widening",
           (g[0].stdout + g[0].stderr + g[1].stdout)[-800:])
    # damaged bf16 files: truncated (with and without its .sum), a flipped weight, a bad dtype
    damaged = os.path.join(tmp, "damaged_bf16.bin")
    for name, edit, keep_sum, pattern in [
            ("truncated", lambda x: x[:-2], False, "truncated"),
            ("truncated, with its .sum", lambda x: x[:-2], True, "truncated"),
            ("one weight changed", lambda x: x[:5000] + bytes([x[5000] ^ 1]) + x[5001:], True, "checksum"),
            ("dtype 2", lambda x: x[:48] + struct.pack("<i", 2) + x[52:], False, "dtype")]:
        open(damaged, "wb").write(edit(b))
        if keep_sum:
            shutil.copy(m5 + ".sum", damaged + ".sum")
        elif os.path.exists(damaged + ".sum"):
            os.remove(damaged + ".sum")
        error_check(f"bf16 Llama checkpoint, {name}: a clear error", [TRAINER, "-e", damaged, "-i", shard, "-j", shard,
                    "-b", str(B), "-t", str(T), "-x", "1"], pattern)
        error_check(f"bf16 Llama checkpoint, {name}: ./generate says so", ["./generate", "-e", damaged, "--tokenizer",
                    tok, "--prompt", "", "-g", "1"], pattern)


def decode_tokenizer(tmp):
    """a decode-only llm.c tokenizer file whose token i reads "<i>", end-of-text V - 1"""
    tok = os.path.join(tmp, "tok.bin")
    with open(tok, "wb") as f:
        f.write(struct.pack("<256I", *([20240328, 2, V, V - 1] + [0] * 252)))
        for i in range(V):
            text = f"<{i}>".encode()
            f.write(bytes([len(text)]) + text)
    return tok


def torch_greedy(model_path, eot, n):
    """PyTorch's greedy continuation of [eot] by the Llama in llmc's checkpoint model_path."""
    import torch
    import train_gpt2 as ref
    import train_llama3 as ll
    raw = open(model_path, "rb").read()
    h = struct.unpack("<256i", raw[:1024])
    f32 = lambda i: struct.unpack("<f", struct.pack("<i", h[i]))[0]  # noqa: E731
    cfg = ll.LlamaConfig(h[3], h[4], h[6], h[7], h[8], h[9], h[10], eps=f32(16), theta=f32(17), factor=f32(18),
                         low=f32(19), high=f32(20), original=h[21])
    p = torch.from_numpy(np.frombuffer(raw, "<f4", offset=1024).copy())
    tensors, o = {}, 0
    for name, shape, _, _ in ll.param_table(cfg):
        k = int(np.prod(shape))
        tensors[name] = p[o:o + k].view(shape)
        o += k
    out, _ = ref.greedy_generate(ll.Llama(cfg, tensors), [eot], n, eot)
    return out


def make_32(tmp):
    """llmc's Llama checkpoint of the reference model with RoPE factor 32 (Llama 3.2's)."""
    raw = bytearray(open(os.path.join(tmp, "ref2.bin"), "rb").read())
    raw[72:76] = struct.pack("<f", 32.0)
    open(os.path.join(tmp, "bf.bin"), "wb").write(raw)
    return True


if __name__ == "__main__":
    sys.exit(main())
