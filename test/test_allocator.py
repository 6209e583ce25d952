#!/usr/bin/env python3
"""test_allocator.py - ./train_gpt's device caching allocator (llmc/cuda/devalloc.cuh) inside a run,
through the cudasim harness (its hand-worked sequences are test/test_dev_alloc.cu's):
- --memory-snapshot FILE: the snapshot's classes are the memory plan's (--plan --json, same flags),
  byte for byte; its totals agree with its allocations and segments; every allocation names its
  class, step and phase; step 1's matmul-tuning copies appear in its history, allocated and freed;
  scripts/memory_snapshot.py prints its timeline;
- every step's log record has dev_reserved, dev_allocated, dev_largest_free (the snapshot's at the
  end) and the step line says "dev alloc";
- the model and state files are byte-identical to a run without --memory-snapshot;
- a planted device leak (LLMC_TEST_DEVICE_LEAK=<class>) is an error naming the class after step 3
  (the warm-up is 2 steps); a bad --memory-snapshot path is an error before any training; the CPU
  trainer refuses the flag.
Usage: test/test_allocator.py [build/cudasim/train_gpt] [./train_gpt_cpu]"""
import glob
import json
import os
import random
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hardening_util import write_model  # noqa: E402
from testlib import all_built, failed_count, report, same_bytes, write_shard  # noqa: E402

SIM = sys.argv[1] if len(sys.argv) > 1 else "build/cudasim/train_gpt"
CPU = sys.argv[2] if len(sys.argv) > 2 else "./train_gpt_cpu"
PHASES = {"setup", "forward", "backward", "update", "eval", "sample", "checkpoint", "end"}


def run(prog, args, env_extra=None):
    # CUDASIM_LT_ALGOS=2: two matmul candidates to time, so step 1 allocates (and frees) lt_plans.cuh's copies
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive", CUDASIM_LT_ALGOS="2", **(env_extra or {}))
    return subprocess.run([prog] + args, capture_output=True, text=True, env=env, timeout=300)


def records(run_dir):
    path = os.path.join(run_dir, "log.jsonl")
    return [r for r in map(json.loads, open(path)) if "train_loss" in r] if os.path.exists(path) else []


def check_snapshot(snap, plan):
    t = snap["totals"]
    allocs = snap["allocations"]
    report(t["allocated"] == sum(a["block"] for a in allocs) and t["requested"] == sum(a["size"] for a in allocs)
           and t["reserved"] == sum(s["size"] for s in snap["segments"]) and t["segments"] == len(snap["segments"])
           and 0 < t["largest_free"] <= t["reserved"] - t["allocated"],  # (the tuning copies' freed blocks stay cached)
           "snapshot totals agree with its allocations and segments", json.dumps(t))
    bad = [a for a in allocs if a["block"] < a["size"] or a["block"] % 512 or a["phase"] not in PHASES or a["step"] < 0]
    report(allocs and not bad, "every allocation has its class, a 512-rounded block, a step and a phase", str(bad[:3]))
    ends = {}
    for a in allocs:  # blocks in one segment do not overlap
        seg = [s for s in snap["segments"] if s["segment"] == a["segment"]]
        ok = seg and a["offset"] >= ends.get(a["segment"], 0) and a["offset"] + a["block"] <= seg[0]["size"]
        if not ok:
            report(False, "allocations lie inside their segments without overlap", json.dumps(a))
            break
        ends[a["segment"]] = a["offset"] + a["block"]
    planned = {c: b for c, b in plan["classes"].items() if b}
    got = {c: v["requested"] for c, v in snap["classes"].items()}
    report(planned == got, "the snapshot's classes are the plan's, with the plan's bytes",
           f"plan {planned}\nsnapshot {got}")
    tune = [e for e in snap["events"] if e["step"] == 1 and e["class"] == "workspaces" and e["phase"] in ("forward", "backward")]
    report(tune and sum(e["bytes"] for e in tune) == 0 and any(e["bytes"] < 0 for e in tune) and t["reused"] > 0,
           "the history has step 1's matmul-tuning copies (workspaces) allocated and freed, and later ones reused the cached blocks",
           f"{tune[:4]} reused {t['reused']}")
    want = planned.get("parameters", 0)
    params = [a for a in allocs if a["class"] == "parameters"]
    report(len(params) == 1 and params[0]["size"] == want and params[0]["phase"] == "setup" and params[0]["step"] == 0,
           "the parameters are one block of the plan's size, made at setup (step 0)", str(params))


def tiny_files(W):
    """A tiny GPT-2 (head size 16) and a shard of its tokens in W."""
    model, data = os.path.join(W, "model.bin"), os.path.join(W, "train.bin")
    write_model(model, maxT=32, V=200, L=2, NH=4, C=64, Vp=256)
    rng = random.Random(26)
    write_shard(data, [rng.randrange(200) for _ in range(4096)])
    return model, data


