"""Hostile categories for the ranks (issue 22): 2 ranks of the tiny model over -pi tcp under timing
faults and differing data, and scripts/run_dist.sh under bad arguments.

multi-rank timing and data identity (fixed scenarios, random parameters): rank 0 busy in its own
work (LLMC_TEST_BUSY_SLEEP) longer than --dist-timeout (must train to the end), one token of rank
1's training or validation data changed under the same relative path (must stop both ranks), a rank
killed (SIGKILL) or stopped (SIGSTOP) at a random moment (the other must exit 1 naming it, in time),
the port taken (run_dist.sh must exit 1 soon, leaving no rank running).
scripts: random bad arguments and settings for run_dist.sh: each an 'error: run_dist.sh:' line
and exit 1, no raw bash error, no process left behind."""
import os
import re
import shutil
import signal
import socket
import subprocess
import time

from hardening_util import TRAINER, clean_outcome
from hostile_common import base_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "run_dist.sh")
RAW_BASH = re.compile(r"unbound variable|division by|syntax error|line \d+:|command not found|integer expression|"
                      r"No such file or directory$")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(extra=None):
    return {**os.environ, "OMP_NUM_THREADS": "1", **(extra or {})}


def strays(tag):
    """Processes whose command line holds tag (killed; their pids returned)."""
    left = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout.split()
    for pid in left:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
    return left


def two_ranks(args, extra_env=None, cwds=(None, None)):
    port = free_port()
    return [subprocess.Popen([os.path.abspath(TRAINER)] + args + ["-pi", "tcp", "-ps", f"127.0.0.1:{port}", "-pn", "2",
                                                                   "-pr", str(r)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=cwds[r],
                             env=env(extra_env)) for r in range(2)]


def wait_all(procs, timeout):
    """(return codes, stderr texts); a rank still running after timeout is killed (code None)."""
    end, rcs, errs = time.time() + timeout, [], []
    for p in procs:
        try:
            _, e = p.communicate(timeout=max(0.1, end - time.time()))
            rcs.append(p.returncode)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGCONT)
            p.kill()
            _, e = p.communicate()
            rcs.append(None)
        errs.append(e)
    return rcs, errs


def worst(rcs, errs):
    outs = [clean_outcome(rc, e) for rc, e in zip(rcs, errs)]
    for o in ("hang", "crash", "unclean", "error", "ok"):
        if o in outs:
            return o
    return "ok"


