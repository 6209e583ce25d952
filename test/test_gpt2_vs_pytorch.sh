#!/usr/bin/env bash
# Regenerates the PyTorch reference (a random 2-layer GPT-2 with the full GPT-2 vocabulary, so
# the padded rows are exercised) and checks the CPU model against it at every recompute level.
set -euo pipefail
out=$(mktemp -d /tmp/llmc_ref.XXXXXX)
trap 'rm -rf "$out"' EXIT
/usr/bin/python3 dev/reference/train_gpt2.py --depth 2 --channels 64 --heads 4 --max-seq-len 64 \
    --seed 42 --batch-size 4 --seq-len 32 --steps 10 \
    --save-model "$out/model.bin" --debug-state "$out/state.bin"
status=0
for r in 0 1 2; do
    echo "--- recompute $r"
    build/test/test_gpt2_cpu "$out/model.bin" "$out/state.bin" "$r" || status=1
done
exit $status
