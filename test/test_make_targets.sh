#!/usr/bin/env bash
# test_make_targets.sh - the Makefile says what is true and builds what its targets run.
#   1. `make`'s feature lines: NCCL (with MPI) makes train_gpt data-parallel; MPI makes train_gpt_cpu data-parallel.
#   2. `make test-cudasim` from a fresh clone: its prerequisites cover every binary that the
#      suite commands it runs (those naming cudasim, and the scripts they call) execute. Checked
#      with a dry run (make -n) against an empty build directory, so nothing is built.
set -u
cd "$(dirname "$0")/.."
FAILED=0
W=$(mktemp -d /tmp/llmc_maketargets.XXXXXX)
trap 'rm -rf "$W"' EXIT

for have in 1 ""; do
    lines=$(make -s --no-print-directory features HAVE_MPI=$have HAVE_NCCL=$have 2>&1 | grep -E " (MPI|NCCL) ")
    nccl=$(printf '%s\n' "$lines" | grep " NCCL ")
    mpi=$(printf '%s\n' "$lines" | grep " MPI ")
    # without MPI, train_gpt_cpu still trains data-parallel over -pi tcp|fs (dist.c's TCP transport)
    if [ -n "$have" ]; then want="runs data-parallel under mpirun"; wantn="train_gpt trains data-parallel"; else want="without it train_gpt_cpu runs data-parallel with -pi tcp|fs"; wantn="train_gpt runs one process"; fi
    if printf '%s\n' "$nccl" | grep -q "$wantn" && printf '%s\n' "$mpi" | grep -q "$want"; then
        echo "PASS: make's NCCL line says what train_gpt does with it, its MPI line says what train_gpt_cpu does (HAVE_MPI/NCCL='$have')"
    else
        echo "FAIL: make's MPI/NCCL lines (HAVE_MPI/NCCL='$have'): $lines"; FAILED=1
    fi
done

dry=$(make -n --no-print-directory test-cudasim BUILD="$W/b" 2>&1)
if printf '%s\n' "$dry" | grep -q "CUDA headers not found"; then
    echo "SKIP: no CUDA headers: make test-cudasim skips everything here"
    exit $FAILED
fi
# the binaries: build/cudasim/..., ./train_gpt_cpu and ./hf_convert in the cudasim suite commands and in the
# scripts those commands run
cmds=$(cat test/suite.d/*.txt | sed 's/#.*//' | grep cudasim)
scripts=$(printf '%s\n' "$cmds" | grep -oE '(test|scripts)/[A-Za-z0-9_./-]+\.sh' | sort -u)
need=$( { printf '%s\n' "$cmds"; for s in $scripts; do cat "$s"; done; } |
        grep -oE 'build/cudasim/[A-Za-z0-9_/.-]+|\./train_gpt_cpu|\./hf_convert' | grep -v '\.cpp$' | sort -u)
missing=()
for bin in $need; do
    case $bin in
        ./train_gpt_cpu) out="-o train_gpt_cpu" ;;
        ./hf_convert) out="-o hf_convert" ;;
        build/*) out="-o $W/b/${bin#build/}" ;;
    esac
    printf '%s\n' "$dry" | grep -qF -- "$out" || missing+=("$bin")
done
if [ -n "$need" ] && [ ${#missing[@]} -eq 0 ]; then
    echo "PASS: make test-cudasim builds all $(printf '%s\n' $need | wc -l) binaries its commands run"
else
    echo "FAIL: make test-cudasim runs binaries it does not build: ${missing[*]:-(none found to check)}"; FAILED=1
fi
exit $FAILED
