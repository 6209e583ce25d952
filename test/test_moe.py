#!/usr/bin/env python3
"""Mixture of experts (issue 24, first slice): the Mixtral architecture on the CPU trainer.

Against the PyTorch reference (dev/reference/train_mixtral.py, transformers' Mixtral with the
>= 4.37 load-balancing loss), through build/test/test_mixtral_cpu: for top-1 and top-2, E 4 and
8, grouped-query attention (NH 4, NKV 2; one shape NKV 1 with a tied head; one with the aux loss
off) the checkpoint byte for byte, the first forward's CE, aux and tokens per expert of every
layer, logits, the objective, every gradient (router and experts), a 10-step AdamW trajectory, the
same bits twice, -z 2/3 as -z 0; an all-zero router (every row ties) routed as the reference routes
it. Then end to end:
- an HF MixtralForCausalLM directory written by the reference trains in ./train_gpt_cpu to the
  reference's 10 losses, bit for bit as the reference's llmc file does; the log has train_ce,
  train_aux and the tokens-per-expert figures, train_loss = train_ce + coef * train_aux, and the
  validation loss is the cross-entropy;
- --save-hf 1 writes a directory that reads back to the trained weights (a step from it equals a
  step from the checkpoint, bit for bit), and ./hf_convert of the reference's file gives the
  reference's safetensors tensor for tensor; a sharded directory (index.json) reads the same;
- transformers' MixtralForCausalLM logits and CE on that directory (transformers 4.36.2 from
  test_lora's build/pyref, or LLMC_TRANSFORMERS_PYTHON's; its 4.36 aux loss is the broken one: not
  compared);
- resume (-y 1) byte-identical; 2 ranks over -pi fs at -z 0 and -z 3 give the same model, with the
  losses of one process accumulating the same batch;
- mixtral:dN-eE-kK descriptors train; --plan counts total and active parameters; bad inputs are clear errors naming the flag or file: top-k
  above E or below 1, a missing or mis-shaped expert tensor, a negative or NaN aux coefficient;
  -ep 2 with one process refused (expert parallelism: test_moe_ep.py); ./generate's greedy tokens (KV-cache decode) are the reference's; the
  CUDA trainer and generator (cudasim build, when present) refuse naming the architecture.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from testlib import expect_error, failed_count, report, write_shard  # noqa: E402

PY = "/usr/bin/python3"
REF = "dev/reference/train_mixtral.py"
B, T, V, STEPS = 4, 32, 1000, 10
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "passive"}


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV, **kw)


def reference(tmp, tag, extra=()):
    """the reference's files for one shape: model, debug state, stats (and --hf-dir if in extra)"""
    files = {k: os.path.join(tmp, f"{tag}_{k}") for k in ("model.bin", "state.bin", "stats.bin")}
    p = run([PY, REF, "--save-model", files["model.bin"], "--debug-state", files["state.bin"],
             "--moe-stats", files["stats.bin"], "--batch-size", str(B), "--seq-len", str(T), "--vocab", str(V),
             "--steps", str(STEPS)] + list(extra))
    if p.returncode != 0:
        sys.exit(f"reference failed ({tag}): {p.stderr[-2000:]}")
    return files


def state_tokens_and_losses(files):
    raw = open(files["state.bin"], "rb").read()
    P = (os.path.getsize(files["model.bin"]) - 1024) // 4
    x = np.frombuffer(raw, "<i4", B * T, 1024)
    y = np.frombuffer(raw, "<i4", B * T, 1024 + 4 * B * T)
    off = 1024 + 8 * B * T + 4 * (B * T * V + 1 + P)
    return [int(v) for v in x] + [int(y[-1])], [float(v) for v in np.frombuffer(raw, "<f4", STEPS, off)]


