#!/usr/bin/env python3
"""Hugging Face directories under hostile input (issue 22, findings 5, 9, 10, 14, 15, 16 and part
of 21): one check per finding, on tiny directories written by test/hf_tiny.py.
- 5: a tokenizer file --save-hf 1 would copy that is a FIFO, a directory or a symbolic link loop,
  or an 'original' that is a file, is an error at startup (before any step), never a hang;
- 9: config floats outside fp32 (rope_theta 1e39, rope_scaling factor 1e40, rms_norm_eps 1e-50)
  are errors naming the field, and an inf in an llmc Llama checkpoint's header too;
- 10: --save-hf keeps the -e directory's config.json fields it does not set (bos/eos_token_id, ...),
  Llama and GPT-2, and so does ./hf_convert HF -> HF; the saved directory still loads;
- 14: ./hf_convert model.bin out/ (a trailing slash) writes out;
- 15: a config.json whose sizes the weights do not hold is an error naming the tensor, before any
  allocation of the model's size (trainer, ./generate, ./hf_convert);
- 16: a tokenizer.model that is a FIFO, a directory, a symbolic link loop or a link to nothing, and a
  model.safetensors symbolic link loop, are errors saying what the file is;
- 21: a sentencepiece tokenizer.model and an HF tokenizer.json given as --tokenizer are named as such.
BIN (environment): the directory of the binaries (default .), e.g. an old build to see these fail.
"""
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_tiny as hf  # noqa: E402
from testlib import failed_count, report  # noqa: E402
from hardening_util import write_model  # noqa: E402

BIN = os.environ.get("BIN", ".")
TRAINER, GENERATE, CONVERT = (os.path.join(BIN, b) for b in ("train_gpt_cpu", "generate", "hf_convert"))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def run(cmd, timeout=30):
    """(returncode or None on a timeout, stdout + stderr)"""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                           errors="replace")
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        return None, "(timed out: a hang)"


def clean_error(name, rc, out, *patterns, absent=()):
    ok = rc == 1 and "error: " in out and all(p in out for p in patterns) and not any(a in out for a in absent)
    return report(ok, name, f"exit {rc}: {out[-600:]}")


def make(kind, path):
    {"FIFO": lambda: os.mkfifo(path), "directory": lambda: os.mkdir(path),
     "symbolic link loop": lambda: os.symlink(os.path.basename(path), path),
     "symbolic link to nothing": lambda: os.symlink("no-such-file", path)}[kind]()


