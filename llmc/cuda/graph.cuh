/*
 * graph.cuh - one training micro-step's forward+backward as a CUDA graph (--cuda-graph 1): the
 * work is captured from the stream once and then replayed with one cudaGraphLaunch per micro-step,
 * so the host launches one graph instead of hundreds of kernels and cuBLASLt calls.
 *
 * What a replay can and cannot change: a captured kernel keeps the arguments it was launched with
 * (pointers, sizes, scalars) and reads whatever its device buffers hold at replay time. So the
 * captured region reads its inputs from fixed device buffers (model.cuh: d_inputs, d_targets,
 * filled by cudamodel_stage from pinned memory before the launch), and the graph is keyed by what
 * it bakes in and may change: B, T and the loss weight dloss (1/accumulation x the fp16 loss scale,
 * which doubles or halves now and then: the graph is then captured anew). Nothing in the region may
 * make the host wait (a stream synchronisation, a pageable copy): the capture fails with
 * cudaErrorStreamCaptureUnsupported, which cudaCheck reports. The caller runs the first micro-step
 * uncaptured, so that one-time work (cuBLASLt algorithm timing, which synchronises) is done before
 * a capture. Capture mode: thread-local (other host threads may use CUDA meanwhile).
 */
#ifndef LLMC_CUDA_GRAPH_CUH
#define LLMC_CUDA_GRAPH_CUH

#include "llmc/cuda/common.cuh"

typedef struct {
    cudaGraphExec_t exec; /* NULL until captured */
    int B, T;
    float dloss;
    long long captures, launches;
} CudaStepGraph;

inline void cuda_step_graph_free(CudaStepGraph *g) {
    if (g->exec) cudaCheck(cudaGraphExecDestroy(g->exec));
    g->exec = NULL;
}

/* Replays the graph of record(), capturing it first when there is none for (B, T, dloss). */
template <class F> void cuda_step_graph_run(CudaStepGraph *g, cudaStream_t stream, int B, int T, float dloss, F &&record) {
    if (g->exec && (g->B != B || g->T != T || g->dloss != dloss)) cuda_step_graph_free(g);
    if (!g->exec) {
        cudaGraph_t graph = NULL;
        cudaCheck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        record();
        cudaCheck(cudaStreamEndCapture(stream, &graph));
        cudaCheck(cudaGraphInstantiate(&g->exec, graph, 0));
        cudaCheck(cudaGraphDestroy(graph));
        g->B = B, g->T = T, g->dloss = dloss;
        g->captures++;
    }
    cudaCheck(cudaGraphLaunch(g->exec, stream));
    g->launches++;
}

#endif
