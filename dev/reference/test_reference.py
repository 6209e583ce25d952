#!/usr/bin/env python3
"""test_reference.py - self-checks of dev/reference/train_gpt2.py on tiny configs.

Run from the repository root: /usr/bin/python3 dev/reference/test_reference.py
Prints "PASS: name", "FAIL: name: reason" or "SKIP: name: reason" per check and exits non-zero
if any check failed. Every check uses fixed seeds, so a failure reproduces.
"""

import math
import os
import struct
import subprocess
import sys
import tempfile
import traceback

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train_gpt2 as ref  # noqa: E402

# Tiny config: V not a multiple of 128 so padding exists; T < maxT so some wpe rows are unused.
TINY = ref.Config(max_seq_len=12, vocab_size=50, padded_vocab=ref.padded_vocab_size(50),
                  n_layer=2, n_head=4, channels=16)
B, T = 2, 8
SEED = 4242
results = []


def check(name):
    def wrap(fn):
        def run():
            try:
                msg = fn()
                if isinstance(msg, str) and msg.startswith("SKIP"):
                    print(f"SKIP: {name}: {msg[5:]}")
                else:
                    print(f"PASS: {name}")
                    results.append(True)
            except Exception as e:  # any exception is a failure with its reason
                reason = f"{type(e).__name__}: {e}".replace("\n", " ")
                print(f"FAIL: {name}: {reason}")
                traceback.print_exc(file=sys.stdout)
                results.append(False)
        run.__name__ = fn.__name__
        CHECKS.append(run)
        return run
    return wrap


CHECKS = []


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


def tiny_model(dtype=torch.float64, seed=SEED, cfg=TINY):
    tensors = ref.init_tensors(cfg, seed)
    # Non-trivial norm gains and biases, so their gradients and their use are exercised.
    gen = torch.Generator().manual_seed(seed + 7)
    for name, shape, _, init in ref.param_table(cfg):
        if init in ("ones", "zeros"):
            tensors[name] = tensors[name] + 0.1 * torch.randn(shape, generator=gen)
    return ref.GPT2(cfg, {k: t.to(dtype) for k, t in tensors.items()}), tensors


def tiny_backward():
    """The float64 tiny model after one forward + backward on the seeded batch:
    (model, x, y, logits, loss), the gradients in each parameter's .grad."""
    model, _ = tiny_model(torch.float64)
    x, y = ref.random_batch(B, T, TINY.vocab_size, SEED)
    logits, loss = model(x, y)
    loss.backward()
    return model, x, y, logits, loss


# ------------------------------------------------------------------------------------------
# An independently written GPT-2: torch.nn.functional layers, per-head einsum attention with an
# additive mask, F.cross_entropy on the sliced logits.

def independent_forward(p, idx, targets, cfg):
    Bn, Tn = idx.shape
    C, NH, V = cfg.channels, cfg.n_head, cfg.vocab_size
    HS = C // NH
    x = F.embedding(idx, p["wte"]) + F.embedding(torch.arange(Tn), p["wpe"]).unsqueeze(0)
    mask = torch.full((Tn, Tn), -1e30, dtype=x.dtype).triu(1)      # 0 on and below diagonal
    for l in range(cfg.n_layer):
        a = F.layer_norm(x, (C,), p["ln1w"][l], p["ln1b"][l], eps=1e-5)
        qkv = F.linear(a, p["qkvw"][l], p["qkvb"][l])
        heads = []
        for hd in range(NH):
            q = qkv[..., hd * HS:(hd + 1) * HS]
            k = qkv[..., C + hd * HS:C + (hd + 1) * HS]
            v = qkv[..., 2 * C + hd * HS:2 * C + (hd + 1) * HS]
            s = torch.einsum("btd,bsd->bts", q, k) / math.sqrt(HS) + mask
            w = torch.exp(s - s.max(dim=-1, keepdim=True).values)
            w = w / w.sum(dim=-1, keepdim=True)
            heads.append(torch.einsum("bts,bsd->btd", w, v))
        x = x + F.linear(torch.cat(heads, dim=-1), p["attprojw"][l], p["attprojb"][l])
        m = F.layer_norm(x, (C,), p["ln2w"][l], p["ln2b"][l], eps=1e-5)
        m = F.gelu(F.linear(m, p["fcw"][l], p["fcb"][l]), approximate="tanh")
        x = x + F.linear(m, p["fcprojw"][l], p["fcprojb"][l])
    x = F.layer_norm(x, (C,), p["lnfw"], p["lnfb"], eps=1e-5)
    logits = F.linear(x, p["wte"])
    loss = F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1))
    return logits, loss


