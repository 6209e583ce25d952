#!/usr/bin/env python3
"""adafactor.py - the PyTorch reference for llmc's --optimizer adafactor (llmc/train/adafactor.h).

Adafactor (Shazeer & Stern 2018) with the semantics of Hugging Face transformers'
transformers.optimization.Adafactor, written out again here (no transformers needed):

    per unit (a 2-D weight matrix, or a vector), step t = 1, 2, ...:
        lr_t = lr                                   relative_step off (the trainer's schedule)
             = min(1e-2, 1/sqrt(t)) * max(eps2, RMS(p))   relative_step and scale_parameter on
        b2t  = 1 - t^decay_rate
        G    = g^2 + eps1
        factored (dim >= 2):  row = b2t row + (1 - b2t) mean(G, -1);  col = b2t col + (1 - b2t) mean(G, -2)
                              u = g * rsqrt(row / mean(row)) [:, None] * rsqrt(col) [None, :]
        else:                 v = b2t v + (1 - b2t) G;  u = g * rsqrt(v)
        u = u / max(1, RMS(u) / clip_threshold) * lr_t
        beta1:                m = beta1 m + (1 - beta1) u;  u = m
        p = p + p * (-weight_decay * lr_t);  p = p - u
    RMS(x) = ||x||_2 / sqrt(numel); eps = (1e-30, 1e-3), clip_threshold 1, decay_rate -0.8.

The units are those of llmc's parameter table: a stacked (L, out, in) tensor is L matrices and a
stacked (L, C) tensor L vectors (as PyTorch would hold them as separate modules' parameters).
Before the update, as the trainer does: the global gradient norm (per-tensor norms, squares
summed in double), and with grad_clip > 0 and norm > grad_clip every gradient times
grad_clip / norm. Weight decay only for the table's "yes" tensors.

CLI: a random tiny GPT-2 (train_gpt2.py) or Llama 3 (train_llama3.py), its checkpoint, a data
shard holding exactly the batch (B*T+1 tokens) and the reference run on it (every step on the same
batch), as an .npz with losses, grad_norms and the final flat parameters:

    /usr/bin/python3 dev/reference/adafactor.py --arch gpt2 --save-model /tmp/m.bin \\
        --save-shard /tmp/s.bin --out /tmp/ref.npz --steps 10 --lr 1e-2 --weight-decay 0.1
"""
import argparse
import math
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_gpt2 as ref  # noqa: E402


def rms(x):
    return x.norm(2) / (x.numel() ** 0.5)


class Adafactor:
    """The update in the docstring over units: step(pairs) with pairs a list of (p, g, decay) in
    the same order every step (p a view into the parameter, updated in place)."""

    def __init__(self, lr, beta1=None, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8,
                 weight_decay=0.0, relative_step=False, scale_parameter=False, warmup_init=False):
        self.lr, self.beta1, self.eps, self.clip = lr, beta1, eps, clip_threshold
        self.decay_rate, self.weight_decay = decay_rate, weight_decay
        self.relative_step, self.scale_parameter, self.warmup_init = relative_step, scale_parameter, warmup_init
        self.state = []

    def step_size(self, p, step):
        lr = self.lr
        if self.relative_step:
            min_step = 1e-6 * step if self.warmup_init else 1e-2
            lr = min(min_step, 1.0 / math.sqrt(step))
        if self.scale_parameter:
            lr = lr * max(self.eps[1], float(rms(p)))
        return lr

    @torch.no_grad()
    def step(self, pairs):
        if not self.state:
            for p, g, _ in pairs:
                s = {"step": 0}
                if g.dim() >= 2:
                    s["row"] = torch.zeros(g.shape[:-1], dtype=g.dtype)
                    s["col"] = torch.zeros(g.shape[:-2] + g.shape[-1:], dtype=g.dtype)
                else:
                    s["v"] = torch.zeros_like(g)
                if self.beta1 is not None:
                    s["m"] = torch.zeros_like(g)
                self.state.append(s)
        for (p, g, decay), s in zip(pairs, self.state):
            s["step"] += 1
            t = s["step"]
            lr = self.step_size(p, t)
            b2t = 1.0 - math.pow(t, self.decay_rate)
            G = g * g + self.eps[0]
            if "row" in s:
                row, col = s["row"], s["col"]
                row.mul_(b2t).add_(G.mean(dim=-1), alpha=1.0 - b2t)
                col.mul_(b2t).add_(G.mean(dim=-2), alpha=1.0 - b2t)
                r = (row / row.mean(dim=-1, keepdim=True)).rsqrt().unsqueeze(-1)
                c = col.unsqueeze(-2).rsqrt()
                u = (r * c) * g
            else:
                s["v"].mul_(b2t).add_(G, alpha=1.0 - b2t)
                u = s["v"].rsqrt() * g
            u = u / (rms(u) / self.clip).clamp(min=1.0)
            u = u * lr
            if self.beta1 is not None:
                s["m"].mul_(self.beta1).add_(u, alpha=1.0 - self.beta1)
                u = s["m"]
            wd = self.weight_decay if decay else 0.0
            if wd != 0.0:
                p.add_(p, alpha=-wd * lr)
            p.add_(-u)


