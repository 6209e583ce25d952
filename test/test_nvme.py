#!/usr/bin/env python3
"""--offload-device nvme --nvme-path DIR (issue 26 item 2): the host AdamW's moments in a file per rank.

- Bit-identical to the in-memory optimizer: the same run with --offload-device cpu and nvme writes
  byte-identical model and state files and the same losses over 6 steps (checkpoints at 3 and 6),
  and an nvme run stopped at 3 and resumed (-y 1) writes the uninterrupted run's step-6 files:
  GPT-2 (L 2, C 64, V 512: 137k parameters) with fp32, int8 and bf16 moments at -z 0, fp32 and int8
  at -z 1 on 2 ranks (mpirun), int8 at -z 2 and fp32 at -z 3 on 2 ranks; a Llama (tiny HF
  directory) with fp32 and int8 moments.
  LLMC_TEST_NVME_CHUNK=4096 cuts the moments into 34 chunks, so the ring's pipeline (read of chunk
  c + 1 and write of c - 1 in flight during the update of c) really runs, and int8's blocks meet
  chunk boundaries. Also the paths of a filesystem that refuses O_DIRECT (LLMC_TEST_NVME_BUFFERED=1:
  buffered I/O, a note) and of a kernel without io_uring (LLMC_TEST_NVME_SYNC=1: pread/pwrite).
- ./train_gpt through cudasim: --offload optimizer --offload-device nvme writes --offload
  optimizer's bytes; --offload-device nvme without --offload optimizer is a clear error.
- Peak RSS (VmHWM of the child, wait4): GPT-2 d4 (16.3M parameters, fp32 m + v 130 MB), one step at
  -b 1 -t 64: the nvme run's peak is lower by at least 70% of the moments' bytes.
- --plan: adamw_m / adamw_v 0, the nvme_ring class (3 slots, closed form) and the disk bytes; the
  log has nvme_read_MBps / nvme_write_MBps; the startup print names the file.
- Files: none left in DIR after a run, after an error (a resume from a corrupted state file, after
  the file was made) and after SIGTERM / SIGINT mid-run; a file that was in DIR before is untouched.
- Bad DIRs are clear errors naming --nvme-path (exit 1, DIR unchanged): missing, a regular file,
  read-only (a read-only tmpfs mount when root may mount, else chmod 555), full (a 1 MiB tmpfs when
  root may mount; else skipped) and a file-size limit (RLIMIT_FSIZE: the reservation fails EFBIG).
Prints PASS:/FAIL: lines; exits non-zero on any failure. Run from the repository root.
"""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hardening_util import limit_file_size, write_model  # noqa: E402 (sets OMP_NUM_THREADS=1)
from testlib import LOOPBACK_MPI, failed_count, report, run_trainer, write_shard  # noqa: E402

TRAINER = os.environ.get("LLMC_TEST_TRAINER", "./train_gpt_cpu")
SIM = "build/cudasim/train_gpt"
CHUNK = {"LLMC_TEST_NVME_CHUNK": "4096"}


def run(args, expect_ok=True, env=None, trainer=TRAINER, mpi=0):
    cmd = ["mpirun", "--oversubscribe", "-np", str(mpi), trainer] if mpi else [trainer]
    return run_trainer(cmd[0], cmd[1:] + args, expect_ok, env={**CHUNK, **LOOPBACK_MPI, **(env or {})}, tail=2000)


def expect_error(name, proc, pattern, tail=500):
    """exit 1 with an "error: " line matching the regular expression pattern"""
    out = proc.stdout + proc.stderr
    return report(proc.returncode == 1 and re.search(r"error: .*" + pattern, out) is not None, name,
                  f"exit {proc.returncode}: {out[-tail:]}")


def losses(outdir):
    with open(os.path.join(outdir, "log.jsonl")) as f:
        return {r["step"]: r["train_loss"] for r in map(json.loads, f) if "train_loss" in r}


def same(a, b):
    return os.path.exists(a) and os.path.exists(b) and open(a, "rb").read() == open(b, "rb").read()


