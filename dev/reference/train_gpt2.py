#!/usr/bin/env python3
"""train_gpt2.py - the PyTorch GPT-2 that llmc's C/CUDA trainers are checked against.

The model is llm.c's GPT-2, written as 16 explicit tensors (one nn.Parameter per checkpoint
tensor, stacked over layers) so that every gradient maps 1:1 onto a checkpoint tensor:

    name       shape       weight decay   random init (GPT-2)
    wte        (Vp, C)     yes            N(0, 0.02); rows >= V are zero padding
    wpe        (maxT, C)   yes            N(0, 0.02)
    ln1w       (L, C)      no             1
    ln1b       (L, C)      no             0
    qkvw       (L, 3C, C)  yes            N(0, 0.02)
    qkvb       (L, 3C)     no             0
    attprojw   (L, C, C)   yes            N(0, 0.02 / sqrt(2L))
    attprojb   (L, C)      no             0
    ln2w       (L, C)      no             1
    ln2b       (L, C)      no             0
    fcw        (L, 4C, C)  yes            N(0, 0.02)
    fcb        (L, 4C)     no             0
    fcprojw    (L, C, 4C)  yes            N(0, 0.02 / sqrt(2L))
    fcprojb    (L, C)      no             0
    lnfw       (C)         no             1
    lnfb       (C)         no             0

Weights are (out, in): y = x @ W^T + b. Forward for idx (B, T):
    x = wte[idx] + wpe[0:T]
    per layer l:  h = x + attproj(attn(ln1(x)));  x = h + fcproj(gelu(fc(ln2(h))))
    logits = lnf(x) @ wte^T                                   (B, T, Vp)
    loss = mean over B*T of cross-entropy(logits[..., :V], y) (padded logits never enter it)
LayerNorm: eps 1e-5, biased variance. Attention: qkv = [q | k | v], each C wide, NH heads of
HS = C/NH, causal softmax with scale 1/sqrt(HS). GELU: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))).

Optimizer (one training step, t = 1, 2, ...; computed in the model dtype, fp32 by default):
    norm = sqrt(sum over all tensors of sum(g^2))          (reported before clipping)
    if grad_clip > 0 and norm > grad_clip: g *= grad_clip / norm   (every tensor)
    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  mhat = m / (1 - b1^t);  vhat = v / (1 - b2^t)
    p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p)         wd only for the "yes" tensors above
The hyperparameters are rounded to float32 first (they are stored as float32 in the debug
state, and exactly those values are used). Scalar factors (lr, 1 - b1^t, ...) are computed in
double and rounded to the model dtype by the tensor ops. The per-tensor norms are computed in
the model dtype; their squares are added up in double. The optimizer is never torch.optim.

Files (all little-endian; every file starts with an int32 header of 256 entries):

Model checkpoint (llm.c's format): [0] 20240326, [1] version (3 = fp32, 5 = bf16),
[2] maxT, [3] V, [4] L, [5] NH, [6] C, [7] Vp; then the 16 tensors above, in that order, full
shapes, as float32 (v3) or bfloat16 (v5, rounded to nearest even from fp32).

Data shard (llm.c's format): [0] 20240520, [1] 1, [2] ntok; then ntok uint16 tokens (the uint32
variant [0] 20240801, [1] 7 is read too). A batch uses the first B*T+1 tokens:
x = tok[0:B*T], y = tok[1:B*T+1], both viewed as (B, T).

Debug state, version 3 (ours; llm.c's version 2 plus the optimizer trajectory):
    int32   header[256]: [0] 20240327, [1] 3, [2] B, [3] T, [4] V, [5] Vp, [6] nsteps, [7] L,
            [8] NH, [9] C, [10] maxT; [16..21] float32 values stored bit for bit in the int32
            slots: lr, beta1, beta2, eps, weight_decay, grad_clip; every other entry 0.
    int32   x[B*T]
    int32   y[B*T]
    float32 logits[B*T*V]       first V columns only, at the initial parameters
    float32 loss                at the initial parameters
    float32 grads               the 16 tensors in checkpoint order, full shapes (wte (Vp, C)),
                                at the initial parameters, before clipping
    float32 losses[nsteps]      losses[i] = loss of step i, computed before update i
    float32 grad_norms[nsteps]  global norm before clipping, step i
    float32 params              the 16 tensors after nsteps updates, checkpoint order
Every step trains on the same (x, y) batch. File size is exactly
1024 + 4 * (2*B*T + B*T*V + 1 + P + 2*nsteps + P), P = number of parameters including padding.

All files are written atomically (temporary file in the same folder, fsync, rename). With the
same flags on CPU the output files are byte-identical.

Examples (run from the repository root):
    /usr/bin/python3 dev/reference/train_gpt2.py --depth 2 --channels 64 --heads 4 \\
        --max-seq-len 64 --vocab 1000 --batch-size 2 --seq-len 16 --seed 1 \\
        --save-model /tmp/m.bin --debug-state /tmp/ds.bin
    /usr/bin/python3 dev/reference/train_gpt2.py --bench-steps 5      # d12, B=4, T=64, CPU
"""