def units(model):
    """(parameter, layer index or None, decay) per unit, in table order (see the docstring)."""
    table = model.param_table() if hasattr(model, "param_table") else ref.param_table(model.cfg)
    out = []
    for p, (name, shape, decay, _) in zip(model.params(), table):
        stacked = len(shape) >= 2 and name not in ("wte", "wpe", "lm_head")
        if p.numel() == 0:
            continue
        if stacked:
            out += [(p, l, decay) for l in range(shape[0])]
        else:
            out.append((p, None, decay))
    return out


def unit_pairs(us):
    return [(p.data if l is None else p.data[l], p.grad if l is None else p.grad[l], decay) for p, l, decay in us]


def grad_norm(model):
    norms = torch.stack([torch.linalg.vector_norm(p.grad) for p in model.params()])
    return math.sqrt(float((norms.double() ** 2).sum()))


def run(model, x, y, opt, nsteps, grad_clip):
    """nsteps training steps on the batch: (losses, grad norms) per step, the model updated."""
    us = units(model)
    losses, norms = [], []
    for _ in range(nsteps):
        for p in model.params():
            p.grad = None
        _, loss = model(x, y)
        loss.backward()
        norm = grad_norm(model)
        if grad_clip > 0 and norm > grad_clip:
            for p in model.params():
                p.grad.mul_(grad_clip / norm)
        opt.step(unit_pairs(us))
        losses.append(float(loss))
        norms.append(norm)
    return np.array(losses, "<f4"), np.array(norms, "<f4")


def build(a):
    """(model, checkpoint writer, V) for --arch."""
    if a.arch == "gpt2":
        cfg = ref.Config(max_seq_len=a.max_seq_len, vocab_size=a.vocab, padded_vocab=ref.padded_vocab_size(a.vocab),
                         n_layer=a.depth, n_head=a.heads, channels=a.channels).validate()
        tensors = ref.init_tensors(cfg, a.seed)
        model = ref.GPT2(cfg, {k: t.clone() for k, t in tensors.items()})
        return model, lambda path: ref.save_model(path, cfg, tensors), cfg.vocab_size
    import train_llama3 as llama
    cfg = llama.LlamaConfig(a.max_seq_len, a.vocab, a.depth, a.heads, a.kv_heads, a.channels, 4 * a.channels,
                            eps=ref.f32(1e-5), theta=ref.f32(10000.0), factor=ref.f32(8.0), low=ref.f32(1.0),
                            high=ref.f32(4.0), original=8192)
    tensors = llama.init_tensors(cfg, a.seed)
    model = llama.Llama(cfg, {k: t.clone() for k, t in tensors.items()})
    return model, lambda path: llama.save_model(path, cfg, tensors), cfg.vocab_size


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", choices=("gpt2", "llama3"), default="gpt2")
    for flag, default in (("--depth", 2), ("--channels", 64), ("--heads", 4), ("--kv-heads", 2),
                          ("--max-seq-len", 64), ("--vocab", 1000), ("--seed", 42), ("--batch-size", 4),
                          ("--seq-len", 32), ("--steps", 10)):
        p.add_argument(flag, type=int, default=default)
    for flag, default in (("--lr", 1e-2), ("--weight-decay", 0.0), ("--grad-clip", 1.0), ("--beta1", 0.0),
                          ("--clip-threshold", 1.0), ("--decay-rate", -0.8)):
        p.add_argument(flag, type=float, default=default)
    p.add_argument("--relative-step", type=int, default=0, choices=(0, 1),
                   help="1 = relative_step and scale_parameter on (then --lr is unused)")
    p.add_argument("--save-model", required=True, help="the initial model (the trainer's -e)")
    p.add_argument("--save-shard", required=True, help="a data shard holding exactly the batch")
    p.add_argument("--out", required=True, help=".npz: losses, grad_norms, params (flat, after --steps)")
    a = p.parse_args(argv)
    torch.set_num_threads(os.cpu_count())
    torch.use_deterministic_algorithms(True)
    model, save, V = build(a)
    save(a.save_model)
    x, y = ref.random_batch(a.batch_size, a.seq_len, V, a.seed)
    tokens = list(x.reshape(-1).tolist()) + [int(y.reshape(-1)[-1])]
    with open(a.save_shard, "wb") as f:
        f.write(struct.pack("<256i", *([20240520, 1, len(tokens)] + [0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))
    f32 = ref.f32
    opt = Adafactor(f32(a.lr), beta1=f32(a.beta1) if a.beta1 > 0 else None, clip_threshold=f32(a.clip_threshold),
                    decay_rate=f32(a.decay_rate), weight_decay=f32(a.weight_decay),
                    relative_step=bool(a.relative_step), scale_parameter=bool(a.relative_step))
    losses, norms = run(model, x, y, opt, a.steps, f32(a.grad_clip))
    params = np.concatenate([ref.tensor_f32(p).reshape(-1) for p in model.params()])
    tmp = a.out + ".tmp.npz"
    np.savez(tmp, losses=losses, grad_norms=norms, params=params)
    os.replace(tmp, a.out)
    print("losses " + " ".join(f"{v:.6f}" for v in losses))
    return 0


if __name__ == "__main__":
    sys.exit(main())
