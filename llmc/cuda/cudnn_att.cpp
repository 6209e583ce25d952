/*
 * cudnn_att.cpp - llmc/cuda/cudnn_att.h through the cuDNN frontend graph API (cudnn_frontend,
 * header-only, from the nvidia-cudnn-frontend wheel; mk/cudnn.mk finds it). Host code only:
 * compiled once, by itself, because the frontend headers are heavy.
 *
 * The graphs are cuDNN's SDPA ("scaled dot product attention") nodes:
 *   forward:  Q, K, V -> O, Stats   (generate_stats, causal, attn_scale 1/sqrt(HS))
 *   backward: Q, K, V, O, dO, Stats -> dQ, dK, dV   (same mask and scale, deterministic)
 * Every tensor is a 4-d (B, NH, T, HS) view with strides straight into our row-major buffers,
 * so nothing is transposed or copied:
 *   Q, K, V, dQ, dK, dV in inp/dinp (B, T, 3C): strides (T*3C, HS, 3C, 1), K at +C, V at +2C
 *   O, dO in out/dout (B, T, C):                 strides (T*C, HS, C, 1)
 *   Stats in lse (B, NH, T) fp32, as (B, NH, T, 1): strides (NH*T, T, 1, 1)
 * Causal mask: diagonal alignment TOP_LEFT with right bound 0 keeps key u for query t iff
 * u - t <= 0, i.e. u <= t, our mask (what the frontend's set_causal_mask expands to).
 *
 * What Stats holds, and why it is our lse with no conversion (cudnn_frontend 1.32 headers):
 *  - node/scaled_dot_product_flash_attention.h (composite SDPA): bmm1 = Q K^T, then the
 *    pointwise multiply by attn_scale, then the mask, then the softmax node, which gets the
 *    Stats output: the statistic is of the scaled, masked scores s[t,u].
 *  - node/softmax.h (composite softmax): Stats = max + LOG(sum(EXP(s - max))) over the row,
 *    i.e. the natural-log logsumexp.
 *  - graph_properties.h, SDPA_attributes::set_stats_use_log2: "Convert the Stats (LSE) output
 *    from cuDNN's natural-log convention to base-2"; we leave it at its default (false).
 * So Stats[b,h,t] = log(sum_{u<=t} exp(s[t,u])) = attention.cuh's lse[b,h,t], stored fp32 in
 * the same (B, NH, T) order. Either backward can consume either forward's lse.
 */
#include "llmc/cuda/cudnn_att.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <cudnn.h>
#include <cudnn_frontend.h>

#include "llmc/core/check.h"

namespace fe = cudnn_frontend;

/* ---- checks: every failure goes through llmc_check_failed (statement, where, HINT) ----------- */
#define CUDNN_ATT_HINT                                                                                    \
    "cuDNN SDPA needs an sm_80+ GPU, HS a multiple of 8 (<= 128, <= 256 on Hopper) and 16-byte aligned " \
    "tensors; CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE=stderr prints the frontend's reasons, "  \
    "CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr the library's; a build without USE_CUDNN=1 uses "   \
    "our own attention kernels"

/* `what` names the operation and the shapes ("cuDNN attention forward bf16 B=.. T=.. ..."). */
static void cudnn_att_failed(const char *stmt, const char *what, const char *detail, const char *func,
                             const char *file, int line) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s: %s", what, detail);
    llmc_check_failed(stmt, msg, CUDNN_ATT_HINT, func, file, line);
}

