#!/usr/bin/env bash
# The CPU Llama model (llmc/cpu/llama.c) against the PyTorch reference (dev/reference/train_llama3.py):
# a random 2-layer Llama (C 64, NH 4, HS 16) with grouped-query attention (NKV 2) and multi-query
# attention (NKV 1), RoPE theta 10000 with Llama 3.1 scaling set so that all three frequency bands
# occur; logits, loss, every gradient, a 10-step trajectory, the checkpoint header round trip.
# Then the released shapes' sizes by name.
set -euo pipefail
out=$(mktemp -d /tmp/llmc_llama_ref.XXXXXX)
trap 'rm -rf "$out"' EXIT
status=0
for nkv in 2 1; do
    echo "--- NKV $nkv"
    /usr/bin/python3 dev/reference/train_llama3.py --depth 2 --channels 64 --heads 4 --kv-heads "$nkv" \
        --max-seq-len 64 --vocab 1000 --seed 42 --batch-size 4 --seq-len 32 --steps 10 \
        --save-model "$out/model$nkv.bin" --debug-state "$out/state$nkv.bin"
    build/test/test_llama_cpu "$out/model$nkv.bin" "$out/state$nkv.bin" || status=1
done
build/test/test_llama_cpu --shapes || status=1
# bad Llama checkpoints: a clear error naming the file, exit status 1
. test/checkfile.sh
bad() { expect_refused "$1" "$out/model2.bin" "$2" "$3" build/test/test_llama_cpu "$out/bad.bin" "$out/state2.bin"; }
bad "wrong magic is refused" "b[0:4]=struct.pack('<i',1234)" "bad magic"
bad "unknown architecture is refused" "b[8:12]=struct.pack('<i',7)" "unknown architecture"
bad "NH not divisible by NKV is refused" "b[32:36]=struct.pack('<i',3)" "not divisible by key/value heads"
bad "truncated parameters are refused" "del b[-4:]" "bytes, but its header describes"
exit $status
