"""distill.py - the PyTorch reference for knowledge distillation (issue 23 item 6): a GPT-2 student
(every parameter, or LoRA adapters on a frozen base) trained against a frozen GPT-2 teacher the way
./train_gpt_cpu --teacher T --distill-alpha a --distill-temperature t trains it, in fp32.

Per token, with s the student's logits and r the teacher's over the V real columns (padding never
enters), p_t = softmax(r / t) and q_t = softmax(s / t):
    loss = (1 - a) * CE(s, y) + a * t^2 * KL(p_t || q_t),   KL(p || q) = sum_v p_v (log p_v - log q_v)
averaged over the batch's B*T tokens; the teacher runs forward only (no gradient). Autograd gives the
student's gradient (the trainer's closed form: (1 - a)(softmax(s) - onehot(y)) + a t (q_t - p_t) per
token, over B*T). The optimizer is llmc's AdamW (train_gpt2.py's AdamW: decoupled decay on the 2-D
weights, or on every adapter tensor, as llmc/cpu/adamw.c), a constant learning rate, the batch is the
first B*T+1 tokens of an llm.c shard (./train_gpt_cpu -a 1 --shuffle 0).

The models are llm.c GPT-2 model files (train_gpt2.py's format: teacher and student of any sizes
with the same vocabulary); --adapter DIR (PEFT's format, as llmc writes it: keys
base_model.model.transformer.h.L.{attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj}.lora_{A,B}.weight,
A [r, in], B [out, r], scale lora_alpha / r, or / sqrt(r) with use_rslora) trains those adapters
on the frozen student.

    python3 dev/reference/distill.py --student FILE --teacher FILE [--adapter DIR] --data SHARD \
        -b B -t T -x STEPS --alpha A --temperature T [-l LR] [-c WD] [--eps EPS] --out OUT_DIR
writes OUT_DIR/result.json ({"loss", "ce", "kd"}: each step's values, before its update),
OUT_DIR/grads.safetensors (step 1's gradient of every trained tensor: the model's 16 tensors by
train_gpt2.py's names, or the adapter's PEFT keys) and OUT_DIR/final.safetensors (the trained
tensors after the last step, the same names).
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import f32_safetensors  # noqa: E402
from train_gpt2 import (GPT2, PARAM_NAMES, AdamW, HyperParams, causal_attention, cross_entropy,  # noqa: E402
                        gelu_tanh, layernorm, linear, load_batch_from_shard, load_model, param_table)

# the adapter sites of llm.c's GPT-2: PEFT's module name -> the base weight it adapts
SITES = {"attn.c_attn": "qkvw", "attn.c_proj": "attprojw", "mlp.c_fc": "fcw", "mlp.c_proj": "fcprojw"}


def read_safetensors(path):
    """f32_safetensors.read_safetensors's tensors as (writable) torch tensors, and the metadata."""
    arrays, metadata = f32_safetensors.read_safetensors(path)
    return {k: torch.from_numpy(a.copy()) for k, a in arrays.items()}, metadata


def write_safetensors(path, tensors, metadata=None):
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for k in sorted(tensors):
        a = np.ascontiguousarray(tensors[k].detach().numpy().astype("<f4"))
        header[k] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


class LoraGPT2(torch.nn.Module):
    """A frozen llm.c GPT-2 with PEFT-format LoRA adapters on some of its linear layers: the site's
    output gains scale * (x @ A^T) @ B^T."""

    def __init__(self, base, adapter_dir):
        super().__init__()
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        cfg = json.load(open(os.path.join(adapter_dir, "adapter_config.json")))
        r = cfg["r"]
        self.scale = cfg["lora_alpha"] / (math.sqrt(r) if cfg.get("use_rslora") else r)
        tensors, _ = read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
        self.keys = sorted(tensors)
        for i, k in enumerate(self.keys):
            self.register_parameter(f"t{i}", torch.nn.Parameter(tensors[k]))

    def params(self):
        return [getattr(self, f"t{i}") for i in range(len(self.keys))]

    def param_table(self):  # (AdamW's decay flags: every adapter tensor decays)
        return [(k, None, True, None) for k in self.keys]

    def delta(self, l, site, x):
        pre = f"base_model.model.transformer.h.{l}.{site}.lora_"
        if pre + "A.weight" not in self.keys:
            return 0.0
        a, b = (getattr(self, f"t{self.keys.index(pre + w + '.weight')}") for w in ("A", "B"))
        return self.scale * ((x @ a.t()) @ b.t())

    def forward(self, idx, targets=None):
        m, cfg = self.base, self.base.cfg
        B, T = idx.shape
        C, NH = cfg.channels, cfg.n_head
        HS = C // NH
        x = m.wte[idx] + m.wpe[:T]
        for l in range(cfg.n_layer):
            h = layernorm(x, m.ln1w[l], m.ln1b[l])
            qkv = linear(h, m.qkvw[l], m.qkvb[l]) + self.delta(l, "attn.c_attn", h)
            q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in qkv.split(C, dim=-1))
            y = causal_attention(q, k, v, False).transpose(1, 2).reshape(B, T, C)
            x = x + linear(y, m.attprojw[l], m.attprojb[l]) + self.delta(l, "attn.c_proj", y)
            h = layernorm(x, m.ln2w[l], m.ln2b[l])
            f = gelu_tanh(linear(h, m.fcw[l], m.fcb[l]) + self.delta(l, "mlp.c_fc", h))
            x = x + linear(f, m.fcprojw[l], m.fcprojb[l]) + self.delta(l, "mlp.c_proj", f)
        x = layernorm(x, m.lnfw, m.lnfb)
        return x @ m.wte.t(), None


