#!/usr/bin/env python3
"""./tokenizer with a tiktoken-format rank file (issue 11, item 4), against tiktoken itself.

Nothing can be downloaded, so the test makes its own vocabularies: a byte-level BPE is trained
(tiktoken's _educational.bpe_train) on a generated corpus with Llama 3's and with cl100k's
pre-tokenizer pattern, written as a rank file (base64 token, space, rank per line), and
tiktoken.Encoding(pat_str=..., mergeable_ranks=..., special_tokens=...) is the reference:
  - `./tokenizer encode` with --pattern llama3 / cl100k gives encode_ordinary's ids exactly, on
    the corpus and on awkward text (other scripts, combining marks, emoji, Unicode spaces and
    digits, contractions in any case, CR/LF runs, trailing spaces, invalid UTF-8 excluded as
    tiktoken cannot take it); a custom --pattern-regex as well;
  - with --specials (the llama3 preset and a NAME=ID list) and --allow-special 1: encode(text,
    allowed_special="all"); without it the special names are ordinary text;
  - uint32 shards (magic 20240801): --token-bytes 4, and `shards` over a vocabulary above 65536
    ids; the shards decode back to the text; train_gpt_cpu refuses a uint32 shard whose ids
    exceed the model's vocabulary with a clear error; `export` writes llm.c's tokenizer file;
  - bad rank files and flags (bad base64, a repeated rank, a missing rank, repeated token bytes,
    a missing byte, a malformed line, special ids among the ranks, no/unknown pattern, a bad
    regex, bad --specials, an unknown --delimiter) exit 1 with an error naming the problem.
Prints PASS:/FAIL: lines; exits non-zero on any failure. Run from the repository root.
"""
import base64
import os
import random
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import failures, first_diff, report, write_shard  # noqa: E402

import tiktoken  # noqa: E402
from tiktoken._educational import bpe_train  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.environ.get("LLMC_TEST_TOKENIZER", os.path.join(ROOT, "tokenizer"))
TRAINER = os.path.join(ROOT, "train_gpt_cpu")

# Meta's Llama 3 pattern (tokenizer.py) and tiktoken's cl100k_base pattern (0.14)
LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CL100K_PAT = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
              r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
LLAMA3_SPECIALS = (["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
                   + [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - 11)])

WORDS = ("the king queen shall will not be more than one two thousand I'll you're we've she'd it's "
         "THEY'RE HE'S Don'T what where whence, running runner ran! questions? answers; (parenthesis) "
         "[bracket] {brace} e-mail x_y 3.14159 2024-11-30 100,000 0xFF naïve café Grüße Straße "
         "日本語の文章 中文字符 한국어 Ελληνικά русский язык עברית العربية ١٢٣٤ ४२ emoji 🙂👍🏽 "
         "combining é ñ ẞ ǅ ﬁ").split()


def corpus(seed, n_words):
    rng = random.Random(seed)
    out = []
    for i in range(n_words):
        out.append(rng.choice(WORDS))
        r = rng.random()
        out.append("\n" if r < 0.08 else "\n\n" if r < 0.1 else "  " if r < 0.12 else "\r\n" if r < 0.13 else " ")
    return "".join(out)


AWKWARD = [
    "Hello world", "", " ", "   leading and trailing   ", "x\n", "\n\n\n", "a\r\n\r\nb", " \n \n", "tab\tand\u000bvt",
    "I'LL do it; she'S here, we'Ve 'll 're", "ſ's 'ſ 'ſt", "12345678901 1.5e10 ١٢٣٤٥ ५६७", "e\u0301e\u0301 a\u0308",
    "\u00a0nbsp\u2003em\u3000ideo\u2028line\u2029para\u0085nel\u180emongol", "👨‍👩‍👧 family 🇩🇪 flag",
    "ǅungla Ǳ ﬀ", "!!!???...\n\n---", "end with spaces   ", "end with newline spaces \n  ", "$$$ %%% &&&",
    "Ω≈ç√∫ µ≤≥÷", "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇", "x" * 300, " " * 70 + "y", "a'b'c' 'd",
    # where Llama 3's and cl100k's patterns split differently (found by comparing them with regex)
    ".\n\t\r\t", "é\n's\n\r\n ", "\n\r \t", "\r ", "'S\raa'S\r\t", "\t\raa\r ", "'sé.'S\n\n\t",
]


