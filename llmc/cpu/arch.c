/*
 * arch.c (CPU) - the CPU backend's registry of per-architecture entries (arch.h) and its lookup.
 */
#include "llmc/cpu/arch.h"

const CpuArch *const cpu_archs[] = {
    &gpt2_cpu_arch,
    &llama3_cpu_arch,
    &mlp_cpu_arch,
    &mixtral_cpu_arch,
    NULL,
};

const CpuArch *cpu_arch_for(const ModelArch *arch) {
    for (int i = 0; cpu_archs[i]; i++)
        if (cpu_archs[i]->arch == arch) return cpu_archs[i];
    return NULL;
}
