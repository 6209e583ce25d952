#!/usr/bin/env bash
# make bench-moe (a benchmark, not a test): ./train_gpt_cpu's tokens/s on a Mixtral (E experts, top-K)
# against the dense Llama with the same active parameters per token (the same attention, one SwiGLU
# MLP of K x the expert's width), same data, -b, -t and threads, run alternately BENCH_ROUNDS times
# in this one invocation. Prints each model's parameters (total / active), tokens/s, and the ratio
# MoE / dense (issue 24's target: >= 0.8, the extra work being the router and the permutation).
# Both models are Hugging Face directories written here with random weights (numpy + safetensors).
# Env: BENCH_STEPS (default 6, first excluded), BENCH_ROUNDS (2), BENCH_E (8), BENCH_K (2),
# BENCH_C (256), BENCH_L (4), BENCH_F (512, one expert's width), BENCH_B (8), BENCH_T (128),
# BENCH_THREADS (2).
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/bench_moe
mkdir -p "$out"
steps=${BENCH_STEPS:-6}
rounds=${BENCH_ROUNDS:-2}
b=${BENCH_B:-8}
t=${BENCH_T:-128}
threads=${BENCH_THREADS:-2}
/usr/bin/python3 - "$out" "${BENCH_E:-8}" "${BENCH_K:-2}" "${BENCH_C:-256}" "${BENCH_L:-4}" "${BENCH_F:-512}" "$t" <<'PY'
import json, os, random, struct, sys
from safetensors.numpy import save_file
sys.path.insert(0, "test")
from hf_tiny import decoder_tensors  # noqa: E402 (the Llama-family tensors at these sizes)
out, E, K, C, L, F, T = sys.argv[1], *map(int, sys.argv[2:])
V, NH, NKV = 4096, 8, 4
def config(arch, ffn, **extra):
    c = {"architectures": [arch], "vocab_size": V, "hidden_size": C, "intermediate_size": ffn,
         "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV,
         "max_position_embeddings": max(T, 256), "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": None,
         "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "float32"}
    c.update(extra)
    return c
def write(name, cfg, ffn):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=1)
    save_file(decoder_tensors(0, ffn, v=V, c=C, layers=L, kv=NKV * (C // NH)), os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
def moe(p, g):
    t = {p + "block_sparse_moe.gate.weight": g(E, C)}
    for e in range(E):
        q = p + f"block_sparse_moe.experts.{e}."
        t.update({q + "w1.weight": g(F, C), q + "w3.weight": g(F, C), q + "w2.weight": g(C, F)})
    return t
write("moe", config("MixtralForCausalLM", F, num_local_experts=E, num_experts_per_tok=K, router_aux_loss_coef=0.02,
                    output_router_logits=True, sliding_window=None), moe)
write("dense", config("LlamaForCausalLM", K * F),
      lambda p, g: {p + "mlp.gate_proj.weight": g(K * F, C), p + "mlp.up_proj.weight": g(K * F, C),
                    p + "mlp.down_proj.weight": g(C, K * F)})
r = random.Random(0)
n = 64 * 8 * 256 + 1
with open(os.path.join(out, "tokens.bin"), "wb") as f:
    f.write(struct.pack("<256i", 20240801, 7, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}I", *(r.randrange(V) for _ in range(n))))
PY
flags=(-i "$out/tokens.bin" -b "$b" -t "$t" -x "$steps" -v 0 -s 0 --threads "$threads" --overwrite 1)
for r in $(seq "$rounds"); do
    for m in moe dense; do
        ./train_gpt_cpu -e "$out/$m" "${flags[@]}" -o "$out/run_${m}_$r" > "$out/run_${m}_$r.txt"
    done
done
/usr/bin/python3 - "$out" "$rounds" "$b" "$t" <<'PY'
import json, re, sys
out, rounds, B, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
res = {}
for m in ("moe", "dense"):
    ms = []
    for r in range(1, rounds + 1):
        steps = [x for x in map(json.loads, open(f"{out}/run_{m}_{r}/log.jsonl")) if "step_ms" in x][1:]
        ms += [x["step_ms"] for x in steps]
    text = open(f"{out}/run_{m}_1.txt").read()
    params = re.search(r"(\d+) parameters", text)
    active = re.search(r"\((\d+) active per token", text)  # the Mixtral's memory line
    res[m] = (B * T * 1000.0 / (sum(ms) / len(ms)), params.group(1) if params else "?",
              active.group(1) if active else (params.group(1) if params else "?"), len(ms))
print(f"bench-moe: ./train_gpt_cpu, -b {B} -t {T}, {res['moe'][3]} timed steps per model over {rounds} alternating rounds")
for m, name in (("moe", "Mixtral"), ("dense", "dense Llama")):
    tps, total, active, _ = res[m]
    print(f"  {name:12s} {tps:10.0f} tokens/s  ({total} parameters, {active} active per token)")
print(f"  ratio MoE / dense: {res['moe'][0] / res['dense'][0]:.2f} (target >= 0.8)")
PY