def checks(W):
    model, data = tiny_files(W)
    shape = ["-e", model, "-b", "2", "-t", "16", "--precision", "fp32"]
    common = shape + ["-i", data, "-v", "0", "-s", "0", "-x", "4", "-n", "2"]
    snap_path = os.path.join(W, "snap.json")
    a_dir, b_dir = os.path.join(W, "a"), os.path.join(W, "b")
    a = run(SIM, common + ["-o", a_dir, "--memory-snapshot", snap_path])
    report(a.returncode == 0 and len(records(a_dir)) == 4, "train_gpt (harness) with --memory-snapshot trains 4 steps",
           a.stdout[-400:] + a.stderr[-400:])
    p = run(SIM, ["--plan", "--json"] + shape)
    plan = json.loads(p.stdout) if p.returncode == 0 else {"classes": {}}
    snap = json.load(open(snap_path)) if os.path.exists(snap_path) else None
    report(snap is not None and snap.get("format") == "llmc-memory-snapshot" and snap["phase"] == "end" and snap["step"] == 4,
           "the snapshot is written at the end of the run (step 4)", str(snap)[:300])
    if snap:
        check_snapshot(snap, plan)
        recs = records(a_dir)
        keys = ("dev_reserved", "dev_allocated", "dev_largest_free")
        report(recs and all(all(k in r for k in keys) for r in recs) and
               all(recs[-1][k] == snap["totals"][k[4:]] for k in keys),
               "every step's record has dev_reserved/dev_allocated/dev_largest_free, the last one the snapshot's",
               str([{k: r.get(k) for k in keys} for r in recs]))
        lines = re.findall(r"^step +\d+/4 .*\| dev alloc [\d.]+ MiB of [\d.]+ reserved, largest free [\d.]+$", a.stdout, re.M)
        report(len(lines) == 4, "every step line says 'dev alloc X MiB of Y reserved, largest free Z'", a.stdout[-600:])
        s = subprocess.run([sys.executable, "scripts/memory_snapshot.py", snap_path], capture_output=True, text=True)
        report(s.returncode == 0 and "timeline" in s.stdout and re.search(r"step +0 setup", s.stdout)
               and "parameters" in s.stdout, "scripts/memory_snapshot.py prints the totals, classes and timeline",
               s.stdout[-500:] + s.stderr[-300:])
    # the trainer's files do not change with the flag
    b = run(SIM, common + ["-o", b_dir])
    names = sorted(os.path.basename(f) for f in glob.glob(os.path.join(a_dir, "*_0000000*.bin")))
    same = b.returncode == 0 and names and all(same_bytes(os.path.join(a_dir, n), os.path.join(b_dir, n)) for n in names)
    report(bool(same) and any(n.startswith("state_") for n in names) and any(n.startswith("model_") for n in names),
           f"model and state files byte-identical without --memory-snapshot ({', '.join(names)})", b.stderr[-300:])
    report("memory leak" not in a.stdout + a.stderr, "no leak reported in a clean run", a.stderr[-300:])
    # the planted leak
    for cls in ("activations", "workspaces"):
        leak = run(SIM, common[:-4] + ["-x", "5", "-n", "0"], {"LLMC_TEST_DEVICE_LEAK": cls})
        named = re.search(rf"error: memory leak: device allocator class '{cls}' grew from \d+ bytes allocated after step 2 "
                          rf"to \d+ bytes after step 3 \(its newest live block: 4096 bytes made at step 3, phase update\)", leak.stderr)
        report(leak.returncode == 1 and named and not re.search(r"^step +3/", leak.stdout, re.M),
               f"a planted device leak in '{cls}' is named after step 3", leak.stderr[-400:])
    # bad paths: before any training, nothing written
    for bad, what in ((os.path.join(W, "missing", "s.json"), "does not exist"), (W, "is not a regular file")):
        r = run(SIM, common[:-2] + ["-n", "0", "--memory-snapshot", bad])
        report(r.returncode == 1 and "error: flag --memory-snapshot" in r.stderr and what in r.stderr
               and "step " not in r.stdout and not os.path.exists(os.path.join(W, "missing")),
               f"--memory-snapshot {os.path.relpath(bad, W) or '.'}: a clear error before training ({what})", r.stderr[-300:])
    c = run(CPU, ["-e", model, "-i", data, "-b", "2", "-t", "16", "-x", "1", "-v", "0", "-s", "0",
                  "--memory-snapshot", os.path.join(W, "cpu.json")])
    report(c.returncode == 1 and "error: flag --memory-snapshot is ./train_gpt's" in c.stderr
           and not os.path.exists(os.path.join(W, "cpu.json")), "the CPU trainer refuses --memory-snapshot clearly", c.stderr[-300:])


def main():
    if not all_built(SIM, CPU):
        return 1
    with tempfile.TemporaryDirectory(prefix="llmc_alloc.") as W:
        checks(W)
    return failed_count()


if __name__ == "__main__":
    sys.exit(main())