import argparse
import math
import os
import struct
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

MODEL_MAGIC = 20240326
MODEL_VERSION_FP32 = 3
MODEL_VERSION_BF16 = 5
SHARD_MAGIC_U16, SHARD_VERSION_U16 = 20240520, 1
SHARD_MAGIC_U32, SHARD_VERSION_U32 = 20240801, 7
DEBUG_MAGIC = 20240327
DEBUG_VERSION = 3
HEADER_INTS = 256
HEADER_BYTES = 4 * HEADER_INTS
DEBUG_HP_SLOT = 16          # header[16..21]: lr, beta1, beta2, eps, weight_decay, grad_clip
LN_EPS = 1e-5
INIT_STD = 0.02
VOCAB_PAD_MULTIPLE = 128


# ------------------------------------------------------------------------------------------
# Config and the parameter table (the one place that lists the 16 tensors)

@dataclass(frozen=True)
class Config:
    max_seq_len: int   # maxT
    vocab_size: int    # V
    padded_vocab: int  # Vp >= V
    n_layer: int       # L
    n_head: int        # NH
    channels: int      # C

    def validate(self):
        for name in ("max_seq_len", "vocab_size", "padded_vocab", "n_layer", "n_head", "channels"):
            if getattr(self, name) <= 0:
                raise ValueError(f"config: {name} must be positive, got {getattr(self, name)}")
        if self.padded_vocab < self.vocab_size:
            raise ValueError(f"config: padded vocab Vp={self.padded_vocab} < V={self.vocab_size}")
        if self.channels % self.n_head != 0:
            raise ValueError(f"config: channels C={self.channels} not divisible by heads "
                             f"NH={self.n_head}")
        return self


def padded_vocab_size(V):
    return (V + VOCAB_PAD_MULTIPLE - 1) // VOCAB_PAD_MULTIPLE * VOCAB_PAD_MULTIPLE


def param_table(cfg):
    """[(name, shape, weight_decay, init)] in checkpoint order; init is 'normal' (std 0.02),
    'normal_proj' (std 0.02/sqrt(2L)), 'ones' or 'zeros'."""
    L, C, Vp, maxT = cfg.n_layer, cfg.channels, cfg.padded_vocab, cfg.max_seq_len
    return [
        ("wte", (Vp, C), True, "normal"),
        ("wpe", (maxT, C), True, "normal"),
        ("ln1w", (L, C), False, "ones"),
        ("ln1b", (L, C), False, "zeros"),
        ("qkvw", (L, 3 * C, C), True, "normal"),
        ("qkvb", (L, 3 * C), False, "zeros"),
        ("attprojw", (L, C, C), True, "normal_proj"),
        ("attprojb", (L, C), False, "zeros"),
        ("ln2w", (L, C), False, "ones"),
        ("ln2b", (L, C), False, "zeros"),
        ("fcw", (L, 4 * C, C), True, "normal"),
        ("fcb", (L, 4 * C), False, "zeros"),
        ("fcprojw", (L, C, 4 * C), True, "normal_proj"),
        ("fcprojb", (L, C), False, "zeros"),
        ("lnfw", (C,), False, "ones"),
        ("lnfb", (C,), False, "zeros"),
    ]


PARAM_NAMES = [name for name, _, _, _ in param_table(Config(1, 1, 1, 1, 1, 1))]


def num_params(cfg):
    return sum(math.prod(shape) for _, shape, _, _ in param_table(cfg))


# ------------------------------------------------------------------------------------------
# The model

def layernorm(x, w, b):
    """x (..., C) -> (x - mean) / sqrt(var + 1e-5) * w + b, biased variance, over C.
    Computed in at least fp32 (matters only under bf16 autocast)."""
    xf = x if x.dtype in (torch.float32, torch.float64) else x.float()
    mean = xf.mean(dim=-1, keepdim=True)
    xc = xf - mean
    var = (xc * xc).mean(dim=-1, keepdim=True)
    return xc * torch.rsqrt(var + LN_EPS) * w + b


