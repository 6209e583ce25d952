#!/usr/bin/env bash
# scripts/gpu_check.sh rehearsed without a GPU (LLMC_GPU_DRY=1: cudasim binaries, tiny shapes, the
# NVML stub), so that a lent GPU machine's few minutes are not lost to a bug in the script itself.
# PASS when every step is ok (or skipped as a dry run) and the summary is printed. About 3 min.
set -u
cd "$(dirname "$0")/.."
out=$(LLMC_GPU_DRY=1 scripts/gpu_check.sh 2>&1)
rc=$?
summary=$(printf '%s\n' "$out" | sed -n '/^## GPU check summary (cudasim dry run/,$p')
if [ $rc -eq 0 ] && [ -n "$summary" ] && ! printf '%s\n' "$summary" | grep -q 'FAILED'; then
    echo "PASS: gpu_check.sh dry run: every step ok"
    printf '%s\n' "$summary" | sed 's/^/      /'
else
    printf '%s\n' "$out" | tail -40
    echo "FAIL: gpu_check.sh dry run (exit $rc)"
    exit 1
fi
