#!/usr/bin/env bash
# bench_gpu.sh - GPT-2 124M training throughput on this GPU (`make bench-gpu`):
#   1. ./train_gpt -e d12 -b 64 -t 1024 --precision bf16: tokens/s and MFU (mean after warmup), then
#      the same with --cuda-graph 1
#   2. the project's PyTorch reference (dev/reference/train_gpt2.py --bench-steps, torch.compile,
#      flash attention, bf16, CUDA) at the same shape, and the ratio of the two
#   3. peak device memory for -r 0..3 and the largest B that fits for each (memory is linear in
#      B: measured at B=1 and B=2 from the startup table, then the estimate is run for real
#      unless --quick)
# Usage: bench_gpu.sh [--quick] [ours] [torch] [memory]   (parts; default all three)
# --quick: fewer steps, no verification runs. STEPS=N, B=N, T=N in the environment.
# Parts run separately (scripts/gpu_check.sh runs the PyTorch part last, in its own time limit) hand
# their numbers on through BENCH_RESULTS (a file of key=value lines): the torch part prints the
# ratio against the ours part's tokens/s measured earlier in the same run.
# PyTorch: the first of $PYTHON_GPU, python3, /usr/bin/python3 whose torch sees a GPU.
# Needs a GPU. Data: a synthetic shard of random tokens.
# LLMC_GPU_DRY=1 (scripts/gpu_check.sh's rehearsal): the cudasim build of train_gpt on d1, B=2,
# T=64, no PyTorch run; the numbers mean nothing, the script's plumbing is what is checked.
set -u
cd "$(dirname "$0")/.."
QUICK=0 PARTS=""
for a in "$@"; do
    case "$a" in
    --quick) QUICK=1 ;;
    ours | torch | memory) PARTS="$PARTS $a" ;;
    *) echo "usage: $0 [--quick] [ours] [torch] [memory]" >&2; exit 2 ;;
    esac