def linear(x, w, b):
    """x (..., in), w (out, in), b (out) -> x @ w^T + b. Under autocast the bias joins the
    matmul's dtype (so bf16 stays bf16 into the attention kernel)."""
    y = x @ w.t()
    return y + b.to(y.dtype)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def causal_attention(q, k, v, flash):
    """q, k, v (B, NH, T, HS) -> (B, NH, T, HS): softmax(q k^T / sqrt(HS), causal) v."""
    if flash:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    T, HS = q.shape[-2], q.shape[-1]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))          # (B, NH, T, T)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    att = att.masked_fill(future, float("-inf")).softmax(dim=-1)
    return att @ v


def have_flash():
    return hasattr(torch.nn.functional, "scaled_dot_product_attention")


class GPT2(nn.Module):
    """llm.c's GPT-2 as 16 explicit parameters, registered in checkpoint order."""

    def __init__(self, cfg, tensors, flash=False):
        super().__init__()
        self.cfg = cfg.validate()
        self.flash = flash
        for name, shape, _, _ in param_table(cfg):
            t = tensors[name]
            if tuple(t.shape) != shape:
                raise ValueError(f"tensor {name}: shape {tuple(t.shape)}, expected {shape}")
            self.register_parameter(name, nn.Parameter(t))

    def params(self):
        """The 16 parameters in checkpoint order."""
        return [getattr(self, name) for name in PARAM_NAMES]

    def forward(self, idx, targets=None):
        """idx, targets (B, T) int64 -> logits (B, T, Vp), loss (scalar or None)."""
        cfg = self.cfg
        B, T = idx.shape
        C, NH, V = cfg.channels, cfg.n_head, cfg.vocab_size
        HS = C // NH
        # unbind once: its backward stacks the per-layer gradients in one go (indexing
        # self.qkvw[l] instead would add L zero-padded (L, ...) gradients per tensor)
        ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb = (
            getattr(self, name).unbind(0) for name in PARAM_NAMES[2:14])
        x = self.wte[idx] + self.wpe[:T]                                 # (B, T, C)
        for l in range(cfg.n_layer):
            h = layernorm(x, ln1w[l], ln1b[l])                           # (B, T, C)
            qkv = linear(h, qkvw[l], qkvb[l])                            # (B, T, 3C)
            q, k, v = (t.view(B, T, NH, HS).transpose(1, 2)              # (B, NH, T, HS)
                       for t in qkv.split(C, dim=-1))
            y = causal_attention(q, k, v, self.flash)
            y = y.transpose(1, 2).reshape(B, T, C)                       # (B, T, C)
            x = x + linear(y, attprojw[l], attprojb[l])
            h = layernorm(x, ln2w[l], ln2b[l])
            h = gelu_tanh(linear(h, fcw[l], fcb[l]))                     # (B, T, 4C)
            x = x + linear(h, fcprojw[l], fcprojb[l])
        x = layernorm(x, self.lnfw, self.lnfb)
        logits = x @ self.wte.t()                                        # (B, T, Vp)
        return logits, None if targets is None else cross_entropy(logits, targets, V)



def cross_entropy(logits, targets, V):
    """Mean cross-entropy over the real vocabulary (padded columns never enter it), in fp32 at
    least: logits (B, T, Vp), targets (B, T). Shared by the GPT-2 and Llama references."""
    B, T = targets.shape
    real = logits[..., :V].reshape(B * T, V)
    real = real if real.dtype in (torch.float32, torch.float64) else real.float()
    picked = real.gather(1, targets.reshape(B * T, 1)).squeeze(1)
    return (torch.logsumexp(real, dim=1) - picked).mean()

def init_tensors(cfg, seed):
    """GPT-2 random init from a seeded CPU generator (same seed -> same fp32 values anywhere)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape, _, init in param_table(cfg):
        if init in ("normal", "normal_proj"):
            std = INIT_STD if init == "normal" else INIT_STD / math.sqrt(2 * cfg.n_layer)
            t = torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=gen)
        elif init == "ones":
            t = torch.ones(shape, dtype=torch.float32)
        else:
            t = torch.zeros(shape, dtype=torch.float32)
        out[name] = t
    out["wte"][cfg.vocab_size:].zero_()
    return out


# ------------------------------------------------------------------------------------------
# Files

def atomic_write(path, write_fn):
    """Calls write_fn(f) on a temporary file next to path, fsyncs it, renames it onto path."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write_fn(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def header_bytes(ints):
    """A 256-entry int32 header; ints maps slot -> int value, or bytes for a raw 4-byte slot."""
    h = bytearray(HEADER_BYTES)
    for slot, value in ints.items():
        raw = value if isinstance(value, bytes) else struct.pack("<i", value)
        h[4 * slot:4 * slot + 4] = raw
    return bytes(h)