def main():
    tmp = tempfile.mkdtemp(prefix="llmc_test_hf_hostile_")
    T = lambda *p: os.path.join(tmp, *p)  # noqa: E731

    # 5: --save-hf's tokenizer files checked at startup
    for name, kind in [("tokenizer.json", "FIFO"), ("tokenizer_config.json", "directory"),
                       ("special_tokens_map.json", "symbolic link loop"), ("original", "regular file")]:
        d = hf.write_llama(T(f"tok5_{name}"))
        p = os.path.join(d, name)
        if os.path.exists(p):
            os.remove(p)
        if kind == "regular file":
            open(p, "w").write("not a directory\n")
        else:
            make(kind, p)
        out_dir = T(f"out5_{name}")
        rc, out = run([TRAINER] + hf.train_args(tmp, d, "-x", "2", "-n", "2", "-o", out_dir, "--save-hf", "1"))
        started = "step " in out or glob.glob(os.path.join(out_dir, "model_*"))
        clean_error(f"5: a --save-hf tokenizer file '{name}' that is a {kind}: an error at startup",
                    rc, out if not started else out + " (it trained: a late failure)", f"{d}/{name}", kind)

    # 9: config floats outside fp32
    base = hf.llama_config()
    for field, cfg in [("rope_theta", hf.llama_config(rope_theta=1e39)),
                       ("factor", hf.llama_config(rope_scaling={**base["rope_scaling"], "factor": 1e40})),
                       ("rms_norm_eps", hf.llama_config(rms_norm_eps=1e-50))]:
        d = hf.write_llama(T(f"f9_{field}"), config=cfg)
        rc, out = run([TRAINER] + hf.train_args(tmp, d, "-x", "1"))
        clean_error(f"9: {field} outside fp32 is an error naming it", rc, out, field, "fp32")

    # llmc's Llama checkpoint holds them as fp32 bit patterns: an inf or NaN there is refused too
    d = hf.write_llama(T("f9_file"))
    rc, out = run([CONVERT, d, T("f9.bin")])
    ok = rc == 0
    if ok:
        raw = bytearray(open(T("f9.bin"), "rb").read())
        raw[4 * 17:4 * 18] = struct.pack("<f", float("inf"))  # slot 17: rope theta
        open(T("f9.bin"), "wb").write(bytes(raw))
        os.remove(T("f9.bin.sum"))
        rc, out = run([CONVERT, T("f9.bin"), T("f9_hf")])
    clean_error("9: an llmc Llama checkpoint with rope theta inf is an error", rc, out if ok else "setup: " + out,
                "theta", "finite")

    # 10: --save-hf keeps the source's config fields
    d = hf.write_llama(T("keep10"))
    rc, out = run([TRAINER] + hf.train_args(tmp, d, "-x", "1", "-n", "1", "-o", T("out10"), "--save-hf", "1"))
    saved = T("out10", "model_00000001_hf")
    got = json.load(open(os.path.join(saved, "config.json"))) if rc == 0 else {}
    keep = {k: base[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id", "pretraining_tp", "transformers_version")}
    report(rc == 0 and all(k in got and got[k] == v for k, v in keep.items()),
           "10: --save-hf on a Llama keeps bos/eos_token_id and the other config.json fields it does not set",
           f"exit {rc}: {out[-300:]} config {got}")
    rc, out = run([TRAINER] + hf.train_args(tmp, saved, "-x", "1"))
    report(rc == 0, "10: the saved Llama directory loads", f"exit {rc}: {out[-300:]}")
    rc, out = run([CONVERT, d, T("conv10"), "--format", "hf", "--dtype", "bf16"])
    path = T("conv10", "config.json")
    got = json.load(open(path)) if rc == 0 and os.path.exists(path) else {}
    report(all(k in got and got[k] == v for k, v in keep.items()) and got.get("torch_dtype") == "bfloat16" and
           os.path.isfile(T("conv10", "tokenizer.json")),
           "10: ./hf_convert HF -> HF (--format hf) keeps the config.json fields it does not set and the tokenizer files",
           f"exit {rc}: {out[-300:]} config {got}")
    g = hf.write_gpt2(T("keep10g"))
    rc, out = run([TRAINER] + hf.train_args(tmp, g, "-x", "1", "-n", "1", "-o", T("out10g"), "--save-hf", "1"))
    gpath = T("out10g", "model_00000001_hf", "config.json")
    got = json.load(open(gpath)) if rc == 0 and os.path.exists(gpath) else {}
    report(got.get("task_specific_params") == hf.gpt2_config()["task_specific_params"],
           "10: --save-hf on a GPT-2 keeps config.json fields it does not set", f"exit {rc}: {out[-300:]} {got}")

    # 14: hf_convert to a path with a trailing slash
    write_model(T("g14.bin"))
    rc, out = run([CONVERT, T("g14.bin"), T("gpt2-ft") + "/"])
    report(rc == 0 and os.path.isfile(T("gpt2-ft", "config.json")), "14: ./hf_convert model.bin gpt2-ft/ writes gpt2-ft",
           f"exit {rc}: {out[-300:]}")

    # 15: sizes the weights do not hold: the tensor named, no allocation
    big = hf.write_llama(T("big15"), config=hf.llama_config(num_hidden_layers=4096, hidden_size=4096,
                                                              intermediate_size=16384, num_attention_heads=32,
                                                              num_key_value_heads=8))
    for what, cmd in [("trainer", [TRAINER] + hf.train_args(tmp, big, "-x", "1")),
                      ("./generate", [GENERATE, "-e", big, "--prompt", "", "-g", "2"]),
                      ("./hf_convert", [CONVERT, big, T("big15.bin")])]:
        rc, out = run(cmd)
        clean_error(f"15: {what}: config.json sizes the weights do not hold name the tensor", rc, out,
                    "model.embed_tokens.weight", absent=("out of memory",))
    g = hf.write_gpt2(T("big15g"), config=hf.gpt2_config(n_layer=4096))
    rc, out = run([TRAINER] + hf.train_args(tmp, g, "-x", "1"))
    clean_error("15: GPT-2 n_layer 4096 with 1 layer of weights names the missing tensor", rc, out,
                "transformer.h.1.", absent=("out of memory",))

    # 16: present-but-unusable files said for what they are
    for kind in ["FIFO", "directory", "symbolic link loop", "symbolic link to nothing"]:
        d = hf.write_llama(T("tok16_" + kind.replace(" ", "_")))
        make(kind, os.path.join(d, "tokenizer.model"))
        rc, out = run([GENERATE, "-e", d, "--prompt", "hi", "-g", "2"])
        clean_error(f"16: ./generate: a tokenizer.model that is a {kind} is named", rc, out,
                    f"{d}/tokenizer.model", kind)
    d = hf.write_llama(T("st16"))
    os.remove(os.path.join(d, "model.safetensors"))
    make("symbolic link loop", os.path.join(d, "model.safetensors"))
    rc, out = run([TRAINER] + hf.train_args(tmp, d, "-x", "1"))
    clean_error("16: a model.safetensors symbolic link loop is named", rc, out, "model.safetensors",
                "symbolic link loop", absent=("holds neither",))

    # 21: other tokenizer formats named
    d = hf.write_llama(T("tok21"))
    sp = T("sp.model")  # a sentencepiece ModelProto's start: pieces <unk>, <s>, </s>
    piece = lambda s, t: bytes([0x0A, len(s) + 7, 0x0A, len(s)]) + s + b"\x15\x00\x00\x00\x00\x18" + bytes([t])  # noqa: E731
    open(sp, "wb").write(piece(b"<unk>", 2) + piece(b"<s>", 3) + piece(b"</s>", 3) + piece(b"hello", 1) * 50)
    rc, out = run([GENERATE, "-e", d, "--tokenizer", sp, "--prompt", "hi", "-g", "2"])
    clean_error("21: a sentencepiece tokenizer.model is named as one", rc, out, "sentencepiece", absent=("magic",))
    rc, out = run([GENERATE, "-e", d, "--tokenizer", os.path.join(d, "tokenizer.json"), "--prompt", "hi", "-g", "2"])
    clean_error("21: --tokenizer tokenizer.json is named as a JSON file", rc, out, "JSON", absent=("1024-byte",))

    shutil.rmtree(tmp, ignore_errors=True)
    return failed_count()


if __name__ == "__main__":
    sys.exit(main())
