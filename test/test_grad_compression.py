#!/usr/bin/env python3
"""--grad-compression (issue 26 item 1): ./train_gpt_cpu's data-parallel gradient sum sent compressed
with an error-feedback residual per rank (llmc/train/gradcomp.h), on 2 ranks on loopback with a
tiny GPT-2 (V 256, L 2, C 64; written by dev/reference/train_gpt2.py) on data whose loss floor the
uncompressed run reaches in 30 steps (16 symbols drawn uniformly: ln 16).

- against dev/reference/grad_compression.py, bit for bit: each scheme's first 3 steps on both
  ranks (LLMC_TEST_GRAD_COMP_DUMP: every rank's gradient, residual before and after, and the sum):
  the reference's sum from the ranks' gradients and residuals equals every rank's sum, its new
  residuals the ranks', and each step starts from the last step's residual; powersgd:4 against the
  reference's float64 within PSGD_RTOL (sums, residuals, the warm-started Q); with an all-zero
  gradient matrix (LLMC_TEST_GRAD_COMP_ZERO_UNIT) it stays finite;
- 30 steps on 2 ranks (mpirun): the mean of the last 5 losses within 1% (int8, bf16) / 5%
  (topk:0.05, powersgd:4) of the uncompressed run's; comm_bytes per step at least 3.5x (int8) / 5x
  (topk:0.05) / 4x (powersgd:4) / 1.9x (bf16) below it; every rank ends each step with the same model (the final model of
  -pi tcp and -pi fs runs, a build without MPI, equals mpirun's bit for bit; -z 1's equals -z 0's);
- error feedback matters: with the residual zeroed (LLMC_TEST_GRAD_COMP_NO_RESIDUAL=1) the final
  model differs;
- resume: 15 steps then -y 1 to 30 gives the uninterrupted run's losses and final model byte for
  byte (int8, topk, powersgd: its Q too); the state file is version 4 with the residual section; resuming with another
  --grad-compression is a clear error (with --allow-config-change 1 a note and a reset); on one
  process the residuals are dropped with a note; onto 4 ranks they are resharded (a note);
- bad values (topk:0, topk:2, powersgd:0, int9, ...), -z 2, --optimizer adafactor: clear errors; one
  process: a note; --plan shows the grad_compression class (residual + 2 payloads) in closed form;
  ./train_gpt (cudasim, when built): a clear error.
Prints PASS:/FAIL: lines; exits non-zero on any failure. Run from the repository root.
"""
import json
import math
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "dev", "reference"))
from testlib import LOOPBACK_MPI, expect_error, failed_count, report  # noqa: E402
import grad_compression as gcref  # noqa: E402

TRAINER = "./train_gpt_cpu"
NOMPI = "build/test/train_gpt_cpu_nompi"
SIM = "build/cudasim/train_gpt"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", **LOOPBACK_MPI}
STEPS = 30
SCHEMES = {"int8": (0.01, 3.5), "topk:0.05": (0.05, 5.0), "powersgd:4": (0.05, 4.0), "bf16": (0.01, 1.9)}  # loss tolerance, bytes reduction
# powersgd against the float64 reference: the trainer sums in fp32 (a dot product of <= 256 terms,
# Gram-Schmidt over 4 columns), observed ~1e-6 of the largest magnitude; a wrong factor, order or
# residual is off by O(1)
PSGD_RTOL = 1e-3


def run(cmd, env=None, timeout=300):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**ENV, **(env or {})})


def mpirun(np_, args, env=None):
    return run(["mpirun", "--oversubscribe", "-np", str(np_), TRAINER] + args, env)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(np_, pi, args):
    """scripts/run_dist.sh local NP --pi PI with the build without MPI"""
    return run(["scripts/run_dist.sh", "local", str(np_), "--pi", pi] + args,
               env={"TRAINER": NOMPI, "PORT": str(free_port())})


def log_steps(outdir):
    with open(os.path.join(outdir, "log.jsonl")) as f:
        return {r["step"]: r for r in map(json.loads, f) if "train_loss" in r}


def same_bytes(a, b):
    return os.path.exists(a) and os.path.exists(b) and open(a, "rb").read() == open(b, "rb").read()


def final(outdir, step=STEPS):
    return os.path.join(outdir, f"model_{step:08d}.bin")


