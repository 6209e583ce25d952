"""Hostile category "HF directories" (issue 22): random malformations of a tiny Hugging Face Llama or
GPT-2 directory (test/hf_tiny.py) given to the trainer as -e, with --save-hf 1 into a fresh -o:
tokenizer files that are FIFOs, directories, symbolic link loops or garbage; config.json floats out
of fp32's range, NaN-like, huge or of the wrong type; sizes the weights do not hold; fields missing
or added; safetensors headers that lie (shapes, dtypes, offsets, lengths); config.json or
model.safetensors that are no regular file. Each case must be a clean error before the first step
or a correct run: never a hang (short timeout), never a failure after steps ran (a late failure
counts as unclean), never a temporary directory left, and the -e directory never changed (lost).
A correct run's HF directory must hold every config.json field of -e that the writer does not set,
each float as read (not null), and the tokenizer files byte for byte. "HF tokenizer files" tries
every tokenizer file name --save-hf copies with every kind of node (a fixed list)."""
import hashlib
import json
import os
import shutil
import struct

import hf_tiny as hf
from hostile_common import base_args, run_judged

TIMEOUT = 20
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                   "generation_config.json", "original/tokenizer.model"]
NODES = ["fifo", "dir", "loop", "dangling", "garbage"]


def setup(ctx):
    ctx.hf_llama = hf.write_llama(ctx.path("hf_base_llama"))
    for name in ("special_tokens_map.json", "generation_config.json"):
        open(os.path.join(ctx.hf_llama, name), "w").write('{"bos_token_id": 1}\n')
    ctx.hf_gpt2 = hf.write_gpt2(ctx.path("hf_base_gpt2"))


def snapshot(d):
    """Every entry under d: its kind and, for a regular file, its content's hash."""
    out = {}
    for root, dirs, files in os.walk(d):
        for n in dirs + files:
            p = os.path.join(root, n)
            st = os.lstat(p)
            kind = st.st_mode & 0o170000
            h = hashlib.sha1(open(p, "rb").read()).hexdigest() if kind == 0o100000 else ""
            out[os.path.relpath(p, d)] = (kind, h)
    return out


