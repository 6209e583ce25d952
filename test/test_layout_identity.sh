#!/usr/bin/env bash
# test_layout_identity.sh - the files the trainers write are byte-identical to those of the build
# before the llmc/ layout change (issue 21: "behaviour, file formats, flags and bit-exactness do not
# change"). A fixed set of seeded runs on a synthetic shard (GPT-2 and Llama, fp32 and bf16 files,
# resume, --save-hf, int8 optimizer states, and ./train_gpt through the cudasim harness in fp32) writes
# model, state, DONE, .sum, HF and log files; their CRC-32s (log.jsonl without its timestamps, timings,
# commit and machine fields) must equal the expected ones. The Llama runs give -r 0: the pre-move
# build ran a CPU Llama at -r 0 whatever -r said (and saved 0); the Llama now has -r levels and saves
# the -r it runs (1 by default), the same bits at every level (test_llama_train.py).
#
# The expected CRCs: test/fixtures/layout_crcs.txt was written by this script with
# `test/test_layout_identity.sh --write FILE` using binaries built from commit fa2875c (the last
# commit before the move) on an AMD EPYC VM of this project (2 cores). Floating-point results depend
# on the OpenBLAS kernel and the -march=native code of the machine, so the fixture is keyed by that
# machine's kernel line; on another kind of machine the script builds train_gpt_cpu (and the harness
# trainer) from fa2875c in a scratch worktree and compares against what those write here and now.
# Usage: test/test_layout_identity.sh [--write FILE] [--bin DIR]   (DIR: where train_gpt_cpu is; default .)
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
PREMOVE=fa2875c
FIXTURE=test/fixtures/layout_crcs.txt
write=""; bindir=.
while [ $# -gt 0 ]; do case "$1" in
    --write) write=$2; shift 2 ;;
    --bin) bindir=$2; shift 2 ;;
    *) echo "FAIL: unknown argument $1"; exit 1 ;;
esac; done
CPU=$bindir/train_gpt_cpu
SIM=$bindir/build/cudasim/train_gpt
[ -x "$CPU" ] || { echo "FAIL: $CPU not built"; exit 1; }
W=$(mktemp -d /tmp/llmc_layout.XXXXXX)
trap 'rm -rf "$W"' EXIT
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=2

# runs BIN_DIR OUT_DIR: every seeded run, then one "name crc" line per written file in OUT_DIR/crcs
runs() {
    local b o cpu sim
    b=$(cd "$1" && pwd); o=$2; cpu=$b/train_gpt_cpu; sim=$b/build/cudasim/train_gpt
    mkdir -p "$o"
    # (run from inside OUT_DIR with relative paths: the DONE markers and logs name them)
    pushd "$o" > /dev/null || return 1
    /usr/bin/python3 - train.bin <<'PY'
import struct, random, sys
random.seed(21); n = 6000
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *([20240520, 1, n] + [0] * 253)))
    f.write(struct.pack("<%dH" % n, *[random.randrange(50257) for _ in range(n)]))
