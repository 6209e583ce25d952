#!/usr/bin/env python3
"""Throughput of ./tokenizer vs tiktoken "gpt2" (built from the same local GPT-2 files).

Corpora: tiny Shakespeare, and a generated mixed text (tiny Shakespeare repeated, plus
multilingual prose, emoji and source code from a fixed seed; --mixed-mb MB, default 32).
./tokenizer: wall time of `./tokenizer encode -q -j N IN OUT` minus the time of the same command
on an empty file (load + start-up), best of --repeat runs. tiktoken: encode_ordinary on the whole
text (1 thread) and encode_ordinary_batch on its blank-line documents (N threads), best of
--repeat. Usage: python3 dev/bench_tokenizer.py [--mixed-mb 32] [--repeat 3] [--threads N]
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tokenizer")


def make_mixed(shakespeare, mb, seed=1234):
    rng = random.Random(seed)
    words = {
        "zh": "\u6211\u4eec \u4e2d\u6587 \u5b57\u7b26 \u6d4b\u8bd5 \u6570\u636e \u6a21\u578b \u8bad\u7ec3 \u4eca\u5929".split(),
        "ja": "\u65e5\u672c\u8a9e \u306e \u30c6\u30ad\u30b9\u30c8 \u3067\u3059 \u6771\u4eac \u30c7\u30fc\u30bf".split(),
        "ru": "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440 \u0434\u0430\u043d\u043d\u044b\u0435 \u043c\u043e\u0434\u0435\u043b\u044c \u0441\u0435\u0433\u043e\u0434\u043d\u044f".split(),
        "ar": "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u0627\u0644\u0628\u064a\u0627\u0646\u0627\u062a \u0627\u0644\u0646\u0645\u0648\u0630\u062c".split(),
        "hi": "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e \u0921\u0947\u091f\u093e \u092e\u0949\u0921\u0932".split(),
        "emoji": ["\U0001F44D", "\U0001F44B\U0001F3FD", "\U0001F468\u200D\U0001F469\u200D\U0001F467", "\u2764\ufe0f",
                  "\U0001F1FA\U0001F1F8", "\U0001F600"],
    }
    code = ("def train(model, data, steps=1000):\n    for step in range(steps):\n        loss = model(data[step])"
            "\n        loss.backward()  # grads\n\nint main(int argc, char **argv) {\n\tfor (int i = 0; i < 42; i++) "
            "{ printf(\"%d\\n\", i); }\n\treturn 0;\n}\n\n")
    parts, size, target = [], 0, mb * 1_000_000
    while size < target:
        r = rng.random()
        if r < 0.4:
            start = rng.randrange(len(shakespeare) - 20000)
            s = shakespeare[start:start + 20000]
        elif r < 0.8:
            lang = rng.choice(list(words))
            s = " ".join(rng.choice(words[lang]) + rng.choice(["", ",", ".", " 42", "!"]) for _ in range(2000)) + "\n\n"
        else:
            s = code * 20
        parts.append(s)
        size += len(s.encode())
    return "".join(parts)


def best_time(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mixed-mb", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    try:
        import tiktoken
        import tiktoken.load
    except ImportError:
        print("error: the benchmark compares with tiktoken: pip install tiktoken", file=sys.stderr)
        return 1
    gpt2 = subprocess.run([TOOL, "find-gpt2"], capture_output=True, text=True, cwd=ROOT)
    if gpt2.returncode != 0:
        print("error: no GPT-2 files (run make data)", file=sys.stderr)
        return 1
    gdir = os.path.join(ROOT, gpt2.stdout.strip())
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(os.path.join(gdir, "vocab.bpe"),
                                                          os.path.join(gdir, "encoder.json"))
    pat = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
    enc = tiktoken.Encoding("gpt2-local", pat_str=pat, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
    ts_path = os.path.join(ROOT, "../shared/data/tinyshakespeare.txt")
    if not os.path.exists(ts_path):
        ts_path = os.path.join(ROOT, "data/tinyshakespeare/input.txt")
    with open(ts_path, encoding="utf-8", newline="") as f:
        shakespeare = f.read()
    threads = sorted({1, args.threads})
    print(f"machine: {os.cpu_count()} CPUs; best of {args.repeat}; tiktoken {tiktoken.__version__}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="llmc_bench_tok_") as tmp:
        empty = os.path.join(tmp, "empty.txt")
        open(empty, "w").close()
        for name, text in (("tinyshakespeare", shakespeare), (f"mixed{args.mixed_mb}MB", make_mixed(shakespeare, args.mixed_mb))):
            path = os.path.join(tmp, name + ".txt")
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            mb = os.path.getsize(path) / 1e6
            out = os.path.join(tmp, "out.bin")
            docs = text.split("\n\n")
            enc.encode_ordinary(text[:100000])  # warm up
            t_tik1 = best_time(lambda: enc.encode_ordinary(text), args.repeat)
            base = mb / t_tik1
            rows.append((name, mb, "tiktoken encode_ordinary", 1, base))
            for n in threads:
                if n > 1:
                    t = best_time(lambda: enc.encode_ordinary_batch(docs, num_threads=n), args.repeat)
                    rows.append((name, mb, "tiktoken encode_ordinary_batch", n, mb / t))
            for n in threads:
                cmd = [TOOL, "encode", "-q", "-j", str(n)]
                t_empty = best_time(lambda: subprocess.run(cmd + [empty, out], check=True), args.repeat)
                t = best_time(lambda: subprocess.run(cmd + [path, out], check=True), args.repeat)
                rows.append((name, mb, "./tokenizer encode", n, mb / max(t - t_empty, 1e-9)))
            rows.append(None)
            base_by = {r[0]: r[4] for r in rows if r and r[2] == "tiktoken encode_ordinary"}
    print(f"{'corpus':<18}{'MB':>8}  {'tool':<32}{'threads':>8}{'MB/s':>10}{'vs tiktoken 1T':>16}")
    for r in rows:
        if r is None:
            print()
            continue
        print(f"{r[0]:<18}{r[1]:>8.1f}  {r[2]:<32}{r[3]:>8}{r[4]:>10.1f}{r[4] / base_by[r[0]]:>15.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
