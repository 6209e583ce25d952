#!/usr/bin/env python3
"""Ranks under faults and hostile starts (issue 22: findings 6, 7, 8, 18, 21), 2 ranks of a tiny
model over -pi tcp (and mpirun when installed), each check seconds:
  6  work only rank 0 does (sampling, a checkpoint) longer than --dist-timeout is no "hung rank 0"
     (rank 0's heartbeat; -pi tcp, and sampling under mpirun); a rank 0 stopped (SIGSTOP) in such
     work is still named, with what it said it was doing
  7  scripts/run_dist.sh local 2 --pi tcp with the port taken: exits 1 soon, no rank left running
  8  the ranks' training or validation data differ in one token under the same relative path (other
     working directories): every rank exits 1 naming the data
  18 scripts/run_dist.sh with bad arguments: an 'error: run_dist.sh:' line and exit 1, never a raw
     bash error; relative -o means the caller's directory, not the checkout
  21 under mpirun -np 2, -pr 1 says to drop -pr (not "between 0 and 0")
TRAINER (environment) selects the trainer, e.g. a build of the code before a fix."""
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hardening_util import write_model, write_shard  # noqa: E402
from testlib import failed_count, report  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINER = os.path.abspath(os.environ.get("TRAINER", os.path.join(ROOT, "train_gpt_cpu")))
SCRIPT = os.path.join(ROOT, "scripts", "run_dist.sh")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
       "OMPI_MCA_btl": "self,vader,tcp", "OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo"}
RAW_BASH = re.compile(r"unbound variable|division by|syntax error|line \d+:|command not found|integer expression")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base(d, extra=()):
    return ["-i", os.path.join(d, "train.bin"), "-j", os.path.join(d, "val.bin"), "-e", os.path.join(d, "tiny.bin"),
            "-b", "2", "-t", "32", "-v", "2", "-m", "1", "-l", "1e-2", "-x", "2"] + list(extra)


