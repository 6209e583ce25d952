#!/usr/bin/env bash
# make bench-dist (a benchmark, not a test): data-parallel ./train_gpt_cpu on this machine,
# 2 ranks x 1 thread (mpirun) against 1 rank x 2 threads, same model, data and -d. Prints the
# mean step time of each (first step excluded), their ratio, and the 2-rank run's per-step
# communication time and bytes (comm_ms / comm_bytes in its log.jsonl); then the same 2 ranks
# started without mpirun over TCP (-pi fs, llmc/dist/dist_tcp.c: a star through rank 0), and the 2 mpirun
# ranks with each --grad-compression scheme (time, bytes, last loss). Then the predicted 8-GPU
# step of ./train_gpt for GPT-2 124M at 524,288 tokens per step: the bytes each GPU moves (ring
# all-reduce of the bf16 gradients; -z 1 adds the all-gather of the bf16 parameters) at a stated
# bus bandwidth, next to the measured single-GPU step when given.
# Env: BENCH_STEPS (default 8), BENCH_MODEL (default d4), BENCH_B (per-rank -b, default 8);
# BENCH_BUSBW_GBS (NCCL bus bandwidth in GB/s, default 360: see the note it prints);
# BENCH_GPU_STEP_MS (a measured one-GPU step of GPT-2 124M at 524,288 tokens, bf16; optional).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${BENCH_STEPS:-8}
model=${BENCH_MODEL:-d4}
b=${BENCH_B:-8}
t=64
out=build/bench_dist
mkdir -p "$out"
command -v mpirun >/dev/null || { echo "error: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
/usr/bin/python3 - "$out/tokens.bin" <<'PY'
import random, struct, sys
rng = random.Random(0)
n = 2 * 8 * 64 * 64 + 1
toks = [rng.randrange(50257) for _ in range(n)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *toks))
PY
d=$((2 * b * t))
flags=(-i "$out/tokens.bin" -e "$model" -t "$t" -d "$d" -x "$steps" -v 0 -s 0 --overwrite 1)
./train_gpt_cpu "${flags[@]}" -b "$((2 * b))" --threads 2 -o "$out/one" >/dev/null
mpirun --oversubscribe -np 2 --bind-to none ./train_gpt_cpu "${flags[@]}" -b "$b" --threads 1 -o "$out/two" >/dev/null
TRAINER=./train_gpt_cpu scripts/run_dist.sh local 2 --pi fs "${flags[@]}" -b "$b" --threads 1 -o "$out/two_tcp" >/dev/null
# the same 2 ranks with each --grad-compression scheme (llmc/train/gradcomp.c)
schemes=(bf16 int8 topk:0.05 powersgd:4)
for s in "${schemes[@]}"; do
    mpirun --oversubscribe -np 2 --bind-to none ./train_gpt_cpu "${flags[@]}" -b "$b" --threads 1 --grad-compression "$s" \
        -o "$out/two_${s//:/_}" >/dev/null
done
/usr/bin/python3 - "$out" "$model" "$d" "${schemes[@]}" <<'PY'
import json, sys
out, model, d = sys.argv[1], sys.argv[2], sys.argv[3]
def steps(run):
    return [r for r in map(json.loads, open(f"{out}/{run}/log.jsonl")) if "train_loss" in r][1:]
one, two, tcp = steps("one"), steps("two"), steps("two_tcp")
mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)
ms1, ms2 = mean(one, "step_ms"), mean(two, "step_ms")
print(f"bench-dist: {model}, {d} tokens per step, {len(one)} timed steps each")
print(f"  1 rank x 2 threads: {ms1:8.1f} ms/step")
print(f"  2 ranks x 1 thread: {ms2:8.1f} ms/step (communication {mean(two, 'comm_ms'):.1f} ms, "
      f"{mean(two, 'comm_bytes') / 1e6:.2f} MB sent per rank per step)")
print(f"  ratio (2 ranks / 1 rank): {ms2 / ms1:.2f}")
print(f"  2 ranks x 1 thread, -pi fs (TCP, no mpirun): {mean(tcp, 'step_ms'):8.1f} ms/step (communication "
      f"{mean(tcp, 'comm_ms'):.1f} ms, {mean(tcp, 'comm_bytes') / 1e6:.2f} MB per rank per step)")
print("  --grad-compression on the 2 mpirun ranks (bytes and time per rank per step; the last step's loss):")
print(f"    {'none':11s} {ms2:8.1f} ms/step, communication {mean(two, 'comm_ms'):6.1f} ms, "
      f"{mean(two, 'comm_bytes') / 1e6:7.3f} MB, loss {two[-1]['train_loss']:.4f}")
for s in sys.argv[4:]:
    rs = steps("two_" + s.replace(":", "_"))
    print(f"    {s:11s} {mean(rs, 'step_ms'):8.1f} ms/step, communication {mean(rs, 'comm_ms'):6.1f} ms, "
          f"{mean(rs, 'comm_bytes') / 1e6:7.3f} MB ({mean(two, 'comm_bytes') / mean(rs, 'comm_bytes'):.1f}x fewer), "
          f"loss {rs[-1]['train_loss']:.4f}")
PY
/usr/bin/python3 - "${BENCH_BUSBW_GBS:-360}" "${BENCH_GPU_STEP_MS:-}" <<'PY'
import sys
busbw, step = float(sys.argv[1]) * 1e9, sys.argv[2]
P, tokens = 8, 524288
Vp, C, L, maxT = 50304, 768, 12, 1024
N = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C  # GPT-2 124M: 124,475,904
grad = 2 * N  # bf16 gradients, as ./train_gpt reduces them
# NCCL's bus bandwidth: an all-reduce of S bytes takes S * 2(P-1)/P / busbw, an all-gather S * (P-1)/P / busbw
ar = grad * 2 * (P - 1) / P
ag = grad * (P - 1) / P
print(f"predicted {P}-GPU step of ./train_gpt, GPT-2 124M ({N:,} parameters), {tokens:,} tokens per step, bf16:")
print(f"  bytes per GPU per step: gradient all-reduce {ar / 1e6:.1f} MB (-z 0); plus the parameter all-gather "
      f"{ag / 1e6:.1f} MB (-z 1)")
print(f"  at {busbw / 1e9:.0f} GB/s bus bandwidth: {ar / busbw * 1e3:.2f} ms (-z 0), {(ar + ag) / busbw * 1e3:.2f} ms (-z 1)")
print("  (an assumed bandwidth, not measured here: NVLink 4 gives an H100/H200 SXM GPU 900 GB/s in all, 450 GB/s each "
      "way (NVIDIA's H100 datasheet); the default 360 GB/s assumes a ring all-reduce reaches 80% of one direction. "
      "Set BENCH_BUSBW_GBS to the busbw nccl-tests' all_reduce_perf measures on the node)")
if step:
    one = float(step)
    comm = (ar + ag) / busbw * 1e3
    exposed, hidden = one / P + comm, one / P
    print(f"  measured 1-GPU step (BENCH_GPU_STEP_MS): {one:.1f} ms; predicted {P}-GPU step (-z 1): {exposed:.1f} ms with "
          f"the communication exposed ({one / P / exposed * 100:.1f}% scaling efficiency), {hidden:.1f} ms hidden behind the backward")
else:
    print("  no measured 1-GPU step given: BENCH_GPU_STEP_MS=<ms of one 524,288-token step on one GPU> (e.g. 8 x the "
          "B=64, T=1024 step of make bench-gpu) prints the predicted step and scaling efficiency")
PY
