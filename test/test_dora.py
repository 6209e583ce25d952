#!/usr/bin/env python3
"""test_dora.py - DoRA (--use-dora 1) on ./train_gpt_cpu against Hugging Face PEFT 0.13.2 (issue 23 item 2).

On test_lora.py's tiny GPT-2 (c_attn, both c_proj, c_fc: GPT-2's Conv1D (in, out) weights, whose output
rows the magnitudes follow) and GQA Llama (every linear module, rsLoRA, q/k rows through our RoPE order),
from the same PEFT DoRA adapter directory (written by PEFT with init_lora_weights=False, so B != 0 and
the magnitudes differ from ||W||), fp32, with test_lora.py's checks: step 1's loss and every trainable
gradient (A, B and the magnitudes), a 10-step AdamW trajectory (weight decay on the magnitudes too), the
trained adapter, PEFT loading ours, the frozen base, a bit-exact resume, and ./hf_convert --adapter's
merged model against the unmerged one (fp32 relative 1e-5, bf16 2e-2); GPT-2's -r 0/1/2 and 2 ranks at
-z 0 / -z 1 write the same adapter bytes.
Zero rows: a GPT-2 whose c_attn has output rows that are all zero, and a Llama whose o_proj has, with
an adapter whose B rows there are zero too (so W + s B A = 0 there, m = 0): PEFT 0.13.2 gives NaN;
llmc's rule (gain 0 where the norm is 0) is finite and equals PEFT with that rule patched in (loss,
gradients, trajectory); fresh adapters (--use-dora 1) on it train with finite losses and keep m = 0 there.
./generate --adapter (unmerged) continues a prompt greedily as the merged model does; --plan counts the
magnitude vectors. Bad inputs: --use-dora without --lora-rank, --use-dora 1 with a LoRA adapter, a DoRA
directory missing a magnitude or holding one of the wrong shape, a magnitude in a LoRA directory, and
--use-dora on the CUDA trainer.
"""
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_lora as tl  # noqa: E402
from testlib import report  # noqa: E402

ROOT, B, T = tl.ROOT, tl.B, tl.T

MAKE_MODELS = tl.MAKE_FAMILIES + r"""
ZERO = [3, 17, 40, 64 + 5, 130]  # output rows (GPT-2 c_attn: q, k and v rows; Llama o_proj: < 64)
for name, make, targets, rslora in FAMILIES:
    for zero in (False, True):
        tag = f"d{name}" + ("_zero" if zero else "")
        m = make(1)
        if zero:
            with torch.no_grad():
                for l in range(2):
                    if name == "gpt2":
                        m.transformer.h[l].attn.c_attn.weight[:, ZERO] = 0.0  # Conv1D (in, out): output columns
                    else:
                        m.model.layers[l].self_attn.o_proj.weight[[r for r in ZERO if r < 64], :] = 0.0
        m.save_pretrained(f"{out}/{tag}", safe_serialization=True)
        pm = peft(m, targets, rslora, use_dora=True)
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if "lora_magnitude_vector" in n: p.mul_(1.1)  # not ||W + s B A||: the gain is not 1
                if zero and "lora_B" in n and ("c_attn" in n or "o_proj" in n):
                    p[[r for r in ZERO if r < p.shape[0]], :] = 0.0
                if zero and "lora_magnitude_vector" in n and ("c_attn" in n or "o_proj" in n):
                    p[[r for r in ZERO if r < p.shape[0]]] = 0.0
        save_adapter(pm, f"{out}/{tag}_adapter")
"""