PY
    local d="-i train.bin -j train.bin -b 2 -t 32 -v 2 -m 2 -s 2 -g 4 --threads 2 -l 1e-3 -u 1 -c 0.1"
    {
    "$cpu" -e d2 $d -x 3 -n 2 -o "gpt2" &&
    "$cpu" -e d2 $d -x 5 -n 2 -o "gpt2" -y 1 --allow-config-change 1 &&
    "$cpu" -e d2 $d -x 2 --checkpoint-bf16 1 --optim-state int8 -o "gpt2bf16" &&
    "$cpu" -e llama3:d1 $d -x 3 -n 3 -r 0 -o "llama" &&
    if "$cpu" --help 2>&1 | grep -q -- --save-hf && [ -z "${NO_HF:-}" ]; then
        "$cpu" -e d1 $d -x 2 --save-hf 1 -o "hf" && "$cpu" -e llama3:d1 $d -x 1 -r 0 --save-hf 1 -o "hfllama"; fi &&
    if [ -x "$sim" ]; then "$sim" -e d1 $d -x 2 -n 2 --precision fp32 -o "sim"; fi
    } > runs.log 2>&1 || { echo "FAIL: a seeded run failed ($b):"; tail -5 runs.log; popd > /dev/null; return 1; }
    (/usr/bin/python3 - > crcs <<'PY'
import json, os, zlib
# (mem_planned_peak: the CPU plan's blas_packing depends on the OpenBLAS kernels and the thread count;
# dev_*: the device allocator's fields, added to ./train_gpt's records after the fixture, and mem_gib /
# peak_mem_gib: cudaMemGetInfo's use, now the allocator's segments (2 MiB granularity), issue 26)
# (sim/log.jsonl's CRC in the fixture recomputed with this DROP from main 09bb272's build, which matched it before)
DROP = {"dev_reserved", "dev_allocated", "dev_largest_free", "mem_gib", "peak_mem_gib", "time", "version", "host", "cpu", "cores", "step_ms", "tokens_per_s", "data_wait_ms", "mfu",
        "wall_s", "elapsed_s", "eta_s", "mem_measured_hwm", "mem_runtime_overhead", "mem_planned_over_measured",
        "mem_planned_peak"}
def clean(v):
    if isinstance(v, dict): return {k: clean(x) for k, x in v.items() if k not in DROP}
    return v
for run in sorted(d for d in os.listdir(".") if os.path.isdir(d)):
    for root, dirs, files in os.walk(run):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(root, f)
            if f == ".llmc.lock": continue
            data = open(p, "rb").read()
            if f == "log.jsonl":
                recs = [clean(json.loads(l)) for l in data.decode().splitlines()]
                for r in recs:  # the run record's config names its own output directory
                    r.pop("config", None) if r.get("event") else None
                data = "\n".join(json.dumps(r, sort_keys=True) for r in recs).encode()
            print(p, "%08x" % zlib.crc32(data))
PY
    )
    popd > /dev/null
}

runs "$bindir" "$W/new" || exit 1
# the machine: the OpenBLAS kernels the trainer ran and the CPU flags that change -march=native code
machine="$(grep -o -m1 'OpenBLAS [A-Za-z0-9]* kernels\|built-in blocked matmul' "$W/new/runs.log"); $(grep -o -w 'avx512f\|avx512bw\|avx2\|fma\|avx512_bf16\|avx512vl' /proc/cpuinfo | sort -u | tr '\n' ' ')"
if [ -n "$write" ]; then
    { echo "# machine: $machine"; cat "$W/new/crcs"; } > "$write"
    echo "wrote $(grep -vc '^#' "$write") CRCs to $write"; exit 0
fi
expected=$W/expected
if [ -f "$FIXTURE" ] && [ "$(sed -n 's/^# machine: //p' "$FIXTURE")" = "$machine" ]; then
    grep -v '^#' "$FIXTURE" > "$expected"; source="the fixture ($FIXTURE, made by $PREMOVE's build)"
    # runs the fixture machine could do and this build cannot (no cJSON, no harness) are not compared
    [ -x "$SIM" ] || sed -i '/^sim\//d' "$expected"
    "$CPU" --help 2>&1 | grep -q -- --save-hf || sed -i '/^hf/d' "$expected"
else
    git cat-file -e "$PREMOVE^{commit}" 2>/dev/null || {
        echo "SKIP: this machine ($machine) is not the fixture's and commit $PREMOVE is not in this clone"; exit 0; }
    echo "note: this machine is not the fixture's; building $PREMOVE's trainers to compare against"
    old=$W/old; git worktree add -q --detach "$old" "$PREMOVE" || { echo "FAIL: git worktree $PREMOVE"; exit 1; }
    trap 'git worktree remove --force "$old" 2>/dev/null; rm -rf "$W"' EXIT
    targets=train_gpt_cpu; [ -x "$SIM" ] && targets="$targets build/cudasim/train_gpt"
    make -C "$old" -j2 $targets > "$W/old_build.log" 2>&1 || { echo "FAIL: building $PREMOVE"; tail -5 "$W/old_build.log"; exit 1; }
    runs "$old" "$W/oldruns" || exit 1
    cp "$W/oldruns/crcs" "$expected"; source="$PREMOVE's build on this machine"
fi
n=$(wc -l < "$expected")
if [ "$n" -lt 20 ]; then echo "FAIL: only $n expected files"; exit 1; fi
if diff <(sort "$expected") <(sort "$W/new/crcs") > "$W/diff"; then
    echo "PASS: layout identity: $n files (models, states, DONE markers, .sums, HF directories, logs) byte-identical to $source"
else
    echo "FAIL: layout identity: files differ from $source:"; sed 's/^/    /' "$W/diff" | head -30; exit 1
fi