def run_files(d, step):
    return sorted(f for f in os.listdir(d) if f.startswith(("model_", "state_")) and f"{step:08d}" in f
                  and not f.endswith(".sum"))


def listing(d):
    return sorted(os.listdir(d))


def bit_identical(tmp, name, base, extra, nvdir, mpi=0, env=None, note=None):
    """cpu vs nvme over 6 steps, and nvme stopped at 3 and resumed to 6 (env: the nvme runs'; note:
    a line their output must have)."""
    cpu, nv, part = (os.path.join(tmp, f"{name}_{k}") for k in ("cpu", "nvme", "part"))
    nvf = ["--offload-device", "nvme", "--nvme-path", nvdir]
    p = [run(base + extra + ["-x", "6", "-n", "3", "-o", cpu], mpi=mpi),
         run(base + extra + nvf + ["-x", "6", "-n", "3", "-o", nv], mpi=mpi, env=env),
         run(base + extra + nvf + ["-x", "3", "-n", "3", "-o", part], mpi=mpi, env=env)]
    p.append(run(base + extra + nvf + ["-x", "6", "-n", "3", "-o", part, "-y", "1", "--allow-config-change", "1"], mpi=mpi,
                 env=env) if p[2].returncode == 0 else p[2])
    ok = all(q.returncode == 0 for q in p)
    if ok and note:
        report(all(note in q.stdout for q in p[1:]), f"{name}: the runs say '{note}'", p[1].stdout[-600:])
    report(ok, f"{name}: the cpu, nvme and nvme-resumed runs train", "" if ok else (p[-1].stdout + p[-1].stderr)[-800:])
    if not ok:
        return
    files = run_files(cpu, 3) + run_files(cpu, 6)
    diff = [f for f in files if not same(os.path.join(cpu, f), os.path.join(nv, f))]
    report(files and not diff and losses(cpu) == losses(nv),
           f"{name}: --offload-device nvme writes the in-memory optimizer's model and state bytes at steps 3 and 6, "
           "the same losses", f"{len(files)} files, differing: {diff}")
    six = run_files(cpu, 6)
    diff = [f for f in six if not same(os.path.join(cpu, f), os.path.join(part, f))]
    report(six and not diff and losses(part) == losses(cpu),
           f"{name}: an nvme run saved at 3 and resumed (-y 1) writes the uninterrupted run's step-6 files and losses",
           f"differing: {diff}")
    report(listing(nvdir) == ["keep.txt"], f"{name}: no files left in --nvme-path after the runs", str(listing(nvdir)))


def cudasim(tmp, model, shard, nvdir):
    if not os.access(SIM, os.X_OK):
        print(f"SKIP: {SIM} not built (make build/cudasim/train_gpt)")
        return
    base = ["-e", model, "-i", shard, "-b", "4", "-t", "32", "-l", "1e-3", "-k", "constant", "-v", "0", "-s", "0",
            "--precision", "fp32", "--offload", "optimizer", "-x", "3", "-n", "3"]
    a, b = os.path.join(tmp, "sim_cpu"), os.path.join(tmp, "sim_nvme")
    p1 = run(base + ["-o", a], trainer=SIM)
    p2 = run(base + ["-o", b, "--offload-device", "nvme", "--nvme-path", nvdir], trainer=SIM)
    ok = p1.returncode == 0 and p2.returncode == 0
    files = run_files(a, 3) if ok else []
    ok = ok and files and all(same(os.path.join(a, f), os.path.join(b, f)) for f in files) and losses(a) == losses(b)
    report(ok, "./train_gpt (cudasim) --offload optimizer --offload-device nvme: --offload optimizer's model, state and "
               "losses", (p2.stdout + p2.stderr)[-800:])
    report(listing(nvdir) == ["keep.txt"], "./train_gpt (cudasim): no files left in --nvme-path", str(listing(nvdir)))
    expect_error("./train_gpt (cudasim) --offload-device nvme without --offload optimizer: a clear error",
                 run([x for x in base[:-2] if x not in ("--offload", "optimizer")] + ["--offload-device", "nvme", "--nvme-path",
                                                                                  nvdir], trainer=SIM),
                 "--offload optimizer")


