#!/usr/bin/env bash
# test_cuda_trainer_sim.sh - ./train_gpt's whole loop through the cudasim harness (no GPU):
# 3 bf16 steps of d1 with a checkpoint, resumed by train_gpt_cpu for 2 steps, resumed again by
# train_gpt in fp16 for 1 step. Checks that each run trains (finite losses) and resumes; that an
# fp16 resume is bit-exact; and -lg telemetry, without NVML and with a stub NVML library.
set -u
. "$(dirname "$0")/sim_setup.sh" llmc_simtrain
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
# (a longer -x and another precision change the math: said with --allow-config-change 1)
check "train_gpt_cpu resumes a train_gpt checkpoint" 5 "$(./train_gpt_cpu $common -x 5 -n 5 -y 1 --allow-config-change 1 2>&1)"
check "train_gpt (harness) fp16 resumes a train_gpt_cpu checkpoint" 6 "$($SIM $common -x 6 -n 6 -y 1 --precision fp16 --allow-config-change 1 2>&1)"

# -x 0 (evaluation only) through the harness: the latest checkpoint's val loss, no training step;
# in fp32 equal to train_gpt_cpu's -x 0 to 1e-5 relative (the summation orders differ)
evalonly="-e d1 -i $W/none_*.bin -j $W/train.bin -b 2 -t 16 -m 2 -s 0 -x 0 -y 1 -o $W/out"
ev_sim=$($SIM $evalonly --precision fp32 2>&1); ev_cpu=$(./train_gpt_cpu $evalonly 2>&1)
v_sim=$(echo "$ev_sim" | sed -n 's/^val loss \([0-9.]*\) (step 6)$/\1/p'); v_cpu=$(echo "$ev_cpu" | sed -n 's/^val loss \([0-9.]*\) (step 6)$/\1/p')
if [ -n "$v_sim" ] && [ -n "$v_cpu" ] && ! echo "$ev_sim" | grep -q "^step" &&
    /usr/bin/python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 1e-5 * abs(b))" "$v_sim" "$v_cpu"; then
    echo "PASS: train_gpt (harness) -x 0 evaluates the checkpoint only, equal to train_gpt_cpu's ($v_sim vs $v_cpu)"
else
    echo "FAIL: train_gpt (harness) -x 0"; echo "$ev_sim" | tail -3; echo "$ev_cpu" | tail -3; FAILED=1
fi

# Hugging Face directories (llmc/formats/hf.c) load through the same -e path: the step-6 checkpoint as an
# HF directory (./hf_convert) evaluates to exactly the val loss of the llm.c file (same binary,
# same weights), and --save-hf 1 writes a directory that converts back to the checkpoint's bytes
if [ -x ./hf_convert ]; then
    rm -rf "$W/hf6"
    ./hf_convert "$W/out/model_00000006.bin" "$W/hf6" > /dev/null
    hfeval="-i $W/none_*.bin -j $W/train.bin -b 2 -t 16 -m 2 -s 0 -x 0 --precision fp32"
    v_hf=$($SIM -e "$W/hf6" $hfeval 2>&1 | sed -n 's/^val loss \([0-9.]*\) (step 0)$/\1/p')
    v_bin=$($SIM -e "$W/out/model_00000006.bin" $hfeval 2>&1 | sed -n 's/^val loss \([0-9.]*\) (step 0)$/\1/p')
    out=$($SIM -e "$W/hf6" -i $W/train.bin -b 2 -t 16 -v 0 -s 0 -x 1 --precision fp32 --save-hf 1 -o "$W/hfrun" 2>&1)
    ./hf_convert "$W/hfrun/model_00000001_hf" "$W/hfrun_back.bin" > /dev/null 2>&1
    if [ -n "$v_hf" ] && [ "$v_hf" = "$v_bin" ] && cmp -s "$W/hfrun_back.bin" "$W/hfrun/model_00000001.bin"; then
        echo "PASS: train_gpt (harness) -e HF directory evaluates like the llm.c file ($v_hf) and --save-hf 1 round-trips"
    else
        echo "FAIL: train_gpt (harness) -e HF directory: val loss '$v_hf' vs '$v_bin'"; echo "$out" | tail -3; FAILED=1
    fi
else
    echo "SKIP: train_gpt (harness) -e HF directory: ./hf_convert not built (cJSON missing)"
fi