def distill_loss(student_logits, teacher_logits, y, V, alpha, t):
    """-> (loss, ce, kd): the objective and its two parts, means over the tokens."""
    ce = cross_entropy(student_logits, y, V)
    s = student_logits[..., :V].reshape(-1, V) / t
    r = teacher_logits[..., :V].reshape(-1, V) / t
    log_q, log_p = torch.log_softmax(s, dim=-1), torch.log_softmax(r, dim=-1)
    kd = (log_p.exp() * (log_p - log_q)).sum(dim=-1).mean()
    return (1.0 - alpha) * ce + alpha * t * t * kd, ce, kd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--student", required=True)
    ap.add_argument("--teacher", required=True)
    ap.add_argument("--adapter", default="")
    ap.add_argument("--data", required=True)
    ap.add_argument("-b", type=int, required=True)
    ap.add_argument("-t", type=int, required=True)
    ap.add_argument("-x", type=int, default=10)
    ap.add_argument("--alpha", type=float, required=True)
    ap.add_argument("--temperature", type=float, required=True)
    ap.add_argument("-l", type=float, default=1e-3)
    ap.add_argument("-c", type=float, default=0.0)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(2)

    scfg, stensors, _ = load_model(args.student)
    tcfg, ttensors, _ = load_model(args.teacher)
    if scfg.vocab_size != tcfg.vocab_size:
        sys.exit(f"the teacher's vocabulary ({tcfg.vocab_size}) is not the student's ({scfg.vocab_size})")
    teacher = GPT2(tcfg, ttensors)
    for p in teacher.parameters():
        p.requires_grad_(False)
    student = GPT2(scfg, stensors)
    model = LoraGPT2(student, args.adapter) if args.adapter else student
    names = model.keys if args.adapter else PARAM_NAMES
    x, y = load_batch_from_shard(args.data, args.b, args.t, scfg.vocab_size)
    opt = AdamW(model, HyperParams(lr=args.l, beta1=args.beta1, beta2=args.beta2, eps=args.eps,
                                   weight_decay=args.c, grad_clip=0.0))
    if not args.adapter:  # (train_gpt2's table: decay on the 2-D weights)
        opt.decay = [decay for _, _, decay, _ in param_table(scfg)]
    with torch.no_grad():
        teacher_logits, _ = teacher(x)  # (-a 1: the same batch every step)
    res = {"loss": [], "ce": [], "kd": []}
    os.makedirs(args.out, exist_ok=True)
    for step in range(1, args.x + 1):
        for p in model.params():
            p.grad = None
        logits, _ = model(x)
        loss, ce, kd = distill_loss(logits, teacher_logits, y, scfg.vocab_size, args.alpha, args.temperature)
        loss.backward()
        for k, v in (("loss", loss), ("ce", ce), ("kd", kd)):
            res[k].append(float(v))
        if step == 1:
            write_safetensors(os.path.join(args.out, "grads.safetensors"),
                              {n: p.grad for n, p in zip(names, model.params())})
        opt.step()
    write_safetensors(os.path.join(args.out, "final.safetensors"), dict(zip(names, model.params())))
    json.dump(res, open(os.path.join(args.out, "result.json"), "w"))


if __name__ == "__main__":
    main()
