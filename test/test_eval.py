#!/usr/bin/env python3
"""Multiple-choice evaluation (-h 1, issue 27): llm.c's eval files, batching and acc_norm.

Files are made here (llm.c's write_evalfile layout, evalfile() below): contexts and endings cut
from tiny Shakespeare (byte values as token ids). The counts of ./train_gpt_cpu -x 0 -h 1 and of
./train_gpt through the cudasim harness equal dev/reference/eval_mc.py's (PyTorch, float64, one
unpadded row per completion), for GPT-2 and the Llama, at -b 4 and -b 6 (not a multiple of 4:
rows 4 and 5 unused), on 1 and 2 ranks (mpirun), at -t 32 (llm.c's B x T batch) and -t 256 (the
forward on B x 64: the longest row rounded up to 64). Each file is also scored with its labels rotated
by 1, 2, 3: four counts per model pin every prediction's distribution, not only one sum.
A training run with -h 1 evaluates at -v steps after step 0 and at the last step (log.jsonl:
hellaswag_acc and the counts); the default file absent is a note; a named file absent, and every
bad file (truncated, wrong magic or version, label >= completions, an example not shorter than T,
a token outside the vocabulary, a count that disagrees), is a clean error naming the file and
the example.
Usage: test/test_eval.py [--no-sim]   (LLMC_DATA_DIR: where tinyshakespeare.txt is)
"""
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from testlib import LOOPBACK_MPI, expect_error, failed_count, report  # noqa: E402

PY = "/usr/bin/python3"
CPU = "./train_gpt_cpu"
SIM = "build/cudasim/train_gpt"
T, V = 32, 512
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "passive", **LOOPBACK_MPI}


def run(cmd, timeout=600):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)


def evalfile(path, examples, version=1, longest=None, count=None, corrupt=None):
    """llm.c's write_evalfile: header (magic 20240522, version, count, longest example bytes), then
    per example the words START, BYTES, INDEX, LABEL, NCOMP, NCTX ctx..., (N comp...) x NCOMP.
    corrupt(i, words) may change example i's words (before BYTES is filled in)."""
    wb = 2 if version == 1 else 4
    stream, big = [], 0
    for i, (label, ctx, comps) in enumerate(examples):
        w = [(1 << (8 * wb)) - 1, 0, i, label, len(comps), len(ctx)] + list(ctx)
        for c in comps:
            w += [len(c)] + list(c)
        if corrupt:
            corrupt(i, w)
        w[1] = w[1] or len(w) * wb
        big = max(big, w[1])
        stream += w
    header = [20240522, version, len(examples) if count is None else count, big if longest is None else longest]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *(header + [0] * 252)))
        f.write(struct.pack(f"<{len(stream)}{'H' if wb == 2 else 'I'}", *stream))