def train(init, shard, outdir, steps=STEPS, extra=()):
    return run(["./train_gpt_cpu", "-e", init, "-i", shard, "-j", shard, "-b", str(B), "-t", str(T), "-x", str(steps),
                "-k", "constant", "-l", "1e-3", "-c", "0.1", "--shuffle", "0", "-v", "0", "-s", "0", "--threads", "1",
                "-o", outdir] + list(extra))


def records(outdir):
    with open(os.path.join(outdir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def losses_of(outdir):
    return [r["train_loss"] for r in records(outdir) if "train_loss" in r]


def check_cpu_vs_reference(tmp):
    shapes = [("E4 top-1", ["--experts", "4", "--top-k", "1"]),
              ("E4 top-2", ["--experts", "4", "--top-k", "2"]),
              ("E8 top-2", ["--experts", "8", "--top-k", "2"]),
              ("E8 top-1, NKV 1, tied head", ["--experts", "8", "--top-k", "1", "--kv-heads", "1", "--tied", "1"]),
              ("E4 top-2, aux loss off (output_router_logits false)", ["--experts", "4", "--router-logits", "0"])]
    for i, (name, extra) in enumerate(shapes):
        files = reference(tmp, f"s{i}", extra)
        p = run(["build/test/test_mixtral_cpu", files["model.bin"], files["state.bin"], files["stats.bin"]])
        bad = [line for line in p.stdout.splitlines() if line.startswith("FAIL")]
        report(p.returncode == 0 and not bad and "(checks: " in p.stdout,
               f"CPU Mixtral vs the PyTorch reference, {name}: CE, aux, routing, logits, objective, every gradient, "
               f"10 AdamW steps, the same bits twice, -z 2/3", "\n".join(bad[:8]) + p.stderr[-800:])
    files = reference(tmp, "tie", ["--experts", "4", "--top-k", "2", "--zero-router", "--steps", "1"])
    p = run(["build/test/test_mixtral_cpu", "--tie", files["model.bin"], files["state.bin"], files["stats.bin"]])
    report(p.returncode == 0 and "FAIL" not in p.stdout,
           "an all-zero router (every row a tie): experts 0..K-1 in order on both sides, routing, CE and aux equal",
           p.stdout[-1500:] + p.stderr[-500:])


def check_hf(tmp):
    hf = os.path.join(tmp, "hf")
    files = reference(tmp, "hf", ["--experts", "4", "--top-k", "2", "--hf-dir", hf])
    tokens, ref_losses = state_tokens_and_losses(files)
    shard = os.path.join(tmp, "batch.bin")
    write_shard(shard, tokens)
    stats = np.fromfile(files["stats.bin"], "<f4")
    p1 = train(files["model.bin"], shard, os.path.join(tmp, "run_bin"))
    p2 = train(hf, shard, os.path.join(tmp, "run_hf"), extra=["--save-hf", "1", "-n", "10"])
    ok = p1.returncode == 0 and p2.returncode == 0
    got = losses_of(os.path.join(tmp, "run_hf")) if ok else []
    report(ok and got == losses_of(os.path.join(tmp, "run_bin")),
           "-e <HF Mixtral dir> trains with the losses of the reference's llmc file, bit for bit",
           (p1.stdout + p1.stderr + p2.stdout + p2.stderr)[-1500:])
    report(ok and len(got) == STEPS and all(abs(g - r) <= 1e-4 * r for g, r in zip(got, ref_losses)),
           "-e <HF Mixtral dir>: the 10-step trajectory (CE + coef * aux) equals the PyTorch reference's",
           f"{got} vs {ref_losses}")
    recs = [r for r in records(os.path.join(tmp, "run_hf")) if "train_loss" in r] if ok else []
    fields = all(k in r for r in recs for k in ("train_ce", "train_aux", "expert_tokens_min", "expert_tokens_max"))
    parts = fields and all(abs(r["train_loss"] - (r["train_ce"] + 0.02 * r["train_aux"])) <= 1e-5 * r["train_loss"]
                           for r in recs)
    first = recs[0] if recs else {}
    # 2 layers of 128 tokens x 2 slots: per layer min <= 64 <= max; summed over the layers
    routed = fields and all(r["expert_tokens_min"] <= 128 <= r["expert_tokens_max"] for r in recs)
    report(len(recs) == STEPS and parts and routed and abs(first.get("train_ce", 0) - float(stats[0])) <= 1e-5 * stats[0]
           and abs(first.get("train_aux", 0) - float(stats[1])) <= 1e-5 * stats[1],
           "the log: train_loss = train_ce + coef * train_aux; train_ce and train_aux (unscaled) of step 1 are the "
           "reference's; tokens per expert min/max summed over layers", json.dumps(first)[:600])
    pv = run(["./train_gpt_cpu", "-e", hf, "-i", shard, "-j", shard, "-b", str(B), "-t", str(T), "-x", "0", "-v", "1",
              "-m", "1", "--threads", "1", "-o", os.path.join(tmp, "run_val")])
    val = [r["val_loss"] for r in records(os.path.join(tmp, "run_val")) if "val_loss" in r] if pv.returncode == 0 else []
    report(len(val) == 1 and abs(val[0] - float(stats[0])) <= 1e-5 * stats[0],
           "validation reports the cross-entropy (no aux term)", f"{val} vs CE {stats[0]}: {pv.stderr[-500:]}")
    # --save-hf: the directory reads back to the trained weights
    saved = os.path.join(tmp, "run_hf", "model_00000010_hf")
    ckpt = os.path.join(tmp, "run_hf", "model_00000010.bin")
    a = train(saved, shard, os.path.join(tmp, "again_hf"), steps=1)
    b = train(ckpt, shard, os.path.join(tmp, "again_bin"), steps=1)
    cfg = json.load(open(os.path.join(saved, "config.json"))) if os.path.exists(saved) else {}
    report(a.returncode == 0 and b.returncode == 0 and losses_of(os.path.join(tmp, "again_hf")) ==
           losses_of(os.path.join(tmp, "again_bin")) and cfg.get("architectures") == ["MixtralForCausalLM"]
           and cfg.get("num_local_experts") == 4 and cfg.get("num_experts_per_tok") == 2,
           "--save-hf 1: the MixtralForCausalLM directory reads back to the trained weights (a step from it equals "
           "a step from the checkpoint)", (a.stderr + b.stderr)[-800:])
    # ./hf_convert of the reference's llmc file: the reference's tensors, exactly
    from safetensors.numpy import load_file, save_file
    conv = os.path.join(tmp, "converted")
    c = run(["./hf_convert", files["model.bin"], conv])
    same = False
    if c.returncode == 0:
        x, y = load_file(os.path.join(hf, "model.safetensors")), load_file(os.path.join(conv, "model.safetensors"))
        same = x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
    report(same, "./hf_convert <reference's Mixtral file>: the reference's HF tensors, key for key, bit for bit",
           c.stdout[-500:] + c.stderr[-500:])
    back = os.path.join(tmp, "back.bin")
    c2 = run(["./hf_convert", hf, back])
    report(c2.returncode == 0 and os.path.exists(back) and open(back, "rb").read() == open(files["model.bin"], "rb").read(),
           "./hf_convert <reference's HF Mixtral dir> model.bin: the reference's llmc file byte for byte",
           c2.stdout[-500:] + c2.stderr[-500:])
    # sharded: the same tensors in two files with an index
    sharded = os.path.join(tmp, "hf_sharded")
    os.makedirs(sharded)
    shutil.copy(os.path.join(hf, "config.json"), sharded)
    t = load_file(os.path.join(hf, "model.safetensors"))
    names = sorted(t)
    wm = {}
    for s in range(2):
        fname = f"model-{s + 1:05d}-of-00002.safetensors"
        save_file({n: t[n] for n in names[s::2]}, os.path.join(sharded, fname), metadata={"format": "pt"})
        wm.update({n: fname for n in names[s::2]})
    json.dump({"metadata": {"total_size": sum(v.nbytes for v in t.values())}, "weight_map": wm},
              open(os.path.join(sharded, "model.safetensors.index.json"), "w"))
    p3 = train(sharded, shard, os.path.join(tmp, "run_sharded"), steps=2)
    report(p3.returncode == 0 and losses_of(os.path.join(tmp, "run_sharded")) == got[:2],
           "a sharded HF Mixtral directory (index.json) trains as the single-file one", p3.stderr[-600:])
    check_transformers(tmp, saved)
    return hf, shard, files


TRANSFORMERS_CHECK = r"""
import json, sys
import numpy as np, torch
from transformers import MixtralForCausalLM, __version__
conv, state, saved, B, T, V = sys.argv[1], sys.argv[2], sys.argv[3], 4, 32, 1000
raw = open(state, "rb").read()
x = torch.tensor(np.frombuffer(raw, "<i4", B * T, 1024).astype(np.int64)).view(B, T)
y = torch.tensor(np.frombuffer(raw, "<i4", B * T, 1024 + 4 * B * T).astype(np.int64)).view(B, T)
ours = np.frombuffer(raw, "<f4", B * T * V, 1024 + 8 * B * T).reshape(B, T, V)
out = {"version": __version__}
for name, d in (("converted", conv), ("saved", saved)):
    m, info = MixtralForCausalLM.from_pretrained(d, torch_dtype=torch.float32, output_loading_info=True)
    with torch.no_grad():
        lg = m.eval()(x).logits
    out[name] = {"missing": info["missing_keys"], "unexpected": info["unexpected_keys"],
                 "finite": bool(torch.isfinite(lg).all())}
    if name == "converted":
        out["maxdiff"] = float(np.abs(lg.numpy() - ours).max())
        out["ce"] = float(torch.nn.functional.cross_entropy(lg.view(-1, V), y.view(-1)))
print(json.dumps(out))
"""


def check_transformers(tmp, saved):
    """transformers' MixtralForCausalLM (LLMC_TRANSFORMERS_PYTHON where set, else test_lora's
    build/pyref) on ./hf_convert's directory of a reference model without RoPE scaling (transformers
    4.36's Mixtral has none): the reference's logits and CE; the --save-hf directory loads with no
    missing or unexpected keys. Its 4.36 aux loss is the broken one: not compared."""
    py, env = os.environ.get("LLMC_TRANSFORMERS_PYTHON"), ENV
    if not py:  # test_lora's reference libraries (transformers 4.36.2 in build/pyref, installed when missing)
        import test_lora
        if not test_lora.ensure_pyref():
            return  # reported as a FAIL by ensure_pyref
        py, env = PY, {**test_lora.pyenv(), **ENV}
    files = reference(tmp, "tf", ["--experts", "4", "--top-k", "2", "--rope-factor", "0", "--theta", "500000",
                                  "--steps", "1"])
    conv = os.path.join(tmp, "tf_hf")
    c = run(["./hf_convert", files["model.bin"], conv])
    p = subprocess.run([py, "-c", TRANSFORMERS_CHECK, conv, files["state.bin"], saved], capture_output=True, text=True,
                       timeout=600, env=env)
    try:
        got = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        got = {}
    ce = float(np.fromfile(files["stats.bin"], "<f4")[0])
    report(c.returncode == 0 and got.get("maxdiff", 1) <= 1e-4 and abs(got.get("ce", 0) - ce) <= 1e-5 * ce
           and not got["converted"]["missing"] and not got["converted"]["unexpected"],
           f"transformers {got.get('version', '?')} MixtralForCausalLM on ./hf_convert's directory: the reference's "
           "logits and CE", json.dumps(got)[:600] + p.stderr[-600:])
    sv = got.get("saved", {})
    report(sv.get("finite") and not sv.get("missing") and not sv.get("unexpected"),
           "transformers' MixtralForCausalLM.from_pretrained loads the --save-hf directory (no missing or unexpected "
           "keys)", json.dumps(sv)[:400])


def patch_header(src, dst, slot, fmt, value):
    raw = bytearray(open(src, "rb").read())
    raw[4 * slot:4 * slot + 4] = struct.pack(fmt, value)
    open(dst, "wb").write(raw)


def check_errors(tmp, hf, shard, files):
    e = lambda name, cmd, pattern: expect_error(name, run(cmd), pattern)  # noqa: E731
    base = ["-i", shard, "-j", shard, "-b", str(B), "-t", str(T), "-x", "1", "--threads", "1"]
    # descriptors
    p = run(["./train_gpt_cpu", "-e", "mixtral:d1-e4-k1", "-i", shard, "-j", shard, "-b", "1", "-t", "16", "-x", "2",
             "-v", "0", "-s", "0", "--threads", "1", "-o", os.path.join(tmp, "run_desc")])
    recs = [r for r in records(os.path.join(tmp, "run_desc")) if "train_loss" in r] if p.returncode == 0 else []
    report(len(recs) == 2 and all("train_aux" in r and r["expert_tokens_max"] >= r["expert_tokens_min"] for r in recs),
           "-e mixtral:d1-e4-k1 (random init) trains 2 steps", (p.stdout + p.stderr)[-800:])
    # --plan: total and active parameters (K of E experts per token), the grouped buffers B T K rows
    p = run(["./train_gpt_cpu", "--plan", "-e", "mixtral:d2-e8-k2", "-b", "2", "-t", "64"])
    C2, L2, F2, E2, K2 = 128, 2, 512, 8, 2  # llama3:d2's C and F (multiplier 1, multiple of 256)
    line = next((x for x in p.stdout.splitlines() if x.startswith("memory plan (CPU")), "")
    try:
        total = int(line.split("): ")[1].split(" parameters")[0])
        active = int(line.split("top-2: ")[1].split(" active")[0])
    except (IndexError, ValueError):
        total = active = -1
    experts = L2 * E2 * 3 * F2 * C2
    report(p.returncode == 0 and active == total - experts + experts * K2 // E2 and "grouped expert rows B*T*K = 256" in line
           and "moe_h      (L, NK, 2F)" in p.stdout,
           "--plan -e mixtral:d2-e8-k2: total and active parameters, the grouped expert buffers (B T K rows)",
           (p.stdout + p.stderr)[:600])
    e("-e mixtral:d1-e2-k3 (top-k > E): a clear error", ["./train_gpt_cpu", "-e", "mixtral:d1-e2-k3"] + base,
      "top-k 3 must be in [1, experts 2]")
    e("-e mixtral:d1-e4-k0 (top-k < 1): a clear error", ["./train_gpt_cpu", "-e", "mixtral:d1-e4-k0"] + base,
      "-e mixtral:d1-e4-k0: not a Mixtral descriptor")
    # checkpoint header: coefficient negative / NaN, top-k > E
    for what, slot, fmt, value, want in (("a negative aux coefficient", 27, "<f", -0.5,
                                          "router aux loss coefficient -0.5 must be finite and >= 0"),
                                         ("a NaN aux coefficient", 27, "<f", float("nan"),
                                          "router aux loss coefficient nan must be finite and >= 0"),
                                         ("top-k above E", 25, "<i", 5, "top-k 5 must be in [1, experts 4]"),
                                         ("top-k 0", 25, "<i", 0, "top-k 0 must be in [1, experts 4]")):
        bad = os.path.join(tmp, "bad.bin")
        patch_header(files["model.bin"], bad, slot, fmt, value)
        e(f"a Mixtral checkpoint with {what}: a clear error naming the file", ["./train_gpt_cpu", "-e", bad] + base,
          f"'{bad}': invalid Mixtral checkpoint header: " + want)
    # HF directories
    def hf_variant(name, config=None, drop=None, reshape=None):
        from safetensors.numpy import load_file, save_file
        d = os.path.join(tmp, name)
        os.makedirs(d)
        c = json.load(open(os.path.join(hf, "config.json")))
        c.update(config or {})
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write(json.dumps(c))
        t = load_file(os.path.join(hf, "model.safetensors"))
        if drop:
            del t[drop]
        if reshape:
            t[reshape] = t[reshape][:-1]
        save_file(t, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        return d
    key = "model.layers.1.block_sparse_moe.experts.3.w2.weight"
    d = hf_variant("hf_missing", drop=key)
    e("an HF Mixtral directory without an expert tensor: a clear error naming the key",
      ["./train_gpt_cpu", "-e", d] + base, f"has no tensor '{key}'")
    d = hf_variant("hf_shape", reshape="model.layers.0.block_sparse_moe.experts.2.w1.weight")
    e("an HF Mixtral directory with a mis-shaped expert tensor: a clear error naming the key and file",
      ["./train_gpt_cpu", "-e", d] + base, "tensor 'model.layers.0.block_sparse_moe.experts.2.w1.weight' (in '")
    d = hf_variant("hf_gate", reshape="model.layers.0.block_sparse_moe.gate.weight")
    e("an HF Mixtral directory with a mis-shaped router: a clear error naming the key",
      ["./train_gpt_cpu", "-e", d] + base, "tensor 'model.layers.0.block_sparse_moe.gate.weight' (in '")
    d = hf_variant("hf_topk", config={"num_experts_per_tok": 5})
    e("config.json num_experts_per_tok > num_local_experts: a clear error naming the file",
      ["./train_gpt_cpu", "-e", d] + base, "num_experts_per_tok 5 is more than num_local_experts 4")
    d = hf_variant("hf_coef", config={"router_aux_loss_coef": -0.1})
    e("config.json router_aux_loss_coef negative: a clear error naming the file",
      ["./train_gpt_cpu", "-e", d] + base, "router_aux_loss_coef is not a finite number >= 0")
    d = hf_variant("hf_noexp", config={"num_local_experts": None})
    e("config.json without num_local_experts: a clear error", ["./train_gpt_cpu", "-e", d] + base,
      "num_local_experts is missing")
    d = hf_variant("hf_window", config={"sliding_window": 16})
    e("config.json sliding_window below the context: a clear error", ["./train_gpt_cpu", "-e", d] + base,
      "sliding_window 16 is less than max_position_embeddings 64")
    e("-ep 2 with one process: a clear error (expert parallelism needs ranks: test/test_moe_ep.py)",
      ["./train_gpt_cpu", "-e", hf, "-ep", "2"] + base, "-ep 2 with one process: expert parallelism needs")
    # ./generate: greedy decoding (the KV cache) equals the reference's (a decode-only tokenizer whose
    # token i reads "<i>", end-of-text V - 1)
    tok = os.path.join(tmp, "tok.bin")
    with open(tok, "wb") as f:
        f.write(struct.pack("<256I", *([20240328, 2, V, V - 1] + [0] * 252)))
        for i in range(V):
            f.write(bytes([len(f"<{i}>")]) + f"<{i}>".encode())
    g = run(["./generate", "-e", files["model.bin"], "--tokenizer", tok, "--prompt", "", "-g", "20", "--temperature", "0"])
    got = [int(t) for t in g.stdout.replace(">", "").split("<")[1:]]
    r = run([PY, REF, "--save-model", os.path.join(tmp, "greedy_model.bin"), "--greedy", "20", "--experts", "4",
             "--top-k", "2", "--vocab", str(V)])
    want = [int(t) for line in r.stdout.splitlines() if line.startswith("GREEDY ") for t in line.split()[1:]]
    report(g.returncode == 0 and r.returncode == 0 and len(want) > 0 and got == want,
           "./generate -e <Mixtral>: greedy tokens (KV-cache decode) equal the PyTorch reference's greedy decoding",
           f"got {got}, reference {want}: {g.stderr[-400:]}{r.stderr[-400:]}")
    for b, want in (("build/cudasim/train_gpt", "is a Mixtral model: the CUDA trainer has no block sequence for it yet"),
                    ("build/cudasim/generate", "is a Mixtral model: ./generate_gpu runs GPT-2 only")):
        if not os.path.exists(b):
            print(f"SKIP: {b} not built")
            continue
        for init in (files["model.bin"], "mixtral:d1", hf):
            flags = ["-g", "1"] if b.endswith("generate") else base
            e(f"{b} -e {os.path.basename(init.rstrip('/'))}: refused naming the architecture", [b, "-e", init] + flags,
              f"-e {init} {want}")


def check_runs(tmp, hf, shard):
    """resume byte-identical; 2 ranks over -pi fs at -z 0 and -z 3 as one process accumulating"""
    args = ["-e", hf, "-i", shard, "-j", shard, "-b", "2", "-t", str(T), "-v", "0", "-s", "0", "--threads", "1",
            "-l", "1e-3", "-k", "constant"]
    full, part = os.path.join(tmp, "res_full"), os.path.join(tmp, "res_part")
    p1 = run(["./train_gpt_cpu"] + args + ["-x", "3", "-n", "1", "-o", full])
    ok = p1.returncode == 0
    if ok:
        shutil.copytree(full, part)
        for f in os.listdir(part):
            if "00000003" in f:
                path = os.path.join(part, f)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    p2 = run(["./train_gpt_cpu"] + args + ["-x", "3", "-n", "1", "-o", part, "-y", "1"]) if ok else p1
    same = lambda a, b: open(a, "rb").read() == open(b, "rb").read()  # noqa: E731
    report(ok and p2.returncode == 0 and "resumed from step 2" in p2.stdout and
           same(os.path.join(full, "model_00000003.bin"), os.path.join(part, "model_00000003.bin")) and
           same(os.path.join(full, "state_00000003_00000.bin"), os.path.join(part, "state_00000003_00000.bin")),
           "-y 1 from step 2 writes step 3's model and state byte-identical to the uninterrupted run",
           (p1.stderr + p2.stdout + p2.stderr)[-800:])
    env = {"TRAINER": "./train_gpt_cpu"}
    outs = {}
    for z in ("0", "3"):
        outs[z] = os.path.join(tmp, f"two{z}")
        q = subprocess.run(["scripts/run_dist.sh", "local", "2", "--pi", "fs"] + args + ["-x", "2", "-n", "2", "-z", z,
                           "-o", outs[z]], capture_output=True, text=True, timeout=600, env={**ENV, **env})
        if q.returncode != 0:
            print(q.stdout[-800:], q.stderr[-800:])
    one = os.path.join(tmp, "one")
    q1 = run(["./train_gpt_cpu"] + args + ["-x", "2", "-n", "2", "-d", str(4 * T), "-o", one])
    m = lambda d: os.path.join(d, "model_00000002.bin")  # noqa: E731
    okz = all(os.path.exists(m(d)) for d in outs.values()) and same(m(outs["0"]), m(outs["3"]))
    report(okz, "2 ranks over -pi fs: -z 3 (parameter shards, expert tensors in the layer buckets) gives -z 0's "
           "model byte for byte", "")
    a = losses_of(one) if q1.returncode == 0 else []
    b = losses_of(outs["0"]) if okz else []
    report(len(a) == 2 and len(b) == 2 and all(abs(x - y) <= 1e-5 * x for x, y in zip(a, b)),
           "2 ranks over -pi fs: the losses of one process accumulating the same batch (-d)", f"{b} vs {a}")


def main():
    tmp = tempfile.mkdtemp(prefix="llmc_moe_")
    try:
        check_cpu_vs_reference(tmp)
        hf, shard, files = check_hf(tmp)
        check_runs(tmp, hf, shard)
        check_errors(tmp, hf, shard, files)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return failed_count()


if __name__ == "__main__":
    sys.exit(main())
