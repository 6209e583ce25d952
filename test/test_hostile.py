#!/usr/bin/env python3
"""Hostile-input driver (issues 12, 22): seeded random cases per category, each run under a timeout.
Every case must end in success or a clean failure (exit 1 with an 'error: ' line); a signal
death or other status is a crash, a timeout a hang, and a success where the input was bad (or a
failure that left a temporary file, or a success whose files are incomplete or non-finite) a
silent result. Prints one PASS/FAIL line per category with its counts, and a summary table.
Usage: test/test_hostile.py [--seed N] [--cases N]   (TRAINER / TOKENIZER: other binaries)
"""
import argparse
import concurrent.futures as cf
import glob
import importlib.util
import os
import random
import shutil
import stat
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hardening_util import (TOKENIZER, TRAINER, clean_outcome, limit_file_size, numel, run,  # noqa: E402
                            state_rewrite, write_model, write_shard)

from hostile_common import (MODEL_BYTES, TIMEOUT, Ctx, base_args, finite_models, leftovers,  # noqa: E402
                            resume_copy)


# ---- categories: each case returns (outcome, note) where outcome is ok/error/crash/hang/unclean/silent ----

def case_checkpoint(ctx, r, i):
    """A model file of a complete checkpoint damaged (bit flips, bytes, truncation, header fields), then
    resumed (-y 1) or used with -e: any change must be an error (the checksum covers every byte)."""
    d = resume_copy(ctx, f"ck_{i}")
    m = os.path.join(d, "model_00000002.bin")
    data = bytearray(open(m, "rb").read())
    kind = r.choice(["flip", "flip", "bytes", "truncate", "extend", "header"])
    if kind == "flip":
        for _ in range(r.randint(1, 16)):
            k = r.randrange(len(data))
            data[k] ^= 1 << r.randrange(8)
    elif kind == "bytes":
        k = r.randrange(len(data) - 8)
        data[k:k + 8] = bytes(r.randrange(256) for _ in range(8))
    elif kind == "truncate":
        data = data[:r.randrange(len(data))]
    elif kind == "extend":
        data += bytes(r.randrange(1, 64))
    else:
        f = r.randrange(2, 8)
        v = r.choice([0, -1, 1, 2, 3, 1 << 28, 1 << 29, (1 << 31) - 1, -(1 << 31), r.randrange(-1000, 100000)])
        data[4 * f:4 * f + 4] = struct.pack("<i", v)
    if bytes(data) == open(m, "rb").read():
        data[-1] ^= 1
    open(m, "wb").write(bytes(data))
    if r.random() < 0.7:
        args = base_args(ctx) + ["-e", "d1", "-x", "4", "-y", "1", "-o", d]
    else:
        args = base_args(ctx) + ["-e", m, "-x", "1"]
    rc, out, err = run(TRAINER, args, timeout=TIMEOUT)
    o = clean_outcome(rc, err)
    return ("silent", f"{kind}: exit 0 with a damaged model") if o == "ok" else (o, kind)


def case_state(ctx, r, i):
    """A state file damaged: raw (checksum must catch it) or with a recomputed checksum (the field
    checks must catch it or the value must be harmless)."""
    d = resume_copy(ctx, f"st_{i}")
    s = os.path.join(d, "state_00000002_00000.bin")
    data = bytearray(open(s, "rb").read())
    kind = r.choice(["flip", "truncate", "header_raw", "header_crc", "header_crc"])
    must_fail = True
    if kind == "flip":
        for _ in range(r.randint(1, 8)):
            k = r.randrange(len(data))
            data[k] ^= 1 << r.randrange(8)
        open(s, "wb").write(bytes(data))
    elif kind == "truncate":
        open(s, "wb").write(bytes(data[:r.randrange(len(data))]))
    elif kind == "header_raw":
        f = r.randrange(0, 44)
        data[4 * f:4 * f + 4] = struct.pack("<i", r.choice([0, -1, 1, 7, 1 << 30, r.randrange(-9999, 9999)]))
        if bytes(data) == open(s, "rb").read():
            data[4 * f] ^= 1
        open(s, "wb").write(bytes(data))
    else:
        # the fields a bad value cannot hide in: step, numel, B, T, processes, shuffle, seed, loader, rng
        f = r.choice([2, 3, 4, 5, 6, 7, 9, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 29, 40])
        v = r.choice([0, -1, 3, 99, 1 << 30, -(1 << 31), r.randrange(-9999, 9999)])
        old = struct.unpack("<256i", bytes(data[:1024]))[f]
        if v == old:
            v = old + 1
        state_rewrite(s, lambda h: h.__setitem__(f, v))
        # another epoch or batch position, or another non-zero RNG state, is a valid state that only the
        # checksum could tell apart (and it was recomputed); every other field must be refused
        must_fail = f not in (12, 16, 28, 29)
    rc, out, err = run(TRAINER, base_args(ctx) + ["-e", "d1", "-x", "4", "-y", "1", "-o", d], timeout=TIMEOUT)
    o = clean_outcome(rc, err)
    if o == "ok" and must_fail:
        return "silent", f"{kind}: exit 0 with a damaged state"
    return o, kind


