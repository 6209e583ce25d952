#!/usr/bin/env python3
"""step_model.py - a roofline model of one GPT-2 training step on a named GPU.

For a configuration (model, B, T, precision, recompute level, attention path) it lists every op
of the CUDA trainer's step (llmc/cuda/cudamodel.cuh's sequence) with the floating-point operations it
must do and the fewest bytes it must move through device memory (each input read once, each
output written once), and the roofline time: the larger of flops / peak and bytes / bandwidth.
The sum is the step time a trainer whose every kernel ran at the roofline would reach (kernels
run one after another: no overlap is assumed), so measured time / model time is the gap, op by op.

    scripts/step_model.py                         # GPT-2 124M, B=64, T=1024, bf16, H200
    scripts/step_model.py -e d24 -b 16 --gpu H100 -r 3
    scripts/step_model.py --measured-ms 280.4     # prints the gap against a measured step
    scripts/step_model.py --json                  # one JSON object (ops, totals)
    scripts/step_model.py -ge 0 --bias-grad kernel   # the trainer before GELU/bias-gradient fusion

Peaks are datasheet figures (dense, no sparsity); --peak-tflops / --bandwidth-tbs override them
with measured ceilings. MFU is reported as the trainers report it: 6N + 6LCT flops per token
(N parameters) over the step time and the peak.
"""
import argparse
import json
import sys

# name: (bf16/fp16 dense TFLOP/s, fp32 non-tensor TFLOP/s, tf32 dense TFLOP/s, HBM TB/s)
GPUS = {
    "H200": (989.0, 67.0, 494.0, 4.8),
    "H100": (989.0, 67.0, 494.0, 3.35),
    "A100": (312.0, 19.5, 156.0, 2.039),
}
DEPTHS = {12: 768, 24: 1024, 36: 1280, 48: 1600}  # GPT-2 124M/350M/774M/1558M


def model_shape(desc):
    d = desc.split(":")[-1]
    if not d.startswith("d") or not d[1:].isdigit() or int(d[1:]) < 1:
        raise SystemExit(f"error: -e {desc!r}: expected dN or gpt2:dN (e.g. d12)")
    L = int(d[1:])
    C = DEPTHS.get(L, 64 * L)
    NH = C // 64
    return {"L": L, "C": C, "NH": NH, "V": 50257, "Vp": 50304, "maxT": 1024, "F": 4 * C}


def num_parameters(m):
    """The parameter count of llmc/models/gpt2.h's GPT2_PARAMETERS table (wte padded to Vp)."""
    L, C, F, Vp, maxT = m["L"], m["C"], m["F"], m["Vp"], m["maxT"]
    per_layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C
    return Vp * C + maxT * C + L * per_layer + 2 * C


