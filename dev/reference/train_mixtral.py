#!/usr/bin/env python3
"""train_mixtral.py - the PyTorch Mixtral that llmc's CPU Mixtral model (llmc/models/mixtral.h) is checked against.

A clean implementation following transformers' MixtralForCausalLM (modeling_mixtral.py): the Llama
block (train_llama3.py: RMSNorm, GQA, RoPE with Llama 3.1 scaling) whose MLP is a sparse mixture:

    router logits = h gatew[l]^T (E per token); p = softmax(router logits) in fp32
    top-k experts of p (ties: the lower expert index; a stable sort), weights p / sum(top-k p)
    out[t] = sum_j weight_j * (silu(h W1_e^T) * (h W3_e^T)) W2_e^T,  e = the j-th chosen expert
    (dropless: each expert computes every token routed to it, transformers' loop over experts)

The auxiliary loss is transformers >= 4.37's load_balancing_loss_func (no attention mask): the
router logits of all layers concatenated, p = softmax, the same top-k, aux = E * sum over (slot,
expert) of mean(one_hot(selected)) * mean(p); loss = CE + router_aux_loss_coef * aux when
output_router_logits (4.36.2's version is a constant E/k without gradient: not this).

Tensors (llmc's table, one nn.Parameter each; the Llama's with fcw/fcprojw replaced):
    gatew    (L, E, C)      decay   N(0, 0.02)             HF block_sparse_moe.gate
    expfcw   (L, E, 2F, C)  decay   N(0, 0.02)             rows [w1 (gate): F | w3 (up): F]
    expprojw (L, E, C, F)   decay   N(0, 0.02/sqrt(2L))    HF w2
Files: llmc's Mixtral checkpoint (llmc/formats/mixtralfile.h: magic 20261130, architecture 3,
[24] E [25] K [26] output_router_logits [27] coef), the debug state in train_llama3.py's layout,
--moe-stats (float32: CE, aux, then each layer's E tokens per expert), and --hf-dir: the model as
an HF MixtralForCausalLM directory (safetensors, q/k rows in HF's rotate-half order).
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_gpt2 as ref  # noqa: E402
import train_llama3 as ll  # noqa: E402

ARCH_MIXTRAL = 3


class MixtralConfig(ll.LlamaConfig):
    def __init__(self, *args, experts=8, top_k=2, aux_coef=0.02, router_logits=True, tied=False, **kw):
        super().__init__(*args, **kw)
        if not 1 <= top_k <= experts:
            raise ValueError("config: 1 <= top_k <= experts")
        self.experts, self.top_k, self.aux_coef, self.router_logits, self.tied = experts, top_k, aux_coef, router_logits, tied


def param_table(cfg):
    L, C, Vp, F, E = cfg.n_layer, cfg.channels, cfg.padded_vocab, cfg.ffn, cfg.experts
    QKV = (cfg.n_head + 2 * cfg.n_kv_head) * (C // cfg.n_head)
    rows = [
        ("wte", (Vp, C), True, "normal"),
        ("ln1w", (L, C), False, "ones"),
        ("qkvw", (L, QKV, C), True, "normal"),
        ("attprojw", (L, C, C), True, "normal_proj"),
        ("ln2w", (L, C), False, "ones"),
        ("gatew", (L, E, C), True, "normal"),
        ("expfcw", (L, E, 2 * F, C), True, "normal"),
        ("expprojw", (L, E, C, F), True, "normal_proj"),
        ("lnfw", (C,), False, "ones"),
    ]
    return rows if cfg.tied else rows + [("lm_head", (Vp, C), True, "normal")]


def route(router_logits, top_k):
    """softmax in fp32, the top-k (stable: ties to the lower expert index), renormalised weights"""
    p = router_logits.float().softmax(dim=-1)
    order = torch.sort(p.detach(), dim=-1, descending=True, stable=True).indices
    selected = order[:, :top_k]
    w = p.gather(1, selected)
    return p, selected, w / w.sum(dim=-1, keepdim=True)


def load_balancing_loss(router_logits_per_layer, E, top_k):
    """transformers >= 4.37's load_balancing_loss_func without an attention mask"""
    logits = torch.cat(router_logits_per_layer, dim=0)
    p, selected, _ = route(logits, top_k)
    expert_mask = torch.nn.functional.one_hot(selected, E)          # (rows, k, E)
    tokens_per_expert = expert_mask.float().mean(dim=0)             # (k, E)
    router_prob_per_expert = p.mean(dim=0)                          # (E)
    return (tokens_per_expert * router_prob_per_expert.unsqueeze(0)).sum() * E


