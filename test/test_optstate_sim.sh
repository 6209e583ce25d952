#!/usr/bin/env bash
# test_optstate_sim.sh - --optim-state and --offload in ./train_gpt through the cudasim harness
# (no GPU), on a tiny model (L 1, C 32, V 256: 23k parameters, 90 int8 blocks), 3 fp32 steps:
# - --offload optimizer (gradients to the host, the loop's CPU optimizer, parameters back) gives
#   bit-identical losses and final model file to the device optimizer (--grad-clip 0: the two
#   compute the gradient norm in different orders, and a clip would carry that difference);
#   each bucket's gradients are copied to the host as soon as the backward has queued them
#   (LLMC_TEST_TRACE_BUCKETS: every step issues its 2 buckets during the backward), and in bf16
#   (staged, converted on the host) the bucketed copies give the same model bits as one copy
#   after the backward (LLMC_TEST_UNBUCKETED), with the same logged norms (the host functions'
#   per-bucket sums against sums taken after the backward);
# - the pipeline, from the trace: each step the host converts and sums a bucket's gradients before
#   the backward issues its last bucket, and queues the outer bucket's parameters for the device
#   before the update of the last bucket is done;
# - ./train_gpt_cpu --offload optimizer updates bucket by bucket (trace) and gives the plain
#   optimizer's model and state files bit for bit, with fp32 and int8 states (int8 blocks straddle
#   buckets: each block updated once);
# - --optim-state bf16 / int8: the CUDA kernel (adamw_update_compact, on optstate.h's codes)
#   against the CPU trainer's compact states: losses within 1e-5 relative (the fp32 GPU and CPU
#   models differ only in summation orders, as in test_cuda_trainer_sim.sh) and the moments of
#   the step-3 state files within 1e-3 relative L2. Why 1e-3: an element whose code is the same
#   differs only by its block scale's summation-order difference (~1e-6); a code that flips at a
#   rounding boundary differs by one step (<= 2/127 of its block's scale), so 1e-3 allows ~0.4% of
#   the codes to flip; encoding differently (another rounding or code, a wrong scale) moves most
#   codes and fails by far more;
#   The same for -z 1 on 2 ranks (mpirun; cudasim's NCCL), where each rank's int8 blocks start at
#   its shard;
# - --offload optimizer -z 1 on 2 ranks (the loop's optimizer: host gradients reduced over MPI, m
#   and v sharded) gives the same model bits as the device optimizer's -z 1 (NCCL) in fp32 (each
#   rank's gradients weighted 1/2 and summed, or summed and halved: the same floats);
# - the plan: device adamw_m/adamw_v are the compact bytes, and with --offload the moments and
#   master weights are host bytes (closed forms); each run checks allocated == plan at startup;
# - --offload optimizer with bf16 trains; with fp16 it is an error naming the flags.
set -u
. "$(dirname "$0")/sim_setup.sh" llmc_optstate_sim
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1
/usr/bin/python3 - "$W" <<'PY'
import os, random, sys
sys.path.insert(0, "test")
from hardening_util import write_model, write_shard
w = sys.argv[1]
write_model(os.path.join(w, "init.bin"), maxT=64, V=256, L=1, NH=2, C=32, Vp=256, seed=5)
r = random.Random(9)
pat = [r.randrange(256) for _ in range(61)]
write_shard(os.path.join(w, "train.bin"), [pat[i % 61] if r.random() < 0.8 else r.randrange(256) for i in range(6000)])
PY
common="-e $W/init.bin -i $W/train.bin -b 2 -t 16 -l 1e-3 -k constant -v 0 -s 0 --seed 7 -x 3 -n 3 --grad-clip 0"
FAILED=0
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1"; FAILED=1; }
losses() { sed -n 's/^step *[0-9]*\/[0-9]* | loss \([0-9.]*\) .*/\1/p' "$1" | tr '\n' ' '; }
run() { # name, binary, flags...: output in $W/<name>.out, run directory $W/<name>
    local name=$1 bin=$2
    shift 2
    if $bin $common --precision fp32 "$@" -o "$W/$name" > "$W/$name.out" 2>&1 && grep -q "^step *3/3" "$W/$name.out"; then return 0; fi
    fail "$name: did not train 3 steps"; tail -3 "$W/$name.out"; return 1
}
run sim_fp32 $SIM
LLMC_TEST_TRACE_BUCKETS=1 run sim_offload $SIM --offload optimizer
run sim_bf16 $SIM --optim-state bf16
run sim_int8 $SIM --optim-state int8
run cpu_bf16 ./train_gpt_cpu --optim-state bf16
run cpu_int8 ./train_gpt_cpu --optim-state int8
run cpu_fp32 ./train_gpt_cpu
LLMC_TEST_TRACE_BUCKETS=1 run cpu_fp32_offload ./train_gpt_cpu --offload optimizer
run cpu_int8_offload ./train_gpt_cpu --offload optimizer --optim-state int8

