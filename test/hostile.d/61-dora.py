"""Hostile-driver category "DoRA adapter directories" (issue 23 item 2): --adapter DIR (a DoRA adapter the
trainer wrote for the tiny model, --use-dora 1) mangled at random: a magnitude vector dropped, renamed,
misshapen ([out - 1], [out, 1], [1], []), of another dtype, its values NaN, infinite, zero or negative;
use_dora flipped to false or to a non-boolean; and --use-dora 1 / 2 given with it. Every run must train
(or stop with non-finite losses reported as an error) or stop with a clean error (exit 1, 'error: '),
and the adapter directory it read must be left as it was (lost otherwise)."""
import json
import os
import struct

from lora_common import adapter_case, join_safetensors, split_safetensors, train_adapter


def setup(ctx):
    flags = ["--lora-rank", "4", "--lora-targets", "all-linear", "--use-dora", "1"]
    ctx.dora_adapter = train_adapter(ctx, "dora_src", flags)


def mangle_magnitudes(r, data):
    header, body = split_safetensors(data)
    body = bytearray(body)
    mags = [k for k in header if k.endswith("lora_magnitude_vector")]
    k = r.choice(mags)
    e = header[k]
    choice = r.randrange(6)
    if choice == 0:
        header.pop(k)
    elif choice == 1:
        header[k.replace("lora_magnitude_vector", "lora_magnitude")] = header.pop(k)
    elif choice == 2:
        e["shape"] = r.choice([[e["shape"][0] - 1], [e["shape"][0], 1], [1], [], [e["shape"][0] // 2, 2]])
    elif choice == 3:
        e["dtype"] = r.choice(["F16", "BF16", "I32", "F64", "X"])
    else:  # values (the header stays valid)
        b0, b1 = e["data_offsets"]
        value = r.choice([float("nan"), float("inf"), 0.0, -1.0, 1e38])
        for i in range(b0, b1, 4):
            if choice == 5 or r.random() < 0.2:
                body[i:i + 4] = struct.pack("<f", value)
    return join_safetensors(header, body), k


def edit_magnitude(r, d):
    p = os.path.join(d, "adapter_model.safetensors")
    data, key = mangle_magnitudes(r, open(p, "rb").read())
    open(p, "wb").write(data)
    return f"magnitude {key.split('.h.')[-1]} mangled"


def edit_use_dora(r, d):
    p = os.path.join(d, "adapter_config.json")
    cfg = json.load(open(p))
    cfg["use_dora"] = r.choice([False, None, "yes", 1])
    open(p, "w").write(json.dumps(cfg))
    return f"use_dora {cfg['use_dora']!r}"


def case_dora_adapter(ctx, r, tag):
    return adapter_case(ctx, r, tag, "DoRA", ctx.dora_adapter, [(0.7, edit_magnitude), (0.3, edit_use_dora)],
                        [["--use-dora", "1"], ["--use-dora", "2"], ["--lora-rank", "4", "--use-dora", "1"]], 0.3)


CATEGORIES = [("DoRA adapter directories", case_dora_adapter)]
