"""What the Python tests share: the PASS:/FAIL: protocol (test/run_tests.sh counts the lines),
shard writing in llm.c's format, and small comparisons. Import from test/ (each test puts its own
directory on sys.path). As a command, `python3 test/testlib.py random-shard PATH N SEED` writes a
shard of N random GPT-2 token ids (random.Random(SEED)), for the shell scripts."""
import struct
import sys

_failures = 0

# Open MPI for ranks on this machine: allowed as root, over shared memory and loopback TCP only
LOOPBACK_MPI = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self,vader,tcp",
                "OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo"}


def report(ok, name, detail=""):
    """Prints "PASS: name" or "FAIL: name: detail" and counts failures; returns ok."""
    global _failures
    if ok:
        print(f"PASS: {name}")
    else:
        _failures += 1
        print(f"FAIL: {name}: {detail}")
    sys.stdout.flush()
    return ok


def failures():
    """How many report() calls failed so far."""
    return _failures


def write_shard(path, tokens, magic=20240520, version=1, ntok=None, width="H"):
    """A token shard (llm.c's write_datafile: header[256] int32 = magic, version, token count;
    then the tokens, uint16 by default); ntok overrides the count in the header."""
    header = [0] * 256
    header[0], header[1], header[2] = magic, version, len(tokens) if ntok is None else ntok
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}{width}", *tokens))


def run_trainer(trainer, args, expect_ok=True, env=None, tail=3000):
    """Runs [trainer] + args (text output, 600 s at most; env: variables added to the environment)
    and returns the CompletedProcess; when expect_ok and it failed, prints its output's last
    tail characters."""
    import os
    import subprocess
    p = subprocess.run([trainer] + args, capture_output=True, text=True, timeout=600,
                       env=None if env is None else {**os.environ, **env})
    if expect_ok and p.returncode != 0:
        print(p.stdout[-tail:])
        print(p.stderr[-tail:])
    return p


def failed_count():
    """Prints how many checks failed; returns the exit status (1 when any did, else 0)."""
    print(f"{_failures} failed")
    return 1 if _failures else 0


def expect_error(name, proc, pattern, tail=500):
    """Reports whether a finished run (a subprocess.CompletedProcess with text output) exited 1
    with "error: " and pattern in its stdout + stderr."""
    out = proc.stdout + proc.stderr
    return report(proc.returncode == 1 and "error: " in out and pattern in out, name,
                  f"exit {proc.returncode}: {out[-tail:]}")


def write_random_shard(path, n, seed):
    """A shard of n token ids drawn uniformly from GPT-2's 50257 by random.Random(seed)."""
    import random
    rng = random.Random(seed)
    write_shard(path, [rng.randrange(50257) for _ in range(n)])


def first_diff(a, b):
    """The first index where two sequences differ (the shorter one's length if one is a prefix)."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def log_losses(outdir, key="train_loss"):
    """{step: value} of key in outdir/log.jsonl ({} when there is no log)."""
    import json
    import os
    path = os.path.join(outdir, "log.jsonl")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {r["step"]: r[key] for r in map(json.loads, f) if key in r}


def log_records(outdir):
    """outdir/log.jsonl's records, in order."""
    import json
    import os
    with open(os.path.join(outdir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def model_floats(path, header=1024):
    """The fp32 parameters of a model file after its header (bytes)."""
    with open(path, "rb") as f:
        f.seek(header)
        data = f.read()
    return struct.unpack(f"<{len(data) // 4}f", data)


def rel_loss_diff(a, b):
    """The largest relative difference of two {step: value} maps; inf when their steps differ (or none)."""
    if sorted(a) != sorted(b) or not a:
        return float("inf")
    return max(abs(a[s] - b[s]) / abs(b[s]) for s in a)


def same_bytes(a, b):
    """Do both files exist, byte for byte the same?"""
    import os
    if not (os.path.exists(a) and os.path.exists(b)):
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def all_built(*exes):
    """Reports a FAIL for each of exes that is not an executable file; True when all are."""
    import os
    missing = [e for e in exes if not os.access(e, os.X_OK)]
    for e in missing:
        report(False, f"{e} is built", "build it first")
    return not missing


def check_losses_match(name, runs, steps, rtol, marker=None):
    """runs: two (CompletedProcess, run directory) pairs, the one checked first. Reports whether both
    exited 0, both logged train losses for exactly steps, the first's within rtol (relative) of the
    second's, and (marker given) the first printed marker; returns the two {step: loss}."""
    (pa, da), (pb, db) = runs
    a, b = log_losses(da), log_losses(db)
    ok = pa.returncode == 0 and pb.returncode == 0 and sorted(a) == sorted(b) == list(steps)
    ok = ok and all(abs(a[s] - b[s]) <= rtol * abs(b[s]) for s in a) and (marker is None or marker in pa.stdout)
    report(ok, name, f"{a} vs {b}: {(pa.stdout + pa.stderr)[-800:]} {pb.stderr[-300:]}")
    return a, b


def kill_a_rank(cmd, np, outdir, env, timeout=60, start_timeout=120, which=1):
    """Starts cmd (mpirun with np ranks, training into outdir), waits until its first step is
    logged (outdir/log.jsonl), SIGKILLs one rank (the launcher's child number `which`, in the
    order of their process ids: the second by default) and waits up to timeout
    seconds for the job to end. Returns (problem, returncode, output, seconds): problem is None
    when the job ended, else what went wrong (the job is then killed)."""
    import os
    import signal
    import subprocess
    import time
    # its own session: whatever goes wrong, the whole job (launcher and ranks) is killed at the end
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)

    def kill_job():
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    ranks, log = [], os.path.join(outdir, "log.jsonl")
    deadline = time.time() + start_timeout
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(log) and '"train_loss"' in open(log).read():
            # the launcher's children that are ranks (a launcher script also runs sleep, subshells, ...)
            rows = subprocess.run(["ps", "--ppid", str(proc.pid), "-o", "pid=,comm="], capture_output=True,
                                  text=True).stdout.split("\n")
            ranks = [r.split()[0] for r in rows if len(r.split()) == 2 and r.split()[1] not in ("sleep", "bash", "sh", "tr")]
            break
        time.sleep(0.1)
    if len(ranks) != np:
        kill_job()
        text, _ = proc.communicate()
        return f"the job did not start {np} ranks training (ranks {ranks}): {text[-300:]}", proc.returncode, text, 0.0
    os.kill(int(ranks[which]), signal.SIGKILL)
    t0 = time.time()
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_job()
        text, _ = proc.communicate()
        return f"still running {timeout} s after the kill", proc.returncode, text, time.time() - t0
    kill_job()  # (anything of the job still left)
    return None, proc.returncode, text, time.time() - t0


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "random-shard":
        sys.exit("usage: testlib.py random-shard PATH N SEED")
    write_random_shard(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
