#!/usr/bin/env python3
"""Data-parallel Llama 3 through ./train_gpt_cpu under mpirun (issues 10 + 11), on loopback.

A 2-layer Llama (C 64, NH 4, NKV 2, F 256, V 1000, untied head) written here as llmc's Llama
checkpoint with random weights:
- 2 ranks x -b 4 at -z 0, 1, 2 and 3 equal one process with -b 8 over a 10-step fp32 trajectory
  (train losses, grad norms, val losses; final parameters), with test_dist.py's tolerances;
- per-rank bytes of every sharded class at -z 2 and 3: AdamW m/v, the gradient shard and (-z 3)
  the parameters ceil(numel / 2) floats, the gradients only the outer bucket (wte, lnfw, lm_head)
  and one layer's, the -z 3 gather buffers the outer bucket and two layers', as printed and as
  allocated (log.jsonl's mem_by_class, from the accounting allocator);
- resume with another rank count: 2 ranks at -z 3 -> 1 process (-z 3), 1 process -> 2 ranks at
  -z 3, against the uninterrupted run (losses and final parameters).
Prints PASS:/FAIL: lines; exits non-zero on any failure. Run from the repository root.
"""
import os
import random
import shutil
import struct
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from testlib import failed_count, report, write_shard  # noqa: E402
from test_dist import LOSS_RTOL, PARAM_ATOL, inf_if_none, loss_diff, losses, mpirun, param_diff, params, shard_bytes  # noqa: E402

MAXT, V, L, NH, NKV, C, F = 64, 1000, 2, 4, 2, 64, 256


def table(vocab=V):
    """(name, floats per layer or whole, stacked over L?) in llmc/models/llama.h's table order"""
    vp, qkv = (vocab + 127) // 128 * 128, (NH + 2 * NKV) * (C // NH)
    return [("wte", vp * C, 0), ("ln1w", C, 1), ("qkvw", qkv * C, 1), ("attprojw", C * C, 1), ("ln2w", C, 1),
            ("fcw", 2 * F * C, 1), ("fcprojw", C * F, 1), ("lnfw", C, 0), ("lm_head", vp * C, 0)]


def llama_file(path, layers=L, vocab=V, seed=5):
    """llmc's Llama checkpoint (llmc/models/llama.h: int32 header[256], then the table's float32 tensors)
    with random weights: N(0, 0.02), RMSNorm gains 1, padded vocabulary rows 0; untied head."""
    vp = (vocab + 127) // 128 * 128
    h = [0] * 256
    h[:12] = [20261130, 1, 1, MAXT, vocab, vp, layers, NH, NKV, C, F, 0]
    h[16:21] = [struct.unpack("<i", struct.pack("<f", x))[0] for x in (1e-5, 500000.0, 0.0, 0.0, 0.0)]
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *h))
        for name, n, stacked in table(vocab):
            n *= layers if stacked else 1
            w = np.ones(n) if name in ("ln1w", "ln2w", "lnfw") else rng.normal(0, 0.02, n)
            if name in ("wte", "lm_head"):
                w.reshape(vp, C)[vocab:] = 0
            f.write(w.astype("<f4").tobytes())


