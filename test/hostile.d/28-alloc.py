"""Hostile-driver category "--memory-snapshot paths" (issue 26 item 3): ./train_gpt (the cudasim
harness build, SIM) given a snapshot path that is missing its directory, a directory, the model it
reads, another file of the user's (or a symbolic link to one), a FIFO, a path with a trailing '/',
an earlier snapshot (replaced: ok), or a disk that fills while the snapshot is written. Every case
must train or stop with a clean error before training; the user's files must stay as they were
(lost), a failed write must leave no file and no temporary behind (unclean), and a replaced snapshot
must be a whole one."""
import hashlib
import json
import os
import stat

from hardening_util import clean_outcome, limit_file_size, run
from hostile_common import TIMEOUT, base_args, leftovers

SIM = os.environ.get("SIM", "build/cudasim/train_gpt")
SCENARIOS = ["no directory", "a directory", "the model file", "a user file", "a link to a user file", "a FIFO",
             "a trailing slash", "an earlier snapshot", "a full disk"]


def file_hashes(d):
    """sha256 of every regular file in d (links followed, FIFOs skipped)."""
    out = {}
    for f in sorted(os.listdir(d)):
        p = os.path.join(d, f)
        if os.path.exists(p) and stat.S_ISREG(os.stat(p).st_mode):
            out[f] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def case_snapshot(ctx, r, tag, k):
    if not os.access(SIM, os.X_OK):
        return "skip", f"{SIM} not built"
    what = SCENARIOS[k]
    d = ctx.fresh("snap")
    os.makedirs(d)
    user = os.path.join(d, "notes.txt")
    with open(user, "w") as f:
        f.write("the user's own file\n")
    model = os.path.join(d, "model.bin")
    with open(ctx.model, "rb") as src, open(model, "wb") as dst:
        dst.write(src.read())
    path = {"no directory": os.path.join(d, "missing", "s.json"), "a directory": d, "the model file": model,
            "a user file": user, "a link to a user file": os.path.join(d, "link.json"), "a FIFO": os.path.join(d, "fifo"),
            "a trailing slash": os.path.join(d, "s.json") + "/", "an earlier snapshot": os.path.join(d, "old.json"),
            "a full disk": os.path.join(d, "s.json")}[what]
    if what == "a link to a user file":
        os.symlink(user, path)
    elif what == "a FIFO":
        os.mkfifo(path)
    elif what == "an earlier snapshot":
        with open(path, "w") as f:
            f.write('{"format": "llmc-memory-snapshot", "version": 1}\n')
    before = file_hashes(d)
    preexec = limit_file_size(2048) if what == "a full disk" else None
    rc, out, err = run(SIM, base_args(ctx) + ["-e", model, "-x", "1", "--precision", "fp32", "--memory-snapshot", path],
                       timeout=TIMEOUT, preexec=preexec)
    o = clean_outcome(rc, err)
    after = file_hashes(d)
    kept = {f: h for f, h in before.items() if not (what == "an earlier snapshot" and f == "old.json")}
    if any(after.get(f) != h for f, h in kept.items()):
        return "lost", f"{what}: a file of the user's changed"
    if leftovers(d):
        return "unclean", f"{what}: a temporary file was left: {leftovers(d)}"
    if what == "an earlier snapshot":
        if o != "ok":
            return o, f"{what}: {err.strip()[-200:]}"
        try:
            ok = json.load(open(path)).get("totals", {}).get("allocated", 0) > 0
        except ValueError:
            ok = False
        return ("ok", what) if ok else ("silent", f"{what}: the replacement is not a whole snapshot")
    if o == "ok":
        return "silent", f"{what}: the run succeeded"
    if what == "a full disk" and os.path.exists(path):
        return "unclean", f"{what}: a partial snapshot was left"
    if what != "a full disk" and "step " in out:
        return "unclean", f"{what}: refused only after training"
    return o, f"{what}: {err.strip().splitlines()[-1][:160] if err.strip() else ''}"


CATEGORIES = [("--memory-snapshot paths (train_gpt, harness)", case_snapshot, len(SCENARIOS))]
