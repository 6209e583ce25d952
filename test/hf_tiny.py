"""Tiny Hugging Face directories written from Python (numpy + safetensors, no transformers), for
test/test_hf_hostile.py and the hostile driver's "HF directories" category (test/hostile.d/30-hf.py):
a LlamaForCausalLM (V 256, C 32, L 1, NH 2, NKV 1, F 64, maxT 64, untied head) with a few tokenizer
files, and a GPT2LMHeadModel of the same vocabulary. Keys, shapes and config.json fields are
transformers' (hf.h documents them); the weights are random."""
import json
import os

import numpy as np
from safetensors.numpy import save_file

V, C, L, NH, NKV, F, MAXT = 256, 32, 1, 2, 1, 64, 64
HS = C // NH


def llama_config(**extra):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": C,
         "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV,
         "max_position_embeddings": MAXT, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
         "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 32},
         "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
         "pad_token_id": None, "pretraining_tp": 1, "transformers_version": "4.45.0", "torch_dtype": "float32"}
    c.update(extra)
    return c


def decoder_tensors(seed, ffn, v=V, c=C, layers=L, kv=NKV * HS):
    """A Llama-family decoder's tensors (these sizes unless given: vocabulary v, width c, layers, kv =
    NKV x HS; untied head) with N(0, 0.02) weights and unit norms drawn from seed; ffn(prefix, g) gives
    each layer's feed-forward tensors (g(*shape) draws one)."""
    rng = np.random.default_rng(seed)
    g = lambda *s: (rng.standard_normal(s) * 0.02).astype(np.float32)  # noqa: E731
    t = {"model.embed_tokens.weight": g(v, c), "model.norm.weight": np.ones(c, np.float32),
         "lm_head.weight": g(v, c)}
    for layer in range(layers):
        p = f"model.layers.{layer}."
        t[p + "input_layernorm.weight"] = np.ones(c, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(c, np.float32)
        t[p + "self_attn.q_proj.weight"] = g(c, c)
        t[p + "self_attn.k_proj.weight"] = g(kv, c)
        t[p + "self_attn.v_proj.weight"] = g(kv, c)
        t[p + "self_attn.o_proj.weight"] = g(c, c)
        t.update(ffn(p, g))
    return t


def llama_tensors(seed=1):
    return decoder_tensors(seed, lambda p, g: {p + "mlp.gate_proj.weight": g(F, C), p + "mlp.up_proj.weight": g(F, C),
                                               p + "mlp.down_proj.weight": g(C, F)})


TOKENIZER_JSON = '{"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}\n'
TOKENIZER_CONFIG = '{"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}\n'


def write_llama(d, config=None, tensors=None, tokenizer=True):
    """d as an HF Llama directory: config.json (llama_config() unless given), model.safetensors,
    and with tokenizer tokenizer.json and tokenizer_config.json."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(llama_config() if config is None else config, f, indent=2)
    save_file(llama_tensors() if tensors is None else tensors, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
    if tokenizer:
        open(os.path.join(d, "tokenizer.json"), "w").write(TOKENIZER_JSON)
        open(os.path.join(d, "tokenizer_config.json"), "w").write(TOKENIZER_CONFIG)
    return d


def gpt2_config(**extra):
    c = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V, "n_positions": MAXT,
         "n_ctx": MAXT, "n_embd": C, "n_layer": L, "n_head": NH, "bos_token_id": 0, "eos_token_id": 0,
         "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}}}
    c.update(extra)
    return c


def gpt2_tensors(seed=2):
    rng = np.random.default_rng(seed)
    g = lambda *s: (rng.standard_normal(s) * 0.02).astype(np.float32)  # noqa: E731
    t = {"transformer.wte.weight": g(V, C), "transformer.wpe.weight": g(MAXT, C),
         "transformer.ln_f.weight": np.ones(C, np.float32), "transformer.ln_f.bias": np.zeros(C, np.float32)}
    for layer in range(L):
        p = f"transformer.h.{layer}."
        t[p + "ln_1.weight"] = np.ones(C, np.float32)
        t[p + "ln_1.bias"] = np.zeros(C, np.float32)
        t[p + "ln_2.weight"] = np.ones(C, np.float32)
        t[p + "ln_2.bias"] = np.zeros(C, np.float32)
        t[p + "attn.c_attn.weight"] = g(C, 3 * C)
        t[p + "attn.c_attn.bias"] = np.zeros(3 * C, np.float32)
        t[p + "attn.c_proj.weight"] = g(C, C)
        t[p + "attn.c_proj.bias"] = np.zeros(C, np.float32)
        t[p + "mlp.c_fc.weight"] = g(C, 4 * C)
        t[p + "mlp.c_fc.bias"] = np.zeros(4 * C, np.float32)
        t[p + "mlp.c_proj.weight"] = g(4 * C, C)
        t[p + "mlp.c_proj.bias"] = np.zeros(C, np.float32)
    return t


def write_gpt2(d, config=None, tensors=None):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(gpt2_config() if config is None else config, f, indent=2)
    save_file(gpt2_tensors() if tensors is None else tensors, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
    return d


def train_args(tmp, init, *more):
    """The trainer's flags for a tiny run of init on shards of V tokens written into tmp."""
    from testlib import write_shard
    rng = np.random.default_rng(3)
    tr, va = os.path.join(tmp, "hf_train.bin"), os.path.join(tmp, "hf_val.bin")
    if not os.path.exists(tr):
        write_shard(tr, [int(x) for x in rng.integers(0, V, 3000)])
        write_shard(va, [int(x) for x in rng.integers(0, V, 600)])
    return ["-e", init, "-i", tr, "-j", va, "-b", "2", "-t", "16", "-v", "0", "-s", "0", "-l", "1e-3"] + list(more)
