/* tp.c - a tensor-parallel rank's arena against the whole model's (tp.h). */
#include "llmc/train/tp.h"
#include "llmc/core/check.h"
#include "llmc/dist/dist.h"
#include "llmc/dist/layout.h"

#include <stdlib.h>
#include <string.h>

int train_tp_size(void) { return dist_tp_group()->size; }

/* The whole model's table from a rank's: the split rows tp times as large, offsets back to back. */
static TensorSpec *whole_specs(const TensorSpec *local, int n, int tp) {
    TensorSpec *w = (TensorSpec *)mallocCheck((size_t)n * sizeof *w, "parameter table");
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        w[i] = local[i];
        if (local[i].split.kind != TENSOR_SPLIT_NONE) w[i].numel *= (size_t)tp, w[i].layer_numel *= (size_t)tp;
        w[i].offset = offset;
        offset += w[i].numel;
    }
    return w;
}

size_t train_tp_whole_numel(const TensorSpec *local, int n, int tp) {
    TensorSpec *w = whole_specs(local, n, tp);
    size_t total = n ? w[n - 1].offset + w[n - 1].numel : 0;
    free(w);
    return total;
}

void train_tp_gather(const TensorSpec *local, int n, size_t nlocal, const float *mine, float *whole) {
    Dist *g = dist_tp_group();
    const int tp = g->size;
    float *all = (float *)mallocCheck((g->rank == 0 ? (size_t)tp * nlocal : 1) * sizeof(float), "tensor-parallel gather");
    dist_gather_f32(g, mine, all, (size_t)tp * nlocal); /* (rank r's shard of tp x nlocal floats: its nlocal) */
    if (g->rank == 0 && whole) {
        TensorSpec *w = whole_specs(local, n, tp);
        for (int r = 0; r < tp; r++) tensor_split_copy(w, local, n, tp, r, whole, all + (size_t)r * nlocal, 0);
        free(w);
    }
    free(all);
}

void train_tp_take(const TensorSpec *local, int n, const float *whole, float *mine) {
    Dist *g = dist_tp_group();
    TensorSpec *w = whole_specs(local, n, g->size);
    tensor_split_copy(w, local, n, g->size, g->rank, (float *)whole, mine, 1);
    free(w);
}

const float *train_tp_logits_row(const float *mine, int Vp) {
    static float *row;
    static int have;
    Dist *g = dist_tp_group();
    const int part = Vp / g->size;
    if (have < Vp) {
        free(row);
        row = (float *)mallocCheck((size_t)Vp * sizeof(float), "the sampled position's logits");
        have = Vp;
    }
    memcpy(row + (size_t)g->rank * part, mine, (size_t)part * sizeof(float));
    dist_allgather_f32(g, row, (size_t)Vp); /* (Vp divides by tp: rank r's shard is its part) */
    return row;
}