def case_shard(ctx, r, i):
    """A training shard with random damage; invalid shards (by the format) must be errors."""
    p = ctx.path(f"shard_{i}.bin")
    n = r.randint(50, 3000)
    toks = [r.randrange(256) for _ in range(n)]
    magic, version, ntok, width, bad = 20240520, 1, n, "H", False
    kind = r.choice(["ok", "oov", "oov_tail", "count", "magic", "version", "truncate", "u32", "u32_oov", "tiny", "empty"])
    if kind == "oov":
        toks[r.randrange(n)] = r.randrange(256, 65536)
        bad = True
    elif kind == "oov_tail":
        toks[-1] = 256
        bad = True
    elif kind == "count":
        ntok = r.choice([n + 1, n - 1, -1, 0, 1 << 30, -(1 << 31)])
        bad = True
    elif kind == "magic":
        magic, bad = r.randrange(1 << 31), True
    elif kind == "version":
        version, bad = r.choice([0, 2, 7, -1]), True
    elif kind == "u32":
        magic, version, width = 20240801, 7, "I"
    elif kind == "u32_oov":
        magic, version, width = 20240801, 7, "I"
        toks[r.randrange(n)] = r.choice([256, 1 << 20, (1 << 32) - 1])
        bad = True
    elif kind == "tiny":
        toks = toks[:r.randint(1, 64)]
        ntok, bad = len(toks), True  # fewer than B*T + 1 = 65 tokens
    elif kind == "empty":
        toks, ntok, bad = [], 0, True
    write_shard(p, toks, magic=magic, version=version, ntok=ntok, width=width)
    if kind == "truncate":
        os.truncate(p, r.randrange(0, os.path.getsize(p)))
        bad = True
    which = r.choice(["-i", "-j"])
    args = base_args(ctx) + ["-e", ctx.model, "-x", "2", "-v", "1"]
    args[args.index(which) + 1] = p
    rc, out, err = run(TRAINER, args, timeout=TIMEOUT)
    o = clean_outcome(rc, err)
    if o == "ok" and bad:
        return "silent", f"{kind} via {which}: exit 0"
    return o, kind


