#!/usr/bin/env bash
# test_cuda_trainer_sim.sh - ./train_gpt's whole loop through the cudasim harness (no GPU):
# 3 bf16 steps of d1 with a checkpoint, resumed by train_gpt_cpu for 2 steps, resumed again by
# train_gpt in fp16 for 1 step. Checks that each run trains (finite losses) and resumes.
set -u
cd "$(dirname "$0")/.."
SIM=build/cudasim/train_gpt
[ -x "$SIM" ] && [ -x ./train_gpt_cpu ] || { echo "FAIL: build $SIM and train_gpt_cpu first"; exit 1; }
W=$(mktemp -d /tmp/llmc_simtrain.XXXXXX)
trap 'rm -rf "$W"' EXIT
/usr/bin/python3 - "$W/train.bin" <<'PY'
import struct, random, sys
random.seed(3); n = 20000
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *([20240520, 1, n] + [0] * 253)))
    f.write(struct.pack("<%dH" % n, *[random.randrange(50257) for _ in range(n)]))
PY
export OMP_WAIT_POLICY=passive
common="-e d1 -i $W/train.bin -b 2 -t 16 -v 0 -s 0 -o $W/out"
check() { # name, expected last step, output
    if echo "$3" | grep -q "^step *$2/" && ! echo "$3" | grep "^step" | grep -qi "nan\|inf"; then echo "PASS: $1"
    else echo "FAIL: $1"; echo "$3" | tail -5; FAILED=1; fi
}
FAILED=0
check "train_gpt (harness) bf16 3 steps + checkpoint" 3 "$($SIM $common -x 3 -n 3 2>&1)"
check "train_gpt_cpu resumes a train_gpt checkpoint" 5 "$(./train_gpt_cpu $common -x 5 -n 5 -y 1 2>&1)"
check "train_gpt (harness) fp16 resumes a train_gpt_cpu checkpoint" 6 "$($SIM $common -x 6 -n 6 -y 1 --precision fp16 2>&1)"

# fp16 resume is bit-exact, loss scaler included: an uninterrupted run against one that stops
# at the step-2 checkpoint (its later files removed) and resumes
fp16="-e d1 -i $W/train.bin -b 2 -t 16 -v 0 -s 0 --precision fp16 -x 4 -n 2"
$SIM $fp16 -o "$W/full" > /dev/null 2>&1
$SIM $fp16 -o "$W/part" > /dev/null 2>&1
rm -f "$W/part/DONE_00000004" "$W/part/model_00000004.bin" "$W/part/state_00000004_00000.bin"
$SIM $fp16 -o "$W/part" -y 1 > /dev/null 2>&1
series() { /usr/bin/python3 -c "
import json, sys
print([(r['step'], r['train_loss'], r['grad_norm'], r.get('loss_scale')) for r in map(json.loads, open(sys.argv[1])) if 'train_loss' in r])" "$1"; }
a=$(series "$W/full/log.jsonl" 2>&1); b=$(series "$W/part/log.jsonl" 2>&1)
if [ "$a" = "$b" ] && echo "$a" | grep -q "(4, " && cmp -s "$W/full/model_00000004.bin" "$W/part/model_00000004.bin"; then
    echo "PASS: train_gpt (harness) fp16 resume is bit-exact (losses, norms, loss scale, weights)"
else
    echo "FAIL: train_gpt (harness) fp16 resume differs"; echo "  full: $a"; echo "  part: $b"; FAILED=1
fi
exit $FAILED
