// graph.cu - cudasim self-test: stream capture and CUDA graphs (cudaStreamBeginCapture,
// cudaStreamEndCapture, cudaGraphInstantiate, cudaGraphLaunch, cudaStreamIsCapturing, destroy),
// the errors a synchronising call raises inside a capture, and the host-synchronisation counter.
// Expected values are worked by hand from the kernels below.
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>
#include "test/testing.h"
#include "llmc/cuda/graph.cuh"

__global__ void axpb_kernel(float* x, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = a * x[i] + b;
}

__global__ void fill_kernel(float* out, float value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value + i;
}

// records a launch through a local function pointer; the graph runs it after this returns
static void record_fill(float* d, int n, cudaStream_t s) {
    void (*fn)(float*, float, int) = fill_kernel;
    fn<<<1, 64, 0, s>>>(d, 5.0f, n);
}

static int capturing(cudaStream_t s, cudaStreamCaptureStatus want) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(s, &st) == cudaSuccess && st == want;
}

// A capture with one unsafe call in it: the call fails with `want`, the stream reports the
// capture invalidated and cudaStreamEndCapture fails without a graph.
template <class F>
static void check_refused(const char* name, cudaStream_t s, float* d, cudaError_t want, F&& unsafe) {
    cudaGetLastError();
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    axpb_kernel<<<1, 32, 0, s>>>(d, 1.0f, 1.0f, 32);
    cudaError_t got = unsafe();
    if (got == cudaSuccess) got = cudaGetLastError(); // a launch reports through the error state
    int invalidated = capturing(s, cudaStreamCaptureStatusInvalidated);
    cudaGraph_t g = (cudaGraph_t)&g;
    cudaError_t end = cudaStreamEndCapture(s, &g);
    test_report(got == want && invalidated && end == cudaErrorStreamCaptureInvalidated && g == NULL, name,
                "call %s (want %s), invalidated %d, end %s, graph %p", cudaGetErrorName(got), cudaGetErrorName(want),
                invalidated, cudaGetErrorName(end), (void*)g);
    cudaGetLastError();
}

