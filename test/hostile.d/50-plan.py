"""Hostile categories (issue 22): the memory plan and --memory-budget, and ./tokenizer shards.

"plan and budget inputs": random -d / -b / -t / --memory-budget (unit strings, exponents, garbage)
/ --max-batch through `--plan --json`. A value this file's own reading of the documented grammar
calls bad must be an error; a good one must give a self-consistent answer: the budget in bytes as
documented (K, M, G, T, KiB .. TiB: 1024^k; KB .. TB: 1000^k), a plan whose -b * -t * accumulation
steps is -d and whose peak is within the budget, and a --max-batch whose -b fits (its peak, plus
the overhead, within the budget; the same peak --plan gives for that -b), whose next candidate does
not, and that keeps -d exact. No message may price anything at "0.000 GiB".

"tokenizer shards": one to three inputs, each good JSONL, JSONL with a bad line somewhere, JSONL
behind a UTF-8 byte order mark, an empty file or a text file; random shard sizes, --skip-bad-lines,
--overwrite over an earlier dataset, and writes capped (RLIMIT_FSIZE, a full disk). Next to the
prefix lie a user's look-alike files (ds_notes.txt, ds_val_000000.bin.bak, ds_train_1.bin). A
success must leave exactly the shards a clean unlimited run in a fresh directory writes; a failure
must leave the directory as it was (the earlier dataset included); a look-alike file changed or
deleted is "lost".
"""
import json
import os
import re
import shutil

from hardening_util import TOKENIZER, TRAINER, clean_outcome, limit_file_size, run
from hostile_common import TIMEOUT

# ---- plan and budget inputs ---------------------------------------------------------------------

UNITS = ["", "B", "b", "K", "k", "M", "G", "T", "KiB", "MiB", "GiB", "TiB", "Ki", "Gi", "KB", "MB", "GB", "TB", "kB",
         "gb", "Mib", "GIB"]
GARBAGE = ["-5", "0", "G", "0x10", "inf", "nan", "1.5Q", "12 G", "1e", "1GG", "+1G", ".5G", "1PB", "1e-400",
           "1e400", "1e30", "9300000000000000000", "1iB", "1Bi", "one"]


def expected_budget(s):
    """The budget in bytes that the README's grammar gives s, or None for a bad size."""
    m = re.fullmatch(r"(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)(?:([kKmMgGtT])(i?)([bB]?)|([bB]))?", s)
    if not m:
        return None
    v = float(m.group(1))
    if m.group(2):
        power = "KMGT".index(m.group(2).upper()) + 1
        binary = m.group(3) == "i" or not m.group(4)
        v *= float(1 << (10 * power)) if binary else 1000.0 ** power
    if not (1.0 <= v < 2.0 ** 63):
        return None
    return int(v)


def random_size(r):
    if r.random() < 0.25:
        return r.choice(GARBAGE)
    if r.random() < 0.5:  # near the tiny model's plans (a few MB to a few hundred)
        return r.choice([f"{r.randint(2, 300)}{r.choice(['M', 'MB', 'MiB', 'm', 'Mi'])}", str(r.randint(2, 300) * 10**6),
                         f"{r.uniform(0.002, 0.3):.3f}{r.choice(['G', 'GB', 'GiB'])}", f"{r.randint(2, 300)}e6",
                         f"{r.randint(2000, 300000)}{r.choice(['K', 'KB', 'kiB'])}"])
    num = r.choice([str(r.randint(1, 4000)), f"{r.uniform(0.01, 64):.2f}", f"{r.randint(1, 9)}e{r.randint(0, 12)}",
                    str(r.randint(1, 1 << 40))])
    return num + r.choice(UNITS)


def plan_json(args):
    rc, out, err = run(TRAINER, args, timeout=TIMEOUT)
    try:
        return rc, json.loads(out) if rc == 0 else None, err
    except ValueError:
        return rc, None, err