def main():
    tmp = tempfile.mkdtemp(prefix="llmc_llama_dist_")
    model = os.path.join(tmp, "llama.bin")
    llama_file(model)
    rng = random.Random(99)
    pattern = [rng.randrange(V) for _ in range(53)]
    toks = [pattern[i % 53] if rng.random() < 0.8 else rng.randrange(V) for i in range(6000)]
    tr, va = os.path.join(tmp, "train.bin"), os.path.join(tmp, "val.bin")
    write_shard(tr, toks[:5000])
    write_shard(va, toks[5000:])
    # 8 sequences of 16 tokens per step
    base = ["-e", model, "-i", tr, "-j", va, "-t", "16", "-d", "128", "-l", "1e-3", "-u", "2", "-v", "5", "-m", "2",
            "-s", "0", "--seed", "7", "--threads", "1", "-x", "10", "-n", "5"]
    final = "model_00000010.bin"

    def train(name, np_, extra):
        out = os.path.join(tmp, name)
        p = mpirun(np_, base + extra + ["-o", out])
        if p.returncode != 0:
            print(p.stdout[-1500:] + p.stderr[-1500:])
        return p, out

    try:
        p, ref = train("p1_b8", 0, ["-b", "8"])
        if not report(p.returncode == 0, "Llama, one process, -b 8: trains", p.stderr[-300:]):
            return 1
        want = {k: losses(ref, k) for k in ("train_loss", "grad_norm", "val_loss")}
        ref_par = params(os.path.join(ref, final))
        numel = len(ref_par)
        outer = 4 * sum(n for _, n, stacked in table() if not stacked)
        layer = 4 * sum(n for _, n, stacked in table() if stacked)
        report(outer + L * layer == 4 * numel, f"the test's table adds up to the model's {numel} parameters")
        for z in (0, 1, 2, 3):
            what = f"Llama, 2 ranks x -b 4, -z {z}"
            p, out = train(f"p2_z{z}", 2, ["-b", "4", "-z", str(z)])
            if not report(p.returncode == 0, f"{what}: trains", p.stderr[-500:]):
                continue
            ld = max(inf_if_none(loss_diff(losses(out, k), w)) for k, w in want.items())
            report(ld <= LOSS_RTOL, f"{what}: train/val losses and grad norms equal one process with -b 8 (rel {LOSS_RTOL}; "
                   f"largest {ld:.1e})", f"largest relative difference {ld}")
            pd = param_diff(params(os.path.join(out, final)), ref_par)
            report(pd <= PARAM_ATOL, f"{what}: final parameters equal one process with -b 8 (abs {PARAM_ATOL}; "
                   f"largest {pd:.1e})", f"largest difference {pd}")
            if z < 2:
                continue
            printed, got, bad = shard_bytes(p, out, z, numel, 2, outer, layer)
            report(printed and got and not any(bad),
                   f"Llama -z {z} on 2 ranks: per-rank bytes printed and allocated: m, v, gradient shard"
                   f"{', parameters' if z == 3 else ''} ceil(numel / 2) floats, gradients two buckets"
                   f"{', gather buffers the outer bucket and two layers' if z == 3 else ''}",
                   f"{[l for l in p.stdout.splitlines() if l.startswith('optimizer')]} {bad[:1]}")

        # resume with another rank count, from the checkpoints at step 5
        cases = [(os.path.join(tmp, "p2_z3"), "r2to1_z3", 0, ["-b", "8", "-z", "3"], "2 ranks (-z 3) -> 1 process (-z 3)"),
                 (ref, "r1to2_z3", 2, ["-b", "4", "-z", "3"], "1 process -> 2 ranks (-z 3)")]
        for src, name, np_, extra, what in cases:
            out = os.path.join(tmp, name)
            shutil.copytree(src, out)
            for f in os.listdir(out):
                if "00000010" in f:
                    os.remove(os.path.join(out, f))
            p = mpirun(np_, base + extra + ["-o", out, "-y", "1"])
            if not report(p.returncode == 0 and "resumed from step 5" in p.stdout, f"Llama resume {what}: resumes from step 5",
                          p.stdout[-500:] + p.stderr[-500:]):
                continue
            src_loss = losses(src)
            ld = loss_diff(losses(out), src_loss)
            report(ld is not None and ld <= LOSS_RTOL, f"Llama resume {what}: losses equal the uninterrupted run's (rel {LOSS_RTOL})",
                   f"largest relative difference {ld}")
            pd = param_diff(params(os.path.join(out, final)), params(os.path.join(src, final)))
            report(pd <= PARAM_ATOL, f"Llama resume {what}: final parameters equal the uninterrupted run's (abs {PARAM_ATOL}; "
                   f"largest {pd:.1e})", f"largest difference {pd}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return failed_count()


if __name__ == "__main__":
    sys.exit(main())