# fp16 resume is bit-exact, loss scaler included: an uninterrupted run against one that stops
# at the step-2 checkpoint (its later files removed) and resumes
fp16="-e d1 -i $W/train.bin -b 2 -t 16 -v 0 -s 0 --precision fp16 -x 4 -n 2"
$SIM $fp16 -o "$W/full" > /dev/null 2>&1
$SIM $fp16 -o "$W/part" > /dev/null 2>&1
rm -f "$W/part/DONE_00000004" "$W/part/model_00000004.bin" "$W/part/state_00000004_00000.bin"
# (the resumed part offers 2 algorithms per matmul: it must take the ones -o/matmul_algos.txt
# recorded instead of tuning anew, which would print a "matmul ..." line per shape)
CUDASIM_LT_ALGOS=2 $SIM $fp16 -o "$W/part" -y 1 > "$W/part_resume.txt" 2>&1
if [ "$(sed -n 1p "$W/part/matmul_algos.txt" 2>/dev/null)" = "llmc-matmul-algos 1" ] && [ "$(wc -l < "$W/part/matmul_algos.txt")" -gt 3 ] &&
    grep -q "^step *4/" "$W/part_resume.txt" && ! grep -q "^matmul " "$W/part_resume.txt"; then
    echo "PASS: train_gpt (harness) keeps its matmul algorithms in -o/matmul_algos.txt and a resume reuses them"
else
    echo "FAIL: train_gpt (harness) matmul algorithm cache in -o"; grep "^matmul \|^note\|error" "$W/part_resume.txt" | head -5; FAILED=1