def case_plan_budget(ctx, r, tag):
    T = r.choice([16, 32, 64, 48, 16, 32, 100, 65])  # the tiny model's maxT is 64
    B = r.choice([1, 2, 3, 4, 8, 16, 33])
    args = ["--plan", "--json", "-e", ctx.model, "-t", str(T), "-b", str(B), "-v", "0"]
    d = r.choice([None, None, B * T, B * T * r.randint(1, 8), T * r.randint(1, 40), r.randint(1, 5000)])
    if d is not None:
        args += ["-d", str(d)]
    size = random_size(r)
    want = expected_budget(size)
    args += ["--memory-budget", size]
    maxb = r.random() < 0.5
    if maxb:
        args += ["--max-batch"]
    if r.random() < 0.3:
        args += ["-r", str(r.choice([0, 1, 2]))]
    rc, j, err = plan_json(args)
    o = clean_outcome(rc, err)
    what = " ".join(args[2:])
    if re.search(r"needs? 0\.000 GiB|; 0\.000 GiB|exact; 0\.000", err):
        return "silent", f"{what}: a message prices something at 0.000 GiB: {err.strip()[-200:]}"
    if o != "ok":
        return o, what
    if want is None:
        return "silent", f"{what}: exit 0 with a size the grammar calls bad"
    if T > 64:
        return "silent", f"{what}: exit 0 with -t above the model's maxT"
    if j is None:
        return "silent", f"{what}: exit 0 without a JSON answer"
    if maxb:
        Bm, nb = j.get("max_batch", 0), j.get("next_batch")
        ok = nb is not None and j.get("budget_bytes") == want and Bm >= 1 and j["peak_bytes"] <= want
        ok = ok and (d is None or d % (Bm * T) == 0) and (nb == 0 or (nb > Bm and j["next_peak_bytes"] > want))
        ok = ok and (nb == 0 or d is None or d % (nb * T) == 0)
        if ok:  # the same peak as --plan for that -b (plus the runtime overhead the budget counts)
            p_args = ["--plan", "--json", "-e", ctx.model, "-t", str(T), "-b", str(Bm), "-v", "0"]
            p_args += (["-d", str(d)] if d is not None else []) + args[args.index("--max-batch") + 1:]
            _, p, _ = plan_json(p_args)
            ok = p is not None and p["peak_bytes"] + j["overhead_bytes"] == j["peak_bytes"]
        return ("ok", what) if ok else ("silent", f"{what}: inconsistent --max-batch answer {j} (budget {want})")
    total = d if d is not None else B * T
    ok = j["total_batch"] == total and j["B"] * j["T"] * j["accum"] == total and j["peak_bytes"] <= want
    return ("ok", what) if ok else ("silent", f"{what}: inconsistent plan B {j['B']} accum {j['accum']} -d "
                                    f"{j['total_batch']} peak {j['peak_bytes']} (budget {want})")


# ---- tokenizer shards ---------------------------------------------------------------------------

LOOKALIKES = {"ds_notes.txt": b"my notes\n", "ds_val_000000.bin.bak": b"a backup\n", "ds_train_1.bin": b"not ours\n"}
SHARD = re.compile(r"ds_(val|train)_\d{6}\.bin$")


def snapshot(d):
    return {f: open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))} if os.path.isdir(d) else {}


def write_inputs(ctx, r, d):
    """1-3 inputs of random kinds; returns (paths, has_bad_line)."""
    docs = [f"Document {k}: the quick brown fox number {k} jumps." for k in range(r.randint(1, 40))]
    paths, bad = [], False
    for k in range(r.randint(1, 3)):
        kind = r.choice(["jsonl", "jsonl", "bad", "bom", "empty", "text"])
        p = os.path.join(d, f"in{k}.txt" if kind == "text" else f"in{k}.jsonl")
        lines = [json.dumps({"text": t}) for t in r.sample(docs, r.randint(1, len(docs)))]
        if kind == "bad":
            line = r.choice(['{"text": oops}', '[1, 2]', '{"other": "x"}', '{"text": "a"', "\ufeff{\"text\": \"BOM\"}"])
            # a byte order mark is bad only after line 1 (at the very start it is skipped)
            lines.insert(r.randint(1 if line.startswith("\ufeff") else 0, len(lines)), line)
            bad = True
        data = ("\n".join(lines) + "\n").encode()
        if kind == "bom":
            data = b"\xef\xbb\xbf" + data
        elif kind == "empty":
            data = b""
        elif kind == "text":
            data = " ".join(docs).encode()
        open(p, "wb").write(data)
        paths.append(p)
    return paths, bad