def setup(tmp):
    import train_gpt2 as ref
    cfg = ref.Config(max_seq_len=64, vocab_size=256, padded_vocab=ref.padded_vocab_size(256), n_layer=2, n_head=2,
                     channels=64).validate()
    model = os.path.join(tmp, "tiny.bin")
    ref.save_model(model, cfg, ref.init_tensors(cfg, 5))
    rng = random.Random(11)
    syms = rng.sample(range(256), 16)
    toks = [rng.choice(syms) for _ in range(20000)]
    shard = os.path.join(tmp, "data.bin")
    with open(shard, "wb") as f:
        f.write(struct.pack("<256i", *([20240520, 1, len(toks)] + [0] * 253)))
        f.write(struct.pack(f"<{len(toks)}H", *toks))
    return model, shard


def base(model, shard, steps=STEPS):
    return ["-e", model, "-i", shard, "-j", shard, "-t", "32", "-b", "4", "-l", "1e-2", "-u", "2", "-v", "0", "-s", "0",
            "--seed", "7", "--threads", "1", "-x", str(steps)]


def reference_check(tmp, args):
    """each scheme's first 3 steps against the reference, bit for bit"""
    for scheme in SCHEMES:
        d = os.path.join(tmp, "dump_" + scheme.replace(":", "_"))
        os.makedirs(d)
        p = mpirun(2, args[:-1] + ["3", "--grad-compression", scheme], env={"LLMC_TEST_GRAD_COMP_DUMP": d})
        if p.returncode != 0:
            report(False, f"{scheme}: the dumped run trains", (p.stdout + p.stderr)[-800:])
            continue
        buckets = {}
        for line in open(os.path.join(d, "buckets.txt")):
            k, off, ln = map(int, line.split())
            buckets.setdefault(k, []).append((off, ln))
        buckets = [buckets[k] for k in sorted(buckets)]
        ranks = [np.fromfile(os.path.join(d, f"rank{r}.bin"), "<f4") for r in range(2)]
        n = sum(ln for b in buckets for _, ln in b)
        ok, why = ranks[0].size == ranks[1].size == 3 * 4 * n, f"dump sizes {[x.size for x in ranks]}, n {n}"
        if scheme.startswith("powersgd:"):
            powersgd_check(d, scheme, ranks, n, ok, why)
            continue
        prev = [np.zeros(n, np.float32)] * 2
        for s in range(3 if ok else 0):
            g, e, e2, tot = ([x[(4 * s + i) * n:(4 * s + i + 1) * n] for x in ranks] for i in range(4))
            want, new, _ = gcref.reduce_step(scheme, g, e, buckets)
            checks = {"residual carried from the step before": all(np.array_equal(a, b) for a, b in zip(e, prev)),
                      "every rank's sum is the reference's": all(np.array_equal(t.view("<u4"), want.view("<u4")) for t in tot),
                      "the new residuals are the reference's": all(np.array_equal(a.view("<u4"), b.view("<u4"))
                                                                    for a, b in zip(e2, new)),
                      "the residual is not zero": s == 0 or any(np.any(x != 0) for x in e)}
            bad = [k for k, v in checks.items() if not v]
            if bad:
                ok, why = False, f"step {s + 1}: {bad}"
                break
            prev = e2
        report(ok, f"{scheme}: 2 ranks' first 3 steps (gradients, residuals, sums) equal dev/reference/grad_compression.py "
               "bit for bit", why)


def powersgd_check(d, scheme, ranks, n, ok, why):
    """powersgd's first 3 steps against the float64 reference, within PSGD_RTOL of the largest magnitude"""
    units = [tuple(map(int, line.split())) for line in open(os.path.join(d, "units.txt"))]
    qs = [np.fromfile(os.path.join(d, f"rank{r}_q.bin"), "<f4") for r in range(2)]
    nq = qs[0].size // 6
    ok = ok and qs[0].size == qs[1].size == 6 * nq and nq > 0 and np.array_equal(qs[0], qs[1])
    worst = 0.0

    def close(a, b):
        scale = max(float(np.max(np.abs(b))), 1e-30)
        return float(np.max(np.abs(np.asarray(a, np.float64) - b))) / scale

    prev = [np.zeros(n, np.float32)] * 2
    for s in range(3 if ok else 0):
        g, e, e2, tot = ([x[(4 * s + i) * n:(4 * s + i + 1) * n] for x in ranks] for i in range(4))
        q0, q1 = qs[0][2 * s * nq:(2 * s + 1) * nq], qs[0][(2 * s + 1) * nq:(2 * s + 2) * nq]
        want, new, qwant = gcref.powersgd_step(g, e, units, q0, int(scheme.split(":")[1]))
        errs = [close(tot[0], want), close(e2[0], new[0]), close(e2[1], new[1]), close(q1, qwant)]
        worst = max([worst] + errs)
        if not (np.array_equal(tot[0], tot[1]) and all(np.array_equal(a, b) for a, b in zip(e, prev)) and
                max(errs) <= PSGD_RTOL and (s == 0 or np.array_equal(q0, prev_q))):
            ok, why = False, f"step {s + 1}: errors {errs}, ranks' sums equal {np.array_equal(tot[0], tot[1])}"
            break
        prev, prev_q = e2, q1
    report(ok, f"{scheme}: 2 ranks' first 3 steps (sums, residuals, warm-started Q) equal the float64 reference within "
           f"{PSGD_RTOL} of the largest magnitude (largest {worst:.1e}); the ranks' sums bit-identical", why)