# ZeRO-1 on 2 ranks (int8 blocks counted from each rank's shard): train_gpt against train_gpt_cpu
if command -v mpirun > /dev/null; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp \
        OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
    mp="mpirun --oversubscribe -np 2"
    run sim_z1_int8 "$mp $SIM" -z 1 --optim-state int8 -b 1
    run cpu_z1_int8 "$mp ./train_gpt_cpu" -z 1 --optim-state int8 -b 1
    run sim_z1_fp32 "$mp $SIM" -z 1 -b 1
    run sim_z1_offload "$mp $SIM" -z 1 --offload optimizer -b 1
    if cmp -s "$W/sim_z1_fp32/model_00000003.bin" "$W/sim_z1_offload/model_00000003.bin" &&
        grep -q "optimizer (per rank, -z 1: moments sharded, 2 ranks" "$W/sim_z1_offload.out"; then
        pass "train_gpt (harness) --offload optimizer -z 1 on 2 ranks: the same model bits as the device optimizer's -z 1"
    else
        fail "train_gpt (harness) --offload optimizer -z 1 on 2 ranks differs from the device optimizer's -z 1"
    fi
fi
during=$(grep -c "^trace: gradient bucket -\?[0-9]* issued during the backward" "$W/sim_offload.out")
if [ "$during" = 6 ] && ! grep -q "issued after the backward" "$W/sim_offload.out"; then
    pass "train_gpt (harness) --offload optimizer: each step's 2 gradient buckets are copied to the host during the backward"
else
    fail "train_gpt (harness) --offload optimizer: $during of 6 bucket copies issued during the backward"
fi
# the pipeline, from the trace: each step, the host converts and sums a bucket's gradients before
# the backward has issued its last bucket, and queues a bucket's parameters for the device before
# the update of the last bucket is done (the unpipelined code printed neither line)
if /usr/bin/python3 - "$W/sim_offload.out" <<'PY'
import re, sys
steps = re.split(r"^step .*$", open(sys.argv[1]).read(), flags=re.M)[:3]
ok = len(steps) == 3
for s in steps:
    lines = [l for l in s.splitlines() if l.startswith("trace: ")]
    at = lambda pat: [i for i, l in enumerate(lines) if re.match(pat, l)]
    issued, host, done, queued = (at(r"trace: gradient bucket -?\d+ issued"), at(r"trace: host gradient bucket"),
                                  at(r"trace: update of parameter bucket"), at(r"trace: parameter bucket -?\d+ queued"))
    ok &= len(issued) == len(host) == len(done) == len(queued) == 2
    ok &= ok and host[0] < issued[-1] and queued[0] < done[-1]
    ok &= ok and [lines[i].split()[-2] for i in done] == ["-1", "0"]
if not ok: print("\n".join(lines))
sys.exit(0 if ok else 1)
PY
then
    pass "train_gpt (harness) --offload optimizer: per-bucket host gradient work starts before the last bucket is issued; parameters go back per bucket (outer first) before the last bucket's update is done"
else
    fail "train_gpt (harness) --offload optimizer: the host work is not pipelined with the buckets (trace above)"
fi
ok=1
for s in fp32 int8; do
    cmp -s "$W/cpu_$s/model_00000003.bin" "$W/cpu_${s}_offload/model_00000003.bin" &&
        cmp -s "$W/cpu_$s/state_00000003_00000.bin" "$W/cpu_${s}_offload/state_00000003_00000.bin" || ok=0
done
if [ $ok = 1 ] && [ "$(grep -c "^trace: update of parameter bucket" "$W/cpu_fp32_offload.out")" = 6 ]; then
    pass "train_gpt_cpu --offload optimizer: the update bucket by bucket, model and state bits identical to the plain optimizer (fp32, int8 states)"
else
    fail "train_gpt_cpu --offload optimizer differs from the plain optimizer, or did not update by bucket"
fi
a=$(losses "$W/sim_fp32.out"); b=$(losses "$W/sim_offload.out")
if [ -n "$a" ] && [ "$a" = "$b" ] && cmp -s "$W/sim_fp32/model_00000003.bin" "$W/sim_offload/model_00000003.bin"; then
    pass "train_gpt (harness) --offload optimizer: losses and final parameters bit-identical to the device optimizer ($a)"
else
    fail "train_gpt (harness) --offload optimizer differs: '$a' vs '$b'"
fi

for s in bf16 int8 z1_int8; do
    if /usr/bin/python3 - "$W" "$s" <<'PY'
import struct, sys, re
w, s = sys.argv[1:]
def losses(name):
    return [float(x) for x in re.findall(r"^step +\d+/\d+ \| loss ([0-9.]+)", open(f"{w}/{name}.out").read(), re.M)]
def moments(name):
    data = open(f"{w}/{name}/state_00000003_00000.bin", "rb").read()
    n = (len(data) - 1024) // 8
    return struct.unpack(f"<{n}f", data[1024:1024 + 4 * n]), struct.unpack(f"<{n}f", data[1024 + 4 * n:])