int main(void) {
    const int n = 64;
    float *d_x, *d_y, *h_in, *h_out;
    cudaMalloc(&d_x, n * sizeof(float));
    cudaMalloc(&d_y, n * sizeof(float));
    cudaMallocHost(&h_in, n * sizeof(float));
    cudaMallocHost(&h_out, n * sizeof(float));
    cudaStream_t s, other;
    cudaStreamCreate(&s);
    cudaStreamCreate(&other);
    for (int i = 0; i < n; i++) h_in[i] = (float)i, h_out[i] = -7.0f;
    cudaMemset(d_x, 0, n * sizeof(float));

    // record: x <- h_in; x <- 2x + b (b = 3 at record time); h_out <- x; y <- 5 + i (function pointer)
    test_report(capturing(s, cudaStreamCaptureStatusNone), "capture: status none before", "");
    test_report(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "capture: begin", "");
    test_report(capturing(s, cudaStreamCaptureStatusActive) && capturing(other, cudaStreamCaptureStatusNone),
                "capture: status active on the stream, none on another", "");
    float b = 3.0f;
    cudaMemcpyAsync(d_x, h_in, n * sizeof(float), cudaMemcpyHostToDevice, s);
    axpb_kernel<<<2, 32, 0, s>>>(d_x, 2.0f, b, n);
    b = 100.0f; // the recorded launch keeps 3
    cudaMemsetAsync(d_y, 0, n * sizeof(float), s);
    record_fill(d_y, n, s);
    cudaMemcpyAsync(h_out, d_x, n * sizeof(float), cudaMemcpyDeviceToHost, s);
    // work on another stream is not part of the graph: it runs now
    fill_kernel<<<1, 64, 0, other>>>(d_y, 1.0f, n);
    float h[64]; // (no wait for `other` here: cudasim refuses every host wait during a capture)
    cudaGraph_t graph = NULL;
    test_report(cudaStreamEndCapture(s, &graph) == cudaSuccess && graph != NULL, "capture: end gives a graph", "");
    test_report(capturing(s, cudaStreamCaptureStatusNone), "capture: status none after", "");
    cudaMemcpy(h, d_x, sizeof h, cudaMemcpyDeviceToHost);
    int untouched = h_out[0] == -7.0f && h_out[63] == -7.0f && h[5] == 0.0f;
    cudaMemcpy(h, d_y, sizeof h, cudaMemcpyDeviceToHost);
    test_report(untouched && h[10] == 11.0f, "capture: recorded work does not run; another stream's does",
                "h_out[0] %g, y[10] %g", h_out[0], h[10]);

    cudaGraphExec_t exec = NULL;
    test_report(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess && exec != NULL, "graph: instantiate", "");
    test_report(cudaGraphDestroy(graph) == cudaSuccess, "graph: destroy after instantiate", "");
#ifdef CUDASIM
    unsigned long long launches0 = cudasim::stats().graph_launches;
#endif
    test_report(cudaGraphLaunch(exec, s) == cudaSuccess, "graph: launch", "");
    cudaStreamSynchronize(s);
    float want[64];
    for (int i = 0; i < n; i++) want[i] = 2.0f * i + 3.0f; // x = 2 * i + 3
    test_close("graph: replay in order, kernel arguments as recorded", h_out, want, n, 0.0, 0.0);
    cudaMemcpy(h, d_y, sizeof h, cudaMemcpyDeviceToHost);
    for (int i = 0; i < n; i++) want[i] = 5.0f + i;
    test_close("graph: a launch through a local function pointer replays after its scope ended", h, want, n, 0.0, 0.0);
    // the copies read the pinned input at launch time
    for (int i = 0; i < n; i++) h_in[i] = 10.0f;
    cudaGraphLaunch(exec, s);
    cudaStreamSynchronize(s);
    for (int i = 0; i < n; i++) want[i] = 23.0f; // 2 * 10 + 3
    test_close("graph: a second launch reads the pinned input anew", h_out, want, n, 0.0, 0.0);
#ifdef CUDASIM
    test_report(cudasim::stats().graph_launches == launches0 + 2, "graph: launches counted", "%llu",
                cudasim::stats().graph_launches - launches0);
#endif
    test_report(cudaGraphExecDestroy(exec) == cudaSuccess, "graph: exec destroy", "");

    // graph.cuh's step graph: captured once per (B, T, dloss), replayed otherwise
    {
        CudaStepGraph sg;
        memset(&sg, 0, sizeof sg);
        for (int i = 0; i < n; i++) h_in[i] = 1.0f;
        const float dlosses[3] = {0.5f, 0.5f, 0.25f};
        float got[3];
        for (int k = 0; k < 3; k++) {
            const float dloss = dlosses[k];
            cuda_step_graph_run(&sg, s, 2, 32, dloss, [&]() {
                cudaMemcpyAsync(d_x, h_in, n * sizeof(float), cudaMemcpyHostToDevice, s);
                axpb_kernel<<<2, 32, 0, s>>>(d_x, 4.0f, dloss, n); // x = 4 * 1 + dloss
                cudaMemcpyAsync(h_out, d_x, n * sizeof(float), cudaMemcpyDeviceToHost, s);
            });
            cudaStreamSynchronize(s);
            got[k] = h_out[n - 1];
        }
        test_report(sg.captures == 2 && sg.launches == 3 && got[0] == 4.5f && got[1] == 4.5f && got[2] == 4.25f,
                    "graph.cuh: one capture per loss weight, replayed for the same one", "captures %lld launches %lld, x %g %g %g",
                    sg.captures, sg.launches, got[0], got[1], got[2]);
        cuda_step_graph_free(&sg);
        test_report(sg.exec == NULL, "graph.cuh: freed", "");
    }

    // synchronising and unsafe calls inside a capture
    float pageable[64];
    check_refused("capture: cudaStreamSynchronize is refused", s, d_x, cudaErrorStreamCaptureUnsupported,
                  [&] { return cudaStreamSynchronize(s); });
    check_refused("capture: cudaDeviceSynchronize is refused", s, d_x, cudaErrorStreamCaptureUnsupported,
                  [&] { return cudaDeviceSynchronize(); });
    check_refused("capture: cudaMemcpy (synchronous) is refused", s, d_x, cudaErrorStreamCaptureUnsupported,
                  [&] { return cudaMemcpy(h, d_x, sizeof h, cudaMemcpyDeviceToHost); });
    check_refused("capture: cudaMemcpyAsync with pageable host memory is refused", s, d_x,
                  cudaErrorStreamCaptureUnsupported,
                  [&] { return cudaMemcpyAsync(pageable, d_x, sizeof pageable, cudaMemcpyDeviceToHost, s); });
    check_refused("capture: a launch on the legacy default stream is refused", s, d_x, cudaErrorStreamCaptureImplicit,
                  [&] {
                      fill_kernel<<<1, 32>>>(d_y, 0.0f, 32);
                      return cudaSuccess;
                  });
    check_refused("capture: cudaMalloc is refused in global mode", s, d_x, cudaErrorStreamCaptureUnsupported, [&] {
        float* p = NULL;
        return cudaMalloc(&p, 256);
    });

#ifdef CUDASIM
    // the host-synchronisation counter: calls that make the host wait
    struct {
        const char* name;
        int want;
    } cases[6] = {{"cudaStreamSynchronize", 1}, {"cudaMemcpyAsync D2H into pinned memory", 0},
                  {"cudaMemcpyAsync D2H into pageable memory", 1}, {"cudaMemcpyAsync H2D from pinned memory", 0},
                  {"cudaMemcpy D2H", 1}, {"cudaMemcpy D2D", 0}};
    for (int c = 0; c < 6; c++) {
        unsigned long long before = cudasim::stats().host_syncs;
        switch (c) {
        case 0: cudaStreamSynchronize(s); break;
        case 1: cudaMemcpyAsync(h_out, d_x, n * sizeof(float), cudaMemcpyDeviceToHost, s); break;
        case 2: cudaMemcpyAsync(pageable, d_x, n * sizeof(float), cudaMemcpyDeviceToHost, s); break;
        case 3: cudaMemcpyAsync(d_x, h_in, n * sizeof(float), cudaMemcpyHostToDevice, s); break;
        case 4: cudaMemcpy(pageable, d_x, n * sizeof(float), cudaMemcpyDeviceToHost); break;
        case 5: cudaMemcpy(d_y, d_x, n * sizeof(float), cudaMemcpyDeviceToDevice); break;
        }
        int got = (int)(cudasim::stats().host_syncs - before);
        char name[128];
        snprintf(name, sizeof name, "sync counter: %s counts %d", cases[c].name, cases[c].want);
        test_report(got == cases[c].want, name, "counted %d", got);
    }
#endif
    cudaFree(d_x);
    cudaFree(d_y);
    cudaFreeHost(h_in);
    cudaFreeHost(h_out);
    cudaStreamDestroy(s);
    cudaStreamDestroy(other);
    return test_exit_code();
}