def train(text, vocab_size, pat):
    """BPE ranks for text, plus whitespace tokens that only some patterns' pieces can reach (so
    that a pattern implemented wrongly changes the ids, not only the pieces)."""
    ranks = bpe_train(text, vocab_size, pat, visualise=None)
    for extra in (b"\r ", b"\r\t", b"\t\r", b"\t\r\t", b"\n ", b"\n\r", b"\n\r\n", b"\n\r\n "):
        if extra not in ranks:
            ranks[extra] = len(ranks)
    return ranks


def write_ranks(path, ranks, edit=None):
    lines = [f"{base64.b64encode(tok).decode()} {rank}" for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1])]
    if edit:
        lines = edit(lines)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, ntok = struct.unpack("<3i", data[:12])
    width = {(20240520, 1): 2, (20240801, 7): 4}[(magic, version)]
    if len(data) != 1024 + width * ntok:
        raise ValueError(f"{path}: size does not match its header")
    return list(memoryview(data[1024:]).cast("H" if width == 2 else "I")), magic


def tool(args):
    return subprocess.run([TOOL] + args, capture_output=True, cwd=ROOT)


def encode_with_tool(tmp, text, args):
    src, out = os.path.join(tmp, "in.txt"), os.path.join(tmp, "out.bin")
    with open(src, "wb") as f:
        f.write(text.encode())
    if os.path.exists(out):
        os.unlink(out)
    r = tool(["encode", "-q", "-j", "1"] + args + [src, out])
    if r.returncode != 0:
        return None, r.stderr.decode(errors="replace")
    return read_shard(out)[0], ""


def check_texts(tmp, name, enc, args, texts, special=False):
    bad = []
    for i, text in enumerate(texts):
        want = enc.encode(text, allowed_special="all") if special else enc.encode_ordinary(text)
        got, err = encode_with_tool(tmp, text, args)
        if got != want:
            k = first_diff(got or [], want)
            bad.append(f"text {i} {text[:40]!r}: " + (err.strip() if got is None else
                       f"first difference at token {k}: got {got[k:k + 5]}, want {want[k:k + 5]}"))
    report(not bad, name, "; ".join(bad[:3]) + (f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""))


def expect_error(name, args, needle):
    r = tool(args)
    err = r.stderr.decode(errors="replace").strip()
    report(r.returncode == 1 and err.startswith("error:") and needle in err, name,
           f"rc {r.returncode} (want 1); stderr {err[-300:]!r} (want it to name {needle!r})")