def fp32_to_bf16_bits(a):
    """float32 array -> uint16 bfloat16 bits, round to nearest, ties to even; NaN stays NaN."""
    bits = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(a)
    rounded[nan] = (bits[nan] >> 16) | 0x40                 # keep sign, force a quiet NaN
    return rounded.astype("<u2")


def bf16_bits_to_fp32(u):
    return (u.astype(np.uint32) << 16).view("<f4")


def tensor_f32(t):
    """A float32 numpy copy (never a view: the tensor may change in place later)."""
    return np.array(t.detach().to("cpu", torch.float32).contiguous().numpy(), dtype="<f4")


def save_model(path, cfg, tensors, version=MODEL_VERSION_FP32):
    """Writes an llm.c checkpoint: version 3 (fp32) or 5 (bf16); tensors: name -> tensor."""
    if version not in (MODEL_VERSION_FP32, MODEL_VERSION_BF16):
        raise ValueError(f"checkpoint version must be 3 (fp32) or 5 (bf16), got {version}")
    head = header_bytes({0: MODEL_MAGIC, 1: version, 2: cfg.max_seq_len, 3: cfg.vocab_size,
                         4: cfg.n_layer, 5: cfg.n_head, 6: cfg.channels, 7: cfg.padded_vocab})

    def write(f):
        f.write(head)
        for name, shape, _, _ in param_table(cfg):
            a = tensor_f32(tensors[name]).reshape(-1)
            if a.size != math.prod(shape):
                raise ValueError(f"save_model: {name} has {a.size} values, expected {shape}")
            f.write((a if version == MODEL_VERSION_FP32 else fp32_to_bf16_bits(a)).tobytes())
    atomic_write(path, write)


def load_model(path):
    """Reads an llm.c checkpoint (v3 or v5) -> (Config, {name: fp32 tensor}, version)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < HEADER_BYTES:
        raise ValueError(f"{path}: {len(raw)} bytes, too short for the 1024-byte header")
    h = np.frombuffer(raw[:HEADER_BYTES], dtype="<i4")
    if h[0] != MODEL_MAGIC:
        raise ValueError(f"{path}: magic {h[0]}, expected {MODEL_MAGIC} (an llm.c model file)")
    version = int(h[1])
    if version not in (MODEL_VERSION_FP32, MODEL_VERSION_BF16):
        raise ValueError(f"{path}: version {version}, expected 3 (fp32) or 5 (bf16)")
    cfg = Config(max_seq_len=int(h[2]), vocab_size=int(h[3]), n_layer=int(h[4]),
                 n_head=int(h[5]), channels=int(h[6]), padded_vocab=int(h[7])).validate()
    elem = 4 if version == MODEL_VERSION_FP32 else 2
    want = HEADER_BYTES + elem * num_params(cfg)
    if len(raw) != want:
        raise ValueError(f"{path}: {len(raw)} bytes, but the header ({cfg}) implies {want}")
    tensors, off = {}, HEADER_BYTES
    for name, shape, _, _ in param_table(cfg):
        n = math.prod(shape)
        if version == MODEL_VERSION_FP32:
            a = np.frombuffer(raw, dtype="<f4", count=n, offset=off).copy()
        else:
            a = bf16_bits_to_fp32(np.frombuffer(raw, dtype="<u2", count=n, offset=off))
        tensors[name] = torch.from_numpy(a.astype(np.float32).reshape(shape))
        off += elem * n
    return cfg, tensors, version


def load_batch_from_shard(path, B, T, V):
    """First B*T+1 tokens of an llm.c shard -> x, y (B, T) int64."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < HEADER_BYTES:
        raise ValueError(f"{path}: {len(raw)} bytes, too short for the 1024-byte header")
    h = np.frombuffer(raw[:HEADER_BYTES], dtype="<i4")
    if (h[0], h[1]) == (SHARD_MAGIC_U16, SHARD_VERSION_U16):
        dtype = "<u2"
    elif (h[0], h[1]) == (SHARD_MAGIC_U32, SHARD_VERSION_U32):
        dtype = "<u4"
    else:
        raise ValueError(f"{path}: magic/version {h[0]}/{h[1]}, expected {SHARD_MAGIC_U16}/1 "
                         f"or {SHARD_MAGIC_U32}/7 (an llm.c data shard)")
    ntok = int(h[2])
    want = HEADER_BYTES + np.dtype(dtype).itemsize * ntok
    if ntok < 0 or len(raw) != want:
        raise ValueError(f"{path}: {len(raw)} bytes, but header ntok={ntok} implies {want}")
    if ntok < B * T + 1:
        raise ValueError(f"{path}: {ntok} tokens, a B={B} T={T} batch needs {B * T + 1}")
    tok = torch.from_numpy(np.frombuffer(raw, dtype=dtype, count=B * T + 1,
                                         offset=HEADER_BYTES).astype(np.int64))
    if int(tok.max()) >= V:
        raise ValueError(f"{path}: token id {int(tok.max())} >= vocab size V={V}")
    return tok[:B * T].view(B, T), tok[1:].view(B, T)


