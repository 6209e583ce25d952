#!/usr/bin/env python3
"""Checks ./tokenizer against tiktoken's "gpt2" encoding, built from the local GPT-2 files
(no download), token for token; plus round trips, shards, `make data` and bad inputs.

Usage (repo root): python3 test/test_tokenizer.py [--seed N] [--quick]
Prints PASS:/FAIL: lines; exits non-zero on any failure. The fuzz seed is printed.
--quick skips the sweep over every Unicode code point (the slowest check).
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import failures, first_diff, report, write_shard  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the program under test; test/test_sanitizers.sh points this at its ASan+UBSan build
TOOL = os.environ.get("LLMC_TEST_TOKENIZER", os.path.join(ROOT, "tokenizer"))


def run(args, **kw):
    return subprocess.run([TOOL] + args, capture_output=True, cwd=ROOT, **kw)


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, ntok = struct.unpack("<3i", data[:12])
    width = {(20240520, 1): 2, (20240801, 7): 4}[(magic, version)]
    assert len(data) == 1024 + width * ntok, f"{path}: size does not match its header"
    return list(memoryview(data[1024:]).cast("H" if width == 2 else "I"))


def read_shards(prefix):
    """All tokens of PREFIX_val_000000.bin, PREFIX_train_000001.bin, ... in order."""
    out, i = [], 0
    while True:
        path = f"{prefix}_{'val' if i == 0 else 'train'}_{i:06d}.bin"
        if not os.path.exists(path):
            return out
        out += read_shard(path)
        i += 1


def make_encoding(gpt2_dir):
    import tiktoken
    import tiktoken.load

    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        os.path.join(gpt2_dir, "vocab.bpe"), os.path.join(gpt2_dir, "encoder.json"))
    # tiktoken_ext.openai_public's r50k/gpt2 pattern (GPT-2's regex, written possessively)
    pat = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
    return tiktoken.Encoding("gpt2-local", pat_str=pat, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)


class Ctx:
    def __init__(self, enc, tmp):
        self.enc, self.tmp, self.n = enc, tmp, 0

    def path(self, name):
        self.n += 1
        return os.path.join(self.tmp, f"{self.n}_{name}")

    def encode_bytes(self, data, extra=()):
        src, dst = self.path("in.txt"), self.path("out.bin")
        with open(src, "wb") as f:
            f.write(data)
        r = run(["encode", "-q", *extra, src, dst])
        if r.returncode != 0:
            raise RuntimeError(r.stderr.decode(errors="replace"))
        return read_shard(dst), dst

    def encode_docs(self, docs, extra=()):
        """Encodes many documents in one ./tokenizer shards call (JSONL); returns per-doc ids."""
        src, prefix = self.path("docs.jsonl"), self.path("docs")
        with open(src, "w") as f:
            for d in docs:
                f.write(json.dumps({"id": 1, "meta": {"text": "decoy"}, "text": d}) + "\n")
        r = run(["shards", "-q", "-o", prefix, "--shard-tokens", "2000000000", *extra, src])
        if r.returncode != 0:
            raise RuntimeError(r.stderr.decode(errors="replace"))
        ids = read_shards(prefix)
        out, cur = [], None
        for t in ids:
            if t == 50256:
                cur = []
                out.append(cur)
            else:
                cur.append(t)
        return out


def check_same(ctx, name, text):
    ref = ctx.enc.encode_ordinary(text)
    got, _ = ctx.encode_bytes(text.encode("utf-8"))
    i = first_diff(ref, got)
    return report(ref == got, name,
                  f"{len(got)} tokens vs tiktoken {len(ref)}; first difference at token {i}: "
                  f"got {got[i:i + 5]} want {ref[i:i + 5]} in {text[:80]!r}")


TRICKY = {
    "contractions": "I'm he's she'd we'll they've you're it's can't 'S 'T 'RE 'VE 'M 'LL 'D O'NEILL'S DON'T I'M "
                    "'s's 'll've ''s '' 'x",
    "contractions_unicode_apostrophe": "don\u2019t it\u2019s \u2018quoted\u2019",
    "numbers": "0 1 12 123 1234 12345 3.14159 -42 1,000,000 1e10 0x1F \u0663\u0664 \u00bd \u2167 \u00b2",
    "whitespace_runs": "a  b   c    d\n\ne\n\n\nf \n g\t\th \t \n i   \n",
    "trailing_spaces_before_words": "word   word    \n   word\n    \n\tword  ",
    "only_spaces": "     ",
    "only_newlines": "\n\n\n\n",
    "crlf": "line one\r\nline two\r\n\r\nline four\r\n  \r\n",
    "tabs": "\tindented\n\t\tdouble\n    spaces\n\t \tmixed",
    "cjk": "\u4e2d\u6587\u5b57\u7b26\u6d4b\u8bd5 \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "arabic": "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u0661\u0662\u0663",
    "devanagari": "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e \u0967\u0968",
    "cyrillic": "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0401\u0436\u0438\u043a",
    "emoji": "hi \U0001F44B\U0001F3FD family \U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 "
             "flag \U0001F1FA\U0001F1F8 \u2764\ufe0f \U0001F9D1\U0001F3FF\u200D\U0001F4BB!!",
    "unicode_spaces": "a\u00a0b\u2009c\u3000d\u202fe\u205ff\u1680g\u2028h\u2029i\u0085j\u180ek\u200bl\ufeffm "
                      "\u00a0\u00a0word \u3000\u3000x",
    "combining_marks": "e\u0301 n\u0303o\u0308 a\u0300\u0301\u0302 \u0915\u093f Z\u0351\u0352\u0353",
    "code": "def f(x):\n    return x**2  # square\n\nif __name__ == '__main__':\n\tprint(f(3))\n",
    "punctuation": "Hello, world!!! ...?! (parens) [brackets] {braces} <tags/> @#$%^&*_+=~`|\\",
    "control_chars": "a\x00b\x01c\x1f\x7fd\x0be\x0cf",
    "long_word": "pneumonoultramicroscopicsilicovolcanoconiosis" * 20,
    "long_space_run": " " * 5000 + "x" + "\n" * 3000,
}


def fuzz_docs(rng, n):
    pieces = ["the", "The", " ", "  ", "\n", "\n\n", "\t", "\r\n", "'s", "'S", "'ll", "'re", "'", "''", "0", "42",
              "3.5", "\u00a0", "\u3000", "\u2009", "\u0301", "\u200d", "\U0001F44D", "\U0001F3FD", "\u4e2d", "\u0645",
              "\u0928", "\u0416", "\u00e9", "!", "?!", "...", "-", "_", "\u2019", "\x00", "\u0663", "\u00b2"]
    docs = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randrange(0, 40)):
            r = rng.random()
            if r < 0.7:
                parts.append(rng.choice(pieces))
            elif r < 0.85:
                parts.append(chr(rng.randrange(0x20, 0x250)))
            else:
                cp = rng.randrange(0x80, 0x30000)
                if not 0xD800 <= cp <= 0xDFFF:
                    parts.append(chr(cp))
        docs.append("".join(parts))
    return docs


def check_docs(ctx, name, docs, extra=()):
    ref = ctx.enc.encode_ordinary_batch(docs)
    got = ctx.encode_docs(docs, extra)
    if len(got) != len(docs):
        return report(False, name, f"{len(got)} documents back, {len(docs)} sent")
    bad = [i for i in range(len(docs)) if got[i] != ref[i]]
    return report(not bad, name, f"{len(bad)} of {len(docs)} documents differ; first {docs[bad[0]]!r}: "
                                 f"got {got[bad[0]][:20]} want {ref[bad[0]][:20]}" if bad else "")


def unicode_sweep_docs():
    # every code point of planes 0-3 and 14 (the others are unassigned or private use)
    cps = [c for c in range(0x40000) if not 0xD800 <= c <= 0xDFFF] + list(range(0xE0000, 0xE1000))
    return [f"a{c}b {c}{c}1{c}\n{c}'s  {c}" for c in map(chr, cps)]


def llmc_tinyshakespeare(enc, text):
    """llm.c's tinyshakespeare.py procedure, re-implemented with tiktoken."""
    parts = text.split("\n\n")
    tokens = []
    for i, part in enumerate(parts):
        tokens.append(50256)
        tokens.extend(enc.encode_ordinary(part + ("\n\n" if i < len(parts) - 1 else "")))
    return tokens[:32768], tokens[32768:]