def main():
    if not os.access(TOOL, os.X_OK):
        report(False, "tokenizer_built", f"{TOOL} is missing: run 'make tokenizer'")
        return 1
    train_text = corpus(1, 2500)
    texts = [corpus(2, 1500)] + AWKWARD
    with tempfile.TemporaryDirectory(prefix="llmc_test_tiktoken_") as tmp:
        built = {}
        for pname, pat in (("llama3", LLAMA3_PAT), ("cl100k", CL100K_PAT)):
            ranks = train(train_text, 420, pat)
            path = os.path.join(tmp, f"{pname}.tiktoken")
            write_ranks(path, ranks)
            built[pname] = (path, ranks)
            enc = tiktoken.Encoding(f"test_{pname}", pat_str=pat, mergeable_ranks=ranks, special_tokens={})
            check_texts(tmp, f"{pname}_pattern_equals_tiktoken_encode_ordinary", enc,
                        ["--tokenizer", path, "--pattern", pname, "--specials", "none"], texts)

        # special tokens: Llama 3's set after the ranks, and a hand-written list
        path, ranks = built["llama3"]
        n = len(ranks)
        specials = {name: n + i for i, name in enumerate(LLAMA3_SPECIALS)}
        enc = tiktoken.Encoding("test_llama3_sp", pat_str=LLAMA3_PAT, mergeable_ranks=ranks, special_tokens=specials)
        special_texts = ["<|begin_of_text|>Hello<|eot_id|>\n<|start_header_id|>user<|end_header_id|>\n\nhi there",
                         "no specials here", "<|end_of_text|>", "a<|reserved_special_token_250|>b<|bogus|>c",
                         "<|begin_of_text|><|begin_of_text|>  <|eot_id|>  "]
        args = ["--tokenizer", path, "--pattern", "llama3", "--specials", "llama3"]
        check_texts(tmp, "llama3_specials_allowed_equal_tiktoken_encode_all", enc, args + ["--allow-special"],
                    special_texts, special=True)
        check_texts(tmp, "llama3_specials_not_allowed_are_ordinary_text", enc, args, special_texts)
        path, ranks = built["cl100k"]
        n = len(ranks)
        sp = {"<|endoftext|>": n + 1, "<|fim_prefix|>": n + 2, "<|im_start|>": n + 7}
        enc = tiktoken.Encoding("test_cl_sp", pat_str=CL100K_PAT, mergeable_ranks=ranks, special_tokens=sp)
        check_texts(tmp, "cl100k_specials_as_name_id_list_equal_tiktoken", enc,
                    ["--tokenizer", path, "--pattern", "cl100k", "--allow-special",
                     "--specials", ",".join(f"{k}={v}" for k, v in sp.items())],
                    ["<|im_start|>system\nhi<|endoftext|><|fim_prefix|>x", "plain"], special=True)

        # a custom pattern (ASCII text: PCRE2's and tiktoken's classes agree there)
        custom = r"[A-Za-z]+|[0-9]{1,2}|\s+|[^A-Za-z0-9\s]+"
        ascii_train = "".join(c for c in train_text if ord(c) < 128)
        cranks = train(ascii_train, 330, custom)
        cpath = os.path.join(tmp, "custom.tiktoken")
        write_ranks(cpath, cranks)
        enc = tiktoken.Encoding("test_custom", pat_str=custom, mergeable_ranks=cranks, special_tokens={})
        check_texts(tmp, "custom_pattern_regex_equals_tiktoken", enc, ["--tokenizer", cpath, "--pattern-regex", custom],
                    [ascii_train[:3000], "Hello, World 12345 !!", "  x  "])

        # uint32 shards: --token-bytes 4; `shards` over a vocabulary above 65536 ids (specials
        # numbered up there), decoded back to the text
        path, ranks = built["llama3"]
        n = len(ranks)
        got, err = encode_with_tool(tmp, texts[0], ["--tokenizer", path, "--pattern", "llama3", "--token-bytes", "4"])
        _, magic = read_shard(os.path.join(tmp, "out.bin")) if got is not None else (None, None)
        enc = tiktoken.Encoding("t", pat_str=LLAMA3_PAT, mergeable_ranks=ranks, special_tokens={})
        report(got == enc.encode_ordinary(texts[0]) and magic == 20240801, "token_bytes_4_writes_uint32_shard",
               f"magic {magic}; {err}")
        docs = os.path.join(tmp, "docs.txt")
        with open(docs, "w") as f:
            f.write(corpus(3, 3000))
        big = f"<|doc|>=70000,<|pad|>={n}"
        prefix = os.path.join(tmp, "sh", "big")
        r = tool(["shards", "-q", "-j", "2", "--tokenizer", path, "--pattern", "llama3", "--specials", big,
                  "--delimiter", "<|doc|>", "--doc-split", "blank-lines", "-o", prefix, "-v", "500", docs])
        toks, ok = [], r.returncode == 0
        shard_paths = sorted(p for p in os.listdir(os.path.join(tmp, "sh")))
        magics = set()
        for p in shard_paths:
            t, m = read_shard(os.path.join(tmp, "sh", p))
            magics.add(m)
        for p in [f"{prefix}_val_000000.bin"] + [os.path.join(tmp, "sh", q) for q in shard_paths if "_train_" in q]:
            toks += read_shard(p)[0]
        report(ok and magics == {20240801} and toks.count(70000) == open(docs).read().count("\n\n") + 1,
               "shards_over_65536_ids_are_uint32_with_a_delimiter_per_document",
               f"rc {r.returncode} {r.stderr.decode(errors='replace')[-300:]}; magics {magics}; "
               f"{toks.count(70000)} delimiters")
        r = tool(["decode", "--tokenizer", path, "--pattern", "llama3", "--specials", big, f"{prefix}_val_000000.bin"])
        val_text = enc.decode([t for t in read_shard(f"{prefix}_val_000000.bin")[0] if t != 70000])
        report(r.returncode == 0 and r.stdout.decode().replace("<|doc|>", "") == val_text,
               "uint32_shard_decodes_back_to_the_text", r.stderr.decode(errors="replace")[-300:])

        # llm.c's tokenizer file from a rank file (for decoding samples) decodes the same shard alike
        # (no unused ids: the format has no empty tokens; an unused id is refused, naming it)
        exported = os.path.join(tmp, "exported.bin")
        r1 = tool(["export", "--tokenizer", path, "--pattern", "llama3", exported])
        r2 = tool(["decode", "--tokenizer", exported, os.path.join(tmp, "out.bin")])  # texts[0], uint32
        r3 = tool(["export", "--tokenizer", path, "--pattern", "llama3", "--specials", big, exported + ".2"])
        report(r1.returncode == 0 and r2.returncode == 0 and r2.stdout == texts[0].encode() and r3.returncode == 1
               and b"is 0 bytes" in r3.stderr,
               "export_writes_llmc_tokenizer_file_that_decodes_the_shard",
               f"rc {r1.returncode}/{r2.returncode}/{r3.returncode}: {(r1.stderr + r2.stderr + r3.stderr).decode(errors='replace')[-300:]}")

        # the trainer refuses a uint32 shard with ids beyond its model's vocabulary
        if os.access(TRAINER, os.X_OK):
            shard = os.path.join(tmp, "wide.bin")
            write_shard(shard, [1, 2, 3] * 400 + [70000] + [4, 5] * 400, magic=20240801, version=7, width="I")
            r = subprocess.run([TRAINER, "-e", "d2", "-i", shard, "-j", shard, "-b", "2", "-t", "16", "-x", "1",
                                "-v", "0", "-s", "0"], capture_output=True, text=True, cwd=ROOT,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
            last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
            report(r.returncode == 1 and last.startswith("error:") and "70000" in last and "vocab" in last,
                   "trainer_refuses_uint32_shard_ids_beyond_the_model_vocab", f"rc {r.returncode}; {last!r}")
        else:
            print("SKIP: train_gpt_cpu not built: the shard-vocabulary check did not run")

        # bad rank files and flags
        path, ranks = built["llama3"]
        base = ["encode", "--tokenizer"]
        src = os.path.join(tmp, "in.txt")
        out = os.path.join(tmp, "bad_out.bin")
        cases = {
            "bad_base64": (lambda ls: ls[:5] + ["@@not*base64 5"] + ls[6:], "line 6", "base64"),
            "repeated_rank": (lambda ls: ls[:7] + [ls[7].split()[0] + " 3"] + ls[8:], "line 8", "rank 3 appears twice"),
            "missing_rank": (lambda ls: ls[:300] + ls[301:], "ranks must be 0..", ""),
            "repeated_bytes": (lambda ls: ls[:9] + [ls[3].split()[0] + " 9"] + ls[10:], "duplicates", ""),
            "missing_byte": (lambda ls: [f"{base64.b64encode(b'ab').decode()} 65"] + [x for x in ls if not x.endswith(" 65")],
                             "no token for byte 0x41", ""),
            "malformed_line": (lambda ls: ls[:2] + ["QQ==  "] + ls[3:], "line 3", "BASE64TOKEN RANK"),
        }
        for name, (edit, needle, needle2) in cases.items():
            bad = os.path.join(tmp, f"{name}.tiktoken")
            write_ranks(bad, ranks, edit)
            r = tool(base + [bad, "--pattern", "llama3", src, out])
            err = r.stderr.decode(errors="replace").strip()
            report(r.returncode == 1 and err.startswith("error:") and bad in err and needle in err and needle2 in err
                   and not os.path.exists(out), f"bad_rank_file_{name}", f"rc {r.returncode}; {err[-300:]!r}")
        n = len(ranks)
        expect_error("special_id_among_ranks", base + [path, "--pattern", "llama3", "--specials", "<|x|>=5", src, out],
                     "come after the ranks")
        expect_error("no_pattern", base + [path, src, out], "--pattern")
        expect_error("unknown_pattern", base + [path, "--pattern", "llama2", src, out], "llama2")
        expect_error("bad_regex", base + [path, "--pattern-regex", "([a-z]", src, out], "pattern")
        expect_error("bad_specials", base + [path, "--pattern", "llama3", "--specials", "<|x|>", src, out], "NAME=ID")
        expect_error("unknown_delimiter", base + [path, "--pattern", "llama3", "--delimiter", "<|nope|>", src, out],
                     "<|nope|>")
        expect_error("shards_without_specials", ["shards", "--tokenizer", path, "--pattern-regex", custom, "-o",
                                                 os.path.join(tmp, "x", "p"), src], "--specials")
    print(f"({failures()} failed)")
    return 1 if failures() else 0


if __name__ == "__main__":
    sys.exit(main())
