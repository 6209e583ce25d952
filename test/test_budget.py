#!/usr/bin/env python3
"""--memory-budget (issue 14 item 4): the cheapest configuration whose memory plan fits.

Covers, on the CPU trainer (tiny d2 model, fp32): a budget below the requested configuration's
plan picks another -r/-b (same -d), whose plan fits and whose run stays under the budget as
measured (VmHWM) with the unconstrained run's loss trajectory; nothing fits -> exit 1 naming the
smallest peak; bad sizes are clear errors; --max-batch's B fits and B + 1 does not, by the plan.
On the CUDA trainer through cudasim: --plan with a budget, --max-batch, and a device smaller than
the plan (CUDASIM_DEVICE_MEMORY_MB) makes the trainer search with the device's free memory.
Prints PASS:/FAIL:; exits non-zero on any failure.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from test_llama_dist import llama_file
from test_plan import write_shard
from testlib import write_shard as write_tokens

CPU, SIM = "./train_gpt_cpu", "build/cudasim/train_gpt"
MiB = 1 << 20
failures = 0


def report(ok, name, detail=""):
    global failures
    print(("PASS: " if ok else "FAIL: ") + name + ("" if ok else f": {detail}"))
    failures += not ok
    sys.stdout.flush()


def run(trainer, args, env=None):
    return subprocess.run([trainer] + args, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


def plan(trainer, args):
    """--plan --json's object (None when it failed) and the process."""
    p = run(trainer, ["--plan", "--json"] + args)
    return (json.loads(p.stdout) if p.returncode == 0 else None), p


def losses(stdout):
    return [float(x) for x in re.findall(r"^step +\d+/\d+ \| loss (\S+)", stdout, re.M)]


def check_budgeted_run(what, args, ref_out, out, size, budget, total_batch, chosen):
    """Trains args unconstrained (into ref_out) and with --memory-budget size (into out); checks
    that the budgeted run trains with the chosen (-r, -b) and -d total_batch, that its measured
    VmHWM (log.jsonl) is within budget bytes, and that its losses equal the unconstrained run's."""
    ref = run(CPU, args + ["-o", ref_out])
    fit = run(CPU, args + ["-o", out, "--memory-budget", size])
    m = re.search(rf"chose -r (\d), -b (\d+), -z 0, --offload none, -d {total_batch} \((\d+) accumulation steps\)",
                  fit.stdout)
    rec = [r for r in map(json.loads, open(os.path.join(out, "log.jsonl"))) if "mem_measured_hwm" in r] \
        if fit.returncode == 0 else []
    hwm = rec[0]["mem_measured_hwm"] if rec else None
    report(fit.returncode == 0 and m and (int(m[1]), int(m[2])) == chosen and f"x {m[3]} accumulation steps" in fit.stdout
           and hwm is not None and hwm <= budget,
           f"{what} trains with the chosen configuration and its measured VmHWM ({hwm}) is within the budget ({budget})",
           fit.stdout[-600:] + fit.stderr[-400:])
    # recompute repeats the same float ops; more accumulation steps sum the same gradients in
    # another order (fp32: ~1e-6 relative), which 3 AdamW steps may amplify: rel 1e-4 as
    # test_train_cpu's accumulation check
    a, b = losses(ref.stdout), losses(fit.stdout)
    worst = max((abs(x - y) / abs(x) for x, y in zip(a, b)), default=None)
    report(len(a) == len(b) == 3 and worst is not None and worst <= 1e-4,
           f"{what}: its losses equal the unconstrained run's (rel 1e-4)", f"{a} vs {b}")


