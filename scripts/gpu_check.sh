#!/usr/bin/env bash
# gpu_check.sh - the whole GPU verification, in three parts that each fit one short device call.
#
#   scripts/gpu_check.sh correctness   build (sm_90), kernel tests and test_gpt natively (tiny and
#                                      GPT-2 124M shapes, every precision), determinism, fp16 loss
#                                      scale, -lg through NVML, compute-sanitizer (~4-6 min)
#   scripts/gpu_check.sh speed         build (a no-op when the machine is still warm), the trainer's
#                                      tokens/s and memory (bench_gpu.sh), the kernel lab timings,
#                                      the cuDNN build and lab, then the PyTorch reference under
#                                      torch.compile and the ratio (~4-6 min)
#   scripts/gpu_check.sh memory        build (train_gpt only), then issue 14's GPU memory targets
#                                      (bench_gpu.sh budget, plan, offload): GPT-2 1.5B at B 16, T 1024
#                                      under --memory-budget 40G, --plan against cudaMemGetInfo for d12
#                                      at two (B, -r), Llama 3.1 8B with --offload optimizer on one
#                                      GPU (device and host peaks, step time) (~4-5 min; not yet run
#                                      on a GPU)
#   scripts/gpu_check.sh [all]         all three
# Ends with a markdown summary; exits non-zero if anything failed. GPU_CHECK_ONLY=regex further
# selects steps by name (see step() below).
#
# Results: every step's whole log and the summary so far are written as the step ends, to
# GPU_CHECK_LOGS (a directory) when set; under the device tool ($OUT set) they go to a fixed
# directory and are packed after every step into $OUT/gpu_check_<part>.tar.gz beside
# $OUT/gpu_check_<part>_summary.md: two files (the tool returns at most 8), and a run cut short
# by a time limit still returns what it did.
#
# Python: the PyTorch comparison uses the first of $PYTHON_GPU, python3, /usr/bin/python3 whose
# torch sees a GPU (on the lent machines that is plain python3). cuDNN: wherever mk/cudnn.mk finds
# it (the toolkit, CUDNN_PATH, or the nvidia-cudnn-cu13 wheel in that python); the cudnn_frontend
# headers from CUDNN_FRONTEND_PATH or build/cudnn_frontend (staged and carried: docs/CUDA.md).
#
# LLMC_GPU_DRY=1 rehearses the script without a GPU (CI runs it, so a lent machine's few minutes
# are not lost to a script bug): the binaries are the cudasim builds, the GPT-2-shape steps
# shrink to d1 / tiny shapes or are skipped, NVML is test/nvml_stub.c, and the summary says
# "dry run". It checks the plumbing, not the GPU.
set -u
cd "$(dirname "$0")/.."
PART=${1:-all}
case "$PART" in
all | correctness | speed | memory) ;;
*) echo "usage: $0 [all|correctness|speed|memory]" >&2; exit 2 ;;
esac
want() { [ "$PART" = all ] || [ "$PART" = "$1" ]; } # is this part selected?
WORK=$(mktemp -d /tmp/llmc_gpucheck.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
SUMMARY=()
FAILED=0
DRY=${LLMC_GPU_DRY:-0}
PY=$(command -v python3 || echo /usr/bin/python3) # for the synthetic shards (any python3)
if [ "$DRY" = 1 ]; then
    TRAIN=build/cudasim/train_gpt TESTS=build/cudasim/test LAB=build/cudasim/dev/cuda
    LABS=$(ls dev/cuda/*.cu | grep -v '/cudnn_' | sed 's|^dev/cuda/\(.*\)\.cu$|build/cudasim/dev/cuda/\1|' | tr '\n' ' ')
    BUILD_CMD="make -s $TRAIN $TESTS/test_cuda_ops $TESTS/test_gpt $LABS"
    MODEL="-e d1 -b 2 -t 64" LAB_ARGS="--small" GPU_NAME="cudasim dry run, no GPU" NSTEPS=3
    mkdir -p "$WORK/nvml"
    ${CC:-cc} -shared -fPIC test/nvml_stub.c -o "$WORK/nvml/libnvidia-ml.so.1" || { echo "error: cannot build the NVML stub"; exit 1; }
    export LD_LIBRARY_PATH="$WORK/nvml${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
    TRAIN=./train_gpt TESTS=build/test LAB=build/dev/cuda
    BUILD_CMD="make -s -j\$(nproc) train_gpt cuda-tests cuda-lab"
    MODEL="-e d12 -b 8 -t 1024" LAB_ARGS="--reps 10" NSTEPS=6
    GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
fi
if [ "$PART" = memory ]; then BUILD_CMD="make -s -j\$(nproc) ${TRAIN#./}"; fi # its steps run only train_gpt
# the staged cudnn_frontend headers (machines without internet), for the cuDNN step
if [ -z "${CUDNN_FRONTEND_PATH:-}" ] && [ -f build/cudnn_frontend/include/cudnn_frontend.h ]; then
    export CUDNN_FRONTEND_PATH=$PWD/build/cudnn_frontend/include
fi

# ---- logs and summary ----------------------------------------------------------------------
LOGS=${GPU_CHECK_LOGS:-}
PACK=""
if [ -z "$LOGS" ] && [ -n "${OUT:-}" ]; then
    LOGS=/tmp/llmc_gpu_check_$PART # outside $OUT: the tool returns files, not folders of logs
    PACK=$OUT/gpu_check_$PART
    rm -rf "$LOGS"
fi
NSTEP=0
if [ -n "$LOGS" ]; then mkdir -p "$LOGS" && echo "| step | status | checks | time |" > "$LOGS/summary.md"; fi
pack() { # the logs so far as one archive and the summary beside it
    if [ -n "$PACK" ]; then
        tar czf "$PACK.tar.gz.tmp" -C "$LOGS" . && mv "$PACK.tar.gz.tmp" "$PACK.tar.gz"
        cp "$LOGS/summary.md" "${PACK}_summary.md"
    fi
}
record() { # one summary row
    SUMMARY+=("$1")
    if [ -n "$LOGS" ]; then echo "$1" >> "$LOGS/summary.md"; fi
    pack
}
skip() { # name: a step the dry run leaves out
    echo "=== $1: skipped (dry run)"
    record "| $1 | skipped (dry run) | | |"
}
# GPU_CHECK_ONLY=regex runs only the steps whose names match (and the build).
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
    [ "$DRY" = 1 ] && limit=$((limit * 5)) # the limits are sized for a GPU; cudasim is far slower
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
    [ $rc -eq 124 ] && status="**TIMED OUT** after ${limit}s"
    if [ $rc -ne 0 ] || [ "$fails" -gt 0 ]; then [ $rc -eq 124 ] || status="**FAILED** (rc $rc)"; FAILED=1; fi
    record "| $name | $status | $passes pass / $fails fail | $(( $(date +%s) - t0 ))s |"
}

if [ "$DRY" != 1 ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "error: no GPU"; exit 1; }
    if [ -n "$LOGS" ]; then # the machine, for the record (not a step)
        { date -u; nvidia-smi; nvidia-smi -q -d CLOCK,POWER,PERFORMANCE 2>&1 | head -80; nvcc --version; nproc;
          grep -m1 'model name' /proc/cpuinfo; ldconfig -p | grep -E 'openblas|cudnn|nvidia-ml' ;
          for p in ${PYTHON_GPU:-} python3 /usr/bin/python3; do echo "$p: $("$p" -c 'import torch; print(torch.__version__, torch.cuda.is_available())' 2>&1 | tail -1)"; done
        } > "$LOGS/00-machine.txt" 2>&1
    fi
fi
step "build (sm_90)" 400 "$BUILD_CMD"

# a synthetic shard of random tokens (llm.c format) for the training runs
"$PY" - "$WORK/train.bin" 300000 <<'PY'
import struct, sys, random
path, n = sys.argv[1], int(sys.argv[2])
random.seed(2)
with open(path, "wb") as f:
    f.write(struct.pack("<256i", *([20240520, 1, n] + [0] * 253)))
    f.write(struct.pack("<%dH" % n, *[random.randrange(50257) for _ in range(n)]))
PY

if want correctness; then
    # (the dry run skips these two: `make test` runs the same cudasim test_cuda_ops and test_gpt)
    if [ "$DRY" = 1 ]; then skip "test_cuda_ops (tiny shapes, fp32/bf16/fp16)"; else step "test_cuda_ops (tiny shapes, fp32/bf16/fp16)" 120 "$TESTS/test_cuda_ops"; fi
    if [ "$DRY" = 1 ]; then skip "test_gpt (tiny)"; else step "test_gpt (tiny)" 120 "$TESTS/test_gpt"; fi
    # determinism: the same run twice must log the same losses bit for bit (the second run reads
    # the first's matmul algorithm choices: timing alone may rank near-equal algorithms either way)
    det="for k in 1 2; do $TRAIN $MODEL -i $WORK/train.bin -x $NSTEPS -v 0 -s 0 -o $WORK/det\$k --matmul-cache $WORK/det_algos.txt || exit 1; done;
         a=\$(grep -o '\"train_loss\":[^,]*' $WORK/det1/log.jsonl); b=\$(grep -o '\"train_loss\":[^,]*' $WORK/det2/log.jsonl);
         echo \"\$a\"; [ -n \"\$a\" ] && [ \"\$a\" = \"\$b\" ] && echo 'PASS: two bf16 runs log bit-identical losses' || echo 'FAIL: determinism: losses differ'"
    step "determinism (2 x $NSTEPS steps, $MODEL, bf16)" 150 "$det"
    fp16="$TRAIN $MODEL -i $WORK/train.bin -x $NSTEPS -v 0 -s 0 --precision fp16 -o '' | tee /dev/stderr | grep -q 'loss scale' && echo 'PASS: fp16 run shows the loss scale' || echo 'FAIL: fp16 run: no loss scale in the output'"
    step "fp16 run (loss scale in the step lines)" 120 "$fp16"
    # -lg through the real NVML (nvidia-smi above used it, so it must load and find the device)
    lg="$TRAIN -e d1 -i $WORK/train.bin -b 2 -t 64 -x 3 -v 0 -s 0 -lg 1 -o $WORK/lg > $WORK/lg.txt || exit 1; cat $WORK/lg.txt;
        n=\$(grep -cE '^gpu +[0-9]+/3 \\| mem .* GiB \\| SM [0-9]+/[0-9]+ MHz .* C \\| .* W \\| util [0-9]+% \\| throttle [a-z]' $WORK/lg.txt);
        k=\$(grep -c '\"gpu_nvml\":1,.*\"gpu_temp_c\"' $WORK/lg/log.jsonl);
        [ \"\$n\" = 3 ] && [ \"\$k\" = 3 ] && echo 'PASS: -lg 1 prints and logs NVML readings every step' || echo \"FAIL: -lg 1: \$n full gpu lines, \$k log records with NVML readings (want 3 and 3)\""
    step "-lg 1 telemetry through NVML (d1, 3 steps)" 90 "$lg"
    if [ "$DRY" = 1 ]; then skip "test_cuda_ops --big (GPT-2 124M shapes)"; else step "test_cuda_ops --big (GPT-2 124M shapes)" 150 "$TESTS/test_cuda_ops --big"; fi
    if [ "$DRY" = 1 ]; then skip "test_gpt --big (d12, B=2, T=256)"; else step "test_gpt --big (d12, B=2, T=256)" 200 "$TESTS/test_gpt --big"; fi
    if [ "$DRY" = 1 ]; then
        skip "compute-sanitizer"
    elif command -v compute-sanitizer >/dev/null 2>&1; then
        step "compute-sanitizer memcheck (test_cuda_ops tiny)" 90 "compute-sanitizer --tool memcheck --error-exitcode 1 $TESTS/test_cuda_ops"
        # our kernels only: cuBLASLt's split-K kernels (nvjet_*) report shared-memory hazards of
        # their own (seen on an H200, 2026-11-30) that are not ours to fix
        rc_filter=""
        if compute-sanitizer --help 2>&1 | grep -q -- '--kernel-name-exclude'; then
            rc_filter="--kernel-name-exclude kns=nvjet --kernel-name-exclude kns=cutlass --kernel-name-exclude kns=xmma"
        fi
        step "compute-sanitizer racecheck (train_gpt d1, 1 step${rc_filter:+, cuBLASLt kernels excluded})" 90 \
            "compute-sanitizer --tool racecheck --error-exitcode 1 $rc_filter $TRAIN -e d1 -i $WORK/train.bin -b 2 -t 64 -x 1 -v 0 -s 0 -o ''"
    else
        record "| compute-sanitizer | not installed | | |"
    fi
fi

if want speed; then
    export BENCH_RESULTS=$WORK/bench_results.txt # bench_gpu.sh's parts hand each other numbers
    step "benchmark: train_gpt tokens/s and memory (bench_gpu.sh --quick ours memory)" 200 "scripts/bench_gpu.sh --quick ours memory"
    # attention and matmul first: they carry most of the step time
    # (the dry run rehearses the loop on one program: `make test` runs each at --small, 55-cuda-lab.txt)
    names="attention matmul classifier layernorm gelu residual encoder adamw cast"
    [ "$DRY" = 1 ] && names=gelu
    labs="for n in $names; do p=$LAB/\$n; [ -x \$p ] || continue; echo \"--- \$n\"; \$p $LAB_ARGS || rc=1; done; exit \${rc:-0}"
    step "kernel lab (dev/cuda, $LAB_ARGS)" 150 "$labs"
    if [ "$DRY" = 1 ]; then skip "cuDNN attention (USE_CUDNN=1 build + lab)"; else step "cuDNN attention (USE_CUDNN=1 build + lab)" 200 "CUDNN_LAB_ARGS='$LAB_ARGS' test/test_cudnn_build.sh"; fi
    # last: torch.compile's first steps are slow, and a slow or broken PyTorch must not cost the rest
    if [ "$DRY" = 1 ]; then skip "benchmark: PyTorch reference (torch.compile) and ratio"; else
        step "benchmark: PyTorch reference (torch.compile) and ratio" 240 "BENCH_TORCH_TIMEOUT=225 scripts/bench_gpu.sh --quick torch"; fi
fi

if want memory; then # issue 14's GPU targets (bench_gpu.sh says what each runs and when it passes)
    # the host's memory first, for the record: the 8B's offload pins ~45 GiB and holds ~90 GiB in all
    if [ -n "$LOGS" ]; then { grep -E 'Mem|Commit|Huge' /proc/meminfo; echo "overcommit_memory $(cat /proc/sys/vm/overcommit_memory)"; } > "$LOGS/00-host-memory.txt" 2>&1; fi
    step "memory: GPT-2 1.5B at B 16, T 1024 within --memory-budget 40G" 150 "scripts/bench_gpu.sh --quick budget"
    step "memory: --plan against cudaMemGetInfo (d12, two B and -r)" 90 "scripts/bench_gpu.sh --quick plan"
    step "memory: Llama 3.1 8B with --offload optimizer on one GPU" 240 "scripts/bench_gpu.sh --quick offload"
fi

echo
echo "## GPU check summary ($GPU_NAME, $PART)"
echo
echo "| step | status | checks | time |"
echo "|---|---|---|---|"
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
