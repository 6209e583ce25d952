/*
 * test_core.c - the shared core's small pieces: GPT-2 descriptors and the parameter table,
 * learning-rate schedules, round-trip float formatting for the log, bf16 rounding, the sampler,
 * and the -lg telemetry text and log fields (throttle-reason words, the line, the keys), and the
 * compact optimizer-state codes (llmc/core/optstate.h) against double-precision math.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "llmc/formats/arch.h"
#include "llmc/formats/modelfile.h"
#include "llmc/models/llama.h"
#include "llmc/dist/dist.h"
#include "llmc/core/logger.h"
#include "llmc/cpu/adamw.h"
#include "llmc/models/gpt2.h"
#include "llmc/core/optstate.h"
#include "llmc/core/rng.h"
#include "llmc/generate/sampler.h"
#include "llmc/train/schedule.h"
#include "llmc/cuda/telemetry.h"
#include "test/testing.h"

static void test_descriptors(void) {
    ModelConfig cfg = {0};
    /* GPT-2 124M including the padded vocabulary rows: the figure llm.c documents */
    int parsed = model_config_from_descriptor(&cfg, "d12") == 0;
    size_t n12 = parsed ? gpt2_parameter_specs(&cfg, NULL) : 0;
    test_report(n12 == 124475904, "d12 has GPT-2 124M's 124,475,904 parameters", "got %zu", n12);
    parsed = model_config_from_descriptor(&cfg, "gpt2:d24") == 0;
    test_report(parsed && cfg.channels == 1024 && cfg.num_heads == 16 && cfg.num_layers == 24,
                "gpt2:d24 is the 350M shape (C 1024, NH 16)", "C %d NH %d", cfg.channels, cfg.num_heads);
    const char *bad[] = {"d0", "d", "12", "dx", "d12x", "gpt2:", "e12"};
    int ok = 1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) ok &= model_config_from_descriptor(&cfg, bad[i]) != 0;
    test_report(ok, "malformed descriptors are rejected", "one of d0, d, 12, dx, d12x, gpt2:, e12 was accepted");
    model_config_from_descriptor(&cfg, "d2");
    TensorSpec specs[NUM_PARAMETER_TENSORS];
    size_t total = gpt2_parameter_specs(&cfg, specs);
    int order = strcmp(specs[0].name, "wte") == 0 && strcmp(specs[4].name, "qkvw") == 0 &&
                strcmp(specs[15].name, "lnfb") == 0 && specs[15].offset + specs[15].numel == total;
    int decay = specs[0].decay && specs[1].decay && !specs[2].decay && specs[4].decay && !specs[5].decay;
    test_report(order && decay, "parameter table: llm.c order, contiguous offsets, decay only on weights",
                "order %d decay %d", order, decay);
    TensorSpec a0[NUM_ACTIVATION_TENSORS], a2[NUM_ACTIVATION_TENSORS];
    size_t n0 = gpt2_activation_specs(&cfg, 4, 32, 0, a0), n2 = gpt2_activation_specs(&cfg, 4, 32, 2, a2);
    /* recompute 2 keeps one layer of ln1, ln2 and fch_gelu instead of L */
    size_t saved = (size_t)(cfg.num_layers - 1) * 4 * 32 * (2 * cfg.channels + cfg.ffn_hidden);
    test_report(n0 - n2 == saved, "recompute 2 saves (L-1) layers of ln1, ln2, fch_gelu", "%zu vs %zu", n0 - n2, saved);
}

/* The architecture table: -e resolves to the entry whose tables the name describes, and the entry's
 * functions agree with the architecture's own. */
