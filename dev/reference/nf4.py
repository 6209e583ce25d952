"""nf4.py - the double-precision reference of QLoRA's quantised base (issue 23 item 4; llmc/core/quant.h):
bitsandbytes' NF4 (blocks of 64 over the row-major (out, in) matrix, an fp32 absmax per block, the first
value of a byte in its high nibble), its double quantisation of the absmax values (the mean subtracted,
the signed 8-bit dynamic map in blocks of 256) and int8 per output row, with numpy.

Codes are decided in double: the NF4 index is the number of code midpoints below x / absmax (above a
midpoint, the upper code: bitsandbytes' rule), the dynamic-map index the nearest value (the lower on a
tie), the int8 code rint(x * 127 / absmax) (ties to even, torch.round's rule). Dequantisation is one
fp32 product per value (table[index] * absmax, q * scale) and, after double quantisation, the absmax as
bitsandbytes' dequantize_blockwise then "absmax += offset" compute it in fp32.

    python3 dev/reference/nf4.py MODE DQ ROWS COLS IN.f32 OUTDIR   writes what test/test_quant.c writes
"""
import os
import sys

import numpy as np

# bitsandbytes/functional.py get_4bit_type('nf4') (the QLoRA paper's Appendix E), as published
NF4_TABLE = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
             -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
             0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
             0.7229568362236023, 1.0]
BLOCK, DQ_BLOCK = 64, 256


def dynamic_map():
    """bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8) in double, each value
    rounded once to fp32, sorted: 127 positive and 127 negative values 10^(i-6) * (the midpoints of
    linspace(0.1, 1, 2^i + 1)), i = 0..6, then 0 and 1."""
    data = []
    for i in range(7):
        b = np.linspace(0.1, 1.0, 2 ** i + 1)
        means = (b[:-1] + b[1:]) / 2.0
        data += list(10.0 ** (i - 6) * means) + list(-(10.0 ** (i - 6)) * means)
    data += [0.0, 1.0]
    assert len(data) == 256
    return np.sort(np.array(data, np.float64).astype(np.float32))


def dynamic_map_bitsandbytes_torch():
    """create_dynamic_map as bitsandbytes computes it (torch float32 linspace and products): for comparing."""
    import torch
    data = []
    for i in range(7):
        b = torch.linspace(0.1, 1, 2 ** i + 1)
        means = (b[:-1] + b[1:]) / 2.0
        data += ((10 ** (-(7 - 1) + i)) * means).tolist() + (-(10 ** (-(7 - 1) + i)) * means).tolist()
    data += [0, 1.0]
    data.sort()
    return np.array(data, np.float32)


def quantize_nf4(w, double_quant=False):
    """w (rows, cols) float32, cols % 64 == 0 -> dict(codes (packed uint8), absmax (fp32 per block; after
    double quantisation the dequantised one), and with double_quant qabsmax, absmax2, mean)."""
    w = np.asarray(w, np.float32)
    rows, cols = w.shape
    assert cols % BLOCK == 0, "nf4: the input features must be a multiple of 64"
    x = w.reshape(-1, BLOCK).astype(np.float64)
    absmax = np.abs(x).max(axis=1)  # exact: fp32 values
    t = np.array(NF4_TABLE, np.float32).astype(np.float64)
    mids = (t[:-1] + t[1:]) / 2.0
    safe = np.where(absmax > 0, absmax, 1.0)
    idx = np.sum((x / safe[:, None])[..., None] > mids, axis=-1)  # midpoints below x / absmax
    idx = np.where(absmax[:, None] > 0, idx, 7).reshape(-1).astype(np.uint8)
    codes = (idx[0::2] << 4) | idx[1::2]
    out = {"codes": codes.astype(np.uint8), "absmax": absmax.astype(np.float32)}
    if double_quant:
        a = absmax.astype(np.float32).astype(np.float64)
        mean = np.float32(np.cumsum(a)[-1] / len(a))  # (a sequential sum, as the C code's)
        d = a - np.float64(mean)
        m = dynamic_map().astype(np.float64)
        q8 = np.zeros(len(a), np.uint8)
        absmax2 = []
        for b0 in range(0, len(a), DQ_BLOCK):
            blk = d[b0:b0 + DQ_BLOCK]
            a2 = np.float32(np.abs(blk).max())
            absmax2.append(a2)
            n = blk / np.float64(a2) if a2 > 0 else np.zeros_like(blk)
            q8[b0:b0 + DQ_BLOCK] = np.argmin(np.abs(n[:, None] - m[None, :]), axis=1)
        absmax2 = np.array(absmax2, np.float32)
        out.update(qabsmax=q8, absmax2=absmax2, mean=mean,
                   absmax=dequant_absmax(q8, absmax2, mean))
    return out


def dequant_absmax(q8, absmax2, mean):
    """The absmax after double quantisation, fp32 as bitsandbytes computes it: map[q] * absmax2 + mean."""
    m = dynamic_map()
    scaled = m[q8] * np.repeat(absmax2, DQ_BLOCK)[:len(q8)]  # float32 products
    return (scaled + np.float32(mean)).astype(np.float32)


def dequantize_nf4(q, rows, cols):
    idx = np.empty(rows * cols, np.uint8)
    idx[0::2], idx[1::2] = q["codes"] >> 4, q["codes"] & 15
    t = np.array(NF4_TABLE, np.float32)
    return (t[idx].reshape(-1, BLOCK) * q["absmax"][:, None]).astype(np.float32).reshape(rows, cols)


def quantize_int8(w):
    w = np.asarray(w, np.float32).astype(np.float64)
    absmax = np.abs(w).max(axis=1)
    scale = (absmax / 127.0).astype(np.float32)
    safe = np.where(absmax > 0, absmax, 1.0)
    codes = np.where(absmax[:, None] > 0, np.rint(w * 127.0 / safe[:, None]), 0).astype(np.int8)
    return {"codes": codes, "absmax": scale}


def dequantize_int8(q):
    return (q["codes"].astype(np.float32) * q["absmax"][:, None]).astype(np.float32)


def roundtrip(w, mode, double_quant=False):
    """w (out, in) float32 -> its dequantised quantisation (what the quantised base computes with)."""
    w = np.asarray(w, np.float32)
    if mode == "nf4":
        return dequantize_nf4(quantize_nf4(w, double_quant), *w.shape)
    if mode == "int8":
        return dequantize_int8(quantize_int8(w))
    raise ValueError(f"unknown mode {mode!r}")


def main():
    mode, dq, rows, cols, src, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
    w = np.fromfile(src, np.float32).reshape(rows, cols)
    os.makedirs(out, exist_ok=True)
    q = quantize_nf4(w, bool(dq)) if mode == "nf4" else quantize_int8(w)
    deq = dequantize_nf4(q, rows, cols) if mode == "nf4" else dequantize_int8(q)
    q["codes"].tofile(os.path.join(out, "codes.bin"))
    q["absmax"].tofile(os.path.join(out, "absmax.f32"))
    deq.tofile(os.path.join(out, "dequant.f32"))
    if dq:
        q["qabsmax"].tofile(os.path.join(out, "qabsmax.bin"))
        q["absmax2"].tofile(os.path.join(out, "absmax2.f32"))
        np.array([q["mean"]], np.float32).tofile(os.path.join(out, "mean.f32"))
    np.array(NF4_TABLE, np.float32).tofile(os.path.join(out, "table.f32"))
    dynamic_map().tofile(os.path.join(out, "map.f32"))


if __name__ == "__main__":
    main()