def random_batch(B, T, V, seed):
    """B*T+1 ids uniform in [0, V) from a generator seeded with seed + 1 (the init uses seed),
    split like a shard: x = tok[0:BT], y = tok[1:BT+1]."""
    gen = torch.Generator().manual_seed(seed + 1)
    tok = torch.randint(0, V, (B * T + 1,), generator=gen, dtype=torch.int64)
    return tok[:B * T].view(B, T), tok[1:].view(B, T)


# ------------------------------------------------------------------------------------------
# Training step

@dataclass(frozen=True)
class HyperParams:
    lr: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0


class AdamW:
    """The update in the docstring, by hand; m and v live in the parameters' dtype/device.
    Two scratch buffers (the size of the largest tensor) hold mhat and the denominator, so a
    step allocates nothing."""

    def __init__(self, model, hp):
        self.hp = hp
        self.params = model.params()
        # the model's own table when it has one (train_llama3.py), else GPT-2's
        table = model.param_table() if hasattr(model, "param_table") else param_table(model.cfg)
        self.decay = [decay for _, _, decay, _ in table]
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        biggest = max(p.numel() for p in self.params)
        p0 = self.params[0]
        self.scratch = [torch.empty(biggest, dtype=p0.dtype, device=p0.device) for _ in range(2)]
        self.t = 0

    @torch.no_grad()
    def grad_norm(self):
        """Global L2 norm of all gradients; per-tensor sums of squares added in double."""
        norms = torch.stack([torch.linalg.vector_norm(p.grad) for p in self.params])
        return math.sqrt(float((norms.double() ** 2).sum()))   # one device sync

    @torch.no_grad()
    def step(self):
        """Clips the gradients in place and updates; returns the norm before clipping."""
        hp = self.hp
        norm = self.grad_norm()
        if hp.grad_clip > 0 and norm > hp.grad_clip:
            scale = hp.grad_clip / norm
            for p in self.params:
                p.grad.mul_(scale)
        self.t += 1
        bc1 = 1.0 - hp.beta1 ** self.t
        bc2 = 1.0 - hp.beta2 ** self.t
        for p, m, v, decay in zip(self.params, self.m, self.v, self.decay):
            g = p.grad
            m.mul_(hp.beta1).add_(g, alpha=1.0 - hp.beta1)               # m = b1 m + (1-b1) g
            v.mul_(hp.beta2).addcmul_(g, g, value=1.0 - hp.beta2)        # v = b2 v + (1-b2) g^2
            update = self.scratch[0][:p.numel()].view_as(p)
            denom = self.scratch[1][:p.numel()].view_as(p)
            torch.div(m, bc1, out=update)                                # mhat
            torch.div(v, bc2, out=denom).sqrt_().add_(hp.eps)            # sqrt(vhat) + eps
            update.div_(denom)
            if decay:
                update.add_(p, alpha=hp.weight_decay)
            p.sub_(update, alpha=hp.lr)                                  # p -= lr * update
        return norm


def train_step(model, opt, x, y, autocast_dtype=None, forward=None):
    """forward, backward, clip, update -> (loss float, norm float, logits of the forward)."""
    forward = model if forward is None else forward
    for p in model.params():   # zero in place (backward then adds into the same memory)
        if p.grad is not None:
            p.grad.zero_()
    if autocast_dtype is not None:
        with torch.autocast(device_type=x.device.type, dtype=autocast_dtype):
            logits, loss = forward(x, y)
    else:
        logits, loss = forward(x, y)
    loss.backward()
    return float(loss), opt.step(), logits


