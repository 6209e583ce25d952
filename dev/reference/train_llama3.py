#!/usr/bin/env python3
"""train_llama3.py - the PyTorch Llama 3 that llmc's CPU Llama model is checked against.

The tensors follow llmc/models/llama.h's table (one nn.Parameter each, stacked over layers, no biases):

    name       shape          weight decay   random init
    wte        (Vp, C)        yes            N(0, 0.02); rows >= V zero
    ln1w       (L, C)         no             1                 RMSNorm gain before attention
    qkvw       (L, QKV, C)    yes            N(0, 0.02)        rows [q: NH*HS | k: NKV*HS | v: NKV*HS]
    attprojw   (L, C, C)      yes            N(0, 0.02/sqrt(2L))
    ln2w       (L, C)         no             1                 RMSNorm gain before the MLP
    fcw        (L, 2F, C)     yes            N(0, 0.02)        rows [gate: F | up: F]
    fcprojw    (L, C, F)      yes            N(0, 0.02/sqrt(2L))
    lnfw       (C)            no             1
    lm_head    (Vp, C)        yes            N(0, 0.02); rows >= V zero (untied head)

Forward for idx (B, T): x = wte[idx]; per layer
    h = rmsnorm(x) ln1w; q, k, v = h qkvw^T; q, k = rope(q), rope(k)
    x += attention(q, k, v) attprojw^T   (grouped-query: query head h uses k/v head h // (NH/NKV))
    h = rmsnorm(x) ln2w; g, u = h fcw^T; x += (silu(g) * u) fcprojw^T
logits = rmsnorm(x) lnfw lm_head^T; loss as GPT-2's. rmsnorm(x) = x / sqrt(mean(x^2) + eps).
RoPE: Meta's convention, channel pairs (2i, 2i+1) of each head rotate by t * f_i,
f_i = theta^(-2i/HS), with Llama 3.1's frequency scaling when --rope-factor > 0.

Files: the model as llmc's Llama checkpoint (llmc/models/llama.h: magic 20261130, our header; then the
tensors in table order as float32), and the debug state in train_gpt2.py's layout (version 3)
with header [11] NKV and [12] F added and the tensors in this table's order. The optimizer is
train_gpt2.py's AdamW.
"""

import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_gpt2 as ref  # noqa: E402

LLAMA_MAGIC = 20261130
LLAMA_VERSION = 1
ARCH_LLAMA3 = 1


