#!/usr/bin/env bash
# gpu_check.sh - the whole GPU verification in one script (< 8 minutes on an H100/H200).
# Builds for sm_90 (GPU_ARCH to change), runs the kernel tests and test_gpt natively (tiny shapes
# and GPT-2 124M shapes, every precision), a determinism check (two training runs must log
# bit-identical losses), the benchmark (scripts/bench_gpu.sh --quick) and compute-sanitizer on a
# tiny config where installed. Ends with a markdown summary; exits non-zero if anything failed.
# GPU_CHECK_ONLY=regex selects steps by name (see step() below).
#
# LLMC_GPU_DRY=1 rehearses the script without a GPU (CI runs it, so a lent machine's few minutes
# are not lost to a script bug): the binaries are the cudasim builds, the GPT-2-shape steps
# shrink to d1 / tiny shapes or are skipped, NVML is test/nvml_stub.c, and the summary says
# "dry run". It checks the plumbing, not the GPU.
set -u
cd "$(dirname "$0")/.."
WORK=$(mktemp -d /tmp/llmc_gpucheck.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
SUMMARY=()
FAILED=0
DRY=${LLMC_GPU_DRY:-0}
if [ "$DRY" = 1 ]; then
    TRAIN=build/cudasim/train_gpt TESTS=build/cudasim/test LAB=build/cudasim/dev/cuda
    LABS=$(ls dev/cuda/*.cu | grep -v '/cudnn_' | sed 's|^dev/cuda/\(.*\)\.cu$|build/cudasim/dev/cuda/\1|' | tr '\n' ' ')
    BUILD_CMD="make -s $TRAIN $TESTS/test_cuda_ops $TESTS/test_gpt $LABS"
    MODEL="-e d1 -b 2 -t 64" LAB_ARGS="--small" GPU_NAME="cudasim dry run, no GPU"
    mkdir -p "$WORK/nvml"
    ${CC:-cc} -shared -fPIC test/nvml_stub.c -o "$WORK/nvml/libnvidia-ml.so.1" || { echo "error: cannot build the NVML stub"; exit 1; }
    export LD_LIBRARY_PATH="$WORK/nvml${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
    TRAIN=./train_gpt TESTS=build/test LAB=build/dev/cuda
    BUILD_CMD="make -s -j\$(nproc) train_gpt cuda-tests cuda-lab"
    MODEL="-e d12 -b 8 -t 1024" LAB_ARGS="--reps 10"
    GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
fi
# Logs: with GPU_CHECK_LOGS=dir (default: $OUT/gpu_check when the device tool's $OUT is set) every
# step's whole output and the summary so far are written there as the steps finish, so a run cut
# short by a time limit still returns what it did.
LOGS=${GPU_CHECK_LOGS:-${OUT:+$OUT/gpu_check}}
NSTEP=0
if [ -n "$LOGS" ]; then mkdir -p "$LOGS" && echo "| step | status | checks | time |" > "$LOGS/summary.md"; fi
record() { # one summary row
    SUMMARY+=("$1")
    if [ -n "$LOGS" ]; then echo "$1" >> "$LOGS/summary.md"; fi
}
skip() { # name: a step the dry run leaves out
    echo "=== $1: skipped (dry run)"
    record "| $1 | skipped (dry run) | | |"
}
# GPU_CHECK_ONLY=regex runs only the steps whose names match (and the build), e.g. to split the
# check over two calls when device time is short: GPU_CHECK_ONLY='test_|lab' then 'benchmark|cuDNN'.
ONLY=${GPU_CHECK_ONLY:-}
step() { # name, timeout seconds, command...
    local name=$1 limit=$2
    shift 2
    if [ -n "$ONLY" ] && [ "$name" != "build (sm_90)" ] && ! printf '%s' "$name" | grep -Eq -- "$ONLY"; then
        echo "=== $name: not selected (GPU_CHECK_ONLY)"
        record "| $name | not selected | | |"
        return
    fi
    echo "=== $name"
    local t0=$(date +%s)
    timeout "$limit" bash -c "$*" > "$WORK/out.txt" 2>&1
    local rc=$?
    tail -25 "$WORK/out.txt"
    NSTEP=$((NSTEP + 1))
    if [ -n "$LOGS" ]; then
        cp "$WORK/out.txt" "$LOGS/$(printf '%02d' $NSTEP)-$(echo "$name" | tr -c 'A-Za-z0-9_.\n-' '_' | cut -c1-60).log"
    fi
    local fails=$(grep -c '^FAIL' "$WORK/out.txt")
    local passes=$(grep -c '^PASS' "$WORK/out.txt")
    local status=ok
    if [ $rc -ne 0 ] || [ "$fails" -gt 0 ]; then status="**FAILED** (rc $rc)"; FAILED=1; fi
    record "| $name | $status | $passes pass / $fails fail | $(( $(date +%s) - t0 ))s |"
}

if [ "$DRY" != 1 ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "error: no GPU"; exit 1; }
fi
step "build (sm_90)" 400 "$BUILD_CMD"
step "test_cuda_ops (tiny shapes, fp32/bf16/fp16)" 120 "$TESTS/test_cuda_ops"
if [ "$DRY" = 1 ]; then skip "test_cuda_ops --big (GPT-2 124M shapes)"; else step "test_cuda_ops --big (GPT-2 124M shapes)" 300 "$TESTS/test_cuda_ops --big"; fi
step "test_gpt (tiny)" 120 "$TESTS/test_gpt"
if [ "$DRY" = 1 ]; then skip "test_gpt --big (d12, B=2, T=256)"; else step "test_gpt --big (d12, B=2, T=256)" 400 "$TESTS/test_gpt --big"; fi
step "kernel lab (dev/cuda, $LAB_ARGS)" 400 "for p in $LAB/*; do case \$p in *.cpp|*.d) continue;; esac; \$p $LAB_ARGS || exit 1; done"

# determinism: the same run twice must log the same losses bit for bit
/usr/bin/python3 - "$WORK/train.bin" 300000 <<'PY'
import struct, sys, random
path, n = sys.argv[1], int(sys.argv[2])
random.seed(2)
with open(path, "wb") as f:
    f.write(struct.pack("<256i", *([20240520, 1, n] + [0] * 253)))
    f.write(struct.pack("<%dH" % n, *[random.randrange(50257) for _ in range(n)]))
PY
det="for k in 1 2; do $TRAIN $MODEL -i $WORK/train.bin -x 6 -v 0 -s 0 -o $WORK/det\$k || exit 1; done;
     a=\$(grep -o '\"train_loss\":[^,]*' $WORK/det1/log.jsonl); b=\$(grep -o '\"train_loss\":[^,]*' $WORK/det2/log.jsonl);
     echo \"\$a\"; [ -n \"\$a\" ] && [ \"\$a\" = \"\$b\" ] && echo 'PASS: two bf16 runs log bit-identical losses' || echo 'FAIL: determinism: losses differ'"
step "determinism (2 x 6 steps, $MODEL, bf16)" 200 "$det"
fp16="$TRAIN $MODEL -i $WORK/train.bin -x 6 -v 0 -s 0 --precision fp16 -o '' | grep -q 'loss scale' && echo 'PASS: fp16 run shows the loss scale' || echo 'FAIL: fp16 run: no loss scale in the output'"
step "fp16 run (loss scale in the step lines)" 150 "$fp16"
# -lg through the real NVML (nvidia-smi above used it, so it must load and find the device)
lg="$TRAIN -e d1 -i $WORK/train.bin -b 2 -t 64 -x 3 -v 0 -s 0 -lg 1 -o $WORK/lg > $WORK/lg.txt || exit 1; cat $WORK/lg.txt;
    n=\$(grep -cE '^gpu +[0-9]+/3 \\| mem .* GiB \\| SM [0-9]+/[0-9]+ MHz .* C \\| .* W \\| util [0-9]+% \\| throttle [a-z]' $WORK/lg.txt);
    k=\$(grep -c '\"gpu_nvml\":1,.*\"gpu_temp_c\"' $WORK/lg/log.jsonl);
    [ \"\$n\" = 3 ] && [ \"\$k\" = 3 ] && echo 'PASS: -lg 1 prints and logs NVML readings every step' || echo \"FAIL: -lg 1: \$n full gpu lines, \$k log records with NVML readings (want 3 and 3)\""
step "-lg 1 telemetry through NVML (d1, 3 steps)" 120 "$lg"
step "benchmark (scripts/bench_gpu.sh --quick)" 420 "scripts/bench_gpu.sh --quick"
# the optional cuDNN attention: builds with USE_CUDNN=1 into a scratch dir and runs its lab against
# our kernels (SKIPs where the cudnn_frontend headers are not installed). Machines without
# internet: stage the headers here first and carry build/cudnn_frontend along (docs/CUDA.md).
if [ -z "${CUDNN_FRONTEND_PATH:-}" ] && [ -f build/cudnn_frontend/include/cudnn_frontend.h ]; then
    export CUDNN_FRONTEND_PATH=$PWD/build/cudnn_frontend/include
fi
if [ "$DRY" = 1 ]; then skip "cuDNN attention (USE_CUDNN=1 build + lab)"; else step "cuDNN attention (USE_CUDNN=1 build + lab)" 240 "test/test_cudnn_build.sh"; fi
if [ "$DRY" = 1 ]; then
    skip "compute-sanitizer"
elif command -v compute-sanitizer >/dev/null 2>&1; then
    step "compute-sanitizer memcheck (test_cuda_ops tiny)" 300 "compute-sanitizer --tool memcheck --error-exitcode 1 build/test/test_cuda_ops"
    step "compute-sanitizer racecheck (train_gpt d1, 2 steps)" 300 \
        "compute-sanitizer --tool racecheck --error-exitcode 1 $TRAIN -e d1 -i $WORK/train.bin -b 2 -t 64 -x 2 -v 0 -s 0 -o ''"
else
    record "| compute-sanitizer | not installed | | |"
fi

echo
echo "## GPU check summary ($GPU_NAME)"
echo
echo "| step | status | checks | time |"
echo "|---|---|---|---|"
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