def run_reference(model, x, y, hp, nsteps):
    """Runs nsteps training steps on one batch (model updated in place). Returns a dict with
    logits (B*T, V), loss and grads (list, checkpoint order) at the initial parameters, losses
    and grad_norms per step, and params after the steps; all fp32 CPU tensors."""
    V = model.cfg.vocab_size
    logits, loss = model(x, y)
    loss.backward()
    out = {"logits": tensor_f32(logits[..., :V].reshape(-1, V)),
           "loss": float(loss),
           "grads": [tensor_f32(p.grad) for p in model.params()]}
    opt = AdamW(model, hp)
    losses, norms = [], []
    for i in range(nsteps):
        if i > 0:   # step 0 reuses the forward/backward above
            for p in model.params():
                p.grad = None
            _, loss = model(x, y)
            loss.backward()
        losses.append(float(loss))
        norms.append(opt.step())
    out["losses"] = np.array(losses, dtype="<f4")
    out["grad_norms"] = np.array(norms, dtype="<f4")
    out["params"] = [tensor_f32(p) for p in model.params()]
    return out


def f32(value):
    """value rounded to float32 (the hyperparameters used are exactly those in the header)."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def debug_state_size(B, T, cfg, nsteps):
    P = num_params(cfg)
    return HEADER_BYTES + 4 * (2 * B * T + B * T * cfg.vocab_size + 1 + P + 2 * nsteps + P)


@torch.no_grad()
def greedy_generate(model, prompt_ids, max_new, eot):
    """Greedy decoding by full recompute: at each step the whole sequence goes through the model
    and the next token is the argmax of the last position's logits over the real vocabulary
    (the first maximum). Stops after max_new tokens, at eot (not returned) or at maxT.
    Returns (new ids, smallest gap between the best and second-best logit seen)."""
    ids, out, gap = list(prompt_ids), [], math.inf
    V = model.cfg.vocab_size
    while len(out) < max_new and len(ids) < model.cfg.max_seq_len:
        logits, _ = model(torch.tensor([ids], dtype=torch.long))
        last = logits[0, -1, :V]
        top2 = torch.topk(last, 2).values
        gap = min(gap, float(top2[0] - top2[1]))
        nxt = int(torch.argmax(last))
        if nxt == eot:
            break
        out.append(nxt)
        ids.append(nxt)
    return out, gap


def write_debug_state_body(f, header, x, y, ref):
    """Writes a debug state after its header: the tokens x, y (B, T) as int32, then ref's logits,
    loss, grads, per-step losses and grad norms and final params (the order both trainers read)."""
    f.write(header)
    f.write(x.cpu().numpy().astype("<i4").tobytes())
    f.write(y.cpu().numpy().astype("<i4").tobytes())
    f.write(ref["logits"].tobytes())
    f.write(struct.pack("<f", ref["loss"]))
    for g in ref["grads"]:
        f.write(g.tobytes())
    f.write(ref["losses"].tobytes())
    f.write(ref["grad_norms"].tobytes())
    for p in ref["params"]:
        f.write(p.tobytes())


def write_debug_state(path, cfg, x, y, hp, nsteps, ref):
    B, T = x.shape
    hp_values = [hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, hp.grad_clip]
    fields = {0: DEBUG_MAGIC, 1: DEBUG_VERSION, 2: B, 3: T, 4: cfg.vocab_size,
              5: cfg.padded_vocab, 6: nsteps, 7: cfg.n_layer, 8: cfg.n_head, 9: cfg.channels,
              10: cfg.max_seq_len}
    for i, value in enumerate(hp_values):
        fields[DEBUG_HP_SLOT + i] = struct.pack("<f", value)

    atomic_write(path, lambda f: write_debug_state_body(f, header_bytes(fields), x, y, ref))
    size = os.path.getsize(path)
    if size != debug_state_size(B, T, cfg, nsteps):
        raise RuntimeError(f"{path}: wrote {size} bytes, layout says "
                           f"{debug_state_size(B, T, cfg, nsteps)}")


# ------------------------------------------------------------------------------------------
# Benchmark

def bench(model, x, y, hp, nsteps, dtype, compile_model):
    """2 warm-up steps, then nsteps timed training steps -> ms per step."""
    dev = x.device
    autocast_dtype = torch.bfloat16 if dtype == "bfloat16" else None
    forward = model
    if compile_model:
        if not hasattr(torch, "compile"):
            raise SystemExit(f"--compile needs torch >= 2.0 (this is {torch.__version__})")
        forward = torch.compile(model)
    opt = AdamW(model, hp)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()
    for _ in range(2):
        train_step(model, opt, x, y, autocast_dtype, forward)
    sync()
    start = time.perf_counter()
    loss = 0.0
    for _ in range(nsteps):
        loss, _, _ = train_step(model, opt, x, y, autocast_dtype, forward)
    sync()
    return (time.perf_counter() - start) * 1000.0 / nsteps, loss


# ------------------------------------------------------------------------------------------
# CLI

MODEL_SHAPE_DEFAULTS = {"depth": 12, "channels": 768, "heads": 12, "max_seq_len": 1024,
                        "vocab": 50257}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows live defaults, except for flags whose default is None (their help says it)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="PyTorch reference GPT-2 (llm.c layout): writes checkpoints and debug "
                    "states, and benchmarks training steps. See the module docstring for the "
                    "file layouts.",
        formatter_class=HelpFormatter)
    g = p.add_argument_group("model (a checkpoint, or a random GPT-2; shape defaults = d12)")
    g.add_argument("--load", metavar="PATH", help="llm.c checkpoint (version 3 or 5) to start from")
    g.add_argument("--depth", type=int, help=f"L (default {MODEL_SHAPE_DEFAULTS['depth']})")
    g.add_argument("--channels", type=int, help=f"C (default {MODEL_SHAPE_DEFAULTS['channels']})")
    g.add_argument("--heads", type=int, help=f"NH (default {MODEL_SHAPE_DEFAULTS['heads']})")
    g.add_argument("--max-seq-len", type=int,
                   help=f"maxT (default {MODEL_SHAPE_DEFAULTS['max_seq_len']})")
    g.add_argument("--vocab", type=int,
                   help=f"V; Vp = V rounded up to a multiple of 128 "
                        f"(default {MODEL_SHAPE_DEFAULTS['vocab']})")
    g.add_argument("--seed", type=int, default=1337,
                   help="init seed; random batches use seed + 1")
    g.add_argument("--save-model", metavar="PATH", help="write the initial model here")
    g.add_argument("--save-version", type=int, default=3, choices=(3, 5),
                   help="--save-model format: 3 = fp32, 5 = bf16")
    g = p.add_argument_group("batch")
    g.add_argument("--batch-size", type=int, default=4, help="B")
    g.add_argument("--seq-len", type=int, default=64, help="T (<= maxT)")
    g.add_argument("--data", metavar="PATH",
                   help="llm.c data shard; default: random ids from --seed")
    g = p.add_argument_group("reference run (debug state)")
    g.add_argument("--debug-state", metavar="PATH", help="write the debug state (version 3) here")
    g.add_argument("--steps", type=int, default=10, help="training steps in the debug state")
    g.add_argument("--float64", action="store_true",
                   help="compute the debug state in float64 (from the same fp32 parameters)")
    g = p.add_argument_group("greedy generation (full recompute; checks ./generate)")
    g.add_argument("--generate", type=int, default=0, metavar="N",
                   help="print the greedy continuation (up to N token ids) of --prompt-ids")
    g.add_argument("--prompt-ids", default="50256", metavar="IDS",
                   help="comma-separated prompt token ids for --generate")
    g.add_argument("--eot", type=int, default=50256, help="end-of-text id: --generate stops there")
    g = p.add_argument_group("optimizer")
    for field, what in (("lr", "learning rate"), ("beta1", "AdamW beta1"), ("beta2", "AdamW beta2"),
                        ("eps", "AdamW epsilon"),
                        ("weight_decay", "decoupled weight decay (wte, wpe, qkvw, attprojw, fcw, fcprojw)"),
                        ("grad_clip", "clip the global grad norm to this; <= 0 disables")):
        g.add_argument("--" + field.replace("_", "-"), type=float, default=getattr(HyperParams, field), help=what)
    g = p.add_argument_group("benchmark")
    g.add_argument("--bench-steps", type=int, default=0,
                   help="time this many training steps (after 2 warm-up steps); 0 = no bench")
    g.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where to run")
    g.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="bfloat16 = autocast with fp32 master weights (benchmark only)")
    g.add_argument("--compile", action="store_true", help="torch.compile the model (torch 2.x)")
    g.add_argument("--flash", action="store_true",
                   help="attention via F.scaled_dot_product_attention (torch 2.x)")
    args = p.parse_args(argv)

    shape_flags = [k for k in MODEL_SHAPE_DEFAULTS if getattr(args, k) is not None]
    if args.load and shape_flags:
        p.error("--load takes the model shape from the checkpoint; drop "
                + ", ".join("--" + k.replace("_", "-") for k in shape_flags))
    for k, v in MODEL_SHAPE_DEFAULTS.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    for k in ("batch_size", "seq_len"):
        if getattr(args, k) <= 0:
            p.error(f"--{k.replace('_', '-')} must be positive")
    for k in ("steps", "bench_steps"):
        if getattr(args, k) < 0:
            p.error(f"--{k.replace('_', '-')} must be >= 0")
    if not (args.save_model or args.debug_state or args.bench_steps or args.generate):
        p.error("nothing to do: give --save-model, --debug-state, --bench-steps and/or --generate")
    if args.generate < 0:
        p.error("--generate must be >= 0")
    try:
        args.prompt_ids = [int(t) for t in args.prompt_ids.split(",")]
    except ValueError:
        p.error(f"--prompt-ids expects comma-separated integers, got '{args.prompt_ids}'")
    if args.debug_state and args.device != "cpu":
        print("warning: debug states are byte-reproducible on CPU only", file=sys.stderr)
    if args.flash and not have_flash():
        p.error(f"--flash needs F.scaled_dot_product_attention (torch >= 2.0; this is "
                f"{torch.__version__})")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device visible to torch")
    return args


def build_model_tensors(args):
    if args.load:
        cfg, tensors, version = load_model(args.load)
        print(f"loaded {args.load} (version {version})")
    else:
        V = args.vocab
        cfg = Config(max_seq_len=args.max_seq_len, vocab_size=V, padded_vocab=padded_vocab_size(V),
                     n_layer=args.depth, n_head=args.heads, channels=args.channels).validate()
        tensors = init_tensors(cfg, args.seed)
    return cfg, tensors


def make_model(cfg, tensors, device, dtype, flash=False):
    return GPT2(cfg, {k: t.to(device=device, dtype=dtype).clone() for k, t in tensors.items()},
                flash=flash)


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(os.cpu_count())
        torch.use_deterministic_algorithms(True)
    cfg, tensors = build_model_tensors(args)
    B, T = args.batch_size, args.seq_len
    if T > cfg.max_seq_len:
        raise SystemExit(f"--seq-len {T} exceeds the model's maxT {cfg.max_seq_len}")
    hp = HyperParams(*(f32(v) for v in (args.lr, args.beta1, args.beta2, args.eps,
                                         args.weight_decay, args.grad_clip)))
    print(f"config: maxT={cfg.max_seq_len} V={cfg.vocab_size} Vp={cfg.padded_vocab} "
          f"L={cfg.n_layer} NH={cfg.n_head} C={cfg.channels} params={num_params(cfg)} "
          f"B={B} T={T} seed={args.seed} "
          + " ".join(f"{k}={getattr(hp, k):.7g}" for k in HyperParams.__dataclass_fields__))

    if args.save_model:
        save_model(args.save_model, cfg, tensors, args.save_version)
        print(f"wrote {args.save_model} (version {args.save_version})")

    if args.data:
        x, y = load_batch_from_shard(args.data, B, T, cfg.vocab_size)
    else:
        x, y = random_batch(B, T, cfg.vocab_size, args.seed)

    if args.debug_state:
        dtype = torch.float64 if args.float64 else torch.float32
        model = make_model(cfg, tensors, args.device, dtype, flash=args.flash)
        ref = run_reference(model, x.to(args.device), y.to(args.device), hp, args.steps)
        write_debug_state(args.debug_state, cfg, x, y, hp, args.steps, ref)
        losses = " ".join(f"{v:.6f}" for v in ref["losses"])
        print(f"wrote {args.debug_state}: loss {ref['loss']:.6f}; losses {losses}")
        del model, ref

    if args.generate:
        model = make_model(cfg, tensors, "cpu", torch.float32)
        if not args.prompt_ids or not all(0 <= t < cfg.vocab_size for t in args.prompt_ids):
            raise SystemExit(f"--prompt-ids: every id must be in [0, {cfg.vocab_size})")
        if len(args.prompt_ids) >= cfg.max_seq_len:
            raise SystemExit(f"--prompt-ids: {len(args.prompt_ids)} ids leave no room below maxT "
                             f"{cfg.max_seq_len}")
        out, gap = greedy_generate(model, args.prompt_ids, args.generate, args.eot)
        print(f"GENERATE ids={','.join(map(str, out))} min_top2_gap={gap:.6g}")
        del model

    if args.bench_steps:
        model = make_model(cfg, tensors, args.device, torch.float32, flash=args.flash)
        ms, loss = bench(model, x.to(args.device), y.to(args.device), hp, args.bench_steps,
                         args.dtype, args.compile)
        print(f"BENCH pytorch ms_per_step={ms:.2f} tokens_per_s={B * T / (ms / 1000.0):.0f} "
              f"torch={torch.__version__} threads={torch.get_num_threads()} "
              f"device={args.device} dtype={args.dtype} compile={int(args.compile)} "
              f"flash={int(args.flash)} B={B} T={T} L={cfg.n_layer} C={cfg.channels} "
              f"steps={args.bench_steps} last_loss={loss:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