def step_ops(m, B, T, S, recompute, attention, gelu_fusion=2, bias_kernel=False):
    """[(name, count, flops, bytes)] for one step; S = bytes per stored activation/parameter.
    gelu_fusion: the trainer's -ge (1: the GELU in the fc product's epilogue, which also writes the
    pre-activation; 2: also gelu' in the fcproj dinp product's epilogue, which reads it);
    bias_kernel: bias gradients by a column-sum kernel that reads dout again (fp32, and 16-bit
    before the BGRADB epilogue) instead of the dweight product's epilogue."""
    L, C, F, Vp, NH = m["L"], m["C"], m["F"], m["Vp"], m["NH"]
    N = B * T
    f4 = 4  # fp32 statistics, master weights, moments
    ops = []

    def op(name, count, flops, nbytes):
        ops.append((name, count, float(flops), float(nbytes)))

    def mm(name, n, k, oc, count, bias=True, aux_fwd=0, aux_bwd=0):  # out (n, oc) = inp (n, k) @ w (oc, k)^T
        # aux_fwd / aux_bwd: GELU epilogue tensors written by the forward / read by dinp
        op(name + " fwd", count, 2 * n * k * oc, S * (n * k + oc * k + n * oc + (oc if bias else 0) + aux_fwd))
        # backward: dinp = dout @ w, dweight += dout^T @ inp (read and write dweight), dbias
        op(name + " bwd", count, 4 * n * k * oc,
           S * (2 * n * oc + oc * k + n * k + n * k + 2 * oc * k + (2 * oc if bias else 0) + aux_bwd))
        if bias and bias_kernel:
            op("bias grad " + name.split()[-1] + " (kernel)", count, n * oc, S * n * oc)

    op("encoder fwd", 1, 0, 4 * N + S * (2 * N * C + N * C))
    op("encoder bwd", 1, 0, 4 * N + S * (N * C + 2 * N * C))
    # per layer, forward: layer 0's ln1 is a plain layernorm; every other one (ln2, the next
    # layer's ln1, the final lnf) is fused with the residual add before it (read 2, write 2)
    op("layernorm fwd (first)", 1, 0, S * 2 * N * C + 2 * f4 * N)
    op("residual + layernorm fwd", 2 * L, 0, S * 4 * N * C + 2 * f4 * N)
    mm("matmul qkv", N, C, 3 * C, L)
    att_fwd = 2 * B * T * T * C  # QK^T and PV, causal half of 4 B T^2 C
    op("attention fwd", L, att_fwd, S * (3 * N * C + N * C) + f4 * B * NH * T)
    mm("matmul attproj", N, C, C, L)
    mm("matmul fc", N, C, F, L, aux_fwd=N * F if gelu_fusion >= 1 else 0)
    if gelu_fusion == 0:
        op("gelu fwd", L, 0, S * 2 * N * F)
    mm("matmul fcproj", N, F, C, L, aux_bwd=N * F if gelu_fusion >= 2 else 0)
    # recompute in backward (llmc's levels): 1 gelu, 2 also layernorm, 3 the whole block
    if recompute >= 1:
        op("gelu recompute", L, 0, S * 2 * N * F)
    if recompute >= 2:
        op("layernorm recompute", 2 * L, 0, S * 2 * N * C + 2 * f4 * N)
    if recompute >= 3:
        for name, k, oc in (("matmul qkv", C, 3 * C), ("matmul attproj", C, C), ("matmul fc", C, F)):
            op(name + " fwd (recompute)", L, 2 * N * k * oc, S * (N * k + oc * k + N * oc))
        op("attention fwd (recompute)", L, att_fwd, S * (3 * N * C + N * C))
    # per layer, backward
    if gelu_fusion < 2:
        op("gelu bwd", L, 0, S * 3 * N * F)
    # backward = 5 products (recomputed scores, dV, dP, dQ, dK) against the forward's 2
    op("attention bwd", L, 2.5 * att_fwd, S * (3 * N * C + 2 * N * C + 3 * N * C) + f4 * B * NH * T)
    # layernorm backward adds into the residual stream's gradient (read x, dout, dres; write dres):
    # the residual adds need no kernel of their own
    op("layernorm bwd", 2 * L, 0, S * 4 * N * C + 2 * f4 * N + 2 * S * 2 * C)
    # head
    mm("matmul lm head", N, C, Vp, 1, bias=False)
    op("classifier (softmax, loss, dlogits)", 1, 5 * N * Vp, S * 2 * N * Vp + f4 * N)
    op("layernorm bwd (final)", 1, 0, S * 4 * N * C + 2 * f4 * N)
    P = num_parameters(m)
    op("global grad norm", 1, 2 * P, S * P)
    # AdamW: read grad, param, m, v, master; write param, m, v, master
    op("AdamW", 1, 12 * P, S * 2 * P + f4 * 7 * P)
    return ops


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-e", default="d12", help="model descriptor dN (d12 = GPT-2 124M)")
    p.add_argument("-b", type=int, default=64, help="micro-batch B")
    p.add_argument("-t", type=int, default=1024, help="sequence length T")
    p.add_argument("-r", type=int, default=0, choices=(0, 1, 2, 3), help="recompute level")
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("-ge", type=int, default=2, choices=(0, 1, 2),
                   help="GELU fusion as the trainer's -ge (default 2: what its default -1 picks for GPT-2)")
    p.add_argument("--bias-grad", default="auto", choices=("auto", "kernel", "epilogue"),
                   help="bias gradients: the dweight product's epilogue or a column-sum kernel (auto: as "
                        "the trainer, the epilogue in bf16/fp16, the kernel in fp32)")
    p.add_argument("--gpu", default="H200", help="one of " + ", ".join(GPUS))
    p.add_argument("--peak-tflops", type=float, help="override the matrix peak (a measured ceiling)")
    p.add_argument("--bandwidth-tbs", type=float, help="override the memory bandwidth (TB/s)")
    p.add_argument("--measured-ms", type=float, help="a measured step time, to print the gap")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    if a.gpu not in GPUS:
        p.error(f"--gpu {a.gpu!r}: unknown (known: {', '.join(GPUS)}); give --peak-tflops and --bandwidth-tbs with a known one")
    if a.b < 1 or a.t < 1:
        p.error("-b and -t must be positive")
    m = model_shape(a.e)
    if a.t > m["maxT"]:
        p.error(f"-t {a.t} is above the model's maxT {m['maxT']}")
    bf16_peak, fp32_peak, _, bw = GPUS[a.gpu]
    peak = (a.peak_tflops or (fp32_peak if a.precision == "fp32" else bf16_peak)) * 1e12
    bw = (a.bandwidth_tbs or bw) * 1e12
    S = 4 if a.precision == "fp32" else 2
    bias_kernel = a.bias_grad == "kernel" or (a.bias_grad == "auto" and a.precision == "fp32")
    ops = step_ops(m, a.b, a.t, S, a.r, "own", a.ge, bias_kernel)
    rows = []
    for name, count, flops, nbytes in ops:
        tc, tm = count * flops / peak, count * nbytes / bw
        rows.append({"op": name, "count": count, "flops": count * flops, "bytes": count * nbytes,
                     "compute_ms": tc * 1e3, "memory_ms": tm * 1e3, "roofline_ms": max(tc, tm) * 1e3,
                     "bound": "compute" if tc >= tm else "memory"})
    total_ms = sum(r["roofline_ms"] for r in rows)
    tokens = a.b * a.t
    P = num_parameters(m)
    flops_per_token = 6 * P + 6 * m["L"] * m["C"] * a.t
    out = {"gpu": a.gpu, "model": a.e, "B": a.b, "T": a.t, "precision": a.precision, "recompute": a.r,
           "gelu_fusion": a.ge, "bias_grad": "kernel" if bias_kernel else "epilogue",
           "parameters": P, "peak_tflops": peak / 1e12, "bandwidth_tbs": bw / 1e12,
           "step_ms": total_ms, "tokens_per_s": tokens / (total_ms / 1e3),
           "mfu": flops_per_token * tokens / (total_ms / 1e3) / peak,
           "matmul_flops": sum(r["flops"] for r in rows if r["op"].startswith("matmul")),
           "total_flops": sum(r["flops"] for r in rows), "total_bytes": sum(r["bytes"] for r in rows), "ops": rows}
    if a.measured_ms:
        out["measured_ms"] = a.measured_ms
        out["measured_mfu"] = flops_per_token * tokens / (a.measured_ms / 1e3) / peak
    if a.json:
        print(json.dumps(out))
        return 0
    print(f"# roofline step model: GPT-2 {a.e} ({P:,} parameters), B={a.b}, T={a.t}, {a.precision}, -r {a.r}, "
          f"-ge {a.ge}, bias gradients by {out['bias_grad']}, "
          f"{a.gpu} ({peak / 1e12:.0f} TFLOP/s, {bw / 1e12:.2f} TB/s)")
    print()
    print("| op | x | GFLOP | MB | compute ms | memory ms | roofline ms | bound |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: -r["roofline_ms"]):
        print(f"| {r['op']} | {r['count']} | {r['flops'] / 1e9:.1f} | {r['bytes'] / 1e6:.1f} | {r['compute_ms']:.3f} | "
              f"{r['memory_ms']:.3f} | {r['roofline_ms']:.3f} | {r['bound']} |")
    print()
    print(f"roofline step: {total_ms:.1f} ms, {out['tokens_per_s']:,.0f} tokens/s, MFU {100 * out['mfu']:.1f}% "
          f"(6N + 6LCT flops per token); {out['total_flops'] / 1e12:.1f} TFLOP and {out['total_bytes'] / 1e9:.1f} GB moved")
    if a.measured_ms:
        print(f"measured: {a.measured_ms:.1f} ms (MFU {100 * out['measured_mfu']:.1f}%): {a.measured_ms / total_ms:.2f}x the roofline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