def zero_matrix(tmp, args):
    """PowerSGD with an all-zero gradient matrix (LLMC_TEST_GRAD_COMP_ZERO_UNIT=0: the first matrix,
    wte): the orthogonalisation's guard keeps everything finite"""
    out = os.path.join(tmp, "psgd_zero")
    p = mpirun(2, args[:-1] + ["5", "--grad-compression", "powersgd:4", "-o", out],
               env={"LLMC_TEST_GRAD_COMP_ZERO_UNIT": "0"})
    ok = p.returncode == 0 and os.path.exists(final(out, 5))
    if ok:
        w = np.fromfile(final(out, 5), "<f4", offset=1024)
        steps = log_steps(out)
        def finite(v):
            return isinstance(v, (int, float)) and math.isfinite(v)  # (a non-finite value is logged as null)
        ok = bool(np.all(np.isfinite(w))) and all(finite(r.get("train_loss")) and finite(r.get("grad_norm"))
                                                  for r in steps.values()) and len(steps) == 5
    report(ok, "powersgd:4 with an all-zero gradient matrix: 5 steps, finite losses, norms and weights",
           (p.stdout + p.stderr)[-800:])


def training(tmp, args):
    """30 steps per scheme on 2 ranks against the uncompressed run; returns {scheme: run dir}"""
    outs = {}
    for scheme in ["none"] + list(SCHEMES):
        out = os.path.join(tmp, "run_" + scheme.replace(":", "_"))
        p = mpirun(2, args + ["--grad-compression", scheme, "-n", "15", "-o", out])
        if p.returncode != 0:
            report(False, f"{scheme}: 2 ranks train {STEPS} steps", (p.stdout + p.stderr)[-1500:])
            continue
        outs[scheme] = (out, p)
    if "none" not in outs:
        return outs
    ref = log_steps(outs["none"][0])
    ref_loss = sum(ref[s]["train_loss"] for s in range(STEPS - 4, STEPS + 1)) / 5
    ref_bytes = [ref[s]["comm_bytes"] for s in range(1, STEPS + 1)]
    for scheme, (tol, factor) in SCHEMES.items():
        if scheme not in outs:
            continue
        out, p = outs[scheme]
        got = log_steps(out)
        loss = sum(got[s]["train_loss"] for s in range(STEPS - 4, STEPS + 1)) / 5
        rel = abs(loss - ref_loss) / ref_loss
        report(rel <= tol, f"{scheme}: the mean of the last 5 losses is within {tol:.0%} of the uncompressed run's "
               f"({loss:.4f} vs {ref_loss:.4f}: {rel:.2%})")
        ratio = min(a / got[s]["comm_bytes"] for s, a in zip(range(1, STEPS + 1), ref_bytes))
        report(ratio >= factor, f"{scheme}: comm_bytes of every step at least {factor}x below the uncompressed run's "
               f"(smallest ratio {ratio:.2f})")
        report("error-feedback residual" in p.stdout and "bytes sent per step" in p.stdout,
               f"{scheme}: the startup print shows the residual's memory", p.stdout[-600:])
    return outs


