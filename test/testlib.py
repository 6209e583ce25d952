"""What the Python tests share: the PASS:/FAIL: protocol (test/run_tests.sh counts the lines),
shard writing in llm.c's format, and small comparisons. Import from test/ (each test puts its own
directory on sys.path)."""
import struct
import sys

_failures = 0


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


def first_diff(a, b):
    """The first index where two sequences differ (the shorter one's length if one is a prefix)."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


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
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    ranks, log = [], os.path.join(outdir, "log.jsonl")
    deadline = time.time() + start_timeout
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(log) and '"train_loss"' in open(log).read():
            ranks = subprocess.run(["ps", "--ppid", str(proc.pid), "-o", "pid="], capture_output=True, text=True).stdout.split()
            break
        time.sleep(0.1)
    if len(ranks) != np:
        proc.kill()
        text, _ = proc.communicate()
        return f"the job did not start {np} ranks training (ranks {ranks}): {text[-300:]}", proc.returncode, text, 0.0
    os.kill(int(ranks[which]), signal.SIGKILL)
    t0 = time.time()
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        text, _ = proc.communicate()
        return f"still running {timeout} s after the kill", proc.returncode, text, time.time() - t0
    return None, proc.returncode, text, time.time() - t0
