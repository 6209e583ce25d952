"""Hostile-driver categories "QLoRA flags" and "QLoRA resume" (issue 23 item 4): --quantize-base and
--double-quant at random (good and bad modes, values out of range, without adapters, with DoRA, on a model
whose in features are not a multiple of 64 for NF4, -x 0 and training), and a QLoRA run directory resumed
(-y 1 with --allow-config-change 1, so that the adapter's own record is the check) as it is, or after its
adapter's llmc_quantize_base metadata was changed, removed or made a non-string, with the mode flags at
random. Every run must train or stop with a clean error (exit 1, 'error: '); a run that trains with
--quantize-base but no adapters, or resumes on another mode than its adapter records, is 'silent'; the
resumed checkpoint's files must be left as they were ('lost' otherwise)."""
import os
import shutil

from hardening_util import TRAINER, clean_outcome, run, write_model
from hostile_common import TIMEOUT, base_args
from lora_common import join_safetensors, snapshot, split_safetensors

MODES = {"nf4": ["--quantize-base", "nf4"], "nf4+dq": ["--quantize-base", "nf4", "--double-quant", "1"],
         "int8": ["--quantize-base", "int8"], "": []}


def setup(ctx):
    ctx.qmodel = ctx.path("qlora64.bin")  # C 64: NF4's blocks of 64 fit every module
    write_model(ctx.qmodel, C=64, NH=2, seed=3)
    d = ctx.path("qlora_run")
    rc, _, _ = run(TRAINER, base_args(ctx) + ["-e", ctx.qmodel, "-x", "1", "-n", "1", "-v", "0", "-o", d, "--lora-rank", "4",
                                             "--lora-targets", "c_attn,c_proj,c_fc"] + MODES["nf4"], timeout=TIMEOUT)
    ctx.qlora_run = d if rc == 0 else None


def case_flags(ctx, r, tag):
    q = r.choice(["nf4", "nf4", "int8", "int8", "", "NF4", "nf4 ", "int4", "none", "x" * 40])
    dq = r.choice([None, None, None, "0", "1", "1", "2", "-1", "x"])
    lora = r.choice([[], ["--lora-rank", "4"], ["--lora-rank", "4", "--lora-targets", "all-linear"],
                     ["--lora-rank", "4", "--use-dora", "1"]])
    model = r.choice([ctx.qmodel, ctx.qmodel, ctx.model])  # (ctx.model: C 32)
    flags = (["--quantize-base", q] if q or r.random() < 0.5 else []) + (["--double-quant", dq] if dq is not None else []) + lora
    rc, out, err = run(TRAINER, base_args(ctx) + ["-e", model, "-x", r.choice(["0", "1"]), "-v", "0"] + flags, timeout=TIMEOUT)
    what = " ".join(flags) + (" (C 32)" if model == ctx.model else "")
    if rc == 0 and q in ("nf4", "int8") and not lora:
        return "silent", f"{what}: ran with a quantised base and no adapters"
    if rc == 0 and q in ("nf4", "int8") and "quantised base" not in out:
        return "silent", f"{what}: no quantised base line"
    return clean_outcome(rc, err), what


def case_resume(ctx, r, tag):
    if not ctx.qlora_run:
        return "skip", "no QLoRA run (the setup's run failed)"
    d = ctx.path(f"qlora_resume_{tag}")
    shutil.copytree(ctx.qlora_run, d)
    p = os.path.join(d, "adapter_00000001", "adapter_model.safetensors")
    header, body = split_safetensors(open(p, "rb").read())
    meta = header.setdefault("__metadata__", {})
    recorded = "nf4" if r.random() < 0.5 else r.choice(["nf4+dq", "int8", "", None, 5, "fp4"])
    if recorded != "nf4":  # (the state's CRC of the adapter file catches any edit first)
        if recorded is None:
            meta.pop("llmc_quantize_base", None)
        else:
            meta["llmc_quantize_base"] = recorded
        open(p, "wb").write(join_safetensors(header, body))
    mode = r.choice(sorted(MODES))
    before = {f: snapshot(os.path.join(d, f)) if os.path.isdir(os.path.join(d, f)) else open(os.path.join(d, f), "rb").read()
              for f in os.listdir(d) if "00000001" in f}
    rc, out, err = run(TRAINER, base_args(ctx) + ["-e", ctx.qmodel, "-x", "2", "-n", "1", "-v", "0", "-o", d, "-y", "1", "--allow-config-change", "1",
                                                 "--lora-rank", "4", "--lora-targets", "c_attn,c_proj,c_fc"] + MODES[mode],
                       timeout=TIMEOUT)
    what = f"adapter records {recorded!r}, resumed with {mode or 'fp32'}"
    after = {f: snapshot(os.path.join(d, f)) if os.path.isdir(os.path.join(d, f)) else open(os.path.join(d, f), "rb").read()
             for f in before if os.path.exists(os.path.join(d, f))}
    if after != before:
        return "lost", f"{what}: the step-1 checkpoint changed"
    if rc == 0 and (recorded != "nf4" or mode != "nf4"):
        return "silent", f"{what}: resumed on another base"
    return clean_outcome(rc, err), what


CATEGORIES = [("QLoRA flags", case_flags), ("QLoRA resume", case_resume)]
