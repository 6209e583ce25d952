#!/usr/bin/env python3
"""Hugging Face LlamaForCausalLM directories (llmc/formats/hf.c's Llama row), issue 11 item 3.

transformers is not installed: the test builds HF directories itself with the `safetensors`
package from the PyTorch reference's weights (dev/reference/train_llama3.py, 2 layers, C 64,
NH 4, NKV 2, V 1000), in HF's names and layout: q_proj/k_proj rows in HF's rotate-half order.
That order is checked first against HF's RoPE (rotate_half) computed here, so the directory is
what transformers would hold for this model. Then:
- -e DIR trains with the same losses as the reference's llmc file (bit for bit) and the PyTorch
  reference's 10-step trajectory; BF16 and F16 directories load as their rounded weights;
- --save-hf 1 and ./hf_convert: HF -> train -> HF holds the trained weights exactly; llmc -> HF
  equals the directory built here tensor for tensor; sharded directories (index.json) read and,
  above the shard limit, written; a tied head (tie_word_embeddings) round-trips;
- Llama 3's tokenizer in ./generate, the trainer's samples and ./tokenizer (item 2; a tiktoken rank file of 744 ranks made here, Llama 3's
  256 special tokens after them: V 1000): found in the HF directory's original/tokenizer.model, the
  prompt encoded as tiktoken encodes it (special names included) after <|begin_of_text|>, greedy
  continuation and its text equal PyTorch's / tiktoken's; a bad rank file and a Llama without its
  tokenizer are clear errors;
- the README's fine-tune path end to end: HF directory -> train_gpt_cpu --save-hf 1 -> ./generate
  -e model_NNNNNNNN_hf --tokenizer <HF directory>; a BF16 directory with --checkpoint-bf16 1: bf16
  checkpoint and BF16 --save-hf directory holding the same weights;
- --save-hf copies the -e directory's tokenizer files (tokenizer.json, tokenizer_config.json,
  special_tokens_map.json, generation_config.json, original/tokenizer.model) byte for byte into
  model_NNNNNNNN_hf, so ./generate reads it without --tokenizer; a run from an llmc file copies none
  and says how to add them;
- bad directories are clear errors: missing tensor, wrong shape, unknown dtype, unknown
  architecture, an index naming a missing shard, unsupported rope_scaling, biases.
"""
import base64
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "dev", "reference"))
from testlib import expect_error, failed_count, report, write_shard  # noqa: E402
import train_llama3 as ll  # noqa: E402

PY = "/usr/bin/python3"
B, T, V, C, L, NH, NKV, F, STEPS = 4, 32, 1000, 64, 2, 4, 2, 256, 10
HS = C // NH


def run(cmd, env=None, text=True):
    return subprocess.run(cmd, capture_output=True, text=text, timeout=600,
                          env=None if env is None else {**os.environ, **env})


def reference(tmp):
    model, state = os.path.join(tmp, "ref.bin"), os.path.join(tmp, "state.bin")
    p = run([PY, "dev/reference/train_llama3.py", "--depth", str(L), "--channels", str(C), "--heads", str(NH),
             "--kv-heads", str(NKV), "--max-seq-len", "64", "--vocab", str(V), "--seed", "42", "--batch-size", str(B),
             "--seq-len", str(T), "--steps", str(STEPS), "--save-model", model, "--debug-state", state])
    if p.returncode != 0:
        sys.exit(f"reference failed: {p.stderr[-2000:]}")
    raw = open(state, "rb").read()
    P = (os.path.getsize(model) - 1024) // 4
    x = np.frombuffer(raw, "<i4", B * T, 1024)
    y = np.frombuffer(raw, "<i4", B * T, 1024 + 4 * B * T)
    off = 1024 + 8 * B * T + 4 * (B * T * V + 1 + P)
    return model, np.frombuffer(raw, "<f4", STEPS, off), list(x) + [int(y[-1])]


