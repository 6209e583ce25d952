#!/usr/bin/env bash
# The memory-bound kernels' machine code (issue 13): every packed kernel (NAME_kernel16 or
# NAME_fused16_kernel in llmc/cuda/: 16-byte packs, common.cuh's Pack16) of gelu, residual, cast,
# the encoder, the layernorm forward/fused residual forward/recompute/backward, AdamW (fp32 and
# compact bf16/int8 states), the classifier and the Llama ops (RMSNorm, SwiGLU, RoPE) (and,
# loads only, the gradient norm's NAME_reduce16), in
# fp32, bf16 and fp16, must load and store with 128-bit accesses (LDG.E.128 / STG.E.128 in
# cuobjdump's SASS for sm_90), and no bf16/fp16 kernel of the trainer may spill registers
# (ptxas: "0 bytes spill stores, 0 bytes spill loads"); the FA2 attention kernels use HMMA,
# LDSM and LDGSTS. A planted scalar kernel must fail the first and the last of these checks, so
# the checks can fail.
# Needs nvcc and cuobjdump + nvdisasm (the CUDA toolkit's, or the PyPI wheels
# nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm, which `make test` installs); SKIPs without nvcc.
set -u
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc)}
if [ -z "$NVCC" ]; then echo "SKIP: SASS checks: no nvcc"; exit 0; fi
# cuobjdump/nvdisasm: the toolkit's, else the wheels' (site-packages/nvidia/cu13/bin)
tooldir=$(dirname "$NVCC")
if [ ! -x "$tooldir/cuobjdump" ] || [ ! -x "$tooldir/nvdisasm" ]; then
    command -v cuobjdump >/dev/null && command -v nvdisasm >/dev/null && tooldir=$(dirname "$(command -v cuobjdump)")
