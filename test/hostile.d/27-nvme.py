"""Hostile-driver category "NVMe offload paths" (issue 26 item 2): a 2-step --offload-device nvme run
whose --nvme-path is a random kind of path: a regular file, missing, a dangling symbolic link, a
symbolic link loop, a FIFO, a directory holding a FIFO and other files, a directory under a
file-size limit (the file's reservation fails as on a full disk), read-only (chmod 555: refused
unless root, whom it does not stop), '', a valid directory with a trailing '/'. Each must train or
stop with a clean error; a path that cannot hold the files must never train (silent); every file
that was in the sandbox before is unchanged (lost) and no llmc-optstate-* file is left (unclean)."""
import hashlib
import os

from hardening_util import TRAINER, clean_outcome, limit_file_size, run
from hostile_common import TIMEOUT, base_args

KINDS = ["file", "missing", "dangling", "loop", "fifo", "dir_with_fifo", "size_limit", "read_only", "empty", "slash"]
MUST_FAIL = {"file", "missing", "dangling", "loop", "fifo", "size_limit", "empty"}


def snapshot(d):
    """path -> (kind, sha256 or link target) of everything under d, links not followed"""
    out = {}
    for root, dirs, files in os.walk(d):
        for n in dirs + files:
            p = os.path.join(root, n)
            if os.path.islink(p):
                out[p] = ("link", os.readlink(p))
            elif os.path.isfile(p):
                out[p] = ("file", hashlib.sha256(open(p, "rb").read()).hexdigest())
            else:
                out[p] = ("dir" if os.path.isdir(p) else "other",)
    return out


def case_nvme_path(ctx, r, tag):
    box = ctx.fresh("nvme")
    os.makedirs(box)
    open(os.path.join(box, "bystander.bin"), "wb").write(os.urandom(64))
    kind = r.choice(KINDS)
    path, preexec = os.path.join(box, "dir"), None
    if kind == "file":
        open(path, "w").write("a file, not a directory")
    elif kind == "dangling":
        os.symlink(os.path.join(box, "nowhere"), path)
    elif kind == "loop":
        os.symlink(os.path.join(box, "loop_b"), path)
        os.symlink(path, os.path.join(box, "loop_b"))
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind in ("dir_with_fifo", "size_limit", "read_only", "slash"):
        os.makedirs(path)
        open(os.path.join(path, "llmc-optstate-notours.bin"), "w").write("someone else's")
        if kind == "dir_with_fifo":
            os.mkfifo(os.path.join(path, "pipe"))
        if kind == "size_limit":
            preexec = limit_file_size(r.choice([0, 4096, 64 * 1024]))
        if kind == "read_only":
            os.chmod(path, 0o555)
        if kind == "slash":
            path += "/"
    elif kind == "empty":
        path = ""
    before = snapshot(box)
    out = ctx.fresh("nvme_run")
    rc, _, err = run(TRAINER, base_args(ctx) + ["-e", ctx.model, "-x", "2", "-o", out, "--offload-device", "nvme",
                                               "--nvme-path", path], timeout=TIMEOUT, preexec=preexec)
    if kind == "read_only":
        os.chmod(path, 0o755)
    o = clean_outcome(rc, err)
    after = snapshot(box)
    if any(after.get(p) != v for p, v in before.items()):
        return "lost", f"{kind}: a file in the sandbox changed or went away"
    left = [p for p in after if p not in before and os.path.basename(p).startswith("llmc-optstate-")]
    if left:
        return "unclean", f"{kind}: {left} left behind"
    must_fail = kind in MUST_FAIL or (kind == "read_only" and os.geteuid() != 0)
    if o == "ok" and must_fail:
        return "silent", f"{kind}: trained with --nvme-path {path!r}"
    # (under a file-size limit another file of the run may be the one that fails first)
    if o == "error" and kind != "size_limit" and "--nvme-path" not in err and "--offload-device" not in err:
        return "unclean", f"{kind}: the error does not name --nvme-path: {err.strip()[-200:]}"
    return o, kind


CATEGORIES = [("NVMe offload paths (file, missing, links, FIFO, full, read-only)", case_nvme_path)]
