#!/usr/bin/env python3
"""test_qlora.py - QLoRA (issue 23 item 4): LoRA on a quantised frozen base, ./train_gpt_cpu --quantize-base
nf4|int8 [--double-quant 1] and ./generate --quantize-base, against the double-precision reference
(dev/reference/nf4.py) and PEFT on the same dequantised base (dev/reference/lora.py --quantize-base).

  - the C quantiser (build/test/test_quant) writes the same NF4 / int8 codes, absmax, double-quantised
    absmax (indices, absmax2, mean) and dequantised values as nf4.py, byte for byte, on awkward shapes (a
    zero block, an outlier, block counts not a multiple of 256, int8 rows not a multiple of 64); the first
    value of a byte is its high nibble; the NF4 table is bitsandbytes' published one (copied here); the
    dynamic map is within 1 ulp of bitsandbytes' create_dynamic_map computed by torch in float32;
  - GPT-2 (nf4 with double quantisation, int8) and a GQA Llama (nf4, int8; F 128) with LoRA from the same
    PEFT adapter (B != 0): step 1's loss, every adapter gradient and a 10-step trajectory equal PEFT's on
    the reference's dequantised base (fp32: loss rtol 1e-5, gradients rtol 1e-3 + 1e-4 max|g|, trajectory
    rtol 1e-4, as test_lora.py), and differ from the fp32 base's loss; the base directory is untouched and
    each adapter records llmc_quantize_base;
  - a resumed run (-y 1 from step 5) writes the same adapter bytes as one that never stopped; -z 1 on 2
    ranks follows one process; --plan's parameters and op_scratch classes hold the codes and the panel
    (bytes computed here from the shapes); ./generate --quantize-base nf4 continues a prompt greedily as
    ./generate does on the reference's dequantised model;
  - bad inputs are clear errors: an unknown mode, --double-quant with int8, --quantize-base without
    adapters, a resume with another mode or without it, in-features not a multiple of 64 (nf4), DoRA on a
    quantised base, and ./train_gpt ("not built for ./train_gpt yet").
"""
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_lora as tl  # noqa: E402
import testlib  # noqa: E402
from f32_safetensors import read_safetensors  # noqa: E402
from testlib import report  # noqa: E402

ROOT, B, T, STEPS, CPU = tl.ROOT, tl.B, tl.T, tl.STEPS, tl.CPU
QUANT = os.path.join(ROOT, "build", "test", "test_quant")
NF4 = os.path.join(ROOT, "dev", "reference", "nf4.py")
sys.path.insert(0, os.path.join(ROOT, "dev", "reference"))
import nf4  # noqa: E402

# bitsandbytes' NF4 code values as published (bitsandbytes/functional.py get_4bit_type('nf4'))
BNB_NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
           -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
           0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]

# test_lora.py's tiny models, the Llama with F 128 (NF4's blocks of 64 need down_proj's in features a
# multiple of 64); llama96 is test_lora.py's shape (F 96), for the error
MAKE_MODELS = tl.MAKE_FAMILIES.replace("intermediate_size=96", "intermediate_size=128") + r"""
for name, make, targets, rslora in FAMILIES:
    m = make(1)
    m.save_pretrained(f"{out}/{name}", safe_serialization=True)
    save_adapter(peft(m, targets, rslora), f"{out}/{name}_adapter")
torch.manual_seed(1)
LlamaForCausalLM(LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                             num_hidden_layers=2, vocab_size=V, max_position_embeddings=64, tie_word_embeddings=False,
                             rms_norm_eps=1e-5)).save_pretrained(f"{out}/llama96", safe_serialization=True)
torch.manual_seed(4)  # GPT-2's vocabulary, for ./generate with its tokenizer
GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=50257, n_positions=64, initializer_range=0.3)).save_pretrained(
    f"{out}/gpt2_gen", safe_serialization=True)
"""

