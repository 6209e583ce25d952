/*
 * nvtx.cuh - NVTX ranges for Nsight Systems: one-line scoped ranges around the phases and the
 * layers of the CUDA step, so a timeline reads "forward > forward layer 3 > ...".
 *   NVTX_RANGE("backward");                 the enclosing scope is the range
 *   NVTX_RANGE_LAYER("backward layer", l);  named "backward layer <l>"
 * nvtx3 is header-only (in the CUDA toolkit); without a profiler attached a push/pop is a call
 * that returns at once. cudasim builds get test/cudasim/include/nvtx3's no-op stub.
 */
#ifndef LLMC_CUDA_NVTX_CUH
#define LLMC_CUDA_NVTX_CUH

#include <stdio.h>

#include <nvtx3/nvToolsExt.h>

struct NvtxRange {
    explicit NvtxRange(const char *name) { nvtxRangePushA(name); }
    NvtxRange(const char *name, int layer) {
        char label[64];
        snprintf(label, sizeof label, "%s %d", name, layer);
        nvtxRangePushA(label);
    }
    ~NvtxRange() { nvtxRangePop(); }
    NvtxRange(const NvtxRange &) = delete;
    NvtxRange &operator=(const NvtxRange &) = delete;
};

#define NVTX_CONCAT2(a, b) a##b
#define NVTX_CONCAT(a, b) NVTX_CONCAT2(a, b)
#define NVTX_RANGE(name) NvtxRange NVTX_CONCAT(nvtx_range_, __LINE__)(name)
#define NVTX_RANGE_LAYER(name, layer) NvtxRange NVTX_CONCAT(nvtx_range_, __LINE__)(name, layer)

#endif
