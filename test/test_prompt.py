#!/usr/bin/env python3
"""test_prompt.py - prompt tuning on ./train_gpt_cpu against Hugging Face PEFT 0.13.2 (issue 23 item 5).

On test_lora.py's tiny GPT-2 and GQA Llama, from the same PEFT PROMPT_TUNING adapter directory (written
by PEFT: P soft tokens, RANDOM init, seeded), fp32, one batch (-a 1), through test_lora.check_family
against dev/reference/prompt.py:
  - step 1's loss and the prompt_embeddings gradient (LLMC_LORA_DUMP_GRADS) equal PEFT's (loss relative
    1e-5; gradient relative 1e-3 + 1e-4 of its largest value);
  - a 10-step AdamW trajectory follows PEFT's (losses relative 1e-4, the trained prompt relative 1e-3);
  - PEFT loads the adapter llmc writes (its loss on the batch is llmc's -x 0 --adapter loss);
  - the base is bit-identical through training (each checkpoint recomputes its CRC); -y 1 from step 5
    writes the same adapter bytes as the run that never stopped;
  - GPT-2's -r 0, 1, 2 write the same adapter; 2 ranks at -z 0 and -z 1 write the same adapter, with the
    losses of one process accumulating the same -d.
Also: a fresh --prompt-tokens run starts from a seeded N(0, 1) draw (PEFT's RANDOM init) and writes
PEFT's config fields; --plan counts the P * C parameters (gradients and AdamW state for them only) and
activations for P + T positions; ./generate --adapter continues a prompt greedily as PEFT's generate
with the soft tokens does; ./hf_convert refuses the adapter clearly. Bad inputs are
clear errors: --prompt-tokens 0 and -3, P + T > maxT, with --lora-rank or --quantize-base, an adapter of another base (CRC;
other channels), a P that differs from the adapter's.
"""
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_lora as tl  # noqa: E402
from f32_safetensors import read_safetensors  # noqa: E402
from testlib import report  # noqa: E402

P = 8
REFERENCE = os.path.join(tl.ROOT, "dev", "reference", "prompt.py")

MAKE_MODELS = tl.MAKE_FAMILIES + r"""
from peft import PromptTuningConfig
for name, make, _, _ in FAMILIES:
    m = make(1)
    m.save_pretrained(f"{out}/{name}", safe_serialization=True)
    make(2).save_pretrained(f"{out}/{name}_other", safe_serialization=True)  # same shapes, other weights
    torch.manual_seed(5)
    save_adapter(get_peft_model(m, PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=%d)), f"{out}/{name}_prompt")
torch.manual_seed(3)
GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=96, n_head=4, vocab_size=V, n_positions=64)).save_pretrained(
    f"{out}/gpt2_wide", safe_serialization=True)
""" % P


def base_flags(data, steps=1):
    return ["-i", data, "-j", data, "-b", str(tl.B), "-t", str(tl.T), "-x", str(steps), "-v", "0", "-s", "0", "--threads", "2"]


def check_fresh(w, data):
    """--prompt-tokens P from the seed: PEFT's RANDOM init (N(0, 1)) and PEFT's config."""
    out = os.path.join(w, "fresh")
    tl.run(["-e", os.path.join(w, "gpt2"), "--prompt-tokens", str(P), "-o", out, "-l", "0"] + base_flags(data))
    d = os.path.join(out, "adapter_00000001")
    t, meta = read_safetensors(os.path.join(d, "adapter_model.safetensors"))
    e = t.get("prompt_embeddings", np.zeros((0, 0)))
    n = e.size
    ok = e.shape == (P, 64) and abs(float(e.mean())) < 4 / np.sqrt(n) and abs(float(e.std()) - 1) < 4 / np.sqrt(2 * n)
    report(ok and sorted(t) == ["prompt_embeddings"], "fresh_prompt_is_normal_0_1",
           f"shape {e.shape}, mean {e.mean() if n else 0:.3g}, std {e.std() if n else 0:.3g}, keys {sorted(t)}")
    cfg = json.load(open(os.path.join(d, "adapter_config.json")))
    want = {"peft_type": "PROMPT_TUNING", "task_type": "CAUSAL_LM", "num_virtual_tokens": P, "token_dim": 64,
            "num_layers": 2, "num_attention_heads": 4, "num_transformer_submodules": 1, "prompt_tuning_init": "RANDOM"}
    report(all(cfg.get(k) == v for k, v in want.items()) and meta.get("llmc_base_crc32"), "fresh_adapter_config",
           json.dumps(cfg)[:400])
    again = os.path.join(w, "fresh_again")
    tl.run(["-e", os.path.join(w, "gpt2"), "--prompt-tokens", str(P), "-o", again, "-l", "0"] + base_flags(data))
    same = open(os.path.join(d, "adapter_model.safetensors"), "rb").read() == \
        open(os.path.join(again, "adapter_00000001", "adapter_model.safetensors"), "rb").read()
    report(same, "fresh_prompt_seeded", "two runs with the same -rs wrote different prompts")


