"""Shared pieces of the hostile-input driver (test/test_hostile.py) and its category plug-ins
(test/hostile.d/*.py): the context every case gets, the tiny model's size, the base flags."""
import glob
import os
import shutil
import signal
import socket
import struct
import subprocess

from hardening_util import TRAINER, clean_outcome, numel, run

TIMEOUT = 30
MODEL_BYTES = 1024 + 4 * numel(64, 256, 1, 32, 256)


class Ctx:
    def __init__(self, tmp, seed):
        self.tmp, self.seed = tmp, seed
        self.counter = 0

    def path(self, *parts):
        return os.path.join(self.tmp, *parts)

    def fresh(self, stem):
        self.counter += 1
        return self.path(f"{stem}_{self.counter}")


def dist_ranks(args, n):
    """n ranks of the trainer started by scripts/run_dist.sh over -pi tcp, on a port of their own (cases run
    2 at a time; n 1: the trainer alone): (outcome, stderr)"""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [TRAINER] + args if n == 1 else ["scripts/run_dist.sh", "local", str(n), "--pi", "tcp"] + args
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRAINER": os.path.abspath(TRAINER), "PORT": str(port)}
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        _, err = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return "hang", ""
    return clean_outcome(p.returncode, err), err


def leftovers(d):
    return [f for f in os.listdir(d) if ".tmp." in f] if os.path.isdir(d) else []


def finite_models(d):
    """Every model file in d has the size its header's version needs (3: fp32, 5: bf16, as
    --checkpoint-bf16 writes) and only finite weights."""
    for m in glob.glob(os.path.join(d, "model_*.bin")):
        data = open(m, "rb").read()
        version = struct.unpack("<i", data[4:8])[0] if len(data) >= 8 else 0
        if version == 3 and len(data) == MODEL_BYTES:
            if any(x != x or abs(x) == float("inf") for x in struct.unpack(f"<{(len(data) - 1024) // 4}f", data[1024:])):
                return False
        elif version == 5 and len(data) == 1024 + (MODEL_BYTES - 1024) // 2:
            if any(h & 0x7F80 == 0x7F80 for h in struct.unpack(f"<{(len(data) - 1024) // 2}H", data[1024:])):
                return False
        else:
            return False
    return True


def base_args(ctx):
    return ["-i", ctx.train, "-j", ctx.val, "-b", "2", "-t", "32", "-v", "2", "-m", "1", "-s", "0", "-l", "1e-2"]


def resume_copy(ctx, name):
    d = ctx.path(name)
    shutil.copytree(ctx.ckpt, d)
    for f in glob.glob(os.path.join(d, "*00000003*")):
        os.remove(f)
    return d


def checkpoint_copy(src, d, drop):
    """A copy of the run directory src at d without its files matching the glob drop (the later
    checkpoints a case's resume is to write again)."""
    shutil.copytree(src, d)
    for f in glob.glob(os.path.join(d, drop)):
        os.remove(f)
    return d


def rank_checkpoint(ctx, name, args, n, launch, what):
    """A resume category's run directory: args trained 3 steps (a checkpoint each) on n processes that
    launch(args, n) starts, returning (outcome, stderr); None, with a note naming the category (what),
    when that run fails."""
    d = ctx.path(name)
    o, err = launch(base_args(ctx) + args + ["-x", "3", "-n", "1", "-o", d], n)
    if o != "ok":
        print(f"note: {what} category setup failed: {err[-300:]}")
        return None
    return d


def digests(d):
    """sha256 of the run's checkpoint files of steps 1 and 2 (a failed resume must leave them as they were)."""
    import hashlib
    return {f: hashlib.sha256(open(f, "rb").read()).hexdigest() for f in glob.glob(os.path.join(d, "*_0000000[12]*"))}


def run_judged(args, out_dir, what, must_fail, unchanged, input_name, timeout=TIMEOUT):
    """Runs the trainer with args (its output directory out_dir) and judges what every hostile input must
    hold: an exit within timeout seconds, unchanged() still true (else lost: "the -e <input_name> changed"), no
    temporary file left, no failure after steps ran, an error when must_fail. Returns (outcome, note) when
    that settles the case, else None: a clean exit 0, for the caller's own checks of what it wrote."""
    rc, out, err = run(TRAINER, args, timeout=timeout)
    o = clean_outcome(rc, err)
    if o == "hang":
        return o, f"{what}: no exit in {timeout} s"
    if not unchanged():
        return "lost", f"{what}: the -e {input_name} changed"
    if leftovers(out_dir):
        return "silent", f"{what}: temporary files left {leftovers(out_dir)}"
    if o == "error" and "step " in out:
        return "unclean", f"{what}: a late failure (after steps ran): {err.strip()[-200:]}"
    if o != "ok":
        return o, f"{what}: {err.strip()[-160:]}"
    if must_fail:
        return "silent", f"{what}: exit 0"
    return None