# the reference's dequantised copy of a model directory (argv: SRC DST MODE DQ)
DEQUANTISE = r"""
import sys, torch
sys.path.insert(0, sys.argv[5])
from transformers import AutoModelForCausalLM
from lora import quantize_base
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
print(quantize_base(m, sys.argv[3], sys.argv[4] == "1"))
m.save_pretrained(sys.argv[2], safe_serialization=True)
"""


def qflags(mode, dq):
    return ["--quantize-base", mode] + (["--double-quant", "1"] if dq else [])


def tree_digest(d):
    h = hashlib.sha256()
    for root, _, files in sorted(os.walk(d)):
        for f in sorted(files):
            h.update(f.encode() + open(os.path.join(root, f), "rb").read())
    return h.hexdigest()


# ---- the C quantiser against nf4.py ---------------------------------------------------------------
def check_codes(w):
    rng = np.random.default_rng(3)
    cases = []
    m = (rng.standard_normal((300, 128)) * 0.02).astype(np.float32)
    m[3, :64] = 0.0      # a zero block
    m[5, 7] = 0.5        # an outlier
    m[9, :] = np.linspace(-1, 1, 128)  # values on and near the code midpoints' scale
    cases += [("nf4", 0, m), ("nf4", 1, m), ("int8", 0, m)]
    cases.append(("nf4", 1, (rng.standard_normal((1000, 64)) * 3 + 1).astype(np.float32)))  # 1000 blocks: 3 full DQ blocks + 232
    cases.append(("nf4", 1, (rng.standard_normal((7, 320))).astype(np.float32)))  # 35 blocks: one short DQ block
    cases.append(("int8", 0, (rng.standard_normal((33, 100)) * 0.1).astype(np.float32)))  # cols not a multiple of 64
    for i, (mode, dq, mat) in enumerate(cases):
        src, c, r = (os.path.join(w, f"q{i}.{x}") for x in ("f32", "c", "ref"))
        mat.tofile(src)
        os.makedirs(c)
        p = subprocess.run([QUANT, mode, str(dq), str(mat.shape[0]), str(mat.shape[1]), src, c], capture_output=True, text=True)
        subprocess.run([sys.executable, NF4, mode, str(dq), str(mat.shape[0]), str(mat.shape[1]), src, r], check=True)
        files = sorted(os.listdir(r))
        diff = [f for f in files if not os.path.exists(os.path.join(c, f)) or
                open(os.path.join(c, f), "rb").read() != open(os.path.join(r, f), "rb").read()]
        report(p.returncode == 0 and not diff and len(files) >= 5, f"codes_{mode}_dq{dq}_{mat.shape[0]}x{mat.shape[1]}",
               f"rc {p.returncode} {p.stderr[-200:]}; differ from nf4.py: {diff} of {files}")
        if i == 0:
            deq = np.fromfile(os.path.join(c, "dequant.f32"), np.float32).reshape(mat.shape)
            absmax = np.abs(mat.reshape(-1, 64)).max(axis=1)
            err = np.abs(deq - mat).reshape(-1, 64).max(axis=1)
            report(bool(np.all(err <= absmax * 0.16 + 1e-12)) and not np.any(deq[3, :64]),
                   "nf4_dequant_error_within_half_the_largest_gap", f"max err/absmax {np.max(err / np.maximum(absmax, 1e-30)):.3g}")
    # the first value of a byte in its high nibble: -1 (index 0) then 1 (index 15) -> 0x0f
    pair = np.array([[-1.0, 1.0] + [0.0] * 62], np.float32)
    src, c = os.path.join(w, "nib.f32"), os.path.join(w, "nib.c")
    pair.tofile(src)
    os.makedirs(c)
    subprocess.run([QUANT, "nf4", "0", "1", "64", src, c], check=True)
    first = open(os.path.join(c, "codes.bin"), "rb").read()[:2]
    report(first == bytes([0x0F, 0x77]), "nf4_first_value_high_nibble", f"bytes {first.hex()} (want 0f77)")
    table = np.fromfile(os.path.join(c, "table.f32"), np.float32)
    report(np.array_equal(table, np.array(BNB_NF4, np.float32)), "nf4_table_is_bitsandbytes", f"{table.tolist()}")
    cmap = np.fromfile(os.path.join(c, "map.f32"), np.float32)
    bnb = nf4.dynamic_map_bitsandbytes_torch()
    ulps = np.abs(cmap.view(np.int32).astype(np.int64) - bnb.view(np.int32).astype(np.int64))
    report(cmap.shape == (256,) and ulps.max() <= 1 and cmap[-1] == 1.0 and 0.0 in cmap and np.all(np.diff(cmap) > 0),
           "dynamic_map_is_create_dynamic_map", f"max {ulps.max()} ulps from bitsandbytes' torch float32 values")
    p = subprocess.run([QUANT, "nf4", "0", "4", "100", src, c], capture_output=True, text=True)
    report(p.returncode == 1 and "multiple of 64" in p.stderr, "codes_nf4_cols_not_multiple_of_64_refused", p.stderr)


