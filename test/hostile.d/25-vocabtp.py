"""Hostile-driver category "tensor-parallel vocabulary" (issue 25, the vocabulary-parallel wte / LM head):
tp2 runs (2 ranks over -pi tcp) of GPT-2 models whose vocabulary V and padded
vocabulary Vp put the padding across rank 1's slice, fill rank 1's slice with padding only, or leave
Vp odd (does not divide over -tp 2), and of data holding token ids in the padding [V, Vp). A model
whose Vp divides and data within V must train and write finite models of the whole vocabulary; any
other case must stop with a clean error before training (silent otherwise); the model file trained
from must stay as it was (lost)."""
import os
import struct

from hardening_util import numel, write_model, write_shard
from hostile_common import base_args, dist_ranks

C, MAXT = 32, 64


def scenario(r, k):
    """(V, Vp, tokens in the padding?) of case k"""
    return [(r.randrange(129, 256), 256, False),  # the padding inside rank 1's slice
            (r.randrange(2, 128), 256, False),    # rank 1's slice all padding: its sums are empty
            (256, 256, False),                    # no padding
            (r.randrange(200, 255), 255, False),  # Vp odd: does not divide over -tp 2
            (257, 257, False),                    # odd, no padding
            (200, 256, True)][k]                  # data with ids in [V, Vp): outside the vocabulary


def whole_finite(path, V, Vp):
    """path is a whole model (every rank's rows of wte) of this vocabulary with finite weights."""
    data = open(path, "rb").read()
    if len(data) != 1024 + 4 * numel(MAXT, V, 1, C, Vp) or struct.unpack("<8i", data[:32])[3::4] != (V, Vp):
        return False
    return all(x == x and abs(x) != float("inf") for x in struct.unpack(f"<{(len(data) - 1024) // 4}f", data[1024:]))


def case_vocab(ctx, r, tag, k):
    V, Vp, padded_ids = scenario(r, k)
    d = ctx.fresh("vocab")
    os.makedirs(d)
    model, shard = os.path.join(d, "model.bin"), os.path.join(d, "train.bin")
    write_model(model, maxT=MAXT, V=V, NH=2, C=C, Vp=Vp, seed=r.randrange(1 << 20))
    toks = [r.randrange(V) for _ in range(2000)]
    if padded_ids:
        toks[r.randrange(64)] = r.randrange(V, Vp)  # within the first step's batch
    write_shard(shard, toks)
    before = open(model, "rb").read()
    out = os.path.join(d, "run")
    args = base_args(ctx) + ["-e", model, "-x", "2", "-n", "1", "-tp", "2", "-o", out]
    args[args.index("-i") + 1] = shard
    args[args.index("-j") + 1] = shard
    runnable = Vp % 2 == 0 and not padded_ids
    note = f"V {V}, Vp {Vp}{', a token id in the padding' if padded_ids else ''}"
    o, err = dist_ranks(args, 2)
    if open(model, "rb").read() != before:
        return "lost", f"{note}: the model trained from changed"
    if o == "ok" and not runnable:
        return "silent", f"{note}: trained"
    if o == "ok" and not whole_finite(os.path.join(out, "model_00000002.bin"), V, Vp):
        return "silent", f"{note}: the model written is not the whole vocabulary's, or not finite"
    if o != "ok" and runnable:
        return "silent", f"{note}: a layout that runs failed: {err[-200:]}"
    return o, note


CATEGORIES = [("tensor-parallel vocabulary (V, Vp, padded ids)", case_vocab, 6)]
