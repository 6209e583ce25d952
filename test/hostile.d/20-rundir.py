"""Hostile-driver category "run-directory ownership" (issue 22): -o full of look-alike names (files,
folders, symbolic links: model_base.bin, model_card.md, model_exports/x, model_00000002.bin.bak,
DONE_x, MODEL_00000002.BIN, notes.tmp.<dead pid>, ...) in a random mix, with or without a real run
beside them, under a new run, -y 1 or --overwrite 1, -e sometimes a look-alike model in -o or
one of the run's own files. Nothing not written by the run may be deleted or changed (lost); -e
is never deleted; --overwrite 1 leaves no file of the previous run; a run-file name on the wrong
kind of entry must be a clean error."""
import glob
import hashlib
import os
import shutil

from hardening_util import TRAINER, clean_outcome, run
from hostile_common import TIMEOUT, base_args, leftovers

LOOKALIKE_FILES = ["model_base.bin", "model_card.md", "state_dict_notes.txt", "model_00000002.bin.bak", "model_1.bin",
                   "DONE_x", "DONE_1", "DONE_00000002.txt", "done_00000002", "log.jsonl.old", "log.json",
                   "MODEL_00000002.BIN", "Model_00000002.bin", "model_000000002.bin", "model_-0000002.bin",
                   "model_00000002.bin.sum.orig", "model_00000002.binx", "state_00000002.bin",
                   "state_00000002_0.bin", "state_00000002_00000.bin.bak", "log.jsonl.tmp.x", "notes.tmp.99999999",
                   "model_00000002.bin.tmp.", "model_00000002.bin.tmp.0123", "DONE_00000002 ", " DONE_00000002",
                   "DONE_+0000002", "model_00000002_hf.zip", "llmc.lock"]
LOOKALIKE_DIRS = ["model_hf_base", "model_exports", "state_dumps", "DONE_dir", "model_00000002_hf.bak",
                  "model_2_hf", "log.jsonl.d"]
# a run file's name on an entry no run writes: a clean error, nothing deleted
WRONG_TYPE = [("model_00000007.bin", "dir"), ("DONE_00000007", "dir"), ("state_00000007_00000.bin", "dir"),
              ("model_00000007_hf", "file"), ("log.jsonl", "link"), ("model_00000007.bin", "link")]


def digest(p):
    if os.path.islink(p):
        return "link:" + os.readlink(p)
    if os.path.isdir(p):
        h = hashlib.sha256()
        for root, dirs, files in sorted(os.walk(p)):
            dirs.sort()
            for f in sorted(files):
                q = os.path.join(root, f)
                h.update(os.path.relpath(q, p).encode() + b"\0" + open(q, "rb").read())
        return "dir:" + h.hexdigest()
    return hashlib.sha256(open(p, "rb").read()).hexdigest() if os.path.exists(p) else None


def plant(ctx, r, d, tag):
    """A random mix of look-alikes in d; returns {path: digest} of everything planted (and of the
    files the symbolic links point to)."""
    os.makedirs(d, exist_ok=True)
    made = []
    for n in r.sample(LOOKALIKE_FILES, r.randint(3, len(LOOKALIKE_FILES))):
        p = os.path.join(d, n)
        if n in ("model_base.bin", "model_1.bin"):
            shutil.copy(ctx.model, p)
        else:
            open(p, "w").write(f"{tag}: {n}\n")
        made.append(p)
    for n in r.sample(LOOKALIKE_DIRS, r.randint(1, len(LOOKALIKE_DIRS))):
        os.makedirs(os.path.join(d, n, "x"))
        open(os.path.join(d, n, "x", "data"), "w").write(n)
        if r.random() < 0.5:
            open(os.path.join(d, n, "config.json"), "w").write("{}")
        made.append(os.path.join(d, n))
    if r.random() < 0.4:  # a link with a look-alike name, to a file outside -o
        target = ctx.path(f"{tag}_outside.txt")
        open(target, "w").write(f"{tag}: outside\n")
        link = os.path.join(d, r.choice(["model_link.bin", "state_link", "DONE_link"]))
        os.symlink(target, link)
        made += [target, link]
    return {p: digest(p) for p in made}


def case_ownership(ctx, r, tag):
    d = ctx.path(f"own_{tag}")
    with_run = r.random() < 0.6
    if with_run:
        shutil.copytree(ctx.ckpt, d)  # steps 1..3, complete
        if r.random() < 0.3:  # no complete checkpoint: -y 1 starts over
            for f in glob.glob(os.path.join(d, "DONE_*")):
                os.remove(f)
    planted = plant(ctx, r, d, tag)
    wrong = None
    if r.random() < 0.15:
        name, kind = r.choice(WRONG_TYPE)
        p = os.path.join(d, name)
        if os.path.lexists(p):
            os.remove(p)
        if kind == "dir":
            os.makedirs(p)
        elif kind == "file":
            open(p, "w").write("x")
        else:
            target = ctx.path(f"{tag}_wrong_target")
            open(target, "w").write("someone else's\n")
            os.symlink(target, p)
            planted[target] = digest(target)
        wrong = name
        planted[p] = digest(p)
    mode = r.choice(["new", "resume", "overwrite"] if with_run else ["new", "resume"])
    e_kind = r.choice(["outside", "lookalike", "run"] if with_run else ["outside", "lookalike"])
    if e_kind == "lookalike" and os.path.exists(os.path.join(d, "model_base.bin")):
        e = os.path.join(d, "model_base.bin")
    elif e_kind == "run":
        e = os.path.join(d, "model_00000002.bin")
    else:
        e_kind, e = "outside", ctx.model
    e_digest = digest(e)
    steps = r.choice([1, 2, 4])
    args = base_args(ctx) + ["-e", e, "-x", str(steps), "-n", "1", "-o", d,
                             "--allow-config-change", "1"]
    if mode == "resume":
        args += ["-y", "1"]
    elif mode == "overwrite":
        args += ["--overwrite", "1"]
    rc, out, err = run(TRAINER, args, timeout=TIMEOUT)
    o = clean_outcome(rc, err)
    what = f"{mode}, -e {e_kind}, run {'yes' if with_run else 'no'}{', wrong type ' + wrong if wrong else ''}"
    lost = [os.path.relpath(p, d) for p, h in planted.items() if digest(p) != h]
    if lost:
        return "lost", f"{what}: changed or deleted {lost[:4]}"
    if e_kind != "outside" and digest(e) != e_digest and not (mode == "resume" and e_kind == "run"):
        return "lost", f"{what}: the -e input changed or was deleted"
    if o == "ok" and wrong:
        return "silent", f"{what}: exit 0 with a run-file name on the wrong kind of entry"
    if o == "ok" and mode == "overwrite" and e_kind == "run":
        return "silent", f"{what}: exit 0 deleting the run whose file is -e"
    if o == "ok" and mode == "overwrite":
        stale = [f for s in range(steps + 1, 4) for f in (f"DONE_{s:08d}", f"model_{s:08d}.bin", f"model_{s:08d}.bin.sum",
                                                          f"state_{s:08d}_00000.bin") if os.path.exists(os.path.join(d, f))]
        if stale:
            return "silent", f"{what}: the previous run's files {stale} left after --overwrite 1"
    own_tmp = [f for f in leftovers(d) if f not in LOOKALIKE_FILES]
    if own_tmp:
        return "silent", f"{what}: temporary files left {own_tmp}"
    return o, what


CATEGORIES = [("run-directory ownership", case_ownership)]
