#!/usr/bin/env python3
"""Hardening under hostile input and faults (issue 12): one check (or a few) per defect, each
failing on the code before the fix. Uses a tiny llm.c model written here (V 256, C 32, L 1), so
the whole file runs in well under a minute. Prints PASS:/FAIL:/SKIP: lines; exits non-zero on any
failure. Run from the repository root; TRAINER / TOKENIZER select other binaries.
"""
import glob
import os
import random
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hardening_util import (TOKENIZER, TRAINER, flip_bit, limit_file_size, numel, run, state_rewrite,  # noqa: E402
                            write_model, write_shard)
from testlib import failures, report  # noqa: E402


def expect_error(args, needles, name, timeout=60, preexec=None, binary=None):
    rc, out, err = run(binary or TRAINER, args, timeout=timeout, preexec=preexec)
    ok = rc == 1 and "error: " in err and all(n in err for n in needles)
    report(ok, name, f"exit {rc} (want 1 naming {needles}); stderr: {err.strip()[-400:]!r}")
    return rc, out, err


def main():
    tmp = tempfile.mkdtemp(prefix="llmc_test_hardening_")
    print(f"temp dir {tmp}")
    P = lambda *a: os.path.join(tmp, *a)  # noqa: E731
    rng = random.Random(12)
    pat = [rng.randrange(256) for _ in range(37)]
    tr, va, model = P("train.bin"), P("val.bin"), P("tiny.bin")
    write_shard(tr, [pat[i % 37] if rng.random() < 0.8 else rng.randrange(256) for i in range(20000)])
    write_shard(va, [pat[i % 37] if rng.random() < 0.8 else rng.randrange(256) for i in range(3000)])
    write_model(model)
    base = ["-i", tr, "-j", va, "-e", model, "-b", "2", "-t", "32", "-v", "0", "-s", "0", "-l", "1e-2"]

    # a run with checkpoints to corrupt: steps 1..3
    ck = P("ck")
    rc, out, err = run(TRAINER, base + ["-x", "3", "-n", "1", "-o", ck])
    report(rc == 0, "setup: tiny model trains and checkpoints", err[-300:])
    m2, s2 = os.path.join(ck, "model_00000002.bin"), os.path.join(ck, "state_00000002_00000.bin")

    def fresh_copy(name):
        """A copy of ck with only steps 1 and 2 (so -y 1 resumes step 2)."""
        d = P(name)
        shutil.copytree(ck, d)
        for f in glob.glob(os.path.join(d, "*00000003*")):
            os.remove(f)
        return d

    # ---- 1: sizes in 64-bit; --threads bound ------------------------------------------------
    expect_error(base + ["-d", str(1 << 37), "-x", "1"], ["-d"], "1: -d whose accumulation count overflows int -> error")
    expect_error(base + ["-d", str(1 << 38)], ["-d"], "1: -d whose accumulation count wraps to 0 -> error (was SIGFPE)")
    expect_error(base + ["-g", "2147483647", "-s", "1", "-x", "1"], ["-g (--gen-tokens)"],
                 "1: -g 2147483647 -> error naming -g (was a bogus out-of-memory)")
    expect_error(base + ["-b", "65536", "-t", "65536", "-x", "1"], ["-b 65536 -t 65536"], "1: B*T above 2^31 -> error")
    expect_error(base + ["--threads", str((os.cpu_count() or 1) + 1), "-x", "1"], ["--threads"],
                 "1: --threads above the CPU count -> error")

    # ---- 2: a shard truncated while training runs ---------------------------------------------
    trunc = P("trunc.bin")
    shutil.copy(tr, trunc)
    proc = subprocess.Popen([TRAINER, "-i", trunc, "-j", va, "-e", model, "-b", "2", "-t", "32", "-v", "0", "-s", "0",
                             "-x", "100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = ""
    while proc.poll() is None and not line.startswith("step "):
        line = proc.stdout.readline()
    os.truncate(trunc, 1024 + 2 * 40)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    report(proc.returncode == 1 and trunc in err and "truncated" in err,
           "2: shard truncated during training -> exit 1 naming the shard (was SIGBUS)",
           f"exit {proc.returncode}; stderr {err.strip()[-300:]!r}")

    # ---- 3: FIFOs where a regular file is needed ---------------------------------------------
    fifo = P("fifo")
    os.mkfifo(fifo)
    expect_error(["-i", tr, "-j", va, "-e", fifo, "-b", "2", "-t", "32", "-x", "1"], [fifo, "FIFO"],
                 "3: -e FIFO -> error, no hang", timeout=20)
    expect_error(base + ["-x", "1", "-s", "1", "--tokenizer", fifo], [fifo, "FIFO"],
                 "3: --tokenizer FIFO -> error, no hang", timeout=20)

    # ---- 4: never rename over a non-regular file ------------------------------------------------
    have_tok = run(TOKENIZER, ["find-gpt2"], timeout=20)[0] == 0
    if have_tok:
        txt = P("in.txt")
        open(txt, "w").write("Hello world. " * 20)
        targets = [("FIFO", fifo, stat.S_ISFIFO)]
        dev = P("nulldev")
        try:
            os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            targets.append(("character device", dev, stat.S_ISCHR))
        except OSError as e:
            print(f"SKIP: 4: character device output (mknod: {e})")
        for kind, path, is_kind in targets:
            rc, out, err = run(TOKENIZER, ["encode", txt, path], timeout=20)
            ok = rc == 1 and "error: " in err and kind in err and is_kind(os.lstat(path).st_mode)
            report(ok, f"4: tokenizer encode to a {kind} -> refused, the node is kept",
                   f"exit {rc}, still a {kind}: {is_kind(os.lstat(path).st_mode)}; {err.strip()[-300:]!r}")
    else:
        print("SKIP: 4: no GPT-2 tokenizer files (make data) for ./tokenizer encode")

    # ---- 5: full disk: every write checked, temporary files removed --------------------------------
    out5 = P("full_log")
    rc, out, err = run(TRAINER, base + ["-x", "40", "-o", out5], preexec=limit_file_size(2000))
    report(rc == 1 and "log.jsonl" in err and "error: " in err, "5: log write fails (file limit) -> exit 1 naming log.jsonl",
           f"exit {rc}; {err.strip()[-300:]!r}")
    out5 = P("full_ckpt")
    size = 1024 + 4 * numel(64, 256, 1, 32, 256)
    rc, out, err = run(TRAINER, base + ["-x", "2", "-n", "1", "-o", out5], preexec=limit_file_size(size // 2))
    left = [f for f in os.listdir(out5) if ".tmp." in f] if os.path.isdir(out5) else []
    report(rc == 1 and "model_00000001.bin" in err and not left and not os.path.exists(os.path.join(out5, "DONE_00000001")),
           "5/6: checkpoint write fails -> exit 1 naming the file, no temporary file left, no DONE",
           f"exit {rc}, left {left}; {err.strip()[-300:]!r}")

    # ---- 6: stale temporary files of dead processes are removed on the next start --------------------
    out6 = P("stale")
    os.makedirs(out6)
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = os.path.join(out6, f"model_00000001.bin.tmp.{dead.pid}")
    live = os.path.join(out6, f"model_00000001.bin.tmp.{os.getpid()}")
    open(stale, "wb").write(b"x" * 1000)
    open(live, "wb").write(b"x")
    rc, out, err = run(TRAINER, base + ["-x", "1", "-o", out6])
    report(rc == 0 and not os.path.exists(stale) and os.path.exists(live),
           "6: stale *.tmp.PID of a dead process removed at start; a live process's kept",
           f"exit {rc}, stale exists {os.path.exists(stale)}, live exists {os.path.exists(live)}")

    # ---- 7: divergence ------------------------------------------------------------------------
    d7 = fresh_copy("diverge")
    rc, out, err = run(TRAINER, base + ["-x", "30", "-n", "1", "-nk", "1", "-l", "1e6", "--max-skips", "3", "-y", "1",
                                        "--allow-config-change", "1",
                                        "-o", d7])
    models = sorted(glob.glob(os.path.join(d7, "model_*.bin")))
    finite = True
    for m in models:
        data = open(m, "rb").read()[1024:]
        finite &= all(x == x and abs(x) != float("inf") for x in struct.unpack(f"<{len(data) // 4}f", data))
    report(rc == 1 and "consecutive steps were skipped" in err and "--max-skips 3" in err,
           "7: -l 1e6 diverges -> stopped after --max-skips consecutive skipped steps, exit 1",
           f"exit {rc}; {err.strip()[-300:]!r}")
    report(os.path.exists(os.path.join(d7, "DONE_00000002")) and os.path.exists(os.path.join(d7, "model_00000002.bin"))
           and "newest healthy checkpoint is step 2" in err,
           "7: -nk 1 keeps the newest healthy checkpoint (step 2) and names it", f"{sorted(os.listdir(d7))}")
    report(finite and not os.path.exists(os.path.join(d7, "DONE_00000004")),
           "7: no checkpoint of a diverged step, no non-finite weights written", f"{models}")
    rc, out, err = run(TRAINER, base + ["-x", "5", "-l", "1e6", "--max-skips", "0"])
    report(rc == 1 and "diverged" in err, "7: a diverged last step is an error (no silent exit 0)", f"exit {rc}; {err[-300:]!r}")

    # ---- 8: the -sl detector has a 32-step warm-up and recovers after a shift ---------------------------
    shift = P("shift.bin")
    toks = [5] * (32 * 36) + [rng.randrange(256) for _ in range(32 * 30)]
    write_shard(shift, toks)
    rc, out, err = run(TRAINER, ["-i", shift, "-j", va, "-e", model, "-b", "1", "-t", "32", "-v", "0", "-s", "0",
                                 "-sl", "3", "--shuffle", "0", "-l", "1e-2", "-x", "64", "--max-skips", "0"])
    steps = [ln for ln in out.splitlines() if ln.startswith("step ")]
    skipped = [i + 1 for i, ln in enumerate(steps) if "loss outlier" in ln]
    report(rc == 0 and len(steps) == 64 and skipped and min(skipped) > 32 and max(skipped) < 50,
           "8: -sl 3 skips the jump after a distribution shift (past the 32-step warm-up), then recovers",
           f"exit {rc}, skipped steps {skipped}; {err[-200:]!r}")

    # ---- 9: crafted checkpoint headers ---------------------------------------------------------
    for name, h in [("C = 2^29", [1024, 256, 1, 1, 1 << 29, 256]),
                    ("L = 2^31-1, C = 2^28", [1024, 256, (1 << 31) - 1, 1, 1 << 28, 256]),
                    ("parameter bytes wrap to 0", [1024, 50257, 5, 1, 1 << 28, 1073740733])]:
        path = P("hdr.bin")
        open(path, "wb").write(struct.pack("<256i", *([20240326, 3] + h + [0] * 248)))
        expect_error(["-i", tr, "-j", va, "-e", path, "-b", "2", "-t", "32", "-x", "1"], [path, "out of range"],
                     f"9: crafted header ({name}) -> error, no overflow")

    # ---- 10: checksums -----------------------------------------------------------------------------
    d = fresh_copy("flip_model")
    flip_bit(os.path.join(d, "model_00000002.bin"), 1024 + 4 * 1000 + 2, 3)
    expect_error(base + ["-x", "4", "-y", "1", "--allow-config-change", "1", "-o", d], ["model_00000002.bin", "checksum"],
                 "10: bit flip in a checkpoint's model payload -> error on resume")
    d = fresh_copy("flip_state")
    flip_bit(os.path.join(d, "state_00000002_00000.bin"), 1024 + 4 * 5000 + 1, 6)
    expect_error(base + ["-x", "4", "-y", "1", "--allow-config-change", "1", "-o", d], ["state_00000002_00000.bin", "checksum"],
                 "10: bit flip in a state file's payload -> error on resume")
    d = fresh_copy("pair")
    for suffix in (".bin", ".bin.sum"):
        if os.path.exists(os.path.join(d, "model_00000001" + suffix)):
            shutil.copy(os.path.join(d, "model_00000001" + suffix), os.path.join(d, "model_00000002" + suffix))
    expect_error(base + ["-x", "4", "-y", "1", "--allow-config-change", "1", "-o", d], ["state_00000002_00000.bin", "model_00000002.bin", "belong"],
                 "10: state paired with another step's model -> error")
    flipped = P("flipped_e.bin")
    shutil.copy(m2, flipped)
    if os.path.exists(m2 + ".sum"):
        shutil.copy(m2 + ".sum", flipped + ".sum")
    flip_bit(flipped, 1024 + 4 * 300, 0)
    expect_error(["-i", tr, "-j", va, "-e", flipped, "-b", "2", "-t", "32", "-x", "1"], [flipped, "checksum"],
                 "10: -e model with a checksum file and a bit flip -> error")
    for bad, label in ((float("nan"), "NaN"), (float("inf"), "Inf")):
        path = P(f"bad_{label}.bin")
        shutil.copy(model, path)
        with open(path, "r+b") as f:
            f.seek(1024 + 4 * 777)
            f.write(struct.pack("<f", bad))
        expect_error(["-i", tr, "-j", va, "-e", path, "-b", "2", "-t", "32", "-x", "1"], [path, "non-finite"],
                     f"10: -e plain llm.c file with a {label} weight -> error")
    rc, out, err = run(TRAINER, ["-i", tr, "-j", va, "-e", model, "-b", "2", "-t", "32", "-x", "1", "-v", "0", "-s", "0"])
    report(rc == 0 and "no checksum file" in out, "10: -e plain llm.c file without a checksum file still loads (noted)",
           f"exit {rc}; {err[-200:]!r}")

    # ---- 11: minor -----------------------------------------------------------------------------------
    d = fresh_copy("state_loader")
    st = os.path.join(d, "state_00000002_00000.bin")
    state_rewrite(st, lambda h: h.__setitem__(14, 99))  # loader shard_pos (int64 at [14..15])
    expect_error(base + ["-x", "4", "-y", "1", "--allow-config-change", "1", "-o", d], [st, "shard_pos 99"],
                 "11: a bad loader position in a state file names the state file")
    d = fresh_copy("state_rng")
    st = os.path.join(d, "state_00000002_00000.bin")
    state_rewrite(st, lambda h: (h.__setitem__(28, 0), h.__setitem__(29, 0)))
    expect_error(base + ["-x", "4", "-y", "1", "--allow-config-change", "1", "-o", d], [st, "sampler RNG"], "11: sampler_rng = 0 in a state file -> error")
    badv = P("badv.bin")
    shutil.copy(model, badv)
    with open(badv, "r+b") as f:
        f.seek(12)
        f.write(struct.pack("<i", 100))  # V 256 -> 100 (Vp stays 256: the file size still fits)
    expect_error(["-i", tr, "-j", va, "-e", badv, "-b", "2", "-t", "32", "-x", "1"], [badv, "header"],
                 "11: a corrupt vocabulary size names the model's header, not only the shard")
    tail = P("tail_oov.bin")
    toks = [rng.randrange(256) for _ in range(2000)]
    toks[-1] = 300  # in the tail no batch of B*T = 64 reads
    write_shard(tail, toks)
    expect_error(["-i", tail, "-j", va, "-e", model, "-b", "2", "-t", "32", "-x", "2", "-v", "0", "-s", "0",
                  "--shuffle", "0"], [tail, "token 300", "position 1999"],
                 "11: an out-of-vocabulary id anywhere in a shard is found at open")
    for flag, val in (("-l", "0x1p-10"), ("-c", "0X1P-3"), ("--beta1", "inf"), ("-q", "nan")):
        expect_error(base + ["-x", "1", flag, val], [flag], f"11: float flag {flag} {val} -> error (decimal only)")

    shutil.rmtree(tmp, ignore_errors=True)
    print(f"(checks failed: {failures()})")
    return 1 if failures() else 0


if __name__ == "__main__":
    sys.exit(main())
