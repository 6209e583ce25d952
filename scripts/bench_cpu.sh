#!/usr/bin/env bash
# make bench: CPU training speed of GPT-2 124M (-e d12) at B=4, T=64 — ./train_gpt_cpu against
# the project's PyTorch reference (dev/reference/train_gpt2.py) on the same config in the same
# run. Prints ms/step, tokens/s, GFLOP/s, the fraction of this CPU's measured fp32 peak, peak
# RSS, and the ratio. Runs twice: with the environment as it is, and with OPENBLAS_CORETYPE and
# OPENBLAS_L2_SIZE unset (OpenBLAS picks kernels for this CPU itself) — both peers get the same.
# Then a Llama 3 of about the same size against dev/reference/train_llama3.py (run_llama below).
# Env: BENCH_STEPS (timed steps, default 6), BENCH_MODES ("as-is autodetect"; "" = none: the Llama only),
# BENCH_LLAMA (1; 0 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${BENCH_STEPS:-6}
modes=${BENCH_MODES-as-is autodetect}
out=build/bench
mkdir -p "$out"
py=/usr/bin/python3

# random tokens: timing does not depend on the text
$py test/testlib.py random-shard "$out/tokens.bin" $((4 * 64 * 64 + 1)) 0
gcc -O2 -march=native -fopenmp dev/bench/cpu_peak.c -o "$out/cpu_peak"
# the CPU's own peak (widest vectors, all cores, best of several runs; OpenBLAS plays no part)
peak=$("$out/cpu_peak" | sed -n 's/.*gflops=\([0-9.]*\).*/\1/p')

# flops per step: the trainer's basis, 6N + 6LCT per token (N = 124,475,904 for d12)
flops=$($py -c "print((6 * 124475904 + 6 * 12 * 768 * 64) * 4 * 64)")

peak_rss() { awk '/Maximum resident set size/ {printf "%.0f", $NF / 1024}' "$1"; }

# the median step time of a run directory's log.jsonl, without its first step (which pays for the
# page faults of fresh buffers)
median_step_ms() {
    $py -c "
import json, statistics, sys
ms = [json.loads(l)['step_ms'] for l in open(sys.argv[1] + '/log.jsonl') if 'train_loss' in l][1:]
print(statistics.median(ms))" "$1"
}

# the table of one comparison: bench_table TITLE NOTE FLOPS_PER_STEP OURS_MS OURS_RSS TORCH_MS TORCH_RSS
# (NOTE follows the speed ratio's line; GFLOP/s and % of the measured $peak from the flops per step)
bench_table() {
    $py - "$peak" "$@" <<'PY'
import sys
peak, title, note, flops, ours, ours_rss, torch, torch_rss = sys.argv[1:]
peak, flops, ours, torch = float(peak), float(flops), float(ours), float(torch)
print(f"\n### {title}\n")
print("| trainer | ms/step | tokens/s | GFLOP/s | % of peak | peak RSS MiB |")
print("|---|---|---|---|---|---|")
for name, ms, rss in (("train_gpt_cpu", ours, ours_rss), ("PyTorch reference", torch, torch_rss)):
    g = flops / (ms * 1e6)
    print(f"| {name} | {ms:.0f} | {256 / (ms / 1e3):.0f} | {g:.1f} | {100 * g / peak:.0f}% | {rss} |")
print(f"\ntrain_gpt_cpu is {torch / ours:.2f}x faster than the PyTorch reference{note}")
PY
}

