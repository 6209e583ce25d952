#!/usr/bin/env bash
# Runs every test command listed in test/suite.d/*.txt (one command per line, run from the
# repository root; '#' starts a comment) and ends with the line "N passed, M failed".
#
# A test command reports each check as a line "PASS: name" or "FAIL: name: reason" and exits
# non-zero if anything failed. A command that exits non-zero without printing a FAIL line
# (a crash, a missing binary) counts as one failure, so nothing fails silently. A command
# that prints no PASS/FAIL line at all and exits 0 counts as one pass, unless it printed
# "SKIP: reason" lines: those are counted as skipped, never as passed.
#
# Two at a time: a line that starts with "@pair " declares a command that may run beside another
# one (the machine of CI has 2 cores). Such a command must keep to one core (no OpenMP/OpenBLAS
# team worth the name, no make -j, no mpirun or other ranks), must not depend on timing, and must
# write only under its own mktemp directory (no fixed /tmp name, TCP port, out/ or build/ path).
# Every other line runs alone, after the "@pair" ones: a new test is alone until it declares itself.
# The "@pair" commands run first, two at a time, then the others one by one; each command's output
# is buffered and printed whole when it ends, in that order (suite order within each group).
# The end: the ten slowest commands with their seconds, the failing ones, then the counts line.
# Usage: test/run_tests.sh [FILTER]   (FILTER: only commands containing this substring;
#        RUN_TESTS_JOBS=1 runs the "@pair" commands one at a time too)
set -u
cd "$(dirname "$0")/.."
filter="${1:-}"
JOBS=${RUN_TESTS_JOBS:-2}
tmp=$(mktemp -d /tmp/llmc_run_tests.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill -- "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

# ---- the commands: paired ones first, then the others, each group in suite order -----------------
paired=()
alone=()
for suite in test/suite.d/*.txt; do
    while IFS= read -r cmd || [ -n "$cmd" ]; do
        cmd="${cmd%%#*}"
        [[ -z "${cmd// /}" ]] && continue
        pair=0
        if [[ "$cmd" == "@pair "* ]]; then pair=1; cmd="${cmd#@pair }"; fi
        [[ -n "$filter" && "$cmd" != *"$filter"* ]] && continue
        if [ "$pair" -eq 1 ]; then paired+=("$cmd"); else alone+=("$cmd"); fi
    done < "$suite"
done
cmds=("${paired[@]}" "${alone[@]}")
npaired=${#paired[@]}

# start I: runs command I in the background; its output goes to $tmp/I.out, then its status and
# seconds to $tmp/I.done (written last: its presence means the command ended)
start() {
    local i=$1
    (
        exec > "$tmp/$i.out" 2>&1 < /dev/null # (a crash's "Segmentation fault" line included)
        s=$(date +%s.%N)
        bash -c "${cmds[i]}"
        rc=$?
        echo "$rc $(awk -v s="$s" -v e="$(date +%s.%N)" 'BEGIN{printf "%.1f", e-s}')" > "$tmp/$i.tmp"
        mv "$tmp/$i.tmp" "$tmp/$i.done"
    ) &
    pids+=($!)
}

passed=0
failed=0
skipped=0
failed_cmds=()
times=()
# report I: prints command I's buffered output and its line of counts, adds its counts
report() {
    local i=$1 cmd=${cmds[$1]} rc secs p f k
    read -r rc secs < "$tmp/$i.done"
    echo "=== $cmd"
    # (as $(...) did: trailing newlines dropped, one added)
    printf '%s\n' "$(cat "$tmp/$i.out")"
    p=$(grep -c '^PASS: ' "$tmp/$i.out")
    f=$(grep -c '^FAIL: ' "$tmp/$i.out")
    k=$(grep -c '^SKIP: ' "$tmp/$i.out")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL: '$cmd' exited with status $rc"
        f=1
    fi
    if [ "$rc" -eq 0 ] && [ "$p" -eq 0 ] && [ "$f" -eq 0 ] && [ "$k" -eq 0 ]; then p=1; fi
    skipped=$((skipped + k))
    if [ "$rc" -eq 0 ] && [ "$f" -gt 0 ]; then
        echo "FAIL: '$cmd' printed FAIL lines but exited 0 (a test binary must exit non-zero)"
        f=$((f + 1))
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    [ "$f" -gt 0 ] && failed_cmds+=("$cmd")
    times+=("$secs $cmd")
    echo "--- ${secs}s: $p passed, $f failed$([ "$k" -gt 0 ] && echo ", $k skipped")"
    rm -f "$tmp/$i.out"
}

# ---- run: up to $JOBS paired commands at once, then one at a time; print in order as they end ------
t0=$(date +%s.%N)
next=0    # the next command to start
shown=0   # the next command to print
running() { local n=0 i; for ((i = shown; i < next; i++)); do [ -f "$tmp/$i.done" ] || n=$((n + 1)); done; echo $n; }
while [ "$shown" -lt "${#cmds[@]}" ]; do
    if [ "$next" -lt "${#cmds[@]}" ]; then
        n=$(running)
        if [ "$next" -lt "$npaired" ] && [ "$n" -lt "$JOBS" ]; then start $next; next=$((next + 1)); continue; fi
        if [ "$next" -ge "$npaired" ] && [ "$n" -eq 0 ]; then start $next; next=$((next + 1)); continue; fi
    fi
    if [ "$shown" -lt "$next" ] && [ -f "$tmp/$shown.done" ]; then report $shown; shown=$((shown + 1)); continue; fi
    wait -n 2>/dev/null || sleep 0.2
done
wall=$(awk -v s="$t0" -v e="$(date +%s.%N)" 'BEGIN{printf "%.0f", e-s}')

if [ "${#times[@]}" -gt 0 ]; then
    echo
    echo "Slowest commands (of ${#cmds[@]}, ${wall} s wall in all):"
    printf '%s\n' "${times[@]}" | sort -k1,1 -g -r | head -10 | while read -r t c; do
        [ "${#c}" -gt 150 ] && c="${c:0:147}..."
        printf '  %7.1fs  %s\n' "$t" "$c"
    done
fi
if [ "${#failed_cmds[@]}" -gt 0 ]; then
    echo
    echo "Failing commands:"
    printf '  %s\n' "${failed_cmds[@]}"
fi
echo
if [ "$skipped" -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"; else echo "$passed passed, $failed failed"; fi
[ "$failed" -eq 0 ]