fi
if [ ! -x "$tooldir/cuobjdump" ] || [ ! -x "$tooldir/nvdisasm" ]; then
    tooldir=$(/usr/bin/python3 -c 'import glob, site, sys
for d in site.getsitepackages() + [site.getusersitepackages()]:
    for b in sorted(glob.glob(d + "/nvidia/cu*/bin")):
        if glob.glob(b + "/cuobjdump") and glob.glob(b + "/nvdisasm"): print(b); sys.exit()' 2>/dev/null)
fi
if [ -z "$tooldir" ] || [ ! -x "$tooldir/cuobjdump" ]; then
    echo "FAIL: SASS checks: cuobjdump/nvdisasm not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)"; exit 1
fi
export PATH="$tooldir:$PATH"
dir=$(mktemp -d /tmp/llmc_sass.XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail=0

# global accesses per kernel: "kernel OPCODE" lines
accesses() { cuobjdump --dump-sass "$1" | awk '/Function :/{f=$3} /[^A-Z](LDG|STG)\./{match($0,/(LDG|STG)[.A-Z0-9_]*/); print f, substr($0,RSTART,RLENGTH)}'; }
check_packed() { # object [name regex]: every *_kernel16 (or matching kernel) has a 128-bit load and store
    local acc kernels k n=0 bad=0
    acc=$(accesses "$1")
    kernels=$(printf '%s\n' "$acc" | awk '{print $1}' | grep -E "${2:-kernel16|fused16}" | sort -u)
    for k in $kernels; do
        n=$((n + 1))
        if ! printf '%s\n' "$acc" | grep -q "^$k LDG\.E\.128" ||
            { [ -z "${3:-}" ] && ! printf '%s\n' "$acc" | grep -q "^$k STG\.E\.128"; }; then
            echo "      $k: $(printf '%s\n' "$acc" | grep "^$k " | awk '{print $2}' | sort -u | tr '\n' ' ')"
            bad=$((bad + 1))
        fi
    done
    echo "$n $bad"
}

if ! "$NVCC" -O3 -std=c++17 -arch=sm_90 -I. -Xptxas -v -c test/sass_kernels.cu -o "$dir/k.o" > "$dir/ptxas.txt" 2>&1; then
    cat "$dir/ptxas.txt"; echo "FAIL: nvcc test/sass_kernels.cu"; exit 1
fi
read -r n bad < <(check_packed "$dir/k.o" | tail -1)
check_packed "$dir/k.o" | head -n -1
# gelu fwd + bwd, residual, cast T <- fp32 for 3 types, and fp32 <- bf16/fp16: 14 kernels; the
# layernorm backward, 1..4 packs per lane for 3 types: 12; the classifier for 3 types: 3; the
# encoder forward, dwte and dwpe: 9; the layernorm forward and fused residual forward, 1/2/4/8
# packs per lane: 24; the recompute: 3; AdamW: 3, and its compact-state form: 3; Llama ops for
# 3 types: RMSNorm forward 1, its backward 1..4 packs per lane 4, SwiGLU forward and backward 2,
# RoPE 1: 24 (98 counted on sm_90; the compact AdamW, adamw_update_compact_kernel16, 3 of them)
ncompact=$(accesses "$dir/k.o" | awk '$1 ~ /adamw_update_compact_kernel16/ {print $1}' | sort -u | wc -l)
if [ "$bad" = 0 ] && [ "$n" -ge 98 ] && [ "$ncompact" -ge 3 ]; then
    echo "PASS: $n packed memory-bound kernels (gelu, residual, cast, encoder, layernorm forward/fused/recompute/backward, AdamW and its compact states, classifier, rmsnorm, swiglu, rope; fp32/bf16/fp16) load and store 128 bits"
else
    echo "FAIL: packed kernels: $bad of $n without 128-bit loads and stores (want at least 98, all 128-bit, 3 of them the compact AdamW: $ncompact)"; fail=1
fi
# the gradient norm's partial sums (3 types): 128-bit loads (they store one float per block)
check_packed "$dir/k.o" reduce16 loads | head -n -1
read -r n bad < <(check_packed "$dir/k.o" reduce16 loads | tail -1)
if [ "$bad" = 0 ] && [ "$n" -ge 3 ]; then
    echo "PASS: $n packed reductions (gradient norm; fp32/bf16/fp16) load 128 bits"
else
    echo "FAIL: packed reductions: $bad of $n without 128-bit loads (want at least 3)"; fail=1
fi
# spills of the kernels this file is about: the packed memory-bound ones and attention_decode in
# every precision, and any bf16/fp16 kernel (FA2). The fp32 CUDA-core attention kernels that
# attention.cuh brings in are the tight reference path and may spill (as in train_gpt's check below).
spills=$(awk '/Compiling entry function/{f=$0} /spill stores/{ if (($5 > 0 || $9 > 0) && f ~ /(kernel16|fused16|reduce16|attention_decode|13__nv_bfloat16|6__half)/) print f " -> " $0 }' "$dir/ptxas.txt" | head -5)
nentries=$(grep -c 'Compiling entry function' "$dir/ptxas.txt")
if [ -z "$spills" ] && [ "$nentries" -gt 0 ]; then echo "PASS: the memory-bound kernels, attention_decode (./generate_gpu) and the bf16/fp16 kernels do not spill ($nentries entry functions)"; else echo "FAIL: spills ($nentries entries): $spills"; fail=1; fi

# the check can fail: a kernel16 with 2-byte accesses (the old form) must be reported
cat > "$dir/planted.cu" <<'CU'
#include <cuda_bf16.h>
__global__ void planted_kernel16(__nv_bfloat16 *o, const __nv_bfloat16 *i, unsigned long n) {
    unsigned long k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n) o[k] = i[k];
}
__global__ void planted_reduce16(float *o, const __nv_bfloat16 *i, unsigned long n) {
    unsigned long k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n) o[k] = __bfloat162float(i[k]);
}
CU
"$NVCC" -O3 -arch=sm_90 -c "$dir/planted.cu" -o "$dir/p.o" 2>/dev/null
read -r pn pbad < <(check_packed "$dir/p.o" | tail -1)
if [ "$pn" = 1 ] && [ "$pbad" = 1 ]; then echo "PASS: a planted 2-byte kernel16 is reported"; else echo "FAIL: the planted 2-byte kernel16 was not reported ($pn kernels, $pbad bad)"; fail=1; fi
read -r pn pbad < <(check_packed "$dir/p.o" reduce16 loads | tail -1)
if [ "$pn" = 1 ] && [ "$pbad" = 1 ]; then echo "PASS: a planted 2-byte reduce16 is reported"; else echo "FAIL: the planted 2-byte reduce16 was not reported ($pn kernels, $pbad bad)"; fail=1; fi

