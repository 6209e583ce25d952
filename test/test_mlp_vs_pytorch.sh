#!/usr/bin/env bash
# The MLP-only test architecture on the CPU (llmc/cpu/mlp.c) against the PyTorch reference
# (dev/reference/train_mlp.py): random 2- and 3-layer models (C 64, F 256; C 48, F 96); logits,
# loss, every gradient, a 10-step trajectory, the checkpoint saved back byte for byte. Then the
# mlp:dN descriptors, init rules and bf16 files, and bad headers refused naming the file. End to end
# through the registries: ./train_gpt_cpu -e mlp:d2 trains, checkpoints, resumes byte-identically,
# shards over 2 ranks (-pi fs, -z 1-3), plans; ./generate continues a prompt from its checkpoint;
# the harness's CUDA trainer and generator refuse it naming the architecture.
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
. test/checkfile.sh
bad() { expect_refused "$1" "$out/model2.bin" "$2" "$3" build/test/test_mlp_cpu "$out/bad.bin" "$out/state2.bin"; }
bad "a wrong version is refused" "b[4:8]=struct.pack('<i',9)" "unsupported version"
bad "heads other than 1 are refused" "b[28:32]=struct.pack('<i',2)" "no attention heads"
bad "an untied head is refused" "b[44:48]=struct.pack('<i',0)" "tied (slot 11) must be 1"
bad "an unknown dtype is refused" "b[48:52]=struct.pack('<i',5)" "dtype (slot 12)"
bad "a zero eps is refused" "b[64:68]=struct.pack('<f',0.0)" "norm eps must be > 0"
bad "truncated parameters are refused" "del b[-4:]" "the file is truncated"
bad "a non-finite weight is refused naming its tensor" "b[1024:1028]=struct.pack('<f',float('nan'))" "non-finite weight .* in tensor wte"

# ---- end to end: the architecture through the registries (formats/arch.c, cpu/arch.c) ----
# a synthetic GPT-2-token shard; seeded runs of ./train_gpt_cpu -e mlp:d2, ./generate on their checkpoint
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1"; status=1; }
/usr/bin/python3 -c "
import struct, random, sys
random.seed(13); n = 4000
with open(sys.argv[1], 'wb') as f:
    f.write(struct.pack('<256i', *([20240520, 1, n] + [0] * 253)))
    f.write(struct.pack('<%dH' % n, *[random.randrange(50257) for _ in range(n)]))" "$out/train.bin"
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1
run="-e mlp:d2 -i $out/train.bin -j $out/train.bin -b 2 -t 32 -v 2 -m 2 -s 0 -g 4 --threads 1 -l 1e-3 -u 1 -c 0.1 -k constant -x 3"
losses() { grep -o '"train_loss":[-0-9.e]*' "$1/log.jsonl" | cut -d: -f2 | tr '\n' ' '; }
if ./train_gpt_cpu $run -n 1 -o "$out/full" > "$out/full.log" 2>&1 && [ -f "$out/full/model_00000003.bin" ] &&
    [ "$(losses "$out/full" | wc -w)" = 3 ]; then pass "./train_gpt_cpu -e mlp:d2 trains 3 steps and checkpoints each (-o)"
else fail "./train_gpt_cpu -e mlp:d2 -x 3 -o: $(tail -2 "$out/full.log")"; fi
# resume: the step-2 checkpoint of the run (step 3 removed), -y 1: step 3 byte-identical
cp -r "$out/full" "$out/part" && rm -f "$out/part/"*00000003*
if ./train_gpt_cpu $run -n 1 -o "$out/part" -y 1 > "$out/part.log" 2>&1 && grep -q "resumed from step 2" "$out/part.log" &&
    cmp -s "$out/full/model_00000003.bin" "$out/part/model_00000003.bin" &&
    cmp -s "$out/full/state_00000003_00000.bin" "$out/part/state_00000003_00000.bin"; then
    pass "-y 1 from step 2 writes step 3's model and state byte-identical to the uninterrupted run"