def case_tokenizer_shards(ctx, r, tag):
    if not ctx.have_tokenizer:
        return "skip", "no tokenizer files"
    base = ctx.path(f"toksh_{tag}")
    inputs, out, ref = (os.path.join(base, x) for x in ("inputs", "out", "ref"))
    for x in (inputs, out, ref):
        os.makedirs(x)
    paths, bad = write_inputs(ctx, r, inputs)
    flags = ["-q", "-j", "1", "--shard-tokens", str(r.choice([20, 50, 100, 400, 100000]))]
    if r.random() < 0.4:
        flags += ["--val-tokens", str(r.choice([5, 30, 200]))]
    skip = r.random() < 0.3
    if skip:
        flags += ["--skip-bad-lines"]
    # the reference: a fresh directory, no limit
    rrc, _, rerr = run(TOKENIZER, ["shards", "-o", os.path.join(ref, "ds")] + flags + paths, timeout=TIMEOUT)
    if clean_outcome(rrc, rerr) not in ("ok", "error"):
        return clean_outcome(rrc, rerr), f"reference run: {rerr.strip()[-200:]}"
    if rrc == 0 and bad and not skip:
        return "silent", "a bad JSONL line without --skip-bad-lines, exit 0"
    want = {f: b for f, b in snapshot(ref).items() if SHARD.match(f)}
    if rrc == 0 and (set(snapshot(ref)) != set(want) or not want):
        return "silent", f"reference run: files {sorted(snapshot(ref))}"
    # the run under test: look-alikes, maybe an earlier dataset and --overwrite, maybe a full disk
    for f, b in LOOKALIKES.items():
        open(os.path.join(out, f), "wb").write(b)
    overwrite = r.random() < 0.7
    if r.random() < 0.5:  # an earlier dataset (one more shard than most new ones: stale extras must go)
        old_docs = os.path.join(inputs, "old.jsonl")
        open(old_docs, "w").write("".join(json.dumps({"text": f"old document {k} " * 5}) + "\n" for k in range(30)))
        orc, _, oerr = run(TOKENIZER, ["shards", "-q", "-o", os.path.join(out, "ds"), "--shard-tokens", "30", old_docs],
                           timeout=TIMEOUT)
        if orc != 0:
            return clean_outcome(orc, oerr), f"writing the earlier dataset: {oerr.strip()[-200:]}"
    if overwrite:
        flags = flags + ["--overwrite"]
    limit = r.choice([None, None, None, 0, 500, 1100, 1500, 4000])
    before = snapshot(out)
    rc, _, err = run(TOKENIZER, ["shards", "-o", os.path.join(out, "ds")] + flags + paths, timeout=TIMEOUT,
                     preexec=limit_file_size(limit) if limit is not None else None)
    o = clean_outcome(rc, err)
    after = snapshot(out)
    what = f"{len(paths)} input(s){' with a bad line' if bad else ''}, {' '.join(flags)}, limit {limit}"
    if any(after.get(f) != b for f, b in LOOKALIKES.items()):
        return "lost", f"{what}: a look-alike file was changed or deleted: {sorted(after)}"
    if o not in ("ok", "error"):
        return o, what
    if o == "error":
        if after != before:
            return "silent", f"{what}: failed but changed the directory: {sorted(before)} -> {sorted(after)}"
        return "error", what
    if rrc != 0:
        return "silent", f"{what}: exit 0 where the clean run failed ({rerr.strip()[-120:]})"
    got = {f: b for f, b in after.items() if f not in LOOKALIKES}
    if got != want:
        return "silent", f"{what}: exit 0 but the shards differ from a clean run's: {sorted(got)} vs {sorted(want)}"
    shutil.rmtree(base, ignore_errors=True)
    return "ok", what


CATEGORIES = [
    ("plan and budget inputs", case_plan_budget),
    ("tokenizer shards", case_tokenizer_shards),
]
