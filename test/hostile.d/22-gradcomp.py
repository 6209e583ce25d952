"""Hostile-driver category "gradient compression resume" (issue 26 item 1): a 2-rank --grad-compression
int8 run's checkpoint (its state file version 4, with both ranks' residuals) resumed on one process
or on 2 ranks (-pi tcp) with a random --grad-compression (valid, another scheme, malformed), -z and
--allow-config-change, or with the state's compression section (header [43..49]: scheme, parameter,
ranks, floats per rank, shared floats) rewritten under a recomputed checksum. Every case must train
or stop with a clean error; a rewritten section must never resume (silent); the run's earlier
checkpoints must stay as they were (lost) and a model it writes must be finite."""
import os
import socket
import subprocess
import time

from hardening_util import TRAINER, clean_outcome, state_rewrite
from hostile_common import TIMEOUT, base_args, checkpoint_copy, digests, finite_models, rank_checkpoint

VALUES = ["int8", "int8", "bf16", "topk:0.05", "powersgd:2", "none", "topk:0", "topk:1e-30", "int9", "powersgd:0", ""]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks(args, n):
    """n processes (1: the trainer alone; 2: -pi tcp); (worst outcome, stderr)"""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if n == 1:
        cmds = [[TRAINER] + args]
    else:
        port = free_port()
        cmds = [[TRAINER] + args + ["-pi", "tcp", "-ps", f"127.0.0.1:{port}", "-pn", "2", "-pr", str(r)] for r in range(2)]
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env) for c in cmds]
    end, outs, errs = time.time() + TIMEOUT, [], []
    for p in procs:
        try:
            _, e = p.communicate(timeout=max(0.1, end - time.time()))
            outs.append(clean_outcome(p.returncode, e))
        except subprocess.TimeoutExpired:
            p.kill()
            _, e = p.communicate()
            outs.append("hang")
        errs.append(e)
    for o in ("hang", "crash", "unclean", "error", "ok"):
        if o in outs:
            return o, "".join(errs)
    return "ok", ""


def setup(ctx):
    ctx.gc_ckpt = rank_checkpoint(ctx, "gc_ck", ["-e", ctx.model, "--grad-compression", "int8"], 2, ranks,
                                  "gradient compression")


def case_gradcomp(ctx, r, tag, k):
    if not ctx.gc_ckpt:
        return "skip", "no 2-rank --grad-compression checkpoint"
    d = checkpoint_copy(ctx.gc_ckpt, ctx.fresh("gc"), "*00000003*")
    nproc = r.choice([1, 2])
    given = {"--grad-compression": "int8"}
    edit = k % 2 == 1  # odd scenarios rewrite the state's section, even ones change flags
    if edit:
        slot, v = r.choice([(43, 0), (43, 1), (43, 4), (43, 9), (44, 7), (45, 0), (45, 1), (45, 3), (45, -1),
                            (45, 1 << 30), (46, 0), (46, -1), (46, 1 << 20), (47, 1), (48, 5), (49, 1)])
        state_rewrite(os.path.join(d, "state_00000002_00000.bin"), lambda h: h.__setitem__(slot, v))
        note = f"state header [{slot}] = {v}"
    else:
        given["--grad-compression"] = r.choice(VALUES)
        if r.random() < 0.4:
            given["-z"] = r.choice(["0", "1", "2", "3"])
        if r.random() < 0.4:
            given["--allow-config-change"] = "1"
        note = " ".join(x for kv in given.items() for x in kv)
    note = f"{nproc} process(es), {note}"
    args = base_args(ctx) + ["-e", ctx.model, "-x", "3", "-y", "1", "-o", d] + [x for kv in given.items() for x in kv]
    if nproc == 1:  # the same -d as the 2 ranks' (2 x -b 2)
        args[args.index("-b") + 1] = "4"
    before = digests(d)
    o, _ = ranks(args, nproc)
    if digests(d) != before:
        return "lost", f"{note}: an earlier checkpoint changed"
    if o == "ok" and edit:
        return "silent", f"{note}: resumed from a rewritten compression section"
    if o == "ok" and not finite_models(d):
        return "silent", f"{note}: a non-finite model written"
    return o, note


CATEGORIES = [("gradient compression resume (flags, state section)", case_gradcomp, 8)]