# ---- the trainer against PEFT on the dequantised base ------------------------------------------------
def check_family(name, mode, dq, w, data):
    model, adapter = os.path.join(w, name), os.path.join(w, f"{name}_adapter")
    tag = f"{name}_{mode}" + ("_dq" if dq else "")
    ref = os.path.join(w, f"{tag}_ref")
    before = tree_digest(model)
    tl.py(tl.REFERENCE, "--model", model, "--adapter", adapter, "--data", data, "-b", str(B), "-t", str(T), "-x", str(STEPS),
          "-l", str(tl.LR), "-c", str(tl.WD), "--quantize-base", mode, *(["--double-quant"] if dq else []), "--out", ref)
    ref_losses = json.load(open(os.path.join(ref, "losses.json")))
    ref_grads, _ = read_safetensors(os.path.join(ref, "grads.safetensors"))

    out, gdir = os.path.join(w, f"{tag}_run"), os.path.join(w, f"{tag}_grads")
    env = dict(os.environ, LLMC_LORA_DUMP_GRADS=gdir, OMP_NUM_THREADS="2")
    p = tl.run(tl.train_args(model, adapter, data, out, STEPS, ["-n", "5"] + qflags(mode, dq)), env=env)
    report(f"quantised base ({nf4_name(mode, dq)})" in p.stdout, f"{tag}_memory_line", p.stdout[-600:])
    losses = tl.log_losses(out)
    ok, _ = tl.close(losses[0], ref_losses[0], 1e-5, 1e-6)
    report(ok, f"{tag}_loss_step1", f"llmc {losses[0]!r} reference {ref_losses[0]!r}")
    # -x 0 on the quantised base is the fp32 trainer on the reference's dequantised copy of the model (to
    # summation order: the printed 6 decimals), which the fp32 base is not
    deq = os.path.join(w, f"{tag}_dequantised")
    tl.py(DEQUANTISE, model, deq, mode, str(dq), os.path.join(ROOT, "dev", "reference"))
    ev = ["--adapter", adapter, "-i", data, "-j", data, "-b", str(B), "-t", str(T)]
    mine, theirs, fp32 = (tl.val_loss(["-e", m] + ev + f) for m, f in ((model, qflags(mode, dq)), (deq, []), (model, [])))
    report(abs(mine - theirs) <= 3e-6 and abs(mine - fp32) > 1e-5, f"{tag}_eval_is_the_dequantised_model",
           f"-x 0 val loss: {mode} base {mine!r}, the reference's dequantised model {theirs!r}, the fp32 base {fp32!r}")
    grads, _ = read_safetensors(os.path.join(gdir, "adapter_model.safetensors"))
    bad = tl.gradient_mismatches(grads, ref_grads)
    report(not bad and sorted(grads) == sorted(ref_grads), f"{tag}_every_adapter_gradient",
           f"{len(ref_grads)} tensors; " + "; ".join(bad[:4]))
    ok, err = tl.close(losses, ref_losses, 1e-4, 1e-5)
    report(ok and len(losses) == STEPS and ref_losses[-1] < ref_losses[0], f"{tag}_trajectory_{STEPS}_steps",
           f"max |diff| {err:.3g}; llmc {losses[:2]}...{losses[-1:]} reference {ref_losses[:2]}...{ref_losses[-1:]}")
    _, meta5 = read_safetensors(os.path.join(out, "adapter_00000005", "adapter_model.safetensors"))
    _, meta10 = read_safetensors(os.path.join(out, f"adapter_{STEPS:08d}", "adapter_model.safetensors"))
    want = "nf4+dq" if dq else mode
    report(meta5.get("llmc_quantize_base") == want == meta10.get("llmc_quantize_base") and
           meta5.get("llmc_base_crc32") == meta10.get("llmc_base_crc32") and tree_digest(model) == before,
           f"{tag}_base_untouched_and_recorded", f"metadata {meta5} / {meta10}")
    return out


