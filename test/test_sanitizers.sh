#!/usr/bin/env bash
# The sanitizer pass (issue 12): the CPU tests, ./train_gpt_cpu's end-to-end and bad-input tests
# (test/test_train_cpu.py), ./tokenizer's tests (test/test_tokenizer.py --quick), the Hugging Face
# directory conversions and bad inputs (test/test_hf.py --quick, ./hf_convert) and one cudasim
# program (dev/cuda/gelu: a g++ link of ASan-built C objects, issue 12 defect 12), built with
# gcc's ASan + UBSan into build/asan (programs in build/asan/bin; the normal build is untouched).
# Every sanitizer report is written to a file of its own (log_path), and a check FAILs when one
# appears, whatever the exit status; a sanitizer death exits 66, which no test expects. Then three
# bugs planted in a scratch copy of llmc/data/dataloader.c (a heap overflow, a signed overflow, a leak)
# must be caught by the same check, or the pass itself is broken.
# No suppressions are needed (OpenBLAS's OpenMP build and libgomp report nothing here); should one
# become necessary, check it into test/ with its reason. About 2-3 min on 2 cores.
set -u
cd "$(dirname "$0")/.."
B=build/asan
BIN=$B/bin
SAN="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all"
# gcc's UBSan honours log_path only when linked statically (with a shared libubsan next to libasan
# its reports go to stderr, where a test capturing stderr could miss them)
SAN_LD="-static-libubsan"
CHECKS=(test/test_core test/test_ops_cpu test/test_dataloader test/test_tokenizer)
failed=0

reports=$(mktemp -d /tmp/llmc_sanitizers.XXXXXX)
trap 'rm -rf "$reports"' EXIT
ASAN_BASE="exitcode=66:detect_leaks=1"
UBSAN_BASE="exitcode=66:print_stacktrace=1:halt_on_error=1"

# san_check NAME COMMAND...: runs COMMAND with its sanitizer reports going to a directory of its
# own; PASS when it exits 0 and no report was written.
san_check() {
    local name=$1 dir=$reports/$1
    shift
    mkdir -p "$dir"
    local out rc start=$SECONDS
    out=$(ASAN_OPTIONS="$ASAN_BASE:log_path=$dir/asan" UBSAN_OPTIONS="$UBSAN_BASE:log_path=$dir/ubsan" "$@" 2>&1)
    rc=$?
    local found
    found=$(find "$dir" -type f | sort)
    if [ "$rc" -eq 0 ] && [ -z "$found" ]; then
        echo "PASS: sanitizers: $name ($((SECONDS - start)) s)"
        return 0
    fi
    echo "FAIL: sanitizers: $name: exit status $rc, $(echo "$found" | grep -c .) sanitizer report(s)"
    printf '%s\n' "$out" | grep -E '^FAIL' | head -20 | sed 's/^/    /'
    printf '%s\n' "$out" | tail -5 | sed 's/^/    | /'
    for f in $found; do
        echo "    --- $f"
        head -40 "$f" | sed 's/^/    /'
    done
    failed=1
    return 1
}

# ---- build ---------------------------------------------------------------------------------
targets=("${CHECKS[@]/#/$B/}" "$BIN/train_gpt_cpu" "$BIN/tokenizer")
cudasim_ok=$(make -s print-CUDASIM_OK)
# a kernel-lab program: its g++ link takes libllmc.a's ASan objects (what defect 12 broke)
[ "$cudasim_ok" = 1 ] && targets+=("$B/cudasim/dev/cuda/gelu")
have_cjson=$(make -s print-HAVE_CJSON)
[ "$have_cjson" = 1 ] && targets+=("$BIN/hf_convert")
if ! log=$(CFLAGS="$SAN" LDFLAGS="$SAN_LD" make -j2 --no-print-directory BUILD=$B BIN_DIR=$BIN "${targets[@]}" 2>&1); then
    echo "FAIL: sanitizers: the ASan+UBSan build failed:"
    printf '%s\n' "$log" | grep -E 'error|undefined reference' | head -20
    exit 1
fi
echo "PASS: sanitizers: ASan+UBSan build of the CPU tests, train_gpt_cpu, tokenizer$([ "$cudasim_ok" = 1 ] && echo ' and a cudasim program (g++ link)')"

