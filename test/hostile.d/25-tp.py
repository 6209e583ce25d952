"""Hostile-driver category "tensor-parallel resume" (issue 25): the checkpoint of a tp2 run (2 ranks
over -pi tcp, GPT-2 with NH 2) resumed with a random layout: 1 or 2 processes, -tp 1..4 (some do not
divide the processes or the heads), -z 0..3, now and then -pp 2 or -sp 1 (not built yet), or with
the resumed model file's head count rewritten (3: does not split over -tp 2). Every case must train
or stop with a clean error; a layout that cannot run must never train (silent); the run's earlier
checkpoints must stay as they were (lost) and a model it writes must be finite."""
import os
import struct

from hardening_util import write_model
from hostile_common import base_args, checkpoint_copy, digests, dist_ranks as tp_ranks, finite_models, rank_checkpoint

T, STEP_SEQS = 32, 2  # base_args' -t; sequences per optimizer step (-d)


def setup(ctx):
    ctx.tp_model = ctx.path("tiny_nh2.bin")
    write_model(ctx.tp_model, NH=2)
    ctx.tp_ckpt = rank_checkpoint(ctx, "tp_ck", ["-e", ctx.tp_model, "-tp", "2"], 2, tp_ranks, "tensor-parallel")


def case_tp(ctx, r, tag, k):
    if not ctx.tp_ckpt:
        return "skip", "no tp2 checkpoint"
    d = checkpoint_copy(ctx.tp_ckpt, ctx.fresh("tp"), "*00000003*")
    nproc, tp, z = r.choice([1, 2, 2]), r.choice([1, 2, 2, 3, 4]), r.choice(["0", "1", "1", "2", "3"])
    if k % 4 == 0:  # a layout that runs: tp2 on 2 ranks, or one process
        nproc, z = r.choice([2, 2, 1]), r.choice(["0", "1"])
        tp = nproc
    extra = ["-tp", str(tp), "-z", z]
    if r.random() < 0.2 and k % 4:
        extra += r.choice([["-pp", "2"], ["-sp", "1"]])
    runnable = nproc % tp == 0 and 2 % tp == 0 and (tp == 1 or z in ("0", "1")) and len(extra) == 4
    if k % 4 == 3:  # the model resumed from: NH 3 in its header (and the checksum no longer matches)
        m = os.path.join(d, "model_00000002.bin")
        data = bytearray(open(m, "rb").read())
        data[20:24] = struct.pack("<i", 3)
        open(m, "wb").write(bytes(data))
        runnable = False
    dp = nproc // tp if nproc % tp == 0 else 1
    args = base_args(ctx) + ["-e", ctx.tp_model, "-x", "3", "-y", "1", "-o", d, "-d", str(STEP_SEQS * T)] + extra
    args[args.index("-b") + 1] = str(max(1, STEP_SEQS // dp))
    note = f"{nproc} process(es), {' '.join(extra)}{', model header NH 3' if k % 4 == 3 else ''}"
    before = digests(d)
    o, _ = tp_ranks(args, nproc)
    if digests(d) != before:
        return "lost", f"{note}: an earlier checkpoint changed"
    if o == "ok" and not runnable:
        return "silent", f"{note}: trained with a layout that cannot run"
    if o == "ok" and not finite_models(d):
        return "silent", f"{note}: a non-finite model written"
    return o, note


CATEGORIES = [("tensor-parallel resume (layouts, head count)", case_tp, 8)]