# per flag: values that must be rejected (bad) and values that are fine alone (good); none makes a
# valid run long (no -d with millions of micro-steps, no -g near its limit with -s on)
FLAG_VALUES = {
    "-b": (["0", "-1", "x", "1.5", "0x10", "2147483648"], ["1", "2", "4"]),
    "-t": (["0", "-5", "abc", "99999999999"], ["8", "16", "32"]),
    "-d": (["-1", "abc", str(1 << 37), str(1 << 38), "1e3"], ["0", "128"]),
    "-x": (["-2", "2147483647", "2147483648", "1.0"], ["0", "1", "2", "3"]),
    "-l": (["-1", "0x1p-3", "nan", "inf", "1e39", "fast", ""], ["0", "1e-3", "1e-2", "1e2"]),
    "-u": (["-1", "z"], ["0", "1", "1000"]),
    "-q": (["-0.5", "1.5", "NaN"], ["0", "0.1", "1"]),
    "-c": (["-1", "0X1P0"], ["0", "0.1"]),
    "--beta1": (["1", "-0.1", "2", "Infinity"], ["0", "0.9"]),
    "--beta2": (["1", "1.5"], ["0.95", "0.999"]),
    "--eps": (["0", "-1e-8"], ["1e-8", "1e-3"]),
    "--grad-clip": (["-1"], ["0", "1", "1e-6"]),
    "-sl": (["-1", "0x2"], ["0", "3", "0.5"]),
    "-sg": (["-3"], ["0", "2"]),
    "--max-skips": (["-1", "k"], ["0", "1", "50"]),
    "-r": (["3", "-1", "9"], ["0", "1", "2"]),
    "-v": (["-1"], ["0", "1", "2"]),
    "-m": (["0", "-2"], ["1", "-1"]),
    "-s": (["-1"], ["0", "1"]),
    "-g": (["0", "-1", "2147483647", "1048577"], ["1", "8"]),
    "-n": (["-1"], ["0", "1"]),
    "-nk": (["-1"], ["0", "1", "2"]),
    "-nm": (["-1"], ["0", "2"]),
    "-a": (["2", "-1"], ["0", "1"]),
    "--shuffle": (["2"], ["0", "1"]),
    "--seed": (["-1", "x", "18446744073709551616"], ["0", "1", "18446744073709551615"]),
    "--threads": (["-1", "100000"], ["0", "1"]),
    "-k": (["zigzag", ""], ["cosine", "linear", "constant", "wsd"]),
    "--precision": (["bf16", "fp8"], ["fp32"]),
    "-z": (["4", "-1", "x"], ["0", "1", "2"]),
    "-pn": (["0", "2"], ["1"]),
    "-h": (["2", "-1", "x"], ["0", "1"]),
    "--checkpoint-bf16": (["2"], ["0", "1"]),
    "-y": (["2"], ["0"]),
    "--memory-budget": (["-1", "abc", "0x10", "1Q", "inf"], ["1G", "512M"]),
    "--optim-state": (["fp8", "int4"], ["fp32", "bf16", "int8"]),
    "--offload": (["gpu", "1"], ["none", "optimizer"]),
    "--dist-timeout": (["0", "-1", "nan"], ["30", "300"]),
}


def case_flags(ctx, r, i):
    chosen, expect_bad = {}, False
    for f in r.sample(sorted(FLAG_VALUES), r.randint(1, 5)):
        bad_vals, good_vals = FLAG_VALUES[f]
        if r.random() < 0.15:
            chosen[f], expect_bad = r.choice(bad_vals), True
        else:
            chosen[f] = r.choice(good_vals)
    chosen.setdefault("-x", "2")
    args = ["-i", ctx.train, "-j", ctx.val, "-e", ctx.model, "-b", "2", "-t", "32", "-s", "0", "-v", "1", "-m", "1"]
    out_dir = ctx.path(f"flags_{i}")
    args += ["-o", out_dir]
    given = []
    for f, v in chosen.items():
        given += [f, v] if r.random() < 0.8 or not f.startswith("--") else [f"{f}={v}"]
    args += given
    rc, out, err = run(TRAINER, args, timeout=TIMEOUT)
    o = clean_outcome(rc, err)
    if o == "ok" and expect_bad:
        return "silent", f"exit 0 with a bad value: {' '.join(given)}"
    if o == "ok" and not finite_models(out_dir):
        return "silent", "exit 0 with a non-finite or wrong-size model file"
    if o == "error" and leftovers(out_dir):
        return "silent", f"temporary files left: {leftovers(out_dir)}"
    return o, " ".join(given)