@check("grads_vs_independent_model")
def _():
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
        model, _ = tiny_model(dtype)
        x, y = ref.random_batch(B, T, TINY.vocab_size, SEED)
        logits, loss = model(x, y)
        loss.backward()
        p = {n: getattr(model, n).detach().clone().requires_grad_(True) for n in ref.PARAM_NAMES}
        logits2, loss2 = independent_forward(p, x, y, TINY)
        loss2.backward()
        expect(abs(float(loss) - float(loss2)) <= tol * abs(float(loss2)),
               f"{dtype}: loss {float(loss)} vs {float(loss2)}")
        err = float((logits - logits2).abs().max())
        expect(err <= tol, f"{dtype}: logits differ by {err:.3g}")
        for n in ref.PARAM_NAMES:
            g, g2 = getattr(model, n).grad, p[n].grad
            err = float((g - g2).abs().max()) / max(float(g2.abs().max()), 1e-30)
            expect(err <= tol, f"{dtype}: grad {n} differs, max err / max |g| = {err:.3g}")
        expect(float(model.wte.grad[TINY.vocab_size:].abs().max()) == 0.0,
               f"{dtype}: padded wte rows have a nonzero gradient")


@check("finite_difference_every_tensor_float64")
def _():
    model, x, y, _, _ = tiny_backward()
    gen = torch.Generator().manual_seed(SEED + 3)
    h = 1e-6
    for n in ref.PARAM_NAMES:
        param = getattr(model, n)
        flat = param.data.view(-1)
        picks = torch.randint(0, flat.numel(), (3,), generator=gen).tolist()
        if n == "wte":   # also a padded row and a row of a token in the batch
            picks += [TINY.vocab_size * TINY.channels + 1, int(x[0, 0]) * TINY.channels]
        if n == "wpe":   # also a position >= T (never used: gradient 0)
            picks += [T * TINY.channels + 2]
        for i in picks:
            old = float(flat[i])
            with torch.no_grad():
                flat[i] = old + h
                lp = float(model(x, y)[1])
                flat[i] = old - h
                lm = float(model(x, y)[1])
                flat[i] = old
            fd = (lp - lm) / (2 * h)
            an = float(param.grad.view(-1)[i])
            expect(abs(fd - an) <= 1e-6 + 1e-5 * abs(an),
                   f"{n}[{i}]: analytic {an:.10g} vs finite difference {fd:.10g}")


