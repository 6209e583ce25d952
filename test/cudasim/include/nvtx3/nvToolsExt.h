/* nvToolsExt.h - cudasim's stand-in for the CUDA toolkit's NVTX v3 header: the range calls
 * llmc uses (llmc/cuda/nvtx.cuh), as no-ops (no profiler runs under cudasim). */
#ifndef CUDASIM_NVTOOLSEXT_H
#define CUDASIM_NVTOOLSEXT_H
static inline int nvtxRangePushA(const char *message) { (void)message; return 0; }
static inline int nvtxRangePop(void) { return 0; }
#endif