def check_plan(w):
    """--plan: the prompt's P * C parameters train (gradients, AdamW m and v for them only), the base's are
    there frozen, and the activations are the model's for P + T positions (plus the (B, P + T) batch)."""
    g = os.path.join(w, "gpt2")
    plan = lambda *a: json.loads(tl.run(["-e", g, "-b", str(tl.B), "--plan", "--json"] + list(a)).stdout)  # noqa: E731
    full, longer = plan("-t", str(tl.T)), plan("-t", str(tl.T + P))
    pt = plan("-t", str(tl.T), "--prompt-tokens", str(P))
    n = P * 64
    c, fc, lc = pt["classes"], full["classes"], longer["classes"]
    got = (pt["parameters"], c["parameters"] - fc["parameters"], c["gradients"], c["adamw_m"], c["adamw_v"],
           c["activations"] - lc["activations"])
    want = (n, 4 * n, 4 * n, 4 * n, 4 * n, 2 * 4 * tl.B * (tl.T + P))
    report(got == want, "plan_counts_prompt", f"(trained, parameters up, gradients, m, v, activations over -t T+P) {got}, "
           f"want {want}")
    text = tl.run(["-e", g, "-b", str(tl.B), "-t", str(tl.T), "--plan", "--prompt-tokens", str(P)]).stdout
    report(f"prompt tuning (--prompt-tokens {P}): {P} x 64 = {n} trained parameters" in text and
           f"activations for {P} + {tl.T} positions" in text, "plan_prompt_line", text[-600:])
    text = tl.run(["-e", g, "--prompt-tokens", str(P)] + base_flags(os.path.join(w, "data.bin"))).stdout
    report(f"prompt tuning: {P} soft tokens x 64 channels" in text, "memory_print_prompt_line", text[-600:])


MAKE_GEN = tl.MAKE_FAMILIES.replace("out, V = sys.argv[1], int(sys.argv[2])", "out, P, ids = sys.argv[1], int(sys.argv[2]), "
                                    "[int(t) for t in sys.argv[3].split(',')]") + r"""
import json
from peft import PromptTuningConfig
torch.manual_seed(4)
m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=50257, n_positions=64, resid_pdrop=0.0,
                               embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.5))  # (large: the text varies)
m.save_pretrained(f"{out}/gen_base", safe_serialization=True)
torch.manual_seed(6)
pm = get_peft_model(m, PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=P))
save_adapter(pm, f"{out}/gen_prompt")
pm.eval()
x = torch.tensor([ids])
with torch.no_grad():
    g = pm.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=12, do_sample=False, pad_token_id=0)
new = g[0, -12:].tolist()
print(json.dumps(new[:new.index(50256)] if 50256 in new else new))
"""


def check_generate(w):
    """./generate -e BASE --adapter DIR (a PEFT prompt-tuning directory) continues a prompt greedily as PEFT's
    generate does with the soft tokens (a tiny GPT-2 on GPT-2's vocabulary; the tokens through ./tokenizer),
    and not as the base alone."""
    tokenizer = os.path.join(tl.ROOT, "tokenizer")
    tok = subprocess.run([tokenizer, "find-gpt2"], capture_output=True, text=True, cwd=tl.ROOT)
    if not report(tok.returncode == 0, "generate_gpt2_tokenizer_files", tok.stderr[-300:]):
        return
    tokdir = os.path.join(tl.ROOT, tok.stdout.strip())
    open(os.path.join(w, "prompt.txt"), "w").write("The king said")
    subprocess.run([tokenizer, "encode", os.path.join(w, "prompt.txt"), os.path.join(w, "prompt.bin")], check=True,
                   capture_output=True)
    ids = np.fromfile(os.path.join(w, "prompt.bin"), dtype=np.uint16, offset=1024).tolist()
    new = json.loads(tl.py(MAKE_GEN, w, str(P), ",".join(map(str, ids))).strip().splitlines()[-1])
    tl.testlib.write_shard(os.path.join(w, "new.bin"), new)
    want = subprocess.run([tokenizer, "decode", os.path.join(w, "new.bin")], capture_output=True, text=True).stdout
    gen = os.path.join(tl.ROOT, "generate")
    g = ["--prompt", "The king said", "--temperature", "0", "-g", "12", "--threads", "1", "--tokenizer", tokdir]
    a = subprocess.run([gen, "-e", os.path.join(w, "gen_base"), "--adapter", os.path.join(w, "gen_prompt")] + g,
                       capture_output=True, text=True)
    b = subprocess.run([gen, "-e", os.path.join(w, "gen_base")] + g, capture_output=True, text=True)
    text = lambda r: r.stdout.split("The king said", 1)[-1]  # noqa: E731
    report(a.returncode == 0 and want and text(a) == want and text(b) != want, "generate_prompt_adapter_as_peft",
           f"rc {a.returncode}: llmc {text(a)!r}, PEFT {want!r}, base alone {text(b)!r} {a.stderr[-300:]!r}")


