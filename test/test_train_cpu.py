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
import shutil
import struct
import subprocess
import sys
import tempfile

TRAINER = "./train_gpt_cpu"
failures = 0


def report(ok, name, detail=""):
    global failures
    if ok:
        print(f"PASS: {name}")
    else:
        failures += 1
        print(f"FAIL: {name}: {detail}")
    sys.stdout.flush()


def write_shard(path, tokens, magic=20240520, version=1, ntok=None, width="H"):
    header = [0] * 256
    header[0], header[1], header[2] = magic, version, len(tokens) if ntok is None else ntok
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}{width}", *tokens))


def run(args, expect_ok=True):
    p = subprocess.run([TRAINER] + args, capture_output=True, text=True, timeout=600)
    if expect_ok and p.returncode != 0:
        print(p.stdout[-3000:])
        print(p.stderr[-3000:])
    return p


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
        (d + ["-b", "abc"], "-b"),
        (d + ["-b", "0"], "-b"),
        (d + ["-b", "-3"], "-b"),
        (d + ["-t", "0"], "-t"),
        (d + ["-x", "0"], "-x"),
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

    shutil.rmtree(tmp, ignore_errors=True)
    print(f"(checks failed: {failures})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