@check("padded_vocab_does_not_affect_loss")
def _():
    model, x, y, logits, loss = tiny_backward()
    grads = {n: getattr(model, n).grad.clone() for n in ref.PARAM_NAMES}
    with torch.no_grad():   # garbage (large) values in the padded rows
        model.wte[TINY.vocab_size:] = 100.0 * torch.randn(
            TINY.padded_vocab - TINY.vocab_size, TINY.channels,
            generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for p in model.params():
        p.grad = None
    logits2, loss2 = model(x, y)
    loss2.backward()
    V = TINY.vocab_size
    expect(float(loss) == float(loss2), f"loss changed: {float(loss)} -> {float(loss2)}")
    expect(torch.equal(logits[..., :V], logits2[..., :V]), "first V logits changed")
    expect(float(logits2[..., V:].abs().max()) > 1.0, "padded logits were not exercised")
    for n in ref.PARAM_NAMES:
        g = getattr(model, n).grad
        if n == "wte":
            expect(torch.equal(g[:V], grads[n][:V]), "wte grad (rows < V) changed")
            expect(float(g[V:].abs().max()) == 0.0, "padded wte rows got a gradient")
        else:
            expect(torch.equal(g, grads[n]), f"grad {n} changed")


@check("adamw_and_clipping_vs_torch_optim")
def _():
    hp = ref.HyperParams(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
                         grad_clip=0.05)
    model, tensors = tiny_model(torch.float64)
    x, y = ref.random_batch(B, T, TINY.vocab_size, SEED)
    twin = ref.GPT2(TINY, {n: getattr(model, n).detach().clone() for n in ref.PARAM_NAMES})
    opt = ref.AdamW(model, hp)
    decay = {n: d for n, _, d, _ in ref.param_table(TINY)}
    groups = [{"params": [getattr(twin, n) for n in ref.PARAM_NAMES if decay[n]],
               "weight_decay": hp.weight_decay},
              {"params": [getattr(twin, n) for n in ref.PARAM_NAMES if not decay[n]],
               "weight_decay": 0.0}]
    topt = torch.optim.AdamW(groups, lr=hp.lr, betas=(hp.beta1, hp.beta2), eps=hp.eps)
    clipped = 0
    for step in range(4):
        _, norm, _ = ref.train_step(model, opt, x, y)
        for p in twin.params():
            p.grad = None
        _, loss = twin(x, y)
        loss.backward()
        tnorm = float(torch.linalg.vector_norm(torch.cat([p.grad.view(-1)
                                                         for p in twin.params()])))
        expect(abs(norm - tnorm) <= 1e-12 * tnorm, f"step {step}: norm {norm} vs {tnorm}")
        if tnorm > hp.grad_clip:
            clipped += 1
            for p in twin.params():
                p.grad.mul_(hp.grad_clip / tnorm)
        topt.step()
        for n in ref.PARAM_NAMES:
            a, b = getattr(model, n), getattr(twin, n)
            err = float((a - b).abs().max())
            expect(err <= 1e-12, f"step {step}: param {n} differs by {err:.3g}")
    expect(clipped > 0, "clipping was never exercised")
    expect(float(model.wte[TINY.vocab_size:].abs().max()) == 0.0, "padded wte rows moved")


def bf16_reference(a):
    """torch's own fp32 -> bf16 conversion (round to nearest even), back to fp32 numpy."""
    return torch.from_numpy(a).to(torch.bfloat16).to(torch.float32).numpy()


@check("checkpoint_roundtrip_v3_v5")
def _():
    _, tensors = tiny_model(torch.float32)
    with tempfile.TemporaryDirectory() as d:
        for version in (3, 5):
            path = os.path.join(d, f"m{version}.bin")
            ref.save_model(path, TINY, tensors, version)
            raw = open(path, "rb").read()
            h = struct.unpack("<256i", raw[:1024])
            c = TINY
            expect(h[:8] == (20240326, version, c.max_seq_len, c.vocab_size, c.n_layer,
                             c.n_head, c.channels, c.padded_vocab), f"v{version}: header {h[:8]}")
            expect(not any(h[8:]), f"v{version}: header slots 8..255 not zero")
            elem = 4 if version == 3 else 2
            expect(len(raw) == 1024 + elem * ref.num_params(c),
                   f"v{version}: file size {len(raw)}")
            cfg2, t2, v2 = ref.load_model(path)
            expect(cfg2 == c and v2 == version, f"v{version}: read back {cfg2} v{v2}")
            for n in ref.PARAM_NAMES:
                a = tensors[n].numpy()
                want = a if version == 3 else bf16_reference(a)
                expect(np.array_equal(t2[n].numpy(), want), f"v{version}: tensor {n} differs")
            if version == 5:   # re-saving a bf16-exact model is lossless
                path2 = os.path.join(d, "m5b.bin")
                ref.save_model(path2, cfg2, t2, 5)
                expect(open(path2, "rb").read() == raw, "v5 -> read -> v5 not byte-identical")
        # A truncated file and a wrong magic are refused with a reason.
        bad = os.path.join(d, "bad.bin")
        open(bad, "wb").write(raw[:-2])
        for content in (raw[:-2], b"\0" * 1024):
            open(bad, "wb").write(content)
            try:
                ref.load_model(bad)
                raise AssertionError("a broken checkpoint was accepted")
            except ValueError:
                pass


@check("bf16_round_to_nearest_even")
def _():
    one = 1.0
    ulp = 2.0 ** -7                               # bf16 spacing at 1.0
    vals = np.array([one + ulp / 2,               # tie, 1.0 is even -> 1.0
                     one + 3 * ulp / 2,           # tie, 1+2ulp is even -> 1 + 2ulp
                     one + ulp / 2 + 2 ** -20,    # above the tie -> 1 + ulp
                     -(one + 3 * ulp / 2), 3.0e38, -0.0, 1e-40, np.inf, -np.inf],
                    dtype=np.float32)
    got = ref.bf16_bits_to_fp32(ref.fp32_to_bf16_bits(vals))
    want = np.array([1.0, 1.0 + 2 * ulp, 1.0 + ulp, -(1.0 + 2 * ulp)], dtype=np.float32)
    expect(np.array_equal(got[:4], want), f"ties: got {got[:4]}, want {want}")
    expect(np.array_equal(got, bf16_reference(vals)), f"vs torch bf16: {got}")
    expect(np.signbit(got[5]), "-0.0 lost its sign")
    nan = ref.bf16_bits_to_fp32(ref.fp32_to_bf16_bits(np.array([np.nan], dtype=np.float32)))
    expect(np.isnan(nan[0]), "NaN did not stay NaN")
    r = np.random.default_rng(5).standard_normal(10000).astype(np.float32) * 3
    expect(np.array_equal(ref.bf16_bits_to_fp32(ref.fp32_to_bf16_bits(r)), bf16_reference(r)),
           "random values differ from torch's bf16 rounding")


def parse_debug_state(path):
    """Independent reader of the documented layout; returns a dict and checks the size."""
    raw = open(path, "rb").read()
    h = struct.unpack("<256i", raw[:1024])
    expect(h[0] == 20240327 and h[1] == 3, f"magic/version {h[0]}/{h[1]}")
    Bn, Tn, V, Vp, nsteps, L, NH, C, maxT = h[2:11]
    cfg = ref.Config(max_seq_len=maxT, vocab_size=V, padded_vocab=Vp, n_layer=L, n_head=NH,
                     channels=C)
    hp = struct.unpack("<6f", raw[4 * 16:4 * 22])
    expect(not any(h[11:16]) and not any(h[22:]), "header slots that must be 0 are not")
    off = 1024

    def take(fmt, n):
        nonlocal off
        a = np.frombuffer(raw, dtype=fmt, count=n, offset=off)
        off += 4 * n
        return a
    out = {"cfg": cfg, "B": Bn, "T": Tn, "nsteps": nsteps, "hp": hp}
    out["x"] = take("<i4", Bn * Tn)
    out["y"] = take("<i4", Bn * Tn)
    out["logits"] = take("<f4", Bn * Tn * V)
    out["loss"] = float(take("<f4", 1)[0])
    out["grads"] = {n: take("<f4", math.prod(s)).reshape(s)
                    for n, s, _, _ in ref.param_table(cfg)}
    out["losses"] = take("<f4", nsteps)
    out["grad_norms"] = take("<f4", nsteps)
    out["params"] = {n: take("<f4", math.prod(s)).reshape(s)
                     for n, s, _, _ in ref.param_table(cfg)}
    expect(off == len(raw), f"layout adds up to {off} bytes, file has {len(raw)}")
    return out


@check("debug_state_layout")
def _():
    hp = ref.HyperParams(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
                         grad_clip=1.0)
    hp = ref.HyperParams(*(ref.f32(v) for v in (hp.lr, hp.beta1, hp.beta2, hp.eps,
                                                hp.weight_decay, hp.grad_clip)))
    nsteps = 4
    model, tensors = tiny_model(torch.float32)
    x, y = ref.random_batch(B, T, TINY.vocab_size, SEED)
    initial = {n: getattr(model, n).detach().clone() for n in ref.PARAM_NAMES}
    r = ref.run_reference(model, x, y, hp, nsteps)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "ds.bin")
        ref.write_debug_state(path, TINY, x, y, hp, nsteps, r)
        s = parse_debug_state(path)
        expect(os.listdir(d) == ["ds.bin"], f"temporary files left behind: {os.listdir(d)}")
    expect(s["cfg"] == TINY and (s["B"], s["T"], s["nsteps"]) == (B, T, nsteps), "header dims")
    expect(s["hp"] == (hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, hp.grad_clip),
           f"hyperparameters {s['hp']}")
    expect(np.array_equal(s["x"], x.view(-1).numpy()) and
           np.array_equal(s["y"], y.view(-1).numpy()), "x / y")
    fresh = ref.GPT2(TINY, {n: t.clone() for n, t in initial.items()})
    logits, loss = fresh(x, y)
    loss.backward()
    expect(np.array_equal(s["logits"], logits[..., :TINY.vocab_size].reshape(-1).detach()
                          .numpy()), "logits are not those of the initial parameters")
    expect(s["loss"] == ref.f32(float(loss)) == float(s["losses"][0]), "loss / losses[0]")
    for n in ref.PARAM_NAMES:
        expect(np.array_equal(s["grads"][n], getattr(fresh, n).grad.numpy()), f"grad {n}")
        expect(np.array_equal(s["params"][n], getattr(model, n).detach().numpy()), f"param {n}")
    expect(all(np.diff(s["losses"]) < 0), f"losses do not decrease: {s['losses']}")
    expect(np.all(s["grad_norms"] > 0), "grad norms")


