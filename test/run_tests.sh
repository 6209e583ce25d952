#!/usr/bin/env bash
# Runs every test command listed in test/suite.d/*.txt (one command per line, run from the
# repository root; '#' starts a comment) and ends with the line "N passed, M failed".
#
# A test command reports each check as a line "PASS: name" or "FAIL: name: reason" and exits
# non-zero if anything failed. A command that exits non-zero without printing a FAIL line
# (a crash, a missing binary) counts as one failure, so nothing fails silently. A command
# that prints no PASS/FAIL line at all and exits 0 counts as one pass, unless it printed
# "SKIP: reason" lines: those are counted as skipped, never as passed.
# Usage: test/run_tests.sh [FILTER]   (FILTER: only commands containing this substring)
set -u
cd "$(dirname "$0")/.."
filter="${1:-}"
passed=0
failed=0
skipped=0
failed_cmds=()
for suite in test/suite.d/*.txt; do
    while IFS= read -r cmd || [ -n "$cmd" ]; do
        cmd="${cmd%%#*}"
        [[ -z "${cmd// /}" ]] && continue
        [[ -n "$filter" && "$cmd" != *"$filter"* ]] && continue
        echo "=== $cmd"
        start=$(date +%s.%N)
        out=$(bash -c "$cmd" 2>&1 < /dev/null)
        rc=$?
        secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN{printf "%.1f", e-s}')
        printf '%s\n' "$out"
        p=$(printf '%s\n' "$out" | grep -c '^PASS: ' || true)
        f=$(printf '%s\n' "$out" | grep -c '^FAIL: ' || true)
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
            echo "FAIL: '$cmd' exited with status $rc"
            f=1
        fi
        k=$(printf '%s\n' "$out" | grep -c '^SKIP: ' || true)
        if [ "$rc" -eq 0 ] && [ "$p" -eq 0 ] && [ "$f" -eq 0 ] && [ "$k" -eq 0 ]; then p=1; fi
        skipped=$((skipped + k))
        if [ "$rc" -eq 0 ] && [ "$f" -gt 0 ]; then
            echo "FAIL: '$cmd' printed FAIL lines but exited 0 (a test binary must exit non-zero)"
            f=$((f + 1))
        fi
        passed=$((passed + p))
        failed=$((failed + f))
        [ "$f" -gt 0 ] && failed_cmds+=("$cmd")
        echo "--- ${secs}s: $p passed, $f failed$([ "$k" -gt 0 ] && echo ", $k skipped")"
    done < "$suite"
done
if [ "${#failed_cmds[@]}" -gt 0 ]; then
    echo
    echo "Failing commands:"
    printf '  %s\n' "${failed_cmds[@]}"
fi
echo
if [ "$skipped" -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"; else echo "$passed passed, $failed failed"; fi
[ "$failed" -eq 0 ]