else fail "-y 1 resume of mlp:d2: $(tail -2 "$out/part.log")"; fi
# 2 ranks over -pi fs: -z 1/2/3 (optimizer states, gradient buckets, parameter shards through
# cpu/zero.h) byte-identical to -z 0; the losses those of one process accumulating the same batch
two() { TRAINER=./train_gpt_cpu scripts/run_dist.sh local 2 --pi fs $run -n 3 -z "$1" -o "$out/two$1" > "$out/two$1.log" 2>&1; }
if two 0 && ./train_gpt_cpu $run -n 3 -d 128 -o "$out/one" > "$out/one.log" 2>&1; then
    for z in 1 2 3; do
        if two $z && cmp -s "$out/two0/model_00000003.bin" "$out/two$z/model_00000003.bin"; then
            pass "2 ranks over -pi fs, -z $z: the final model byte-identical to -z 0"
        else fail "2 ranks over -pi fs, -z $z: $(tail -2 "$out/two$z.log")"; fi
    done
    a=$(losses "$out/one"); b=$(losses "$out/two0")
    if /usr/bin/python3 -c "import sys; a, b = (list(map(float, s.split())) for s in sys.argv[1:3]);
sys.exit(not (len(a) == len(b) == 3 and all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b))))" "$a" "$b"; then
        pass "2 ranks over -pi fs: losses equal one process with -d 128 (2 accumulation steps): $b"
    else fail "2 ranks vs one process: losses '$b' vs '$a'"; fi
else fail "2 ranks over -pi fs (-z 0) or one process -d 128: $(tail -2 "$out/two0.log") $(tail -2 "$out/one.log")"; fi
# --plan: the plan of the architecture's tables; -r noted and run as 0
msg=$(./train_gpt_cpu --plan -e mlp:d2 -b 2 -t 32 -r 1 2>&1)
if grep -q "^memory plan (CPU, rank 0): .* parameters, B 2, T 32, -r 0" <<<"$msg" && grep -q "logits .*(B, T, Vp)" <<<"$msg" &&
    grep -q "note: -r 1: the CPU MLP keeps every activation" <<<"$msg"; then pass "--plan -e mlp:d2 prints its plan (-r 1 noted, run as 0)"
else fail "--plan -e mlp:d2: $(head -3 <<<"$msg")"; fi
# ./generate on its checkpoint: 12 greedy tokens after the prompt, the same text twice
gen() { LLMC_DATA_DIR=${LLMC_DATA_DIR:-../shared/data} ./generate -e "$out/full/model_00000003.bin" --prompt "The king said" \
    -g 12 --temperature 0 --threads 1 2> "$out/gen.err" || true; }
g1=$(gen); g2=$(gen)
if [ "${g1#The king said}" != "$g1" ] && [ ${#g1} -gt 13 ] && [ "$g1" = "$g2" ] && grep -q "generated 12 tokens" "$out/gen.err"; then
    pass "./generate -e <mlp checkpoint>: 12 greedy tokens, the same twice: $g1"
else fail "./generate -e <mlp checkpoint>: '$g1' vs '$g2': $(tail -2 "$out/gen.err")"; fi
# the CUDA runtime builds GPT-2 and the Llama only: the CUDA trainer and generator refuse it by name
for b in build/cudasim/train_gpt build/cudasim/generate; do
    [ -x "$b" ] || { echo "SKIP: $b not built"; continue; }
    for e in mlp:d2 "$out/full/model_00000003.bin"; do
        if [ "$b" = build/cudasim/generate ]; then flags=(-g 1); want="is a MLP model: ./generate_gpu runs GPT-2 only"
        else flags=(-i "$out/train.bin" -x 1); want="is a MLP model: the CUDA trainer has no block sequence for it yet"; fi
        set +e; msg=$("$b" -e "$e" "${flags[@]}" 2>&1); rc=$?; set -e
        if [ $rc = 1 ] && grep -qF -- "error: -e $e $want" <<<"$msg"; then pass "$b -e ${e##*/}: stops naming the architecture"
        else fail "$b -e $e (exit $rc): $(tail -1 <<<"$msg")"; fi
    done
done
exit $status