static const char *fe_code_name(fe::error_code_t c) {
    switch (c) {
    case fe::error_code_t::OK: return "OK";
    case fe::error_code_t::ATTRIBUTE_NOT_SET: return "ATTRIBUTE_NOT_SET";
    case fe::error_code_t::SHAPE_DEDUCTION_FAILED: return "SHAPE_DEDUCTION_FAILED";
    case fe::error_code_t::INVALID_TENSOR_NAME: return "INVALID_TENSOR_NAME";
    case fe::error_code_t::INVALID_VARIANT_PACK: return "INVALID_VARIANT_PACK";
    case fe::error_code_t::GRAPH_NOT_SUPPORTED: return "GRAPH_NOT_SUPPORTED";
    case fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED: return "GRAPH_EXECUTION_PLAN_CREATION_FAILED";
    case fe::error_code_t::GRAPH_EXECUTION_FAILED: return "GRAPH_EXECUTION_FAILED";
    case fe::error_code_t::HEURISTIC_QUERY_FAILED: return "HEURISTIC_QUERY_FAILED";
    case fe::error_code_t::UNSUPPORTED_GRAPH_FORMAT: return "UNSUPPORTED_GRAPH_FORMAT";
    case fe::error_code_t::CUDA_API_FAILED: return "CUDA_API_FAILED";
    case fe::error_code_t::CUDNN_BACKEND_API_FAILED: return "CUDNN_BACKEND_API_FAILED";
    case fe::error_code_t::INVALID_CUDA_DEVICE: return "INVALID_CUDA_DEVICE";
    case fe::error_code_t::HANDLE_ERROR: return "HANDLE_ERROR";
    case fe::error_code_t::INVALID_VALUE: return "INVALID_VALUE";
    default: return "unknown cudnn_frontend error";
    }
}

static void cudnn_att_fe_failed(const char *stmt, const char *what, fe::error_t err, const char *func,
                                const char *file, int line) {
    char detail[768];
    snprintf(detail, sizeof detail, "cudnn_frontend %s: %s", fe_code_name(err.get_code()), err.get_message().c_str());
    cudnn_att_failed(stmt, what, detail, func, file, line);
}