# the FlashAttention-2-class kernels (attention_fa2.cuh) run on tensor cores from registers:
# every one must hold mma.sync (HMMA.16816), ldmatrix and ldmatrix.trans (LDSM.16.M88 /
# LDSM.16.MT88) and cp.async (LDGSTS)
check_tc() { # object, kernel-name regex -> "kernels missing-any"
    local sass k n=0 bad=0 op miss
    sass=$(cuobjdump --dump-sass "$1" | awk '/Function :/{f=$3} /(HMMA|LDSM|LDGSTS)[.]/{match($0,/(HMMA|LDSM|LDGSTS)[.A-Z0-9_]*/); print f, substr($0,RSTART,RLENGTH)}')
    for k in $(cuobjdump --dump-sass "$1" | awk '/Function :/{print $3}' | grep -E "$2" | sort -u); do
        n=$((n + 1)); miss=""
        for op in 'HMMA\.16816' 'LDSM\.16\.M88' 'LDSM\.16\.MT88' 'LDGSTS'; do
            printf '%s\n' "$sass" | grep -q "^$k $op" || miss="$miss $op"
        done
        if [ -n "$miss" ]; then echo "      $k lacks$miss"; bad=$((bad + 1)); fi
    done
    echo "$n $bad"
}
check_tc "$dir/k.o" fa2 | head -n -1
read -r n bad < <(check_tc "$dir/k.o" fa2 | tail -1)
# the forward and the 5-product backward kernel in bf16 and fp16 at head sizes 64 and 128
if [ "$bad" = 0 ] && [ "$n" -ge 8 ]; then
    echo "PASS: $n FA2 attention kernels use HMMA.16816, LDSM (+ .trans) and LDGSTS"
else
    echo "FAIL: FA2 attention kernels: $bad of $n lack HMMA/LDSM/LDGSTS (want at least 8, all with them)"; fail=1
fi
read -r pn pbad < <(check_tc "$dir/p.o" planted_kernel16 | tail -1)
if [ "$pn" = 1 ] && [ "$pbad" = 1 ]; then echo "PASS: a planted kernel without HMMA/LDSM/LDGSTS is reported"; else echo "FAIL: the planted kernel was not reported by the tensor-core check ($pn kernels, $pbad bad)"; fail=1; fi

# no bf16/fp16 kernel of the trainer spills: ptxas's report of train_gpt.cu (mk/cuda.mk keeps it
# beside the object when it builds train_gpt)
rep=build/cuda/train_gpt.o.ptxas
if [ -f "$rep" ]; then
    sp=$(awk '/Compiling entry function/{f=$0} /spill stores/{ if (($5 > 0 || $9 > 0) && f ~ /(13__nv_bfloat16|6__half)/) print f " -> " $0 }' "$rep")
    nk=$(grep -c "Compiling entry function" "$rep")
    if [ "$nk" -gt 0 ] && [ -z "$sp" ]; then echo "PASS: no bf16/fp16 kernel of train_gpt spills ($nk entry functions in ptxas's report)";
    else echo "FAIL: train_gpt kernels spill (or no report): $nk entries; $sp"; fail=1; fi
else
    echo "FAIL: $rep missing: build train_gpt first (make train_gpt)"; fail=1
fi
exit $fail
