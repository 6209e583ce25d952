"""Hostile-driver category "LoRA adapter directories" (issue 23): --adapter DIR (a PEFT adapter the
trainer wrote for the tiny model) mangled at random: adapter_config.json with keys dropped, wrong
types, ranks 0 / negative / fractional / huge, unknown or regular-expression targets, DoRA, patterns,
dropout, truncated or not JSON at all; adapter_model.safetensors truncated, with flipped header bytes,
a tensor renamed, dropped, misshapen or added, the base CRC in its metadata changed; and flags that
contradict the file (--lora-rank, --lora-targets). Every run must train or stop with a clean error
(exit 1, 'error: '), and the adapter directory it read must be left as it was (lost otherwise)."""
import os

import lora_common
from lora_common import adapter_case, join_safetensors, split_safetensors, train_adapter


def setup(ctx):
    ctx.lora_adapter = train_adapter(ctx, "lora_src", ["--lora-rank", "4", "--lora-targets", "all-linear"])


def mangle_config(r, cfg):
    choice = r.randrange(12)
    if choice == 0:
        cfg.pop(r.choice(sorted(cfg)), None)
    elif choice == 1:
        cfg["r"] = r.choice([0, -1, 2.5, 1 << 40, "4", None, 33])
    elif choice == 2:
        cfg["target_modules"] = r.choice([["nope"], [], "c_at.*", "all-linear", [1], None, ["c_attn", "q_proj"], ["c_proj"]])
    elif choice == 3:
        cfg["use_dora"] = True
    elif choice == 4:
        cfg["rank_pattern"] = {"c_attn": 2}
    elif choice == 5:
        cfg["lora_dropout"] = r.choice([0.1, -1, "x"])
    elif choice == 6:
        cfg["lora_alpha"] = r.choice([0, -3, "8", None, 1e30])
    elif choice == 7:
        cfg["peft_type"] = r.choice(["PREFIX_TUNING", 7, None])
    elif choice == 8:
        cfg["layers_to_transform"] = [0]
    elif choice == 9:
        cfg["bias"] = "all"
    elif choice == 10:
        cfg["use_rslora"] = r.choice([True, "yes"])
    else:
        cfg["modules_to_save"] = ["lm_head"]
    return cfg


def mangle_tensors(r, data):
    header, body = split_safetensors(data)
    choice = r.randrange(7)
    keys = [k for k in header if k != "__metadata__"]
    if choice == 0:
        return data[:r.randrange(len(data))]
    if choice == 1:
        b = bytearray(data)
        for _ in range(r.randint(1, 4)):
            b[r.randrange(8, len(data) - len(body))] = r.randrange(256)  # a header byte
        return bytes(b)
    k = r.choice(keys)
    if choice == 2:
        header[k.replace("lora_A", "lora_X") if "lora_A" in k else k + "x"] = header.pop(k)
    elif choice == 3:  # dropped: the data section no longer tiles (or a key is missing)
        header.pop(k)
    elif choice == 4:
        header[k]["shape"] = [header[k]["shape"][1], header[k]["shape"][0]] if r.random() < 0.5 else [1, 1]
    elif choice == 5:
        header["__metadata__"]["llmc_base_crc32"] = r.choice(["00000000", "zz", "deadbeef"])
    else:
        header["base_model.model.transformer.h.9.attn.c_attn.lora_A.weight"] = dict(header[k])
    return join_safetensors(header, body)


def edit_config(r, d):
    return lora_common.edit_config(r, d, mangle_config, '{"r": 4}')


def edit_tensors(r, d):
    p = os.path.join(d, "adapter_model.safetensors")
    data = mangle_tensors(r, open(p, "rb").read())
    open(p, "wb").write(data)
    return "tensors mangled"


def case_adapter(ctx, r, tag):
    return adapter_case(ctx, r, tag, "LoRA", ctx.lora_adapter, [(0.6, edit_config), (0.6, edit_tensors)],
                        [["--lora-rank", "2"], ["--lora-targets", "c_attn"], ["--lora-rank", "4", "--use-rslora", "1"]], 0.2)


CATEGORIES = [("LoRA adapter directories", case_adapter)]