done
[ -z "$PARTS" ] && PARTS=" ours torch memory"
part() { case "$PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
RESULTS=${BENCH_RESULTS:-}
DRY=${LLMC_GPU_DRY:-0}
STEPS=${STEPS:-$([ $QUICK = 1 ] && echo 8 || echo 20)}
if [ "$DRY" = 1 ]; then
    B=${B:-2} T=${T:-64} MODEL=d1 TRAIN=build/cudasim/train_gpt GPU_NAME="cudasim dry run, no GPU" STEPS=${STEPS_DRY:-5}
    make --no-print-directory -s "$TRAIN" >/dev/null || { echo "error: make $TRAIN failed"; exit 1; }
else
    B=${B:-64} T=${T:-1024} MODEL=d12 TRAIN=./train_gpt
    make --no-print-directory -s train_gpt >/dev/null || { echo "error: make train_gpt failed"; exit 1; }
    nvidia-smi >/dev/null 2>&1 || { echo "error: no GPU (nvidia-smi failed)"; exit 1; }
    GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
fi
WORK=$(mktemp -d /tmp/llmc_bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# a synthetic shard (llm.c format: int32 header[256] = 20240520, 1, ntok; uint16 tokens)
SHARD=$WORK/bench_train.bin
"$(command -v python3 || echo /usr/bin/python3)" - "$SHARD" $(( (STEPS + 2) * B * T + 1 )) <<'PY'
import struct, sys, random
path, n = sys.argv[1], int(sys.argv[2])
random.seed(1)
hdr = [20240520, 1, n] + [0] * 253
with open(path, "wb") as f:
    f.write(struct.pack("<256i", *hdr))
    f.write(struct.pack("<%dH" % n, *[random.randrange(50257) for _ in range(n)]))
PY

run_train() { # extra flags...; prints the output
    "$TRAIN" -e $MODEL -i "$SHARD" -v 0 -s 0 -o "" "$@" 2>&1
}
plan_mib() { # flags...; the planned device peak in MiB (--plan --json's peak_bytes)
    "$TRAIN" -e $MODEL --plan --json "$@" 2>/dev/null | sed -n 's/.*"peak_bytes": *\([0-9]*\).*/\1/p' | awk '{ printf "%.1f", $1 / 1048576 }'
}
mean_after_warmup() { # field regex; averages the step lines' values after the first 3 steps
    awk -v re="$1" '/^step /{ if (match($0, re)) { s = substr($0, RSTART, RLENGTH); gsub(/[^0-9.]/, "", s); n++; if (n > 3) { sum += s; k++ } } } END { if (k) printf "%.1f", sum / k; else print "n/a" }'
}

echo "## llmc GPU benchmark ($GPU_NAME)"
echo
ours=n/a
if part ours; then
    out=$(run_train -b "$B" -t "$T" -x "$STEPS" --precision bf16 -r 0)
    echo "$out" | grep -q "^step " || { echo "$out" | tail -20; echo "error: train_gpt failed"; exit 1; }
    echo "$out" | grep -E "^(step|\\| (memory|param|master|AdamW|grad|activ|backward|fp32|cuBLAS|cuDNN|total|device))"
    ours=$(echo "$out" | mean_after_warmup "[0-9]+ tok/s")
    mfu=$(echo "$out" | mean_after_warmup "MFU [0-9.]+%")
    ms=$(echo "$out" | mean_after_warmup "[0-9.]+ ms")
    echo
    echo "| run | ms/step | tokens/s | MFU |"
    echo "|---|---|---|---|"
    echo "| train_gpt $MODEL B=$B T=$T bf16 -r 0 | $ms | $ours | $mfu% |"
    [ -n "$RESULTS" ] && echo "ours_tokens_per_s=$ours" >> "$RESULTS"
    # the same with the micro-step replayed as one CUDA graph (--cuda-graph 1, default off until a GPU
    # has run it): a failure here is reported and the other parts go on (fatal in the dry run)
    gout=$(run_train -b "$B" -t "$T" -x "$STEPS" --precision bf16 -r 0 --cuda-graph 1)
    if echo "$gout" | grep -q "^step " && echo "$gout" | grep -q "^CUDA graph: 1 capture"; then
        echo "| train_gpt $MODEL B=$B T=$T bf16 -r 0 --cuda-graph 1 | $(echo "$gout" | mean_after_warmup "[0-9.]+ ms") |" \
             "$(echo "$gout" | mean_after_warmup "[0-9]+ tok/s") | $(echo "$gout" | mean_after_warmup "MFU [0-9.]+%")% |"
    else
        echo "$gout" | tail -15
        echo "| train_gpt $MODEL B=$B T=$T bf16 -r 0 --cuda-graph 1 | failed (output above) | | |"
        [ "$DRY" = 1 ] && { echo "error: the --cuda-graph 1 run failed"; exit 1; }
    fi
elif [ -n "$RESULTS" ] && [ -f "$RESULTS" ]; then
    ours=$(sed -n 's/^ours_tokens_per_s=//p' "$RESULTS" | tail -1)
    [ -z "$ours" ] && ours=n/a
fi

if part torch; then
    ref=n/a
    tpy=""
    for p in ${PYTHON_GPU:-} python3 /usr/bin/python3; do
        if command -v "$p" >/dev/null 2>&1 && "$p" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then tpy=$p; break; fi
    done
    if [ "$DRY" = 1 ]; then
        echo "PyTorch reference: not run (dry run)"
    elif [ -z "$tpy" ]; then
        echo "PyTorch reference: no python3 with a CUDA torch found (tried: ${PYTHON_GPU:-} python3 /usr/bin/python3)"
    else
        pout=$(timeout "${BENCH_TORCH_TIMEOUT:-900}" "$tpy" dev/reference/train_gpt2.py --bench-steps "$STEPS" --compile --flash \
            --dtype bfloat16 --device cuda --batch-size "$B" --seq-len "$T" 2>&1)
        echo "$pout" | grep BENCH
        ref=$(echo "$pout" | sed -n 's/.*BENCH pytorch .*tokens_per_s=\([0-9.]*\).*/\1/p' | tail -1)
        [ -z "$ref" ] && { ref=n/a; echo "$pout" | tail -15; }
    fi
    echo "| PyTorch reference ($tpy: compile, flash, bf16) | | $ref | |"
    if [ "$ref" != n/a ] && [ "$ours" != n/a ]; then
        echo
        echo "ratio train_gpt / PyTorch: $(awk -v a="$ours" -v b="$ref" 'BEGIN{printf "%.2f", a / b}') (train_gpt $ours tokens/s, measured earlier in this run)"
    fi
fi
part memory || exit 0

echo
echo "| -r | peak GiB at B=$B | largest B (T=$T) |"
echo "|---|---|---|"
if [ "$DRY" = 1 ]; then # the device total from train_gpt's startup table
    total_mib=$(run_train -b 1 -t "$T" -x 1 | sed -n 's/^| device total *| *\([0-9]*\).*/\1/p' | head -1)
else
    total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
fi
RS="0 1 2 3"
[ "$DRY" = 1 ] && RS="0 3" # the rehearsal checks the plumbing; test_gpt covers every -r through cudasim
for r in $RS; do
    peak=$(run_train -b "$B" -t "$T" -x 2 --precision bf16 -r $r | sed -n 's/.*(peak \([0-9.]*\)).*/\1/p' | tail -1)
    # the device bytes at B=1 and B=2 from the plan (--plan: no allocation, no step; the trainer
    # checks at startup that what it allocates equals the plan), in MiB
    m1=$(plan_mib -b 1 -t "$T" --precision bf16 -r $r)
    m2=$(plan_mib -b 2 -t "$T" --precision bf16 -r $r)
    # 95% of the device, less the CUDA context (~600 MiB)
    bmax=$(awk -v a="$m1" -v b="$m2" -v t="$total_mib" 'BEGIN{ per = b - a; if (per <= 0) { print "n/a"; exit } printf "%d", (0.95 * t - 600 - (a - per)) / per }')
    note=estimate
    if [ $QUICK = 0 ] && [ "$bmax" != n/a ]; then
        while [ "$bmax" -gt 1 ] && ! run_train -b "$bmax" -t "$T" -x 1 --precision bf16 -r $r | grep -q "^step "; do
            bmax=$((bmax * 9 / 10))
        done
        note=verified
    fi
    echo "| $r | ${peak:-n/a} | $bmax ($note) |"
done
