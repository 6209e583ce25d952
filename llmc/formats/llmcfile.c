/* llmcfile.c - an architecture's llmc checkpoint file (llmcfile.h). */
#include "llmc/formats/llmcfile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "llmc/core/check.h"
#include "llmc/formats/modelfile.h"

int llmc_file_is_mine(const LlmcFileKind *k, const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int32_t w[3];
    size_t got = fread(w, sizeof w[0], 3, f);
    fclose(f);
    return got == 3 && w[0] == LLMC_FILE_MAGIC && w[2] == k->arch;
}

int llmc_file_config_from(const LlmcFileKind *k, const char *init, ArchConfig *c) {
    if (!llmc_file_is_mine(k, init)) return 0;
    llmc_file_read_header(k, init, c);
    return 1;
}

/* what is wrong with header h (NULL: nothing); c filled from it */
static const char *file_header_problem(const LlmcFileKind *k, const int32_t *h, ArchConfig *c, char *why, size_t len) {
    if (h[0] != LLMC_FILE_MAGIC) return "bad magic (expected 20261130, an llmc checkpoint)";
    if (h[1] != LLMC_FILE_VERSION) return "unsupported version (expected 1)";
    if (h[2] != k->arch) {
        snprintf(why, len, "not the %s architecture (slot 2 must be %d)", k->model->display, (int)k->arch);
        return why;
    }
    memset(c, 0, sizeof *c);
    c->arch = k->model;
    llmc_header_get_shape(h, arch_config_base(c));
    const char *bad = k->get(h, c);
    if (bad) return bad;
    if (h[12] != 0 && h[12] != 1) return "dtype (slot 12) must be 0 (fp32) or 1 (bf16)";
    return k->model->config_validate(c);
}

int llmc_file_read_header(const LlmcFileKind *k, const char *path, ArchConfig *c) {
    const char *name = k->model->display;
    FILE *f = fopen(path, "rb");
    if (!f) llmc_die("cannot open %s checkpoint '%s'", name, path);
    int32_t h[256];
    size_t got = fread(h, sizeof h[0], 256, f);
    fclose(f);
    if (got != 256) llmc_die("'%s': shorter than the 1024-byte %s checkpoint header", path, name);
    char why[160];
    const char *bad = file_header_problem(k, h, c, why, sizeof why);
    if (bad) llmc_die("'%s': invalid %s checkpoint header: %s", path, name, bad);
    return h[12] == 1;
}

int llmc_file_load(const LlmcFileKind *k, const char *path, float *params, size_t n) {
    ArchConfig c;
    const int bf16 = llmc_file_read_header(k, path, &c);
    const int nspecs = k->model->num_param_specs;
    TensorSpec *specs = (TensorSpec *)mallocCheck(nspecs * sizeof(TensorSpec), "parameter table");
    if (k->model->parameter_specs(&c, specs) != n)
        llmc_die("%s checkpoint '%s' does not match the model being loaded", k->model->display, path);
    model_file_read_params(path, 1024, params, n, bf16, specs, nspecs);
    free(specs);
    return bf16;
}

uint32_t llmc_file_write(const LlmcFileKind *k, const char *path, const ArchConfig *c, const float *params, size_t n,
                         int bf16) {
    if (k->model->parameter_specs(c, NULL) != n)
        llmc_die("writing %s checkpoint '%s': %zu parameters do not fit the config", k->model->display, path, n);
    int32_t h[256];
    llmc_header_put(h, LLMC_FILE_MAGIC, LLMC_FILE_VERSION, k->arch, arch_config_cbase(c), 0, bf16);
    k->put(h, c);
    return model_file_write(path, h, sizeof h, params, n, bf16);
}
