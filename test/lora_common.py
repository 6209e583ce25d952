"""Shared pieces of the hostile-driver categories on adapter directories (test/hostile.d/60-lora.py,
61-dora.py): the adapter the trainer writes for the tiny model, a safetensors file split into its header
and data, and a case: a run on a mangled copy that must leave the copy as it was."""
import json
import os
import shutil
import struct

from hardening_util import TRAINER, clean_outcome, run
from hostile_common import TIMEOUT, base_args


def train_adapter(ctx, name, flags):
    """The adapter directory of a 1-step run on the tiny model with flags (--lora-rank ...), in
    ctx.path(name); None when that run fails."""
    d = ctx.path(name)
    rc, out, err = run(TRAINER, base_args(ctx) + ["-e", ctx.model, "-x", "1", "-v", "0", "-o", d] + flags, timeout=TIMEOUT)
    return os.path.join(d, "adapter_00000001") if rc == 0 else None


def split_safetensors(data):
    """(header dict, data section) of a safetensors file's bytes."""
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def join_safetensors(header, body):
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + bytes(body)


def edit_config(r, d, mangle, junk):
    """d/adapter_config.json mangled: now and then replaced by text that is no adapter config (junk among
    it), else its JSON through mangle(r, cfg). Returns what it did."""
    p = os.path.join(d, "adapter_config.json")
    if r.random() < 0.15:
        open(p, "w").write(r.choice(["", "{", "[1, 2]", "null", junk]))
        return "config not an adapter config"
    text = json.dumps(mangle(r, json.load(open(p))))
    open(p, "w").write(text)
    return "config mangled"


def snapshot(d):
    return {f: open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))}


def adapter_case(ctx, r, tag, kind, src, edits, flags, flags_p):
    """One case on a copy of the adapter directory src (None: skipped, the setup's KIND run failed): each
    (p, edit) of edits applied with probability p (the last one always when none was), edit(r, d) -> what it
    did; then, with probability flags_p, one of flags added to the run. Trains 1 step with --adapter on the
    copy: (outcome, note); 'lost' when the run changed the copy."""
    if not src:
        return "skip", f"no adapter (the setup's {kind} run failed)"
    d = ctx.path(f"{kind.lower()}_{tag}")
    shutil.copytree(src, d)
    what = []
    for i, (p, edit) in enumerate(edits):
        if r.random() < p or (i == len(edits) - 1 and not what):
            what.append(edit(r, d))
    extra = []
    if r.random() < flags_p:
        extra = r.choice(flags)
        what.append(" ".join(extra))
    before = snapshot(d)
    rc, out, err = run(TRAINER, base_args(ctx) + ["-e", ctx.model, "--adapter", d, "-x", "1", "-v", "0"] + extra,
                       timeout=TIMEOUT)
    if snapshot(d) != before:
        return "lost", f"{', '.join(what)}: the adapter directory changed"
    return clean_outcome(rc, err), ", ".join(what)