static void test_arch_table(void) {
    ArchConfig ac;
    const ModelArch *g = model_arch_for_init("gpt2:d2", &ac);
    ModelConfig d2;
    model_config_from_descriptor(&d2, "d2");
    int gpt2_ok = g == &gpt2_arch && ac.arch == g && memcmp(arch_config_base(&ac), &d2, sizeof d2) == 0 &&
                  g->parameter_specs(&ac, NULL) == gpt2_parameter_specs(&d2, NULL) &&
                  g->flops_per_token(&ac, 64) == gpt2_flops_per_token(&d2, 64) && g->recompute_levels;
    test_report(gpt2_ok, "model_arch_for_init: gpt2:d2 is GPT-2's entry with d2's config, tables and flops", "");
    const ModelArch *l = model_arch_for_init("llama3:d2", &ac);
    LlamaConfig lc;
    llama_config_from_name(&lc, "llama3:d2");
    const LlamaConfig *got = arch_config_as(&ac, const LlamaConfig);
    int llama_ok = l == &llama3_arch && got->base.num_kv_heads == lc.base.num_kv_heads &&
                   got->rope_theta == lc.rope_theta && l->num_param_specs == LLAMA3_NUM_PARAMETERS &&
                   l->parameter_specs(&ac, NULL) == llama_parameter_specs(&lc, NULL) &&
                   l->flops_per_token(&ac, 64) == llama_flops_per_token(&lc, 64) && l->recompute_levels;
    test_report(llama_ok, "model_arch_for_init: llama3:d2 is Llama 3's entry with its LlamaConfig, tables and flops", "");
    int names = model_arch_by_name("gpt2") == &gpt2_arch && model_arch_by_name("llama3") == &llama3_arch &&
                model_arch_by_name("llama") == NULL;
    int last = 0;
    while (model_archs[last + 1]) last++;
    test_report(names && model_archs[last] == &gpt2_arch, "the registry: names resolve, GPT-2 is the last (the fallback)", "");
    /* model_arch_explicit: only the entries before the fallback answer (train_gpt.cu asks it before -y 1 resolves -e) */
    const int explicit_ok = model_arch_explicit("llama3:d2", &ac) == &llama3_arch && ac.arch == &llama3_arch &&
                            model_arch_explicit("gpt2:d2", &ac) == NULL && model_arch_explicit("d2", &ac) == NULL &&
                            model_arch_explicit("/nonexistent/run_dir", &ac) == NULL;
    test_report(explicit_ok, "model_arch_explicit: llama3:d2 is the Llama's; gpt2:d2, d2 and a missing path name none (the fallback's)", "");
}

static void test_schedules(void) {
    const float peak = 1e-3f, frac = 0.1f;
    const int total = 100, warm = 10;
    int ok = 1;
    for (int kind = 0; kind < 4; kind++) {
        for (int s = 0; s < warm; s++) ok &= fabsf(lr_at(kind, s, total, warm, peak, frac) - peak * (s + 1) / warm) < 1e-9f;
    }
    test_report(ok, "every schedule warms up linearly to the peak", "");
    test_report(fabsf(lr_at(LR_COSINE, warm, total, warm, peak, frac) - peak) < 1e-9f &&
                    fabsf(lr_at(LR_COSINE, total - 1, total, warm, peak, frac) - peak * frac) < 1e-9f,
                "cosine goes from the peak to peak*final_frac", "");
    test_report(fabsf(lr_at(LR_LINEAR, total - 1, total, warm, peak, frac) - peak * frac) < 1e-9f &&
                    fabsf(lr_at(LR_LINEAR, 55, total, warm, peak, frac) - (peak - (peak - peak * frac) * 45.0f / 89.0f)) < 1e-9f,
                "linear decays linearly to peak*final_frac", "");
    test_report(lr_at(LR_CONSTANT, 99, total, warm, peak, frac) == peak, "constant stays at the peak", "");
    test_report(lr_at(LR_WSD, 79, total, warm, peak, frac) == peak && lr_at(LR_WSD, 80, total, warm, peak, frac) == peak &&
                    fabsf(lr_at(LR_WSD, 99, total, warm, peak, frac) - peak * frac) < 1e-9f &&
                    lr_at(LR_WSD, 90, total, warm, peak, frac) < peak,
                "wsd is flat until the last 20%, then decays to peak*final_frac", "");
    int mono = 1;
    for (int s = warm + 1; s < total; s++) mono &= lr_at(LR_COSINE, s, total, warm, peak, frac) <= lr_at(LR_COSINE, s - 1, total, warm, peak, frac);
    test_report(mono, "cosine decreases monotonically after warmup", "");
    /* a run with one step after the warmup trains it at the peak, not at LR 0 with -q 0 */
    int single = 1;
    for (int kind = 0; kind < 3; kind++)
        single &= lr_at(kind, 0, 1, 0, peak, 0.0f) == peak && lr_at(kind, 2, 3, 2, peak, 0.0f) == peak;
    test_report(single, "-x 1 (or one step after the warmup) runs at the peak LR, also with -q 0", "");
    test_report(lr_schedule_parse("wsd") == LR_WSD && lr_schedule_parse("cos") < 0, "schedule names parse strictly", "");
}