def nf4_name(mode, dq):
    return "nf4 (double-quant)" if dq else mode


def check_resume(w, data):
    """-y 1 from step 5 writes the adapter bytes of the run that never stopped (GPT-2, nf4 with double quantisation);
    a resume with another mode, or without --quantize-base, is an error."""
    model, adapter = os.path.join(w, "gpt2"), os.path.join(w, "gpt2_adapter")
    straight, res = os.path.join(w, "q_straight"), os.path.join(w, "q_resume")
    args = tl.train_args(model, adapter, data, straight, STEPS, ["-n", "5"] + qflags("nf4", 1))
    del args[args.index("-a"):args.index("-a") + 2]
    tl.run(args)
    shutil.copytree(straight, res)
    for f in os.listdir(res):
        if any(f.endswith(f"{s:08d}") or f.startswith(f"state_{s:08d}") or f.startswith(f"DONE_{s:08d}")
               for s in range(6, STEPS + 1)) or f == "log.jsonl":
            p = os.path.join(res, f)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    args[args.index("-o") + 1] = res
    plain = args[:args.index("--quantize-base")]  # (qflags come last)
    tl.expect("resume_with_another_mode", plain + ["--quantize-base", "int8", "-y", "1"], "quantize")
    tl.expect("resume_without_quantize_base", plain + ["-y", "1"], "quantize")
    # past the run's saved flags (--allow-config-change 1), the adapter's own record refuses it
    tl.expect("resume_adapter_records_another_mode", plain + ["--quantize-base", "int8", "-y", "1", "--allow-config-change", "1"],
              "was trained on a nf4+dq base, this run asks for int8")
    tl.expect("resume_adapter_records_a_quantised_base", plain + ["-y", "1", "--allow-config-change", "1"],
              "was trained on a nf4+dq base, this run asks for fp32")
    tl.run(args + ["-y", "1"])
    key = os.path.join(f"adapter_{STEPS:08d}", "adapter_model.safetensors")
    a, b = (open(os.path.join(d, key), "rb").read() for d in (straight, res))
    report(a == b, "gpt2_nf4_dq_resume_bit_exact", "the adapter of step 10 differs after -y 1 from step 5")