def start_ranks(args, port, env=None, cwds=(None, None), rank_args=None):
    """Two ranks over -pi tcp on port; returns the Popen objects (text output)."""
    procs = []
    for r in range(2):
        a = list(rank_args[r]) if rank_args else list(args)
        procs.append(subprocess.Popen([TRAINER] + a + ["-pi", "tcp", "-ps", f"127.0.0.1:{port}", "-pn", "2", "-pr", str(r)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwds[r],
                                      env={**ENV, **(env or {})}))
    return procs


def finish(procs, timeout=60):
    out = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
            e += "\n(killed: timeout)"
        out.append((p.returncode, o, e))
    return out


def rank0_busy(d):
    """6: sampling and a checkpoint on rank 0 longer than --dist-timeout 1 s (the others wait up to
    1.5 s); then rank 0 stopped inside a checkpoint: rank 1 names it and what it was doing."""
    t0 = time.time()
    res = finish(start_ranks(base(d, ["-s", "1", "-g", "40000", "--dist-timeout", "1"]), free_port()))
    took = time.time() - t0
    ok = all(rc == 0 for rc, _, _ in res)
    report(ok, f"6: 2 ranks, rank 0 samples 40000 tokens after step 1 (-s 1 -g 40000, {took:.1f} s) with --dist-timeout 1: no "
           "'hung rank 0' abort", " | ".join(e[-300:] for _, _, e in res))

    if shutil.which("mpirun"):
        t0 = time.time()
        p = subprocess.run(["mpirun", "--oversubscribe", "-np", "2", TRAINER] +
                           base(d, ["-s", "1", "-g", "40000", "--dist-timeout", "1"]), capture_output=True, text=True,
                           timeout=300, env=ENV)
        took = time.time() - t0
        if "was built without MPI" in p.stdout + p.stderr:
            print("SKIP: 6: under mpirun (this trainer has no MPI)")
        else:
            report(p.returncode == 0, f"6: mpirun -np 2, rank 0 samples 40000 tokens after step 1 ({took:.1f} s) with "
                   "--dist-timeout 1: no watchdog abort", p.stderr[-400:])

    out = os.path.join(d, "busy_ckpt")
    res = finish(start_ranks(base(d, ["-n", "2", "--dist-timeout", "1", "-o", out]), free_port(),
                             env={"LLMC_TEST_BUSY_SLEEP": "2"}))
    ok = all(rc == 0 for rc, _, _ in res) and os.path.exists(os.path.join(out, "DONE_00000002"))
    report(ok, "6: 2 ranks, each checkpoint (and the -o preparation) on rank 0 takes 2 s (LLMC_TEST_BUSY_SLEEP) with "
           "--dist-timeout 1: trains to the end", " | ".join(e[-300:] for _, _, e in res))

    out = os.path.join(d, "busy_stopped")
    procs = start_ranks(base(d, ["-x", "3", "-n", "2", "--dist-timeout", "1", "-o", out]), free_port(),
                        env={"LLMC_TEST_BUSY_SLEEP": "3"})
    # rank 0 announces its checkpoint at step 2 on stderr (LLMC_TEST_BUSY_SLEEP): stop it there
    err0, stopped = b"", False
    deadline = time.time() + 60
    fd = procs[0].stderr.fileno()
    while time.time() < deadline and procs[0].poll() is None:
        if select.select([fd], [], [], 0.05)[0]:
            err0 += os.read(fd, 65536)
        if b"writing a checkpoint for" in err0:
            os.kill(procs[0].pid, signal.SIGSTOP)
            stopped = True
            break
    t0 = time.time()
    try:
        _, e1 = procs[1].communicate(timeout=30)
        rc1 = procs[1].returncode
    except subprocess.TimeoutExpired:
        procs[1].kill()
        _, e1 = procs[1].communicate()
        rc1 = None
    took = time.time() - t0
    if stopped:
        os.kill(procs[0].pid, signal.SIGCONT)
    procs[0].kill()
    procs[0].communicate()
    named = re.search(r"rank 0 moved no data within --dist-timeout \(hung, stopped or dead\); waited [0-9.]+ s since its "
                      r"last heartbeat \(it said it was writing a checkpoint\)", e1)
    report(stopped and rc1 == 1 and bool(named) and took < 10,
           f"6: rank 0 stopped (SIGSTOP) while writing a checkpoint: rank 1 exits 1 naming it and what it was doing "
           f"({took:.1f} s)", f"stopped {stopped}, exit {rc1}: {e1[-500:]}")


def port_taken(d):
    """7: the port of --pi tcp is taken: rank 0 fails at once, the script stops the others soon."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        port = s.getsockname()[1]
        out = os.path.join(d, "port_taken")
        t0 = time.time()
        try:
            p = subprocess.run([SCRIPT, "local", "2", "--pi", "tcp"] + base(d, ["--dist-timeout", "60", "-o", out]),
                               capture_output=True, text=True, timeout=40,
                               env={**ENV, "TRAINER": TRAINER, "PORT": str(port), "RUN_DIST_GRACE": "2"})
            rc, err = p.returncode, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, err = None, (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        took = time.time() - t0
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", out], capture_output=True, text=True).stdout.split()
    for pid in left:
        os.kill(int(pid), signal.SIGKILL)
    report(rc == 1 and "cannot listen on port" in err and took < 20 and not left,
           f"7: run_dist.sh local 2 --pi tcp, the port taken (--dist-timeout 60): exit 1 naming it in {took:.1f} s, "
           "no rank left running", f"exit {rc}, ranks left {left}: {err[-500:]}")


def data_differs(d):
    """8: same relative -i/-j in two working directories, one token changed in one of them."""
    for which, name in (("train.bin", "training"), ("val.bin", "validation")):
        dirs = [os.path.join(d, f"cwd_{which}_{r}") for r in range(2)]
        for x in dirs:
            os.makedirs(x)
            for f in ("train.bin", "val.bin"):
                shutil.copy(os.path.join(d, f), x)
        path = os.path.join(dirs[1], which)
        data = bytearray(open(path, "rb").read())
        k = 1024 + 2 * random.Random(8).randrange(500)
        data[k] = (data[k] + 1) % 256  # tokens < 256: still in the vocabulary
        open(path, "wb").write(bytes(data))
        args = ["-i", "train.bin", "-j", "val.bin", "-e", os.path.join(d, "tiny.bin"), "-b", "2", "-t", "32", "-v", "2",
                "-m", "1", "-x", "2"]
        res = finish(start_ranks(args, free_port(), cwds=dirs))
        said = re.search(rf"error: rank 1 was started differently from rank 0: it has '{name} data: \d+ tokens in 1 "
                         rf"shard\(s\), content crc32 [0-9a-f]+' where rank 0 has", res[1][2])
        report(all(rc == 1 for rc, _, _ in res) and bool(said),
               f"8: {name} data differs in one token under the same relative path (two working directories): both "
               "ranks exit 1, rank 1 names the data", " | ".join(f"exit {rc}: {e[-300:]}" for rc, _, e in res))


def script_args(d):
    """18: bad arguments to run_dist.sh; relative -o is the caller's directory."""
    cases = [[], ["local"], ["local", "0"], ["local", "abc"], ["local", "-1"], ["local", "2.5"], ["local", "1e3"],
             ["local", "99999"], ["local", "2", "--pi"], ["local", "2", "--pi", "udp"], ["hosts"],
             ["hosts", os.path.join(d, "no_such_hostfile")], ["hosts", d], ["nonsense"], ["slurm"]]
    bad = []
    for c in cases:
        env = {k: v for k, v in ENV.items() if not k.startswith("SLURM_")}
        p = subprocess.run([SCRIPT] + c + ["-x", "1"], capture_output=True, text=True, timeout=30, env=env)
        if p.returncode != 1 or "error: run_dist.sh: " not in p.stderr or RAW_BASH.search(p.stderr):
            bad.append(f"{c}: exit {p.returncode}: {p.stderr.strip()[:200]}")
    report(not bad, f"18: run_dist.sh with {len(cases)} kinds of bad arguments: each an 'error: run_dist.sh:' line and "
           "exit 1, no raw bash error", "; ".join(bad[:4]))
    p = subprocess.run([SCRIPT, "local", "1", "--pi", "tcp"] + base(d, ["-x", "1"])[:-2] + ["-x", "1", "-o", "rel_out"],
                       capture_output=True, text=True, timeout=120, cwd=d, env={**ENV, "TRAINER": TRAINER,
                                                                                "PORT": str(free_port())})
    here = os.path.exists(os.path.join(d, "rel_out", "DONE_00000001"))
    stray = os.path.exists(os.path.join(ROOT, "rel_out"))
    if stray:
        shutil.rmtree(os.path.join(ROOT, "rel_out"), ignore_errors=True)
    report(p.returncode == 0 and here and not stray, "18: run_dist.sh local 1 --pi tcp -o rel_out from another directory: "
           "the run is written there, not in the checkout", f"exit {p.returncode}, here {here}, in checkout {stray}: "
           f"{p.stderr[-300:]}")


def mpirun_pr(d):
    """21: -pr under mpirun."""
    if not shutil.which("mpirun"):
        print("SKIP: 21: -pr under mpirun (mpirun not installed)")
        return
    p = subprocess.run(["mpirun", "--oversubscribe", "-np", "2", TRAINER] + base(d, ["-x", "1", "-pr", "1"]),
                       capture_output=True, text=True, timeout=120, env=ENV)
    out = p.stdout + p.stderr
    if "was built without MPI" in out:
        print("SKIP: 21: -pr under mpirun (this trainer has no MPI)")
        return
    report(p.returncode != 0 and "drop -pr" in out and "between 0 and 0" not in out,
           "21: mpirun -np 2 ... -pr 1: the error says the launcher gives the rank (drop -pr)", out[-400:])


def main():
    if not os.access(TRAINER, os.X_OK):
        report(False, f"the trainer {TRAINER} is built", "make train_gpt_cpu")
        return failed_count()
    d = tempfile.mkdtemp(prefix="llmc_test_dist_hardening_")
    rng = random.Random(22)
    write_shard(os.path.join(d, "train.bin"), [rng.randrange(256) for _ in range(6000)])
    write_shard(os.path.join(d, "val.bin"), [rng.randrange(256) for _ in range(1000)])
    write_model(os.path.join(d, "tiny.bin"))
    try:
        for check in (script_args, data_differs, mpirun_pr, port_taken, rank0_busy):
            check(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return failed_count()


if __name__ == "__main__":
    sys.exit(main())