def read_llmc(path):
    """(config, {name: array}) of llmc's Llama checkpoint (fp32 or bf16), in the reference's table shapes."""
    raw = open(path, "rb").read()
    h = struct.unpack("<256i", raw[:1024])
    f32 = lambda i: struct.unpack("<f", struct.pack("<i", h[i]))[0]  # noqa: E731
    cfg = ll.LlamaConfig(h[3], h[4], h[6], h[7], h[8], h[9], h[10], eps=f32(16), theta=f32(17), factor=f32(18),
                         low=f32(19), high=f32(20), original=h[21])
    p = np.frombuffer(raw, "<f4", offset=1024) if h[12] == 0 else (  # slot 12: 1 = bf16
        np.frombuffer(raw, "<u2", offset=1024).astype("<u4") << 16).view("<f4")
    out, o = {}, 0
    for name, shape, _, _ in ll.param_table(cfg):
        k = int(np.prod(shape))
        out[name] = p[o:o + k].reshape(shape).copy()
        o += k
    return cfg, out


def to_hf_rows(w, heads):
    """Our interleaved RoPE rows (pairs 2i, 2i+1 per head) -> HF's rotate-half order."""
    return w.reshape(heads, HS // 2, 2, -1).transpose(0, 2, 1, 3).reshape(heads * HS, -1)


def hf_tensors(cfg, t, tied=False):
    QKV = (NH + 2 * NKV) * HS
    out = {"model.embed_tokens.weight": t["wte"][:V], "model.norm.weight": t["lnfw"]}
    for l in range(L):
        q, k, v = np.split(t["qkvw"][l].reshape(QKV, C), [NH * HS, (NH + NKV) * HS])
        p = f"model.layers.{l}."
        out[p + "self_attn.q_proj.weight"] = to_hf_rows(q, NH)
        out[p + "self_attn.k_proj.weight"] = to_hf_rows(k, NKV)
        out[p + "self_attn.v_proj.weight"] = v
        out[p + "self_attn.o_proj.weight"] = t["attprojw"][l]
        out[p + "input_layernorm.weight"] = t["ln1w"][l]
        out[p + "post_attention_layernorm.weight"] = t["ln2w"][l]
        out[p + "mlp.gate_proj.weight"] = t["fcw"][l][:F]
        out[p + "mlp.up_proj.weight"] = t["fcw"][l][F:]
        out[p + "mlp.down_proj.weight"] = t["fcprojw"][l]
    if not tied:
        out["lm_head.weight"] = t["lm_head"][:V]
    return {k: np.ascontiguousarray(a, dtype=np.float32) for k, a in out.items()}


def hf_config(cfg, tied=False, **extra):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": C,
         "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV,
         "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.eps, "rope_theta": cfg.theta,
         "rope_scaling": {"rope_type": "llama3", "factor": cfg.factor, "low_freq_factor": cfg.low,
                          "high_freq_factor": cfg.high, "original_max_position_embeddings": cfg.original},
         "hidden_act": "silu", "tie_word_embeddings": tied, "torch_dtype": "float32"}
    c.update(extra)
    return c