static void test_float_format(void) {
    Rng rng;
    rng_seed(&rng, 99);
    printf("seed 99\n");
    int ok = 1;
    char buf[32];
    for (int i = 0; i < 200000 && ok; i++) {
        uint32_t bits = rng_u32(&rng);
        float x;
        memcpy(&x, &bits, 4);
        if (!isfinite(x)) continue;
        format_float_roundtrip(buf, x);
        ok &= strtof(buf, NULL) == x;
        if (!ok) printf("  %a printed as %s\n", (double)x, buf);
    }
    format_float_roundtrip(buf, 0.1f);
    test_report(ok && strcmp(buf, "0.1") == 0, "log floats read back exactly and stay short", "0.1f -> %s", buf);
}

static void test_bf16(void) {
    /* 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to even (1) */
    int ok = float_to_bf16(1.0f + 1.0f / 256) == 0x3F80 && float_to_bf16(1.0f + 3.0f / 256) == 0x3F82 &&
             float_to_bf16(-2.0f) == 0xC000 && bf16_to_float(0x3F80) == 1.0f && float_to_bf16(INFINITY) == 0x7F80;
    uint16_t n = float_to_bf16(NAN);
    ok &= (n & 0x7F80) == 0x7F80 && (n & 0x7F) != 0;
    test_report(ok, "bf16 rounds to nearest even, keeps infinities and NaN", "");
}

