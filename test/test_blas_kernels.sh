#!/usr/bin/env bash
# Which OpenBLAS kernels ./train_gpt_cpu runs (llmc/cpu/blas_select.c), on the real machine:
# - without a user OPENBLAS_CORETYPE: the startup line names the best kernels the CPU's features
#   allow (chosen by llmc, or OpenBLAS's own choice when it already detected a family at least as
#   good); with one set in the environment (as some machines here do): exactly that, unchanged;
# - a user's OPENBLAS_CORETYPE, set for one command to a family this CPU supports, is respected.
# This script never changes or unsets OPENBLAS_CORETYPE for the checks that run as-is.
set -u
cd "$(dirname "$0")/.."
status=0
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1: $2"; status=1; }
if ! grep -q "LLMC_USE_OPENBLAS=1" build/.cflags 2>/dev/null; then
    echo "SKIP: built without OpenBLAS (no kernels to choose)"
    exit 0
fi
tmp=$(mktemp -d /tmp/llmc_blas.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 test/testlib.py random-shard "$tmp/tok.bin" $((2 * 32 * 2 + 1)) 0
best=$(build/test/test_blas_select | sed -n 's/^BEST_CORETYPE //p')
run() { "$@" ./train_gpt_cpu -i "$tmp/tok.bin" -j "$tmp/tok.bin" -e d1 -b 2 -t 32 -x 1 -v 0 -s 0 2>&1 | grep '^backend:'; }
line=$(run env)
echo "as-is: $line (best for this CPU: $best)"
if [ -n "${OPENBLAS_CORETYPE:-}" ]; then
    if [[ "$line" == *"(OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE set by the user)"* ]]; then
        pass "OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE from the environment is respected and reported"
    else
        fail "OPENBLAS_CORETYPE from the environment" "startup line: $line"
    fi
elif [ "$best" = none ]; then
    [[ "$line" == *"OpenBLAS's own choice"* ]] && pass "no better kernels for this CPU: OpenBLAS's own choice, reported" ||
        fail "kernels on a CPU without AVX" "$line"
else
    core=$(sed -n 's/.*OpenBLAS \([A-Za-z0-9_]*\) kernels.*/\1/p' <<<"$line")
    if [[ "$line" == *"chosen by llmc"* ]] && [ "${core,,}" = "${best,,}" ]; then
        pass "without OPENBLAS_CORETYPE the best kernels for the CPU's features ($best) run and are reported"
    elif [[ "$line" == *"OpenBLAS's own choice"* ]] && [ -n "$core" ] &&
        ! grep -qiE "^(prescott|core2|penryn|dunnington|nehalem|atom|opteron|barcelona|bobcat|athlon|nano)$" <<<"$core"; then
        pass "without OPENBLAS_CORETYPE OpenBLAS's own choice ($core, at least $best) is kept and reported"
    else
        fail "kernels without OPENBLAS_CORETYPE" "expected $best; startup line: $line"
    fi
fi
# a user's choice, set for this one command, to a family the CPU supports (one below the best)
case "$best" in
Cooperlake | SkylakeX) user=Haswell ;;
Haswell | Zen) user=Sandybridge ;;
*) user= ;;
esac
if [ -z "$user" ]; then
    echo "SKIP: no lower AVX kernel family to set on this CPU ($best)"
else
    line=$(run env OPENBLAS_CORETYPE=$user)
    if [[ "$line" == *"OpenBLAS $user kernels (OPENBLAS_CORETYPE=$user set by the user)"* ]]; then
        pass "a user's OPENBLAS_CORETYPE=$user is never overridden, and reported"
    else
        fail "a user's OPENBLAS_CORETYPE=$user" "startup line: $line"
    fi
fi
exit $status