def case_nonregular(ctx, r, i):
    """Non-regular files where a regular file is needed: every case must be a clean error, no hang."""
    fifo = ctx.path(f"fifo_{i}")
    os.mkfifo(fifo)
    dev = ctx.path(f"dev_{i}")
    try:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError:
        dev = fifo
    dirp = ctx.path(f"dir_{i}")
    os.makedirs(dirp)
    node = r.choice([fifo, dev, dirp])
    b = base_args(ctx) + ["-e", ctx.model, "-x", "1"]
    kind = r.choice(["-e", "--tokenizer", "-i", "-j", "log", "state", "model_in_o", "encode_out", "encode_in",
                     "decode_in"])
    binary = TRAINER
    if kind == "-e":
        args = b + ["-e", node]
    elif kind == "--tokenizer":
        if node == dirp:
            node = fifo  # a directory is a valid --tokenizer form (encoder.json + vocab.bpe)
        args = b + ["-s", "1", "-g", "2", "--tokenizer", node]
    elif kind in ("-i", "-j"):
        args = list(b)
        args[args.index(kind) + 1] = node
    elif kind == "log":
        d = ctx.path(f"nr_log_{i}")
        os.makedirs(d)
        if r.random() < 0.5:
            os.symlink(node, os.path.join(d, "log.jsonl"))
        else:
            os.rename(node, os.path.join(d, "log.jsonl"))
            node = os.path.join(d, "log.jsonl")
        args = b + ["-o", d]
    elif kind in ("state", "model_in_o"):
        # the resume's state or model file in -o replaced by a link to the node
        tag, name = ("state", "state_00000002_00000.bin") if kind == "state" else ("model", "model_00000002.bin")
        d = resume_copy(ctx, f"nr_{tag}_{i}")
        link = os.path.join(d, name)
        os.remove(link)
        os.symlink(node, link)
        args = base_args(ctx) + ["-e", "d1", "-x", "4", "-y", "1", "-o", d]
    else:
        if not ctx.have_tokenizer:
            return "skip", "no tokenizer files"
        binary = TOKENIZER
        txt = ctx.path("hostile.txt")
        if kind == "encode_out":
            if node == dirp:
                node = fifo  # a directory output is refused by its own check
            args = ["encode", txt, node]
        elif kind == "encode_in":
            args = ["encode", node, ctx.path(f"enc_{i}.bin")]
        else:
            args = ["decode", node]
    before = os.lstat(node).st_mode
    rc, out, err = run(binary, args, timeout=TIMEOUT)
    o = clean_outcome(rc, err)
    if os.path.lexists(node) and stat.S_IFMT(os.lstat(node).st_mode) != stat.S_IFMT(before):
        return "silent", f"{kind}: the node was replaced"
    return ("silent", f"{kind}: exit 0") if o == "ok" else (o, kind)


def case_full_disk(ctx, r, i):
    """Writes fail (RLIMIT_FSIZE, like a full disk) at a random size: exit 0 only with every file
    complete; a failure leaves no temporary file and no DONE for a partial checkpoint."""
    d = ctx.path(f"full_{i}")
    limit = r.choice([0, 1, 100, 1000, 4000, MODEL_BYTES // 3, MODEL_BYTES - 1, MODEL_BYTES, MODEL_BYTES + 10,
                      4 * MODEL_BYTES])
    kind = r.choice(["train", "train", "resume", "encode"])
    if kind == "encode":
        if not ctx.have_tokenizer:
            return "skip", "no tokenizer files"
        out = ctx.path(f"full_enc_{i}.bin")
        rc, so, err = run(TOKENIZER, ["encode", ctx.path("hostile.txt"), out], timeout=TIMEOUT,
                          preexec=limit_file_size(limit))
        o = clean_outcome(rc, err)
        left = [f for f in os.listdir(ctx.tmp) if f.startswith(f"full_enc_{i}.bin.tmp.")]
        if left:
            return "silent", f"encode: temporary file left {left}"
        if o == "ok" and os.path.getsize(out) < 1024:
            return "silent", "encode: exit 0 with a short shard"
        return o, f"encode limit {limit}"
    steps = r.randint(1, 4)
    if kind == "resume":
        d = resume_copy(ctx, f"full_res_{i}")
        steps = 4
        args = base_args(ctx) + ["-e", "d1", "-x", str(steps), "-n", "1", "-y", "1", "-o", d]
    else:
        args = base_args(ctx) + ["-e", ctx.model, "-x", str(steps), "-n", str(r.choice([1, 2])), "-o", d]
    rc, so, err = run(TRAINER, args, timeout=TIMEOUT, preexec=limit_file_size(limit))
    o = clean_outcome(rc, err)
    if leftovers(d):
        return "silent", f"{kind} limit {limit}: temporary files left {leftovers(d)}"
    if o == "ok":
        log = open(os.path.join(d, "log.jsonl")).read().splitlines() if os.path.exists(os.path.join(d, "log.jsonl")) else []
        done = os.path.exists(os.path.join(d, f"DONE_{steps:08d}"))
        if not done or not any(f'"step":{steps},' in ln for ln in log) or not finite_models(d):
            return "silent", f"{kind} limit {limit}: exit 0 but files incomplete"
    for dn in glob.glob(os.path.join(d, "DONE_*")):
        st = dn[-8:]
        if not (os.path.exists(os.path.join(d, f"model_{st}.bin")) and
                os.path.getsize(os.path.join(d, f"model_{st}.bin")) == MODEL_BYTES and
                os.path.exists(os.path.join(d, f"state_{st}_00000.bin"))):
            return "silent", f"{kind} limit {limit}: DONE for an incomplete checkpoint"
    return o, f"{kind} limit {limit}"