static void test_sampler(void) {
    float logits[5] = {0.0f, 0.0f, 100.0f, 0.0f, 1000.0f}; /* index 4 is "padding" beyond V = 4 */
    test_report(sample_softmax(logits, 4, 0.5f) == 2 && sample_softmax(logits, 4, 0.999f) == 2,
                "sampler picks the dominant token and never one beyond V", "");
    float flat[4] = {1, 1, 1, 1};
    test_report(sample_softmax(flat, 4, 0.1f) == 0 && sample_softmax(flat, 4, 0.3f) == 1 && sample_softmax(flat, 4, 0.99f) == 3,
                "sampler inverts the CDF", "");
    /* sample_filtered: logits log(0.5, 0.3, 0.15, 0.05) (V = 4) */
    float lp[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    int k2_ok = 1, p_ok = 1, t_ok = 1;
    for (int i = 0; i < 100; i++) {
        float coin = (i + 0.25f) / 100.0f; /* never on a CDF boundary */
        int k2 = sample_filtered(lp, 4, 1.0f, 2, 1.0f, coin); /* renormalised 5/8, 3/8 */
        k2_ok &= k2 == (coin < 0.625f ? 0 : 1);
        int p7 = sample_filtered(lp, 4, 1.0f, 0, 0.7f, coin); /* 0.5 + 0.3 reaches 0.7: the two best */
        p_ok &= p7 == (coin < 0.625f ? 0 : 1);
        int all = sample_filtered(lp, 4, 1.0f, 0, 1.0f, coin); /* no filter: the plain inverse CDF */
        t_ok &= all == (coin < 0.5f ? 0 : coin < 0.8f ? 1 : coin < 0.95f ? 2 : 3);
    }
    test_report(k2_ok, "top-k 2 samples the two best, renormalised", "");
    test_report(p_ok, "top-p 0.7 samples the smallest set reaching 0.7, renormalised", "");
    test_report(t_ok, "temperature 1 without filters is the inverse CDF of the softmax", "");
    test_report(sample_filtered(lp, 4, 0.0f, 0, 1.0f, 0.99f) == 0 && sample_filtered(lp, 3, 100.0f, 1, 1.0f, 0.99f) == 0,
                "temperature 0 and top-k 1 give the argmax", "");
}

static void test_throttle_words(void) {
    char buf[256];
    struct { unsigned long long mask; const char *words; } cases[] = {
        {0x0, "none"},
        {0x4, "power-cap"},
        {0x24, "power-cap,sw-thermal"},
        {0x48, "hw-slowdown,hw-thermal"},
        {0x1FF, "idle,app-clocks,power-cap,hw-slowdown,sync-boost,sw-thermal,hw-thermal,power-brake,display-clocks"},
        {0x4 | (1ull << 40), "power-cap,other:0x10000000000"},
        {1ull << 63, "other:0x8000000000000000"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gpu_throttle_describe(cases[i].mask, buf, sizeof buf);
        char name[160];
        snprintf(name, sizeof name, "throttle reasons 0x%llx read as '%s'", cases[i].mask, cases[i].words);
        test_report(strcmp(buf, cases[i].words) == 0, name, "got '%s'", buf);
    }
    /* a short buffer truncates (NUL-terminated) and writes nothing past len */
    char small[16];
    memset(small, '#', sizeof small);
    gpu_throttle_describe(0x24, small, 8);
    int untouched = 1;
    for (size_t i = 8; i < sizeof small; i++) untouched &= small[i] == '#';
    test_report(strcmp(small, "power-c") == 0 && untouched, "throttle words truncate within the buffer",
                "got '%.8s', bytes past len %s", small, untouched ? "untouched" : "overwritten");
}

static void test_gpu_reading_text(void) {
    GpuReading r;
    char text[512];
    gpu_reading_clear(&r);
    gpu_reading_format(&r, text, sizeof text);
    test_report(strcmp(text, " | NVML unavailable") == 0, "telemetry text: nothing read -> only 'NVML unavailable'", "got '%s'", text);
    r.mem_used_gib = 1.5, r.mem_total_gib = 80.0;
    gpu_reading_format(&r, text, sizeof text);
    test_report(strcmp(text, " | mem 1.50/80.00 GiB | NVML unavailable") == 0,
                "telemetry text without NVML: memory, then 'NVML unavailable' once", "got '%s'", text);
    r.nvml = 1;
    r.sm_mhz = 1755, r.sm_max_mhz = 1980, r.mem_mhz = 2619, r.temp_c = 47, r.util_pct = 97;
    r.power_w = 312.4, r.power_limit_w = 700.0;
    r.have_throttle = 1, r.throttle = 0x24;
    gpu_reading_format(&r, text, sizeof text);
    const char *full = " | mem 1.50/80.00 GiB | SM 1755/1980 MHz | mem clock 2619 MHz | 47 C | 312/700 W | util 97% | "
                       "throttle power-cap,sw-thermal";
    test_report(strcmp(text, full) == 0, "telemetry text with every NVML field", "got '%s'", text);
    r.sm_max_mhz = -1, r.power_limit_w = -1.0, r.temp_c = -1, r.have_throttle = 0;
    gpu_reading_format(&r, text, sizeof text);
    test_report(strcmp(text, " | mem 1.50/80.00 GiB | SM 1755 MHz | mem clock 2619 MHz | 312 W | util 97%") == 0,
                "telemetry text leaves out fields that were not read", "got '%s'", text);
    char tiny[20];
    gpu_reading_format(&r, tiny, sizeof tiny);
    test_report(strlen(tiny) == sizeof tiny - 1 && strncmp(tiny, text, sizeof tiny - 1) == 0,
                "telemetry text truncates to the buffer", "got '%s'", tiny);

    /* the log record: the same readings under their keys, nothing for what was not read */
    char dir[] = "/tmp/llmc_test_core_XXXXXX";
    if (!mkdtemp(dir)) {
        test_report(0, "telemetry log fields", "mkdtemp failed");
        return;
    }
    Logger lg;
    logger_open(&lg, dir, -1);
    log_begin(&lg);
    gpu_reading_log(&r, &lg);
    log_end(&lg);
    r.sm_max_mhz = 1980, r.power_limit_w = 700.0, r.temp_c = 47, r.have_throttle = 1;
    log_begin(&lg);
    gpu_reading_log(&r, &lg);
    log_end(&lg);
    gpu_reading_clear(&r);
    log_begin(&lg);
    gpu_reading_log(&r, &lg);
    log_end(&lg);
    logger_close(&lg);
    char path[128], lines[3][512] = {"", "", ""};
    snprintf(path, sizeof path, "%s/log.jsonl", dir);
    FILE *f = fopen(path, "rb");
    for (int i = 0; f && i < 3; i++)
        if (!fgets(lines[i], sizeof lines[i], f)) lines[i][0] = '\0';
    if (f) fclose(f);
    remove(path);
    rmdir(dir);
    const char *want[3] = {
        "{\"gpu_mem_used_gib\":1.5,\"gpu_mem_total_gib\":80,\"gpu_nvml\":1,\"gpu_sm_mhz\":1755,\"gpu_mem_mhz\":2619,"
        "\"gpu_power_w\":312.4,\"gpu_util_pct\":97}\n",
        "{\"gpu_mem_used_gib\":1.5,\"gpu_mem_total_gib\":80,\"gpu_nvml\":1,\"gpu_sm_mhz\":1755,\"gpu_sm_max_mhz\":1980,"
        "\"gpu_mem_mhz\":2619,\"gpu_temp_c\":47,\"gpu_power_w\":312.4,\"gpu_power_limit_w\":700,"
        "\"gpu_util_pct\":97,\"gpu_throttle\":\"power-cap,sw-thermal\",\"gpu_throttle_mask\":36}\n",
        "{\"gpu_nvml\":0}\n",
    };
    for (int i = 0; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "telemetry log fields, record %d of 3", i + 1);
        /* every record ends with "time": Unix seconds with 3 decimals; compared without it */
        char *t = strstr(lines[i], ",\"time\":");
        double secs = 0.0;
        char tail[8] = "";
        int timed = t && sscanf(t, ",\"time\":%lf%7s", &secs, tail) == 2 && strcmp(tail, "}") == 0 &&
                    fabs(secs - (double)time(NULL)) < 600.0;
        if (timed) strcpy(t, "}\n");
        test_report(timed && strcmp(lines[i], want[i]) == 0, name, "got %s", lines[i]);
    }
}

/* Moments to encode: k (not a multiple of the block) values whose magnitudes spread over 1e-9 ..
 * 1e2 (log-uniform, so a block holds a wide range, as v does), exact zeros, an all-zero block
 * and a block with a single non-zero element; signed for m, non-negative for v. */
static void optstate_sample(float *x, size_t k, int is_v, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < k; i++) {
        double mag = pow(10.0, -9.0 + 11.0 * rng_f32(&r));
        x[i] = (float)(is_v || rng_f32(&r) < 0.5 ? mag : -mag);
        if (i % 37 == 0) x[i] = 0.0f;
        if (i >= 256 && i < 512) x[i] = 0.0f;            /* block 1: all zero */
        if (i >= 512 && i < 768) x[i] = i == 600 ? (float)(is_v ? 3e-7 : -3e-7) : 0.0f; /* block 2: one value */
    }
}

