"""Hostile eval files (issue 27): llm.c's multiple-choice files with random damage, scored by
./train_gpt_cpu -x 0 -h 1 on the driver's tiny model (V 256, T 32), and random JSONL lines for
./tokenizer evalfile. A damaged file must be a clean error (never a crash, a hang or a score);
an undamaged one must score; the preparer never leaves an output behind when it fails."""
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hardening_util import TOKENIZER, TRAINER, clean_outcome, run  # noqa: E402
from hostile_common import TIMEOUT, base_args  # noqa: E402

T, V = 32, 256


def words_of(r, n):
    out = []
    for i in range(n):
        ctx = [r.randrange(V) for _ in range(r.randint(1, 12))]
        comps = [[r.randrange(V) for _ in range(r.randint(1, 8))] for _ in range(4)]
        out.append([r.randrange(4), ctx, comps])
    return out


def stream(examples, wb, edit=None):
    """llm.c's write_evalfile words; edit(i, w) may change example i's words before BYTES is set."""
    out, big = [], 0
    for i, (label, ctx, comps) in enumerate(examples):
        w = [(1 << (8 * wb)) - 1, 0, i, label, len(comps), len(ctx)] + ctx
        for c in comps:
            w += [len(c)] + c
        if edit:
            edit(i, w)
        w[1] = w[1] or len(w) * wb
        big = max(big, w[1])
        out += w
    return out, big


def case_evalfile(ctx, r, tag):
    n = r.randint(1, 9)
    ex = words_of(r, n)
    version = r.choice([1, 2])
    wb = 2 if version == 1 else 4
    kind = r.choice(["ok", "ok", "truncate", "magic", "version", "count", "label", "ncomp", "long", "oov", "index",
                     "delim", "bytes", "empty_ctx", "empty_comp", "trailing", "longest", "flip"])
    target = r.randrange(n)
    edits = {"label": (3, r.choice([4, 5, (1 << (8 * wb)) - 2])), "ncomp": (4, r.choice([0, 3, 5])),
             "oov": (6, r.choice([V, V + 1, (1 << (8 * wb)) - 2])), "index": (2, target + r.randint(1, 5)),
             "delim": (0, r.randrange((1 << (8 * wb)) - 1)), "bytes": (1, r.choice([2, 7 * wb, 1 << (8 * wb - 2)]))}

    def edit(i, w):
        if i != target:
            return
        if kind in edits:
            k, v = edits[kind]
            w[k] = v
        elif kind == "long":
            w[5:6 + w[5]] = [T - 1] + [1] * (T - 1)  # context of T - 1 tokens: + any completion >= T
        elif kind == "empty_ctx":
            del w[6:6 + w[5]]
            w[5] = 0
        elif kind == "empty_comp":
            k = 6 + w[5]
            del w[k + 1:k + 1 + w[k]]
            w[k] = 0
    words, big = stream(ex, wb, edit)
    header = [20240522, version, n, big]
    if kind == "magic":
        header[0] = r.choice([20240520, 0, -1])
    elif kind == "version":
        header[1] = r.choice([0, 3, 7, -1])
    elif kind == "count":
        header[2] = r.choice([n + 1, n - 1, 0, -1, 1 << 30])
    elif kind == "longest":
        header[3] = r.choice([0, -1, 1])
    data = struct.pack("<256i", *(header + [0] * 252)) + struct.pack(f"<{len(words)}{'H' if wb == 2 else 'I'}", *words)
    if kind == "truncate":
        data = data[:r.randrange(len(data))]
    elif kind == "trailing":
        data += bytes(r.randrange(256) for _ in range(r.randint(1, 9)))
    elif kind == "flip" and len(data) > 1024:
        k = r.randrange(1024, len(data))
        data = data[:k] + bytes([data[k] ^ (1 << r.randrange(8))]) + data[k + 1:]
    p = ctx.path(f"eval_{tag}.bin")
    open(p, "wb").write(data)
    args = base_args(ctx) + ["-e", ctx.model, "-x", "0", "-h", "1", "--hellaswag-file", p, "-v", "0", "-b", "4"]
    rc, out, err = run(TRAINER, args, timeout=TIMEOUT)
    o = clean_outcome(rc, err)
    scored = "HellaSwag: " in out and f"/{n} = " in out
    if o == "ok" and (kind not in ("ok", "flip") or not scored):
        return "silent", f"{kind} (version {version}): exit 0{'' if scored else ' without a score'}"
    if o == "error" and kind == "ok":
        return "silent", f"a valid file refused: {err[-200:]}"
    if o == "error" and p not in err:
        return "unclean", f"{kind}: the error does not name the file: {err[-200:]}"
    return o, kind


JSONL_LINES = [
    '{"ctx": "To be", "endings": ["or not", "to be", "that is", "the question"], "label": 1}',
    '{"ctx_a": "A", "ctx_b": "b", "endings": ["1", "2", "3", "4"], "label": "3"}',
    '{"ctx": "x", "endings": ["a", "b", "c"], "label": 0}',
    '{"ctx": "x", "endings": ["a", "b", "c", "d"], "label": 9}',
    '{"ctx": "x", "endings": ["a", "b", "c", "d"], "label": -1}',
    '{"ctx": "x", "endings": ["a", "b", "c", "d"], "label": 1.5}',
    '{"ctx": "x", "endings": ["a", "", "c", "d"], "label": 0}',
    '{"ctx": 5, "endings": ["a", "b", "c", "d"], "label": 0}',
    '{"ctx": "x", "endings": "abcd", "label": 0}',
    '{"ctx": "x", "endings": ["a", "b", "c", "d"], "label": 0',
    '{"ctx": "\\ud800", "endings": ["a", "b", "c", "\\u0000"], "label": 2}',
    '[1, 2, 3]',
    '',
    '{}',
]


def case_preparer(ctx, r, tag):
    if not ctx.have_tokenizer:
        return "skip", "no tokenizer files"
    lines = [r.choice(JSONL_LINES) for _ in range(r.randint(1, 6))]
    if r.random() < 0.3:  # random bytes cut in
        k = r.randrange(len(lines))
        s = lines[k]
        cut = r.randrange(len(s) + 1)
        lines[k] = s[:cut] + "".join(chr(r.randrange(32, 127)) for _ in range(r.randint(1, 4))) + s[cut:]
    src, dst = ctx.path(f"mc_{tag}.jsonl"), ctx.path(f"mc_{tag}.bin")
    open(src, "w").write("\n".join(lines) + "\n")
    skip = r.random() < 0.5
    rc, out, err = run(TOKENIZER, ["evalfile"] + (["--skip-bad-lines"] if skip else []) + [src, dst], timeout=TIMEOUT)
    o = clean_outcome(rc, err)
    if o == "error" and os.path.exists(dst):
        return "unclean", "failed but wrote its output"
    if o == "ok" and not os.path.exists(dst):
        return "silent", "exit 0 without an output"
    if o == "ok":  # the output must be a file the trainer scores
        rc2, out2, err2 = run(TRAINER, base_args(ctx) + ["-e", "d1", "-x", "0", "-h", "1", "--hellaswag-file", dst, "-v",
                                                         "0", "-b", "4", "-t", "64"], timeout=TIMEOUT)
        if clean_outcome(rc2, err2) == "crash" or (rc2 == 0 and "HellaSwag: " not in out2):
            return "silent", f"the preparer's output did not score: {err2[-200:]}"
    return o, "skip" if skip else "strict"


CATEGORIES = [("evalfile", case_evalfile), ("evalfile-jsonl", case_preparer)]
