/*
 * archs.cuh - the CUDA runtime's registry of per-architecture entries (arch.cuh): one include of
 * each block sequence (which defines its entry) and one line in cuda_archs[]; and the lookup.
 * Adding an architecture on CUDA is its block-sequence file and these two lines.
 */
#ifndef LLMC_CUDA_ARCHS_CUH
#define LLMC_CUDA_ARCHS_CUH

#include "llmc/cuda/arch.cuh"
#include "llmc/cuda/gpt2.cuh"
#include "llmc/cuda/llama.cuh"
#include "llmc/cuda/mlp.cuh"

/* The registry, ending with NULL. */
inline const CudaArch *const cuda_archs[] = {
    &gpt2_cuda_arch,
    &llama3_cuda_arch,
    &mlp_cuda_arch,
    NULL,
};

/* The CUDA entry of arch, or NULL when the runtime has no block sequence for it. */
inline const CudaArch *cuda_arch_for(const ModelArch *arch) {
    for (int i = 0; cuda_archs[i]; i++)
        if (cuda_archs[i]->arch == arch) return cuda_archs[i];
    return NULL;
}

#endif
