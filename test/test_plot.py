#!/usr/bin/env python3
"""Checks scripts/plot: one or several log.jsonl (synthetic, and one from a real ./train_gpt_cpu
run) become a valid PNG of sensible size with the panels whose keys exist; bad inputs (missing
file, a line that is not JSON, nothing to plot, a directory without a log) print "error: ...",
exit 1 and write no PNG. Prints PASS:/FAIL: lines; exits non-zero on any failure."""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import failures, report  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLOT = os.path.join(ROOT, "scripts", "plot")
def png_size(path):
    """(width, height) from a PNG's IHDR, or None if the file is not a PNG."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def plot(*args):
    return subprocess.run([PLOT, *args], capture_output=True, text=True, cwd=ROOT)


def write_log(path, steps, memory):
    with open(path, "w") as f:
        f.write(json.dumps({"config": {"B": 4}}) + "\n")  # a record without "step" is skipped
        for s in range(steps + 1):
            if s % 10 == 0:
                f.write(json.dumps({"step": s, "val_loss": 10 * math.exp(-s / 30) + 3}) + "\n")
            if s:
                rec = {"step": s, "train_loss": 10 * math.exp(-s / 25) + 3, "lr": 1e-3 * s / steps,
                       "grad_norm": 1 + 1 / s, "tokens_per_s": 1000 + s}
                if memory:
                    rec.update(mem_gib=10.0, peak_mem_gib=12.0)
                f.write(json.dumps(rec) + "\n")


def check_png(name, r, out, panels, runs):
    size = png_size(out) if os.path.exists(out) else None
    ok = (r.returncode == 0 and size is not None and 600 <= size[0] <= 4000 and 300 <= size[1] <= 4000
          and os.path.getsize(out) > 20000 and f"{panels} panel(s)" in r.stderr and f"{runs} run(s)" in r.stderr)
    report(ok, name, f"rc {r.returncode}, PNG size {size}, {os.path.getsize(out) if os.path.exists(out) else 0} bytes; "
           f"stderr {r.stderr.strip()[-300:]}")


def main():
    with tempfile.TemporaryDirectory(prefix="llmc_test_plot_") as tmp:
        a, b = os.path.join(tmp, "runA"), os.path.join(tmp, "runB")
        os.makedirs(a), os.makedirs(b)
        write_log(os.path.join(a, "log.jsonl"), 50, memory=False)
        write_log(os.path.join(b, "log.jsonl"), 40, memory=True)
        out = os.path.join(tmp, "two.png")
        check_png("plot_two_runs_overlaid_with_memory_panel", plot("-o", out, a, os.path.join(b, "log.jsonl")), out, 5, 2)
        out = os.path.join(tmp, "one.png")
        check_png("plot_one_run_without_memory_keys_skips_that_panel", plot("-o", out, a), out, 4, 1)

        # a real run's log
        shard = os.path.join(tmp, "tok.bin")
        n = 2 * 32 * 4 + 1
        with open(shard, "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
            f.write(struct.pack(f"<{n}H", *[(i * 7919) % 50257 for i in range(n)]))
        run = os.path.join(tmp, "real")
        p = subprocess.run([os.path.join(ROOT, "train_gpt_cpu"), "-i", shard, "-j", shard, "-e", "d1", "-b", "2", "-t", "32",
                            "-x", "4", "-v", "2", "-m", "1", "-s", "0", "-o", run], capture_output=True, text=True, cwd=ROOT)
        if p.returncode != 0:
            report(False, "plot_real_training_log", f"training run failed: {p.stderr[-300:]}")
        else:
            # loss, lr, norm, throughput, memory (accounted bytes) and memory by class (mem_by_class)
            out = os.path.join(tmp, "real.png")
            r = plot("-o", out, run)
            check_png("plot_real_training_log", r, out, 6, 1)
            report("memory by class" in r.stderr and "memory, memory by class" in r.stderr,
                   "plot_real_training_log_has_memory_by_class", r.stderr[-300:])
            classes = {c for rec in map(json.loads, open(os.path.join(run, "log.jsonl"))) for c in rec.get("mem_by_class", {})}
            report({"parameters", "activations", "gradients"} <= classes, "real_log_has_mem_by_class", classes)

        bad = os.path.join(tmp, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"step": 1, "train_loss": 5.0}\n{"step": 2, "train_loss": 4.9}\n{"step": 3, "train_lo\n')
        nothing = os.path.join(tmp, "nothing.jsonl")
        with open(nothing, "w") as f:
            f.write('{"config": 1}\n{"step": 1, "note": "text only"}\n')
        not_utf8 = os.path.join(tmp, "not_utf8.jsonl")
        with open(not_utf8, "wb") as f:
            f.write(b'{"step": 1, "train_loss": 5.0}\n{"step": 2, "note": "\xff\xfe"}\n')
        empty_dir = os.path.join(tmp, "empty_dir")
        os.makedirs(empty_dir)
        cases = {
            "missing_file": ([os.path.join(tmp, "nope.jsonl")], "nope.jsonl"),
            "non_json_line": ([bad], "line 3"),
            "one_good_one_bad_log": ([a, bad], "line 3"),
            "nothing_to_plot": ([nothing], "no plottable"),
            "not_utf8_line": ([not_utf8], "line 2: not UTF-8"),
            "directory_without_log": ([empty_dir], "empty_dir"),
        }
        for name, (args, needle) in cases.items():
            out = os.path.join(tmp, f"{name}.png")
            r = plot("-o", out, *args)
            # one error line naming the file and line: no traceback, and no "starting at at" (json's
            # message ends in "starting at"; the column follows it once)
            clean = "Traceback" not in r.stderr and " at at " not in r.stderr
            report(r.returncode == 1 and r.stderr.startswith("error:") and needle in r.stderr and clean
                   and not os.path.exists(out),
                   f"plot_bad_input_{name}", f"rc {r.returncode}, stderr {r.stderr.strip()[-300:]!r}, png written: {os.path.exists(out)}")
        r = plot("-o", os.path.join(tmp, "x.jpg"), a)
        report(r.returncode == 1 and "error:" in r.stderr and ".png" in r.stderr, "plot_bad_input_output_not_png", r.stderr[-200:])
    print(f"({failures()} failed)")
    return 1 if failures() else 0


if __name__ == "__main__":
    sys.exit(main())
