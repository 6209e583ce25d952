#!/usr/bin/env python3
"""PyTorch reference of the multiple-choice evaluation (-h 1, llmc/train/eval.h): llm.c's acc_norm.

For each example of an eval file (llm.c's write_evalfile format, read here by its own reader), each
completion is scored by the mean cross-entropy of its tokens given the context and the tokens of
the completion before them (context + completion as one unpadded row, in float64); the prediction
is the completion with the lowest mean (ties to the lower index); the count of predictions equal
to the label is printed as JSON: {"correct": N, "total": M, "predictions": [...]}.

The model: the project's GPT-2 (train_gpt2.py) or Llama 3 (train_llama3.py), random from --seed,
written to --save-model for the C trainers to load with -e, or an llm.c GPT-2 checkpoint (--load).
"""
import argparse
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_gpt2 as gpt2  # noqa: E402
import train_llama3 as llama  # noqa: E402

EVAL_MAGIC = 20240522


def read_evalfile(path):
    """[(label, context tokens, [completion tokens] * n)] of llm.c's eval file (version 1: uint16
    words, 2: uint32), checked strictly."""
    raw = open(path, "rb").read()
    magic, version, n, longest = struct.unpack_from("<4i", raw, 0)
    if magic != EVAL_MAGIC or version not in (1, 2):
        raise ValueError(f"{path}: magic {magic} version {version}: not an eval file")
    fmt, wb = ("<H", 2) if version == 1 else ("<I", 4)
    pos, out = 1024, []
    word = lambda i: struct.unpack_from(fmt, raw, pos + wb * i)[0]  # noqa: E731
    for i in range(n):
        if word(0) != (1 << (8 * wb)) - 1 or word(2) != i:
            raise ValueError(f"{path}: example {i}: bad delimiter or index")
        nbytes, label, ncomp = word(1), word(3), word(4)
        if nbytes > longest:
            raise ValueError(f"{path}: example {i}: longer than the header says")
        k = 5
        nctx = word(k)
        ctx = [word(k + 1 + j) for j in range(nctx)]
        k += 1 + nctx
        comps = []
        for _ in range(ncomp):
            m = word(k)
            comps.append([word(k + 1 + j) for j in range(m)])
            k += 1 + m
        if k * wb != nbytes:
            raise ValueError(f"{path}: example {i}: its size field disagrees with its contents")
        out.append((label, ctx, comps))
        pos += nbytes
    if pos != len(raw):
        raise ValueError(f"{path}: trailing bytes")
    return out


def completion_loss(model, V, ctx, comp):
    """Mean loss of comp's tokens after ctx (float64)."""
    row = torch.tensor([ctx + comp], dtype=torch.long)
    with torch.no_grad():
        logits, _ = model(row)
    logits = logits[0, :, :V].double()
    n = len(ctx)
    pred = logits[n - 1:n - 1 + len(comp)]  # the positions whose next token is a completion token
    target = torch.tensor(comp, dtype=torch.long)
    losses = torch.logsumexp(pred, dim=1) - pred.gather(1, target[:, None]).squeeze(1)
    return float(losses.mean())


def build_model(a):
    if a.load:
        cfg, tensors, _ = gpt2.load_model(a.load)
        return gpt2.GPT2(cfg, tensors).double(), cfg.vocab_size
    if a.arch == "gpt2":
        cfg = gpt2.Config(max_seq_len=a.max_seq_len, vocab_size=a.vocab, padded_vocab=gpt2.padded_vocab_size(a.vocab),
                          n_layer=a.depth, n_head=a.heads, channels=a.channels).validate()
        tensors = gpt2.init_tensors(cfg, a.seed)
        gpt2.save_model(a.save_model, cfg, tensors)
        return gpt2.GPT2(cfg, tensors).double(), cfg.vocab_size
    f32 = gpt2.f32
    cfg = llama.LlamaConfig(a.max_seq_len, a.vocab, a.depth, a.heads, a.kv_heads, a.channels, 4 * a.channels,
                            eps=f32(1e-5), theta=f32(10000.0), factor=f32(8.0), low=f32(1.0), high=f32(4.0),
                            original=8192)
    tensors = llama.init_tensors(cfg, a.seed)
    llama.save_model(a.save_model, cfg, tensors)
    return llama.Llama(cfg, tensors).double(), cfg.vocab_size


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("evalfile")
    p.add_argument("--arch", choices=("gpt2", "llama3"), default="gpt2")
    p.add_argument("--load", help="an llm.c GPT-2 checkpoint instead of a random model")
    p.add_argument("--save-model", help="where the random model is written (required without --load)")
    for flag, default in (("--depth", 2), ("--channels", 64), ("--heads", 4), ("--kv-heads", 2),
                          ("--max-seq-len", 64), ("--vocab", 512), ("--seed", 42)):
        p.add_argument(flag, type=int, default=default)
    a = p.parse_args(argv)
    if not a.load and not a.save_model:
        p.error("give --save-model PATH (the random model) or --load CHECKPOINT")
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    model, V = build_model(a)
    preds, correct = [], 0
    for label, ctx, comps in read_evalfile(a.evalfile):
        means = [completion_loss(model, V, ctx, c) for c in comps]
        best = min(range(len(means)), key=lambda k: (means[k], k))  # ties to the lower index
        preds.append(best)
        correct += best == label
    print(json.dumps({"correct": correct, "total": len(preds), "predictions": preds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
