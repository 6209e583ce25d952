#!/bin/bash
# test_nccl_ranks.sh - cudasim's multi-rank NCCL (test/cudasim/nccl.cpp) with 2..4 processes:
# every collective under mpirun -np 2, 3, 4 against hand-worked results; mismatched calls give
# every rank ncclInvalidUsage; a rank that kills itself (processes started here, no mpirun to
# tear the job down) makes the other's AllReduce fail within 10 s. Prints PASS:/FAIL: per check.
set -u
bin=${1:-build/cudasim/test/cudasim/tests/nccl_ranks}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
check() { # name, command...: the command must exit 0 and print no FAIL
    local name=$1; shift
    local out=$work/out.txt
    if "$@" >"$out" 2>&1 && ! grep -q '^FAIL' "$out"; then
        echo "PASS: $name ($(grep -c '^PASS' "$out") rank checks)"
    else
        echo "FAIL: $name"; tail -20 "$out"; fails=$((fails + 1))
    fi
}
for np in 2 3 4; do
    d=$(mktemp -d -p "$work")
    check "nccl ranks: every collective, mpirun -np $np" timeout 300 mpirun --oversubscribe -np $np "$bin" "$d"
done
d=$(mktemp -d -p "$work")
check "nccl ranks: mismatched collectives, mpirun -np 3" timeout 120 mpirun --oversubscribe -np 3 "$bin" "$d" mismatch

# a dead rank: two processes started here; rank 1 SIGKILLs itself and stays a zombie until waited
d=$(mktemp -d -p "$work")
CUDASIM_TEST_RANK=1 CUDASIM_TEST_SIZE=2 "$bin" "$d" die >"$work/r1.txt" 2>&1 &
p1=$!
CUDASIM_TEST_RANK=0 CUDASIM_TEST_SIZE=2 timeout 60 "$bin" "$d" die >"$work/r0.txt" 2>&1
rc0=$?
wait $p1 2>/dev/null; rc1=$?
if [ $rc0 -eq 0 ] && [ $rc1 -eq 137 ] && grep -q '^PASS: nccl ranks: a dead rank' "$work/r0.txt" && grep -q 'rank 1 (pid [0-9]*) is gone' "$work/r0.txt"; then
    echo "PASS: nccl ranks: a killed rank makes the other fail, not hang"
else
    echo "FAIL: nccl ranks: a killed rank makes the other fail, not hang (rank 0 exit $rc0, rank 1 exit $rc1)"
    cat "$work/r0.txt"; fails=$((fails + 1))
fi
exit $((fails > 0))
