#!/usr/bin/env python3
"""Checks ./generate end to end against the PyTorch reference (dev/reference/train_gpt2.py).

Greedy output (--temperature 0) must equal the reference's argmax decoding by full recompute,
token for token, printed as text: stdout must be exactly the prompt's bytes followed by the
continuation's bytes (tokens decoded by tiktoken's gpt2 encoding built from the same local GPT-2
files). Also: the prompt from stdin, an empty prompt (starts from end-of-text), a bf16 (version 5)
checkpoint, stopping at maxT, seeded sampling reproducible, --top-k 1 equal to greedy, and bad
inputs (exit 1, "error:" naming the flag or file, nothing on stdout).

The model is a random GPT-2 whose weights are scaled up (see make_model) so that greedy
continuations change from token to token and attention is far from uniform: a KV-cache bug
(wrong position, stale key) then changes the text.
With --sim BINARY (build/cudasim/generate: ./generate_gpu through the cudasim harness) it checks
the CUDA build instead: --precision fp32 greedy output byte-identical to the CPU ./generate's (and
so to the reference) for 24 tokens, from a prompt and from end-of-text; --precision bf16 (the
default) runs and continues with the reference's tokens up to the first step whose top-2 logit gap
(in the fp32 reference) is not well separated, i.e. not above 2 x (0.06 + 0.02 |top logit|): the
bf16 model tolerance of test/test_gpt.cu, so logits each within it cannot swap; bad --precision.
Prints PASS:/FAIL: lines; exits non-zero on any failure. Run from the repository root.
"""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "dev", "reference"))
sys.path.insert(0, os.path.join(ROOT, "test"))
import torch  # noqa: E402
import train_gpt2 as ref  # noqa: E402
from test_tokenizer import make_encoding  # noqa: E402
from testlib import failures, first_diff, report  # noqa: E402

GEN = os.path.join(ROOT, "generate")
EOT = 50256


def make_model(path, version, seed=20241130):
    """A 2-layer GPT-2 (C 64, NH 4, maxT 64, the full GPT-2 vocabulary) from the reference's
    init, with wpe x 20 and qkvw x 8: position-dependent, sharply attending."""
    cfg = ref.Config(max_seq_len=64, vocab_size=50257, padded_vocab=ref.padded_vocab_size(50257),
                     n_layer=2, n_head=4, channels=64).validate()
    tensors = ref.init_tensors(cfg, seed)
    tensors["wpe"] *= 20.0
    tensors["qkvw"] *= 8.0
    ref.save_model(path, cfg, tensors, version)
    cfg, tensors, _ = ref.load_model(path)  # what the file holds (bf16-rounded for version 5)
    return ref.GPT2(cfg, tensors)


def run(args, stdin=b""):
    return subprocess.run([GEN] + args, input=stdin, capture_output=True, cwd=ROOT)


def check_greedy(name, model, enc, model_path, prompt, g, via_stdin=False):
    ids = enc.encode_ordinary(prompt) if prompt else [EOT]
    new, gap = ref.greedy_generate(model, ids, g, EOT)
    want = prompt.encode() + enc.decode_bytes(new)
    args = ["-e", model_path, "--temperature", "0", "-g", str(g), "--threads", "1"]
    r = run(args, prompt.encode()) if via_stdin else run(args + ["--prompt", prompt])
    got = r.stdout
    i = first_diff(got, want)
    report(r.returncode == 0 and got == want, name,
           f"rc {r.returncode}; stdout differs from the reference at byte {i}: got {got[i:i + 40]!r}, "
           f"want {want[i:i + 40]!r} (smallest top-2 logit gap in the reference: {gap:.3g}); "
           f"stderr: {r.stderr.decode(errors='replace')[-300:]}")
    return new, r


def reference_gaps(model, ids, n):
    """The fp32 reference's greedy tokens and (top logit, top-2 gap) at each of n steps."""
    ids, out = list(ids), []
    V = model.cfg.vocab_size
    for _ in range(n):
        logits, _ = model(torch.tensor([ids], dtype=torch.long))
        top2 = torch.topk(logits[0, -1, :V], 2).values
        out.append((int(torch.argmax(logits[0, -1, :V])), float(top2[0]), float(top2[0] - top2[1])))
        ids.append(out[-1][0])
    return out


LNF_SCALE = 4.0


