"""prompt.py - the PyTorch reference for prompt tuning (issue 23 item 5): Hugging Face PEFT's PROMPT_TUNING
(task_type CAUSAL_LM) on a transformers model, trained the way ./train_gpt_cpu --prompt-tokens / --adapter
trains it, in fp32.

PEFT's PeftModelForCausalLM puts the P soft token embeddings in front of the batch's token embeddings
(the model then sees P + T positions: GPT-2 adds wpe[0..P+T), the Llama's RoPE positions are 0..P+T-1);
the loss is the mean cross-entropy over the B*T real positions (logits[:, P:] against the targets),
what PEFT's labels with -100 at the prompt give. The optimizer is llmc's AdamW over prompt_embeddings
only (lora.py's train: constant learning rate, decoupled decay, no clipping); the base is frozen.

    python3 dev/reference/prompt.py --model HF_DIR --adapter ADAPTER_DIR --data SHARD -b B -t T -x STEPS \
        [-l LR] [-c WD] [--eval] --out OUT_DIR
writes OUT_DIR/losses.json (every step's loss), OUT_DIR/grads.safetensors (step 1's gradient of
prompt_embeddings) and OUT_DIR/adapter (the trained adapter, save_pretrained). Needs peft 0.13.2 +
transformers 4.36.2 (test/test_lora.py's build/pyref).
"""
import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import lora  # noqa: E402 (its train(): llmc's AdamW over the trainable tensors)
from train_gpt2 import load_batch_from_shard  # noqa: E402


def load_trainable(model_dir, adapter_dir):
    """PEFT 0.13.2 refuses PeftModel.from_pretrained(..., is_trainable=True) for prompt learning: the
    directory's config (inference_mode off) through get_peft_model, then its prompt_embeddings loaded."""
    from peft import PeftConfig, get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    base.config.use_cache = False
    cfg = PeftConfig.from_pretrained(adapter_dir)
    cfg.inference_mode = False
    model = get_peft_model(base, cfg)
    set_peft_model_state_dict(model, load_file(os.path.join(adapter_dir, "adapter_model.safetensors")))
    model.train()  # (the tiny configs' dropouts are 0)
    return model


def prompt_loss(model, x, y):
    logits = model(input_ids=x).logits.float()  # (B, P + T, V): PEFT prepends the prompt
    logits = logits[:, logits.size(1) - y.size(1):]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for flag, kind, default in (("--model", str, None), ("--adapter", str, None), ("--data", str, None), ("-b", int, None),
                                ("-t", int, None), ("-x", int, 10), ("-l", float, 1e-3), ("-c", float, 0.0),
                                ("--out", str, None)):
        ap.add_argument(flag, type=kind, default=default, required=default is None)
    ap.add_argument("--eval", action="store_true", help="only the loss of the batch: losses.json [loss]")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    model = lora.load(a.model, a.adapter, trainable=False) if a.eval else load_trainable(a.model, a.adapter)
    x, y = load_batch_from_shard(a.data, a.b, a.t, model.config.vocab_size)
    os.makedirs(a.out, exist_ok=True)
    lora.loss_of = prompt_loss
    if a.eval:
        with torch.no_grad():
            losses = [float(prompt_loss(model, x, y))]
    else:
        losses, grads = lora.train(model, x, y, a.x, a.l, a.c, 0.9, 0.95, 1e-8)
        (g,) = grads.values()  # prompt_encoder.embedding.weight: PEFT saves it as prompt_embeddings
        from safetensors.torch import save_file
        save_file({"prompt_embeddings": g.contiguous()}, os.path.join(a.out, "grads.safetensors"))
        os.makedirs(os.path.join(a.out, "adapter"), exist_ok=True)
        with open(os.path.join(a.out, "adapter", "README.md"), "w") as f:  # (a new card would need Jinja2)
            f.write("---\nlibrary_name: peft\n---\n")
        model.save_pretrained(os.path.join(a.out, "adapter"))
    with open(os.path.join(a.out, "losses.json"), "w") as f:
        json.dump(losses, f)
    print(json.dumps({"losses": losses}))


if __name__ == "__main__":
    main()