class Mixtral(ll.TableModel):
    def __init__(self, cfg, tensors):
        super().__init__(cfg, tensors, param_table)

    def forward(self, idx, targets=None):
        cfg = self.cfg
        B, T = idx.shape
        C, NH, NKV, F, V, E, K = cfg.channels, cfg.n_head, cfg.n_kv_head, cfg.ffn, cfg.vocab_size, cfg.experts, cfg.top_k
        HS = C // NH
        angles = torch.arange(T, dtype=torch.float64)[:, None] * ll.rope_inv_freq(cfg)[None, :]
        cos, sin = angles.cos().to(self.wte.dtype), angles.sin().to(self.wte.dtype)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        x = self.wte[idx]
        router_logits, self.expert_tokens = [], []
        for l in range(cfg.n_layer):
            h = ll.rmsnorm(x, self.ln1w[l], cfg.eps)
            q, k, v = (h @ self.qkvw[l].t()).split([NH * HS, NKV * HS, NKV * HS], dim=-1)
            q = ll.rope(q.view(B, T, NH, HS).transpose(1, 2), cos, sin)
            k = ll.rope(k.view(B, T, NKV, HS).transpose(1, 2), cos, sin)
            v = v.view(B, T, NKV, HS).transpose(1, 2)
            qg = q.view(B, NKV, NH // NKV, T, HS)
            att = (qg @ k.unsqueeze(2).transpose(-2, -1)) * (1.0 / math.sqrt(HS))
            att = att.masked_fill(future, float("-inf")).softmax(dim=-1)
            y = (att @ v.unsqueeze(2)).view(B, NH, T, HS).transpose(1, 2).reshape(B, T, C)
            x = x + y @ self.attprojw[l].t()
            h = ll.rmsnorm(x, self.ln2w[l], cfg.eps).view(B * T, C)
            logits_r = h @ self.gatew[l].t()
            router_logits.append(logits_r)
            _, selected, w = route(logits_r, K)
            out = torch.zeros_like(h)
            counts = []
            for e in range(E):  # transformers' loop over experts
                tok, slot = torch.where(selected == e)
                counts.append(int(tok.numel()))
                if tok.numel() == 0:
                    continue
                g, u = (h[tok] @ self.expfcw[l, e].t()).split([F, F], dim=-1)
                ye = (torch.nn.functional.silu(g) * u) @ self.expprojw[l, e].t()
                out = out.index_add(0, tok, ye * w[tok, slot, None])
            self.expert_tokens.append(counts)
            x = x + out.view(B, T, C)
        head = self.wte if cfg.tied else self.lm_head
        logits = ll.rmsnorm(x, self.lnfw, cfg.eps) @ head.t()
        if targets is None:
            return logits, None
        self.ce = ref.cross_entropy(logits, targets, V)
        self.aux = load_balancing_loss(router_logits, E, K)
        loss = self.ce + cfg.aux_coef * self.aux if cfg.router_logits else self.ce
        return logits, loss


def init_tensors(cfg, seed):
    return ll.init_table_tensors(param_table, cfg, seed, ("wte",) if cfg.tied else ("wte", "lm_head"))


def header(cfg):
    f = lambda v: struct.pack("<f", v)  # noqa: E731
    return ref.header_bytes({0: ll.LLAMA_MAGIC, 1: ll.LLAMA_VERSION, 2: ARCH_MIXTRAL, 3: cfg.max_seq_len,
                             4: cfg.vocab_size, 5: cfg.padded_vocab, 6: cfg.n_layer, 7: cfg.n_head,
                             8: cfg.n_kv_head, 9: cfg.channels, 10: cfg.ffn, 11: int(cfg.tied),
                             16: f(cfg.eps), 17: f(cfg.theta), 18: f(cfg.factor), 19: f(cfg.low),
                             20: f(cfg.high), 21: cfg.original, 24: cfg.experts, 25: cfg.top_k,
                             26: int(cfg.router_logits), 27: f(cfg.aux_coef)})


def save_model(path, cfg, tensors):
    ll.save_table_model(path, header(cfg), [name for name, _, _, _ in param_table(cfg)], tensors)


def hf_rotate_half_rows(w, heads, HS):
    """our interleaved RoPE rows -> HF's rotate-half order (per head: even channels, then odd)"""
    w = w.reshape(heads, HS // 2, 2, -1)
    return w.transpose(1, 2).reshape(heads * HS, -1)


def hf_tensors(cfg, t):
    """the HF MixtralForCausalLM state dict (numpy float32) of our tensors t"""
    C, NH, NKV, F = cfg.channels, cfg.n_head, cfg.n_kv_head, cfg.ffn
    HS, V = C // NH, cfg.vocab_size
    n = lambda x: x.detach().float().contiguous().numpy().copy()  # noqa: E731
    out = {"model.embed_tokens.weight": n(t["wte"][:V]), "model.norm.weight": n(t["lnfw"])}
    if not cfg.tied:
        out["lm_head.weight"] = n(t["lm_head"][:V])
    for l in range(cfg.n_layer):
        p = f"model.layers.{l}."
        q, k, v = t["qkvw"][l].split([NH * HS, NKV * HS, NKV * HS], dim=0)
        out[p + "input_layernorm.weight"] = n(t["ln1w"][l])
        out[p + "post_attention_layernorm.weight"] = n(t["ln2w"][l])
        out[p + "self_attn.q_proj.weight"] = n(hf_rotate_half_rows(q, NH, HS))
        out[p + "self_attn.k_proj.weight"] = n(hf_rotate_half_rows(k, NKV, HS))
        out[p + "self_attn.v_proj.weight"] = n(v)
        out[p + "self_attn.o_proj.weight"] = n(t["attprojw"][l])
        out[p + "block_sparse_moe.gate.weight"] = n(t["gatew"][l])
        for e in range(cfg.experts):
            q = p + f"block_sparse_moe.experts.{e}."
            out[q + "w1.weight"] = n(t["expfcw"][l, e, :F])
            out[q + "w3.weight"] = n(t["expfcw"][l, e, F:])
            out[q + "w2.weight"] = n(t["expprojw"][l, e])
    return out


def hf_config(cfg):
    c = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": cfg.vocab_size,
         "hidden_size": cfg.channels, "intermediate_size": cfg.ffn, "num_hidden_layers": cfg.n_layer,
         "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_kv_head,
         "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.eps, "rope_theta": cfg.theta,
         "sliding_window": None, "tie_word_embeddings": cfg.tied, "hidden_act": "silu",
         "num_local_experts": cfg.experts, "num_experts_per_tok": cfg.top_k,
         "router_aux_loss_coef": cfg.aux_coef, "output_router_logits": cfg.router_logits,
         "torch_dtype": "float32"}
    if cfg.factor > 0:
        c["rope_scaling"] = {"rope_type": "llama3", "factor": cfg.factor, "low_freq_factor": cfg.low,
                             "high_freq_factor": cfg.high, "original_max_position_embeddings": cfg.original}
    return c


def write_hf_dir(d, cfg, tensors):
    from safetensors.numpy import save_file
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(hf_config(cfg), f, indent=2)
    save_file(hf_tensors(cfg, tensors), os.path.join(d, "model.safetensors"), metadata={"format": "pt"})


def main(argv=None):
    p = argparse.ArgumentParser(description="PyTorch reference Mixtral (llmc/models/mixtral.h layout)")
    for flag, default in (("--depth", 2), ("--channels", 64), ("--heads", 4), ("--kv-heads", 2),
                          ("--ffn", 96), ("--experts", 4), ("--top-k", 2), ("--max-seq-len", 64),
                          ("--vocab", 1000), ("--seed", 42), ("--batch-size", 4), ("--seq-len", 32),
                          ("--steps", 10), ("--rope-original", 16), ("--router-logits", 1), ("--tied", 0)):
        p.add_argument(flag, type=int, default=default)
    for flag, default in (("--theta", 10000.0), ("--rope-factor", 8.0), ("--rope-low", 1.0),
                          ("--rope-high", 4.0), ("--norm-eps", 1e-5), ("--lr", 1e-3), ("--aux-coef", 0.02)):
        p.add_argument(flag, type=float, default=default)
    p.add_argument("--zero-router", action="store_true", help="gate weights all zero (every router row ties)")
    p.add_argument("--save-model", required=True)
    p.add_argument("--debug-state", help="the debug state (logits, loss, gradients, --steps trajectory)")
    p.add_argument("--moe-stats", help="float32: CE, aux, each layer's tokens per expert (first forward)")
    p.add_argument("--hf-dir", help="also write the model as an HF MixtralForCausalLM directory")
    p.add_argument("--greedy", type=int, default=0, help="print the greedy continuation of [V-1] (N tokens)")
    a = p.parse_args(argv)
    torch.set_num_threads(os.cpu_count())
    torch.use_deterministic_algorithms(True)
    cfg = MixtralConfig(a.max_seq_len, a.vocab, a.depth, a.heads, a.kv_heads, a.channels, a.ffn,
                        eps=ref.f32(a.norm_eps), theta=ref.f32(a.theta), factor=ref.f32(a.rope_factor),
                        low=ref.f32(a.rope_low), high=ref.f32(a.rope_high), original=a.rope_original,
                        experts=a.experts, top_k=a.top_k, aux_coef=ref.f32(a.aux_coef),
                        router_logits=bool(a.router_logits), tied=bool(a.tied))
    tensors = init_tensors(cfg, a.seed)
    if a.zero_router:
        tensors["gatew"].zero_()
    save_model(a.save_model, cfg, tensors)
    if a.hf_dir:
        write_hf_dir(a.hf_dir, cfg, tensors)
    x, y, hp = ll.batch_and_hp(a, cfg)
    if a.moe_stats:
        model = Mixtral(cfg, ll.clone_tensors(tensors))
        with torch.no_grad():
            model(x, y)
        vals = [float(model.ce), float(model.aux)] + [c for layer in model.expert_tokens for c in layer]
        ref.atomic_write(a.moe_stats, lambda fh: fh.write(np.array(vals, dtype="<f4").tobytes()))
    if a.greedy:
        out, _ = ref.greedy_generate(Mixtral(cfg, ll.clone_tensors(tensors)), [cfg.vocab_size - 1],
                                     a.greedy, cfg.vocab_size - 1)
        print("GREEDY " + " ".join(str(t) for t in out))
    if a.debug_state:
        ll.write_reference_run(a.debug_state, Mixtral(cfg, ll.clone_tensors(tensors)), cfg, x, y, hp, a.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