def check_ranks(w, data):
    """-z 1 on 2 ranks (-pi tcp) with an nf4 base follows one process accumulating the same -d."""
    model, adapter = os.path.join(w, "llama"), os.path.join(w, "llama_adapter")
    outs = {}
    for run_name, launch in [("z1", ["scripts/run_dist.sh", "local", "2", "--pi", "tcp"]), ("one", [CPU])]:
        out = os.path.join(w, f"qranks_{run_name}")
        args = tl.train_args(model, adapter, data, out, 4, ["-d", str(2 * B * T), "--threads", "1"] + qflags("nf4", 0))
        del args[args.index("-a"):args.index("-a") + 2]
        if run_name == "z1":
            args += ["-z", "1"]
        p = subprocess.run(launch + args, capture_output=True, text=True, cwd=ROOT, timeout=300)
        if not report(p.returncode == 0, f"qlora_ranks_{run_name}_runs", (p.stdout + p.stderr)[-1500:]):
            return
        outs[run_name] = out
    ok, err = tl.close(tl.log_losses(outs["z1"]), tl.log_losses(outs["one"]), 1e-5, 1e-6)
    report(ok and len(tl.log_losses(outs["z1"])) == 4, "qlora_ranks_2_z1_match_one_process", f"max |diff| {err:.3g}")