def main_sim(sim):
    """./generate_gpu (through cudasim) against ./generate and the reference."""
    r = subprocess.run([os.path.join(ROOT, "tokenizer"), "find-gpt2"], capture_output=True, cwd=ROOT)
    if not report(r.returncode == 0, "find_gpt2_files", r.stderr.decode(errors="replace")):
        return 1
    enc = make_encoding(os.path.join(ROOT, r.stdout.decode().strip()))
    torch.set_num_threads(1)
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    with tempfile.TemporaryDirectory(prefix="llmc_test_gen_sim_") as tmp:
        m3 = os.path.join(tmp, "model_v3.bin")
        model3 = make_model(m3, 3)
        prompt = "The quick brown fox jumps over"
        for name, p in (("prompt", prompt), ("empty_prompt", "")):
            args = ["-e", m3, "--prompt", p, "--temperature", "0", "-g", "24"]
            cpu = subprocess.run([GEN] + args + ["--threads", "1"], capture_output=True, cwd=ROOT)
            gpu = subprocess.run([sim] + args + ["--precision", "fp32"], capture_output=True, cwd=ROOT, env=env)
            i = first_diff(gpu.stdout, cpu.stdout)
            report(cpu.returncode == 0 and gpu.returncode == 0 and gpu.stdout == cpu.stdout and len(cpu.stdout) > len(p),
                   f"cuda_fp32_greedy_equals_cpu_generate_{name}",
                   f"rc cpu {cpu.returncode} gpu {gpu.returncode}; differ at byte {i}: gpu {gpu.stdout[i:i + 40]!r}, "
                   f"cpu {cpu.stdout[i:i + 40]!r}; stderr {gpu.stderr.decode(errors='replace')[-300:]}")
        ids = enc.encode_ordinary(prompt)
        steps = reference_gaps(model3, ids, 24)
        well = next((k for k, (_, top, gap) in enumerate(steps) if gap <= 2 * (0.06 + 0.02 * abs(top))), len(steps))
        gpu = subprocess.run([sim, "-e", m3, "--prompt", prompt, "--temperature", "0", "-g", "24"],
                             capture_output=True, cwd=ROOT, env=env)
        want = prompt.encode() + enc.decode_bytes([t for t, _, _ in steps[:well]])
        # (a random model over GPT-2's 50257 tokens has top-2 gaps of a few % of the top logit, about
        # bf16's resolution, so few steps qualify; test/test_decode_cuda.cu checks every
        # well-separated step with the CPU's sequence fed in)
        report(gpu.returncode == 0 and b"CUDA bf16" in gpu.stderr and b"generated 24 tokens" in gpu.stderr and
               gpu.stdout.startswith(want) and len(gpu.stdout) > len(want),
               f"cuda_bf16_runs_and_its_first_{well}_well_separated_tokens_equal_reference",
               f"rc {gpu.returncode}; stdout {gpu.stdout[:120]!r}, want a start {want!r}; "
               f"stderr {gpu.stderr.decode(errors='replace')[-300:]}")
        for prog, args, needle in ((sim, ["-e", m3, "--precision", "fp8"], "--precision fp8"),
                                   (GEN, ["-e", m3, "--precision", "bf16"], "--precision bf16")):
            r = subprocess.run([prog] + args + ["--prompt", "x"], capture_output=True, cwd=ROOT, env=env)
            err = r.stderr.decode(errors="replace").strip()
            last = err.splitlines()[-1] if err else ""
            report(r.returncode == 1 and last.startswith("error:") and needle in last and r.stdout == b"",
                   f"bad_precision_{'generate_gpu' if prog == sim else 'generate'}", f"rc {r.returncode}; stderr {err[-300:]!r}")
    print(f"{failures()} failure(s)")
    return 1 if failures() else 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--sim":
        return main_sim(os.path.join(ROOT, sys.argv[2]))
    if not os.access(GEN, os.X_OK):
        report(False, "generate_built", f"{GEN} is missing: run 'make generate'")
        return 1
    r = subprocess.run([os.path.join(ROOT, "tokenizer"), "find-gpt2"], capture_output=True, cwd=ROOT)
    if not report(r.returncode == 0, "find_gpt2_files", r.stderr.decode(errors="replace")):
        return 1
    enc = make_encoding(os.path.join(ROOT, r.stdout.decode().strip()))
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="llmc_test_gen_") as tmp:
        m3, m5 = os.path.join(tmp, "model_v3.bin"), os.path.join(tmp, "model_v5.bin")
        model3, model5 = make_model(m3, 3), make_model(m5, 5)

        prompt = "The quick brown fox jumps over"
        new, _ = check_greedy("greedy_equals_pytorch_argmax", model3, enc, m3, prompt, 30)
        report(len(set(new)) > 5, "greedy_reference_continuation_varies",
               f"only {len(set(new))} distinct tokens: the test model is too flat to catch cache bugs")
        check_greedy("greedy_prompt_from_stdin", model3, enc, m3, prompt, 30, via_stdin=True)
        check_greedy("greedy_empty_prompt_starts_at_eot", model3, enc, m3, "", 20)
        check_greedy("greedy_bf16_checkpoint", model5, enc, m5, "Hello, world! Ünïcödé  spaces\n", 25)
        # a prompt of 8 tokens and -g 100: stops at maxT = 64, i.e. after 56 tokens
        long_prompt = "one two three four five six seven eight"
        new, r = check_greedy("greedy_stops_at_maxT", model3, enc, m3, long_prompt, 100)
        n_prompt = len(enc.encode_ordinary(long_prompt))
        report(len(new) == 64 - n_prompt and b"maxT" in r.stderr, "generate_reports_stop_at_maxT",
               f"{len(new)} reference tokens after a {n_prompt}-token prompt; stderr {r.stderr[-200:]!r}")

        # a model whose every prediction is end-of-text (final LayerNorm output = 100 x wte[EOT]):
        # nothing follows the prompt, and stderr says why it stopped
        cfg, tensors, _ = ref.load_model(m3)
        tensors["lnfw"].zero_()
        tensors["lnfb"].copy_(100.0 * tensors["wte"][EOT])
        meot = os.path.join(tmp, "model_eot.bin")
        ref.save_model(meot, cfg, tensors, 3)
        new, _ = ref.greedy_generate(ref.GPT2(cfg, tensors), enc.encode_ordinary(prompt), 10, EOT)
        r = run(["-e", meot, "--prompt", prompt, "-g", "10", "--temperature", "0"])
        report(new == [] and r.returncode == 0 and r.stdout == prompt.encode() and b"end-of-text" in r.stderr,
               "stops_at_end_of_text_printing_nothing_after_the_prompt",
               f"reference {new}; rc {r.returncode}; stdout {r.stdout!r}; stderr {r.stderr[-200:]!r}")

        # sampling: reproducible with --seed, different with another seed, top-k 1 = greedy
        sample = ["-e", m3, "--prompt", prompt, "-g", "30", "--temperature", "1.5", "--threads", "1"]
        a, b, c = run(sample + ["--seed", "7"]), run(sample + ["--seed", "7"]), run(sample + ["--seed", "8"])
        report(a.returncode == 0 and a.stdout == b.stdout and a.stdout != c.stdout, "sampling_seeded",
               f"rc {a.returncode}; same seed equal: {a.stdout == b.stdout}; other seed differs: {a.stdout != c.stdout}")
        greedy = run(["-e", m3, "--prompt", prompt, "-g", "30", "--temperature", "0"]).stdout
        k1 = run(sample + ["--seed", "7", "--top-k", "1"]).stdout
        p0 = run(sample + ["--seed", "7", "--top-p", "1e-6"]).stdout
        report(k1 == greedy and p0 == greedy, "top_k_1_and_tiny_top_p_equal_greedy",
               f"top-k 1 equal: {k1 == greedy}; top-p 1e-6 equal: {p0 == greedy}")
        # a temperature below float's normal range (1e-38 is subnormal: strtof reports ERANGE) is a
        # number all the same, and as good as greedy
        tiny = run(sample + ["--seed", "7", "--temperature", "1e-38"])
        report(tiny.returncode == 0 and tiny.stdout == greedy, "tiny_temperature_1e-38_is_a_number_and_greedy",
               f"rc {tiny.returncode}; stderr {tiny.stderr[-200:]!r}")

        bad = {
            "missing_model": (["-e", os.path.join(tmp, "nope.bin"), "--prompt", "x"], "nope.bin"),
            "unknown_flag": (["-e", m3, "--temprature", "0"], "--temprature"),
            "negative_temperature": (["-e", m3, "--temperature", "-1"], "--temperature"),
            "temperature_beyond_float": (["-e", m3, "--temperature", "1e39"], "out of range"),
            "malformed_top_k": (["-e", m3, "--top-k", "3x"], "--top-k"),
            "top_p_zero": (["-e", m3, "--top-p", "0"], "--top-p"),
            "missing_value": (["-e", m3, "-g"], "-g"),
            "no_model": (["--prompt", "x"], "-e"),
            "prompt_longer_than_maxT": (["-e", m3, "--prompt", "word " * 80], "maxT"),
        }
        for name, (args, needle) in bad.items():
            r = run(args)
            err = r.stderr.decode(errors="replace")
            last = err.strip().splitlines()[-1] if err.strip() else ""  # loader notes may come first
            report(r.returncode == 1 and last.startswith("error:") and needle in last and r.stdout == b"",
                   f"bad_input_{name}", f"rc {r.returncode}; stdout {r.stdout[:80]!r}; stderr {err[-300:]!r}")
    print(f"{failures()} failure(s)")
    return 1 if failures() else 0


if __name__ == "__main__":
    sys.exit(main())