def check_zero_rows(name, w, data):
    """W + s B A = 0 on some rows: PEFT's NaN, llmc's gain-0 rule against PEFT with the rule patched in."""
    tag = f"d{name}_zero"
    model, adapter = os.path.join(w, tag), os.path.join(w, f"{tag}_adapter")
    plain = os.path.join(w, f"{tag}_peft")
    tl.py(tl.REFERENCE, "--model", model, "--adapter", adapter, "--data", data, "-b", str(B), "-t", str(T), "--eval",
          "--out", plain)
    peft_loss = json.load(open(os.path.join(plain, "losses.json")))[0]
    report(np.isnan(peft_loss), f"{tag}_peft_gives_nan", f"PEFT 0.13.2's loss {peft_loss!r}: the case is not exercised")
    ref = os.path.join(w, f"{tag}_ref")
    tl.py(tl.REFERENCE, "--model", model, "--adapter", adapter, "--data", data, "-b", str(B), "-t", str(T), "-x", "3",
          "-l", str(tl.LR), "-c", str(tl.WD), "--dora-zero-rows", "--out", ref)
    ref_losses = json.load(open(os.path.join(ref, "losses.json")))
    ref_grads, _ = tl.read_safetensors(os.path.join(ref, "grads.safetensors"))
    out, gdir = os.path.join(w, f"{tag}_run"), os.path.join(w, f"{tag}_grads")
    tl.run(tl.train_args(model, adapter, data, out, 3), env=dict(os.environ, LLMC_LORA_DUMP_GRADS=gdir, OMP_NUM_THREADS="2"))
    losses = tl.log_losses(out)
    ok, err = tl.close(losses, ref_losses, 1e-4, 1e-5)
    report(ok and len(losses) == 3 and np.all(np.isfinite(losses)), f"{tag}_losses_finite_match_gain0_rule",
           f"max |diff| {err:.3g}; llmc {losses} PEFT (gain 0 rule) {ref_losses}")
    grads, _ = tl.read_safetensors(os.path.join(gdir, "adapter_model.safetensors"))
    bad = []
    for k in sorted(ref_grads):
        g = grads.get(k)
        scale = float(np.max(np.abs(ref_grads[k]))) or 1.0
        ok, err = tl.close(g, ref_grads[k], 1e-3, 1e-4 * scale) if g is not None and g.shape == ref_grads[k].shape else (0, 0)
        if not ok or not np.all(np.isfinite(g)):
            bad.append(f"{k}: max |diff| {err:.3g}")
    report(not bad and sorted(grads) == sorted(ref_grads), f"{tag}_gradients_match_gain0_rule", "; ".join(bad[:4]))
    # fresh adapters (B = 0, m = ||W||): finite losses, the zero rows' magnitudes stay 0
    fresh = os.path.join(w, f"{tag}_fresh")
    args = tl.train_args(model, adapter, data, fresh, 3)
    i = args.index("--adapter")
    args[i:i + 2] = ["--lora-rank", "4", "--use-dora", "1", "--lora-targets", "c_attn" if name == "gpt2" else "o_proj"]
    tl.run(args)
    losses = tl.log_losses(fresh)
    final, _ = tl.read_safetensors(os.path.join(fresh, "adapter_00000003", "adapter_model.safetensors"))
    mags = [v for k, v in final.items() if k.endswith("lora_magnitude_vector")]
    rows = [r for r in (3, 17, 40, 69, 130) if name == "gpt2" or r < 64]
    ok = len(losses) == 3 and np.all(np.isfinite(losses)) and len(mags) == 2 and all(
        np.all(m[rows] == 0) and np.all(np.isfinite(m)) and np.count_nonzero(m) == m.size - len(rows) for m in mags)
    report(ok, f"{tag}_fresh_dora_trains", f"losses {losses}; magnitudes at the zero rows "
           f"{[m[rows].tolist() for m in mags]}")


def check_plan(w, data):
    """--plan counts the magnitude vectors: the tiny GPT-2 (C 64, F 256, L 2), r 8 on every linear module."""
    import re
    counts = []
    for dora in ("0", "1"):
        p = tl.run(["-e", os.path.join(w, "dgpt2"), "--lora-rank", "8", "--lora-targets", "all-linear", "--use-dora", dora,
                    "--plan", "-i", data, "-b", str(B), "-t", str(T)])
        m = re.search(r"memory plan \(CPU[^)]*\): (\d+) parameters", p.stdout)
        counts.append(int(m.group(1)) if m else -1)
    ab = 2 * 8 * ((64 + 192) + (64 + 64) + (64 + 256) + (256 + 64))  # A and B: R (in + out) per module and layer
    mags = 2 * (192 + 64 + 256 + 64)  # one per output row per module and layer
    report(counts == [ab, ab + mags], "plan_counts_magnitudes", f"planned {counts}, wanted {[ab, ab + mags]}")


