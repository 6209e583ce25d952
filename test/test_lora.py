#!/usr/bin/env python3
"""test_lora.py - LoRA / rsLoRA fine-tuning on ./train_gpt_cpu against Hugging Face PEFT (issue 23).

On a tiny GPT-2 and a tiny GQA Llama (Hugging Face directories written here by transformers, seeded),
from the same PEFT adapter directory (written by PEFT with init_lora_weights=False, so B != 0 and the
gradients reach A; the Llama's with use_rslora and every linear module, q/k rows through our RoPE row
order), fp32, one batch (-a 1):
  - step 1's loss and every adapter gradient (LLMC_LORA_DUMP_GRADS) equal PEFT's (dev/reference/lora.py);
  - a 10-step trajectory (losses, then the trained adapter's tensors) follows PEFT's with llmc's AdamW;
  - the adapter llmc writes loads in PEFT, whose loss on the batch is llmc's next one (-x 0 --adapter);
  - the base is bit-identical through training (each checkpoint recomputes its CRC: steps 5 and 10 agree);
  - a run resumed mid-way (-y 1 from step 5) writes the same adapter bytes as one that never stopped;
  - ./hf_convert --adapter merges: the merged model's loss is the unmerged one's (fp32 1e-5, bf16 2e-2),
    and ./generate --adapter (unmerged) continues a prompt greedily as the merged model does;
  - 2 ranks at -z 0 and -z 1 write the same adapter; adapter_NNNNNNNN/ is a run file (-nk, --overwrite 1).
Bad inputs are clear errors: --lora-rank above min(in, out), r 0 in adapter_config.json, an unknown and
an unmatched target, an adapter of another base (other weights: CRC; other shapes: tensor), -z 2, and
--lora-rank on the CUDA trainer ("not built yet on CUDA").

The reference libraries: peft 0.13.2 + transformers 4.36.2 (and what they import that the system
lacks) in build/pyref (LLMC_PYREF_DIR), installed there with pip --no-deps --target when missing.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.append(os.path.join(ROOT, "dev", "reference"))
import testlib  # noqa: E402
from f32_safetensors import read_safetensors  # noqa: E402 (test_dora.py's too)
from testlib import report  # noqa: E402

PYREF = os.environ.get("LLMC_PYREF_DIR", os.path.join(ROOT, "build", "pyref"))
PYREF_PKGS = ["peft==0.13.2", "transformers==4.36.2", "huggingface_hub==0.25.2", "accelerate==0.34.2", "tqdm",
              "filelock", "fsspec"]
CPU = os.path.join(ROOT, "train_gpt_cpu")
V, B, T, STEPS = 96, 2, 32, 10
LR, WD = 2e-3, 0.1


def pyenv():
    env = dict(os.environ, PYTHONPATH=PYREF + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="2",
               TRANSFORMERS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def ensure_pyref():
    """The reference libraries in PYREF, installed when missing. The suite runs tests two at a time
    and several use PYREF (test_lora, test_dora, test_moe, test_adafactor): one installs while the
    others wait on PYREF's lock file, then find it installed."""
    import fcntl
    probe = "import peft, transformers; assert peft.__version__ == '0.13.2' and transformers.__version__ == '4.36.2'"
    os.makedirs(os.path.dirname(PYREF), exist_ok=True)
    with open(PYREF + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if subprocess.run([sys.executable, "-c", probe], env=pyenv(), capture_output=True).returncode == 0:
            return True
        print(f"installing the reference libraries into {PYREF}: {' '.join(PYREF_PKGS)}")
        p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", PYREF] + PYREF_PKGS,
                           capture_output=True, text=True)
        ok = p.returncode == 0 and subprocess.run([sys.executable, "-c", probe], env=pyenv(),
                                                  capture_output=True).returncode == 0
    report(ok, "reference_libraries", "" if ok else f"pip install --no-deps --target {PYREF} failed: {p.stderr[-800:]}")
    return ok


REFERENCE = os.path.join(ROOT, "dev", "reference", "lora.py")


