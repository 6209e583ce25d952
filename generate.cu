/*
 * generate.cu - ./generate_gpu: ./generate on a CUDA GPU. The same front end (llmc/generate/generate.c:
 * flags, prompt, sampling, output) with the CUDA model of llmc/cuda/cudamodel.cuh and its KV-cache
 * forward (llmc/cuda/decode.cuh), in --precision fp32 | bf16 (default, as ./train_gpt) | fp16.
 *
 *   ./generate_gpu -e out/run1/model_00005000.bin --prompt "The king" -g 100 --temperature 0.8
 */
#include <stdio.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/cuda/decode.cuh"
#include "llmc/generate/generate.h"
#include "llmc/formats/arch.h"

typedef struct {
    CudaContext ctx;
    CudaModel model;
    CudaDecoder decoder;
} CudaGenerator;

static void cuda_load(void *self, const GenConfig *g, ModelConfig *cfg, size_t *num_parameters, char *desc, size_t len) {
    if (g->adapter) llmc_die("--adapter %s: LoRA adapters are not built yet on CUDA; use ./generate", g->adapter);
    if (g->quantize_base) llmc_die("--quantize-base is not built for ./generate_gpu yet; use ./generate");
    CudaGenerator *cg = (CudaGenerator *)self;
    int precision = precision_parse(g->precision ? g->precision : "bf16");
    if (precision < 0) llmc_die("--precision %s: use fp32, bf16 or fp16", g->precision);
    ArchConfig ac; /* the CUDA decoder (decode.cuh) runs only the entries that say so: GPT-2's */
    const ModelArch *arch = model_arch_for_init(g->init, &ac);
    const CudaArch *ca = cuda_arch_for(arch);
    if (!ca || !ca->decoder)
        llmc_die("-e %s is a %s model: ./generate_gpu runs GPT-2 only for now; use ./generate (CPU)", g->init, arch->display);
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count < 1)
        llmc_die("no usable CUDA GPU (%s): ./generate_gpu needs an NVIDIA GPU and driver; use ./generate on a CPU",
                 e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    cuda_context_init(&cg->ctx, 0, 0); /* fp32 means fp32: no TF32 */
    cudamodel_build(&cg->model, g->init, g->seed, (Precision)precision, &cg->ctx, 0);
    /* generation keeps no optimizer state: drop the host moments cudamodel_build made */
    free(cg->model.host_m);
    free(cg->model.host_v);
    cg->model.host_m = cg->model.host_v = NULL;
    cuda_decoder_init(&cg->decoder, &cg->model, GENERATE_CHUNK);
    *cfg = cg->model.cfg;
    *num_parameters = cg->model.num_parameters;
    snprintf(desc, len, "CUDA %s on %s (sm_%d%d)", precision_name(cg->model.precision), cg->ctx.props.name,
             cg->ctx.props.major, cg->ctx.props.minor);
}

static const float *cuda_forward(void *self, const int *tokens, int n) {
    return cuda_decoder_forward(&((CudaGenerator *)self)->decoder, tokens, n);
}

static void cuda_free(void *self) {
    CudaGenerator *cg = (CudaGenerator *)self;
    cuda_decoder_free(&cg->decoder);
    cudamodel_free(&cg->model);
    cuda_context_free(&cg->ctx);
}

int main(int argc, char **argv) {
    static CudaGenerator cg;
    GenerateBackend be = {"./generate_gpu", "fp32, bf16 or fp16 (default: bf16)", &cg, cuda_load, cuda_forward, cuda_free};
    return generate_main(argc, argv, &be);
}
