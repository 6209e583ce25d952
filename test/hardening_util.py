"""Shared helpers of test/test_hardening.py and test/test_hostile.py: tiny models and shards
written from Python, file surgery on our checkpoints, and running the binaries under a timeout.
TRAINER / TOKENIZER (environment) select the binaries, so both tests can run against another
build (e.g. the code before a fix, to see the test fail there)."""
import os
import random
import resource
import signal
import struct
import subprocess
import zlib

from testlib import write_shard  # noqa: F401 (re-exported for the hardening tests)

# one OpenMP thread per child: these runs are tiny, and spinning thread teams on a busy machine
# cost 20x their work
os.environ.setdefault("OMP_NUM_THREADS", "1")

TRAINER = os.environ.get("TRAINER", "./train_gpt_cpu")
TOKENIZER = os.environ.get("TOKENIZER", "./tokenizer")


def numel(maxT, V, L, C, Vp):
    return C * (Vp + maxT + 2) + L * (12 * C * C + 13 * C)


def write_model(path, maxT=64, V=256, L=1, NH=1, C=32, Vp=256, seed=1, fill=None, version=3):
    """A random GPT-2 in llm.c's format (no checksum file: a 'plain llm.c file')."""
    rng = random.Random(seed)
    n = numel(maxT, V, L, C, Vp)
    header = [20240326, version, maxT, V, L, NH, C, Vp] + [0] * 248
    vals = [rng.gauss(0.0, 0.02) for _ in range(n)] if fill is None else [fill] * n
    # layernorm gains of 1 keep the model sane; the exact init does not matter for these tests
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{n}f", *vals))
    return n


def flip_bit(path, byte_offset, bit=0):
    with open(path, "r+b") as f:
        f.seek(byte_offset)
        b = f.read(1)[0]
        f.seek(byte_offset)
        f.write(bytes([b ^ (1 << bit)]))


def state_rewrite(path, edit):
    """Applies edit(header ints list) to a version-2 or 3 state file and recomputes its CRC-32 ([42]),
    so that only the field checks (not the checksum) can catch the edit."""
    data = bytearray(open(path, "rb").read())
    h = list(struct.unpack("<256i", data[:1024]))
    edit(h)
    h[42] = 0
    crc = zlib.crc32(struct.pack("<256i", *h))
    crc = zlib.crc32(bytes(data[1024:]), crc)
    h[42] = struct.unpack("<i", struct.pack("<I", crc))[0]
    data[:1024] = struct.pack("<256i", *h)
    open(path, "wb").write(bytes(data))


def limit_file_size(limit):
    """preexec_fn: files the child writes cannot grow past `limit` bytes (writes fail with EFBIG,
    as on a full disk); SIGXFSZ ignored so the failing write returns an error instead of killing."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def run(binary, args, timeout=120, preexec=None, stdin=subprocess.DEVNULL):
    """(returncode, stdout, stderr); returncode None on a timeout (a hang)."""
    try:
        p = subprocess.run([binary] + args, capture_output=True, text=True, timeout=timeout,
                           preexec_fn=preexec, stdin=stdin, errors="replace")
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return None, out, err


def clean_outcome(rc, err):
    """The contract for every input: success, or exit 1 with an 'error: ' line. Returns one of
    'ok', 'error', 'crash' (signal or other status), 'hang' (timeout), 'unclean' (exit 1 without
    an error line)."""
    if rc is None:
        return "hang"
    if rc == 0:
        return "ok"
    if rc == 1:
        return "error" if "error: " in err else "unclean"
    return "crash"