# ---- the tests, sanitized ----------------------------------------------------------------------
san_check test_core "$B/test/test_core"
san_check test_ops_cpu "$B/test/test_ops_cpu"
san_check test_dataloader "$B/test/test_dataloader"
san_check test_tokenizer "$B/test/test_tokenizer" 1337
if [ "$cudasim_ok" = 1 ]; then
    san_check cudasim_gelu_lab env OMP_WAIT_POLICY=passive "$B/cudasim/dev/cuda/gelu" --small
else
    echo "SKIP: sanitizers: cudasim link check: CUDA headers not found (the harness needs cuda_runtime.h)"
fi
san_check train_gpt_cpu_end_to_end_and_bad_inputs env LLMC_TEST_TRAINER="$BIN/train_gpt_cpu" /usr/bin/python3 test/test_train_cpu.py
san_check tokenizer_tool env LLMC_TEST_TOKENIZER="$PWD/$BIN/tokenizer" /usr/bin/python3 test/test_tokenizer.py --seed 20240520 --quick
san_check tokenizer_tiktoken env LLMC_TEST_TOKENIZER="$PWD/$BIN/tokenizer" /usr/bin/python3 test/test_tokenizer_tiktoken.py
if [ "$have_cjson" = 1 ]; then
    san_check hf_directories_and_bad_inputs env LLMC_TEST_TRAINER="$PWD/$BIN/train_gpt_cpu" \
        LLMC_TEST_HF_CONVERT="$PWD/$BIN/hf_convert" /usr/bin/python3 test/test_hf.py --quick
else
    echo "SKIP: sanitizers: Hugging Face directories: cJSON not found (apt-get install libcjson-dev)"
fi

# ---- the pass must catch planted bugs ----------------------------------------------------------
# plant NAME SED_EXPRESSION EXPECTED_REPORT: test_dataloader linked with a scratch copy of
# llmc/data/dataloader.c changed by SED_EXPRESSION must FAIL this pass with EXPECTED_REPORT.
plant() {
    local name=$1 expr=$2 want=$3 mut=$B/mutants/$1
    mkdir -p "$mut"
    sed "$expr" llmc/data/dataloader.c > "$mut/dataloader.c"
    if cmp -s llmc/data/dataloader.c "$mut/dataloader.c"; then
        echo "FAIL: sanitizers: planted $name: the sed expression no longer changes llmc/data/dataloader.c; update it"
        failed=1
        return
    fi
    if ! $cc -Illmc -c "$mut/dataloader.c" -o "$mut/dataloader.o" ||
        ! $cc $SAN_LD "$B/test/test_dataloader.o" "$mut/dataloader.o" $B/libllmc.a $ldlibs -o "$mut/test_dataloader"; then
        echo "FAIL: sanitizers: planted $name: cannot build the mutant"
        failed=1
        return
    fi
    local saved=$failed out
    out=$(san_check "planted_$name" "$mut/test_dataloader")
    failed=$saved
    if printf '%s\n' "$out" | grep -q "^FAIL: sanitizers: planted_$name" && printf '%s\n' "$out" | grep -q "$want"; then
        echo "PASS: sanitizers: a planted $name in llmc/data/dataloader.c is caught ($want)"
    else
        echo "FAIL: sanitizers: a planted $name in llmc/data/dataloader.c went unnoticed:"
        printf '%s\n' "$out" | head -20 | sed 's/^/    /'
        failed=1
    fi
}
# (the compiler and libraries of the ASan build, asked of make once for the three mutants)
cc=$(CFLAGS="$SAN" make -s BUILD=$B print-CC print-CFLAGS | tr '\n' ' ')
ldlibs=$(CFLAGS="$SAN" LDFLAGS="$SAN_LD" make -s BUILD=$B print-LDLIBS)
plant heap_overflow 's/mallocCheck(plen, "shard path")/mallocCheck(plen - 1, "shard path")/' heap-buffer-overflow
plant signed_overflow 's/if (i < bt) inputs\[i\] = (int32_t)tok;/if (i < bt) inputs[i] = (int32_t)tok * 65536 * 32768;/' "signed integer overflow"
plant leak '/^void dataloader_close/,/^}/{/^    free(dl);$/d}' "byte(s) leaked in"

exit $failed
