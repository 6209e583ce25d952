#!/usr/bin/env bash
# The MLP-only test architecture on the CPU (llmc/cpu/mlp.c) against the PyTorch reference
# (dev/reference/train_mlp.py): random 2- and 3-layer models (C 64, F 256; C 48, F 96); logits,
# loss, every gradient, a 10-step trajectory, the checkpoint saved back byte for byte. Then the
# mlp:dN descriptors, init rules and bf16 files, and bad headers refused naming the file.
set -euo pipefail
out=$(mktemp -d /tmp/llmc_mlp_ref.XXXXXX)
trap 'rm -rf "$out"' EXIT
status=0
for shape in "2 64 0" "3 48 96"; do
    read -r depth channels ffn <<<"$shape"
    echo "--- L $depth C $channels F ${ffn/#0/4C}"
    /usr/bin/python3 dev/reference/train_mlp.py --depth "$depth" --channels "$channels" --ffn "$ffn" \
        --max-seq-len 64 --vocab 1000 --seed 42 --batch-size 4 --seq-len 32 --steps 10 \
        --save-model "$out/model$depth.bin" --debug-state "$out/state$depth.bin"
    build/test/test_mlp_cpu "$out/model$depth.bin" "$out/state$depth.bin" || status=1
done
build/test/test_mlp_cpu --descriptors "$out" || status=1
# the cached decode refuses to go past maxT (64 here), naming it
set +e
msg=$(build/test/test_mlp_cpu "$out/model2.bin" "$out/state2.bin" --past-maxT 2>&1)
rc=$?
set -e
if [ $rc -eq 1 ] && grep -q "error: the sequence would reach 72 tokens, beyond the model's context of 64 (maxT)" <<<"$msg"; then
    echo "PASS: the cached decode refuses to run past maxT"
else echo "FAIL: the cached decode past maxT (exit $rc): $(tail -2 <<<"$msg")"; status=1; fi
# bad MLP checkpoints: a clear error naming the file, exit status 1
bad() { # name, python that edits bytearray b, expected message
    /usr/bin/python3 -c "import struct,sys; b=bytearray(open(sys.argv[1],'rb').read()); $2; open(sys.argv[2],'wb').write(b)" \
        "$out/model2.bin" "$out/bad.bin"
    set +e
    msg=$(build/test/test_mlp_cpu "$out/bad.bin" "$out/state2.bin" 2>&1)
    rc=$?
    set -e
    if [ $rc -eq 1 ] && grep -q "error: .*bad.bin.*$3" <<<"$msg"; then echo "PASS: $1"
    else echo "FAIL: $1 (exit $rc): $msg" | head -3; status=1; fi
}
bad "a wrong version is refused" "b[4:8]=struct.pack('<i',9)" "unsupported version"
bad "heads other than 1 are refused" "b[28:32]=struct.pack('<i',2)" "no attention heads"
bad "an untied head is refused" "b[44:48]=struct.pack('<i',0)" "tied (slot 11) must be 1"
bad "an unknown dtype is refused" "b[48:52]=struct.pack('<i',5)" "dtype (slot 12)"
bad "a zero eps is refused" "b[64:68]=struct.pack('<f',0.0)" "norm eps must be > 0"
bad "truncated parameters are refused" "del b[-4:]" "the file is truncated"
bad "a non-finite weight is refused naming its tensor" "b[1024:1028]=struct.pack('<f',float('nan'))" "non-finite weight .* in tensor wte"
exit $status