def transports(tmp, args, outs):
    """-pi tcp / fs (no MPI): the same bits as mpirun's"""
    if not os.path.exists(NOMPI):
        report(False, f"{NOMPI} is built (make {NOMPI})")
        return
    for pi, scheme in (("tcp", "int8"), ("fs", "topk:0.05")):
        if scheme not in outs:
            continue
        out = os.path.join(tmp, f"pi_{pi}")
        p = launch(2, pi, args + ["--grad-compression", scheme, "-n", "15", "-o", out])
        a, b = (log_steps(o) if p.returncode == 0 else {} for o in (out, outs[scheme][0]))
        ok = p.returncode == 0 and [a[s]["train_loss"] for s in a] == [b[s]["train_loss"] for s in b] and \
            same_bytes(final(out), final(outs[scheme][0])) and all(a[s]["comm_bytes"] == b[s]["comm_bytes"] for s in a)
        report(ok, f"{scheme} over -pi {pi} (no MPI): losses, comm_bytes and final model equal mpirun's bit for bit",
               (p.stdout + p.stderr)[-800:])


def zero_one(tmp, args, outs):
    """-z 1 (AdamW sharded, parameters all-gathered) on the same compressed sum: -z 0's bits"""
    for scheme in ("int8", "powersgd:4"):
        if scheme not in outs:
            continue
        out = os.path.join(tmp, "z1_" + scheme.replace(":", "_"))
        p = mpirun(2, args + ["--grad-compression", scheme, "-z", "1", "-o", out])
        report(p.returncode == 0 and same_bytes(final(out), final(outs[scheme][0])),
               f"{scheme} at -z 1: the final model equals -z 0's bit for bit", (p.stdout + p.stderr)[-600:])


def residual_matters(tmp, args, outs):
    for scheme in ("int8", "topk:0.05", "powersgd:4"):
        if scheme not in outs:
            continue
        out = os.path.join(tmp, "nores_" + scheme.replace(":", "_"))
        p = mpirun(2, args + ["--grad-compression", scheme, "-o", out], env={"LLMC_TEST_GRAD_COMP_NO_RESIDUAL": "1"})
        ok = p.returncode == 0 and os.path.exists(final(out)) and not same_bytes(final(out), final(outs[scheme][0]))
        report(ok, f"{scheme}: the residual is used (zeroed, LLMC_TEST_GRAD_COMP_NO_RESIDUAL=1, the final model differs)",
               (p.stdout + p.stderr)[-600:])


def with_b(args, b):
    """args with -b b"""
    i = args.index("-b")
    return args[:i + 1] + [str(b)] + args[i + 2:]


def strip_to(src, dst, step):
    """a copy of run src whose checkpoints after step are removed (a run stopped there)"""
    shutil.copytree(src, dst)
    for f in os.listdir(dst):
        for pre in ("DONE_", "model_", "state_"):
            if f.startswith(pre) and int(f[len(pre):len(pre) + 8]) > step:
                os.remove(os.path.join(dst, f))


def resume(tmp, args, outs):
    for scheme in ("int8", "topk:0.05", "powersgd:4"):
        if scheme not in outs:
            continue
        src = outs[scheme][0]
        head = struct.unpack("<256i", open(os.path.join(src, "state_00000015_00000.bin"), "rb").read(1024))
        n = os.path.getsize(final(src)) // 4 - 256
        report(head[1] == 4 and head[43] in (2, 3, 4) and head[45] == 2 and head[46] == n and
               (head[48] > 0) == scheme.startswith("powersgd"),
               f"{scheme}: the state file is version 4 with both ranks' residuals", f"{head[1]} {head[43:48]} n {n}")
        d = os.path.join(tmp, "resume_" + scheme.replace(":", "_"))
        strip_to(src, d, 15)
        p = mpirun(2, args + ["--grad-compression", scheme, "-n", "15", "-o", d, "-y", "1"])
        a, b = (log_steps(o) if p.returncode == 0 else {} for o in (d, src))
        ok = p.returncode == 0 and "resumed from step 15" in p.stdout and \
            all(a.get(s, {}).get("train_loss") == b[s]["train_loss"] for s in range(16, STEPS + 1)) and \
            same_bytes(final(d), final(src)) and \
            same_bytes(os.path.join(d, "state_00000030_00000.bin"), os.path.join(src, "state_00000030_00000.bin"))
        report(ok, f"{scheme}: 15 steps, then -y 1 to 30: the uninterrupted run's losses, model and state byte for byte",
               (p.stdout + p.stderr)[-1200:])
    if "int8" not in outs:
        return
    src = outs["int8"][0]
    d = os.path.join(tmp, "other_scheme")
    strip_to(src, d, 15)
    expect_error("an int8 checkpoint resumed with --grad-compression bf16: a clear error",
                 mpirun(2, args + ["--grad-compression", "bf16", "-o", d, "-y", "1"]), "--grad-compression")
    p = mpirun(2, args + ["--grad-compression", "topk:0.05", "-o", d, "-y", "1", "--allow-config-change", "1"])
    report(p.returncode == 0 and "--grad-compression int8 residuals" in p.stdout and "are dropped" in p.stdout,
           "an int8 checkpoint resumed with topk:0.05 --allow-config-change 1: trains, a note says the residuals are "
           "dropped", (p.stdout + p.stderr)[-800:])
    d = os.path.join(tmp, "one_process")
    strip_to(src, d, 15)
    p = run([TRAINER] + with_b(args, 8) + ["--grad-compression", "int8", "-o", d, "-y", "1"])
    report(p.returncode == 0 and "residuals of the 2 ranks" in p.stdout and "one process" in p.stdout,
           "a 2-rank int8 checkpoint resumed by one process: trains, a note says the residuals are dropped",
           (p.stdout + p.stderr)[-800:])
    d = os.path.join(tmp, "four_ranks")
    strip_to(src, d, 15)
    p = mpirun(4, with_b(args, 2) + ["--grad-compression", "int8", "-o", d, "-y", "1"])
    report(p.returncode == 0 and "resharded onto 4" in p.stdout,
           "a 2-rank int8 checkpoint resumed on 4 ranks (-b 2): the residuals resharded (a note)",
           (p.stdout + p.stderr)[-800:])


