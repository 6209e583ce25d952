#!/usr/bin/env bash
# scripts/step_model.py (the roofline step model) against closed forms and the C model table:
# its parameter count equals what train_gpt_cpu allocates (d1, d12), its matmul flops equal
# 6 x tokens x (matmul parameters) (each weight: 2 flops per token forward, 4 backward), its
# attention flops equal 3.5 x the causal forward 2 B T^2 C per layer, the step time is the sum of
# the ops' roofline times, recompute adds work, and bad flags are errors.
set -u
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
fail=0
pass() { echo "PASS: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
dir=$(mktemp -d /tmp/llmc_step_model.XXXXXX)
trap 'rm -rf "$dir"' EXIT

# a tiny shard so that train_gpt_cpu can start and print its memory table
$PY - "$dir/t.bin" <<'PY'
import struct, sys
n = 4096
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *([20240520, 1, n] + [0] * 253)))
    f.write(struct.pack("<%dH" % n, *[(i * 7919) % 50257 for i in range(n)]))
PY
for d in d1 d12; do
    c=$(./train_gpt_cpu -e $d -i "$dir/t.bin" -j "$dir/t.bin" -b 1 -t 64 -x 1 -v 0 -s 0 2>&1 | sed -n 's/^| parameters ( *\([0-9]*\)).*/\1/p' | head -1)
    py=$($PY scripts/step_model.py -e $d --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["parameters"])')
    if [ -n "$c" ] && [ "$c" = "$py" ]; then pass "step_model parameter count = train_gpt_cpu's ($d: $c)"; else bad "step_model parameters $d: script $py, trainer '$c'"; fi
done

$PY - <<'PY' || fail=1
import json, subprocess, math
def run(*args):
    return json.loads(subprocess.run(["/usr/bin/python3", "scripts/step_model.py", "--json", *args], check=True,
                                     capture_output=True, text=True).stdout)
ok = True
def check(cond, what):
    global ok
    print(("PASS: " if cond else "FAIL: ") + what)
    ok &= bool(cond)
for e, L, C in (("d12", 12, 768), ("d24", 24, 1024), ("d3", 3, 192)):
    B, T, Vp, F = 8, 256, 50304, 4 * C
    o = run("-e", e, "-b", str(B), "-t", str(T))
    tokens = B * T
    matmul_params = L * (3 * C * C + C * C + C * F + F * C) + Vp * C
    check(math.isclose(o["matmul_flops"], 6 * tokens * matmul_params, rel_tol=1e-12),
          f"step_model {e}: matmul flops = 6 x tokens x matmul parameters")
    att = sum(r["flops"] for r in o["ops"] if r["op"].startswith("attention"))
    check(math.isclose(att, L * 3.5 * 2 * B * T * T * C, rel_tol=1e-12), f"step_model {e}: attention flops = 3.5 x 2BT^2C x L")
    check(math.isclose(o["step_ms"], sum(r["roofline_ms"] for r in o["ops"]), rel_tol=1e-12)
          and all(math.isclose(r["roofline_ms"], max(r["compute_ms"], r["memory_ms"]), rel_tol=1e-12) for r in o["ops"]),
          f"step_model {e}: step = sum over ops of max(compute, memory)")
    r3 = run("-e", e, "-b", str(B), "-t", str(T), "-r", "3")
    check(r3["total_flops"] > o["total_flops"] and r3["step_ms"] > o["step_ms"], f"step_model {e}: -r 3 adds the recomputed forward")
h100, h200 = run("--gpu", "H100"), run("--gpu", "H200")
check(h100["step_ms"] > h200["step_ms"], "step_model: the H100 (less bandwidth) is slower than the H200 on the same step")
# GELU fusion: -ge 1 drops the gelu forward pass (2SNF per layer) for the epilogue's aux write
# (SNF); -ge 2 also the gelu backward pass (3SNF) for the dinp product's aux read (SNF)
d = {ge: run("-ge", str(ge)) for ge in (0, 1, 2)}
N, F, L, S = 64 * 1024, 3072, 12, 2
names = lambda o: {r["op"] for r in o["ops"]}
check("gelu fwd" in names(d[0]) and "gelu fwd" not in names(d[1]) and "gelu bwd" in names(d[1]) and "gelu bwd" not in names(d[2])
      and math.isclose(d[0]["total_bytes"] - d[1]["total_bytes"], L * S * N * F, rel_tol=1e-12)
      and math.isclose(d[1]["total_bytes"] - d[2]["total_bytes"], 2 * L * S * N * F, rel_tol=1e-12)
      and d[2]["total_flops"] == d[0]["total_flops"] and d[2]["gelu_fusion"] == 2,
      "step_model -ge: fusion removes the GELU passes, the epilogues move SNF per layer each way (default 2)")
# bias gradients: the column-sum kernels read each biased product's dout once more (S N oc);
# auto is the epilogue in bf16 and the kernel in fp32
k, e = run("--bias-grad", "kernel"), run()
C = 768
check(math.isclose(k["total_bytes"] - e["total_bytes"], L * S * N * (3 * C + C + F + C), rel_tol=1e-12)
      and e["bias_grad"] == "epilogue" and run("--precision", "fp32")["bias_grad"] == "kernel"
      and k["matmul_flops"] == e["matmul_flops"],
      "step_model --bias-grad: the kernels read dout again (S N oc per biased product); auto = epilogue in bf16, kernel in fp32")
m = run("--measured-ms", "280.4")
check(math.isclose(m["measured_mfu"] / m["mfu"], m["step_ms"] / 280.4, rel_tol=1e-9), "step_model: measured MFU scales with the step time")
raise SystemExit(0 if ok else 1)
PY

for args in "-e x12" "-t 2048" "--gpu B200" "-b 0"; do
    out=$($PY scripts/step_model.py $args 2>&1); rc=$?
    if [ $rc -ne 0 ] && printf '%s' "$out" | grep -q "error"; then pass "step_model rejects '$args'"; else bad "step_model accepted '$args' (rc $rc)"; fi
done
exit $fail