def shakespeare_examples(n, seed, text):
    """n examples: a context of 3..18 bytes and 4 endings of 1..9 bytes cut from text (T 32 holds
    them: context + ending < 32), a random label."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a = rng.randrange(len(text) - 64)
        ctx = list(text[a:a + rng.randint(3, 18)])
        comps = []
        for _ in range(4):
            b = rng.randrange(len(text) - 16)
            comps.append(list(text[b:b + rng.randint(1, 9)]))
        out.append((rng.randrange(4), ctx, comps))
    return out


def rotated(examples, k):
    return [((label + k) % 4, ctx, comps) for label, ctx, comps in examples]


def hellaswag_line(out):
    m = re.findall(r"^HellaSwag: (\d+)/(\d+) = ([0-9.]+)$", out, re.M)
    return (int(m[-1][0]), int(m[-1][1])) if m else None


def main():
    sim = "--no-sim" not in sys.argv and os.path.exists(SIM)
    data = os.environ.get("LLMC_DATA_DIR", os.path.join(HERE, "..", "..", "shared", "data"))
    src = os.path.join(data, "tinyshakespeare.txt")
    if not os.path.exists(src):
        sys.exit(f"FAIL: no {src} (set LLMC_DATA_DIR)")
    text = bytes(b for b in open(src, "rb").read() if b < 128)
    tmp = tempfile.mkdtemp(prefix="llmc_eval.")
    try:
        examples = shakespeare_examples(13, 7, text)  # 13: uneven over 2 ranks and over B/4 = 1
        files = []
        for k in range(4):
            files.append(os.path.join(tmp, f"rot{k}.bin"))
            evalfile(files[-1], rotated(examples, k))
        # ---- counts against the PyTorch reference -------------------------------------------
        for arch in ("gpt2", "llama3"):
            model = os.path.join(tmp, f"{arch}.bin")
            want = []
            for k, f in enumerate(files):
                p = run([PY, "dev/reference/eval_mc.py", f, "--arch", arch, "--vocab", str(V), "--max-seq-len", "256",
                         "--save-model", model])
                if p.returncode != 0:
                    sys.exit(f"FAIL: reference: {p.stderr[-2000:]}")
                want.append(json.loads(p.stdout)["correct"])
            if sum(want) != len(examples):
                report(False, f"{arch}: the reference's rotated counts sum to the examples", str(want))
            trainers = [("CPU", CPU, [])] + ([("cudasim", SIM, ["--precision", "fp32"])] if sim else [])
            for name, trainer, extra in trainers:
                # -t 32: llm.c's B x T batch; -t 256: the forward on B x 64 (the longest row rounded up to 64)
                for B, np_, t in ((4, 1, T), (6, 1, T), (4, 2, T), (6, 2, T), (4, 1, 256), (6, 2, 256)):
                    if name == "cudasim" and arch == "llama3" and np_ == 2 and B == 6 and t == T:
                        continue  # (time: the harness is slow; B 4 covers 2 ranks)
                    got = []
                    for f in files:
                        cmd = [trainer, "-e", model, "-x", "0", "-h", "1", "--hellaswag-file", f, "-v", "0", "-b", str(B),
                               "-t", str(t)] + extra
                        if np_ > 1:
                            cmd = ["mpirun", "--oversubscribe", "-np", str(np_)] + cmd
                        p = run(cmd)
                        line = hellaswag_line(p.stdout)
                        got.append(line[0] if p.returncode == 0 and line and line[1] == len(examples) else
                                   f"exit {p.returncode} {p.stdout[-300:]} {p.stderr[-600:]}")
                    report(got == want, f"{arch} {name} -b {B} -t {t}, {np_} rank(s): HellaSwag counts (labels rotated "
                           "0..3) equal the PyTorch reference's", f"got {got}, reference {want}")
        # ---- during training: where llm.c evaluates, and the log ----------------------------
        shard = os.path.join(tmp, "train.bin")
        toks = list(text[:4000])
        with open(shard, "wb") as f:
            f.write(struct.pack("<256i", *([20240520, 1, len(toks)] + [0] * 253)))
            f.write(struct.pack(f"<{len(toks)}H", *toks))
        out = os.path.join(tmp, "run")
        base = [CPU, "-e", os.path.join(tmp, "gpt2.bin"), "-i", shard, "-j", shard, "-b", "4", "-t", str(T), "-s", "0",
                "-m", "1"]
        p = run(base + ["-x", "3", "-v", "2", "-h", "1", "--hellaswag-file", files[0], "-o", out])
        recs = [json.loads(l) for l in open(os.path.join(out, "log.jsonl"))] if p.returncode == 0 else []
        hs = [(r["step"], r["hellaswag_correct"], r["hellaswag_total"]) for r in recs if "hellaswag_acc" in r]
        steps = [s for s, _, _ in hs]
        prints = re.findall(r"^HellaSwag: \d+/13 = [0-9.]+$", p.stdout, re.M)
        report(steps == [2, 3] and all(t == 13 for _, _, t in hs) and len(prints) == 2 and
               all(abs(r["hellaswag_acc"] - r["hellaswag_correct"] / 13) < 1e-9 for r in recs if "hellaswag_acc" in r),
               "training -x 3 -v 2 -h 1: evaluated at steps 2 and 3 (not 0), printed 'HellaSwag: N/M = ACC', logged "
               "hellaswag_acc with the counts", f"exit {p.returncode}: {hs} {p.stdout[-800:]} {p.stderr[-800:]}")
        here = os.getcwd()
        try:  # llm.c's default path, absent: a note, the run goes on
            os.chdir(tmp)
            p = run([os.path.join(here, CPU)] + base[1:] + ["-x", "1", "-v", "1", "-h", "1"])
        finally:
            os.chdir(here)
        report(p.returncode == 0 and "note: -h 1: no HellaSwag file at 'dev/data/hellaswag/hellaswag_val.bin'" in p.stdout
               and "HellaSwag:" not in p.stdout.replace("no HellaSwag", ""),
               "-h 1 with llm.c's default file absent: a note, training continues without it",
               f"exit {p.returncode}: {p.stdout[-500:]} {p.stderr[-500:]}")
        p = run(base + ["-x", "1", "-h", "1", "--hellaswag-file", os.path.join(tmp, "nope.bin")])
        expect_error("-h 1 --hellaswag-file naming an absent file: an error naming it", p, "nope.bin' (--hellaswag-file) does not exist")
        p = run(base + ["-x", "0", "-h", "1", "-b", "3", "--hellaswag-file", files[0], "-v", "0"])
        expect_error("-h 1 -b 3: an error (one example takes 4 rows)", p, "-b 3 is too small")
        # ---- bad files: clean errors naming the file and the example --------------------------
        bad = os.path.join(tmp, "bad.bin")

        def set_word(idx, k, value):
            def f(i, w):
                if i == idx:
                    w[k] = value
            return f
        long_ex = list(examples)
        long_ex[5] = (long_ex[5][0], [65] * 20, [[66] * 11] + long_ex[5][2][1:])  # 20 + 11 = 31 < 32: fits
        evalfile(bad, long_ex)
        p = run(base + ["-x", "0", "-h", "1", "--hellaswag-file", bad, "-v", "0"])
        report(p.returncode == 0 and hellaswag_line(p.stdout) is not None, "an example of context + completion = T - 1 fits",
               f"exit {p.returncode}: {p.stderr[-400:]}")
        long_ex[5] = (long_ex[5][0], [65] * 20, [[66] * 12] + long_ex[5][2][1:])  # 32: not shorter than T
        cases = [
            ("truncated", lambda: (evalfile(bad, examples), open(bad, "r+b").truncate(os.path.getsize(bad) - 7)),
             "example 12 (at byte"),
            ("header only, truncated", lambda: open(bad, "wb").write(b"\0" * 100), "shorter than its 1024-byte header"),
            ("wrong magic", lambda: (evalfile(bad, examples), patch(bad, 0, 20240520)), "magic 20240520, expected 20240522"),
            ("wrong version", lambda: (evalfile(bad, examples), patch(bad, 4, 3)), "version 3, expected 1"),
            ("label >= completions", lambda: evalfile(bad, examples, corrupt=set_word(4, 3, 4)),
             "example 4 (at byte"),
            ("an example not shorter than T", lambda: evalfile(bad, long_ex), "example 5 (at byte"),
            ("a token outside the vocabulary", lambda: evalfile(bad, examples, corrupt=set_word(9, 7, V)),
             "example 9 (at byte"),
            ("a count above the examples", lambda: evalfile(bad, examples, count=14), "example 13 (at byte"),
            ("a count below the examples", lambda: evalfile(bad, examples, count=12), "follow the 12 examples"),
            ("a bad example index", lambda: evalfile(bad, examples, corrupt=set_word(3, 2, 7)), "example 3 (at byte"),
            ("3 completions", lambda: evalfile(bad, [(0, e[1], e[2][:3]) for e in examples]), "example 0 (at byte"),
        ]
        what = {"label >= completions": "label 4 is not below", "an example not shorter than T": "must be fewer than -t 32",
                "a token outside the vocabulary": "outside the model's vocabulary", "a bad example index": "index field is 7",
                "3 completions": "3 completions", "truncated": "truncated", "a count above the examples": "truncated"}
        for name, make, pattern in cases:
            make()
            for trainer in [CPU] + ([SIM] if sim else []):
                p = run([trainer] + base[1:] + ["-x", "0", "-h", "1", "--hellaswag-file", bad, "-v", "0"])
                expect_error(f"bad eval file ({name}), {os.path.basename(trainer)}: a clean error naming the file and "
                             "what is wrong", p, f"eval file '{bad}'")
                out_ = p.stdout + p.stderr
                report(pattern in out_ and what.get(name, "") in out_ and "Traceback" not in out_ and "Assertion" not in out_,
                       f"bad eval file ({name}), {os.path.basename(trainer)}: the error says '{pattern}'", out_[-400:])
        # ---- version 2 (uint32 words, llm.c's Llama 3 files): the same counts -----------------
        v2 = os.path.join(tmp, "v2.bin")
        evalfile(v2, examples, version=2)
        p1 = run([CPU] + base[1:] + ["-x", "0", "-h", "1", "--hellaswag-file", files[0], "-v", "0"])
        p2 = run([CPU] + base[1:] + ["-x", "0", "-h", "1", "--hellaswag-file", v2, "-v", "0"])
        report(p2.returncode == 0 and hellaswag_line(p2.stdout) == hellaswag_line(p1.stdout) is not None,
               "an eval file of version 2 (uint32 words) scores as its version-1 twin", p2.stderr[-400:])
        preparer(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return failed_count()


def preparer(tmp):
    """./tokenizer evalfile against a writer following write_evalfile over tiktoken's GPT-2 tokens
    (the context encoded as is, each ending with a space before it: llm.c's hellaswag.py)."""
    try:
        from test_tokenizer import make_encoding
        gpt2 = run(["./tokenizer", "find-gpt2"]).stdout.strip()
        enc = make_encoding(gpt2)
    except Exception as e:  # noqa: BLE001
        report(False, "tiktoken and the GPT-2 files for the preparer test", repr(e))
        return
    good = [
        {"ctx": "A man is sitting on a roof. He", "endings": ["is using wrap to wrap a pair of skis.", "starts pulling up roofing.",
                                                              "is ripping level tiles off.", "holds a rubik's cube."], "label": 3},
        {"ind": 4, "activity_label": "Clean and jerk", "ctx_a": "A lady walks to a barbell.", "ctx_b": "she",
         "endings": [" bends down and grabs the pole.", "swings and lands.", "caf\u00e9 \"quoted\"", "lifts it."], "label": "0",
         "split": "val", "source_id": "x"},
        {"ctx_a": "Only ctx_a here", "ctx_b": "", "endings": ["one", "two", "three", "\u4e2d\u6587"], "label": 2},
    ]
    bad = ['{"ctx": "x", "endings": ["a", "b", "c"], "label": 0}',  # 3 endings
           '{"ctx": "x", "endings": ["a", "b", "c", "d"], "label": 4}',  # label out of range
           '{"ctx": "x", "endings": ["a", "b", "c", "d"]}',  # no label
           '{"ctx": "x", "endings": ["a", "b", "c", "d"], "label": 1',  # not JSON
           '{"ctx": "", "endings": ["a", "b", "c", "d"], "label": 1}',  # empty context
           '{"endings": ["a", "b", "c", "d"], "label": 1}']  # no context
    lines = [json.dumps(g) for g in good]

    def expected(objs):
        out = []
        for g in objs:
            ctx = g["ctx"] if "ctx" in g else g["ctx_a"] + (" " + g["ctx_b"] if g.get("ctx_b") else "")
            out.append((int(g["label"]), enc.encode(ctx), [enc.encode(" " + e) for e in g["endings"]]))
        return out
    src, got, want = os.path.join(tmp, "in.jsonl"), os.path.join(tmp, "out.bin"), os.path.join(tmp, "want.bin")
    with open(src, "w") as f:
        f.write("\n".join(lines[:2]) + "\n\n" + lines[2] + "\n")
    p = run(["./tokenizer", "evalfile", src, got])
    evalfile(want, expected(good))
    report(p.returncode == 0 and open(got, "rb").read() == open(want, "rb").read(),
           "./tokenizer evalfile: byte-identical to a write_evalfile-style writer over tiktoken (ctx, ctx_a + ctx_b, "
           "label as a string, escapes, a blank line)", p.stderr[-500:])
    for k, line in enumerate(bad):
        with open(src, "w") as f:
            f.write("\n".join(lines[:2] + [line] + lines[2:]) + "\n")
        if os.path.exists(got):
            os.remove(got)
        p = run(["./tokenizer", "evalfile", src, got])
        expect_error(f"./tokenizer evalfile, bad line {k} ({line[:40]}...): an error with its line number, no output",
                     p, f"'{src}' line 3: ")
        report(not os.path.exists(got), f"./tokenizer evalfile, bad line {k}: no output file written")
    with open(src, "w") as f:
        f.write("\n".join(lines[:1] + bad + lines[1:]) + "\n")
    p = run(["./tokenizer", "evalfile", "--skip-bad-lines", src, got])
    report(p.returncode == 0 and open(got, "rb").read() == open(want, "rb").read() and
           f"skipped {len(bad)} bad line(s)" in p.stderr and "line 2:" in p.stderr,
           "./tokenizer evalfile --skip-bad-lines: the good lines written (== the writer's), the bad ones counted, the first "
           "named", p.stderr[-500:])
    p = run(["./train_gpt_cpu", "-e", "d1", "-x", "0", "-h", "1", "--hellaswag-file", got, "-v", "0", "-b", "4", "-t", "64"])
    report(p.returncode == 0 and hellaswag_line(p.stdout) is not None and hellaswag_line(p.stdout)[1] == 3,
           "the preparer's file evaluates (-e d1 -x 0 -h 1)", p.stderr[-400:])


def patch(path, offset, value):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack("<i", value))


if __name__ == "__main__":
    sys.exit(main())