def check_errors(w, data):
    g, ga = os.path.join(w, "gpt2"), os.path.join(w, "gpt2_prompt")
    base = ["-e", g] + base_flags(data)
    tl.expect("prompt_tokens_0", base + ["--prompt-tokens", "0"], "--prompt-tokens must be >= 1")
    tl.expect("prompt_tokens_negative", base + ["--prompt-tokens", "-3"], "--prompt-tokens must be >= 1")
    tl.expect("prompt_plus_t_above_maxT", base + ["--prompt-tokens", "40", "-t", "32"], "--prompt-tokens 40 + -t 32")
    tl.expect("prompt_with_lora_rank", base + ["--prompt-tokens", str(P), "--lora-rank", "4"], "do not combine")
    tl.expect("prompt_with_lora_adapter", base + ["--prompt-tokens", str(P), "--adapter", os.path.join(w, "gpt2_adapter")],
              "do not combine")
    tl.expect("prompt_with_quantize_base", base + ["--adapter", ga, "--quantize-base", "nf4"], "with prompt tuning")
    tl.expect("adapter_prompt_tokens_differ", base + ["--prompt-tokens", str(P + 1), "--adapter", ga],
              "differs from the adapter's num_virtual_tokens")
    tl.expect("adapter_of_other_channels", ["-e", os.path.join(w, "gpt2_wide"), "--adapter", ga] + base_flags(data),
              "belongs to another base model")
    trained = os.path.join(w, "gpt2_prompt_run", f"adapter_{tl.STEPS:08d}")
    tl.expect("adapter_of_other_base_crc", ["-e", os.path.join(w, "gpt2_other"), "--adapter", trained] + base_flags(data),
              "trained on another base model")
    tl.expect("generate_prompt_adapter_other_channels", ["-e", os.path.join(w, "gpt2_wide"), "--adapter", trained],
              "belongs to another base model", prog=os.path.join(tl.ROOT, "generate"))
    tl.expect("hf_convert_prompt_adapter", [g, os.path.join(w, "merged.bin"), "--adapter", trained], "no weights to merge",
              prog=os.path.join(tl.ROOT, "hf_convert"))
    report(not os.path.exists(os.path.join(w, "merged.bin")), "hf_convert_prompt_adapter_writes_nothing", "")


def checks(w, data):
    # (a LoRA adapter of the same model, for the mutual-exclusion check)
    tl.py(tl.MAKE_FAMILIES + "pm = peft(gpt2(1), ['c_attn'], False)\nsave_adapter(pm, f'{out}/gpt2_adapter')\n", w, str(tl.V))
    for name in ("gpt2", "llama"):
        tl.guarded(f"{name}_prompt", lambda: tl.check_family(name, w, data, kind="prompt", reference=REFERENCE))
    tl.guarded("recompute", lambda: tl.check_recompute(w, data, "gpt2", kind="prompt"))
    tl.guarded("ranks", lambda: tl.check_ranks(w, data, "gpt2", kind="prompt"))
    tl.guarded("fresh", lambda: check_fresh(w, data))
    tl.guarded("plan", lambda: check_plan(w))
    tl.guarded("errors", lambda: check_errors(w, data))
    tl.guarded("generate", lambda: check_generate(w))


if __name__ == "__main__":
    sys.exit(tl.run_checks("llmc_prompt.", MAKE_MODELS, checks))
