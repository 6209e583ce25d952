#!/usr/bin/env python3
"""Run directories and resume (issue 22: findings 1, 2, 4, 11, 13, 19): only the exact names a run
writes in -o are run files (rundir.h's table), for "does -o hold a run?" and for every deletion;
the -e input is never deleted; evaluation repairs a cut-off log line; --plan -y 1 plans the
checkpoint's model; a bf16 checkpoint's resume says it is not bit-exact; ./generate -e RUN_DIR
names no trainer flags. Tiny model, seconds. Prints PASS:/FAIL: lines; exits non-zero on any
failure. Run from the repository root; TRAINER / GENERATE select other binaries (e.g. the code
before the fix, to see the checks fail there; TRAINER=build/cudasim/train_gpt: the CUDA trainer).
"""
import glob
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hardening_util import TRAINER, run, write_model, write_shard  # noqa: E402
from testlib import failures, report  # noqa: E402

GENERATE = os.environ.get("GENERATE", "./generate")

# names that look like a run's but are none of the names it writes (rundir.h): never deleted, never "a run"
LOOKALIKE_FILES = ["model_base.bin", "model_card.md", "state_dict_notes.txt", "model_00000002.bin.bak", "model_1.bin",
                   "DONE_x", "DONE_1", "log.jsonl.old", "MODEL_00000002.BIN", "model_000000002.bin",
                   "state_00000002.bin", "log.jsonl.tmp.x", "notes.tmp.99999999"]
LOOKALIKE_DIRS = ["model_hf_base", "model_exports", "state_dumps"]


def snapshot(d, names):
    """name -> content digest of each file (a folder: of every file under it, by relative path)."""
    out = {}
    for n in names:
        p = os.path.join(d, n)
        if os.path.isdir(p) and not os.path.islink(p):
            h = hashlib.sha256()
            for root, _, files in sorted(os.walk(p)):
                for f in sorted(files):
                    h.update(os.path.relpath(os.path.join(root, f), p).encode())
                    h.update(open(os.path.join(root, f), "rb").read())
            out[n] = "dir:" + h.hexdigest()
        elif os.path.lexists(p):
            out[n] = hashlib.sha256(open(p, "rb").read()).hexdigest()
        else:
            out[n] = None
    return out


def plant(d, model):
    """The look-alikes in d (created): model_base.bin a real model (usable as -e)."""
    os.makedirs(d, exist_ok=True)
    for n in LOOKALIKE_FILES:
        if n == "model_base.bin":
            shutil.copy(model, os.path.join(d, n))
        else:
            open(os.path.join(d, n), "w").write(f"not a run file: {n}\n")
    for n in LOOKALIKE_DIRS:
        os.makedirs(os.path.join(d, n, "sub"))
        open(os.path.join(d, n, "sub", "x"), "w").write(n)
        open(os.path.join(d, n, "config.json"), "w").write("{}")
    return LOOKALIKE_FILES + LOOKALIKE_DIRS


