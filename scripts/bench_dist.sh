#!/usr/bin/env bash
# make bench-dist (a benchmark, not a test): data-parallel ./train_gpt_cpu on this machine,
# 2 ranks x 1 thread (mpirun) against 1 rank x 2 threads, same model, data and -d. Prints the
# mean step time of each (first step excluded), their ratio, and the 2-rank run's per-step
# communication time and bytes (comm_ms / comm_bytes in its log.jsonl).
# Env: BENCH_STEPS (default 8), BENCH_MODEL (default d4), BENCH_B (per-rank -b, default 8).
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
/usr/bin/python3 - "$out" "$model" "$d" <<'PY'
import json, sys
out, model, d = sys.argv[1], sys.argv[2], sys.argv[3]
def steps(run):
    return [r for r in map(json.loads, open(f"{out}/{run}/log.jsonl")) if "train_loss" in r][1:]
one, two = steps("one"), steps("two")
mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)
ms1, ms2 = mean(one, "step_ms"), mean(two, "step_ms")
print(f"bench-dist: {model}, {d} tokens per step, {len(one)} timed steps each")
print(f"  1 rank x 2 threads: {ms1:8.1f} ms/step")
print(f"  2 ranks x 1 thread: {ms2:8.1f} ms/step (communication {mean(two, 'comm_ms'):.1f} ms, "
      f"{mean(two, 'comm_bytes') / 1e6:.2f} MB sent per rank per step)")
print(f"  ratio (2 ranks / 1 rank): {ms2 / ms1:.2f}")
PY