def py(code, *args):
    """Runs python code (or a script, a path ending .py) with the reference libraries; returns its stdout (dies on failure)."""
    cmd = [sys.executable, code] if code.endswith(".py") else [sys.executable, "-c", code]
    p = subprocess.run(cmd + list(args), env=pyenv(), capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"python failed: {p.stderr[-3000:]}")
    return p.stdout


# the tiny seeded models and PEFT adapters (argv: OUT_DIR V), shared by test_dora.py's MAKE_MODELS:
# FAMILIES (name, make(seed), PEFT targets, use_rslora); peft(m, targets, rslora, **config) wraps m with
# seeded random adapters (B random too, scaled by 0.3: gradients reach A); save_adapter(pm, d) writes them
MAKE_FAMILIES = r"""
import os, sys, torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
from peft import LoraConfig, get_peft_model
out, V = sys.argv[1], int(sys.argv[2])
def gpt2(seed):
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=V, n_positions=64, resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0))
def llama(seed):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                                        num_hidden_layers=2, vocab_size=V, max_position_embeddings=64,
                                        tie_word_embeddings=False, rms_norm_eps=1e-5))
FAMILIES = [("gpt2", gpt2, ["c_attn", "c_proj", "c_fc"], False),
            ("llama", llama, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], True)]
def peft(m, targets, rslora, **config):
    torch.manual_seed(5)
    pm = get_peft_model(m, LoraConfig(r=4, lora_alpha=16, target_modules=targets, lora_dropout=0.0, use_rslora=rslora,
                                      init_lora_weights=False, **config))  # B random too: gradients reach A
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n: p.mul_(0.3)
    return pm
def save_adapter(pm, d):
    os.makedirs(d, exist_ok=True)
    open(f"{d}/README.md", "w").write("---\nlibrary_name: peft\n---\n")  # (no Jinja2 needed)
    pm.save_pretrained(d)
"""

MAKE_MODELS = MAKE_FAMILIES + r"""
for name, make, targets, rslora in FAMILIES:
    m = make(1)
    m.save_pretrained(f"{out}/{name}", safe_serialization=True)
    make(2).save_pretrained(f"{out}/{name}_other", safe_serialization=True)  # same shapes, other weights
    if name == "gpt2":  # other shapes, the same module names
        torch.manual_seed(3)
        GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=96, n_head=4, vocab_size=V, n_positions=64)).save_pretrained(
            f"{out}/gpt2_wide", safe_serialization=True)
    save_adapter(peft(m, targets, rslora), f"{out}/{name}_adapter")
"""