def check_errors(w, data):
    g, ga = os.path.join(w, "dgpt2"), os.path.join(w, "dgpt2_adapter")
    base = ["-i", data, "-j", data, "-b", str(B), "-t", str(T), "-x", "1", "-v", "0", "-s", "0"]
    expect = tl.expect

    expect("use_dora_without_rank", ["-e", g, "--use-dora", "1"] + base, "--use-dora need --lora-rank")
    expect("use_dora_2", ["-e", g, "--lora-rank", "4", "--use-dora", "2"] + base, "--use-dora")
    lora = os.path.join(w, "plain_lora_adapter")
    shutil.copytree(ga, lora)
    cfg = json.load(open(os.path.join(lora, "adapter_config.json")))
    cfg["use_dora"] = False
    json.dump(cfg, open(os.path.join(lora, "adapter_config.json"), "w"))
    expect("magnitude_in_lora_adapter", ["-e", g, "--adapter", lora] + base, "but its adapter_config.json has use_dora false")

    def edit(dirname, change):
        d = os.path.join(w, dirname)
        shutil.copytree(ga, d)
        t, _ = tl.read_safetensors(os.path.join(d, "adapter_model.safetensors"))
        t = {k: np.array(v) for k, v in t.items()}
        change(t)
        from_st = os.path.join(d, "adapter_model.safetensors")
        header, blobs, off = {}, [], 0
        for k in sorted(t):
            b = t[k].astype("<f4").tobytes()
            header[k] = {"dtype": "F32", "shape": list(t[k].shape), "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
        h = json.dumps(header).encode()
        with open(from_st, "wb") as f:
            f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))
        return d

    key = "base_model.model.transformer.h.1.mlp.c_fc.lora_magnitude_vector"
    missing = edit("missing_magnitude", lambda t: t.pop(key))
    expect("dora_missing_magnitude", ["-e", g, "--adapter", missing] + base, f"has no tensor {key}")
    expect("dora_missing_magnitude_generate", ["-e", g, "--adapter", missing, "-g", "4"], f"has no tensor {key}",
           prog=os.path.join(ROOT, "generate"))
    expect("dora_missing_magnitude_merge", [g, os.path.join(w, "never.bin"), "--adapter", missing], f"has no tensor {key}",
           prog=os.path.join(ROOT, "hf_convert"))
    report(not os.path.exists(os.path.join(w, "never.bin")), "dora_merge_error_writes_nothing", "never.bin written")
    short = edit("short_magnitude", lambda t: t.update({key: t[key][:-1]}))
    expect("dora_magnitude_wrong_shape", ["-e", g, "--adapter", short] + base, "needs [256]")
    square = edit("square_magnitude", lambda t: t.update({key: np.ones((256, 1), np.float32)}))
    expect("dora_magnitude_two_dims", ["-e", g, "--adapter", square] + base, "needs [256]")
    nolm = edit("no_magnitudes", lambda t: [t.pop(k) for k in list(t) if k.endswith("lora_magnitude_vector")])
    c2 = json.load(open(os.path.join(nolm, "adapter_config.json")))
    c2["use_dora"] = False
    json.dump(c2, open(os.path.join(nolm, "adapter_config.json"), "w"))
    expect("use_dora_with_lora_adapter", ["-e", g, "--adapter", nolm, "--use-dora", "1"] + base,
           "--use-dora 1 differs from the adapter's use_dora false")
    cuda = tl.cuda_trainer()
    if cuda:
        expect("cuda_dora_not_built_yet", ["-e", g, "--lora-rank", "4", "--use-dora", "1"] + base, "not built yet on CUDA",
               prog=cuda)
        expect("cuda_dora_without_rank", ["-e", g, "--use-dora", "1"] + base, "need --lora-rank", prog=cuda)


def checks(w, data):
    for name in ("gpt2", "llama"):
        tag = f"d{name}"
        tl.guarded(tag, lambda: tl.check_family(tag, w, data), lambda: tl.check_merge(tag, w, data),
                   lambda: check_zero_rows(name, w, data))
    tl.check_recompute(w, data, "dgpt2")  # -r 0, 1, 2: the same adapter bytes
    tl.check_ranks(w, data, "dgpt2")  # 2 ranks at -z 0 and -z 1: the same bytes; one process's losses
    check_plan(w, data)
    tl.check_generate(w, dora=True)
    check_errors(w, data)


if __name__ == "__main__":
    sys.exit(tl.run_checks("llmc_dora.", MAKE_MODELS, checks))
