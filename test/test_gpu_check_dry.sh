#!/usr/bin/env bash
# scripts/gpu_check.sh rehearsed without a GPU (LLMC_GPU_DRY=1: cudasim binaries, tiny shapes, the
# NVML stub), so that a lent GPU machine's few minutes are not lost to a bug in the script itself.
# PASS when every step is ok (or skipped as a dry run) and the summary is printed; also checks the
# per-step logs (GPU_CHECK_LOGS), the step selection (GPU_CHECK_ONLY) and the memory part's checks.
set -u
cd "$(dirname "$0")/.."
logs=$(mktemp -d /tmp/llmc_gpucheck_logs.XXXXXX)
trap 'rm -rf "$logs"' EXIT
out=$(LLMC_GPU_DRY=1 GPU_CHECK_LOGS="$logs" scripts/gpu_check.sh 2>&1)
rc=$?
summary=$(printf '%s\n' "$out" | sed -n '/^## GPU check summary (cudasim dry run/,$p')
fail=0
if [ $rc -eq 0 ] && [ -n "$summary" ] && ! printf '%s\n' "$summary" | grep -q 'FAILED'; then
    echo "PASS: gpu_check.sh dry run: every step ok"
    printf '%s\n' "$summary" | sed 's/^/      /'
else
    printf '%s\n' "$out" | tail -40
    echo "FAIL: gpu_check.sh dry run (exit $rc)"
    fail=1
fi
# the rows written as the steps finished are the printed summary's rows; one log per run step
datarows() { grep '^| ' | grep -v '^| step | status'; } # not the header (the rule is '|---')
rows=$(printf '%s\n' "$summary" | datarows | wc -l)
logged=$(datarows < "$logs/summary.md" 2>/dev/null | wc -l)
nlogs=$(ls "$logs"/*.log 2>/dev/null | wc -l)
ran=$(printf '%s\n' "$summary" | datarows | grep -vc 'skipped (dry run)')
if [ "$rows" -gt 0 ] && [ "$rows" = "$logged" ] && [ "$nlogs" = "$ran" ]; then
    echo "PASS: gpu_check.sh writes each step's log and summary row as it goes ($nlogs logs, $logged rows)"
else
    echo "FAIL: gpu_check.sh logs: $logged rows in summary.md for $rows printed, $nlogs logs for $ran steps run"
    fail=1
fi
# without a log dir and with a step selection: every step listed once, only -lg run
out2=$(env -u OUT LLMC_GPU_DRY=1 GPU_CHECK_ONLY='^-lg' scripts/gpu_check.sh 2>&1)
rc2=$?
s2=$(printf '%s\n' "$out2" | sed -n '/^## GPU check summary/,$p' | datarows)
dups=$(printf '%s\n' "$s2" | cut -d'|' -f2 | sort | uniq -d)
ran2=$(printf '%s\n' "$s2" | grep -c '| ok |')
if [ $rc2 -eq 0 ] && [ "$(printf '%s\n' "$s2" | wc -l)" = "$rows" ] && [ -z "$dups" ] && [ "$ran2" = 2 ]; then
    echo "PASS: GPU_CHECK_ONLY runs the build and the selected step; every step listed once"
else
    printf '%s\n' "$s2"
    echo "FAIL: GPU_CHECK_ONLY='^-lg' (exit $rc2): duplicated rows '$dups', $ran2 steps ran (want 2: build, -lg)"
    fail=1
fi
# the memory part (issue 14's GPU targets) ran in the dry run above: each of its three steps printed
# its planned-vs-measured checks and they passed
mem=$(printf '%s\n' "$summary" | datarows | grep '^| memory: ')
memok=$(printf '%s\n' "$mem" | grep -cE '\| ok \| [2-9][0-9]* pass / 0 fail \|')
if [ "$memok" = 3 ]; then
    echo "PASS: gpu_check.sh memory steps (--memory-budget, --plan vs cudaMemGetInfo, 8B offload) ran their checks"
else
    printf '%s\n' "$mem"
    echo "FAIL: gpu_check.sh memory steps: $memok of 3 ok with at least 2 checks passed"
    fail=1
fi
# `gpu_check.sh memory` alone: the build and the memory steps only (none selected here: no run)
out3=$(env -u OUT LLMC_GPU_DRY=1 GPU_CHECK_ONLY='^none$' scripts/gpu_check.sh memory 2>&1)
rc3=$?
s3=$(printf '%s\n' "$out3" | sed -n '/^## GPU check summary (cudasim dry run, no GPU, memory)/,$p' | datarows)
if [ $rc3 -eq 0 ] && [ "$(printf '%s\n' "$s3" | wc -l)" = 4 ] && [ "$(printf '%s\n' "$s3" | grep -c '^| memory: .*| not selected |')" = 3 ]; then
    echo "PASS: gpu_check.sh memory lists the build and the three memory steps only"
else
    printf '%s\n' "$out3" | tail -12
    echo "FAIL: gpu_check.sh memory (exit $rc3): want the build and 3 memory rows"
    fail=1
fi
exit $fail