/* The int8 code of x in a block of scale term a (double): the nearest code in the sqrt domain. */
static double q8_reference(double x, double a, int is_v, int *code) {
    if (a == 0.0) {
        *code = 0;
        return 0.0;
    }
    const double K = is_v ? 255.0 : 127.0;
    double t = is_v ? sqrt(x) : fabs(x);
    double q = nearbyint(sqrt(t / a) * K);
    *code = (int)q;
    double c = q * q / (K * K) * a;
    return is_v ? c * c : (x < 0 ? -c : c);
}

static void test_optstate(void) {
    enum { K = 1000 };
    static float x[K], y[K], z[K];
    static unsigned char s1[8192], s2[8192];
    for (int is_v = 0; is_v <= 1; is_v++) {
        optstate_sample(x, K, is_v, 11 + (uint64_t)is_v);
        /* bf16: round to nearest even, i.e. within half a bf16 step (2^-9 relative) and a bf16 value */
        optstate_encode(s1, OPTSTATE_BF16, is_v, K, x);
        optstate_decode(s1, OPTSTATE_BF16, is_v, K, y);
        int ok = 1;
        for (int i = 0; i < K; i++) {
            uint32_t u;
            memcpy(&u, &y[i], 4);
            ok &= (u & 0xFFFF) == 0 && fabs((double)y[i] - x[i]) <= ldexp(fabs((double)x[i]), -8);
        }
        /* ties go to the even neighbour: 1 + 2^-8 (halfway between 1 and 1 + 2^-7) -> 1 */
        ok &= bf16_to_float(float_to_bf16(1.0f + 0x1p-8f)) == 1.0f &&
              bf16_to_float(float_to_bf16(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f;
        test_report(ok, is_v ? "optstate bf16 v: round to nearest even (within 2^-8 relative)" : "optstate bf16 m: round to nearest even (within 2^-8 relative)", "a value off");
        /* int8: codes equal to the double-precision nearest code (except within 1e-4 of a tie),
         * values equal to the double-precision decode to float accuracy, the scale element exact */
        optstate_encode(s1, OPTSTATE_INT8, is_v, K, x);
        optstate_decode(s1, OPTSTATE_INT8, is_v, K, y);
        int codes_ok = 1, values_ok = 1, scale_ok = 1, bad = -1;
        for (int b = 0; b * OPTSTATE_BLOCK < K; b++) {
            int j0 = b * OPTSTATE_BLOCK, j1 = j0 + OPTSTATE_BLOCK < K ? j0 + OPTSTATE_BLOCK : K;
            double a = 0.0;
            int at = j0;
            for (int j = j0; j < j1; j++) {
                double t = is_v ? sqrt((double)x[j]) : fabs((double)x[j]);
                if (t > a) a = t, at = j;
            }
            if (y[at] != x[at] && !(is_v && y[at] == (float)((double)sqrtf(x[at]) * sqrtf(x[at])))) scale_ok = 0, bad = at;
            for (int j = j0; j < j1; j++) {
                int code;
                double ref = q8_reference(x[j], a, is_v, &code);
                double t = is_v ? sqrt((double)x[j]) : fabs((double)x[j]);
                double frac = a > 0 ? sqrt(t / a) * (is_v ? 255.0 : 127.0) : 0.0;
                int near_tie = fabs(frac - floor(frac) - 0.5) < 1e-4;
                int got = is_v ? (int)((unsigned char *)s1)[optstate_blocks(K) * 4 + j]
                               : abs((int)(int8_t)((unsigned char *)s1)[optstate_blocks(K) * 4 + j]);
                if (!near_tie && got != code) codes_ok = 0, bad = j;
                if (!near_tie && fabs(y[j] - ref) > 1e-6 * fabs(ref) + 1e-30) values_ok = 0, bad = j;
            }
        }
        test_report(codes_ok && values_ok && scale_ok,
                    is_v ? "optstate int8 v: codes and values equal the double-precision quadratic code of sqrt(v)"
                         : "optstate int8 m: codes and values equal the double-precision quadratic code",
                    "element %d: x %g decoded %g (codes %d values %d scale %d)", bad, bad >= 0 ? x[bad] : 0.0,
                    bad >= 0 ? y[bad] : 0.0, codes_ok, values_ok, scale_ok);
        /* decode then encode gives back the same bytes: a state file of fp32 moments resumes exactly */
        for (int type = OPTSTATE_BF16; type <= OPTSTATE_INT8; type++) {
            optstate_encode(s1, type, is_v, K, x);
            optstate_decode(s1, type, is_v, K, y);
            optstate_encode(s2, type, is_v, K, y);
            optstate_decode(s2, type, is_v, K, z);
            size_t bytes = optstate_bytes(K, type);
            test_report(memcmp(s1, s2, bytes) == 0 && memcmp(y, z, sizeof y) == 0,
                        type == OPTSTATE_BF16 ? (is_v ? "optstate_roundtrip_exact bf16 v" : "optstate_roundtrip_exact bf16 m")
                                              : (is_v ? "optstate_roundtrip_exact int8 v" : "optstate_roundtrip_exact int8 m"),
                        "encode(decode(s)) != s");
        }
    }
    test_report(optstate_bytes(1000, OPTSTATE_INT8) == 4 * 4 + 1000 && optstate_bytes(1000, OPTSTATE_BF16) == 2000 &&
                    optstate_bytes(1000, OPTSTATE_FP32) == 4000,
                "optstate_bytes: int8 = one fp32 scale per 256 + one byte each, bf16 2, fp32 4", "wrong sizes");
    /* the compact update with fp32 storage is the plain update bit for bit (the same formula) */
    static float p1[K], p2[K], g[K], m1[K], v1[K], m2[K], v2[K];
    optstate_sample(g, K, 0, 5);
    for (int i = 0; i < K; i++) p1[i] = p2[i] = 0.01f * (float)(i % 17) - 0.05f, m1[i] = m2[i] = v1[i] = v2[i] = 0.0f;
    TensorSpec specs[2] = {{.offset = 0, .numel = 300, .decay = 1}, {.offset = 300, .numel = K - 300, .decay = 0}};
    OptSegments seg;
    optstate_segments(&seg, specs, 2, 0, K, 0.1f);
    for (int t = 1; t <= 3; t++) {
        adamw_update(p1, g, m1, v1, 300, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f);
        adamw_update(p1 + 300, g + 300, m1 + 300, v1 + 300, K - 300, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, t, 0.5f);
        adamw_update_compact(p2, g, m2, v2, OPTSTATE_FP32, K, &seg, 1e-3f, 0.9f, 0.95f, 1e-8f, t, 0.5f);
    }
    test_report(memcmp(p1, p2, sizeof p1) == 0 && memcmp(m1, m2, sizeof m1) == 0 && memcmp(v1, v2, sizeof v1) == 0,
                "adamw_update_compact with fp32 states equals adamw_update bit for bit (per-tensor decay)", "differs");
}

/* A trainer built without data parallelism (./train_gpt without NCCL: can_parallel 0) given
 * -pn 2 and no launcher must refuse, not train alone and write what the other copies write. */
static void test_dist_refuses_pn_without_parallelism(void) {
    fflush(stdout);
    int fds[2];
    if (pipe(fds) != 0) { test_report(0, "dist_init: pipe", "pipe failed"); return; }
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        DistFlags f = {.pn = 2, .pr = 0, .init = "mpi", .timeout_s = 1.0};
        int argc = 1;
        char *args[] = {(char *)"train_gpt", NULL}, **argv = args;
        dist_init(&argc, &argv, &f, 0);
        _exit(0);
    }
    close(fds[1]);
    char out[2048], rest[512];
    size_t n = 0;
    for (;;) { /* to the end: the child writes its message in pieces (a closed pipe would kill it) */
        ssize_t k = n + 1 < sizeof out ? read(fds[0], out + n, sizeof out - 1 - n) : read(fds[0], rest, sizeof rest);
        if (k <= 0) break;
        if (n + 1 < sizeof out) n += (size_t)k;
    }
    out[n] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    test_report(WIFEXITED(status) && WEXITSTATUS(status) == 1 && strstr(out, "error: -pn 2") != NULL,
                "dist_init: -pn 2 in a build without data parallelism is an error naming -pn, not a lone run",
                "exit status %d, stderr: %s", status, out);
}

int main(void) {
    test_descriptors();
    test_arch_table();
    test_dist_refuses_pn_without_parallelism();
    test_optstate();
    test_schedules();
    test_float_format();
    test_bf16();
    test_sampler();
    test_throttle_words();
    test_gpu_reading_text();
    return test_exit_code();
}
