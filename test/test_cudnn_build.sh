#!/usr/bin/env bash
# The optional cuDNN attention (USE_CUDNN=1, mk/cudnn.mk) compiles and links where nvcc, cuDNN
# and the cudnn_frontend headers exist. Builds llmc/cuda/cudnn_att.cpp, the lab program
# dev/cuda/cudnn_att_check, the trainer (linked into the scratch directory) and the native
# test_gpt with USE_CUDNN=1 into a scratch build directory (never build/, whose objects the switch
# would make stale, and never ./train_gpt); that trainer's --plan counts the cuDNN workspace at
# its closed-form bound. Checks that switching USE_CUDNN makes the nvcc objects stale and that keeping it
# does not. The lab program must start (--help: libcudnn and libnvrtc load); without a GPU it
# must exit non-zero with the usual message, on a GPU it runs at --small shapes (or
# $CUDNN_LAB_ARGS) and its PASS/FAIL lines count.
# Prints SKIP (with the reason) when nvcc, cuDNN or the frontend headers are missing.
# About 50 s on 2 cores (cudnn_att.cpp alone is ~45 s: the frontend headers are heavy).
set -u
unset MAKEFLAGS MFLAGS MAKELEVEL # a `make test` parent must not pass its variables or jobserver on
cd "$(dirname "$0")/.."

probe=$(make -s --no-print-directory USE_CUDNN=1 cudnn-frontend-dir 2>&1)
if [ $? -ne 0 ]; then
    case "$probe" in
    *"needs nvcc"* | *"cudnn.h) not found"* | *"cudnn_frontend.h not found"*)
        echo "SKIP: cuDNN attention build: $(printf '%s\n' "$probe" | grep -o 'USE_CUDNN=1.*' | head -1 | sed 's/[.]  Stop[.]$//')"
        exit 0 ;;
    *)
        echo "FAIL: make USE_CUDNN=1 cudnn-frontend-dir: $probe"
        exit 1 ;;
    esac
fi
echo "cudnn_frontend headers: $probe"

dir=$(mktemp -d /tmp/llmc-cudnn-build.XXXXXX)
trap 'rm -rf "$dir"' EXIT
lab="$dir/dev/cuda/cudnn_att_check"
targets=("$lab" "$dir/cuda/train_gpt.o" "$dir/test/test_gpt" "$dir/train_gpt")
start=$(date +%s)
# Built once: USE_CUDNN changes only the nvcc objects (they depend on the $(BUILD)/.cudnn stamp), so
# the C objects and libraries are build/'s, brought up to date there and copied with their times
# (and the flag stamps), instead of compiled again into the scratch directory.
reuse=(build/libllmc.a build/libllmc_cpu.a)
[ "$(make -s --no-print-directory print-HAVE_MPI)" = 1 ] && reuse+=(build/llmc/dist/dist_mpi.o)
if make -s -j"$(nproc)" --no-print-directory "${reuse[@]}" >"$dir/reuse.log" 2>&1; then
    cp -a build/llmc build/libllmc.a build/libllmc_cpu.a build/.cflags build/.git_commit "$dir/"
else
    echo "note: build/'s C objects are not buildable here; the scratch build compiles its own"
fi
if ! make -j"$(nproc)" --no-print-directory BUILD="$dir" BIN_DIR="$dir" USE_CUDNN=1 "${targets[@]}" >"$dir/build.log" 2>&1; then
    tail -40 "$dir/build.log"
    echo "FAIL: make USE_CUDNN=1 ${targets[*]#$dir/} (log above)"
    exit 1
fi
echo "PASS: USE_CUDNN=1 builds cudnn_att.o, dev/cuda/cudnn_att_check, train_gpt and test_gpt ($(($(date +%s) - start)) s)"

fail=0
# the plan counts cuDNN's attention workspace as its own class, at the bound of
# cudamodel_cudnn_workspace_bound: fp32 softmax sum (B, NH, T) and dQ accumulator (B, NH, T, HS),
# 16-bit dP (B, NH, T64, T64); none in fp32 (no cuDNN path). --plan needs no GPU.
for args in "bf16 16 1024" "fp16 4 100" "fp32 4 64"; do
    set -- $args
    B=$2 T=$3 NH=12 HS=64 T64=$(( ($3 + 63) / 64 * 64 ))
    want=$(( B * NH * T * (1 + HS) * 4 + B * NH * T64 * T64 * 2 ))
    [ "$1" = fp32 ] && want=0
    got=$("$dir/train_gpt" --plan --json -e d12 -b "$B" -t "$T" --precision "$1" 2>&1 |
          python3 -c 'import json, sys; print(json.load(sys.stdin)["classes"]["cudnn_workspace"])' 2>&1)
    if [ "$got" = "$want" ]; then
        echo "PASS: USE_CUDNN=1 --plan d12 $1 B $B T $T: cudnn_workspace = $want bytes (the closed-form bound)"
    else
        echo "FAIL: USE_CUDNN=1 --plan d12 $1 B $B T $T: cudnn_workspace $got, want $want"; fail=1
    fi
done

# the stamp: the same setting leaves the objects valid, another one makes them stale
make -s --no-print-directory BUILD="$dir" USE_CUDNN=1 "$dir/.cudnn"
if [ "$dir/.cudnn" -nt "$dir/cuda/train_gpt.o" ]; then
    echo "FAIL: make USE_CUDNN=1 again would rebuild the nvcc objects"; fail=1
else
    echo "PASS: repeating USE_CUDNN=1 leaves the nvcc objects up to date"
fi
make -s --no-print-directory BUILD="$dir" "$dir/.cudnn"
if [ "$dir/.cudnn" -nt "$dir/cuda/train_gpt.o" ]; then
    echo "PASS: switching USE_CUDNN off makes the nvcc objects stale (they are rebuilt)"
else
    echo "FAIL: switching USE_CUDNN off would keep objects compiled with -DUSE_CUDNN=1"; fail=1
fi

out=$("$lab" --help 2>&1)
if [ $? -eq 0 ] && printf '%s\n' "$out" | grep -q '^usage:'; then
    echo "PASS: cudnn_att_check starts (libcudnn and libnvrtc load)"
else
    echo "FAIL: cudnn_att_check --help: $out"; fail=1
fi

if nvidia-smi >/dev/null 2>&1; then
    # CUDNN_LAB_ARGS: scripts/gpu_check.sh times GPT-2 124M shapes (--reps N) instead of --small
    "$lab" ${CUDNN_LAB_ARGS:---small} || fail=1
else
    out=$("$lab" --small 2>&1)
    rc=$?
    if [ $rc -ne 0 ] && printf '%s\n' "$out" | grep -q "no usable CUDA GPU\|no CUDA GPU"; then
        echo "PASS: cudnn_att_check without a GPU exits non-zero with a clear message"
    else
        echo "FAIL: cudnn_att_check without a GPU: rc $rc: $out"; fail=1
    fi
fi
exit $fail