/* A cudnn_frontend call returning fe::error_t. */
#define feCheck(stmt, what)                                                                      \
    do {                                                                                         \
        fe::error_t llmc_fe_err_ = (stmt);                                                       \
        if (llmc_fe_err_.is_bad())                                                               \
            cudnn_att_fe_failed(#stmt, (what), llmc_fe_err_, __func__, __FILE__, __LINE__);      \
    } while (0)

/* A cuDNN library call returning cudnnStatus_t. */
#define cudnnCheck(stmt, what)                                                                                   \
    do {                                                                                                         \
        cudnnStatus_t llmc_cudnn_st_ = (stmt);                                                                   \
        if (llmc_cudnn_st_ != CUDNN_STATUS_SUCCESS)                                                              \
            cudnn_att_failed(#stmt, (what), cudnnGetErrorString(llmc_cudnn_st_), __func__, __FILE__, __LINE__); \
    } while (0)

/* A CUDA runtime call (common.cuh's cudaCheck is not usable here: that header is device code). */
#define cudaAttCheck(stmt, what)                                                                             \
    do {                                                                                                     \
        cudaError_t llmc_cuda_err_ = (stmt);                                                                 \
        if (llmc_cuda_err_ != cudaSuccess)                                                                   \
            cudnn_att_failed(#stmt, (what), cudaGetErrorString(llmc_cuda_err_), __func__, __FILE__, __LINE__); \
    } while (0)

/* ---- shapes ----------------------------------------------------------------------------------- */
typedef struct {
    int B, T, C, NH, NKV, HS, is_fp16, backward;
    char what[192]; /* "cuDNN attention forward bf16 B=8 T=1024 C=768 NH=12 NKV=12 (HS=64)" for messages */
} AttShape;

/* Validates the sizes (always on) and describes them for messages. */
static AttShape att_shape(const char *op, int backward, int B, int T, int C, int NH, int NKV, int is_fp16) {
    AttShape s;
    s.B = B, s.T = T, s.C = C, s.NH = NH, s.NKV = NKV, s.HS = NH > 0 ? C / NH : 0, s.is_fp16 = is_fp16 != 0;
    s.backward = backward;
    snprintf(s.what, sizeof s.what, "cuDNN attention %s %s B=%d T=%d C=%d NH=%d NKV=%d (HS=%d)", op,
             s.is_fp16 ? "fp16" : "bf16", B, T, C, NH, NKV, s.HS);
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || C % NH != 0 || NKV <= 0 || NH % NKV != 0)
        cudnn_att_failed("att_shape", s.what, "B, T, C, NH, NKV must be positive, C divisible by NH and NH by NKV",
                         __func__, __FILE__, __LINE__);
    if (s.HS % 8 != 0 || s.HS > 256)
        cudnn_att_failed("att_shape", s.what, "cuDNN SDPA needs the head size C/NH to be a multiple of 8, at most 256",
                         __func__, __FILE__, __LINE__);
    return s;
}

static void att_check_aligned(const AttShape *s, const char *name, const void *p) {
    if ((uintptr_t)p % 16 == 0) return;
    char detail[256];
    snprintf(detail, sizeof detail, "%s = %p is not 16-byte aligned (cuDNN SDPA loads 16 bytes at a time)", name, p);
    cudnn_att_failed("att_check_aligned", s->what, detail, __func__, __FILE__, __LINE__);
}

/* ---- state ------------------------------------------------------------------------------------ */
/* Tensor uids: the variant pack maps them to device pointers at execute time. */
enum : int64_t { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV };

typedef std::tuple<int, int, int, int, int, int, int> GraphKey; /* B, T, C, NH, NKV, is_fp16, backward */
typedef std::map<GraphKey, std::shared_ptr<fe::graph::Graph>> GraphCache;

/* The one piece of module state, behind the header's context-free C-style API: the handle, the
 * workspace every graph shares (they run one after another on the caller's stream) and the
 * built graphs. The cache is allocated on first use (no static destructor runs at exit, after
 * the CUDA context may be gone); cudnn_att_destroy frees everything. */
static struct {
    cudnnHandle_t handle;
    void *workspace;
    size_t workspace_bytes;
    GraphCache *graphs;
    void *(*alloc)(void *ctx, size_t bytes); /* cudnn_att_set_allocator's (NULL: cudaMalloc / cudaFree) */
    void (*release)(void *ctx, void *p);
    void *alloc_ctx;
} att;

void cudnn_att_set_allocator(void *(*alloc)(void *ctx, size_t bytes), void (*release)(void *ctx, void *p), void *ctx) {
    att.alloc = alloc, att.release = release, att.alloc_ctx = ctx;
}

/* The workspace's memory (att.alloc's, else the runtime's); the caller has synchronised. */
static void att_free_workspace(const char *what) {
    if (att.release) att.release(att.alloc_ctx, att.workspace);
    else cudaAttCheck(cudaFree(att.workspace), what);
}

static void att_init(const AttShape *s) {
    if (att.handle) return;
    /* libcudnn of another major version than the headers would mis-read the graph */
    if (cudnnGetVersion() / 10000 != CUDNN_MAJOR) {
        char detail[160];
        snprintf(detail, sizeof detail, "libcudnn is version %zu, the headers were %d.%d", cudnnGetVersion(),
                 CUDNN_MAJOR, CUDNN_MINOR);
        cudnn_att_failed("cudnnGetVersion()", s->what, detail, __func__, __FILE__, __LINE__);
    }
    cudnnCheck(cudnnCreate(&att.handle), s->what);
    att.graphs = new GraphCache;
}

/* Grows the shared workspace. Only while graphs are built (the first call per shape), so the
 * device-wide synchronisation before freeing the old buffer costs nothing in steady state. */
static void att_reserve_workspace(const AttShape *s, int64_t bytes) {
    if (bytes <= (int64_t)att.workspace_bytes) return;
    if (att.workspace) {
        cudaAttCheck(cudaDeviceSynchronize(), s->what); /* earlier graphs may still use it */
        att_free_workspace(s->what);
        att.workspace = NULL, att.workspace_bytes = 0;
    }
    if (att.alloc) att.workspace = att.alloc(att.alloc_ctx, (size_t)bytes);
    else cudaAttCheck(cudaMalloc(&att.workspace, (size_t)bytes), s->what);
    att.workspace_bytes = (size_t)bytes;
}

/* ---- graphs ----------------------------------------------------------------------------------- */
static std::shared_ptr<fe::graph::Graph> att_build_graph(const AttShape *s) {
    namespace gr = fe::graph;
    const fe::DataType_t io = s->is_fp16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
    auto g = std::make_shared<gr::Graph>();
    g->set_io_data_type(io).set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(fe::DataType_t::FLOAT);

    const int64_t B = s->B, T = s->T, C = s->C, NH = s->NH, NKV = s->NKV, HS = s->HS, W = (NH + 2 * NKV) * HS;
    const std::vector<int64_t> dim = {B, NH, T, HS}, kv_dim = {B, NKV, T, HS}; /* K, V: NKV heads (GQA) */
    const std::vector<int64_t> qkv_stride = {T * W, HS, W, 1};  /* in inp, dinp (B, T, W) */
    const std::vector<int64_t> out_stride = {T * C, HS, C, 1}; /* in out, dout (B, T, C) */
    const std::vector<int64_t> lse_dim = {B, NH, T, 1}, lse_stride = {NH * T, T, 1, 1};
    auto view = [&](const char *name, int64_t uid, const std::vector<int64_t> &d, const std::vector<int64_t> &stride) {
        return g->tensor(gr::Tensor_attributes().set_name(name).set_uid(uid).set_dim(d).set_stride(stride).set_data_type(io));
    };
    auto Q = view("Q", UID_Q, dim, qkv_stride), K = view("K", UID_K, kv_dim, qkv_stride);
    auto V = view("V", UID_V, kv_dim, qkv_stride);
    const float scale = 1.0f / sqrtf((float)HS); /* the same float as attention.cuh's */

    if (!s->backward) {
        auto opt = gr::SDPA_attributes()
                       .set_name("attention_forward")
                       .set_generate_stats(true)
                       .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                       .set_diagonal_band_right_bound(0)
                       .set_attn_scale(scale);
        auto [O, stats] = g->sdpa(Q, K, V, opt);
        O->set_output(true).set_uid(UID_O).set_dim(dim).set_stride(out_stride).set_data_type(io);
        stats->set_output(true).set_uid(UID_STATS).set_dim(lse_dim).set_stride(lse_stride).set_data_type(fe::DataType_t::FLOAT);
    } else {
        auto O = view("O", UID_O, dim, out_stride), dO = view("dO", UID_DO, dim, out_stride);
        auto stats = g->tensor(gr::Tensor_attributes()
                                   .set_name("stats")
                                   .set_uid(UID_STATS)
                                   .set_dim(lse_dim)
                                   .set_stride(lse_stride)
                                   .set_data_type(fe::DataType_t::FLOAT));
        /* deterministic: no atomics in dQ, so runs are bit-reproducible like our kernels */
        auto opt = gr::SDPA_backward_attributes()
                       .set_name("attention_backward")
                       .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                       .set_diagonal_band_right_bound(0)
                       .set_attn_scale(scale)
                       .set_deterministic_algorithm(true);
        auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, stats, opt);
        dQ->set_output(true).set_uid(UID_DQ).set_dim(dim).set_stride(qkv_stride).set_data_type(io);
        dK->set_output(true).set_uid(UID_DK).set_dim(kv_dim).set_stride(qkv_stride).set_data_type(io);
        dV->set_output(true).set_uid(UID_DV).set_dim(kv_dim).set_stride(qkv_stride).set_data_type(io);
    }

    feCheck(g->validate(), s->what);
    feCheck(g->build_operation_graph(att.handle), s->what);
    feCheck(g->create_execution_plans({fe::HeurMode_t::A}), s->what);
    feCheck(g->check_support(att.handle), s->what);
    feCheck(g->build_plans(att.handle), s->what);
    int64_t ws = 0;
    feCheck(g->get_workspace_size(ws), s->what);
    att_reserve_workspace(s, ws);
    return g;
}

/* The cached graph for this shape, built on first use. */
static fe::graph::Graph *att_graph(const AttShape *s) {
    att_init(s);
    GraphKey key(s->B, s->T, s->C, s->NH, s->NKV, s->is_fp16, s->backward);
    auto it = att.graphs->find(key);
    if (it == att.graphs->end()) it = att.graphs->emplace(key, att_build_graph(s)).first;
    return it->second.get();
}

static void att_execute(const AttShape *s, fe::graph::Graph *g, std::unordered_map<int64_t, void *> &pack,
                        cudaStream_t stream) {
    cudnnCheck(cudnnSetStream(att.handle, stream), s->what);
    feCheck(g->execute(att.handle, pack, att.workspace), s->what);
}

/* ---- the ops ---------------------------------------------------------------------------------- */
void attention_forward_cudnn(void *out, float *lse, const void *inp, int B, int T, int C, int NH, int NKV, int is_fp16,
                             cudaStream_t stream) {
    AttShape s = att_shape("forward", 0, B, T, C, NH, NKV, is_fp16);
    att_check_aligned(&s, "out", out);
    att_check_aligned(&s, "lse", lse);
    att_check_aligned(&s, "inp", inp);
    fe::graph::Graph *g = att_graph(&s);
    char *qkv = (char *)inp;
    const size_t q_bytes = (size_t)C * 2, kv_bytes = (size_t)s.HS * NKV * 2; /* of a position's q, k (or v) */
    std::unordered_map<int64_t, void *> pack = {
        {UID_Q, qkv}, {UID_K, qkv + q_bytes}, {UID_V, qkv + q_bytes + kv_bytes}, {UID_O, out}, {UID_STATS, lse}};
    att_execute(&s, g, pack, stream);
}

void attention_backward_cudnn(void *dinp, const void *dout, const void *inp, const void *out, const float *lse, int B,
                              int T, int C, int NH, int NKV, int is_fp16, cudaStream_t stream) {
    AttShape s = att_shape("backward", 1, B, T, C, NH, NKV, is_fp16);
    att_check_aligned(&s, "dinp", dinp);
    att_check_aligned(&s, "dout", dout);
    att_check_aligned(&s, "inp", inp);
    att_check_aligned(&s, "out", out);
    att_check_aligned(&s, "lse", lse);
    fe::graph::Graph *g = att_graph(&s);
    char *qkv = (char *)inp, *dqkv = (char *)dinp;
    const size_t q_bytes = (size_t)C * 2, kv_bytes = (size_t)s.HS * NKV * 2;
    std::unordered_map<int64_t, void *> pack = {
        {UID_Q, qkv},   {UID_K, qkv + q_bytes},   {UID_V, qkv + q_bytes + kv_bytes},   {UID_O, (void *)out},
        {UID_DO, (void *)dout}, {UID_STATS, (void *)lse},
        {UID_DQ, dqkv}, {UID_DK, dqkv + q_bytes}, {UID_DV, dqkv + q_bytes + kv_bytes}};
    att_execute(&s, g, pack, stream);
}

void cudnn_att_prepare(int B, int T, int C, int NH, int NKV, int is_fp16) {
    AttShape fwd = att_shape("forward", 0, B, T, C, NH, NKV, is_fp16);
    AttShape bwd = att_shape("backward", 1, B, T, C, NH, NKV, is_fp16);
    att_graph(&fwd);
    att_graph(&bwd);
}

size_t cudnn_att_workspace_bytes(void) { return att.workspace_bytes; }

void cudnn_att_destroy(void) {
    const char *what = "cuDNN attention teardown";
    delete att.graphs; /* the graphs' plans before the handle they were built with */
    att.graphs = NULL;
    if (att.workspace) {
        cudaAttCheck(cudaDeviceSynchronize(), what);
        att_free_workspace(what);
    }
    att.workspace = NULL, att.workspace_bytes = 0;
    if (att.handle) cudnnCheck(cudnnDestroy(att.handle), what);
    att.handle = NULL;
}
