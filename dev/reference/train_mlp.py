#!/usr/bin/env python3
"""train_mlp.py - the PyTorch MLP-only language model that llmc's test architecture "mlp" is checked against.

The tensors follow llmc/models/mlp.h's table (one nn.Parameter each, stacked over layers, no biases):

    name       shape          weight decay   random init
    wte        (Vp, C)        yes            N(0, 0.02); rows >= V zero   (also the output head)
    lnw        (L, C)         no             1                 RMSNorm gain of each block
    fcw        (L, 2F, C)     yes            N(0, 0.02)        rows [gate: F | up: F]
    fcprojw    (L, C, F)      yes            N(0, 0.02/sqrt(2L))
    lnfw       (C)            no             1

Forward for idx (B, T): x = wte[idx] (no positions, no attention); per layer
    h = rmsnorm(x) lnw; g, u = h fcw^T; x += (silu(g) * u) fcprojw^T
logits = rmsnorm(x) lnfw wte^T; loss as GPT-2's. rmsnorm(x) = x / sqrt(mean(x^2) + eps).

Files: the model as llmc's MLP checkpoint (llmc/formats/mlpfile.h: magic 20261130, architecture 2;
then the tensors in table order as float32), and the debug state in train_gpt2.py's layout (version 3)
with header [11] NKV (1) and [12] F (train_llama3.py's writer), the tensors in this table's order. The optimizer is train_gpt2.py's
AdamW (the project's settings: betas 0.9/0.95, eps 1e-8, weight decay 0.1 on the decayed tensors, clip 1).
"""

import argparse
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_gpt2 as ref  # noqa: E402
import train_llama3  # noqa: E402  (its table model, init, rmsnorm and debug state: train_gpt2.py's layout with NKV and F)

MLP_MAGIC = 20261130
MLP_VERSION = 1
ARCH_MLP = 2


class MlpConfig:
    def __init__(self, maxT, V, L, C, F, eps=1e-5):
        self.max_seq_len, self.vocab_size, self.padded_vocab = maxT, V, ref.padded_vocab_size(V)
        self.n_layer, self.n_head, self.n_kv_head, self.channels, self.ffn, self.eps = L, 1, 1, C, F, eps


def param_table(cfg):
    L, C, Vp, F = cfg.n_layer, cfg.channels, cfg.padded_vocab, cfg.ffn
    return [
        ("wte", (Vp, C), True, "normal"),
        ("lnw", (L, C), False, "ones"),
        ("fcw", (L, 2 * F, C), True, "normal"),
        ("fcprojw", (L, C, F), True, "normal_proj"),
        ("lnfw", (C,), False, "ones"),
    ]


class Mlp(train_llama3.TableModel):
    def __init__(self, cfg, tensors):
        super().__init__(cfg, tensors, param_table)

    def forward(self, idx, targets=None):
        cfg = self.cfg
        F = cfg.ffn
        x = self.wte[idx]
        for l in range(cfg.n_layer):
            h = train_llama3.rmsnorm(x, self.lnw[l], cfg.eps)
            g, u = (h @ self.fcw[l].t()).split([F, F], dim=-1)
            x = x + (torch.nn.functional.silu(g) * u) @ self.fcprojw[l].t()
        logits = train_llama3.rmsnorm(x, self.lnfw, cfg.eps) @ self.wte.t()
        return logits, None if targets is None else ref.cross_entropy(logits, targets, cfg.vocab_size)


def init_tensors(cfg, seed):
    return train_llama3.init_table_tensors(param_table, cfg, seed, ("wte",))


def header(cfg):
    return ref.header_bytes({0: MLP_MAGIC, 1: MLP_VERSION, 2: ARCH_MLP, 3: cfg.max_seq_len,
                             4: cfg.vocab_size, 5: cfg.padded_vocab, 6: cfg.n_layer, 7: 1, 8: 1,
                             9: cfg.channels, 10: cfg.ffn, 11: 1, 16: struct.pack("<f", cfg.eps)})


def save_model(path, cfg, tensors):
    train_llama3.save_table_model(path, header(cfg), [name for name, _, _, _ in param_table(cfg)], tensors)


def main(argv=None):
    p = argparse.ArgumentParser(description="PyTorch reference MLP-only model (llmc/models/mlp.h layout)")
    for flag, default in (("--depth", 2), ("--channels", 64), ("--ffn", 0), ("--max-seq-len", 64),
                          ("--vocab", 1000), ("--seed", 42), ("--batch-size", 4), ("--seq-len", 32),
                          ("--steps", 10)):
        p.add_argument(flag, type=int, default=default)
    for flag, default in (("--norm-eps", 1e-5), ("--lr", 1e-3)):
        p.add_argument(flag, type=float, default=default)
    p.add_argument("--save-model", required=True)
    p.add_argument("--debug-state", required=True, help="logits, loss, gradients, the --steps trajectory")
    a = p.parse_args(argv)
    torch.set_num_threads(os.cpu_count())
    torch.use_deterministic_algorithms(True)
    F = a.ffn or 4 * a.channels  # mlp:dN's rule
    cfg = MlpConfig(a.max_seq_len, a.vocab, a.depth, a.channels, F, eps=ref.f32(a.norm_eps))
    tensors = init_tensors(cfg, a.seed)
    save_model(a.save_model, cfg, tensors)
    x, y, hp = train_llama3.batch_and_hp(a, cfg)
    train_llama3.write_reference_run(a.debug_state, Mlp(cfg, train_llama3.clone_tensors(tensors)), cfg, x, y, hp, a.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