class LlamaConfig:
    def __init__(self, maxT, V, L, NH, NKV, C, F, eps=1e-5, theta=500000.0, factor=0.0,
                 low=1.0, high=4.0, original=8192):
        self.max_seq_len, self.vocab_size, self.padded_vocab = maxT, V, ref.padded_vocab_size(V)
        self.n_layer, self.n_head, self.n_kv_head, self.channels, self.ffn = L, NH, NKV, C, F
        self.eps, self.theta, self.factor, self.low, self.high, self.original = (
            eps, theta, factor, low, high, original)
        if NH % NKV or C % NH or (C // NH) % 2:
            raise ValueError("config: NH % NKV == 0 and an even head size C/NH are required")


def param_table(cfg):
    L, C, Vp, F = cfg.n_layer, cfg.channels, cfg.padded_vocab, cfg.ffn
    QKV = (cfg.n_head + 2 * cfg.n_kv_head) * (C // cfg.n_head)
    return [
        ("wte", (Vp, C), True, "normal"),
        ("ln1w", (L, C), False, "ones"),
        ("qkvw", (L, QKV, C), True, "normal"),
        ("attprojw", (L, C, C), True, "normal_proj"),
        ("ln2w", (L, C), False, "ones"),
        ("fcw", (L, 2 * F, C), True, "normal"),
        ("fcprojw", (L, C, F), True, "normal_proj"),
        ("lnfw", (C,), False, "ones"),
        ("lm_head", (Vp, C), True, "normal"),
    ]


def rope_inv_freq(cfg):
    """f_i in float64, with Llama 3.1's scaling (wavelengths above original/low divided by
    factor, below original/high kept, blended in between)."""
    HS = cfg.channels // cfg.n_head
    out = []
    for i in range(HS // 2):
        f = cfg.theta ** (-2.0 * i / HS)
        if cfg.factor > 0:
            wavelen = 2 * math.pi / f
            if wavelen > cfg.original / cfg.low:
                f = f / cfg.factor
            elif wavelen >= cfg.original / cfg.high:
                smooth = (cfg.original / wavelen - cfg.low) / (cfg.high - cfg.low)
                f = (1 - smooth) * f / cfg.factor + smooth * f
        out.append(f)
    return torch.tensor(out, dtype=torch.float64)


def rmsnorm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w


def rope(x, cos, sin):
    """x (B, H, T, HS): pairs (2i, 2i+1) rotate by the angle whose cos/sin are (T, HS/2)."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


class TableModel(nn.Module):
    """One nn.Parameter per row (name, shape, decay, init) of table(cfg), in the table's order;
    tensors[name] must have the row's shape. The reference models with a table derive from it."""

    def __init__(self, cfg, tensors, table):
        super().__init__()
        self.cfg, self.table = cfg, table
        for name, shape, _, _ in table(cfg):
            if tuple(tensors[name].shape) != shape:
                raise ValueError(f"tensor {name}: shape {tuple(tensors[name].shape)}, expected {shape}")
            self.register_parameter(name, nn.Parameter(tensors[name]))

    def param_table(self):
        return self.table(self.cfg)

    def params(self):
        return [getattr(self, name) for name, _, _, _ in self.table(self.cfg)]


class Llama(TableModel):
    def __init__(self, cfg, tensors):
        super().__init__(cfg, tensors, param_table)

    def forward(self, idx, targets=None):
        cfg = self.cfg
        B, T = idx.shape
        C, NH, NKV, F, V = cfg.channels, cfg.n_head, cfg.n_kv_head, cfg.ffn, cfg.vocab_size
        HS = C // NH
        angles = torch.arange(T, dtype=torch.float64)[:, None] * rope_inv_freq(cfg)[None, :]
        cos, sin = angles.cos().to(self.wte.dtype), angles.sin().to(self.wte.dtype)
        ln1w, qkvw, attprojw, ln2w, fcw, fcprojw = (getattr(self, n).unbind(0) for n in
                                                     ("ln1w", "qkvw", "attprojw", "ln2w", "fcw", "fcprojw"))
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        x = self.wte[idx]
        for l in range(cfg.n_layer):
            h = rmsnorm(x, ln1w[l], cfg.eps)
            q, k, v = (h @ qkvw[l].t()).split([NH * HS, NKV * HS, NKV * HS], dim=-1)
            q = rope(q.view(B, T, NH, HS).transpose(1, 2), cos, sin)       # (B, NH, T, HS)
            k = rope(k.view(B, T, NKV, HS).transpose(1, 2), cos, sin)      # (B, NKV, T, HS)
            v = v.view(B, T, NKV, HS).transpose(1, 2)
            # grouped-query attention: (B, NKV, group, T, HS) against (B, NKV, 1, T, HS)
            qg = q.view(B, NKV, NH // NKV, T, HS)
            att = (qg @ k.unsqueeze(2).transpose(-2, -1)) * (1.0 / math.sqrt(HS))
            att = att.masked_fill(future, float("-inf")).softmax(dim=-1)
            y = (att @ v.unsqueeze(2)).view(B, NH, T, HS).transpose(1, 2).reshape(B, T, C)
            x = x + y @ attprojw[l].t()
            h = rmsnorm(x, ln2w[l], cfg.eps)
            g, u = (h @ fcw[l].t()).split([F, F], dim=-1)
            x = x + (torch.nn.functional.silu(g) * u) @ fcprojw[l].t()
        logits = rmsnorm(x, self.lnfw, cfg.eps) @ self.lm_head.t()
        return logits, None if targets is None else ref.cross_entropy(logits, targets, V)


def init_table_tensors(table, cfg, seed, vocab_rows):
    """table(cfg)'s tensors drawn in order from one generator seeded with seed: "normal" N(0, 0.02),
    "normal_proj" N(0, 0.02/sqrt(2L)), "ones" 1; the rows >= V of each tensor named in vocab_rows zero."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape, _, init in table(cfg):
        if init.startswith("normal"):
            std = ref.INIT_STD if init == "normal" else ref.INIT_STD / math.sqrt(2 * cfg.n_layer)
            out[name] = torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=gen)
        else:
            out[name] = torch.ones(shape, dtype=torch.float32)
    for name in vocab_rows:
        out[name][cfg.vocab_size:].zero_()
    return out


def init_tensors(cfg, seed):
    return init_table_tensors(param_table, cfg, seed, ("wte", "lm_head"))


def header(cfg):
    import struct
    f = lambda v: struct.pack("<f", v)  # noqa: E731
    return ref.header_bytes({0: LLAMA_MAGIC, 1: LLAMA_VERSION, 2: ARCH_LLAMA3, 3: cfg.max_seq_len,
                             4: cfg.vocab_size, 5: cfg.padded_vocab, 6: cfg.n_layer, 7: cfg.n_head,
                             8: cfg.n_kv_head, 9: cfg.channels, 10: cfg.ffn, 11: 0,
                             16: f(cfg.eps), 17: f(cfg.theta), 18: f(cfg.factor), 19: f(cfg.low),
                             20: f(cfg.high), 21: cfg.original})


def save_table_model(path, header_bytes, names, tensors):
    """Writes header_bytes, then tensors[name] as float32 for each of names in order (atomically)."""
    def write(fh):
        fh.write(header_bytes)
        for name in names:
            fh.write(ref.tensor_f32(tensors[name]).tobytes())
    ref.atomic_write(path, write)


def save_model(path, cfg, tensors):
    save_table_model(path, header(cfg), [name for name, _, _, _ in param_table(cfg)], tensors)


def write_debug_state(path, cfg, x, y, hp, nsteps, out):
    import struct
    B, T = x.shape
    fields = {0: ref.DEBUG_MAGIC, 1: ref.DEBUG_VERSION, 2: B, 3: T, 4: cfg.vocab_size,
              5: cfg.padded_vocab, 6: nsteps, 7: cfg.n_layer, 8: cfg.n_head, 9: cfg.channels,
              10: cfg.max_seq_len, 11: cfg.n_kv_head, 12: cfg.ffn}
    for i, value in enumerate([hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, hp.grad_clip]):
        fields[ref.DEBUG_HP_SLOT + i] = struct.pack("<f", value)

    ref.atomic_write(path, lambda fh: ref.write_debug_state_body(fh, ref.header_bytes(fields), x, y, out))


def batch_and_hp(a, cfg):
    """The one batch and the AdamW settings the table references train on (--batch-size, --seq-len,
    --seed, --lr; the project's betas 0.9/0.95, eps 1e-8, weight decay 0.1, clip 1), as float32."""
    x, y = ref.random_batch(a.batch_size, a.seq_len, cfg.vocab_size, a.seed)
    return x, y, ref.HyperParams(*(ref.f32(v) for v in (a.lr, 0.9, 0.95, 1e-8, 0.1, 1.0)))


def clone_tensors(tensors):
    return {k: t.clone() for k, t in tensors.items()}


def write_reference_run(path, model, cfg, x, y, hp, nsteps):
    """Trains model nsteps on (x, y) (ref.run_reference) and writes the debug state at path, saying so."""
    out = ref.run_reference(model, x, y, hp, nsteps)
    write_debug_state(path, cfg, x, y, hp, nsteps, out)
    print(f"wrote {path}: loss {out['loss']:.6f}; losses " + " ".join(f"{v:.6f}" for v in out["losses"]))


def main(argv=None):
    p = argparse.ArgumentParser(description="PyTorch reference Llama 3 (llmc/models/llama.h layout)")
    for flag, default in (("--depth", 2), ("--channels", 64), ("--heads", 4), ("--kv-heads", 2),
                          ("--ffn", 0), ("--max-seq-len", 64), ("--vocab", 1000), ("--seed", 42),
                          ("--batch-size", 4), ("--seq-len", 32), ("--steps", 10),
                          ("--rope-original", 16)):
        p.add_argument(flag, type=int, default=default)
    for flag, default in (("--theta", 10000.0), ("--rope-factor", 8.0), ("--rope-low", 1.0),
                          ("--rope-high", 4.0), ("--norm-eps", 1e-5), ("--lr", 1e-3)):
        p.add_argument(flag, type=float, default=default)
    p.add_argument("--save-model", required=True)
    p.add_argument("--debug-state", help="the debug state (logits, loss, gradients, --steps trajectory)")
    p.add_argument("--bench-steps", type=int, default=0,
                   help="time this many fp32 training steps on the CPU (after 2 warm-up steps); 0 = no bench")
    a = p.parse_args(argv)
    if not a.debug_state and not a.bench_steps:
        p.error("nothing to do: give --debug-state and/or --bench-steps")
    torch.set_num_threads(os.cpu_count())
    torch.use_deterministic_algorithms(True)
    F = a.ffn or 4 * a.channels  # small test models: a plain width; the real ones use llama_ffn_hidden
    cfg = LlamaConfig(a.max_seq_len, a.vocab, a.depth, a.heads, a.kv_heads, a.channels, F,
                      eps=ref.f32(a.norm_eps), theta=ref.f32(a.theta), factor=ref.f32(a.rope_factor),
                      low=ref.f32(a.rope_low), high=ref.f32(a.rope_high), original=a.rope_original)
    tensors = init_tensors(cfg, a.seed)
    save_model(a.save_model, cfg, tensors)
    x, y, hp = batch_and_hp(a, cfg)
    if a.debug_state:
        write_reference_run(a.debug_state, Llama(cfg, clone_tensors(tensors)), cfg, x, y, hp, a.steps)
    if a.bench_steps:  # as train_gpt2.py --bench-steps: the same AdamW steps, timed
        model = Llama(cfg, clone_tensors(tensors))
        ms, loss = ref.bench(model, x, y, hp, a.bench_steps, "float32", False)
        B, T = x.shape
        print(f"BENCH pytorch ms_per_step={ms:.2f} tokens_per_s={B * T / (ms / 1000.0):.0f} "
              f"torch={torch.__version__} threads={torch.get_num_threads()} B={B} T={T} L={cfg.n_layer} "
              f"C={cfg.channels} NKV={cfg.n_kv_head} F={cfg.ffn} V={cfg.vocab_size} steps={a.bench_steps} "
              f"last_loss={loss:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
