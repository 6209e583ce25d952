"""lora.py - the PyTorch reference for LoRA fine-tuning (issue 23): Hugging Face PEFT's LoRA (and DoRA,
when the adapter's config has use_dora) on a
transformers model, trained the way ./train_gpt_cpu --lora-rank / --adapter trains it, in fp32.

The model is a Hugging Face directory (GPT-2 or Llama), the adapter a PEFT adapter directory; the
batch is the first B*T+1 tokens of an llm.c shard (./train_gpt_cpu -a 1 --shuffle 0), the loss the
mean cross-entropy over the B*T positions, the optimizer llmc's AdamW (llmc/cpu/adamw.c: decoupled
decay applied to every adapter tensor, constant learning rate, no clipping) over the adapter's
tensors only; the base is frozen (requires_grad False, as PEFT leaves it).

Needs torch, transformers and peft (peft 0.13.2 + transformers 4.36.2: test/test_lora.py installs
them with `pip install --no-deps --target` into a folder of its own).

    python3 dev/reference/lora.py --model HF_DIR --adapter ADAPTER_DIR --data SHARD -b B -t T -x STEPS \
        [-l LR] [-c WD] [--beta1 .9] [--beta2 .95] [--eps 1e-8] --out OUT_DIR
With --quantize-base nf4|int8 (and --double-quant for NF4) the base is QLoRA's: every linear weight of the
blocks (GPT-2's c_attn, c_proj, c_fc; the Llama's q/k/v/o_proj, gate/up/down_proj; not the head) replaced
by its dequantised quantisation (dev/reference/nf4.py, the (out, in) matrix as HF holds it) before PEFT
wraps the model: the same fp32 base ./train_gpt_cpu --quantize-base computes with.
writes OUT_DIR/losses.json (the loss of every step), OUT_DIR/grads.safetensors (step 1's gradient
of every adapter tensor, PEFT's keys) and OUT_DIR/adapter (the trained adapter, save_pretrained).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train_gpt2 import load_batch_from_shard  # noqa: E402


def peft_key(name):
    """A PeftModel parameter name -> the key PEFT saves ("....lora_A.default.weight" -> "....lora_A.weight";
    DoRA's "....lora_magnitude_vector.default.weight" -> "....lora_magnitude_vector")."""
    name = name.replace(".default.", ".")
    return name[:-len(".weight")] if name.endswith("lora_magnitude_vector.weight") else name


def dora_zero_norm_gain0():
    """DoRA rows whose W + s B A is all zero: gain m / n = 0 (llmc's rule, llmc/models/lora.h) where
    PEFT 0.13.2 computes 0 / 0 = NaN. Applied after loading (the magnitudes come from the adapter)."""
    from peft.tuners.lora.dora import DoraLinearLayer
    plain = DoraLinearLayer.get_weight_norm

    def norm(self, weight, lora_weight, scaling):
        n = plain(self, weight, lora_weight, scaling)
        return torch.where(n > 0, n, torch.full_like(n, float("inf")))  # m / inf = 0, d/dm 0
    DoraLinearLayer.get_weight_norm = norm


def quantize_base(base, mode, double_quant):
    """QLoRA: each block's linear weights (a module under transformer.h.N / model.layers.N) replaced by
    nf4.roundtrip of its (out, in) matrix (GPT-2's Conv1D holds (in, out): transposed there and back)."""
    import re
    import nf4
    from transformers.pytorch_utils import Conv1D
    n = 0
    for name, mod in base.named_modules():
        if not re.search(r"\.(h|layers)\.\d+\.", name) or not isinstance(mod, (torch.nn.Linear, Conv1D)):
            continue
        w = mod.weight.detach().numpy()
        oi = w.T if isinstance(mod, Conv1D) else w
        deq = nf4.roundtrip(np.ascontiguousarray(oi), mode, double_quant)
        with torch.no_grad():
            mod.weight.copy_(torch.from_numpy(np.ascontiguousarray(deq.T if isinstance(mod, Conv1D) else deq)))
        n += 1
    return n


def load(model_dir, adapter_dir, trainable=True, quantize=None, double_quant=False):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    base.config.use_cache = False
    if quantize:
        quantize_base(base, quantize, double_quant)
    model = PeftModel.from_pretrained(base, adapter_dir, is_trainable=trainable)
    model.train()  # (no dropout: lora_dropout 0 and the tiny configs' dropouts are set to 0)
    return model


def loss_of(model, x, y):
    logits = model(input_ids=x).logits.float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


def train(model, x, y, steps, lr, wd, beta1, beta2, eps):
    """llmc's AdamW (llmc/cpu/adamw.c) over the trainable tensors; returns the losses and step 1's gradients."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    m = {n: torch.zeros_like(p) for n, p in params}
    v = {n: torch.zeros_like(p) for n, p in params}
    losses, grads = [], {}
    for t in range(1, steps + 1):
        model.zero_grad(set_to_none=True)
        loss = loss_of(model, x, y)
        loss.backward()
        losses.append(float(loss))
        if t == 1:
            grads = {peft_key(n): p.grad.detach().clone() for n, p in params}
        c1, c2 = 1.0 - beta1 ** t, 1.0 - beta2 ** t
        with torch.no_grad():
            for n, p in params:
                g = p.grad
                m[n] = beta1 * m[n] + (1.0 - beta1) * g
                v[n] = beta2 * v[n] + (1.0 - beta2) * g * g
                p -= lr * ((m[n] / c1) / (torch.sqrt(v[n] / c2) + eps) + wd * p)
    return losses, grads


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("-b", type=int, required=True)
    ap.add_argument("-t", type=int, required=True)
    ap.add_argument("-x", type=int, default=10)
    ap.add_argument("-l", type=float, default=1e-3)
    ap.add_argument("-c", type=float, default=0.0)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--eval", action="store_true", help="only the loss of the batch (no training): losses.json [loss]")
    ap.add_argument("--dora-zero-rows", action="store_true", help="DoRA: zero-norm rows get gain 0 (llmc's rule) instead of NaN")
    ap.add_argument("--quantize-base", choices=["nf4", "int8"], help="QLoRA: the block linear weights quantised and dequantised (nf4.py)")
    ap.add_argument("--double-quant", action="store_true", help="with --quantize-base nf4: the absmax values quantised too")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    model = load(a.model, a.adapter, trainable=not a.eval, quantize=a.quantize_base, double_quant=a.double_quant)
    if a.dora_zero_rows:
        dora_zero_norm_gain0()
    V = model.config.vocab_size
    x, y = load_batch_from_shard(a.data, a.b, a.t, V)
    os.makedirs(a.out, exist_ok=True)
    if a.eval:
        with torch.no_grad():
            losses = [float(loss_of(model, x, y))]
    else:
        losses, grads = train(model, x, y, a.x, a.l, a.c, a.beta1, a.beta2, a.eps)
        from safetensors.torch import save_file
        save_file({k: g.contiguous() for k, g in grads.items()}, os.path.join(a.out, "grads.safetensors"))
        os.makedirs(os.path.join(a.out, "adapter"), exist_ok=True)  # PEFT updates a model card: one to update
        with open(os.path.join(a.out, "adapter", "README.md"), "w") as f:  # (a new one would need Jinja2)
            f.write("---\nlibrary_name: peft\n---\n")
        model.save_pretrained(os.path.join(a.out, "adapter"))
    with open(os.path.join(a.out, "losses.json"), "w") as f:
        json.dump(losses, f)
    base_sum = float(np.sum([p.detach().double().abs().sum().item() for n, p in model.named_parameters() if "lora_" not in n]))
    print(json.dumps({"losses": losses, "base_abs_sum": base_sum}))


if __name__ == "__main__":
    main()