def log_losses(outdir):
    losses = {}
    with open(os.path.join(outdir, "log.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "step" in r and "train_loss" in r and "event" not in r:
                losses[r["step"]] = r["train_loss"]
    return [losses[s] for s in sorted(losses)]


def close(a, b, rtol, atol):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    err = np.abs(a - b) - atol - rtol * np.abs(b)
    return bool(np.all(err <= 0)), float(np.max(np.abs(a - b))) if a.size else 0.0


def gradient_mismatches(grads, ref_grads):
    """What differs between two {name: gradient} maps: a tensor missing or misshapen, or off by more than
    1e-3 relative + 1e-4 of its largest reference value, or a reference gradient that is all zero (it
    tests nothing); [] when they agree."""
    bad = []
    for k in sorted(ref_grads):
        if k not in grads or grads[k].shape != ref_grads[k].shape:
            bad.append(f"{k}: missing or shape {grads.get(k, np.zeros(0)).shape} vs {ref_grads[k].shape}")
            continue
        scale = float(np.max(np.abs(ref_grads[k]))) or 1.0
        ok, err = close(grads[k], ref_grads[k], 1e-3, 1e-4 * scale)
        if not ok or not np.any(ref_grads[k]):
            bad.append(f"{k}: max |diff| {err:.3g} (max |g| {scale:.3g})")
    return bad


def train_args(model, adapter, data, outdir, steps, extra=()):
    return ["-e", model, "--adapter", adapter, "-i", data, "-j", data, "-b", str(B), "-t", str(T), "-x", str(steps),
            "-a", "1", "--shuffle", "0", "-k", "constant", "-u", "0", "-l", str(LR), "-c", str(WD), "--grad-clip", "0",
            "-v", "0", "-s", "0", "-o", outdir, "--threads", "2"] + list(extra)


def run(args, env=None, expect_ok=True):
    p = subprocess.run([CPU] + args, capture_output=True, text=True, env=env)
    if expect_ok and p.returncode != 0:
        raise RuntimeError(f"train_gpt_cpu {' '.join(args)} failed:\n{(p.stdout + p.stderr)[-3000:]}")
    return p


def check_family(name, w, data, kind="adapter", reference=REFERENCE):
    """The checks above of model w/NAME from the PEFT adapter w/NAME_KIND against reference (a script taking
    lora.py's flags); the checks are named NAME_... (KIND other than "adapter": NAME_KIND_...)."""
    model, adapter = os.path.join(w, name), os.path.join(w, f"{name}_{kind}")
    name = name if kind == "adapter" else f"{name}_{kind}"
    ref = os.path.join(w, f"{name}_ref")
    py(reference, "--model", model, "--adapter", adapter,
       "--data", data, "-b", str(B), "-t", str(T), "-x", str(STEPS), "-l", str(LR), "-c", str(WD), "--out", ref)
    ref_losses = json.load(open(os.path.join(ref, "losses.json")))
    ref_grads, _ = read_safetensors(os.path.join(ref, "grads.safetensors"))
    ref_final, _ = read_safetensors(os.path.join(ref, "adapter", "adapter_model.safetensors"))

    out, gdir = os.path.join(w, f"{name}_run"), os.path.join(w, f"{name}_grads")
    env = dict(os.environ, LLMC_LORA_DUMP_GRADS=gdir, OMP_NUM_THREADS="2")
    run(train_args(model, adapter, data, out, STEPS, ["-n", "5"]), env=env)
    losses = log_losses(out)
    ok, err = close(losses[0], ref_losses[0], 1e-5, 1e-6)
    report(ok, f"{name}_loss_step1", f"llmc {losses[0]!r} PEFT {ref_losses[0]!r}")

    grads, _ = read_safetensors(os.path.join(gdir, "adapter_model.safetensors"))
    report(sorted(grads) == sorted(ref_grads), f"{name}_gradient_keys",
           f"llmc {sorted(grads)[:3]}..., PEFT {sorted(ref_grads)[:3]}...")
    bad = gradient_mismatches(grads, ref_grads)
    report(not bad, f"{name}_every_adapter_gradient", f"{len(ref_grads)} tensors; " + "; ".join(bad[:4]))

    ok, err = close(losses, ref_losses, 1e-4, 1e-5)
    report(ok and len(losses) == STEPS and ref_losses[-1] < ref_losses[0], f"{name}_trajectory_{STEPS}_steps",
           f"max |diff| {err:.3g}; llmc {losses[:2]}...{losses[-1:]} PEFT {ref_losses[:2]}...{ref_losses[-1:]}")
    final, meta10 = read_safetensors(os.path.join(out, f"adapter_{STEPS:08d}", "adapter_model.safetensors"))
    bad = []
    for k in sorted(ref_final):
        scale = float(np.max(np.abs(ref_final[k]))) or 1.0
        ok, err = close(final.get(k, np.zeros(0)), ref_final[k], 1e-3, 1e-4 * scale) if k in final else (False, 0)
        if not ok:
            bad.append(f"{k}: max |diff| {err:.3g}")
    report(not bad and sorted(final) == sorted(ref_final), f"{name}_trained_adapter", "; ".join(bad[:4]))

    # PEFT loads the adapter llmc wrote; its loss on the batch is what llmc computes from it
    ev = os.path.join(w, f"{name}_eval")
    py(reference, "--model", model, "--adapter",
       os.path.join(out, f"adapter_{STEPS:08d}"), "--data", data, "-b", str(B), "-t", str(T), "--eval", "--out", ev)
    peft_loss = json.load(open(os.path.join(ev, "losses.json")))[0]
    p = run(["-e", model, "--adapter", os.path.join(out, f"adapter_{STEPS:08d}"), "-i", data, "-j", data, "-b", str(B),
             "-t", str(T), "-x", "0", "-v", "1", "-m", "1", "-s", "0"])
    vl = [l for l in p.stdout.splitlines() if l.startswith("val loss")]
    mine = float(vl[-1].split()[2]) if vl else float("nan")
    ok, _ = close(mine, peft_loss, 1e-5, 1e-6)
    report(ok, f"{name}_peft_loads_our_adapter", f"llmc -x 0 val loss {mine!r}, PEFT's loss with it {peft_loss!r}")

    _, meta5 = read_safetensors(os.path.join(out, "adapter_00000005", "adapter_model.safetensors"))
    report(meta5.get("llmc_base_crc32") and meta5.get("llmc_base_crc32") == meta10.get("llmc_base_crc32"),
           f"{name}_base_bit_identical", f"base crc32 at step 5 {meta5.get('llmc_base_crc32')}, step 10 "
           f"{meta10.get('llmc_base_crc32')}")

    # resume mid-run: the same bytes as the run that never stopped (on the data in order: -a 1 would
    # take the first batch after the resumed position)
    straight, res = os.path.join(w, f"{name}_straight"), os.path.join(w, f"{name}_resume")
    in_order = [a for a in train_args(model, adapter, data, straight, STEPS, ["-n", "5"])]
    del in_order[in_order.index("-a"):in_order.index("-a") + 2]
    run(in_order)
    shutil.copytree(straight, res)
    for f in os.listdir(res):
        if f.endswith(f"{STEPS:08d}") or f.startswith(f"state_{STEPS:08d}") or f == "log.jsonl":
            p = os.path.join(res, f)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    for f in list(os.listdir(res)):  # keep step 5 only
        if any(f.endswith(f"{s:08d}") or f.startswith(f"state_{s:08d}") for s in range(6, STEPS)):
            p = os.path.join(res, f)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    in_order[in_order.index("-o") + 1] = res
    run(in_order + ["-y", "1"])
    a = open(os.path.join(straight, f"adapter_{STEPS:08d}", "adapter_model.safetensors"), "rb").read()
    b = open(os.path.join(res, f"adapter_{STEPS:08d}", "adapter_model.safetensors"), "rb").read()
    report(a == b, f"{name}_resume_bit_exact", "the adapter of step 10 differs after -y 1 from step 5")


def val_loss(args):
    p = run(args + ["-x", "0", "-v", "1", "-m", "1", "-s", "0"])
    vl = [l for l in p.stdout.splitlines() if l.startswith("val loss")]
    return float(vl[-1].split()[2]) if vl else float("nan")


def check_merge(name, w, data):
    """./hf_convert IN OUT --adapter DIR merges in fp32: the merged model's loss is the unmerged one's
    (fp32: relative 1e-5; --dtype bf16, rounded once: relative 2e-2)."""
    model, trained = os.path.join(w, name), os.path.join(w, f"{name}_run", f"adapter_{STEPS:08d}")
    flags = ["-i", data, "-j", data, "-b", str(B), "-t", str(T)]
    unmerged = val_loss(["-e", model, "--adapter", trained] + flags)
    for dtype, rtol in (("fp32", 1e-5), ("bf16", 2e-2)):
        out = os.path.join(w, f"{name}_merged_{dtype}.bin")
        p = subprocess.run([os.path.join(ROOT, "hf_convert"), model, out, "--adapter", trained, "--dtype", dtype],
                           capture_output=True, text=True)
        if p.returncode != 0:
            report(False, f"{name}_merge_{dtype}", (p.stdout + p.stderr)[-800:])
            continue
        merged = val_loss(["-e", out] + flags)
        ok, _ = close(merged, unmerged, rtol, 0)
        report(ok and "weights changed" in p.stdout, f"{name}_merged_{dtype}_equals_unmerged",
               f"merged {merged!r}, unmerged {unmerged!r} (rtol {rtol})")


def check_generate(w, dora=False):
    """./generate -e BASE --adapter DIR (unmerged; DoRA with dora) continues a prompt greedily as the merged model does."""
    gen, conv = os.path.join(ROOT, "generate"), os.path.join(ROOT, "hf_convert")
    base_run, lora_run = os.path.join(w, "gen_base"), os.path.join(w, "gen_dora" if dora else "gen_lora")
    rng = random.Random(11)
    big = os.path.join(w, "big.bin")
    testlib.write_shard(big, [rng.randrange(50257) for _ in range(4096)])
    flags = ["-i", big, "-j", big, "-b", "2", "-t", "32", "-v", "0", "-s", "0", "--threads", "2"]
    run(["-e", "d2", "-x", "1", "-o", base_run] + flags)
    base = os.path.join(base_run, "model_00000001.bin")
    run(["-e", base, "-x", "3", "-l", "3e-2", "-o", lora_run, "--lora-rank", "8", "--lora-targets", "all-linear"] +
        (["--use-dora", "1"] if dora else []) + flags)
    adapter = os.path.join(lora_run, "adapter_00000003")
    merged = os.path.join(w, "gen_merged.bin")
    p = subprocess.run([conv, base, merged, "--adapter", adapter, "--dtype", "fp32"], capture_output=True, text=True)
    tok = subprocess.run([os.path.join(ROOT, "tokenizer"), "find-gpt2"], capture_output=True, text=True, cwd=ROOT)
    if not report(tok.returncode == 0, "generate_gpt2_tokenizer_files", tok.stderr[-300:]):
        return
    g = ["--prompt", "The king said", "--temperature", "0", "-g", "16", "--threads", "1", "--tokenizer",
         os.path.join(ROOT, tok.stdout.strip())]
    a = subprocess.run([gen, "-e", base, "--adapter", adapter] + g, capture_output=True)
    b = subprocess.run([gen, "-e", merged] + g, capture_output=True)
    c = subprocess.run([gen, "-e", base] + g, capture_output=True)
    text = lambda r: r.stdout.split(b"The king said", 1)[-1]  # noqa: E731
    ok = p.returncode == 0 and a.returncode == 0 and b.returncode == 0 and text(a) == text(b) and text(a) != text(c)
    report(ok and (not dora or "merged DoRA adapter" in p.stdout),
           f"generate_{'dora' if dora else 'adapter'}_unmerged_equals_merged",
           f"rc {p.returncode}/{a.returncode}/{b.returncode}; unmerged {text(a)[-120:]!r}, merged {text(b)[-120:]!r}, "
           f"base {text(c)[-80:]!r} {(p.stdout + p.stderr)[-200:]!r} {(a.stderr + b.stderr)[-300:]!r}")
    if dora:
        return
    other = subprocess.run([gen, "-e", "d2", "--adapter", adapter] + g, capture_output=True)
    report(other.returncode == 1 and b"trained on another base model" in other.stderr, "generate_adapter_other_base",
           other.stderr[-300:])


def check_recompute(w, data, name="gpt2", kind="adapter"):
    """GPT-2's -r 0, 1, 2 (what the adapters' backward reads is recomputed first) write the same adapter
    (started from w/NAME_KIND)."""
    g, ga = os.path.join(w, name), os.path.join(w, f"{name}_{kind}")
    tag = name if kind == "adapter" else f"{name}_{kind}"
    files = []
    for r in (0, 1, 2):
        out = os.path.join(w, f"{tag}_recompute_{r}")
        run(train_args(g, ga, data, out, 3, ["-r", str(r)]))
        files.append(open(os.path.join(out, "adapter_00000003", "adapter_model.safetensors"), "rb").read())
    report(files[0] == files[1] == files[2], f"{tag}_recompute_levels_same_adapter", "-r 0, 1, 2 adapters differ")


def check_ranks(w, data, name="gpt2", kind="adapter"):
    """2 ranks (-pi tcp) at -z 0 and -z 1 (the adapter's moments sharded): the same adapter bytes, and the
    losses of one process accumulating the same -d (started from w/NAME_KIND)."""
    g, ga = os.path.join(w, name), os.path.join(w, f"{name}_{kind}")
    tag = ("" if name == "gpt2" else f"{name}_") + ("" if kind == "adapter" else f"{kind}_")
    outs = {}
    for run_name, launch in [("z0", ["scripts/run_dist.sh", "local", "2", "--pi", "tcp"]),
                         ("z1", ["scripts/run_dist.sh", "local", "2", "--pi", "tcp"]), ("one", [CPU])]:
        out = os.path.join(w, f"{tag}ranks_{run_name}")
        args = train_args(g, ga, data, out, 4, ["-d", str(2 * B * T), "--threads", "1"])
        del args[args.index("-a"):args.index("-a") + 2]
        if run_name == "z1":
            args += ["-z", "1"]
        p = subprocess.run(launch + args, capture_output=True, text=True, cwd=ROOT, timeout=300)
        if p.returncode != 0:
            report(False, f"{tag}ranks_{run_name}_runs", (p.stdout + p.stderr)[-1500:])
            return
        outs[run_name] = out
    key = os.path.join("adapter_00000004", "adapter_model.safetensors")
    same = open(os.path.join(outs["z0"], key), "rb").read() == open(os.path.join(outs["z1"], key), "rb").read()
    report(same, f"{tag}ranks_2_z0_equals_z1", "the adapters of -z 0 and -z 1 differ")
    ok, err = close(log_losses(outs["z0"]), log_losses(outs["one"]), 1e-5, 1e-6)
    report(ok and len(log_losses(outs["z0"])) == 4, f"{tag}ranks_2_match_one_process", f"max |diff| {err:.3g}")


def check_rundir(w, data):
    """adapter_NNNNNNNN/ is a run file: -nk prunes it, --overwrite 1 deletes it, a non-directory of that name is refused."""
    g, ga = os.path.join(w, "gpt2"), os.path.join(w, "gpt2_adapter")
    d = os.path.join(w, "rundir")
    run(train_args(g, ga, data, d, 4, ["-n", "1", "-nk", "1"]))
    left = sorted(f for f in os.listdir(d) if f.startswith("adapter_"))
    done = sorted("adapter_" + f[5:] for f in os.listdir(d) if f.startswith("DONE_"))
    # (the newest healthy checkpoint, step 3, is kept too: rundir.h's pruning rule)
    report(left == done and "adapter_00000001" not in left and "adapter_00000002" not in left,
           "rundir_prune_adapters", f"after -x 4 -n 1 -nk 1: adapters {left}, DONE markers {done}")
    open(os.path.join(d, "notes.txt"), "w").write("mine")
    run(train_args(g, ga, data, d, 2, ["--overwrite", "1"]))
    left = sorted(os.listdir(d))
    report("adapter_00000004" not in left and "adapter_00000002" in left and "notes.txt" in left,
           "rundir_overwrite_adapters", f"after --overwrite 1 -x 2: {left}")
    d2 = os.path.join(w, "rundir_wrong")
    os.makedirs(d2)
    open(os.path.join(d2, "adapter_00000003"), "w").write("not a directory")
    p = run(train_args(g, ga, data, d2, 1, ["--overwrite", "1"]), expect_ok=False)
    report(p.returncode == 1 and "has the name of a run file" in p.stdout + p.stderr and
           open(os.path.join(d2, "adapter_00000003")).read() == "not a directory", "rundir_adapter_name_on_a_file",
           (p.stdout + p.stderr)[-400:])


def expect(name, args, pattern, prog=CPU):
    """PROG ARGS is a clean error (exit 1, 'error: ') saying pattern; reported as error_NAME."""
    p = subprocess.run([prog] + args, capture_output=True, text=True)
    text = p.stdout + p.stderr
    ok = p.returncode == 1 and "error: " in text and pattern in text
    report(ok, f"error_{name}", f"rc {p.returncode}, wanted '{pattern}': {text.strip()[-400:]}")
    return p


def cuda_trainer():
    """The CUDA trainer built here (the cudasim harness's, or ./train_gpt), or None with a note."""
    cuda = next((p for p in [os.path.join(ROOT, "build", "cudasim", "train_gpt"), os.path.join(ROOT, "train_gpt")]
                 if os.access(p, os.X_OK)), None)
    if not cuda:
        print("note: no ./train_gpt or build/cudasim/train_gpt built: the CUDA refusal is not checked")
    return cuda


def check_errors(w, data):
    g, ga, la = os.path.join(w, "gpt2"), os.path.join(w, "gpt2_adapter"), os.path.join(w, "llama_adapter")
    base = ["-i", data, "-j", data, "-b", str(B), "-t", str(T), "-x", "1", "-v", "0", "-s", "0"]

    expect("rank_above_min_in_out", ["-e", g, "--lora-rank", "65"] + base, "exceeds min(in, out)")
    expect("unknown_target", ["-e", g, "--lora-rank", "4", "--lora-targets", "c_attn,foo"] + base, "'foo' matches no module")
    expect("unmatched_target", ["-e", g, "--lora-rank", "4", "--lora-targets", "q_proj"] + base, "'q_proj' matches no module")
    expect("targets_without_rank", ["-e", g, "--lora-targets", "c_attn"] + base, "need --lora-rank")
    r0 = os.path.join(w, "rank0_adapter")
    shutil.copytree(ga, r0)
    cfg = json.load(open(os.path.join(r0, "adapter_config.json")))
    cfg["r"] = 0
    json.dump(cfg, open(os.path.join(r0, "adapter_config.json"), "w"))
    expect("adapter_rank_0", ["-e", g, "--adapter", r0] + base, "r is not a rank")
    expect("adapter_of_other_model", ["-e", g, "--adapter", la] + base, "adapter_config.json: --lora-targets: ")
    expect("adapter_of_other_shapes", ["-e", os.path.join(w, "gpt2_wide"), "--adapter", ga] + base,
           "belongs to another base model")
    trained = os.path.join(w, "gpt2_run", f"adapter_{STEPS:08d}")
    expect("adapter_of_other_base_crc", ["-e", os.path.join(w, "gpt2_other"), "--adapter", trained] + base,
           "trained on another base model")
    expect("zero_stage_2", ["-e", g, "--lora-rank", "4", "-z", "2"] + base, "-z 2 with LoRA")
    lora_dir, full_dir = os.path.join(w, "gpt2_run"), os.path.join(w, "full_run")
    expect("resume_lora_run_without_lora", ["-e", g, "-o", lora_dir, "-y", "1", "--allow-config-change", "1"] + base,
           "trained LoRA adapters")
    subprocess.run([CPU, "-e", g, "-o", full_dir] + base, capture_output=True)
    expect("resume_full_run_with_lora", ["-e", g, "-o", full_dir, "-y", "1", "--lora-rank", "4"] + base,
           "has no adapter directory")
    cuda = cuda_trainer()
    if cuda:
        expect("cuda_not_built_yet", ["-e", g, "--lora-rank", "4"] + base, "not built yet on CUDA", prog=cuda)


def guarded(name, *steps):
    """Runs steps (no-argument calls) in order; a crash is the failed check NAME_runs, the others still run."""
    try:
        for step in steps:
            step()
    except Exception as e:  # noqa: BLE001
        import traceback
        report(False, f"{name}_runs", (str(e) + traceback.format_exc())[-2500:])


def run_checks(prefix, make_models, checks):
    """A test's main: the trainer built and the reference libraries there, the python make_models run on a
    temporary directory w (removed after, kept with LLMC_KEEP=1) with V, a seeded shard data in it, then
    checks(w, data). Returns the exit status."""
    if not os.access(CPU, os.X_OK):
        report(False, "built", f"{CPU} is not built (make train_gpt_cpu)")
        return 1
    if not ensure_pyref():
        return 1
    w = tempfile.mkdtemp(prefix=prefix)
    try:
        py(make_models, w, str(V))
        data = os.path.join(w, "data.bin")
        rng = random.Random(7)
        testlib.write_shard(data, [rng.randrange(V) for _ in range(4096)])
        checks(w, data)
    finally:
        shutil.rmtree(w, ignore_errors=True) if not os.environ.get("LLMC_KEEP") else print("kept", w)
    return 1 if testlib.failures() else 0


def checks(w, data):
    for name in ("gpt2", "llama"):
        guarded(name, lambda: check_family(name, w, data))
    for name in ("gpt2", "llama"):
        check_merge(name, w, data)
    check_generate(w)
    check_recompute(w, data)
    check_ranks(w, data)
    check_rundir(w, data)
    check_errors(w, data)


if __name__ == "__main__":
    sys.exit(run_checks("llmc_lora.", MAKE_MODELS, checks))