def case_divergence(ctx, r, i):
    """Learning rates from sane to absurd, with and without -sl/-sg, -nk: a success never ends on a
    diverged step, and no checkpoint ever holds a non-finite weight."""
    d = ctx.path(f"div_{i}")
    lr = r.choice(["1e-2", "1", "1e2", "1e4", "1e6", "1e8", "3e38"])
    args = base_args(ctx) + ["-e", ctx.model, "-x", str(r.randint(2, 20)), "-l", lr, "-n", str(r.choice([1, 2, 3])),
                             "-nk", str(r.choice([0, 1, 2])), "--max-skips", str(r.choice([0, 1, 3, 50])), "-o", d,
                             "--grad-clip", r.choice(["0", "1"])]
    if r.random() < 0.5:
        args += ["-sl", r.choice(["1", "3"]), "-sg", r.choice(["0", "2"])]
    rc, so, err = run(TRAINER, args, timeout=TIMEOUT)
    o = clean_outcome(rc, err)
    if not finite_models(d):
        return "silent", f"lr {lr}: a non-finite model file"
    if o == "ok":
        log = [ln for ln in open(os.path.join(d, "log.jsonl")).read().splitlines() if "train_loss" in ln]
        if log and ("diverged" in log[-1] or "non-finite" in log[-1]):
            return "silent", f"lr {lr}: exit 0 after a diverged last step"
    if leftovers(d):
        return "silent", f"lr {lr}: temporary files left"
    return o, f"lr {lr}"


def case_kill(ctx, r, i):
    """kill -9 at a random moment of a checkpointing run, then -y 1: the resume must succeed, remove
    the killed run's temporary files and end with a complete final checkpoint."""
    d = ctx.path(f"kill_{i}")
    args = base_args(ctx) + ["-e", ctx.model, "-x", "40", "-n", "1", "-o", d]
    proc = subprocess.Popen([TRAINER] + args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=r.uniform(0.01, 0.6))
        if proc.returncode != 0:
            return "crash" if proc.returncode != 1 else "error", "the run to kill failed by itself"
        return "ok", "finished before the kill"
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    rc, out, err = run(TRAINER, args + ["-y", "1"], timeout=TIMEOUT)
    o = clean_outcome(rc, err)
    if o != "ok":
        return ("silent" if o == "error" else o), f"resume after kill -9 failed: {err.strip()[-200:]}"
    if leftovers(d) or not os.path.exists(os.path.join(d, "DONE_00000040")) or not finite_models(d):
        return "silent", f"after kill -9 and resume: left {leftovers(d)}, files {sorted(os.listdir(d))[:6]}"
    return o, "resumed"


# ok: succeeded where it should; error: a clean error; crash/hang/unclean: see clean_outcome; silent: a
# success (or complete-looking files) where the input was bad; lost: a file the run did not write was
# deleted or changed; skip: not tried here (say why in SKIP_WHY).
OUTCOMES = ("ok", "error", "crash", "hang", "unclean", "silent", "lost", "skip")
BAD = ("crash", "hang", "unclean", "silent", "lost")
SKIP_WHY = {}