def main():
    tmp = tempfile.mkdtemp(prefix="llmc_test_rundir_")
    print(f"temp dir {tmp}")
    P = lambda *a: os.path.join(tmp, *a)  # noqa: E731
    rng = random.Random(22)
    tr, va, model = P("train.bin"), P("val.bin"), P("tiny.bin")
    write_shard(tr, [rng.randrange(256) for _ in range(6000)])
    write_shard(va, [rng.randrange(256) for _ in range(1000)])
    write_model(model)
    base = ["-i", tr, "-j", va, "-b", "2", "-t", "32", "-v", "2", "-m", "1", "-s", "0", "-l", "1e-2"]
    ck = P("ck")
    rc, out, err = run(TRAINER, base + ["-e", model, "-x", "3", "-n", "1", "-o", ck])
    if not report(rc == 0, "setup: tiny model trains and checkpoints", err[-300:]):
        return 1

    def copy_run(name, drop_step3=True):
        d = P(name)
        shutil.copytree(ck, d)
        if drop_step3:
            for f in glob.glob(os.path.join(d, "*00000003*")):
                os.remove(f)
        return d

    # ---- 1: only the exact run-file names are a run's ------------------------------------------------
    d = P("fresh")
    names = plant(d, model)
    before = snapshot(d, names)
    rc, out, err = run(TRAINER, base + ["-e", model, "-x", "1", "-o", d])
    report(rc == 0 and snapshot(d, names) == before and os.path.exists(os.path.join(d, "DONE_00000001")),
           "1: a new run in a directory holding only look-alike names (model_base.bin, model_card.md, ...) starts, "
           "touching none", f"exit {rc}; {err.strip()[-300:]!r}")

    d = P("resume_new")
    names = plant(d, model)
    before = snapshot(d, names)
    rc, out, err = run(TRAINER, base + ["-e", os.path.join(d, "model_base.bin"), "-x", "1", "-y", "1", "-o", d])
    report(rc == 0 and snapshot(d, names) == before,
           "1: -y 1 -e DIR/model_base.bin -o DIR among look-alikes: a new run from it, no look-alike deleted",
           f"exit {rc}; {err.strip()[-300:]!r}; changed {[n for n in names if snapshot(d, [n]) != {n: before[n]}]}")

    d = copy_run("overwrite_lookalikes", drop_step3=False)
    names = plant(d, model)
    before = snapshot(d, names)
    rc, out, err = run(TRAINER, base + ["-e", os.path.join(d, "model_base.bin"), "-x", "1", "--overwrite", "1", "-o", d])
    old_left = [f for f in ("DONE_00000002", "DONE_00000003", "model_00000003.bin", "model_00000003.bin.sum",
                            "state_00000003_00000.bin") if os.path.exists(os.path.join(d, f))]
    report(rc == 0 and snapshot(d, names) == before and not old_left,
           "1: --overwrite 1 deletes the previous run's files and no look-alike (the -e model_base.bin in -o included)",
           f"exit {rc}; old files left {old_left}; {err.strip()[-300:]!r}")

    d = copy_run("done_lookalike")
    for f in glob.glob(os.path.join(d, "*")):
        os.remove(f)
    open(os.path.join(d, "DONE_1"), "w").write("")
    shutil.copy(model, os.path.join(d, "model_1.bin"))
    rc, out, err = run(TRAINER, base + ["-e", model, "-x", "1", "-y", "1", "-o", d])
    report(rc == 0 and "holds no run yet" in out and os.path.exists(os.path.join(d, "DONE_1")),
           "1: DONE_1 is no checkpoint marker: -y 1 starts a new run and keeps it",
           f"exit {rc}; {err.strip()[-300:]!r}")

    d = copy_run("wrong_type")
    os.makedirs(os.path.join(d, "model_00000005.bin"))
    before = sorted(os.listdir(d))
    rc, out, err = run(TRAINER, base + ["-e", model, "-x", "1", "--overwrite", "1", "-o", d])
    report(rc == 1 and "model_00000005.bin" in err and "is a directory" in err and sorted(os.listdir(d)) == before,
           "1: a directory with a run file's name is refused by name, nothing deleted",
           f"exit {rc}; {err.strip()[-300:]!r}")

    d = P("symlink_log")
    os.makedirs(d)
    outside = P("outside.txt")
    open(outside, "w").write("someone else's file\n")
    os.symlink(outside, os.path.join(d, "log.jsonl"))
    rc, out, err = run(TRAINER, base + ["-e", model, "-x", "1", "-y", "1", "-o", d])
    report(rc == 1 and "log.jsonl" in err and os.path.islink(os.path.join(d, "log.jsonl")) and
           open(outside).read() == "someone else's file\n",
           "1: -y 1 with a symbolic link named log.jsonl: refused, the link and the file it points to unchanged",
           f"exit {rc}; {err.strip()[-300:]!r}")

    # ---- 2: the -e input is never deleted -------------------------------------------------------------
    d = copy_run("overwrite_e")
    m2 = os.path.join(d, "model_00000002.bin")
    before = sorted(os.listdir(d))
    rc, out, err = run(TRAINER, base + ["-e", m2, "-x", "1", "--overwrite", "1", "-o", d])
    report(rc == 1 and "error: " in err and m2 in err and "-e" in err and sorted(os.listdir(d)) == before,
           "2: --overwrite 1 -e DIR/model_00000002.bin -o DIR: refused naming -e, nothing deleted",
           f"exit {rc}; {err.strip()[-300:]!r}; files {sorted(os.listdir(d))}")

    d = P("startover_e")
    os.makedirs(d)
    m1 = os.path.join(d, "model_00000001.bin")
    shutil.copy(os.path.join(ck, "model_00000001.bin"), m1)
    shutil.copy(os.path.join(ck, "model_00000001.bin.sum"), m1 + ".sum")
    rc, out, err = run(TRAINER, base + ["-e", m1, "-x", "1", "-y", "1", "-o", d])
    report(rc == 1 and m1 in err and os.path.exists(m1) and os.path.exists(m1 + ".sum"),
           "2: -y 1 starting over a run without a checkpoint whose file is -e: refused, -e kept",
           f"exit {rc}; {err.strip()[-300:]!r}")

    hf = P("hf_run")
    rc, out, err = run(TRAINER, base + ["-e", model, "-x", "1", "--save-hf", "1", "-o", hf])
    hfdir = os.path.join(hf, "model_00000001_hf")
    if rc == 0 and os.path.isdir(hfdir):
        rc, out, err = run(TRAINER, base + ["-e", hfdir, "-x", "1", "--overwrite", "1", "-o", hf])
        report(rc == 1 and hfdir in err and os.path.exists(os.path.join(hfdir, "config.json")),
               "2: --overwrite 1 -e DIR/model_00000001_hf -o DIR: refused, the HF directory kept",
               f"exit {rc}; {err.strip()[-300:]!r}")
    else:
        print(f"SKIP: 2: -e inside an HF directory of -o (no --save-hf in this build: {err.strip()[-120:]!r})")

    # ---- 4: evaluation repairs a cut-off last log line ---------------------------------------------------
    def valid_log(path):
        try:
            for ln in open(path):
                json.loads(ln)
            return True
        except ValueError:
            return False

    d = copy_run("eval_cut", drop_step3=False)
    log = os.path.join(d, "log.jsonl")
    data = open(log, "rb").read()
    open(log, "wb").write(data[:-20])
    rc, out, err = run(TRAINER, base + ["-e", model, "-x", "0", "-y", "1", "-o", d])
    lines = open(log).read().splitlines()
    report(rc == 0 and valid_log(log) and '"eval_only":1' in lines[-1],
           "4: -x 0 -y 1 on a log whose last line is cut off: every line valid JSON, the eval record last",
           f"exit {rc}; last lines {lines[-2:]!r}")

    d = copy_run("resume_cut")
    log = os.path.join(d, "log.jsonl")
    lines = open(log).read().splitlines(keepends=True)
    k = max(i for i, ln in enumerate(lines) if '"step":2,' in ln)
    open(log, "w").write("".join(lines[:k + 1]) + lines[k][:len(lines[k]) // 2])
    rc, out, err = run(TRAINER, base + ["-e", model, "-x", "3", "-n", "1", "-y", "1", "-o", d])
    report(rc == 0 and valid_log(log), "4: -y 1 on a log cut off in a line of the resumed step: every line valid JSON",
           f"exit {rc}; {err.strip()[-200:]!r}")

    # ---- 11: --plan -y 1 plans the checkpoint's model -------------------------------------------------
    d = copy_run("plan")
    rc, out, err = run(TRAINER, base + ["-x", "3", "-y", "1", "-o", d, "--plan", "--json"])
    rc2, out2, err2 = run(TRAINER, base + ["-e", os.path.join(d, "model_00000002.bin"), "-x", "3", "--plan", "--json"])
    try:
        same = rc == 0 and rc2 == 0 and json.loads(out) == json.loads(out2)
    except ValueError:
        same = False
    report(same and "differs" in err, "11: --plan -y 1 -o RUN (no -e) plans the checkpoint's model, noting the -e the "
           "resume refuses", f"exit {rc}/{rc2}; {out[:200]!r} vs {out2[:200]!r}; {err.strip()[-200:]!r}")

    # ---- 13: a bf16 checkpoint's resume says it is not bit-exact ---------------------------------------
    b16 = P("bf16")
    rc, out, err = run(TRAINER, base + ["-e", model, "-x", "2", "-n", "1", "--checkpoint-bf16", "1", "-o", b16])
    for f in glob.glob(os.path.join(b16, "*00000002*")):
        os.remove(f)
    rc, out, err = run(TRAINER, base + ["-e", model, "-x", "2", "-n", "1", "--checkpoint-bf16", "1", "-y", "1", "-o", b16])
    report(rc == 0 and "not bit-identical" in out, "13: resuming a --checkpoint-bf16 1 checkpoint notes it is not bit-exact",
           f"exit {rc}; {out.strip()[-300:]!r}; {err.strip()[-200:]!r}")
    d = copy_run("fp32_resume")
    rc, out, err = run(TRAINER, base + ["-e", model, "-x", "3", "-n", "1", "-y", "1", "-o", d])
    report(rc == 0 and "not bit-identical" not in out, "13: an fp32 checkpoint's resume has no such note", f"exit {rc}")

    # ---- 19: ./generate -e RUN_DIR names no trainer flags ---------------------------------------------
    rc, out, err = run(GENERATE, ["-e", ck, "-g", "2"])
    want = os.path.join(ck, "model_00000003.bin")
    report(rc == 1 and want in err and "-y 1" not in err and "-o " not in err,
           "19: ./generate -e RUN_DIR names its latest checkpoint, not the trainer's -o DIR -y 1",
           f"exit {rc}; {err.strip()[-300:]!r}")
    rc, out, err = run(TRAINER, base + ["-e", ck, "-x", "1"])
    report(rc == 1 and want in err and f"-o {ck} -y 1" in err, "19: the trainer's -e RUN_DIR error names both ways",
           f"exit {rc}; {err.strip()[-300:]!r}")

    shutil.rmtree(tmp, ignore_errors=True)
    print(f"(checks failed: {failures()})")
    return 1 if failures() else 0


if __name__ == "__main__":
    sys.exit(main())