ls, lc = losses(f"sim_{s}"), losses(f"cpu_{s}")
ok = len(ls) == len(lc) == 3 and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(ls, lc))
worst = []
for xs, xc in zip(moments(f"sim_{s}"), moments(f"cpu_{s}")):
    num = sum((a - b) ** 2 for a, b in zip(xs, xc)) ** 0.5
    den = sum(b * b for b in xc) ** 0.5
    worst.append(num / den if den > 0 else float("inf"))
    ok &= den > 0 and num <= 1e-3 * den
print(f"losses {ls} vs {lc}; moments m, v relative L2 {worst[0]:.2g}, {worst[1]:.2g}")
sys.exit(0 if ok else 1)
PY
    then pass "train_gpt (harness) --optim-state ${s/z1_/-z 1 on 2 ranks, } against train_gpt_cpu's: losses (1e-5) and step-3 moments (1e-3 L2)"
    else fail "train_gpt (harness) --optim-state ${s/z1_/-z 1 on 2 ranks, } against train_gpt_cpu's"; fi
done

# the plan: compact device moments; offloaded moments and master weights on the host
if /usr/bin/python3 - "$SIM" "$W/init.bin" <<'PY'
import json, subprocess, sys
sim, init = sys.argv[1:]
def plan(*extra):
    p = subprocess.run([sim, "-e", init, "-b", "2", "-t", "16", "--plan", "--json", *extra], capture_output=True, text=True)
    return json.loads(p.stdout)
p32, p16, p8 = plan(), plan("--optim-state", "bf16"), plan("--optim-state", "int8")
n = p32["parameters"]
want8 = 4 * ((n + 255) // 256) + n
ok = p32["classes"]["adamw_m"] == 4 * n and p16["classes"]["adamw_m"] == 2 * n and p8["classes"]["adamw_v"] == want8
for extra, moment in (((), 4 * n), (("--optim-state", "int8"), want8)):
    po = plan("--offload", "optimizer", "--precision", "bf16", *extra)
    d, h = po["classes"], po["host_classes"]
    ok &= d["adamw_m"] == d["adamw_v"] == d["master_weights"] == 0 and d["gradients"] == 2 * n
    ok &= h["adamw_m"] == h["adamw_v"] == moment and h["master_weights"] == 4 * n and h["gradients"] == 4 * n
print(f"n {n}: int8 {p8['classes']['adamw_v']} (want {want8})")
sys.exit(0 if ok else 1)
PY
then pass "train_gpt --plan: device m, v = 4n, 2n, 4*ceil(n/256) + n bytes; --offload: none on the device, master (4n), m, v, fp32 gradients on the host"
else fail "train_gpt --plan with --optim-state / --offload"; fi

if $SIM $common --precision bf16 --offload optimizer --optim-state int8 -o "$W/bf16_offload" > "$W/bo.out" 2>&1 &&
    grep -q "^step *3/3" "$W/bo.out" && ! grep "^step" "$W/bo.out" | grep -qi "nan\|inf"; then
    pass "train_gpt (harness) bf16 --offload optimizer --optim-state int8 trains (plan == allocated at startup)"
else
    fail "train_gpt (harness) bf16 --offload optimizer"; tail -3 "$W/bo.out"
fi
if LLMC_TEST_UNBUCKETED=1 $SIM $common --precision bf16 --offload optimizer --optim-state int8 -o "$W/bf16_offload_whole" \
    > "$W/bow.out" 2>&1 && cmp -s "$W/bf16_offload/model_00000003.bin" "$W/bf16_offload_whole/model_00000003.bin" &&
    norms() { grep -o '"grad_norm":[^,]*' "$1/log.jsonl" | tr '\n' ' '; } &&
    [ -n "$(norms "$W/bf16_offload")" ] && [ "$(norms "$W/bf16_offload")" = "$(norms "$W/bf16_offload_whole")" ]; then
    pass "train_gpt (harness) bf16 --offload optimizer: bucket-by-bucket copies == one copy after the backward (model bits; the norm from the host functions' per-bucket sums == the one computed after the backward)"
else
    fail "train_gpt (harness) bf16 --offload optimizer: bucketed copies differ from one copy"; tail -3 "$W/bow.out"
fi
out=$($SIM $common --precision fp16 --offload optimizer -o "$W/fp16" 2>&1); rc=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q "^error: --offload optimizer with --precision fp16"; then
    pass "train_gpt --offload optimizer --precision fp16 is an error naming both flags"
else
    fail "train_gpt --offload optimizer --precision fp16: exit $rc: $out"
fi
out=$($SIM $common --precision bf16 --offload optimizer -z 2 -o "$W/z2" 2>&1); rc=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q "^error: --offload optimizer in train_gpt runs with -z 0 or 1" && [ ! -e "$W/z2" ]; then
    pass "train_gpt --offload optimizer -z 2 is an error (-z 0 or 1 for now)"
else
    fail "train_gpt --offload optimizer -z 2: exit $rc: $out"
fi
exit $FAILED