CATEGORIES = [
    ("corrupted checkpoints", case_checkpoint),
    ("state files", case_state),
    ("shards", case_shard),
    ("random flag combinations", case_flags),
    ("non-regular files", case_nonregular),
    ("full disk", case_full_disk),
    ("divergence", case_divergence),
    ("kill -9 and resume", case_kill),
]


def plugin_categories():
    """Categories from test/hostile.d/*.py, in file-name order: each file's CATEGORIES holds
    (name, fn) pairs, called like the ones above, or (name, fn, n) triples: n cases (not
    --cases), fn(ctx, r, tag, k) with k = 0..n-1 (a fixed list of scenarios). A file may define
    setup(ctx), called once after the driver's own setup."""
    cats, setups = [], []
    for f in sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostile.d", "*.py"))):
        spec = importlib.util.spec_from_file_location("hostile_" + os.path.basename(f)[:-3].replace("-", "_"), f)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        cats += mod.CATEGORIES
        if hasattr(mod, "setup"):
            setups.append(mod.setup)
    return cats, setups


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--cases", type=int, default=30, help="cases per category")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="llmc_test_hostile_")
    ctx = Ctx(tmp, a.seed)
    print(f"hostile driver: seed {a.seed}, {a.cases} cases per category, temp dir {tmp}")
    rng = random.Random(a.seed)
    ctx.train, ctx.val, ctx.model = ctx.path("train.bin"), ctx.path("val.bin"), ctx.path("tiny.bin")
    write_shard(ctx.train, [rng.randrange(256) for _ in range(6000)])
    write_shard(ctx.val, [rng.randrange(256) for _ in range(1000)])
    write_model(ctx.model)
    ctx.ckpt = ctx.path("ck")
    rc, out, err = run(TRAINER, base_args(ctx) + ["-e", ctx.model, "-x", "3", "-n", "1", "-o", ctx.ckpt])
    if rc != 0:
        print(f"FAIL: hostile driver setup: the tiny model does not train: {err[-300:]}")
        return 1
    ctx.have_tokenizer = run(TOKENIZER, ["find-gpt2"], timeout=20)[0] == 0
    open(ctx.path("hostile.txt"), "w").write("To be, or not to be: that is the question.\n" * 50)
    cats, setups = plugin_categories()
    for fn in setups:
        fn(ctx)
    failed = 0
    rows = []
    for entry in CATEGORIES + cats:
        name, fn = entry[0], entry[1]
        n = entry[2] if len(entry) > 2 else a.cases
        seeds = [rng.randrange(1 << 30) for _ in range(n)]
        if len(entry) > 2:
            call = lambda ia: fn(ctx, random.Random(ia[1]), f"{name[:4]}{ia[0]}", ia[0])  # noqa: E731
        else:
            call = lambda ia: fn(ctx, random.Random(ia[1]), f"{name[:4]}{ia[0]}")  # noqa: E731
        with cf.ThreadPoolExecutor(max_workers=a.jobs) as ex:
            results = list(ex.map(call, enumerate(seeds)))
        counts = {k: 0 for k in OUTCOMES}
        for o, note in results:
            counts[o] += 1
        bad = [(o, note) for o, note in results if o in BAD]
        tried = n - counts["skip"]
        rows.append((name, tried, counts))
        for o, note in bad[:5]:
            print(f"  {name}: {o}: {note}")
        ok = not bad
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}: hostile {name}: {tried} cases, {counts['ok']} succeeded, "
              f"{counts['error']} clean errors, {counts['crash']} crashes, {counts['hang']} hangs, "
              f"{counts['silent']} silent, {counts['lost']} lost files, {counts['unclean']} unclean exits" +
              (f" ({counts['skip']} skipped: {SKIP_WHY.get(name, 'no tokenizer files')})" if counts["skip"] else ""))
        sys.stdout.flush()
    total = sum(t for _, t, _ in rows)
    print(f"hostile driver: {total} cases; crashes {sum(c['crash'] for *_, c in rows)}, hangs "
          f"{sum(c['hang'] for *_, c in rows)}, silent {sum(c['silent'] for *_, c in rows)}, lost files "
          f"{sum(c['lost'] for *_, c in rows)}, unclean "
          f"{sum(c['unclean'] for *_, c in rows)}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