fi
series() { /usr/bin/python3 -c "
import json, sys
print([(r['step'], r['train_loss'], r['grad_norm'], r.get('loss_scale')) for r in map(json.loads, open(sys.argv[1])) if 'train_loss' in r])" "$1"; }
a=$(series "$W/full/log.jsonl" 2>&1); b=$(series "$W/part/log.jsonl" 2>&1)
if [ "$a" = "$b" ] && echo "$a" | grep -q "(4, " && cmp -s "$W/full/model_00000004.bin" "$W/part/model_00000004.bin"; then
    echo "PASS: train_gpt (harness) fp16 resume is bit-exact (losses, norms, loss scale, weights)"
else
    echo "FAIL: train_gpt (harness) fp16 resume differs"; echo "  full: $a"; echo "  part: $b"; FAILED=1
fi

# -lg (GPU telemetry). The harness has no NVML: every step line is followed by a "gpu" line with
# the device memory and "NVML unavailable", log.jsonl gets the memory keys, and training is
# unchanged (losses, norms and the final weights equal those of the same run without -lg).
tiny="-e d1 -i $W/train.bin -b 2 -t 16 -v 0 -s 0 -x 3 -n 3"
$SIM $tiny -o "$W/nolg" > "$W/nolg.txt" 2>&1; rc_nolg=$?
$SIM $tiny -o "$W/lg" -lg 1 > "$W/lg.txt" 2>&1; rc_lg=$?
# The loaded-NVML path through test/nvml_stub.c (a libnvidia-ml.so.1 that knows cudasim's bus id,
# with fixed readings and an unsupported power-limit query), every 2nd step of 4.
mkdir -p "$W/nvml"
if ${CC:-cc} -std=c11 -Wall -Wextra -Werror -shared -fPIC test/nvml_stub.c -o "$W/nvml/libnvidia-ml.so.1" > "$W/stub_cc.txt" 2>&1; then
    LD_LIBRARY_PATH="$W/nvml${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        $SIM -e d1 -i $W/train.bin -b 2 -t 16 -v 0 -s 0 -x 4 -o "$W/stub" -lg 2 > "$W/stub.txt" 2>&1; rc_stub=$?
else
    rc_stub="stub library did not compile: $(cat "$W/stub_cc.txt")"
fi
/usr/bin/python3 - "$W" "$rc_nolg" "$rc_lg" "$rc_stub" <<'PY' || FAILED=1
import json, os, re, sys
W, rc_nolg, rc_lg, rc_stub = sys.argv[1:5]
failed = 0
def report(ok, name, detail):
    global failed
    print(f"PASS: {name}" if ok else f"FAIL: {name}: {detail}")
    failed += not ok
def text(name):
    return open(os.path.join(W, name)).read() if os.path.exists(os.path.join(W, name)) else ""
def records(run):
    path = os.path.join(W, run, "log.jsonl")
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []
def gpu_lines_after_steps(out):
    """{step: the line right after that step's line}, the number of gpu lines"""
    lines = out.splitlines()
    after = {int(m.group(1)): (lines[i + 1] if i + 1 < len(lines) else "")
             for i, l in enumerate(lines) if (m := re.match(r"step +(\d+)/", l))}
    return after, sum(re.match(r"gpu +\d+/", l) is not None for l in lines)
def training(recs):
    return [(r["step"], r["train_loss"], r["grad_norm"]) for r in recs if "train_loss" in r]

nolg, lg, stub = text("nolg.txt"), text("lg.txt"), text("stub.txt")
base = records("nolg")
report(rc_nolg == "0" and rc_lg == "0" and len(training(base)) == 3, "train_gpt (harness) -lg 1 runs",
       f"exit {rc_nolg} / {rc_lg}: {lg[-400:]}")
after, count = gpu_lines_after_steps(lg)
pat = r"gpu +{s}/3 \| mem (\d+\.\d\d)/(\d+\.\d\d) GiB \| NVML unavailable"
ok = count == 3 and sorted(after) == [1, 2, 3]
for s in after:
    m = re.fullmatch(pat.format(s=s), after[s])
    ok = ok and m is not None and 0 < float(m.group(1)) <= float(m.group(2))
report(ok, "-lg 1 without NVML: a gpu line after every step line: memory, then 'NVML unavailable'",
       f"{count} gpu lines; after the step lines: {after}")
report(lg.count("gpu telemetry every 1 step: NVML unavailable (") == 1 and "gpu " not in nolg,
       "-lg 1 says once at startup why NVML is unavailable; no gpu lines without -lg",
       [l for l in lg.splitlines() if "telemetry" in l])
recs = [r for r in records("lg") if "train_loss" in r]
ok = len(recs) == 3 and all(r.get("gpu_mem_total_gib", 0) > 0 and 0 < r.get("gpu_mem_used_gib", 0) <= r["gpu_mem_total_gib"]
                            and r.get("gpu_nvml") == 0 for r in recs)
ok = ok and all(k in ("gpu_mem_used_gib", "gpu_mem_total_gib", "gpu_nvml") for r in recs for k in r if k.startswith("gpu_"))
ok = ok and not any(k.startswith("gpu_") for r in base for k in r)
report(ok, "-lg 1 without NVML: log.jsonl has gpu_mem_used_gib, gpu_mem_total_gib, gpu_nvml 0 each step", recs[:1])
same_model = open(os.path.join(W, "lg", "model_00000003.bin"), "rb").read() == open(os.path.join(W, "nolg", "model_00000003.bin"), "rb").read() \
    if os.path.exists(os.path.join(W, "lg", "model_00000003.bin")) and os.path.exists(os.path.join(W, "nolg", "model_00000003.bin")) else False
report(training(records("lg")) == training(base) and len(training(base)) == 3 and same_model,
       "-lg 1 leaves training unchanged: losses, norms and weights equal the run without -lg",
       f"{training(records('lg'))} vs {training(base)}, weights equal: {same_model}")

after, count = gpu_lines_after_steps(stub)
want = (r"gpu +{s}/4 \| mem \d+\.\d\d/\d+\.\d\d GiB \| SM 1755/1980 MHz \| mem clock 2619 MHz \| 47 C \| 312 W \| "
        r"util 97% \| throttle power-cap,sw-thermal")
ok = rc_stub == "0" and count == 2 and all(re.fullmatch(want.format(s=s), after.get(s, "")) for s in (2, 4))
report(ok, "-lg 2 with a stub NVML: gpu lines after steps 2 and 4 with clocks, temperature, power, utilisation, throttle words",
       f"exit {rc_stub}, {count} gpu lines, after steps: {after}, tail: {stub[-300:]}")
report(stub.count("gpu telemetry every 2 steps: NVML, device 0000:00:00.0") == 1 and
       stub.count("nvmlDeviceGetEnforcedPowerLimit: Not Supported") == 1,
       "-lg with a stub NVML: the device found by bus id; a failing query reported once, its field left out",
       [l for l in stub.splitlines() if "telemetry" in l])
recs = {r["step"]: r for r in records("stub") if "train_loss" in r}
want = {"gpu_nvml": 1, "gpu_sm_mhz": 1755, "gpu_sm_max_mhz": 1980, "gpu_mem_mhz": 2619, "gpu_temp_c": 47,
        "gpu_power_w": 312.4, "gpu_util_pct": 97, "gpu_throttle": "power-cap,sw-thermal", "gpu_throttle_mask": 0x24}
ok = sorted(recs) == [1, 2, 3, 4] and all(all(recs[s].get(k) == v for k, v in want.items()) and
                                          "gpu_power_limit_w" not in recs[s] and recs[s].get("gpu_mem_total_gib", 0) > 0
                                          for s in (2, 4))
ok = ok and not any(k.startswith("gpu_") for s in (1, 3) for k in recs[s])
report(ok and training(records("stub"))[:3] == training(base),
       "-lg with a stub NVML: log.jsonl has the readings at steps 2 and 4 only; losses unchanged",
       {s: {k: v for k, v in r.items() if k.startswith("gpu_")} for s, r in recs.items()})
sys.exit(1 if failed else 0)
PY

# a bad -lg value is an error naming the flag (0 and -1 mean off)
out=$($SIM -lg -2 -x 1 2>&1); rc=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q "error: .*-lg (--gpu-log-every)"; then echo "PASS: train_gpt -lg -2 exits 1 naming the flag"
else echo "FAIL: train_gpt -lg -2: exit $rc: $out"; FAILED=1; fi
exit $FAILED
