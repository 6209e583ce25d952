"""Hostile-driver category "distillation teachers" (issue 23 item 6): --teacher given something that is
not a usable teacher for the tiny model (a missing path, a directory, a truncated copy, a copy with
flipped header bytes, a header whose vocabulary or shape differs, a descriptor of another vocabulary,
an empty string) or a usable one with hostile --distill-alpha / --distill-temperature / --teacher-quantize
values. Every run must train or stop with a clean error (exit 1, 'error: '), and the teacher file it
read must be left as it was (lost otherwise)."""
import os
import shutil
import struct

from hardening_util import TRAINER, clean_outcome, run
from hostile_common import TIMEOUT, base_args

NUMBERS = ["nan", "inf", "-inf", "-0", "0", "1", "0.5", "1.0000001", "-1e-45", "1e-45", "1e39", "0x1p3", "", "1,5",
           "2 ", "1e-3", "1000", "1000.1", "abc"]


def mangled_teacher(ctx, r, d):
    """(path, what): a teacher argument, often unusable."""
    choice = r.randrange(9)
    copy = os.path.join(d, "teacher.bin")
    shutil.copy(ctx.model, copy)
    data = bytearray(open(copy, "rb").read())
    if choice == 0:
        return os.path.join(d, "missing.bin"), "missing file"
    if choice == 1:
        return d, "a directory"
    if choice == 2:
        open(copy, "wb").write(data[:r.randrange(len(data))])
        return copy, "truncated"
    if choice == 3:
        for _ in range(r.randint(1, 4)):
            data[r.randrange(32)] = r.randrange(256)
        open(copy, "wb").write(data)
        return copy, "header bytes flipped"
    if choice == 4:  # the header's V (int 3) or Vp (int 7) changed
        slot = r.choice([3, 7])
        data[4 * slot:4 * slot + 4] = struct.pack("<i", r.choice([1, 80, 255, 257, 100000, -5]))
        open(copy, "wb").write(data)
        return copy, f"header slot {slot} changed"
    if choice == 5:
        return r.choice(["d1", "llama3:d1", "gpt2:d2", "d0", "d-3", "llama3.2-1b"]), "descriptor"
    if choice == 6:
        return "", "empty --teacher"
    return copy, "a usable teacher (the model itself)"


def case_teacher(ctx, r, tag):
    d = ctx.path(f"distill_{tag}")
    os.makedirs(d)
    teacher, what = mangled_teacher(ctx, r, d)
    flags = ["--teacher", teacher]
    if r.random() < 0.5:
        flags += ["--distill-alpha", r.choice(NUMBERS)]
    if r.random() < 0.5:
        flags += ["--distill-temperature", r.choice(NUMBERS)]
    if r.random() < 0.1:
        flags += ["--teacher-quantize", r.choice(["nf4", "bf16", "int8", ""])]
    before = open(teacher, "rb").read() if os.path.isfile(teacher) else None
    rc, out, err = run(TRAINER, base_args(ctx) + ["-e", ctx.model, "-x", "1", "-v", "0"] + flags, timeout=TIMEOUT)
    if before is not None and (not os.path.isfile(teacher) or open(teacher, "rb").read() != before):
        return "lost", f"{what}: the teacher file changed"
    return clean_outcome(rc, err), f"{what}; {' '.join(flags[2:])}"


CATEGORIES = [("distillation teachers", case_teacher)]
