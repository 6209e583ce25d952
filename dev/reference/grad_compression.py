#!/usr/bin/env python3
"""grad_compression.py - the numpy reference for llmc's --grad-compression (llmc/train/gradcomp.h).

Each rank r of P holds its gradient g_r (n float32, already weighted by the loss normalisation) and
its error-feedback residual e_r. One step:

    x_r   = e_r + g_r
    c_r   = compress(x_r)          the payload rank r sends
    e_r'  = x_r - decompress(c_r)  what was not sent, added to the next step's gradient
    sum   = 0; for r in 0 .. P-1: sum += decompress(c_r)   (rank order: every rank the same bits)

Schemes (every operation in float32, rounded on its own, no fused multiply-add):
    bf16        decompress(compress(x)) = x rounded to bf16, nearest even.
    int8        chunks of 256 elements of the flat gradient: s = max|x| / 127 (fp32), q = rint(x / s)
                clamped to [-127, 127] (0 where s == 0); decompress: q * s.
    topk:FRAC   per bucket (a list of (offset, length) slices of the flat gradient: the outer
                tensors, then each layer's slices), the K = max(1, ceil(FRAC * numel)) elements of
                largest |x| (ties: the lower index), sent as (index, value) exactly; the rest 0.
    powersgd:R  per matrix (rows x cols; a stacked (L, out, in) tensor is L matrices), r = min(R,
                rows, cols), Q (cols x r) shared by the ranks and warm-started from the last step:
                P = sum_r M_r Q; P^ = Gram-Schmidt(P) (a column of norm 0 stays 0); Q' = sum_r M_r^T P^;
                the sum is P^ Q'^T, rank r's residual M_r - P^ (M_r^T P^)^T, the next Q is Q'; vectors
                are sent whole (residual 0). powersgd_step computes it in float64: the trainer's fp32
                sums agree to a tolerance, not bit for bit.
Payload bytes per rank: bf16 2n (rounded up to 4), int8 n (rounded up to 4) + 4 * ceil(n / 256),
topk 8 * sum of K, powersgd 4 * (sum over matrices of (rows + cols) r + the vectors' elements).

CLI (a self-check): python3 dev/reference/grad_compression.py prints the payload sizes and the
relative error of each scheme on a random gradient.
"""
import math

import numpy as np

INT8_CHUNK = 256


def bf16_round(x):
    """x (float32) rounded to bf16 (nearest even), as float32"""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return (r & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


def int8_roundtrip(x):
    """decompress(compress(x)) for int8: the chunks' codes times their scales"""
    x = np.asarray(x, np.float32)
    n = x.size
    out = np.empty(n, np.float32)
    for a in range(0, n, INT8_CHUNK):
        c = x[a:a + INT8_CHUNK]
        s = np.float32(np.max(np.abs(c))) / np.float32(127.0)
        if s > 0:
            q = np.clip(np.rint(c / s), -127, 127).astype(np.int8)
        else:
            q = np.zeros(c.size, np.int8)
        out[a:a + INT8_CHUNK] = q.astype(np.float32) * np.float32(s)
    return out


def topk_count(frac, m):
    k = math.ceil(float(np.float32(frac)) * m)
    return max(1, min(m, k))


def topk_roundtrip(x, buckets, frac):
    """decompress(compress(x)) for topk: per bucket the K largest |x| (lower index first on ties)"""
    x = np.asarray(x, np.float32)
    out = np.zeros_like(x)
    pairs = 0
    for slices in buckets:
        idx = np.concatenate([np.arange(o, o + ln, dtype=np.int64) for o, ln in slices])
        if idx.size == 0:
            continue
        k = topk_count(frac, idx.size)
        key = np.abs(x[idx]).view(np.uint32).astype(np.int64)
        order = np.lexsort((idx, -key))[:k]  # by key descending, then index ascending
        out[idx[order]] = x[idx[order]]
        pairs += k
    return out, pairs


def roundtrip(scheme, x, buckets=None):
    """(decompress(compress(x)), payload bytes) for scheme 'bf16', 'int8' or 'topk:FRAC'"""
    n = x.size
    if scheme == "bf16":
        return bf16_round(x), (2 * n + 3) // 4 * 4
    if scheme == "int8":
        return int8_roundtrip(x), (n + 3) // 4 * 4 + 4 * ((n + INT8_CHUNK - 1) // INT8_CHUNK)
    if scheme.startswith("topk:"):
        y, pairs = topk_roundtrip(x, buckets, float(scheme[5:]))
        return y, 8 * pairs
    raise ValueError(f"unknown scheme {scheme}")


def reduce_step(scheme, grads, residuals, buckets=None, error_feedback=True):
    """One step over the ranks: (the sum every rank ends with, the new residuals, payload bytes)"""
    total = np.zeros_like(grads[0], dtype=np.float32)
    new = []
    nbytes = 0
    for g, e in zip(grads, residuals):
        x = (e if error_feedback else np.zeros_like(g)) + g
        y, nbytes = roundtrip(scheme, x, buckets)
        new.append(x - y)
        total = total + y  # rank order
    return total, new, nbytes


def orthogonalise(p):
    """Gram-Schmidt over p's columns (rows x r, float64); a column of norm 0 stays 0"""
    p = p.copy()
    for k in range(p.shape[1]):
        for j in range(k):
            p[:, k] -= (p[:, j] @ p[:, k]) * p[:, j]
        ss = p[:, k] @ p[:, k]
        p[:, k] = p[:, k] / math.sqrt(ss) if ss > 1e-30 else 0.0
    return p


def powersgd_step(grads, residuals, units, q, rank):
    """One PowerSGD step in float64. units: (offset, numel, rows, cols) (cols 0: a vector); q: the
    flat Qs (cols x r each, row-major, in unit order). Returns (sum, new residuals, new q)."""
    xs = [(np.asarray(e, np.float32) + np.asarray(g, np.float32)).astype(np.float64) for g, e in zip(grads, residuals)]
    total = np.zeros(xs[0].size)
    new = [x.copy() for x in xs]
    q_out = np.zeros(q.size)
    qo = 0
    for off, numel, rows, cols in units:
        if cols == 0:
            total[off:off + numel] = sum(x[off:off + numel] for x in xs)
            for e in new:
                e[off:off + numel] = 0.0
            continue
        r = min(rank, rows, cols)
        Q = q[qo:qo + cols * r].astype(np.float64).reshape(cols, r)
        ms = [x[off:off + numel].reshape(rows, cols) for x in xs]
        ph = orthogonalise(sum(m @ Q for m in ms))
        qs = [m.T @ ph for m in ms]
        qsum = sum(qs)
        total[off:off + numel] = (ph @ qsum.T).ravel()
        for e, m, qr in zip(new, ms, qs):
            e[off:off + numel] = (m - ph @ qr.T).ravel()
        q_out[qo:qo + cols * r] = qsum.ravel()
        qo += cols * r
    return total, new, q_out


def main():
    rng = np.random.default_rng(0)
    n = 10000
    x = (rng.standard_normal(n) * 1e-3).astype(np.float32)
    buckets = [[(0, 4000)], [(4000, 3000), (8000, 2000)], [(7000, 1000)]]
    for scheme in ("bf16", "int8", "topk:0.05"):
        y, b = roundtrip(scheme, x, buckets)
        print(f"{scheme}: {b} bytes (uncompressed {4 * n}), relative error {np.linalg.norm(x - y) / np.linalg.norm(x):.3e}")


if __name__ == "__main__":
    main()