def make_node(path, kind, r):
    if os.path.lexists(path):
        os.remove(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        os.mkdir(path)
    elif kind == "loop":
        os.symlink(os.path.basename(path), path)
    elif kind == "dangling":
        os.symlink("no-such-file", path)
    else:
        open(path, "wb").write(bytes(r.randrange(256) for _ in range(r.randint(0, 300))))


def rewrite_header(path, edit):
    """model.safetensors with edit(header dict) applied to its JSON header (data unchanged)."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    edit(head)
    text = json.dumps(head).encode()
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])


def judge(ctx, d, out_dir, before, must_fail, what, config):
    """Runs the trainer on -e d and says what happened (outcome, note)."""
    args = base_args(ctx) + ["-e", d, "-x", "2", "-n", "2", "-o", out_dir, "--save-hf", "1"]
    settled = run_judged(args, out_dir, what, must_fail, lambda: snapshot(d) == before, "directory", TIMEOUT)
    if settled:
        return settled
    saved = os.path.join(out_dir, "model_00000002_hf")
    try:
        got = json.load(open(os.path.join(saved, "config.json")))
    except (OSError, ValueError) as e:
        return "silent", f"{what}: exit 0 without a readable {saved}/config.json ({e})"
    for k, v in config.items():
        if k not in got:
            return "silent", f"{what}: config.json field {k} dropped by --save-hf"
        if isinstance(v, float) and not (isinstance(got[k], (int, float)) and abs(got[k] - v) <= 1e-6 * abs(v)):
            return "silent", f"{what}: {k} {v} written as {got[k]}"
    for name in TOKENIZER_FILES:
        src = os.path.join(d, name)
        if os.path.isfile(src) and not os.path.islink(src):
            dst = os.path.join(saved, name)
            if not os.path.isfile(dst) or open(dst, "rb").read() != open(src, "rb").read():
                return "silent", f"{what}: tokenizer file {name} not copied byte for byte"
    return "ok", what


FLOATS = {"llama": ["rms_norm_eps", "rope_theta", "rope_scaling.factor", "rope_scaling.low_freq_factor",
                    "rope_scaling.high_freq_factor"], "gpt2": ["layer_norm_epsilon"]}
SIZES = {"llama": ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads", "head_dim"],
         "gpt2": ["vocab_size", "n_embd", "n_layer", "n_head", "n_positions", "n_inner"]}
REQUIRED = {"llama": ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                      "max_position_embeddings"], "gpt2": ["vocab_size", "n_embd", "n_layer", "n_head", "n_positions"]}


def case_hf(ctx, r, tag):
    arch = r.choice(["llama", "gpt2"])
    d = ctx.fresh(f"hf_{arch}")
    shutil.copytree(ctx.hf_llama if arch == "llama" else ctx.hf_gpt2, d, symlinks=True)
    cfg_path, st_path = os.path.join(d, "config.json"), os.path.join(d, "model.safetensors")
    config = json.load(open(cfg_path))
    kind = r.choice(["tokenizer", "float", "float", "size", "missing", "extra", "header", "header", "node"])
    if kind == "tokenizer" and arch == "gpt2":
        kind = "extra"
    must_fail, what = True, kind
    if kind == "tokenizer":
        name, node = r.choice(TOKENIZER_FILES), r.choice(NODES)
        if name.startswith("original/") and r.random() < 0.4:
            name = "original"  # the directory itself: a file, FIFO or link where a directory belongs
            node = r.choice(["fifo", "loop", "dangling", "garbage"])
        make_node(os.path.join(d, name), node, r)
        # garbage content is a file to copy, byte for byte; tokenizer.model is also read for samples (-s 0 here)
        must_fail, what = node != "garbage", f"tokenizer {name} as {node}"
    elif kind == "float":
        field = r.choice(FLOATS[arch])
        value = r.choice([1e39, 1e-50, 1e-39, -1.0, 0.0, 1e308, 3.0e38, 2.0e-38, "1.5", True, None, [1.0], 7.5, 1e-3])
        obj, key = (config["rope_scaling"], field.split(".")[1]) if "." in field else (config, field)
        obj[key] = value
        in_fp32 = isinstance(value, float) and 1.1754943508222875e-38 <= value <= 3.4028234663852886e38
        if arch == "gpt2":
            must_fail = value is not None  # (null: refused or the default, either is fine)
        elif key in ("rms_norm_eps", "rope_theta") and value is None:
            must_fail = False  # null: transformers' default
        elif key == "low_freq_factor" and in_fp32:
            must_fail = not value < obj["high_freq_factor"]
        elif key == "high_freq_factor" and in_fp32:
            must_fail = not value > obj["low_freq_factor"]
        else:
            must_fail = not in_fp32 or (key == "rope_theta" and value <= 1)
        what = f"{field} = {value!r}"
        json.dump(config, open(cfg_path, "w"))
    elif kind == "size":
        field = r.choice(SIZES[arch])
        old = config.get(field, 4 * hf.C if field == "n_inner" else hf.HS)
        value = r.choice([old + 1, old - 1, old * 2, 4096, 1 << 20, 0, -1, 1.5, "32"])
        config[field] = value
        must_fail = value != old
        if arch == "gpt2" and field == "n_head":  # no tensor's shape holds it: another head count is another model
            must_fail = not (type(value) is int and value > 0)
        what = f"{field} {old} -> {value!r}"
        json.dump(config, open(cfg_path, "w"))
    elif kind == "missing":
        field = r.choice(sorted(config))
        del config[field]
        must_fail = field in REQUIRED[arch]
        what = f"{field} removed"
        json.dump(config, open(cfg_path, "w"))
    elif kind == "extra":
        field = r.choice(["llmc_hostile_note", "custom_pipelines", "_name_or_path", "quantization_config_x"])
        config[field] = r.choice([1, "text", {"nested": [1, 2]}, None, 2.5])
        must_fail, what = False, f"extra field {field}"
        json.dump(config, open(cfg_path, "w"))
    elif kind == "header":
        lie = r.choice(["shape_swap", "shape_grow", "dtype", "offsets", "length", "truncate", "drop", "rename"])
        raw = open(st_path, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        keys = sorted(k for k in json.loads(raw[8:8 + n]) if k != "__metadata__")
        key = r.choice(keys)
        if lie == "length":
            open(st_path, "wb").write(struct.pack("<Q", r.choice([n + 1, n - 1, 1 << 40, 0])) + raw[8:])
        elif lie == "truncate":
            open(st_path, "wb").write(raw[:r.randrange(len(raw))])
        else:
            def edit(h):
                t = h[key]
                if lie == "shape_swap" and t["shape"] != list(reversed(t["shape"])):
                    t["shape"] = list(reversed(t["shape"]))
                elif lie == "shape_swap":  # square or 1-D: another shape of the same size
                    t["shape"] = t["shape"] + [1] if len(t["shape"]) == 1 else [t["shape"][0] // 2, t["shape"][1] * 2]
                elif lie == "shape_grow":
                    t["shape"][0] += 1
                elif lie == "dtype":
                    t["dtype"] = r.choice(["F64", "I8", "F8_E4M3", "Q4", "f32"])
                elif lie == "offsets":
                    t["data_offsets"] = [t["data_offsets"][0], t["data_offsets"][1] + r.choice([-4, 4, 1 << 40])]
                elif lie == "drop":
                    del h[key]
                else:
                    h[key + ".x"] = h.pop(key)
            rewrite_header(st_path, edit)
        what = f"safetensors header: {lie} ({key})"
    else:
        target = r.choice(["config.json", "model.safetensors"])
        node = r.choice(["fifo", "dir", "loop", "dangling"])
        make_node(os.path.join(d, target), node, r)
        what = f"{target} as {node}"
    before = snapshot(d)
    return judge(ctx, d, ctx.fresh("hf_out"), before, must_fail, f"{arch}: {what}", {} if must_fail else config)


def case_tokenizer_file(ctx, r, tag, k):
    name, node = TOKENIZER_FILES[k // len(NODES)], NODES[k % len(NODES)]
    d = ctx.fresh("hf_tok")
    shutil.copytree(ctx.hf_llama, d, symlinks=True)
    make_node(os.path.join(d, name), node, r)
    before = snapshot(d)
    config = json.load(open(os.path.join(d, "config.json")))
    return judge(ctx, d, ctx.fresh("hf_tok_out"), before, node != "garbage", f"{name} as {node}",
                 config if node == "garbage" else {})


CATEGORIES = [
    ("HF directories", case_hf),
    ("HF tokenizer files", case_tokenizer_file, len(TOKENIZER_FILES) * len(NODES)),
]