def llmc_tokenizer_file(enc):
    """llm.c's write_tokenizer (version 2)."""
    header = [0] * 256
    header[0], header[1], header[2], header[3] = 20240328, 2, enc.max_token_value + 1, 50256
    out = [struct.pack("<256I", *header)]
    for i in range(enc.max_token_value + 1):
        b = enc.decode_single_token_bytes(i)
        out.append(bytes([len(b)]) + b)
    return b"".join(out)


def check_data(ctx, gpt2_dir, shakespeare):
    out = ctx.path("dataout")
    os.makedirs(out)
    env = dict(os.environ, LLMC_DATA_OUT=out)
    r = subprocess.run([os.path.join(ROOT, "data/prepare_tinyshakespeare.sh")], cwd=ROOT, env=env,
                       capture_output=True)
    if not report(r.returncode == 0, "prepare_tinyshakespeare_runs", r.stderr.decode(errors="replace")):
        return
    val_p = os.path.join(out, "tinyshakespeare/tiny_shakespeare_val.bin")
    train_p = os.path.join(out, "tinyshakespeare/tiny_shakespeare_train.bin")
    val, train = read_shard(val_p), read_shard(train_p)
    report((len(val), len(train)) == (32768, 305260), "tinyshakespeare_counts",
           f"val {len(val)} train {len(train)}, expected 32768 + 305260")
    ref_val, ref_train = llmc_tinyshakespeare(ctx.enc, shakespeare)
    ref_dir = ctx.path("ref")
    os.makedirs(ref_dir)
    write_shard(os.path.join(ref_dir, "val.bin"), ref_val)
    write_shard(os.path.join(ref_dir, "train.bin"), ref_train)
    for mine, ref in ((val_p, "val.bin"), (train_p, "train.bin")):
        with open(mine, "rb") as a, open(os.path.join(ref_dir, ref), "rb") as b:
            report(a.read() == b.read(), f"tinyshakespeare_{ref}_identical_to_llmc_procedure",
                   f"{mine} differs from the tiktoken re-implementation")
    with open(os.path.join(out, "gpt2_tokenizer.bin"), "rb") as f:
        report(f.read() == llmc_tokenizer_file(ctx.enc), "gpt2_tokenizer_bin_identical_to_llmc_writer",
               "data/gpt2_tokenizer.bin differs from llm.c's write_tokenizer output")
    before = os.path.getmtime(val_p)
    t0 = time.time()
    r = subprocess.run([os.path.join(ROOT, "data/prepare_tinyshakespeare.sh")], cwd=ROOT, env=env,
                       capture_output=True)
    report(r.returncode == 0 and os.path.getmtime(val_p) == before and b"up to date" in r.stdout,
           "prepare_tinyshakespeare_idempotent", f"second run rc {r.returncode}, rewrote outputs or not up to date "
                                                 f"({time.time() - t0:.2f}s)")
    # the tree's own `make data` output, when it exists, must be the same bytes
    for name, ref in (("tiny_shakespeare_val.bin", "val.bin"), ("tiny_shakespeare_train.bin", "train.bin")):
        mine = os.path.join(ROOT, "data/tinyshakespeare", name)
        if os.path.exists(mine):
            with open(mine, "rb") as a, open(os.path.join(ref_dir, ref), "rb") as b:
                report(a.read() == b.read(), f"make_data_{name}_identical", f"{mine} differs from the reference")