run_mode() {
    local mode=$1
    local -a env_cmd=(env)
    [ "$mode" = autodetect ] && env_cmd=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
    local ours_ms torch_ms
    rm -rf "$out/ours"
    "${env_cmd[@]}" /usr/bin/time -v ./train_gpt_cpu -i "$out/tokens.bin" -j "$out/tokens.bin" -e d12 -b 4 -t 64 \
        -x $((steps + 1)) -v 0 -s 0 -o "$out/ours" > "$out/ours.txt" 2> "$out/ours.time"
    ours_ms=$(median_step_ms "$out/ours")
    local core
    # e.g. "Cooperlake kernels (chosen by llmc from the CPU's features; OpenBLAS detected Prescott)"
    core=$(sed -n 's/^backend: CPU fp32, OpenBLAS \(.* kernels\( ([^)]*)\)\{0,1\}\), [0-9]* threads\{0,1\}$/\1/p' "$out/ours.txt")
    "${env_cmd[@]}" /usr/bin/time -v $py dev/reference/train_gpt2.py --bench-steps "$steps" --batch-size 4 --seq-len 64 \
        > "$out/torch.txt" 2> "$out/torch.time"
    torch_ms=$(sed -n 's/^BENCH pytorch ms_per_step=\([0-9.]*\).*/\1/p' "$out/torch.txt")
    bench_table "OpenBLAS environment: $mode (our trainer ran OpenBLAS $core); CPU fp32 peak measured: $(printf %.0f "$peak") GFLOP/s" \
        " (target: at most 1500 ms/step)" "$flops" "$ours_ms" "$(peak_rss "$out/ours.time")" "$torch_ms" \
        "$(peak_rss "$out/torch.time")"
}

# Llama 3 of about GPT-2 124M's size (issue 11): L 12, C 768, NH 12, NKV 4 (grouped-query), F 2048
# (Llama's 2/3 * 4C rounded to 256), RoPE theta 500000, GPT-2's vocabulary, untied head: 153M
# parameters. The reference writes the model it times (llmc's Llama checkpoint), our trainer
# loads that file; same B, T and steps, the environment as it is.
run_llama() {
    local shape=(--depth 12 --channels 768 --heads 12 --kv-heads 4 --ffn 2048 --max-seq-len 1024 --vocab 50257
                 --theta 500000 --rope-factor 0 --batch-size 4 --seq-len 64)
    /usr/bin/time -v $py dev/reference/train_llama3.py "${shape[@]}" --bench-steps "$steps" \
        --save-model "$out/llama.bin" > "$out/llama_torch.txt" 2> "$out/llama_torch.time"
    local torch_ms ours_ms
    torch_ms=$(sed -n 's/^BENCH pytorch ms_per_step=\([0-9.]*\).*/\1/p' "$out/llama_torch.txt")
    rm -rf "$out/llama_ours"
    /usr/bin/time -v ./train_gpt_cpu -i "$out/tokens.bin" -j "$out/tokens.bin" -e "$out/llama.bin" -b 4 -t 64 -r 0 \
        -x $((steps + 1)) -v 0 -s 0 -o "$out/llama_ours" > "$out/llama_ours.txt" 2> "$out/llama_ours.time"
    ours_ms=$(median_step_ms "$out/llama_ours")
    local params
    params=$(sed -n 's/^model: .*: \([0-9]*\) parameters$/\1/p' "$out/llama_ours.txt")
    rm -f "$out/llama.bin" "$out"/llama_ours/model_* "$out"/llama_ours/state_*
    bench_table "Llama 3, L 12, C 768, NH 12, NKV 4, F 2048, V 50257 ($($py -c "print(f'{$params / 1e6:.0f}')")M parameters), B=4, T=64, fp32" \
        " on this Llama (target: 3x)" "$($py -c "print((6 * $params + 6 * 12 * 768 * 64) * 4 * 64)")" "$ours_ms" \
        "$(peak_rss "$out/llama_ours.time")" "$torch_ms" "$(peak_rss "$out/llama_torch.time")"
}

echo "## make bench: GPT-2 124M (d12), B=4, T=64, fp32, $(nproc) cores, median of $steps steps ($(date -u +%F))"
for m in $modes; do run_mode "$m"; done
if [ "${BENCH_LLAMA:-1}" = 1 ]; then run_llama; fi
