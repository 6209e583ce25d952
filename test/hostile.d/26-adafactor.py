"""Hostile-driver category "Adafactor resume" (issue 26 item 6): an --optimizer adafactor run's
checkpoint resumed with a random mix of optimizer flags (the other --optimizer, with or without
--allow-config-change 1; out-of-range or extreme --adafactor-* values; -z 0..3; --optim-state),
or with its state file's optimizer kind (header [30]) rewritten under a recomputed checksum. Every
case must train or stop with a clean error; a changed kind must never resume (silent); the run's
earlier checkpoints must stay as they were (lost) and a model it writes must be finite."""
import os

from hardening_util import TRAINER, clean_outcome, run, state_rewrite
from hostile_common import TIMEOUT, base_args, checkpoint_copy, digests, finite_models

FLAG_VALUES = {
    "--optimizer": ["adamw", "adafactor", "adafactor", "sgd", ""],
    "--adafactor-beta1": ["0", "0.9", "0.999", "1", "-0.1", "nan", "1e-30"],
    "--adafactor-clip": ["1", "1e-30", "1e30", "0", "-1", "inf"],
    "--adafactor-decay-rate": ["-0.8", "-1e-30", "-1e30", "0", "0.5", "-inf"],
    "--adafactor-relative-step": ["0", "1", "2", "-1"],
    "-z": ["0", "1", "2", "3"],
    "--optim-state": ["fp32", "int8"],
    "--allow-config-change": ["0", "1"],
}


def setup(ctx):
    ctx.af_ckpt = ctx.path("af_ck")
    rc, _, err = run(TRAINER, base_args(ctx) + ["-e", ctx.model, "-x", "4", "-n", "1", "-o", ctx.af_ckpt,
                                               "--optimizer", "adafactor", "--adafactor-beta1", "0.9"])
    if rc != 0:
        print(f"note: Adafactor category setup failed: {err[-300:]}")
        ctx.af_ckpt = None


def case_adafactor(ctx, r, tag):
    if not ctx.af_ckpt:
        return "skip", "no Adafactor checkpoint"
    d = checkpoint_copy(ctx.af_ckpt, ctx.fresh("af"), "*0000000[34]*")
    kind = r.choice(["flags", "flags", "state_kind"])
    given = {"--optimizer": "adafactor", "--adafactor-beta1": "0.9"}  # the run's own
    if kind == "flags":  # some of them changed or dropped, others added
        for name in r.sample(sorted(FLAG_VALUES), r.randint(0, 3)):
            given[name] = r.choice(FLAG_VALUES[name])
        for name in [n for n in given if r.random() < 0.15]:
            del given[name]
    flags = [x for kv in given.items() for x in kv]
    if kind == "flags":
        note = " ".join(flags) or "(no optimizer flags)"
    else:
        v = r.choice([0, 1, 3, -1, 1 << 30])
        state_rewrite(os.path.join(d, "state_00000002_00000.bin"), lambda h: h.__setitem__(30, v))
        note = f"state header [30] = {v}"
    before = digests(d)
    rc, out, err = run(TRAINER, base_args(ctx) + ["-e", ctx.model, "-x", "4", "-y", "1", "-o", d] + flags, timeout=TIMEOUT)
    o = clean_outcome(rc, err)
    if digests(d) != before:
        return "lost", f"{note}: an earlier checkpoint changed"
    if o == "ok" and kind == "state_kind":
        return "silent", f"{note}: resumed from a state of another kind"
    if o == "ok" and not finite_models(d):
        return "silent", f"{note}: a non-finite model written"
    return o, note


CATEGORIES = [("Adafactor resume (flags, state kind)", case_adafactor)]