def peak_rss(tmp, nvdir):
    """VmHWM of one d4 step with the moments in memory and on disk."""
    tr = os.path.join(tmp, "peak_train.bin")
    rng = random.Random(5)
    write_shard(tr, [rng.randrange(50257) for _ in range(2000)])
    args = [TRAINER, "-i", tr, "-e", "d4", "-b", "1", "-t", "64", "-x", "1", "-v", "0", "-s", "0", "--threads", "1"]
    hwm = {}
    for dev in ("cpu", "nvme"):
        extra = ["--offload-device", "nvme", "--nvme-path", nvdir] if dev == "nvme" else []
        with open(os.path.join(tmp, f"peak_{dev}.log"), "w") as log:
            p = subprocess.Popen(args + extra, stdout=log, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(p.pid, 0)
        hwm[dev] = usage.ru_maxrss * 1024 if status == 0 else None
    pl = run(args[1:] + ["--plan", "--json"])
    moments = 0
    if pl.returncode == 0:
        c = json.loads(pl.stdout)["classes"]
        moments = c["adamw_m"] + c["adamw_v"]
    ok = all(hwm.values()) and moments > 0
    report(ok, "d4: one step with the moments in memory and on disk", str(hwm))
    if ok:
        saved = hwm["cpu"] - hwm["nvme"]
        report(saved >= 0.7 * moments, "d4 -b 1 -t 64: the nvme run's peak RSS (VmHWM) is lower by >= 70% of the moments' "
               "bytes", f"saved {saved / 2**20:.1f} MiB of {moments / 2**20:.1f} MiB (VmHWM {hwm['cpu'] / 2**20:.1f} -> "
               f"{hwm['nvme'] / 2**20:.1f} MiB)")


def plan_and_log(tmp, base, nvdir):
    nvf = ["--offload-device", "nvme", "--nvme-path", nvdir]
    p = run(base + nvf + ["--plan", "--json"], env={"LLMC_TEST_NVME_CHUNK": "8192"})
    ok = p.returncode == 0
    if ok:
        j = json.loads(p.stdout)
        n, c = j["parameters"], j["classes"]
        slot = 2 * (((8192 * 4) + 4095) // 4096 * 4096)
        chunks = (n + 8191) // 8192
        ok = c["adamw_m"] == 0 and c["adamw_v"] == 0 and c["nvme_ring"] == 3 * slot and j["disk_bytes"] == chunks * slot
    report(ok, "--plan --json --offload-device nvme: no adamw_m/v bytes, the ring (3 slots of m + v, 4096-aligned) and "
               "the file's bytes in closed form", p.stdout[-600:])
    p = run(base + nvf + ["--plan"])
    report(p.returncode == 0 and "nvme_ring" in p.stdout and "nvme_disk" in p.stdout and "(disk:" in p.stdout,
           "--plan (text) shows the host ring and the disk bytes", p.stdout[-400:])
    d = os.path.join(tmp, "logrun")
    p = run(base + nvf + ["-x", "2", "-o", d])
    recs = [json.loads(x) for x in open(os.path.join(d, "log.jsonl"))] if p.returncode == 0 else []
    steps = [r for r in recs if "train_loss" in r]
    report(steps and all(r.get("nvme_read_MBps", 0) > 0 and r.get("nvme_write_MBps", 0) > 0 for r in steps)
           and "nvme" in p.stdout and "MB/s read" in p.stdout and "llmc-optstate-" in p.stdout,
           "the step line and log.jsonl show the I/O rate (nvme_read_MBps, nvme_write_MBps); the startup print names the file",
           p.stdout[-600:])


def leftovers(tmp, base, nvdir):
    nvf = ["--offload-device", "nvme", "--nvme-path", nvdir]
    # an error after the file was made: a resume from a corrupted state file
    d = os.path.join(tmp, "corrupt")
    p = run(base + ["-x", "2", "-n", "2", "-o", d])
    if p.returncode == 0:
        st = os.path.join(d, "state_00000002_00000.bin")
        data = bytearray(open(st, "rb").read())
        data[2000] ^= 0xFF
        open(st, "wb").write(data)
        p = run(base + nvf + ["-x", "3", "-o", d, "-y", "1"], expect_ok=False)
        report(p.returncode == 1 and "error:" in p.stderr and listing(nvdir) == ["keep.txt"],
               "an error after the file was made (a corrupted state file on resume): exit 1, no file left in --nvme-path",
               p.stderr[-400:] + str(listing(nvdir)))
    # a signal mid-run
    for sig in (signal.SIGTERM, signal.SIGINT):
        out = os.path.join(tmp, f"sig{int(sig)}")
        proc = subprocess.Popen([TRAINER] + base + nvf + ["-x", "100000", "-o", out], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env={**os.environ, **CHUNK})
        seen = False
        for _ in range(300):
            if any(f.startswith("llmc-optstate-") for f in os.listdir(nvdir)):
                seen = True
                break
            time.sleep(0.05)
        time.sleep(0.5)
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
        report(seen and rc == -sig and listing(nvdir) == ["keep.txt"],
               f"{sig.name} mid-run: the run ends by the signal and leaves no file in --nvme-path",
               f"seen {seen}, rc {rc}, {listing(nvdir)}")


def bad_dirs(tmp, base):
    nv = lambda d: base + ["-x", "1", "--offload-device", "nvme", "--nvme-path", d]  # noqa: E731
    expect_error("--nvme-path missing: a clear error", run(nv(os.path.join(tmp, "nope")), expect_ok=False),
                 "--nvme-path.*No such file")
    f = os.path.join(tmp, "afile")
    open(f, "w").write("x")
    expect_error("--nvme-path a regular file: a clear error", run(nv(f), expect_ok=False), "--nvme-path.*not a directory")
    report(open(f).read() == "x", "--nvme-path a regular file: the file is untouched")
    expect_error("--offload-device nvme without --nvme-path", run(base + ["--offload-device", "nvme"], expect_ok=False),
                 "--nvme-path")
    expect_error("--nvme-path without --offload-device nvme", run(base + ["--nvme-path", tmp], expect_ok=False),
                 "--offload-device nvme")
    expect_error("--offload-device: an unknown value", run(base + ["--offload-device", "disk"], expect_ok=False),
                 "--offload-device.*unknown")
    expect_error("--offload-device nvme --optimizer adafactor: refused clearly",
                 run(base + ["--offload-device", "nvme", "--nvme-path", tmp, "--optimizer", "adafactor"], expect_ok=False),
                 "--offload-device nvme with --optimizer adafactor")
    # a file-size limit: the file's reservation fails (EFBIG), as on a disk that fills
    d = os.path.join(tmp, "limited")
    os.makedirs(d)
    p = subprocess.run([TRAINER] + nv(d), capture_output=True, text=True, env={**os.environ, **CHUNK},
                       preexec_fn=limit_file_size(64 * 1024))
    expect_error("--nvme-path under a 64 KiB file-size limit: a clear error", p, "--nvme-path.*(File too large|full)")
    report(listing(d) == [], "--nvme-path under a file-size limit: no file left", str(listing(d)))
    # read-only and full: tmpfs mounts where this process may mount (root), else chmod (non-root)
    mnt = os.path.join(tmp, "mnt")
    os.makedirs(mnt)
    can_mount = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt],
                                                     capture_output=True).returncode == 0
    if can_mount:
        open(os.path.join(mnt, "keep.txt"), "w").write("k")
        p = run(nv(mnt), expect_ok=False)
        expect_error("--nvme-path on a full (1 MiB) tmpfs: a clear error naming the free space", p,
                     "--nvme-path.*free.*needs")
        report(listing(mnt) == ["keep.txt"], "--nvme-path full: DIR unchanged", str(listing(mnt)))
        subprocess.run(["mount", "-o", "remount,ro,size=64m", mnt], capture_output=True)
        expect_error("--nvme-path on a read-only mount: a clear error", run(nv(mnt), expect_ok=False),
                     "--nvme-path.*(read-only|not writable)")
        report(listing(mnt) == ["keep.txt"], "--nvme-path read-only: DIR unchanged", str(listing(mnt)))
        subprocess.run(["umount", mnt], capture_output=True)
    elif os.geteuid() != 0:
        os.chmod(mnt, 0o555)
        expect_error("--nvme-path read-only (chmod 555): a clear error", run(nv(mnt), expect_ok=False),
                     "--nvme-path.*not writable")
        os.chmod(mnt, 0o755)
        print("SKIP: full DIR (no tmpfs mount without root)")
    else:
        print("SKIP: read-only and full DIR (root, and mount is not allowed here)")


