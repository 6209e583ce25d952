#!/usr/bin/env python3
"""End-to-end tests of ./train_gpt_cpu through its command line and files.

Covers: recompute levels give bit-identical losses; repeated runs are deterministic;
gradient accumulation of k micro-batches equals one batch k times larger; save -> reload ->
continue is bit-identical to not stopping (logs and final model file); llm.c model-file round
trips (fp32 version 3 and bf16 version 5); log.jsonl format; and bad inputs (each must exit
with status 1 and a message naming the file or flag, never a crash).
Prints PASS:/FAIL: lines; exits non-zero on any failure. Run from the repository root.
"""
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import failures, report, run_trainer, write_shard  # noqa: E402

# the program under test; test/test_sanitizers.sh points this at its ASan+UBSan build
TRAINER = os.environ.get("LLMC_TEST_TRAINER", "./train_gpt_cpu")


def run(args, expect_ok=True, env=None):
    return run_trainer(TRAINER, args, expect_ok, env)


def read_log(outdir):
    with open(os.path.join(outdir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def train_series(log, key):
    return [(r["step"], r[key]) for r in log if key in r]


def main():
    tmp = tempfile.mkdtemp(prefix="llmc_test_train_")
    seed = 1234
    print(f"temp dir {tmp}, data seed {seed}")
    rng = random.Random(seed)
    # Token data with some structure (a repeating pattern plus noise) so the model learns.
    pattern = [rng.randrange(50257) for _ in range(97)]
    train = [pattern[i % 97] if rng.random() < 0.8 else rng.randrange(50257) for i in range(20000)]
    val = [pattern[i % 97] if rng.random() < 0.8 else rng.randrange(50257) for i in range(3000)]
    tr, va = os.path.join(tmp, "train.bin"), os.path.join(tmp, "val.bin")
    write_shard(tr, train)
    write_shard(va, val)
    base = ["-i", tr, "-j", va, "-e", "d2", "-b", "4", "-t", "32", "-l", "1e-3", "-v", "3", "-m", "2",
            "-s", "0", "--seed", "7", "-u", "2"]

    # --- recompute levels and determinism -------------------------------------------------
    logs = {}
    for r in (0, 1, 2):
        out = os.path.join(tmp, f"rec{r}")
        p = run(base + ["-x", "6", "-r", str(r), "-o", out])
        report(p.returncode == 0, f"train -r {r} runs", p.stderr[-500:])
        logs[r] = read_log(out) if p.returncode == 0 else []
    out = os.path.join(tmp, "rec1_again")
    p = run(base + ["-x", "6", "-r", "1", "-o", out])
    again = read_log(out) if p.returncode == 0 else []
    for key in ("train_loss", "grad_norm", "val_loss"):
        ref = train_series(logs[0], key)
        report(len(ref) > 0 and all(train_series(logs[r], key) == ref for r in (1, 2)),
               f"recompute 0/1/2 give bit-identical {key}", f"{[train_series(logs[r], key) for r in (0, 1, 2)]}")
        report(len(ref) > 0 and train_series(again, key) == train_series(logs[1], key),
               f"two identical runs give bit-identical {key}")
    losses = [v for _, v in train_series(logs[0], "train_loss")]
    report(len(losses) == 6 and losses[-1] < losses[0], "loss decreases over 6 steps", f"{losses}")

    # --- log format --------------------------------------------------------------------------
    tl = [r for r in logs[0] if "train_loss" in r]
    vl = [r for r in logs[0] if "val_loss" in r]
    keys = {"step", "train_loss", "lr", "grad_norm", "step_ms", "tokens_per_s"}
    report(len(tl) == 6 and all(keys <= set(r) for r in tl) and [r["step"] for r in tl] == list(range(1, 7)),
           "log.jsonl training lines have step 1..N and the required keys", f"{tl[:1]}")
    report([r["step"] for r in vl] == [0, 3, 6] and all(isinstance(r["val_loss"], float) for r in vl),
           "log.jsonl validation lines at steps 0, 3, 6", f"{vl}")
    report(abs(tl[0]["lr"] - 0.5e-3) < 1e-9 and abs(tl[1]["lr"] - 1e-3) < 1e-9, "warmup lr in the log",
           f"{[r['lr'] for r in tl]}")

    # --- gradient accumulation -----------------------------------------------------------------
    acc = ["-i", tr, "-j", va, "-e", "d2", "-t", "32", "-l", "1e-3", "-v", "0", "-s", "0", "--shuffle", "0",
           "--seed", "7", "-x", "3"]
    big, small = os.path.join(tmp, "acc_big"), os.path.join(tmp, "acc_small")
    p1 = run(acc + ["-b", "4", "-o", big])
    p2 = run(acc + ["-b", "2", "-d", str(4 * 32), "-o", small])
    if p1.returncode == 0 and p2.returncode == 0:
        a, b = read_log(big), read_log(small)
        worst = 0.0
        for key in ("train_loss", "grad_norm"):
            for (s1, x), (s2, y) in zip(train_series(a, key), train_series(b, key)):
                worst = max(worst, abs(x - y) / max(abs(x), 1e-6))
        # fp32 sums over a different grouping: equal to ~1e-6 relative, 1e-4 leaves room for 3 steps of Adam
        report(worst < 1e-4 and len(train_series(b, "train_loss")) == 3,
               "2 micro-batches of B=2 equal one batch of B=4 (rel 1e-4)", f"worst relative difference {worst:g}")
        report("2 accumulation steps" in p2.stdout, "startup print shows the accumulation steps")
    else:
        report(False, "accumulation runs", p1.stderr[-300:] + p2.stderr[-300:])

    # --- save -> reload -> continue is bit-identical --------------------------------------------
    full, part = os.path.join(tmp, "ckpt_full"), os.path.join(tmp, "ckpt_part")
    ck = base + ["-x", "8", "-n", "4", "-s", "4", "-g", "4", "-v", "4"]
    p1 = run(ck + ["-o", full])
    p2 = run(ck + ["-o", part])
    ok = p1.returncode == 0 and p2.returncode == 0
    if ok:
        # forget everything after step 4, as if the job had died there
        for name in ("DONE_00000008", "model_00000008.bin", "state_00000008_00000.bin"):
            os.remove(os.path.join(part, name))
        p3 = run(ck + ["-o", part, "-y", "1"])
        ok = p3.returncode == 0 and "resumed from step 4" in p3.stdout
        report(ok, "-y 1 resumes from the latest complete checkpoint", p3.stdout[-500:] + p3.stderr[-500:])
    if ok:
        a, b = read_log(full), read_log(part)
        same = all(train_series(a, k) == train_series(b, k) for k in ("train_loss", "grad_norm", "lr", "val_loss"))
        report(same, "resumed run's log equals the uninterrupted run's (losses, norms, lr, val)",
               f"{train_series(a, 'train_loss')} vs {train_series(b, 'train_loss')}")
        m1 = open(os.path.join(full, "model_00000008.bin"), "rb").read()
        m2 = open(os.path.join(part, "model_00000008.bin"), "rb").read()
        report(m1 == m2, "final model file is byte-identical after resume")
        s1 = open(os.path.join(full, "state_00000008_00000.bin"), "rb").read()
        s2 = open(os.path.join(part, "state_00000008_00000.bin"), "rb").read()
        report(s1 == s2, "final optimizer state is byte-identical after resume")
        def last_sample(out):
            start = out.rfind("generating:\n---\n")
            return out[start:out.index("\n---\n", start + 16)] if start >= 0 else ""
        sample_a, sample_b = last_sample(p1.stdout), last_sample(p3.stdout)
        report(sample_a == sample_b and len(sample_a) > 0, "samples after resume equal the uninterrupted run's")
        leftovers = [f for f in os.listdir(part) if ".tmp." in f]
        report(not leftovers, "no temporary files left in the output directory", f"{leftovers}")
        # a restart loop's -y 1 after the run finished (e.g. killed between its last checkpoint and its
        # exit): exit 0, nothing trained, nothing written; a shorter -x is an error naming the step
        run_files = lambda: {f: os.path.getmtime(os.path.join(part, f)) for f in os.listdir(part) if not f.startswith(".")}  # noqa: E731
        before = run_files()  # (the run lock, .llmc.lock, is taken and released as by any run)
        p4 = run(ck + ["-o", part, "-y", "1"])
        after = run_files()
        report(p4.returncode == 0 and "nothing left to train" in p4.stdout and "step " not in p4.stdout.replace("reached step", "")
               and before == after, "-y 1 on a finished run: exit 0, 'nothing left to train', no run file touched",
               p4.stdout[-400:] + p4.stderr[-400:])
        p5 = run([a if a != "8" else "6" for a in ck] + ["-o", part, "-y", "1"], expect_ok=False)
        report(p5.returncode == 1 and "past -x 6" in p5.stderr, "-y 1 with a -x below the checkpoint's step: an error naming it",
               p5.stderr[-400:])

    # --- -x 0: evaluation only, equal to the validation loss the training run logged ----------------
    if ok:
        logged = dict(train_series(read_log(full), "val_loss"))
        ev = os.path.join(tmp, "eval_only")
        # no training data needed: -i names nothing
        p = run(["-x", "0", "-e", os.path.join(full, "model_00000008.bin"), "-i", os.path.join(tmp, "none_*.bin"),
                 "-j", va, "-b", "4", "-t", "32", "-m", "2", "-o", ev])
        lines = read_log(ev) if p.returncode == 0 else []
        report(p.returncode == 0 and len(lines) == 1 and lines[0].get("eval_only") == 1 and
               lines[0]["val_loss"] == logged.get(8) and "step" not in p.stdout.replace("(step", ""),
               "-x 0 -e CHECKPOINT: val loss equals the training run's at that step, logged, no training",
               f"rc {p.returncode}: {lines} vs logged {logged}; {p.stdout[-300:]} {p.stderr[-300:]}")
        resumed = os.path.join(tmp, "eval_resume")
        shutil.copytree(full, resumed)
        before = open(os.path.join(resumed, "log.jsonl")).read()
        p = run(base + ["-x", "0", "-y", "1", "-o", resumed])
        after = open(os.path.join(resumed, "log.jsonl")).read()
        last = json.loads(after.splitlines()[-1]) if after.startswith(before) and after != before else {}
        report(p.returncode == 0 and last.get("val_loss") == logged.get(8) and last.get("step") == 8 and
               f"val loss {logged.get(8, 0):.6f} (step 8)" in p.stdout,
               "-x 0 -y 1: latest checkpoint's val loss printed and appended to its log (old lines kept)",
               f"rc {p.returncode}; last line {last}; {p.stdout[-300:]} {p.stderr[-300:]}")

    # --- checkpoint retention: -nk keeps the newest N, -nm spares multiples of M ----------------------
    keep = os.path.join(tmp, "keep")
    p = run(base + ["-x", "7", "-n", "1", "-nk", "2", "-nm", "3", "-v", "0", "-o", keep])
    if p.returncode == 0:
        done = sorted(int(f[5:]) for f in os.listdir(keep) if f.startswith("DONE_"))
        models = sorted(int(f[6:14]) for f in os.listdir(keep) if f.startswith("model_") and f.endswith(".bin"))
        sums = sorted(int(f[6:14]) for f in os.listdir(keep) if f.startswith("model_") and f.endswith(".bin.sum"))
        report(done == [3, 6, 7] and models == [3, 6, 7] and sums == models, "-n 1 -nk 2 -nm 3 keeps steps 3, 6, 7 (and their checksum files)", f"DONE {done}, models {models}, sums {sums}")
    else:
        report(False, "checkpoint retention run", p.stderr[-300:])

    # --- llm.c model files: v3 fp32 and v5 bf16 round trips -----------------------------------------
    ckpt = os.path.join(full, "model_00000004.bin")
    if os.path.exists(ckpt):
        data = open(ckpt, "rb").read()
        h = struct.unpack("<256i", data[:1024])
        report(h[:8] == (20240326, 3, 1024, 50257, 2, 2, 128, 50304), "model file header is llm.c's (v3, d2)", f"{h[:8]}")
        n = (len(data) - 1024) // 4
        report(len(data) == 1024 + 4 * n, "model file size matches its parameters")
        # continue training from it: loss at the first step equals the logged loss of step 5 (same batch)
        cont = os.path.join(tmp, "from_ckpt", "nested", "dir")  # -o creates missing parents
        p = run(["-i", tr, "-j", va, "-e", ckpt, "-b", "4", "-t", "32", "-x", "1", "-v", "1", "-m", "2", "-s", "0",
                 "-n", "1", "-o", cont])
        report(p.returncode == 0, "-e accepts our own checkpoint", p.stderr[-300:])
        if p.returncode == 0:
            v0 = [r["val_loss"] for r in read_log(cont) if r.get("step") == 0]
            vref = [r["val_loss"] for r in read_log(full) if r.get("step") == 4 and "val_loss" in r]
            report(v0 == vref and v0, "val loss of a reloaded checkpoint equals the loss when it was saved", f"{v0} vs {vref}")
            # write bf16 (version 5) and check it is the fp32 file rounded to nearest even
            bf = os.path.join(tmp, "bf16")
            p = run(["-i", tr, "-j", va, "-e", ckpt, "-b", "4", "-t", "32", "-x", "1", "-v", "0", "-s", "0",
                     "-n", "1", "-o", bf, "--checkpoint-bf16", "1", "-l", "0"])
            b = open(os.path.join(bf, "model_00000001.bin"), "rb").read() if p.returncode == 0 else b""
            ok = len(b) == 1024 + 2 * n and struct.unpack("<2i", b[4:12])[0] == 5
            if ok:
                f32 = struct.unpack(f"<{n}I", data[1024:])
                b16 = struct.unpack(f"<{n}H", b[1024:])
                bad = 0
                for x, y in zip(f32, b16):
                    r = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16) & 0xFFFF  # lr 0, wd 0: weights unchanged
                    bad += r != y
                ok = bad == 0
            report(ok, "bf16 (version 5) checkpoint is the fp32 weights rounded to nearest even",
                   p.stderr[-300:] if p.returncode else "")
            p = run(["-i", tr, "-j", va, "-e", os.path.join(bf, "model_00000001.bin"), "-b", "4", "-t", "32", "-x", "1",
                     "-v", "1", "-m", "2", "-s", "0"])
            report(p.returncode == 0 and "val loss" in p.stdout, "-e reads a bf16 (version 5) checkpoint", p.stderr[-300:])

    # --- bad inputs -------------------------------------------------------------------------------------
    bad_magic = os.path.join(tmp, "bad_magic.bin")
    with open(bad_magic, "wb") as f:
        f.write(struct.pack("<256i", *([12345] + [0] * 255)))
    truncated = os.path.join(tmp, "truncated.bin")
    if os.path.exists(ckpt):
        with open(truncated, "wb") as f:
            f.write(open(ckpt, "rb").read()[:5000])
    short_shard = os.path.join(tmp, "short.bin")
    write_shard(short_shard, train[:5000], ntok=6000)
    oov = os.path.join(tmp, "oov.bin")
    write_shard(oov, [min(t, 50256) for t in train[:3000]] + [60000] + train[:2000])
    d = ["-i", tr, "-j", va, "-e", "d2", "-b", "4", "-t", "32", "-x", "2", "-s", "0", "-v", "0"]
    cases = [
        (["-i", tr, "-j", va, "-e", "/nonexistent/model.bin"], "/nonexistent/model.bin"),
        (["-i", tr, "-j", va, "-e", bad_magic], "not a model checkpoint"),
        (["-i", tr, "-j", va, "-e", truncated, "-b", "4", "-t", "32"], "truncated"),
        (["-i", os.path.join(tmp, "nomatch_*.bin"), "-j", va, "-e", "d2", "-b", "4", "-t", "32"], "nomatch_"),
        (["-i", short_shard, "-j", va, "-e", "d2", "-b", "4", "-t", "32"], "short.bin"),
        (["-i", oov, "-j", va, "-e", "d2", "-b", "4", "-t", "32", "-x", "30", "-v", "0", "-s", "0", "--shuffle", "0"], "60000"),
        (d + ["-t", "2048"], "-t 2048"),
        (d + ["-d", "1000"], "-d 1000"),
        (d + ["--bogus", "1"], "--bogus"),
        *[(d + ["-b", v], "-b") for v in ("abc", "0", "-3")],
        (d + ["-t", "0"], "-t"),
        (d + ["-x", "-2"], "-x"),
        (d + ["-x", "0", "-v", "0"], "-v"),
        (d + ["-l", "fast"], "-l"),
        (d + ["-k", "zigzag"], "zigzag"),
        (d + ["--precision", "bf16"], "precision"),
        (d + ["-r", "3"], "-r"),
        (d + ["-lg", "-2"], "-lg (--gpu-log-every)"),
        (d + ["-y", "1"], "-y"),
        (d + ["-b"], "-b"),
        (d + ["stray"], "stray"),
        (d + ["-o", os.path.join(tr, "sub")], "train.bin"),
        (["-i", tr, "-j", va, "-e", "d0"], "d0"),
    ]
    for args, needle in cases:
        p = run(args, expect_ok=False)
        msg = (p.stderr.strip().splitlines() or [""])[-1]
        ok = p.returncode == 1 and "error" in p.stderr and needle in p.stderr
        report(ok, f"bad input {' '.join(args[-2:])!r} -> exit 1 naming {needle!r}",
               f"exit {p.returncode}, stderr: {p.stderr.strip()[-300:]!r}")
    # -lg (GPU telemetry) on the CPU trainer: said once, then training as without it
    p_lg, p_plain = run(d + ["-lg", "1"]), run(d)
    losses = lambda out: [l.split("|")[1] for l in out.splitlines() if l.startswith("step ")]
    report(p_lg.returncode == 0 and p_lg.stdout.count("no GPU telemetry") == 1 and
           losses(p_lg.stdout) == losses(p_plain.stdout) and len(losses(p_plain.stdout)) == 2,
           "-lg 1 on the CPU trainer: a note that there is no GPU telemetry, then the same training",
           f"exit {p_lg.returncode}, losses {losses(p_lg.stdout)} vs {losses(p_plain.stdout)}: {p_lg.stderr[-300:]}")
    p = run(["--help"])
    report(p.returncode == 0 and "--batch-size" in p.stdout and "default: 4" in p.stdout, "--help lists flags with defaults")

    run_directory_tests(tmp, tr, va, train)

    shutil.rmtree(tmp, ignore_errors=True)
    print(f"(checks failed: {failures()})")
    return 1 if failures() else 0


def files_of(d):
    return sorted(f for f in os.listdir(d) if not f.startswith(".")) if os.path.isdir(d) else []


def run_directory_tests(tmp, tr, va, train):
    """One run per -o (issue 9): used directories, the final checkpoint, resume with changed flags,
    launchers and the lock, progress output, run metadata in log.jsonl, help and clarity."""
    rs = ["-i", tr, "-j", va, "-e", "d1", "-b", "2", "-t", "16", "-v", "0", "-s", "0"]

    # --- a used -o: refused without -y 1 / --overwrite 1; the final step is always saved ----------
    d1 = os.path.join(tmp, "used")
    p = run(rs + ["-x", "2", "-o", d1])
    report(p.returncode == 0 and {"model_00000002.bin", "state_00000002_00000.bin", "DONE_00000002"} <= set(files_of(d1)),
           "-o without -n saves the final model, state and DONE marker", f"{files_of(d1)} {p.stderr[-300:]}")
    before = {f: open(os.path.join(d1, f), "rb").read() for f in files_of(d1)}
    p = run(rs + ["-x", "1", "-o", d1], expect_ok=False)
    after = {f: open(os.path.join(d1, f), "rb").read() for f in files_of(d1)}
    report(p.returncode == 1 and d1 in p.stderr and "-y 1" in p.stderr and "--overwrite 1" in p.stderr and before == after,
           "a new run in a used -o is refused, naming the directory, -y 1 and --overwrite 1, and touches nothing",
           f"exit {p.returncode}: {p.stderr.strip()[-400:]}; files unchanged: {before == after}")
    p = run(rs + ["-x", "1", "-o", d1, "--overwrite", "1"])
    recs = read_log(d1) if p.returncode == 0 else []
    report(p.returncode == 0 and files_of(d1) == ["DONE_00000001", "log.jsonl", "model_00000001.bin", "model_00000001.bin.sum",
                                                 "state_00000001_00000.bin"]
           and [r.get("step") for r in recs if "train_loss" in r] == [1] and len([r for r in recs if "event" in r]) == 1,
           "--overwrite 1 deletes the old run's files and starts a new run", f"{files_of(d1)} {recs[:3]} {p.stderr[-300:]}")
    p = run(rs + ["-x", "2", "-o", d1, "-y", "1", "--allow-config-change", "1"])
    report(p.returncode == 0 and "resumed from step 1" in p.stdout, "-y 1 then resumes the new run, not the deleted one",
           p.stdout[-300:] + p.stderr[-300:])

    # --- -y 1: a directory with no run starts one; one with a run but no checkpoint starts over --------
    d2 = os.path.join(tmp, "fresh_resume")
    p = run(rs + ["-x", "1", "-o", d2, "-y", "1"], env={"OMPI_COMM_WORLD_SIZE": "1"})
    report(p.returncode == 0 and "holds no run yet" in p.stdout and "DONE_00000001" in files_of(d2),
           "-y 1 on a directory with no run starts a new run and says so (a launcher's world size 1 is fine)",
           p.stdout[-300:] + p.stderr[-300:])
    d3 = os.path.join(tmp, "log_only")
    os.makedirs(d3)
    open(os.path.join(d3, "log.jsonl"), "w").write('{"step":1,"train_loss":5}\n')
    p = run(rs + ["-x", "1", "-o", d3, "-y", "1"], expect_ok=False)
    recs = read_log(d3) if p.returncode == 0 else []
    report(p.returncode == 0 and d3 in p.stdout and "no complete checkpoint" in p.stdout and "starts over" in p.stdout
           and "DONE_00000001" in files_of(d3) and [r.get("train_loss") for r in recs if "step" in r and "train_loss" in r] != [5],
           "-y 1 on a run without a complete checkpoint (killed before its first) says so and starts it over",
           f"exit {p.returncode}: {p.stdout.strip()[-300:]} {p.stderr.strip()[-300:]}")

    # --- resume with changed flags: printed; math-changing ones need --allow-config-change 1 ---------
    d4 = os.path.join(tmp, "changed")
    p = run(rs + ["-x", "3", "-n", "1", "-o", d4])
    for name in ("DONE_00000003", "model_00000003.bin", "state_00000003_00000.bin", "DONE_00000002"):
        if os.path.exists(os.path.join(d4, name)):
            os.remove(os.path.join(d4, name))
    p = run(rs + ["-x", "3", "-o", d4, "-y", "1", "-l", "0.002"], expect_ok=False)
    report(p.returncode == 1 and "-l (--lr) 0.0003 (saved) -> 0.002 (now)" in p.stderr and "--allow-config-change 1" in p.stderr
           and "DONE_00000003" not in files_of(d4),
           "resume with a changed -l is an error naming the flag with both values", f"exit {p.returncode}: {p.stderr.strip()[-400:]}")
    p = run(rs + ["-x", "3", "-o", d4, "-y", "1", "-l", "0.002", "-m", "3", "--allow-config-change", "1"])
    report(p.returncode == 0 and "resumed from step 1" in p.stdout and
           re.search(r"-l \(--lr\) +0\.0003 -> 0\.002", p.stdout) and re.search(r"-m \(--val-max-steps\) +20 -> 3", p.stdout),
           "--allow-config-change 1 resumes and prints every changed flag", p.stdout[:600] + p.stderr[-300:])
    recs = read_log(d4) if p.returncode == 0 else []
    steps = [r["step"] for r in recs if "step" in r]
    events = [(i, r.get("event"), r.get("resumed_from")) for i, r in enumerate(recs) if "event" in r]
    report(steps == [1, 2, 3] and [e[1:] for e in events] == [("start", None), ("resume", 1)] and events[1][0] == 2 and
           all(isinstance(r.get("time"), float) for r in recs) and [r["time"] for r in recs] == sorted(r["time"] for r in recs),
           "resumed log: lines up to the checkpoint, a resume record, then the new steps; every record timed in order",
           f"{events} {steps}")
    if os.path.exists(os.path.join(d4, "DONE_00000003")):
        os.remove(os.path.join(d4, "DONE_00000003"))
    open(os.path.join(d4, "DONE_00000002"), "w").close()  # an llm.c-style empty marker
    p = run(rs + ["-x", "3", "-o", d4, "-y", "1", "-l", "0.002"])
    report(p.returncode == 0 and "resumed from step 2" in p.stdout and "no saved configuration" in p.stdout,
           "a checkpoint whose DONE marker is empty (llm.c, older llmc) resumes with a note", p.stdout[-300:] + p.stderr[-300:])

    # --- launchers and the lock: only one process writes a run directory ------------------------------
    for env in ({"OMPI_COMM_WORLD_SIZE": "2"}, {"PMI_SIZE": "2"}, {"SLURM_STEP_NUM_TASKS": "2"},
                {"SLURM_NTASKS": "2", "SLURM_PROCID": "1"}):
        p = run(rs + ["-x", "1", "-o", os.path.join(tmp, "mpi")], expect_ok=False, env=env)
        var = list(env)[0]
        report(p.returncode == 1 and var in p.stderr and "data parallelism" in p.stderr and not os.path.exists(os.path.join(tmp, "mpi")),
               f"started by a launcher ({' '.join(f'{k}={v}' for k, v in env.items())}): refused before touching -o",
               f"exit {p.returncode}: {p.stderr.strip()[-300:]}")
    d5 = os.path.join(tmp, "locked")
    first = subprocess.Popen([TRAINER] + rs + ["-x", "100000", "-o", d5], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(3000):  # until it is training (its first step is logged)
            if os.path.exists(os.path.join(d5, "log.jsonl")) and '"train_loss"' in open(os.path.join(d5, "log.jsonl")).read():
                break
            time.sleep(0.02)
        p = run(rs + ["-x", "1", "-o", d5, "-y", "1"], expect_ok=False)
        report(p.returncode == 1 and d5 in p.stderr and f"PID {first.pid}" in p.stderr and first.poll() is None,
               "a second trainer on a directory in use stops, naming the directory and the holder's PID",
               f"exit {p.returncode}: {p.stderr.strip()[-300:]}")
    finally:
        first.kill()
        first.wait()
    p = run(rs + ["-x", "1", "-o", d5, "--overwrite", "1"])
    report(p.returncode == 0, "the lock goes with its process", p.stderr[-300:])

    # --- progress: every line flushed, epoch and ETA in the step line, a summary at the end -----------
    d6 = os.path.join(tmp, "progress")
    out_path = os.path.join(tmp, "progress.txt")
    with open(out_path, "w") as out:
        # (two micro-batches: step 1 takes long enough for the poll below to see the gap before it)
        proc = subprocess.Popen([TRAINER, "-i", tr, "-j", va, "-e", "d2", "-b", "4", "-t", "64", "-d", "512", "-v", "1", "-m", "1",
                                 "-s", "0", "-x", "1", "-q", "0", "-o", d6], stdout=out, stderr=subprocess.STDOUT)
        early = False  # the step-0 validation line seen while step 1 has not printed yet
        while proc.poll() is None:
            text = open(out_path).read()
            if "val loss" in text and "(step 0)" in text and not re.search(r"^step +1/", text, re.M):
                early = True
            time.sleep(0.005)
    text = open(out_path).read()
    report(early, "the step-0 validation line is written out before step 1 runs", text[-300:])
    m = re.search(r"^step +1/1 \|.* \d+ tok/s \|.*\| epoch (\d+\.\d\d) \| (\S+), ETA (\S+) \| mem \d+\.\d\d GiB \(peak \d+\.\d\d\)$", text, re.M)
    report(m is not None and float(m.group(1)) > 0, "step line shows tok/s, epoch, elapsed time and ETA", text[-400:])
    model = os.path.join(d6, "model_00000001.bin")
    m = re.search(r"^done: steps 1-1 of 1 \((\d+) tokens\) in \S+ \| val loss best (\S+) \(step (\d)\), last (\S+) "
                  r"\(step 1\) \| model saved: (.*)$", text, re.M)
    report(m is not None and m.group(1) == "512" and m.group(5) == model and os.path.exists(model),
           "one summary line at the end: steps, tokens, time, best and last val loss, the saved model", text[-400:])
    lr = [r["lr"] for r in read_log(d6) if "lr" in r] if os.path.exists(os.path.join(d6, "log.jsonl")) else []
    report(lr == [0.0003], "-x 1 -q 0 trains its one step at the peak LR (not 0)", f"{lr}")

    # --- run metadata: the first record holds the resolved configuration, version and machine --------
    tiny = os.path.join(tmp, "tiny.bin")
    write_shard(tiny, train[:3 * 2 * 16 + 1])  # three batches of B=2, T=16: one epoch is 3 steps
    d7 = os.path.join(tmp, "meta")
    p = run(["-i", tiny, "-j", va, "-e", "d1", "-b", "2", "-t", "16", "-v", "0", "-s", "0", "-o", d7])
    recs = read_log(d7) if p.returncode == 0 else [{}]
    first = recs[0]
    c = first.get("config", {})
    version = first.get("version", "")
    try:
        in_git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).returncode == 0
    except OSError:
        in_git = False
    report(first.get("event") == "start" and c.get("max_steps") == 3 and c.get("total_batch") == 32 and
           isinstance(c.get("threads"), int) and c["threads"] >= 1 and c.get("batch_size") == 2 and c.get("lr") == 0.0003 and
           first.get("host") and first.get("cpu") and first.get("cores", 0) >= 1 and "CPU fp32" in first.get("backend", "") and
           re.fullmatch(r"[0-9a-f]{7,40}(-dirty)?" if in_git else r"unknown", version),
           "log.jsonl's first record: resolved -x/-d/--threads, every flag, version (git commit), host, CPU, cores",
           f"{first}")
    now = time.time()
    report(len(recs) == 4 and all(abs(r.get("time", 0) - now) < 3600 for r in recs),
           "every log.jsonl record has a time (Unix seconds)", f"{recs}")

    # --- help and clarity ---------------------------------------------------------------------------
    p = run(["-h"], expect_ok=False)
    report(p.returncode == 1 and "--help" in p.stderr and "HellaSwag" in p.stderr,
           "-h without a value points to --help", p.stderr.strip()[-300:])
    p = run(rs + ["-e", d1], expect_ok=False)
    report(p.returncode == 1 and "is a directory" in p.stderr and "model_00000002.bin" in p.stderr,
           "-e DIR says it is a directory and names its latest model file", p.stderr.strip()[-300:])
    head = text[text.find("configuration:"):text.find("backend:")]
    report(head.startswith("configuration: -i ") and len(head.splitlines()) <= 8 and
           not re.search(r"(^| )(-pi|-ps|-pf|-pr|-pg|--precision|-ge|-w|-f|-lg|--peak-tflops|-h) ", head),
           "the startup print is compact: changed flags first, no multi-process or GPU-only flags on one CPU process", head)


if __name__ == "__main__":
    sys.exit(main())
