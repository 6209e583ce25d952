"""Hostile categories "Mixtral inputs" (issue 24): random malformations of a tiny HF MixtralForCausalLM
directory (V 256, C 32, L 1, NH 2, NKV 1, F 64, 4 experts, top-2, maxT 64; numpy + safetensors) and of
its llmc Mixtral checkpoint (./hf_convert of it) given to the trainer as -e: config.json's expert
fields (num_local_experts, num_experts_per_tok, router_aux_loss_coef, output_router_logits,
sliding_window) of odd values and types, expert and router tensors dropped, mis-shaped or added, the
checkpoint header's slots 24-27 (E, top-k, output_router_logits, coefficient) set at random. Each
case must be a clean error before the first step or a correct run: never a crash or a hang, never a
failure after steps ran, never a temporary file left, and the -e input never changed (lost)."""
import hashlib
import json
import os
import shutil
import struct

import numpy as np
from safetensors.numpy import load_file, save_file

import hf_tiny
from hardening_util import run
from hostile_common import base_args, run_judged

TIMEOUT = 30
V, C, L, NH, NKV, F, MAXT = hf_tiny.V, hf_tiny.C, hf_tiny.L, hf_tiny.NH, hf_tiny.NKV, hf_tiny.F, hf_tiny.MAXT
E, K = 4, 2


def mixtral_config():
    return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": V, "hidden_size": C,
            "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV,
            "max_position_embeddings": MAXT, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "sliding_window": None,
            "tie_word_embeddings": False, "hidden_act": "silu", "num_local_experts": E, "num_experts_per_tok": K,
            "router_aux_loss_coef": 0.02, "output_router_logits": True, "torch_dtype": "float32"}


def experts(p, g):
    """a layer's router and experts (w1 gate, w3 up, w2 down), named as transformers' Mixtral"""
    t = {p + "block_sparse_moe.gate.weight": g(E, C)}
    for e in range(E):
        q = p + f"block_sparse_moe.experts.{e}."
        t[q + "w1.weight"], t[q + "w3.weight"], t[q + "w2.weight"] = g(F, C), g(F, C), g(C, F)
    return t


def mixtral_tensors(seed=3):
    return hf_tiny.decoder_tensors(seed, experts)


def setup(ctx):
    d = ctx.path("hf_base_mixtral")
    os.makedirs(d)
    json.dump(mixtral_config(), open(os.path.join(d, "config.json"), "w"))
    save_file(mixtral_tensors(), os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    ctx.hf_mixtral = d
    ctx.mixtral_bin = ctx.path("mixtral_base.bin")
    rc, out, err = run("./hf_convert", [d, ctx.mixtral_bin], timeout=TIMEOUT)
    if rc != 0:
        raise RuntimeError(f"hostile.d/35-moe.py setup: ./hf_convert of the tiny Mixtral failed: {err[-300:]}")


def digest(path):
    if os.path.isdir(path):
        return {n: hashlib.sha1(open(os.path.join(path, n), "rb").read()).hexdigest() for n in sorted(os.listdir(path))}
    return hashlib.sha1(open(path, "rb").read()).hexdigest()


def judge(ctx, init, what, must_fail):
    out_dir = ctx.fresh("moe_run")
    before = digest(init)
    args = base_args(ctx) + ["-e", init, "-x", "2", "-n", "2", "-o", out_dir, "--threads", "1"]
    settled = run_judged(args, out_dir, what, must_fail, lambda: digest(init) == before, "input")
    if settled:
        return settled
    if not os.path.exists(os.path.join(out_dir, "model_00000002.bin")):
        return "silent", f"{what}: exit 0 without its checkpoint"
    return "ok", what


FIELDS = ["num_local_experts", "num_experts_per_tok", "router_aux_loss_coef", "output_router_logits", "sliding_window"]
VALUES = [0, -1, 1, 2, 3, 4, 5, 257, 1e9, 1.5, -0.5, 1e39, "2", True, False, None, [4], {}]
COEFS = [0, -1, -0.5, 0.001, 1.5, 1e39, float("nan"), "0.02", True, None, [0.02], {}]


def case_config(ctx, r, tag):
    d = ctx.fresh("hf_mixtral")
    shutil.copytree(ctx.hf_mixtral, d)
    cfg = mixtral_config()
    field = r.choice(FIELDS)
    # (a huge finite aux coefficient is a valid model whose run diverges: the divergence category's)
    value = r.choice(COEFS if field == "router_aux_loss_coef" else VALUES)
    if r.random() < 0.15:
        cfg.pop(field)
        what = f"config.json without {field}"
    else:
        cfg[field] = value
        what = f"config.json {field} = {value!r}"
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    return judge(ctx, d, what, must_fail=False)  # some values are valid (top-1, aux off, ...): either is fine


def case_tensors(ctx, r, tag):
    d = ctx.fresh("hf_mixtral")
    shutil.copytree(ctx.hf_mixtral, d)
    path = os.path.join(d, "model.safetensors")
    t = load_file(path)
    keys = [k for k in t if "block_sparse_moe" in k]
    key = r.choice(keys)
    kind = r.choice(["drop", "rows", "cols", "extra", "scalar"])
    if kind == "drop":
        del t[key]
    elif kind == "rows":
        t[key] = t[key][:-1] if r.random() < 0.5 else np.concatenate([t[key], t[key][:1]])
    elif kind == "cols":
        t[key] = np.ascontiguousarray(t[key][:, :-1])
    elif kind == "extra":
        t[key.replace("experts.0.", f"experts.{E}.") if "experts.0." in key else f"model.layers.0.block_sparse_moe.experts.{E}.w1.weight"] = t[key]
    else:
        t[key] = np.array(1.0, dtype=np.float32)  # a 0-d tensor
    save_file(t, path, metadata={"format": "pt"})
    return judge(ctx, d, f"{kind} {key}", must_fail=True)


def case_header(ctx, r, tag):
    f = ctx.fresh("mixtral") + ".bin"
    raw = bytearray(open(ctx.mixtral_bin, "rb").read())
    slot = r.choice([24, 25, 26, 27])
    if slot == 27:  # (a huge finite coefficient is a valid model whose run diverges: the divergence category's)
        value = struct.pack("<f", r.choice([-1.0, -0.0, float("nan"), float("inf"), float("-inf"), 0.0, 0.5, 2.0]))
    else:
        value = struct.pack("<i", r.choice([0, -1, 1, 2, 3, 4, 5, 256, 257, 1 << 30, -(1 << 31)]))
    raw[4 * slot:4 * slot + 4] = value
    open(f, "wb").write(bytes(raw))
    return judge(ctx, f, f"checkpoint slot {slot} = {value.hex()}", must_fail=False)


CATEGORIES = [
    ("Mixtral config.json", case_config),
    ("Mixtral tensors", case_tensors),
    ("Mixtral checkpoint header", case_header),
]