def expected_bytes(mode, dq, modules, L):
    """(codes, fp32, panel) bytes of the quantised base: modules [(out, in)] per layer."""
    codes = fp32 = 0
    for o, i in modules:
        n = o * i
        fp32 += 4 * n * L
        if mode == "int8":
            codes += L * (4 * o + (n + 3) // 4 * 4)
        elif not dq:
            codes += L * (4 * (n // 64) + (n // 2 + 3) // 4 * 4)
        else:
            nb = n // 64
            codes += L * (4 * ((nb + 255) // 256) + (n // 2 + 3) // 4 * 4 + (nb + 3) // 4 * 4)
    return codes, fp32, 128 * max(i for _, i in modules) * 4


def check_plan(w, data):
    model, adapter = os.path.join(w, "gpt2"), os.path.join(w, "gpt2_adapter")
    base = ["-e", model, "--adapter", adapter, "-b", str(B), "-t", str(T), "--plan", "--json"]
    plain = json.loads(tl.run(base).stdout)
    gpt2 = [(192, 64), (64, 64), (256, 64), (64, 256)]  # c_attn, attn.c_proj, c_fc, mlp.c_proj (out, in)
    for mode, dq in (("nf4", 0), ("nf4", 1), ("int8", 0)):
        q = json.loads(tl.run(base + qflags(mode, dq)).stdout)
        codes, fp32, panel = expected_bytes(mode, dq, gpt2, 2)
        got = (plain["classes"]["parameters"] - q["classes"]["parameters"], q["classes"]["op_scratch"] - plain["classes"]["op_scratch"])
        report(got == (fp32 - codes, panel), f"plan_{mode}_dq{dq}_classes",
               f"parameters down {got[0]} (want {fp32 - codes}), op_scratch up {got[1]} (want {panel})")
    text = tl.run(base[:-1] + qflags("nf4", 1)).stdout
    report("quantised base (--quantize-base nf4 (double-quant))" in text, "plan_quantised_base_line", text[-500:])


def check_generate(w):
    """./generate --quantize-base nf4 (and int8) continues greedily as ./generate on the reference's dequantised model."""
    gen, src = os.path.join(ROOT, "generate"), os.path.join(w, "gpt2_gen")
    tok = subprocess.run([os.path.join(ROOT, "tokenizer"), "find-gpt2"], capture_output=True, text=True, cwd=ROOT)
    if not report(tok.returncode == 0, "generate_gpt2_tokenizer_files", tok.stderr[-300:]):
        return
    g = ["--prompt", "The king said", "--temperature", "0", "-g", "16", "--threads", "1", "--tokenizer",
         os.path.join(ROOT, tok.stdout.strip())]
    text = lambda r: r.stdout.split(b"The king said", 1)[-1]  # noqa: E731
    fp32 = subprocess.run([gen, "-e", src] + g, capture_output=True)
    for mode, dq in (("nf4", 1), ("int8", 0)):
        deq = os.path.join(w, f"gpt2_gen_{mode}")
        tl.py(DEQUANTISE, src, deq, mode, str(dq), os.path.join(ROOT, "dev", "reference"))
        a = subprocess.run([gen, "-e", src] + qflags(mode, dq) + g, capture_output=True)
        b = subprocess.run([gen, "-e", deq] + g, capture_output=True)
        report(a.returncode == 0 and b.returncode == 0 and text(a) == text(b) and (mode == "int8" or text(a) != text(fp32)),
               f"generate_{mode}_equals_dequantised_model",
               f"quantised {text(a)[-100:]!r}, dequantised {text(b)[-100:]!r}, fp32 {text(fp32)[-100:]!r} {a.stderr[-300:]!r}")


def check_errors(w, data):
    g, ga = os.path.join(w, "gpt2"), os.path.join(w, "gpt2_adapter")
    base = ["-i", data, "-j", data, "-b", str(B), "-t", str(T), "-x", "1", "-v", "0", "-s", "0"]
    tl.expect("unknown_mode", ["-e", g, "--adapter", ga, "--quantize-base", "nf3"] + base, "unknown mode 'nf3'")
    tl.expect("double_quant_with_int8", ["-e", g, "--adapter", ga, "--quantize-base", "int8", "--double-quant", "1"] + base,
              "--double-quant 1 is for --quantize-base nf4 only")
    tl.expect("quantize_without_adapters", ["-e", g, "--quantize-base", "nf4"] + base, "needs LoRA adapters")
    tl.expect("dora_on_quantised_base", ["-e", g, "--lora-rank", "4", "--use-dora", "1", "--quantize-base", "nf4"] + base,
              "DoRA on a quantised base is not built yet")
    tl.expect("nf4_in_features_not_multiple_of_64", ["-e", os.path.join(w, "llama96"), "--lora-rank", "4",
                                                     "--quantize-base", "nf4"] + base, "mlp.down_proj is (64, 96)")
    dora = os.path.join(w, "dora_run")
    tl.run(["-e", g, "--lora-rank", "4", "--use-dora", "1", "-o", dora] + base)
    tl.expect("dora_adapter_on_quantised_base", ["-e", g, "--adapter", os.path.join(dora, "adapter_00000001"),
                                                 "--quantize-base", "int8"] + base, "DoRA on a quantised base is not built yet")
    tl.expect("plan_nf4_in_features_not_multiple_of_64", ["-e", os.path.join(w, "llama96"), "--lora-rank", "4",
                                                          "--quantize-base", "nf4", "-t", "32", "--plan", "--json"], "mlp.down_proj is (64, 96)")
    tl.expect("generate_unknown_mode", ["-e", g, "--quantize-base", "fp4"], "unknown mode 'fp4'", prog=os.path.join(ROOT, "generate"))
    cuda = tl.cuda_trainer()
    if cuda:
        tl.expect("cuda_not_built_yet", ["-e", g, "--lora-rank", "4", "--quantize-base", "nf4"] + base,
                  "--quantize-base is not built for ./train_gpt yet", prog=cuda)


def checks(w, data):
    tl.guarded("codes", lambda: check_codes(w))
    for name, mode, dq in (("gpt2", "nf4", 1), ("gpt2", "int8", 0), ("llama", "nf4", 0), ("llama", "int8", 0)):
        tl.guarded(f"{name}_{mode}", lambda: check_family(name, mode, dq, w, data))
    tl.guarded("resume", lambda: check_resume(w, data))
    tl.guarded("ranks", lambda: check_ranks(w, data))
    tl.guarded("plan", lambda: check_plan(w, data))
    tl.guarded("generate", lambda: check_generate(w))
    tl.guarded("errors", lambda: check_errors(w, data))


if __name__ == "__main__":
    if not os.access(QUANT, os.X_OK):
        report(False, "built", f"{QUANT} is not built (make {os.path.relpath(QUANT, ROOT)})")
        sys.exit(1)
    sys.exit(tl.run_checks("llmc_qlora.", MAKE_MODELS, checks))