def case_ranks(ctx, r, tag, k):
    kind = ("busy", "data", "killed", "stopped", "port")[k % 5]
    d = ctx.fresh(f"ranks_{kind}")
    os.makedirs(d)
    out = os.path.join(d, "run")
    args = base_args(ctx) + ["-e", ctx.model, "-x", str(r.randint(2, 3)), "-n", "1", "--dist-timeout", "1", "-o", out]
    if kind == "busy":  # sampling 30000+ tokens after step 1 (seconds), or each checkpoint slowed (the test hook)
        args[args.index("-x") + 1] = "2"
        if k < 5:
            what, extra = "sampling", None
            args += ["-s", "1", "-g", str(r.randint(30000, 40000))]
        else:
            sleep = round(r.uniform(1.6, 2.2), 2)
            what, extra = f"checkpoints of {sleep} s", {"LLMC_TEST_BUSY_SLEEP": str(sleep)}
        rcs, errs = wait_all(two_ranks(args, extra), 60)
        o = worst(rcs, errs)
        if o == "error":
            return "silent", f"rank 0 busy ({what}) > --dist-timeout 1: the run aborted: {errs[1].strip()[-200:]}"
        if o == "ok" and not os.path.exists(os.path.join(out, "DONE_00000002")):
            return "silent", f"rank 0 busy ({what}): exit 0 without the last checkpoint"
        return o, f"rank 0 busy ({what})"
    if kind == "data":
        which = r.choice(["train", "val"])
        cwds = [os.path.join(d, f"cwd{q}") for q in range(2)]
        for c in cwds:
            os.makedirs(c)
            shutil.copy(ctx.train, os.path.join(c, "train.bin"))
            shutil.copy(ctx.val, os.path.join(c, "val.bin"))
        p = os.path.join(cwds[1], f"{which}.bin")
        data = bytearray(open(p, "rb").read())
        pos = 1024 + 2 * r.randrange((len(data) - 1024) // 2)
        data[pos] = (data[pos] + r.randint(1, 255)) % 256  # still a token < 256
        open(p, "wb").write(bytes(data))
        rel = list(args)
        rel[rel.index("-i") + 1], rel[rel.index("-j") + 1] = "train.bin", "val.bin"
        rcs, errs = wait_all(two_ranks(rel, cwds=cwds), 60)
        o = worst(rcs, errs)
        if any(rc == 0 for rc in rcs):
            return "silent", f"{which} data differs at byte {pos} on rank 1: a rank trained"
        return o, f"{which} data differs at byte {pos}"
    if kind in ("killed", "stopped"):
        victim = r.randrange(2)
        procs = two_ranks(args[:args.index("-x")] + ["-x", "100000", "-n", "0"] + args[args.index("-x") + 2:])
        time.sleep(r.uniform(0.3, 1.5))
        os.kill(procs[victim].pid, signal.SIGKILL if kind == "killed" else signal.SIGSTOP)
        t0 = time.time()
        other = procs[1 - victim]
        try:
            _, e = other.communicate(timeout=20)
            rc = other.returncode
        except subprocess.TimeoutExpired:
            other.kill()
            _, e = other.communicate()
            rc = None
        took = time.time() - t0
        procs[victim].send_signal(signal.SIGCONT)
        procs[victim].kill()
        procs[victim].communicate()
        if rc is None:
            return "hang", f"rank {victim} {kind}: rank {1 - victim} still running 20 s later"
        if rc == 0:
            return "silent", f"rank {victim} {kind}: rank {1 - victim} exited 0"
        o = clean_outcome(rc, e)
        if o == "error" and not re.search(rf"rank(\(s\))? {victim}\b", e):
            return "unclean", f"rank {victim} {kind}: rank {1 - victim}'s error does not name it: {e.strip()[-200:]}"
        return o, f"rank {victim} {kind}, rank {1 - victim} stopped in {took:.1f} s"
    # port taken: rank 0 cannot listen; the script must stop rank 1 soon and leave nothing behind
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        port = s.getsockname()[1]
        slow = args[:args.index("--dist-timeout")] + ["--dist-timeout", "60"] + args[args.index("--dist-timeout") + 2:]
        try:
            p = subprocess.run([SCRIPT, "local", "2", "--pi", "tcp"] + slow, capture_output=True, text=True, timeout=30,
                               env=env({"TRAINER": os.path.abspath(TRAINER), "PORT": str(port), "RUN_DIST_GRACE": "2"}))
            rc, e = p.returncode, p.stderr
        except subprocess.TimeoutExpired:
            rc, e = None, ""
    left = strays(out)
    if rc is None:
        return "hang", "port taken: run_dist.sh still waiting 30 s later"
    if left:
        return "unclean", f"port taken: {len(left)} rank(s) left running"
    return clean_outcome(rc, e), "port taken"


def case_scripts(ctx, r, tag):
    d = ctx.fresh("script")
    os.makedirs(d)
    out = os.path.join(d, "run")
    flags = base_args(ctx) + ["-e", ctx.model, "-x", "1", "-o", out]
    extra = {"TRAINER": os.path.abspath(TRAINER)}
    kind = r.choice(["mode", "count", "pi", "port", "trainer", "hosts", "slurm", "grace"])
    if kind == "mode":
        argv = [r.choice(["", "Local", "remote", "-h", "--help", "local2", "2", "--pi"])]
    elif kind == "count":
        argv = ["local", r.choice(["0", "-1", "-5", "abc", "2.5", "1e3", "0x2", "99999", "", " ", "1 2", "+2", "2a",
                                   "1025"])]
    elif kind == "pi":
        argv = ["local", "2", "--pi"] + r.choice([[], ["udp"], [""], ["TCP"], ["--pi"], ["mpi2"]])
    elif kind == "port":
        argv = ["local", "2", "--pi", "tcp"]
        extra["PORT"] = r.choice(["0", "-1", "65536", "99999", "abc", "12 34", "1e4", "0x50"])
    elif kind == "trainer":
        argv = ["local", "2", "--pi", r.choice(["tcp", "fs"])]
        bad = r.choice(["missing", "dir", "plain"])
        t = {"missing": os.path.join(d, "no_trainer"), "dir": d, "plain": os.path.join(d, "not_executable")}[bad]
        if bad == "plain":
            open(t, "w").write("not a program\n")
        extra["TRAINER"] = t
    elif kind == "hosts":
        argv = ["hosts"] + r.choice([[], [os.path.join(d, "no_hosts")], [d]])
    elif kind == "slurm":
        argv = ["slurm"] + r.choice([[], ["--pi"], ["--pi", "fs"], ["--pi", "tcp", d]])
    else:
        argv = ["local", "2", "--pi", "tcp"]
        extra["RUN_DIST_GRACE"] = r.choice(["-1", "abc", "1.5", ""])
        if extra["RUN_DIST_GRACE"] == "":
            extra["PORT"] = "70000"
    e = {k: v for k, v in env(extra).items() if not k.startswith("SLURM_")}
    try:
        p = subprocess.run([SCRIPT] + argv + flags, capture_output=True, text=True, timeout=30, env=e)
        rc, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired:
        rc, err = None, ""
    left = strays(out)
    note = f"{kind}: {argv} {({k: v for k, v in extra.items() if k != 'TRAINER'})}"
    if rc is None:
        return "hang", note
    if left:
        return "unclean", f"{note}: {len(left)} process(es) left running"
    if rc == 0:
        return "silent", f"{note}: exit 0"
    if rc != 1:
        return "crash", f"{note}: exit {rc}"
    if "error: run_dist.sh: " not in err or RAW_BASH.search(err):
        return "unclean", f"{note}: {err.strip()[-200:]}"
    return "error", note


CATEGORIES = [
    ("multi-rank timing and data identity", case_ranks, 10),
    ("scripts", case_scripts),
]