def write_dir(path, config, tensors, shards=1):
    os.makedirs(path)
    json.dump(config, open(os.path.join(path, "config.json"), "w"))
    if shards == 1:
        save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        return
    names = list(tensors)
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, os.path.join(path, fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    json.dump({"metadata": {"total_size": sum(a.nbytes for a in tensors.values())}, "weight_map": weight_map},
              open(os.path.join(path, "model.safetensors.index.json"), "w"))


def rotate_half_matches(cfg, t):
    """HF's RoPE (rotate_half, cos/sin of cat(freqs, freqs)) on the HF rows equals the reference's
    interleaved RoPE on ours, rows permuted: the directory is what transformers computes with."""
    x = torch.randn(T, C, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    q = torch.from_numpy(t["qkvw"][0][:NH * HS].astype(np.float64))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * ll.rope_inv_freq(cfg)[None, :]
    ours = ll.rope((x @ q.t()).view(T, NH, HS).transpose(0, 1), ang.cos(), ang.sin())  # (NH, T, HS)
    qh = torch.from_numpy(to_hf_rows(t["qkvw"][0][:NH * HS], NH).astype(np.float64))
    y = (x @ qh.t()).view(T, NH, HS).transpose(0, 1)
    cos, sin = torch.cat((ang.cos(), ang.cos()), -1), torch.cat((ang.sin(), ang.sin()), -1)
    rot = torch.cat((-y[..., HS // 2:], y[..., :HS // 2]), -1)
    hf = y * cos + rot * sin
    # HF channel p * HS/2 + i of a head is our channel 2i + p
    back = hf.view(NH, T, 2, HS // 2).transpose(-1, -2).reshape(NH, T, HS)
    return torch.allclose(back, ours, rtol=1e-12, atol=1e-12)


def train(init, shard, outdir, steps=STEPS, extra=(), env=None, text=True):
    return run(["./train_gpt_cpu", "-e", init, "-i", shard, "-j", shard, "-b", str(B), "-t", str(T), "-x", str(steps),
                "-k", "constant", "-l", "1e-3", "-c", "0.1", "--shuffle", "0", "-v", "0", "-s", "0", "-r", "0",
                "-o", outdir] + list(extra), env=env, text=text)


def losses_of(outdir):
    with open(os.path.join(outdir, "log.jsonl")) as f:
        return [r["train_loss"] for r in map(json.loads, f) if "train_loss" in r]


def tensors_equal(a, b):
    x, y = load_file(a), load_file(b)
    return x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)


def dir_tensors(path):
    if os.path.exists(os.path.join(path, "model.safetensors")):
        return load_file(os.path.join(path, "model.safetensors"))
    out = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, f)))
    return out


SPECIALS = (["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
             "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
             "<|eot_id|>", "<|python_tag|>"] + [f"<|reserved_special_token_{2 + i}|>" for i in range(245)])
LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def write_rank_file(path):
    """A Llama 3-style tiktoken rank file of V - 256 ranks (the 256 bytes, then prefixes of words'
    pieces, then letter pairs) and tiktoken's Encoding of it with Llama 3's pattern and specials."""
    import tiktoken
    ranks = {bytes([i]): i for i in range(256)}
    words = "the king queen shall will not be more than one thousand hello world Romeo Juliet love night".split()
    extra = [(" " + w).encode()[:k] for w in words for k in range(2, len(w) + 2)]
    extra += [w.encode()[:k] for w in words for k in range(2, len(w) + 1)]
    extra += [bytes([a, b]) for a in range(97, 123) for b in range(97, 123)]
    for tok in extra:
        if tok not in ranks and len(ranks) < V - 256:
            ranks[tok] = len(ranks)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
    return tiktoken.Encoding("llama3-test", pat_str=LLAMA3_PAT, mergeable_ranks=ranks,
                             special_tokens={name: len(ranks) + k for k, name in enumerate(SPECIALS)})


def torch_greedy(model_path, ids, n, stops):
    """PyTorch's greedy continuation of ids by the Llama in llmc's checkpoint (first maximum over V),
    stopping after n tokens or at a token in stops (not returned)."""
    cfg, t = read_llmc(model_path)
    model = ll.Llama(cfg, {k: torch.from_numpy(a) for k, a in t.items()})
    ids, out = list(ids), []
    with torch.no_grad():
        while len(out) < n and len(ids) < cfg.max_seq_len:
            nxt = int(torch.argmax(model(torch.tensor([ids]))[0][0, -1, :V]))
            if nxt in stops:
                break
            out.append(nxt)
            ids.append(nxt)
    return out


def generate(args):
    return subprocess.run(["./generate", "--temperature", "0", "-g", "8"] + args, capture_output=True, timeout=600)


def check_generate(name, args, enc, prompt, model, tokenizer_path):
    """./generate with Llama 3's tokenizer: the prompt's ids, the continuation and its text."""
    ids = [enc.encode_single_token("<|begin_of_text|>")] + enc.encode(prompt, allowed_special="all")
    want = torch_greedy(model, ids, 8, {enc.encode_single_token("<|end_of_text|>"), enc.encode_single_token("<|eot_id|>")})
    p = generate(args + ["--prompt", prompt])
    err = p.stderr.decode(errors="replace")
    ok = p.returncode == 0 and f"prompt: {len(ids)} tokens" in err and f"tokenizer: {tokenizer_path}" in err
    report(ok and p.stdout == prompt.encode() + enc.decode_bytes(want), name,
           f"stdout {p.stdout!r}, want {prompt.encode() + enc.decode_bytes(want)!r} ({want}): {err[-600:]}")


def safetensors_dtypes(path):
    raw = open(path, "rb").read()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def tokenizer_and_finetune(tmp, hf, ref, shard, run_hf):
    """Llama 3's tokenizer in ./generate, and the fine-tune path of the README end to end."""
    tok = os.path.join(hf, "original", "tokenizer.model")
    enc = write_rank_file(tok)
    prompt = "the king shall love Juliet<|eot_id|> hello world, 1234!"
    check_generate("./generate -e <HF Llama dir>: finds original/tokenizer.model, encodes the prompt as tiktoken "
                   "(<|begin_of_text|> first, special names as tokens), greedy text equals PyTorch's + tiktoken's",
                   ["-e", hf], enc, prompt, ref, tok)
    check_generate("fine-tune end to end: -e <HF dir> -> --save-hf 1 -> ./generate -e model_00000010_hf --tokenizer "
                   "<HF dir>: the trained model's greedy text", ["-e", os.path.join(run_hf, "model_00000010_hf"),
                   "--tokenizer", hf], enc, "Romeo, Romeo", os.path.join(run_hf, "model_00000010.bin"), tok)
    check_generate("./generate --tokenizer <tokenizer.model> with an llmc Llama file, empty prompt (<|begin_of_text|> "
                   "alone)", ["-e", ref, "--tokenizer", tok], enc, "", ref, tok)
    # ./tokenizer reads the directory as Llama 3's too
    text, shard_out = os.path.join(tmp, "prompt.txt"), os.path.join(tmp, "prompt_ids.bin")
    open(text, "w").write(prompt)
    p = run(["./tokenizer", "encode", "-q", "--tokenizer", hf, text, shard_out])
    got = list(memoryview(open(shard_out, "rb").read()[1024:]).cast("H")) if p.returncode == 0 else None
    report(got == enc.encode_ordinary(prompt), "./tokenizer encode --tokenizer <HF Llama dir>: tiktoken's ids",
           f"{got} vs {enc.encode_ordinary(prompt)}: {p.stderr[-400:]}")
    # the trainer's samples (-s) decode with it too (found in -e's directory): the text of the ids that a
    # decode-only tokenizer file (token i reads "<i>", starting token <|begin_of_text|>) shows
    ids_tok = os.path.join(tmp, "ids_tok.bin")
    with open(ids_tok, "wb") as f:
        f.write(struct.pack("<256I", *([20240328, 2, V, enc.encode_single_token("<|begin_of_text|>")] + [0] * 252)))
        f.write(b"".join(bytes([len(f"<{i}>")]) + f"<{i}>".encode() for i in range(V)))
    sample = ["-s", "1", "-g", "16"]
    p1 = train(hf, shard, os.path.join(tmp, "samples_ids"), steps=1, extra=sample + ["--tokenizer", ids_tok], text=False)
    p2 = train(hf, shard, os.path.join(tmp, "samples_text"), steps=1, extra=sample, text=False)
    between = lambda out: out.split(b"generating:\n---\n")[-1].split(b"\n---\n")[0]  # noqa: E731
    ids = [int(x) for x in between(p1.stdout).replace(b">", b"").split(b"<")[1:]] if p1.returncode == 0 else []
    want = bytes(c for c in enc.decode_bytes(ids) if c >= 0x20 or c in b"\n\t")
    ok = p1.returncode == 0 and p2.returncode == 0 and len(ids) == 16
    report(ok and between(p2.stdout) == want, "train_gpt_cpu -e <HF Llama dir> -s: samples decoded with its "
           "original/tokenizer.model", f"{ids} -> {want!r}: {(p2.stdout + p2.stderr)[-600:]!r}")
    bad = os.path.join(tmp, "bad_tokenizer.model")
    lines = open(tok).read().splitlines()
    open(bad, "w").write("\n".join(lines[:300] + ["not-base64! 300"] + lines[301:]) + "\n")
    p = generate(["-e", ref, "--tokenizer", bad, "--prompt", "hi"])
    err = p.stderr.decode(errors="replace")
    report(p.returncode == 1 and "error: " in err and "bad_tokenizer.model', line 301" in err and not p.stdout,
           "./generate --tokenizer <bad rank file>: a clear error naming the file and line", err[-400:])
    p = generate(["-e", ref, "--tokenizer", os.path.join(tmp, "nowhere"), "--prompt", "hi"])
    err = p.stderr.decode(errors="replace")
    report(p.returncode == 1 and "error: " in err and "nowhere" in err, "./generate --tokenizer <missing>: a clear error",
           err[-400:])
    p = generate(["-e", ref, "--prompt", "hi"])
    err = p.stderr.decode(errors="replace")
    report(p.returncode == 1 and "error: " in err and "tokenizer.model" in err and not p.stdout,
           "./generate -e <Llama file> without its tokenizer: a clear error saying what to give", err[-400:])
    # a BF16 HF directory with --checkpoint-bf16 1 --save-hf 1: the bf16 checkpoint and the BF16 directory hold
    # the same weights, and the losses are those of the run without --checkpoint-bf16
    d = os.path.join(tmp, "hf_BF16")
    p1 = train(d, shard, os.path.join(tmp, "run_bf16"), steps=2, extra=["--checkpoint-bf16", "1", "--save-hf", "1"])
    p2 = train(d, shard, os.path.join(tmp, "run_bf16_fp32ckpt"), steps=2)
    ok = p1.returncode == 0 and p2.returncode == 0
    ok = ok and losses_of(os.path.join(tmp, "run_bf16")) == losses_of(os.path.join(tmp, "run_bf16_fp32ckpt"))
    model = os.path.join(tmp, "run_bf16", "model_00000002.bin")
    saved = os.path.join(tmp, "run_bf16", "model_00000002_hf")
    back = os.path.join(tmp, "run_bf16_back.bin")
    p3 = run(["./hf_convert", saved, back, "--format", "llmc"])
    ok = ok and p3.returncode == 0 and struct.unpack("<i", open(model, "rb").read()[48:52])[0] == 1
    ok = ok and open(back, "rb").read() == open(model, "rb").read()
    ok = ok and safetensors_dtypes(os.path.join(saved, "model.safetensors")) == {"BF16"}
    report(ok, "-e <BF16 HF dir> --checkpoint-bf16 1 --save-hf 1: bf16 checkpoint and BF16 directory hold the same "
           "weights; losses as without --checkpoint-bf16", (p1.stdout + p1.stderr + p2.stderr + p3.stdout + p3.stderr)[-1500:])


def tokenizer_files_saved(tmp, hf, ref, shard):
    """--save-hf 1 from an HF directory with tokenizer files, and from an llmc file."""
    src = os.path.join(tmp, "hf_tok")
    shutil.copytree(hf, src)  # holds original/tokenizer.model (tokenizer_and_finetune wrote it)
    names = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"]
    for i, name in enumerate(names):  # contents unlike each other, not parsed by llmc
        with open(os.path.join(src, name), "w") as f:
            json.dump({"file": name, "n": i, "text": "caf\u00e9 " * (i + 1)}, f)
    names.append("original/tokenizer.model")
    out = os.path.join(tmp, "run_tok")
    p = train(src, shard, out, steps=1, extra=["--save-hf", "1", "-n", "1", "-s", "0"])
    saved = os.path.join(out, "model_00000001_hf")
    same = [n for n in names if os.path.exists(os.path.join(saved, n))
            and open(os.path.join(saved, n), "rb").read() == open(os.path.join(src, n), "rb").read()]
    report(p.returncode == 0 and same == names and "holds no tokenizer files" not in p.stdout,
           "--save-hf 1 from an HF directory with tokenizer files: each copied byte for byte into model_00000001_hf",
           f"copied {same} of {names}: {(p.stdout + p.stderr)[-600:]}")
    g1, g2 = generate(["-e", saved, "--prompt", "Romeo"]), generate(["-e", saved, "--tokenizer", src, "--prompt", "Romeo"])
    report(g1.returncode == 0 and g1.stdout == g2.stdout, "./generate -e <--save-hf directory> without --tokenizer: "
           "the copied tokenizer, the same text as --tokenizer <source>", (g1.stdout + g1.stderr)[-400:])
    out = os.path.join(tmp, "run_llmc")
    p = train(ref, shard, out, steps=1, extra=["--save-hf", "1", "-n", "1", "-s", "0"])
    saved = os.path.join(out, "model_00000001_hf")
    left = [n for n in names + ["tokenizer.model"] if os.path.exists(os.path.join(saved, n))]
    report(p.returncode == 0 and os.path.exists(os.path.join(saved, "config.json")) and not left
           and "holds no tokenizer files (the run did not start from a Hugging Face directory (-e))" in p.stdout
           and "copy the model's tokenizer.json" in p.stdout,
           "--save-hf 1 from an llmc file: no tokenizer files, and a note saying how to add them",
           f"found {left}: {p.stdout[-600:]}")


def error_check(name, cmd, pattern):
    expect_error(name, run(cmd), pattern)


def main():
    tmp = tempfile.mkdtemp(prefix="llmc_hf_llama_")
    try:
        ref, ref_losses, tokens = reference(tmp)
        shard = os.path.join(tmp, "batch.bin")
        write_shard(shard, tokens)
        cfg, t = read_llmc(ref)
        report(rotate_half_matches(cfg, t), "HF's rotate-half RoPE on the permuted q rows equals the reference's "
               "interleaved RoPE (the permutation the directory needs)")
        tensors = hf_tensors(cfg, t)
        hf = os.path.join(tmp, "hf")
        write_dir(hf, hf_config(cfg), tensors)

        # -e DIR: the reference's losses
        p1, p2 = train(ref, shard, os.path.join(tmp, "run_bin")), train(hf, shard, os.path.join(tmp, "run_hf"),
                                                                        extra=["--save-hf", "1", "-n", "10"])
        ok = p1.returncode == 0 and p2.returncode == 0
        got = losses_of(os.path.join(tmp, "run_hf")) if ok else []
        report(ok and got == losses_of(os.path.join(tmp, "run_bin")), "-e <HF Llama dir> trains with the losses of "
               "the reference's llmc file, bit for bit", (p1.stdout + p1.stderr + p2.stdout + p2.stderr)[-1500:])
        report(ok and all(abs(g - r) <= 1e-4 * r for g, r in zip(got, ref_losses)) and len(got) == STEPS,
               "-e <HF Llama dir>: 10-step trajectory equals the PyTorch reference's", f"{got} vs {list(ref_losses)}")
        # HF -> train -> HF: --save-hf holds the trained weights exactly
        run_hf = os.path.join(tmp, "run_hf")
        back = os.path.join(tmp, "back.bin")
        p = run(["./hf_convert", os.path.join(run_hf, "model_00000010_hf"), back, "--format", "llmc"])
        ok = p.returncode == 0 and open(back, "rb").read()[1024:] == open(os.path.join(run_hf, "model_00000010.bin"),
                                                                          "rb").read()[1024:]
        report(ok, "HF -> train -> --save-hf 1 -> llmc file: the trained weights exactly", (p.stdout + p.stderr)[-800:])
        # llmc -> HF equals the directory built here
        out = os.path.join(tmp, "from_llmc_hf")
        p = run(["./hf_convert", ref, out, "--format", "hf"])
        cj = json.load(open(os.path.join(out, "config.json"))) if p.returncode == 0 else {}
        ok = p.returncode == 0 and tensors_equal(os.path.join(out, "model.safetensors"),
                                                 os.path.join(hf, "model.safetensors"))
        ok = ok and cj.get("architectures") == ["LlamaForCausalLM"] and cj.get("num_key_value_heads") == NKV
        report(ok, "llmc file -> HF directory: the tensors (rotate-half q/k rows) and config of the directory built "
               "from the reference", (p.stdout + p.stderr)[-800:])
        # BF16 and F16 tensors load as their rounded values
        for dtype, tdt in (("BF16", torch.bfloat16), ("F16", torch.float16)):
            d = os.path.join(tmp, f"hf_{dtype}")
            os.makedirs(d)
            json.dump(hf_config(cfg), open(os.path.join(d, "config.json"), "w"))
            from safetensors.torch import save_file as save_torch
            save_torch({k: torch.from_numpy(a).to(tdt) for k, a in tensors.items()},
                       os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
            out = os.path.join(tmp, f"{dtype}.bin")
            p = run(["./hf_convert", d, out, "--format", "llmc"])
            ok = p.returncode == 0
            if ok:
                _, got = read_llmc(out)
                want = {k: torch.from_numpy(a).to(tdt).float().numpy() for k, a in t.items()}
                ok = all(np.array_equal(got[k], want[k]) for k in t)
            report(ok, f"{dtype} HF Llama directory loads as the rounded weights", (p.stdout + p.stderr)[-800:])
        # sharded: read (index.json), and written above the shard limit
        sh = os.path.join(tmp, "hf_sharded")
        write_dir(sh, hf_config(cfg), tensors, shards=3)
        out = os.path.join(tmp, "sharded.bin")
        p = run(["./hf_convert", sh, out, "--format", "llmc"])
        report(p.returncode == 0 and open(out, "rb").read()[1024:] == open(ref, "rb").read()[1024:],
               "sharded HF Llama directory (3 shards + index) reads as the reference's weights", (p.stdout + p.stderr)[-800:])
        out = os.path.join(tmp, "written_sharded")
        p = run(["./hf_convert", ref, out, "--format", "hf"], env={"LLMC_HF_SHARD_BYTES": "300000"})
        files = sorted(os.listdir(out)) if p.returncode == 0 else []
        ok = "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) > 1
        ok = ok and dir_tensors(out).keys() == tensors.keys() and all(
            np.array_equal(dir_tensors(out)[k], tensors[k]) for k in tensors)
        again = os.path.join(tmp, "sharded_again.bin")
        p2 = run(["./hf_convert", out, again, "--format", "llmc"]) if ok else p
        ok = ok and p2.returncode == 0 and open(again, "rb").read()[1024:] == open(ref, "rb").read()[1024:]
        report(ok, "above LLMC_HF_SHARD_BYTES the HF directory is written as shards + index, and reads back",
               f"{files} {(p.stdout + p.stderr + p2.stdout + p2.stderr)[-800:]}")
        # tied head
        tied = os.path.join(tmp, "hf_tied")
        write_dir(tied, hf_config(cfg, tied=True), hf_tensors(cfg, t, tied=True))
        mid, out = os.path.join(tmp, "tied.bin"), os.path.join(tmp, "tied_again")
        p1 = run(["./hf_convert", tied, mid, "--format", "llmc"])
        p2 = run(["./hf_convert", mid, out, "--format", "hf"])
        ok = p1.returncode == 0 and p2.returncode == 0 and tensors_equal(os.path.join(tied, "model.safetensors"),
                                                                         os.path.join(out, "model.safetensors"))
        ok = ok and json.load(open(os.path.join(out, "config.json")))["tie_word_embeddings"] is True
        p3 = train(tied, shard, os.path.join(tmp, "run_tied"), steps=2)
        report(ok and p3.returncode == 0, "tied head (tie_word_embeddings, no lm_head): HF -> llmc -> HF and training",
               (p1.stdout + p1.stderr + p2.stdout + p2.stderr + p3.stdout + p3.stderr)[-800:])

        tokenizer_and_finetune(tmp, hf, ref, shard, run_hf)
        tokenizer_files_saved(tmp, hf, ref, shard)

        # bad directories: clear errors naming what is wrong
        def bad_dir(name, config=None, drop=None, change=None, shards=1):
            d = os.path.join(tmp, "bad_" + name.replace(" ", "_"))
            ts = dict(tensors)
            if drop:
                del ts[drop]
            if change:
                ts.update(change)
            write_dir(d, config or hf_config(cfg), ts, shards=shards)
            return d
        cases = [
            ("missing tensor", bad_dir("missing", drop="model.layers.1.self_attn.k_proj.weight"),
             "has no tensor 'model.layers.1.self_attn.k_proj.weight'"),
            ("wrong shape", bad_dir("shape", change={"model.layers.0.self_attn.v_proj.weight":
                                                     np.zeros((C, C), np.float32)}), "has shape [64, 64]"),
            ("unknown dtype", bad_dir("dtype", change={"model.norm.weight": np.zeros(C, np.int32)}), "I32"),
            ("unknown architecture", bad_dir("arch", config=hf_config(cfg, architectures=["MistralForCausalLM"],
                                                                      model_type="mistral")), "MistralForCausalLM"),
            ("rope_scaling yarn", bad_dir("yarn", config=hf_config(cfg, rope_scaling={"rope_type": "yarn",
                                                                                       "factor": 4.0})), "yarn"),
            ("attention_bias true", bad_dir("bias", config=hf_config(cfg, attention_bias=True)), "attention_bias"),
        ]
        missing = bad_dir("index", shards=2)
        os.remove(os.path.join(missing, "model-00002-of-00002.safetensors"))
        cases.append(("sharded index naming a missing file", missing, "model-00002-of-00002.safetensors"))
        for name, d, pattern in cases:
            error_check(f"HF Llama directory, {name}: a clear error", ["./train_gpt_cpu", "-e", d, "-i", shard, "-j",
                        shard, "-b", str(B), "-t", str(T), "-x", "1"], pattern)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return failed_count()


if __name__ == "__main__":
    sys.exit(main())
