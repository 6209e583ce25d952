#!/usr/bin/env bash
# Planted kernel bugs must make the CUDA op tests fail through the harness: each mutant is a
# copy of llmc/cuda/ with one bug (a missing barrier, a wrong index), built into
# test_cuda_ops exactly as CI builds the real one. PASS means the bug was caught.
set -uo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory build/cudasim/test/test_cuda_ops >/dev/null || { echo "FAIL: cannot build test_cuda_ops"; exit 1; }
mapfile -t cmd < <(make --no-print-directory -s cudasim-build-cmd)
# mutants build at -O1 (half the compile time of the suite's -O2 -g; they stop at their first FAIL)
cmd[0]=${cmd[0]/-O2 -g/${MUTANT_OPT--O1}}
tmp=$(mktemp -d /tmp/llmc_mutants.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
status=0

# Each mutant is prepared, built and run in the background (at most $JOBS at a time: the builds
# are most of the time); the run stops at its first FAIL (LLMC_TEST_FAIL_FAST, test/testing.h).
# Attention mutants run only test_cuda_ops's attention tests (--attention).
JOBS=${JOBS:-$(nproc)}
names=()
mutant() {  # name file sed-expression [test_cuda_ops arguments]
    local name=$1 file=$2 expr=$3 dir="$tmp/$1" args=${4:-}
    if [ -n "${MUTANT:-}" ] && [ "$MUTANT" != "$name" ]; then return; fi # MUTANT=name: only that one
    mkdir -p "$dir/llmc"
    cp -r llmc/cuda "$dir/llmc/cuda"
    for f in llmc/*; do [ "$f" = llmc/cuda ] || ln -s "$PWD/$f" "$dir/$f"; done
    ln -s "$PWD/test" "$dir/test"
    sed -i "$expr" "$dir/llmc/cuda/$file"
    if cmp -s "llmc/cuda/$file" "$dir/llmc/cuda/$file"; then
        echo "FAIL: mutant '$name': the edit did not apply to llmc/cuda/$file (kernel changed?)"
        status=1
        return
    fi
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    { { /usr/bin/python3 test/cudasim/cu2cpp.py test/test_cuda_ops.cu -o "$dir/t.cpp" -I "$dir" -I . &&
        ${cmd[0]} "$dir/t.cpp" -o "$dir/t" ${cmd[1]}; } > "$dir/build.log" 2>&1 || exit
      LLMC_TEST_FAIL_FAST=1 OMP_WAIT_POLICY=passive "$dir/t" $args > "$dir/run.log" 2>&1
      echo $? > "$dir/rc"; } &
    names+=("$name")
}
run_mutants() {
    wait
    local name dir rc fails
    for name in "${names[@]}"; do
        dir="$tmp/$name"
        if [ ! -x "$dir/t" ]; then
            echo "FAIL: mutant '$name' does not build: $(tail -3 "$dir/build.log")"
            status=1
            continue
        fi
        rc=$(cat "$dir/rc" 2>/dev/null)
        if [ -z "$rc" ]; then
            echo "FAIL: mutant '$name' built but did not run"
            status=1
            continue
        fi
        fails=$(grep -c '^FAIL' "$dir/run.log")
        if [ $rc -ne 0 ]; then
            echo "PASS: mutant '$name' is caught (exit $rc, $fails FAIL lines); first report:"
            grep -m1 -E '^FAIL|cudasim' "$dir/run.log" | cut -c1-240 | sed 's/^/      /'
        else
            echo "FAIL: mutant '$name' was not caught: test_cuda_ops passed with the bug"
            status=1
        fi
    done
}

mutant missing-barrier layernorm.cuh '/sb\[threadIdx.y\]\[threadIdx.x\] = accb;/{n;s/__syncthreads();//}'
mutant wrong-index residual.cuh 's/to_float(inp2\[i\])/to_float(inp2[i \/ 2])/'
mutant wrong-row layernorm.cuh '/void layernorm_forward_rowwarp_kernel/,/if (row >= N)/s/threadIdx.x \/ 32,/threadIdx.x \/ 32 + 1,/'
# the one-pass norm backwards (LayerNorm's and RMSNorm's share common.cuh's block_sum_lane_packs):
# warps adding their weight/bias partials before the shared sums are zeroed; a chunk's rows skipped
mutant norm-partials-zero-barrier common.cuh '/acc\[i\] = 0.0f;/{n;s/__syncthreads();//}'
mutant ln-fused-row-stride layernorm.cuh 's/row < r1; row += LN_WARPS_PER_BLOCK)/row < r1; row += LN_WARPS_PER_BLOCK + 1)/'
# the packed classifier forgetting the real columns of the last, partly padded pack
mutant classifier-pack-tail classifier.cuh 's/live = (V + P - 1) \/ P;/live = V \/ P;/'
# the packed encoder backward (dwte, one block per token) dropping each token's first position
mutant encoder-wte16-first-position encoder.cuh '/encoder_backward_wte_kernel16(T \*dwte/,/store16(row + c, floats_to_pack/s/int p = offsets\[j\]; p < offsets\[j + 1\]/int p = offsets[j] + 1; p < offsets[j + 1]/'
# tensor-core attention: a lane reading scores other lanes stored, without __syncwarp (the
# harness's wmma stores write each lane's share only, so this reads stale shared memory); O rows
# scaled by lanes and reloaded into fragments without __syncwarp (the lazy rescale); an
# off-by-one causal mask. (A missing __syncwarp right after a shuffle is not caught: in the
# harness a shuffle waits for every lane, which orders memory; the GPU does not promise that.)
mutant tc-missing-syncwarp-scores attention_tc.cuh '/store_matrix_sync(ss + j \* 16, sf, L::LDS/{n;n;s/__syncwarp();//}' --attention
mutant tc-missing-syncwarp-rescale attention_tc.cuh '/\*= corr;/{n;s/__syncwarp();//}' --attention
# the forward's lazy rescale skipped (O kept against the old row max): only inputs whose row
# maxima jump between key tiles reach that branch (test_attention's "growing scores")
mutant tc-no-rescale attention_tc.cuh 's/corr = expf(m - m_new); \/\* 0 while m = -inf \*\//corr = 1.0f;/' --attention
mutant tc-causal-off-by-one attention_tc.cuh 's/tq >= u \&\& tq < T_/tq > u \&\& tq < T_/' --attention
# the FlashAttention-2-class kernels (attention_fa2.cuh, through cudasim's PTX emulation): the
# forward reading its first tiles without cp.async.wait_group (cudasim lands the data only at
# the wait); the causal mask taking a lane's rows from the wrong accumulator elements (c0, c1:
# row g, c2, c3: row g + 8); the running output not rescaled when a row max grows; in the
# 5-product backward, warps reading the other warps' dS^T rows for the dQ product before the
# barrier, and a key block adding to the dQ accumulator out of key-block order (cudasim reports
# a turn counter that does not read the block's turn: a deadlock on the GPU)
mutant fa2-missing-cp-async-wait attention_fa2.cuh '/attention_forward_fa2_kernel(T \*out/,/ptx_cp_async_wait<0>/s/ptx_cp_async_wait<1>();//' --attention
mutant fa2-wrong-fragment-row attention_fa2.cuh 's/const int row = row0 + (i \/ 2) \* 8, key = k0 + 8 \* j + 2 \* tq + i % 2;/const int row = row0 + (i % 2) * 8, key = k0 + 8 * j + 2 * tq + i % 2;/' --attention
mutant fa2-no-rescale attention_fa2.cuh 's/corr\[r\] = exp2f(m\[r\] - m_new);/corr[r] = 1.0f;/' --attention
mutant fa2-bwd-missing-barrier-dst attention_fa2.cuh 's/__syncthreads(); \/\* all 64 keys.*$//' --attention
mutant fa2-bwd-dq-turn-order attention_fa2.cuh 's/fa2_wait_turn(turn, kb);/fa2_wait_turn(turn, kb > 0 ? kb - 1 : 0);/' --attention
# the Llama ops (test/cuda_llama_ops.h): RoPE's packed kernel rotating the first NH of the q and k
# heads only (the last NKV key heads left alone). (Each mutant is a ~30 s build: SwiGLU has none.)
mutant rope-gqa-heads rope.cuh 's/h = idx \/ packs % heads,/h = idx \/ packs % NH,/'
run_mutants
exit $status