def check_bad_inputs(ctx):
    missing = os.path.join(ctx.tmp, "does_not_exist.txt")
    badmagic = ctx.path("badmagic.bin")
    with open(badmagic, "wb") as f:
        f.write(struct.pack("<256I", *([7] * 256)))
    trunc = ctx.path("trunc_tok.bin")
    exported = ctx.path("tok.bin")
    run(["export", exported])
    with open(exported, "rb") as f:
        data = f.read()
    with open(trunc, "wb") as f:
        f.write(data[: len(data) // 2])
    shard = ctx.path("ok.bin")
    txt = ctx.path("ok.txt")
    with open(txt, "w") as f:
        f.write("hello")
    run(["encode", "-q", txt, shard])
    badjson = ctx.path("bad.jsonl")
    with open(badjson, "w") as f:
        f.write('{"text": "fine"}\n{"text": "unterminated}\n')
    nofield = ctx.path("nofield.jsonl")
    with open(nofield, "w") as f:
        f.write('{"body": "x"}\n')
    cases = [
        ("encode_missing_input", ["encode", missing, ctx.path("o.bin")], missing),
        ("decode_missing_shard", ["decode", missing], missing),
        ("decode_wrong_magic", ["decode", badmagic], badmagic),
        ("decode_with_wrong_magic_tokenizer", ["decode", "--tokenizer", badmagic, shard], badmagic),
        ("decode_with_truncated_tokenizer", ["decode", "--tokenizer", trunc, shard], trunc),
        ("encode_with_llmc_tokenizer_refused", ["encode", "--tokenizer", exported, txt, ctx.path("o.bin")], "merges"),
        ("unknown_flag", ["encode", "--bogus", txt, ctx.path("o.bin")], "--bogus"),
        ("bad_int_flag", ["shards", "-o", ctx.path("p"), "-j", "two", txt], "--threads"),
        ("int_flag_out_of_range", ["shards", "-o", ctx.path("p"), "--shard-tokens", "0", txt], "--shard-tokens"),
        ("missing_positional", ["encode", txt], "IN OUT.bin"),
        ("extra_positional", ["decode", shard, shard], shard),
        ("shards_needs_prefix", ["shards", txt], "--out-prefix"),
        ("bad_doc_split", ["shards", "-o", ctx.path("p"), "--doc-split", "pages", txt], "--doc-split"),
        ("unknown_command", ["frobnicate"], "frobnicate"),
        ("jsonl_malformed_line", ["shards", "-q", "-o", ctx.path("p"), badjson], "line 2"),
        ("jsonl_missing_field", ["shards", "-q", "-o", ctx.path("p"), nofield], "line 1"),
        ("tokenizer_dir_missing", ["encode", "--tokenizer", missing, txt, ctx.path("o.bin")], missing),
        ("token_bytes_invalid", ["encode", "--token-bytes", "3", txt, ctx.path("o.bin")], "--token-bytes"),
    ]
    for name, args, needle in cases:
        r = run(args)
        err = r.stderr.decode(errors="replace")
        report(r.returncode != 0 and "error:" in err and needle in err, f"bad_input_{name}",
               f"rc {r.returncode}, stderr {err.strip()[:200]!r} (wanted a message with {needle!r})")
    for cmd in ("encode", "decode", "shards", "export", "find-gpt2"):
        r = run([cmd, "--help"])
        report(r.returncode == 0 and b"usage:" in r.stdout, f"help_{cmd}", r.stderr.decode(errors="replace"))


def check_shards(ctx, shakespeare):
    src = ctx.path("ts.txt")
    with open(src, "w", encoding="utf-8", newline="") as f:
        f.write(shakespeare)
    docs = shakespeare.split("\n\n")
    want = []
    for i, d in enumerate(docs):
        want.append(50256)
        want += ctx.enc.encode_ordinary(d + ("\n\n" if i < len(docs) - 1 else ""))
    for threads in ("1", "2", "5"):
        prefix = ctx.path(f"sh{threads}")
        r = run(["shards", "-q", "-j", threads, "--doc-split", "blank-lines", "--shard-tokens", "100000",
                 "-o", prefix, src])
        if not report(r.returncode == 0, f"shards_j{threads}_runs", r.stderr.decode(errors="replace")):
            continue
        n = (len(want) + 99999) // 100000
        names = [f"{prefix}_{'val' if i == 0 else 'train'}_{i:06d}.bin" for i in range(n)]
        ok = all(os.path.exists(p) for p in names) and not os.path.exists(
            f"{prefix}_train_{n:06d}.bin")
        got = [t for p in names for t in read_shard(p)] if ok else []
        report(ok and got == want and all(len(read_shard(p)) == 100000 for p in names[:-1]),
               f"shards_j{threads}_split_and_content", f"files {names} exist={ok}; tokens equal={got == want}")
    prefix = ctx.path("u32")
    r = run(["shards", "-q", "--token-bytes", "4", "--val-tokens", "1000", "--doc-split", "blank-lines", "-o", prefix, src])
    ok = r.returncode == 0
    if ok:
        val, train = read_shard(prefix + "_val_000000.bin"), read_shard(prefix + "_train_000001.bin")
        with open(prefix + "_val_000000.bin", "rb") as f:
            magic = struct.unpack("<i", f.read(4))[0]
        ok = magic == 20240801 and len(val) == 1000 and val + train == want
    report(ok, "shards_uint32_and_val_tokens", r.stderr.decode(errors="replace"))
    # multi-file text input: each file is one document
    a, b = ctx.path("a.txt"), ctx.path("b.txt")
    with open(a, "w") as f:
        f.write("First file.\n\n")
    with open(b, "w") as f:
        f.write("Second  file")
    prefix = ctx.path("multi")
    r = run(["shards", "-q", "-o", prefix, a, b])
    want2 = [50256] + ctx.enc.encode_ordinary("First file.\n\n") + [50256] + ctx.enc.encode_ordinary("Second  file")
    report(r.returncode == 0 and read_shards(prefix) == want2, "shards_text_files_one_doc_each",
           r.stderr.decode(errors="replace"))


def check_shard_traps(ctx):
    """./tokenizer shards: the output directory is created; a corpus too small for the validation
    part is an error or split by the documented rule; old shards under the prefix are refused or
    (--overwrite) replaced; bad JSONL lines stop the job or (--skip-bad-lines) are skipped and
    counted."""
    docs = [f"Document number {i} says hello to the world." for i in range(40)]
    src = ctx.path("traps.jsonl")
    with open(src, "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    want = []
    for d in docs:
        want += [50256] + ctx.enc.encode_ordinary(d)
    # README's example shape: the prefix's directories do not exist yet
    prefix = os.path.join(ctx.path("newdir"), "sub", "my")
    r = run(["shards", "-q", "-o", prefix, src, "--val-tokens", "100"])
    ok = r.returncode == 0 and len(read_shard(prefix + "_val_000000.bin")) == 100 and read_shards(prefix) == want
    report(ok, "shards_create_output_directory", r.stderr.decode(errors="replace"))
    # the same prefix again: refused, old shards untouched; --overwrite replaces them, none left over
    before = sorted(os.listdir(os.path.dirname(prefix)))
    r = run(["shards", "-q", "-o", prefix, src, "--val-tokens", "50", "--shard-tokens", "100"])
    err = r.stderr.decode(errors="replace")
    report(r.returncode == 1 and "error:" in err and "--overwrite" in err and "_val_000000.bin" in err
           and sorted(os.listdir(os.path.dirname(prefix))) == before and read_shards(prefix) == want,
           "shards_existing_prefix_refused", f"rc {r.returncode}: {err[:300]}")
    r = run(["shards", "-q", "-o", prefix, src, "--val-tokens", "50", "--shard-tokens", "100", "--overwrite"])
    n = 1 + (len(want) - 50 + 99) // 100
    names = [f"my_{'val' if i == 0 else 'train'}_{i:06d}.bin" for i in range(n)]
    report(r.returncode == 0 and sorted(os.listdir(os.path.dirname(prefix))) == sorted(names)
           and read_shards(prefix) == want and len(read_shard(prefix + "_val_000000.bin")) == 50,
           "shards_overwrite_replaces_old_shards", f"rc {r.returncode}; files {sorted(os.listdir(os.path.dirname(prefix)))}")
    # a longer run followed by a shorter one must not leave the longer run's last shards
    r = run(["shards", "-q", "-o", prefix, src, "--val-tokens", "50", "--overwrite"])
    report(r.returncode == 0 and sorted(os.listdir(os.path.dirname(prefix))) == ["my_train_000001.bin", "my_val_000000.bin"],
           "shards_overwrite_removes_extra_old_shards", f"files {sorted(os.listdir(os.path.dirname(prefix)))}")
    # explicit --val-tokens at or above the corpus: an error naming --val-tokens and the size; nothing written
    small = ctx.path("small")
    for val in (len(want), len(want) + 1000):
        r = run(["shards", "-q", "-o", small, src, "--val-tokens", str(val)])
        err = r.stderr.decode(errors="replace")
        report(r.returncode == 1 and "--val-tokens" in err and f"{len(want)} tokens" in err
               and not read_shards(small), f"shards_val_tokens_{'equal' if val == len(want) else 'above'}_corpus_is_an_error",
               f"rc {r.returncode}: {err[:300]}")
    # default (the first shard is validation) on a corpus smaller than a shard: the first tenth is validation
    r = run(["shards", "-q", "-o", small, src])
    val = read_shard(small + "_val_000000.bin") if r.returncode == 0 else []
    report(r.returncode == 0 and len(val) == len(want) // 10 and read_shards(small) == want and b"tenth" in r.stderr,
           "shards_small_corpus_default_split_one_tenth", f"rc {r.returncode}; val {len(val)} of {len(want)}: {r.stderr[:300]!r}")
    # a malformed line: stops with its line number and the hint; --skip-bad-lines skips and counts
    bad = ctx.path("bad.jsonl")
    with open(bad, "w") as f:
        f.write(json.dumps({"text": docs[0]}) + "\n" + '{"text": oops}\n' + json.dumps({"text": docs[1]}) + "\n"
                + '{"other": "x"}\n' + "[1, 2]\n" + json.dumps({"text": docs[2]}) + "\n")
    r = run(["shards", "-q", "-o", ctx.path("b1"), bad])
    err = r.stderr.decode(errors="replace")
    report(r.returncode == 1 and "line 2" in err and "--skip-bad-lines" in err, "shards_bad_line_error_names_line_and_flag", err[:300])
    skipped = ctx.path("b2")
    r = run(["shards", "-q", "-o", skipped, bad, "--skip-bad-lines"])
    err = r.stderr.decode(errors="replace")
    good = []
    for d in docs[:3]:
        good += [50256] + ctx.enc.encode_ordinary(d)
    report(r.returncode == 0 and "skipped 3 bad JSONL line(s)" in err and "line 2" in err and read_shards(skipped) == good,
           "shards_skip_bad_lines_counts_and_reports_first", f"rc {r.returncode}: {err[:300]}")


def check_shards_all_or_nothing(ctx):
    """issue 22 items 3 and 21: a shards run that stops (a bad line in its second input, a full disk)
    leaves no shard behind, and old shards (--overwrite) stay as they were; a JSONL file that starts
    with a UTF-8 byte order mark reads as without it."""
    import resource
    import signal
    docs = [f"Document number {i} says hello to the world." for i in range(40)]
    good, bad = ctx.path("whole_good.jsonl"), ctx.path("whole_bad.jsonl")
    with open(good, "w") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    with open(bad, "w") as f:
        f.write(json.dumps({"text": docs[0]}) + "\n" + json.dumps({"text": docs[1]}) + "\n" + '{"text": oops}\n')
    small = ["--val-tokens", "50", "--shard-tokens", "100"]  # the first input alone fills several shards
    out = ctx.path("whole_out")
    os.makedirs(out)
    r = run(["shards", "-q", "-o", os.path.join(out, "ds"), *small, good, bad])
    err = r.stderr.decode(errors="replace")
    report(r.returncode == 1 and "whole_bad.jsonl' line 3" in err and os.listdir(out) == [],
           "shards_bad_line_in_second_input_leaves_no_shards", f"rc {r.returncode}; files {sorted(os.listdir(out))}: {err[:300]}")
    # the same over an earlier dataset with --overwrite: it stays whole and unchanged
    r = run(["shards", "-q", "-o", os.path.join(out, "ds"), *small, good])
    before = {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)}
    r2 = run(["shards", "-q", "-o", os.path.join(out, "ds"), "--val-tokens", "60", "--shard-tokens", "90", "--overwrite",
              good, bad])
    after = {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)}
    report(r.returncode == 0 and len(before) > 2 and r2.returncode == 1 and after == before,
           "shards_failed_overwrite_keeps_the_old_dataset", f"rc {r.returncode}, {r2.returncode}; {sorted(before)} -> {sorted(after)}")
    # a full disk (files capped at 1200 bytes): the validation shard (50 tokens, 1124 bytes) fits, the
    # train shard (the other ~390 tokens) does not; an error, and nothing is left

    def cap():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1200, 1200))
    full = ctx.path("whole_full")
    os.makedirs(full)
    r = subprocess.run([TOOL, "shards", "-q", "-o", os.path.join(full, "ds"), "--val-tokens", "50", "--shard-tokens",
                        "1000", good], capture_output=True, cwd=ROOT, preexec_fn=cap)
    err = r.stderr.decode(errors="replace")
    report(r.returncode == 1 and "error:" in err and os.listdir(full) == [],
           "shards_full_disk_leaves_no_shards", f"rc {r.returncode}; files {sorted(os.listdir(full))}: {err[:300]}")
    # the same cap with SIGXFSZ at its default (a shell's ulimit -f): the tool ignores the signal, so
    # the write fails, is reported and cleaned up, instead of the process dying mid-file
    full2 = ctx.path("whole_full_sig")
    os.makedirs(full2)
    r = subprocess.run([TOOL, "shards", "-q", "-o", os.path.join(full2, "ds"), "--val-tokens", "50", "--shard-tokens",
                        "1000", good], capture_output=True, cwd=ROOT,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1200, 1200)))
    report(r.returncode == 1 and b"error:" in r.stderr and os.listdir(full2) == [],
           "shards_file_size_limit_with_default_sigxfsz_is_a_clean_error", f"rc {r.returncode}; files {os.listdir(full2)}")
    # interrupted (SIGINT) once its first shard is staged: it removes what it staged, then dies of the signal
    many = ctx.path("whole_many.jsonl")
    with open(many, "w") as f:
        f.writelines(json.dumps({"text": f"{d} and more words, line {k}"}) + "\n" for k in range(20000) for d in docs[:2])
    intr = ctx.path("whole_intr")
    os.makedirs(intr)
    p = subprocess.Popen([TOOL, "shards", "-q", "-j", "1", "-o", os.path.join(intr, "ds"), "--shard-tokens", "1000"]
                         + [many] * 20, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, staged = time.time() + 60, False
    while time.time() < deadline and p.poll() is None and not staged:
        staged = any(".tmp." in f for f in os.listdir(intr))
        time.sleep(0.005)
    if staged:
        p.send_signal(signal.SIGINT)
    rc = p.wait()
    report(staged and rc == -signal.SIGINT and os.listdir(intr) == [], "shards_interrupted_removes_its_staged_shards",
           f"staged seen {staged}, rc {rc}, files left {len(os.listdir(intr))}")
    # a byte order mark before line 1
    bom = ctx.path("whole_bom.jsonl")
    with open(bom, "wb") as f:
        f.write(b"\xef\xbb\xbf" + open(good, "rb").read())
    pa, pb = ctx.path("bom_a"), ctx.path("bom_b")
    r1 = run(["shards", "-q", "-o", pa, "--val-tokens", "50", bom])
    r2 = run(["shards", "-q", "-o", pb, "--val-tokens", "50", good])
    report(r1.returncode == 0 and r2.returncode == 0 and read_shards(pa) == read_shards(pb) != [],
           "shards_jsonl_with_utf8_bom_reads_as_without", r1.stderr.decode(errors="replace")[:300])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=20240520)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        report(False, "tiktoken_available", "python module tiktoken is missing: pip install tiktoken")
        return 1
    if not os.access(TOOL, os.X_OK):
        report(False, "tokenizer_built", f"{TOOL} is missing: run 'make tokenizer'")
        return 1
    r = run(["find-gpt2"])
    if not report(r.returncode == 0, "find_gpt2_files", r.stderr.decode(errors="replace")):
        return 1
    gpt2_dir = os.path.join(ROOT, r.stdout.decode().strip())
    enc = make_encoding(gpt2_dir)
    ts_path = os.path.join(ROOT, "../shared/data/tinyshakespeare.txt")
    if not os.path.exists(ts_path):
        ts_path = os.path.join(ROOT, "data/tinyshakespeare/input.txt")
    with open(ts_path, encoding="utf-8", newline="") as f:
        shakespeare = f.read()

    with tempfile.TemporaryDirectory(prefix="llmc_test_tok_") as tmp:
        ctx = Ctx(enc, tmp)
        for name, text in TRICKY.items():
            check_same(ctx, f"tiktoken_equal_{name}", text)
        check_same(ctx, "tiktoken_equal_tinyshakespeare", shakespeare)
        for threads in ("1", "2"):
            ref = enc.encode_ordinary(shakespeare * 3)
            got, _ = ctx.encode_bytes((shakespeare * 3).encode(), ["-j", threads])
            report(got == ref, f"tiktoken_equal_tinyshakespeare_x3_j{threads}",
                   f"first difference at token {first_diff(got, ref)}")

        print(f"fuzz seed {args.seed} (rerun: python3 test/test_tokenizer.py --seed {args.seed})")
        rng = random.Random(args.seed)
        docs = fuzz_docs(rng, 3000)
        check_docs(ctx, "tiktoken_equal_fuzz_docs", docs)
        check_docs(ctx, "tiktoken_equal_fuzz_docs_j1", docs, ["-j", "1"])
        big = "".join(docs)
        check_same(ctx, "tiktoken_equal_fuzz_concatenated", big * 20)
        if not args.quick:
            check_docs(ctx, "tiktoken_equal_every_code_point", unicode_sweep_docs())

        # invalid UTF-8: lossless round trip through encode -> shard -> decode
        ok, why = True, ""
        for trial in range(30):
            n = rng.randrange(0, 3000)
            blob = bytes(rng.choice([rng.randrange(256), rng.randrange(0x80, 0x100), 0x20, 0x0A, 0x27, 0x61]) for _ in range(n))
            blob += "\u00e9\U0001F600".encode()[: rng.randrange(7)]  # possibly cut mid-character
            _, shard = ctx.encode_bytes(blob)
            r = run(["decode", shard])
            if r.returncode != 0 or r.stdout != blob:
                ok, why = False, f"trial {trial}: {len(blob)} bytes in, {len(r.stdout)} out; {r.stderr[:200]!r}"
                break
        report(ok, "invalid_utf8_round_trip", why)
        exported = ctx.path("tok.bin")
        run(["export", exported])
        _, shard = ctx.encode_bytes(shakespeare.encode())
        for tok_args, name in (([], "gpt2_dir"), (["--tokenizer", exported], "llmc_tokenizer_file")):
            r = run(["decode", *tok_args, shard])
            report(r.returncode == 0 and r.stdout == shakespeare.encode(), f"shard_round_trip_decode_{name}",
                   r.stderr.decode(errors="replace"))

        check_shards(ctx, shakespeare)
        check_shard_traps(ctx)
        check_shards_all_or_nothing(ctx)
        check_data(ctx, gpt2_dir, shakespeare)
        check_bad_inputs(ctx)
    print(f"({failures()} failed)")
    return 1 if failures() else 0


if __name__ == "__main__":
    sys.exit(main())
