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
