#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpus (test/fuzz/corpus/TARGET/) and the tiny GPT-2-style
tokenizer in test/fuzz/mini_gpt2/: small valid inputs for each parser, so that fuzzing starts
from files that get past the magic numbers. The outputs are checked in; rerun this script
(from anywhere) after a format change and commit what changed. See docs/FUZZING.md.
"""
import json
import zlib
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_MAGIC, STATE_MAGIC = 20240326, 20261130
SHARD_U16, SHARD_U32 = (20240520, 1), (20240801, 7)
TOKENIZER_MAGIC = 20240328
DL_STATE_MAGIC = 20250601
MASK = (1 << 64) - 1


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def header(*fields):
    return struct.pack("<256i", *(list(fields) + [0] * (256 - len(fields))))


# ---- model files: the parameter table of llmc/models/gpt2.h for a GPT-2 config -------------------
def gpt2_numel(maxT, Vp, L, C):
    F = 4 * C
    return Vp * C + maxT * C + L * (2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C) + 2 * C


def model_file(version, maxT, V, L, NH, C, Vp):
    n = gpt2_numel(maxT, Vp, L, C)
    if version == 3:
        payload = struct.pack(f"<{n}f", *[((i * 37) % 101 - 50) / 64.0 for i in range(n)])
    else:
        payload = struct.pack(f"<{n}H", *[(0x3C00 + i * 13) & 0xFFFF for i in range(n)])
    return header(MODEL_MAGIC, version, maxT, V, L, NH, C, Vp) + payload


# ---- state files (llmc/formats/modelfile.h) with the data loader's position ------------------------
def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def stream_state(seed, epoch, stream):
    s, h = splitmix64(seed)
    s, h = splitmix64(h ^ (epoch & MASK))
    s, h = splitmix64(h ^ (stream & MASK))
    return h


def state_file(numel, loader, step=3, B=2, T=8, seed=7, version=1):
    h = [0] * 256

    def put64(at, v):
        v &= MASK
        h[at], h[at + 1] = struct.unpack("<2i", struct.pack("<Q", v))

    h[0], h[1], h[2] = STATE_MAGIC, version, step
    put64(3, numel)
    h[5], h[6], h[7], h[8], h[9] = B, T, 1, 0, 1
    put64(10, seed)
    for i, v in enumerate(loader):
        put64(12 + 2 * i, v)
    put64(28, 0x1234567)
    h[30] = 1
    m = struct.pack(f"<{numel}f", *[i / 8.0 for i in range(numel)])
    v = struct.pack(f"<{numel}f", *[i / 16.0 for i in range(numel)])
    if version >= 2:  # [42]: CRC-32 of the file with [42] = 0 (llmc/formats/modelfile.c state_crc)
        h[42] = struct.unpack("<i", struct.pack("<I", zlib.crc32(struct.pack("<256i", *h) + m + v)))[0]
    return struct.pack("<256i", *h) + m + v


# ---- shards ----------------------------------------------------------------------------------
def shard(kind, tokens, knobs=0):
    magic, version = kind
    fmt = "H" if kind == SHARD_U16 else "I"
    return header(magic, version, len(tokens), knobs) + struct.pack(f"<{len(tokens)}{fmt}", *tokens)


# ---- tokenizers: GPT-2's byte alphabet, a few merges, <|endoftext|> --------------------------
def gpt2_alphabet():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}, bs


MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"),
          ("Ġ", "s"), ("r", "e"), ("Ġ", "w"), ("a", "n"), ("Ġ", "o"), ("in", "g"), ("'", "s")]


def mini_tokenizer():
    byte_to_char, order = gpt2_alphabet()
    encoder = {byte_to_char[b]: i for i, b in enumerate(order)}
    for a, b in MERGES:
        encoder[a + b] = len(encoder)
    encoder["<|endoftext|>"] = len(encoder)
    enc_json = json.dumps(encoder, ensure_ascii=False).encode("utf-8")
    vocab_bpe = ("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES)).encode("utf-8")
    char_to_byte = {c: b for b, c in byte_to_char.items()}
    tokens = [bytes(char_to_byte[c] for c in s) if s != "<|endoftext|>" else s.encode()
              for s, _ in sorted(encoder.items(), key=lambda kv: kv[1])]
    return enc_json, vocab_bpe, tokens, encoder["<|endoftext|>"]


def tokenizer_file(tokens, eot, version=2):
    h = [TOKENIZER_MAGIC, version, len(tokens), eot if version == 2 else 0] + [0] * 252
    return struct.pack("<256I", *h) + b"".join(bytes([len(t)]) + t for t in tokens)


# ---- safetensors: u64 header length, JSON header, data ------------------------------------
def safetensors_file(tensors, metadata=None, pad=True):
    """tensors: [(name, dtype, shape, raw bytes)] laid out in order."""
    h, data = {}, b""
    if metadata is not None:
        h["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        h[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(h).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def main():
    # model files: the smallest config, and a slightly larger one in fp32 and bf16
    f32 = struct.pack("<6f", 1.0, -2.5, 0.0, 3.25, -0.0, 1e-30)
    write("safetensors", "f32_bf16_f16", safetensors_file(
        [("transformer.h.0.attn.c_attn.weight", "F32", [2, 3], f32), ("wte.weight", "BF16", [2, 2], struct.pack("<4H", 0x3F80, 0xBF00, 0x0001, 0x7F80)),
         ("ln_f.bias", "F16", [3], struct.pack("<3H", 0x3C00, 0x0001, 0xFC00)), ("scalar", "F32", [], struct.pack("<f", 7.0))],
        metadata={"format": "pt"}))
    write("safetensors", "other_dtypes_unpadded", safetensors_file(
        [("h.0.attn.bias", "BOOL", [1, 1, 2, 2], b"\1\0\1\1"), ("ids", "I64", [2], struct.pack("<2q", 5, -1)),
         ("empty", "F32", [0, 4], b"")], pad=False))
    write("model_file", "fp32_min", model_file(3, maxT=1, V=1, L=1, NH=1, C=1, Vp=1))
    write("model_file", "fp32_small", model_file(3, maxT=4, V=5, L=2, NH=2, C=4, Vp=8))
    write("model_file", "bf16_small", model_file(5, maxT=4, V=5, L=2, NH=2, C=4, Vp=8))

    # state files for fuzz_state_file.c's loader: 1 shard of 1000 tokens, B*T = 16, shuffle, seed 7
    fingerprint = (stream_state(7, -1, -1) >> 1) | 1
    write("state_file", "by_hand", state_file(3, [0, 0, 5, 0, 0, 0, 0, 0]))
    write("state_file", "fingerprinted", state_file(4, [2, 0, 61, DL_STATE_MAGIC, 1, 1000, 16, fingerprint]))
    write("state_file", "v2_checksummed", state_file(4, [1, 0, 7, DL_STATE_MAGIC, 1, 1000, 16, fingerprint], version=2))

    # shards: uint16 and uint32, sequential and shuffled settings (header[3], see fuzz_shard.c)
    toks = [(i * 7919) % 50257 for i in range(40)]
    write("shard", "u16", shard(SHARD_U16, toks, knobs=(1 << 8) | 2 | (3 << 2)))
    write("shard", "u32_shuffled", shard(SHARD_U32, toks, knobs=(1 << 8) | (1 << 7) | (1 << 5) | (1 << 6) | (5 << 25)))
    write("shard", "u16_small_vocab", shard(SHARD_U16, [t % 300 for t in toks], knobs=(299 << 9)))

    # tokenizers
    enc_json, vocab_bpe, tokens, eot = mini_tokenizer()
    d = os.path.join(HERE, "mini_gpt2")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "encoder.json"), "wb") as f:
        f.write(enc_json)
    with open(os.path.join(d, "vocab.bpe"), "wb") as f:
        f.write(vocab_bpe)
    write("tokenizer_json", "mini", enc_json + b"\0" + vocab_bpe)
    write("tokenizer_json", "string_escapes", b'"a\\u00e9\\ud83d\\ude00\\n\\"\\\\"')
    write("tokenizer_file", "mini_v2", tokenizer_file(tokens, eot))
    write("tokenizer_file", "v1_eot_outside_vocab", tokenizer_file(tokens[:257], 0, version=1))

    # text to encode
    write("tokenizer_encode", "english", b"The quick brown fox's 2 dogs weren't there.\n\nThey'll see  it  ")
    write("tokenizer_encode", "unicode", "caf\u00e9 \u4e2d\u6587 \U0001F600 \u00a0x\u2003y \u0663\u0664".encode())
    write("tokenizer_encode", "invalid_utf8", b"ok \xff\xfe \xc3 \xe2\x82 \xed\xa0\x80 \xf4\x90\x80\x80 end")

    # command lines: arguments separated by NUL bytes
    for name, argv in [
        ("typical", ["-i", "data/train.bin", "-j", "data/val.bin", "-e", "d2", "-b", "4", "-t", "64",
                     "-x", "10", "-l", "1e-3", "-o", "out", "-n", "5", "-nk", "2"]),
        ("long_flags", ["--batch-size=8", "--seq-len=128", "--lr-schedule", "wsd", "--total-batch", "2048",
                        "--precision", "fp32", "--seed=42", "--shuffle", "0", "--threads", "2"]),
        ("procs", ["-pn", "4", "-pr", "3", "-pi", "tcp", "-ps", "10.0.0.1", "-d", "0", "-sl", "3.5", "-sg", "4"]),
        ("help", ["--help"]),
    ]:
        write("cli", name, b"\0".join(a.encode() for a in argv))


if __name__ == "__main__":
    main()
