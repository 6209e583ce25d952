"""f32_safetensors.py - reads a safetensors file of float32 tensors (llmc's adapters and gradient dumps,
the references' outputs) as numpy arrays, with no torch or safetensors package: shared by
dev/reference/distill.py and test/test_lora.py (test_dora.py)."""
import json
import struct

import numpy as np


def read_safetensors(path):
    """({name: float32 array of its shape}, the header's __metadata__ or {}); every tensor must be F32."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, e in header.items():
        if k == "__metadata__":
            continue
        assert e["dtype"] == "F32", (path, k, e["dtype"])
        b0, b1 = e["data_offsets"]
        out[k] = np.frombuffer(data[b0:b1], dtype="<f4").reshape(e["shape"])
    return out, header.get("__metadata__", {})
