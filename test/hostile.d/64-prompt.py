"""Hostile-driver category "prompt-tuning adapter directories" (issue 23 item 5): --adapter DIR (a PEFT
PROMPT_TUNING directory the trainer wrote for the tiny model with --prompt-tokens) mangled at random:
adapter_config.json with keys dropped, num_virtual_tokens / token_dim 0, negative, fractional, huge or
not numbers, another task_type or num_transformer_submodules, LoRA's peft_type, truncated or not JSON;
adapter_model.safetensors mangled as 60-lora.py's category does (truncated, header bytes flipped, the
tensor renamed, dropped, misshapen, one added, the base CRC changed); and flags that contradict the file
(--prompt-tokens, --lora-rank, -t beyond maxT). Every run must train or stop with a clean error (exit 1,
'error: '), and the adapter directory it read must be left as it was (lost otherwise)."""
import importlib.util
import os

import lora_common
from lora_common import adapter_case, train_adapter

_spec = importlib.util.spec_from_file_location("hostile_lora", os.path.join(os.path.dirname(__file__), "60-lora.py"))
_lora = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_lora)


def setup(ctx):
    ctx.prompt_adapter = train_adapter(ctx, "prompt_src", ["--prompt-tokens", "4"])


def mangle_config(r, cfg):
    choice = r.randrange(6)
    if choice == 0:
        cfg.pop(r.choice(sorted(cfg)), None)
    elif choice in (1, 2):
        cfg["num_virtual_tokens" if choice == 1 else "token_dim"] = r.choice([0, -1, 2.5, 1 << 40, "4", None, 3, 5, 1 << 20])
    elif choice == 3:
        cfg["task_type"] = r.choice(["SEQ_CLS", None, 3])
    elif choice == 4:
        cfg["num_transformer_submodules"] = r.choice([2, 0, "1"])
    else:
        cfg["peft_type"] = r.choice(["LORA", "PREFIX_TUNING", None])
    return cfg


def edit_config(r, d):
    return lora_common.edit_config(r, d, mangle_config, '{"peft_type": "PROMPT_TUNING"}')


def case_adapter(ctx, r, tag):
    return adapter_case(ctx, r, tag, "prompt", ctx.prompt_adapter, [(0.6, edit_config), (0.6, _lora.edit_tensors)],
                        [["--prompt-tokens", "5"], ["--lora-rank", "2"], ["-t", "100000"], ["--prompt-tokens", "4"]], 0.2)


CATEGORIES = [("prompt-tuning adapter directories", case_adapter)]