def bad_values(tmp, args, model, shard):
    for v, want in (("topk:0", "topk:0"), ("topk:2", "topk:2"), ("powersgd:0", "powersgd:0"), ("int9", "int9"),
                    ("topk:", "topk:"), ("topk:0.1x", "topk:0.1x"), ("powersgd:-1", "powersgd:-1"),
                    ("powersgd:2x", "powersgd:2x")):
        expect_error(f"--grad-compression {v}: a clear error naming it", run([TRAINER] + args + ["--grad-compression", v]),
                     f"--grad-compression: '{want}'" if v != "int9" else "unknown scheme 'int9'")
    expect_error("--grad-compression int8 -z 2: a clear error naming both flags",
                 run([TRAINER] + args + ["--grad-compression", "int8", "-z", "2"]), "--grad-compression int8 and -z 2")
    expect_error("--grad-compression int8 --optimizer adafactor: a clear error",
                 run([TRAINER] + args + ["--grad-compression", "int8", "--optimizer", "adafactor"]),
                 "--grad-compression int8 with --optimizer adafactor")
    p = run([TRAINER] + args[:-1] + ["2", "--grad-compression", "int8"])
    report(p.returncode == 0 and "with one process: nothing to communicate" in p.stdout,
           "one process with --grad-compression int8: trains, a note says the gradients are used uncompressed",
           (p.stdout + p.stderr)[-600:])
    # --plan: residual n floats + 2 payloads (int8: n bytes rounded to 4 + a scale per 256)
    p = run([TRAINER, "--plan", "--json", "-e", model, "-b", "4", "-t", "32", "-pn", "2", "--grad-compression", "int8"])
    try:
        j = json.loads(p.stdout)
        n = j["parameters"]
        want = 4 * n + 2 * ((n + 3) // 4 * 4 + 4 * math.ceil(n / 256))
        got = j["classes"].get("grad_compression")
    except (ValueError, KeyError):
        want, got = 0, None
    report(got == want, f"--plan -pn 2 --grad-compression int8: the grad_compression class is the residual + 2 payloads "
           f"({got} bytes, closed form {want})", (p.stdout + p.stderr)[-600:])
    if os.path.exists(SIM):
        expect_error("./train_gpt --grad-compression int8: a clear error", run([SIM] + args + ["--grad-compression", "int8"]),
                     "--grad-compression is not built for ./train_gpt yet")


def main():
    if not shutil.which("mpirun"):
        report(False, "OpenMPI is installed (mpirun)")
        return 1
    tmp = tempfile.mkdtemp(prefix="llmc_gradcomp_")
    try:
        model, shard = setup(tmp)
        args = base(model, shard)
        reference_check(tmp, args)
        outs = training(tmp, args)
        transports(tmp, args, outs)
        zero_one(tmp, args, outs)
        residual_matters(tmp, args, outs)
        zero_matrix(tmp, args)
        resume(tmp, args, outs)
        bad_values(tmp, args, model, shard)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rc = failed_count()
    print(f"test_grad_compression: {'all passed' if rc == 0 else 'FAILED'}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