def check_size_units_and_max_batch_messages():
    """issue 22 items 17 and 21: --memory-budget units are exact (G, GiB: 2^30; GB: 10^9), a size
    beyond the largest budget says so, and --max-batch names -d when -d is the problem."""
    def budget_bytes(size):
        p = run(CPU, ["--plan", "--json", "--max-batch", "--memory-budget", size, "-e", "d2", "-t", "32"])
        return json.loads(p.stdout)["budget_bytes"] if p.returncode == 0 else p.stderr[-200:]
    want = {"12G": 12 << 30, "12GiB": 12 << 30, "12Gi": 12 << 30, "12GB": 12 * 10**9, "1500MB": 1500 * 10**6,
            "1500M": 1500 << 20, "2TB": 2 * 10**12, "1e9": 10**9, "2000000KiB": 2000000 << 10, "2000000kB": 2 * 10**9}
    got = {size: budget_bytes(size) for size in want}
    report(got == want, "--memory-budget units: K/M/G/T and KiB..TiB are powers of 1024, KB..TB powers of 1000",
           {k: v for k, v in got.items() if v != want[k]})
    for size in ("1e30", "1e400", "9300000000000000000"):
        p = run(CPU, ["--plan", "--memory-budget", size, "-e", "d2"])
        report(p.returncode == 1 and p.stderr.startswith("error: flag --memory-budget") and "2^63" in p.stderr
               and f"'{size}'" in p.stderr, f"--memory-budget {size}: an error saying it is beyond the largest budget",
               p.stderr[-300:])
    mb = ["--plan", "--max-batch", "--memory-budget", "1G", "-e", "d2", "-t", "128"]
    p = run(CPU, mb + ["-d", "1000"])
    report(p.returncode == 1 and p.stderr.startswith("error: --max-batch: -d 1000 is not a multiple of -t")
           and "0.000 GiB" not in p.stderr, "--max-batch -d 1000 -t 128: the error names -d, not the budget", p.stderr[-300:])
    p = run(CPU, mb + ["-d", "1024"])
    report(p.returncode == 0 and "0.000 GiB" not in p.stdout and "no larger -b keeps -d 1024 exact" in p.stdout,
           "--max-batch -d 1024 -t 128 (-b 8, the largest divisor, fits): no '-b 9 ... 0.000 GiB'", p.stdout + p.stderr[-300:])
    # the next candidate is the next -b that keeps -d exact, priced: it exceeds the budget
    d2 = ["-e", "d2", "-t", "32", "-d", str(32 * 24)]
    b6 = plan(CPU, d2 + ["-b", "6"])[0]["peak_bytes"]
    b8 = plan(CPU, d2 + ["-b", "8"])[0]["peak_bytes"]
    over = json.loads(run(CPU, d2 + ["--plan", "--json", "--max-batch", "--memory-budget", "1G"]).stdout)["overhead_bytes"]
    size = str((b6 + b8) // 2 + over)
    p = run(CPU, d2 + ["--plan", "--json", "--max-batch", "--memory-budget", size])
    j = json.loads(p.stdout) if p.returncode == 0 else {}
    report(j.get("max_batch") == 6 and j.get("next_batch") == 8 and j.get("next_peak_bytes") == b8 + j.get("overhead_bytes", 0),
           "--max-batch with -d 768 -t 32 between the -b 6 and -b 8 plans: -b 6, next candidate -b 8 with its peak",
           (j, b6, b8, p.stderr[-300:]))


def main():
    tmp = tempfile.mkdtemp(prefix="llmc_test_budget_")
    tr, va = os.path.join(tmp, "train.bin"), os.path.join(tmp, "val.bin")
    write_shard(tr, 8000, 1)
    write_shard(va, 2000, 2)

    # --- a budget below the requested configuration's need (CPU, d2, fp32) ---------------------
    cfg = ["-e", "d2", "-b", "8", "-t", "32", "-d", "512", "-r", "0"]
    train = ["-i", tr, "-j", va, "-x", "3", "-v", "0", "-s", "0"]
    out = os.path.join(tmp, "fit")  # with -o the plan counts the checkpoint phase: the runs' -o too
    want, _ = plan(CPU, cfg + ["-o", out])
    budget = int(want["peak_bytes"] * 0.75) // MiB * MiB  # the requested plan alone exceeds it
    size = f"{budget // MiB}M"
    got, p = plan(CPU, cfg + ["-o", out, "--memory-budget", size])
    report(got is not None and got["peak_bytes"] <= budget and (got["B"], got["recompute"]) != (8, 0)
           and got["total_batch"] == 512 and got["accum"] * got["B"] * 32 == 512,
           f"--plan --memory-budget {size} (requested plan {want['peak_bytes']} bytes): a plan within the budget, "
           "another -b/-r, the same -d", (got, p.stderr[-400:]))
    report("chose -r" in p.stderr and "predicted cost +" in p.stderr, "the choice and its predicted cost are printed",
           p.stderr[-400:])

    check_budgeted_run("the budgeted run", cfg + train, os.path.join(tmp, "ref"), out, size, budget, 512,
                       (got["recompute"], got["B"]) if got else None)

    # --offload optimizer changes nothing in the CPU trainer (its optimizer is on the host): the
    # same search, the same choice
    got2, p = plan(CPU, cfg + ["-o", out, "--offload", "optimizer", "--memory-budget", size])
    report(got and got2 and (got2["B"], got2["recompute"], got2["peak_bytes"]) == (got["B"], got["recompute"], got["peak_bytes"]),
           "train_gpt_cpu --offload optimizer --memory-budget: the same choice as without the flag", (got, got2, p.stderr[-300:]))

    p = run(CPU, cfg + ["--plan", "--memory-budget", "20M"])
    report(p.returncode == 1 and re.search(r"error: --memory-budget 0\.020 GiB: nothing fits; .* smallest peak found is "
                                           r"\d+\.\d+ GiB \(-r \d, -b 1,", p.stderr),
           "a budget nothing fits in: exit 1 naming the smallest peak found", p.stderr[-400:])
    p = run(CPU, ["--plan", "-e", "d2", "-b", "1", "-t", "32", "-r", "2", "--memory-budget", "20M"])
    report(p.returncode == 1 and "-b is 1 already" in p.stderr, "when -b is 1 already, the error says so", p.stderr[-400:])
    # several ranks (planned for rank 0 of -pn 2): with -b 1 and -r 2 already, only ZeRO-1 helps
    zcfg = ["-e", "d4", "-b", "1", "-t", "32", "-r", "2", "-pn", "2"]
    z0, z1 = plan(CPU, zcfg)[0], plan(CPU, zcfg + ["-z", "1"])[0]
    zsize = f"{(z0['peak_bytes'] + z1['peak_bytes']) // 2 // 1024}K"  # m and v halve: 32 MiB between them
    got, p = plan(CPU, zcfg + ["--memory-budget", zsize])
    report(got is not None and got["zero"] == 1 and got["B"] == 1 and "ZeRO +5%" in p.stderr,
           f"-pn 2 --memory-budget {zsize}: -z 1 is chosen when -b and -r have nothing left", (got, p.stderr[-300:]))
    # two ranks train with rank 0's choice (each rank's own start-up RSS could tip its search)
    if shutil.which("mpirun"):
        env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self,tcp"}
        p = subprocess.run(["mpirun", "--oversubscribe", "-np", "2", CPU] + cfg + ["-i", tr, "-x", "1", "-v", "0", "-s", "0",
                           "--threads", "1", "--memory-budget", size], capture_output=True, text=True, timeout=300,
                           env={**os.environ, **env})
        report(p.returncode == 0 and p.stdout.count("chose -r") == 1 and re.search(r"= [1-4] x 32 x 2 processes", p.stdout),
               f"mpirun -np 2 --memory-budget {size}: one choice, trained by both ranks", p.stdout[-500:] + p.stderr[-500:])
    else:
        report(False, "mpirun for the two-rank budget run", "OpenMPI is not installed")
    for bad in ("12x", "-5", "0", "1.5Q", "G", "0x10", "inf"):
        p = run(CPU, ["--plan", "--memory-budget", bad])
        report(p.returncode == 1 and "error: flag --memory-budget expects a size" in p.stderr and f"'{bad}'" in p.stderr,
               f"--memory-budget {bad} is a clear error", p.stderr[-300:])
    check_size_units_and_max_batch_messages()
    p = run(CPU, ["--max-batch", "--memory-budget", "1G"])
    report(p.returncode == 1 and "--max-batch goes with --plan --memory-budget" in p.stderr,
           "--max-batch without --plan is a clear error", p.stderr[-300:])

    # --- --max-batch: B fits, B + 1 does not, by the plan -------------------------------------
    def max_batch(trainer, args, size, label=None):
        p = run(trainer, ["--plan", "--json", "--max-batch", "--memory-budget", size] + args)
        if p.returncode != 0:
            report(False, f"{trainer} --max-batch {' '.join(args)}", p.stderr[-300:])
            return
        j = json.loads(p.stdout)
        B, over = j["max_batch"], j["overhead_bytes"]
        at, after = plan(trainer, args + ["-b", str(B)])[0], plan(trainer, args + ["-b", str(B + 1)])[0]
        report(B >= 1 and at and after and at["peak_bytes"] + over <= j["budget_bytes"] < after["peak_bytes"] + over,
               f"{trainer} --max-batch {label or ' '.join(args)} {size}: -b {B} fits, -b {B + 1} does not", (j, at and at["peak_bytes"],
                                                                                                 after and after["peak_bytes"]))

    max_batch(CPU, ["-e", "d2", "-t", "32", "-r", "1"], size)

    # --- a Llama (priced by llama_plan; the CPU Llama has no recompute levels, so the search
    # changes -b, and -z with several ranks) ------------------------------------------------------
    llama, llama48, ltr = os.path.join(tmp, "llama.bin"), os.path.join(tmp, "llama48.bin"), os.path.join(tmp, "ltr.bin")
    llama_file(llama)  # L 2, C 64, NH 4, NKV 2, V 1000: the activations dominate at -b 16 -t 64
    write_tokens(ltr, [(i * 37 + i // 7) % 1000 for i in range(6000)])
    lcfg = ["-e", llama, "-b", "16", "-t", "64", "-d", "1024", "-r", "0"]
    ltrain = ["-i", ltr, "-j", ltr, "-x", "3", "-v", "0", "-s", "0"]
    lout = os.path.join(tmp, "llama_fit")
    want, _ = plan(CPU, lcfg + ["-o", lout])
    lbudget = int(want["peak_bytes"] * 0.75) // MiB * MiB
    lsize = f"{lbudget // MiB}M"
    got, p = plan(CPU, lcfg + ["-o", lout, "--memory-budget", lsize])
    report(got is not None and got["peak_bytes"] <= lbudget and got["B"] < 16 and got["recompute"] == 0
           and got["total_batch"] == 1024 and got["accum"] * got["B"] * 64 == 1024,
           f"Llama --plan --memory-budget {lsize} (requested plan {want['peak_bytes']} bytes): a plan within the budget, "
           "a smaller -b, the same -d", (got, p.stderr[-400:]))
    check_budgeted_run("the budgeted Llama run", lcfg + ltrain, os.path.join(tmp, "llama_ref"), lout, lsize, lbudget,
                       1024, (0, got["B"]) if got else None)
    # several ranks: a deep Llama with a small vocabulary, where -z 3's parameter shard saves more
    # than its gather buffers cost; a budget between the -z 2 and -z 3 plans picks -z 3
    llama_file(llama48, layers=48, vocab=256)
    zl = ["-e", llama48, "-b", "1", "-t", "16", "-pn", "2"]
    z2, z3 = plan(CPU, zl + ["-z", "2"])[0], plan(CPU, zl + ["-z", "3"])[0]
    over = json.loads(run(CPU, zl + ["--plan", "--json", "--max-batch", "--memory-budget", "1G"]).stdout)["overhead_bytes"]
    zsize = f"{((z2['peak_bytes'] + z3['peak_bytes']) // 2 + over) // 1024}K"
    got, p = plan(CPU, zl + ["--memory-budget", zsize])
    report(z3["peak_bytes"] < z2["peak_bytes"] and got is not None and got["zero"] == 3 and got["B"] == 1
           and "ZeRO +15%" in p.stderr,
           f"Llama -pn 2 --memory-budget {zsize}: -z 3 is chosen between the -z 2 and -z 3 plans", (got, p.stderr[-300:]))
    max_batch(CPU, ["-e", llama, "-t", "64", "-r", "0"], "20M", "-e <2-layer Llama> -t 64 -r 0")

    # --- the CUDA trainer (cudasim) -----------------------------------------------------------
    if not os.path.exists(SIM):
        report(False, f"{SIM} is built (make {SIM})")
    else:
        big = ["-e", "d48", "-b", "16", "-t", "1024", "--precision", "bf16"]
        want, _ = plan(SIM, big)
        got, p = plan(SIM, big + ["--memory-budget", "40G"])
        report(want and got and want["peak_bytes"] > 40 << 30 >= got["peak_bytes"] and got["total_batch"] == 16 * 1024,
               "cudasim --plan d48 B 16 T 1024 bf16 --memory-budget 40G: a device plan within 40 GiB, the same -d",
               (want and want["peak_bytes"], got, p.stderr[-300:]))
        max_batch(SIM, ["-e", "d48", "-t", "1024", "-r", "3"], "40G")
        # a device smaller than the requested plan: the trainer searches with its free memory (d1:
        # the LM head dominates, so only a smaller -b helps; -x 0: allocate everything, one forward)
        small = ["-i", tr, "-j", va, "-m", "1", "-e", "d1", "-b", "16", "-t", "16", "-d", "256", "-x", "0", "-s", "0",
                 "--precision", "fp32", "-r", "0"]
        need, fits = plan(SIM, small)[0]["peak_bytes"], plan(SIM, small + ["-b", "4"])[0]["peak_bytes"]
        device_mb = (need + fits) // 2 // MiB  # below the plan, above that of -b 4
        p = run(SIM, small, env={"CUDASIM_DEVICE_MEMORY_MB": str(device_mb)})
        report(p.returncode == 0 and "the plan exceeds the device's free memory" in p.stdout
               and "device free memory (cudaMemGetInfo)" in p.stdout and re.search(r"chose -r \d, -b [1-8],", p.stdout)
               and "val loss" in p.stdout,
               f"cudasim with a {device_mb} MiB device (plan {need} bytes): searched with its free memory, allocated, ran",
               p.stdout[-800:] + p.stderr[-400:])

        # offload is the last resort: a budget below the smallest -r/-b plan (-r 3, -b 1) but above
        # that plan with the optimizer offloaded makes the trainer offload, and it trains
        one = ["-i", tr, "-j", va, "-e", "d1", "-b", "1", "-t", "16", "-x", "2", "-v", "0", "-s", "0", "--precision", "bf16"]
        tightest = plan(SIM, one + ["-r", "3"])[0]["peak_bytes"]
        offl = plan(SIM, one + ["-r", "0", "--offload", "optimizer"])[0]["peak_bytes"]
        mb = (tightest + offl) // 2 // MiB
        p = run(SIM, one + ["-r", "0", "--memory-budget", f"{mb}M"])
        report(offl < mb * MiB < tightest and p.returncode == 0 and "--offload optimizer, -d 16" in p.stdout
               and "offload +15%" in p.stdout and len(losses(p.stdout)) == 2,
               f"cudasim --memory-budget {mb}M below -r 3 -b 1's plan ({tightest} bytes): chose --offload optimizer "
               f"(plan {offl} bytes) and trained", p.stdout[-800:] + p.stderr[-400:])
        p = run(SIM, one + ["--precision", "fp16", "-r", "0", "--plan", "--memory-budget", f"{mb}M"])
        report(p.returncode == 1 and "nothing fits" in p.stderr and "offload optimizer" not in p.stderr,
               "cudasim fp16: offload is not a candidate (its loss scaler lives in the device optimizer)",
               p.stdout[-400:] + p.stderr[-400:])

    shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'FAILED' if failures else 'all passed'}: test_budget ({failures} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