def main():
    if not os.access(TRAINER, os.X_OK):
        report(False, f"{TRAINER} is built")
        return 1
    tmp = tempfile.mkdtemp(prefix="llmc_test_nvme_")
    nvdir = os.path.join(tmp, "nvme")
    os.makedirs(nvdir)
    open(os.path.join(nvdir, "keep.txt"), "w").write("not the run's")
    rng = random.Random(2026)
    model = os.path.join(tmp, "init.bin")
    write_model(model, maxT=64, V=512, L=2, NH=2, C=64, Vp=512, seed=3)
    tr = os.path.join(tmp, "train.bin")
    write_shard(tr, [rng.randrange(512) for _ in range(12000)])
    base = ["-i", tr, "-e", model, "-b", "4", "-t", "32", "-l", "1e-3", "-k", "constant", "-c", "0.1", "-v", "0", "-s", "0",
            "--seed", "7"]
    bit_identical(tmp, "GPT-2 fp32 -z 0", base, [], nvdir)
    bit_identical(tmp, "GPT-2 int8 -z 0", base, ["--optim-state", "int8"], nvdir)
    bit_identical(tmp, "GPT-2 bf16 -z 0", base, ["--optim-state", "bf16"], nvdir)
    # a filesystem that refuses O_DIRECT (buffered I/O) and a kernel without io_uring (pread/pwrite)
    bit_identical(tmp, "GPT-2 int8 -z 0, buffered", base, ["--optim-state", "int8"], nvdir,
                  env={"LLMC_TEST_NVME_BUFFERED": "1"}, note="refuses O_DIRECT; buffered I/O")
    bit_identical(tmp, "GPT-2 fp32 -z 0, synchronous", base, [], nvdir, env={"LLMC_TEST_NVME_SYNC": "1"},
                  note="synchronous reads and writes")
    if shutil.which("mpirun"):
        two = list(base)
        two[two.index("-b") + 1] = "2"
        bit_identical(tmp, "GPT-2 fp32 -z 1, 2 ranks", two, ["-z", "1"], nvdir, mpi=2)
        bit_identical(tmp, "GPT-2 int8 -z 1, 2 ranks", two, ["-z", "1", "--optim-state", "int8"], nvdir, mpi=2)
        bit_identical(tmp, "GPT-2 int8 -z 2, 2 ranks", two, ["-z", "2", "--optim-state", "int8"], nvdir, mpi=2)
        bit_identical(tmp, "GPT-2 fp32 -z 3, 2 ranks", two, ["-z", "3"], nvdir, mpi=2)
    else:
        report(False, "OpenMPI is installed (mpirun)")
    try:
        from hf_tiny import train_args, write_llama
        llama = write_llama(os.path.join(tmp, "llama"))
        lbase = train_args(tmp, llama, "-k", "constant", "-c", "0.1", "--seed", "7")
        bit_identical(tmp, "Llama fp32 -z 0", lbase, [], nvdir)
        bit_identical(tmp, "Llama int8 -z 0", lbase, ["--optim-state", "int8"], nvdir)
    except ImportError as e:
        print(f"SKIP: the Llama runs ({e})")
    plan_and_log(tmp, base, nvdir)
    leftovers(tmp, base, nvdir)
    bad_dirs(tmp, base)
    cudasim(tmp, model, tr, nvdir)
    peak_rss(tmp, nvdir)
    report(listing(nvdir) == ["keep.txt"] and open(os.path.join(nvdir, "keep.txt")).read() == "not the run's",
           "the file in --nvme-path that was there before is untouched, nothing else left")
    shutil.rmtree(tmp, ignore_errors=True)
    return failed_count()


if __name__ == "__main__":
    sys.exit(main())