@check("cli_deterministic_and_consistent")
def _():
    script = os.path.join(HERE, "train_gpt2.py")
    with tempfile.TemporaryDirectory() as d:
        shard = os.path.join(d, "shard.bin")
        toks = np.arange(B * T + 5, dtype=np.uint16) * 7 % TINY.vocab_size
        with open(shard, "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, toks.size, *([0] * 253)))
            f.write(toks.astype("<u2").tobytes())
        outs = []
        for run in range(2):
            m, ds = os.path.join(d, f"m{run}.bin"), os.path.join(d, f"ds{run}.bin")
            cmd = [sys.executable, script, "--depth", "2", "--channels", "16", "--heads", "4",
                   "--max-seq-len", "12", "--vocab", "50", "--seed", "9", "--batch-size",
                   str(B), "--seq-len", str(T), "--data", shard, "--steps", "3",
                   "--save-model", m, "--debug-state", ds]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            expect(p.returncode == 0, f"exit {p.returncode}: {p.stderr[-500:]}")
            outs.append((open(m, "rb").read(), open(ds, "rb").read()))
        expect(outs[0] == outs[1], "two runs with the same flags wrote different bytes")
        s = parse_debug_state(os.path.join(d, "ds0.bin"))
        expect(np.array_equal(s["x"], toks[:B * T]) and
               np.array_equal(s["y"], toks[1:B * T + 1]), "x / y are not the shard's tokens")
        cfg, tensors, _ = ref.load_model(os.path.join(d, "m0.bin"))
        expect(np.array_equal(tensors["wte"].numpy(), ref.init_tensors(cfg, 9)["wte"].numpy()),
               "saved model is not the seeded init")
        # Starting from the saved checkpoint reproduces the same debug state.
        ds2 = os.path.join(d, "ds_loaded.bin")
        p = subprocess.run([sys.executable, script, "--load", os.path.join(d, "m0.bin"),
                            "--batch-size", str(B), "--seq-len", str(T), "--data", shard,
                            "--steps", "3", "--debug-state", ds2],
                           capture_output=True, text=True, timeout=120)
        expect(p.returncode == 0, f"--load run exit {p.returncode}: {p.stderr[-500:]}")
        expect(open(ds2, "rb").read() == outs[0][1], "--load run differs from the seeded run")


@check("init_statistics")
def _():
    cfg = ref.Config(max_seq_len=64, vocab_size=1000, padded_vocab=1024, n_layer=4, n_head=4,
                     channels=64)
    t = ref.init_tensors(cfg, 0)
    t2 = ref.init_tensors(cfg, 0)
    expect(all(torch.equal(t[n], t2[n]) for n in ref.PARAM_NAMES), "init not deterministic")
    for n, _, _, init in ref.param_table(cfg):
        a = t[n][:cfg.vocab_size] if n == "wte" else t[n]
        if init == "ones":
            expect(bool((a == 1).all()), f"{n} not ones")
        elif init == "zeros":
            expect(bool((a == 0).all()), f"{n} not zeros")
        else:
            std = 0.02 if init == "normal" else 0.02 / math.sqrt(2 * cfg.n_layer)
            got = float(a.std())
            expect(abs(got - std) < 0.03 * std and abs(float(a.mean())) < 0.03 * std,
                   f"{n}: std {got:.5g}, expected {std:.5g}")
    expect(bool((t["wte"][cfg.vocab_size:] == 0).all()), "padded wte rows not zero")


@check("bench_smoke")
def _():
    model, _ = tiny_model(torch.float32)
    x, y = ref.random_batch(B, T, TINY.vocab_size, SEED)
    ms, loss = ref.bench(model, x, y, ref.HyperParams(), 2, "float32", False)
    expect(ms > 0 and math.isfinite(loss), f"ms {ms} loss {loss}")
    ms, loss = ref.bench(model, x, y, ref.HyperParams(), 1, "bfloat16", False)
    expect(ms > 0 and math.isfinite(loss), f"bf16 autocast: ms {ms} loss {loss}")


@check("flash_attention_matches")
def _():
    if not ref.have_flash():
        return f"SKIP no F.scaled_dot_product_attention in torch {torch.__version__}"
    model, _ = tiny_model(torch.float64)
    x, y = ref.random_batch(B, T, TINY.vocab_size, SEED)
    logits, loss = model(x, y)
    model.flash = True
    logits2, loss2 = model(x, y)
    err = float((logits - logits2).abs().max())
    expect(err < 1e-10, f"logits differ by {err:.3g}")


def main():
    torch.set_num_threads(1)
    for run in CHECKS:
        run()
    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
