/*
 * telemetry.h - one reading of a GPU's state for -lg (--gpu-log-every): what it holds, how it
 * reads in the step output and which keys it writes into log.jsonl. Pure functions, no CUDA:
 * llmc/cuda/telemetry.cuh fills a GpuReading (cudaMemGetInfo + NVML), the GPU trainer prints
 * and logs it with these, and test/test_core.c checks them on the CPU.
 *
 * Printed after the step line it belongs to, e.g.
 *   gpu      7/100 | mem 61.20/139.81 GiB | SM 1980/1980 MHz | mem clock 3201 MHz | 54 C |
 *                   412/700 W | util 100% | throttle power-cap            (one line)
 *   gpu      7/100 | mem 0.02/131.32 GiB | NVML unavailable
 * Log keys (only for what was read): gpu_mem_used_gib, gpu_mem_total_gib, gpu_nvml (1/0),
 * gpu_sm_mhz, gpu_sm_max_mhz, gpu_mem_mhz, gpu_temp_c, gpu_power_w, gpu_power_limit_w,
 * gpu_util_pct, gpu_throttle (the words), gpu_throttle_mask (NVML's bits).
 */
#ifndef LLMC_TELEMETRY_H
#define LLMC_TELEMETRY_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include "llmc/core/logger.h"

/* A value of -1 means "not read" (NVML missing, or that query failed); such fields are neither
 * printed nor logged. */
typedef struct {
    double mem_used_gib, mem_total_gib; /* cudaMemGetInfo: the whole device, every process */
    int nvml;                           /* 1: NVML answered for this device; 0: memory only */
    int sm_mhz, sm_max_mhz, mem_mhz;    /* current SM clock, its maximum, memory clock */
    int temp_c;                         /* GPU core temperature */
    double power_w, power_limit_w;      /* board draw, the enforced limit */
    int util_pct;                       /* % of the last sample period with a kernel running */
    int have_throttle;
    unsigned long long throttle;        /* NVML clocks-event (throttle) reason bits */
} GpuReading;

static inline void gpu_reading_clear(GpuReading *r) {
    r->mem_used_gib = r->mem_total_gib = -1.0;
    r->nvml = 0;
    r->sm_mhz = r->sm_max_mhz = r->mem_mhz = r->temp_c = r->util_pct = -1;
    r->power_w = r->power_limit_w = -1.0;
    r->have_throttle = 0;
    r->throttle = 0;
}

/* Appends printf-style text at text[*used], never past len (the result is truncated, always
 * NUL-terminated); *used keeps counting past len so a caller can tell. len >= 1. */
static inline void gpu_text_append(char *text, size_t len, size_t *used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline void gpu_text_append(char *text, size_t len, size_t *used, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t at = *used < len ? *used : len - 1;
    int n = vsnprintf(text + at, len - at, fmt, ap);
    va_end(ap);
    if (n > 0) *used = at + (size_t)n;
}

/* The reason bits as words joined by ',' ("power-cap,sw-thermal"); "none" for 0; bits NVML may
 * add later print as "other:0x...". Returns buf (len >= 1; truncated if short). */
static inline const char *gpu_throttle_describe(unsigned long long mask, char *buf, size_t len) {
    /* NVML's clocks-event reason bits (nvmlClocksEventReason*, formerly
     * nvmlClocksThrottleReason*) and their words; hw-slowdown is also set together with
     * hw-thermal and power-brake */
    static const struct {
        unsigned long long bit;
        const char *word;
    } reasons[] = {
        {0x001ull, "idle"},           /* nothing running: clocks drop to idle */
        {0x002ull, "app-clocks"},     /* held by the applications-clocks setting */
        {0x004ull, "power-cap"},      /* software power cap (the power limit) */
        {0x008ull, "hw-slowdown"},    /* hardware slowdown: clocks halved or worse */
        {0x010ull, "sync-boost"},     /* held to the slowest GPU of a sync-boost group */
        {0x020ull, "sw-thermal"},     /* software thermal slowdown */
        {0x040ull, "hw-thermal"},     /* hardware thermal slowdown */
        {0x080ull, "power-brake"},    /* external power-brake signal */
        {0x100ull, "display-clocks"}, /* display clock setting */
    };
    size_t used = 0;
    buf[0] = '\0';
    if (mask == 0) {
        gpu_text_append(buf, len, &used, "none");
        return buf;
    }
    for (size_t i = 0; i < sizeof reasons / sizeof reasons[0]; i++) {
        if (!(mask & reasons[i].bit)) continue;
        gpu_text_append(buf, len, &used, "%s%s", used ? "," : "", reasons[i].word);
        mask &= ~reasons[i].bit;
    }
    if (mask) gpu_text_append(buf, len, &used, "%sother:0x%llx", used ? "," : "", mask);
    return buf;
}

/* " | mem U/T GiB | SM ..." : the reading as the text that follows "gpu  step/max" (empty when
 * nothing was read). Without NVML it says "NVML unavailable" once. */
static inline void gpu_reading_format(const GpuReading *r, char *text, size_t len) {
    size_t used = 0;
    text[0] = '\0';
    if (r->mem_total_gib > 0) gpu_text_append(text, len, &used, " | mem %.2f/%.2f GiB", r->mem_used_gib, r->mem_total_gib);
    if (!r->nvml) {
        gpu_text_append(text, len, &used, " | NVML unavailable");
        return;
    }
    if (r->sm_mhz >= 0 && r->sm_max_mhz >= 0) gpu_text_append(text, len, &used, " | SM %d/%d MHz", r->sm_mhz, r->sm_max_mhz);
    else if (r->sm_mhz >= 0) gpu_text_append(text, len, &used, " | SM %d MHz", r->sm_mhz);
    if (r->mem_mhz >= 0) gpu_text_append(text, len, &used, " | mem clock %d MHz", r->mem_mhz);
    if (r->temp_c >= 0) gpu_text_append(text, len, &used, " | %d C", r->temp_c);
    if (r->power_w >= 0 && r->power_limit_w >= 0) gpu_text_append(text, len, &used, " | %.0f/%.0f W", r->power_w, r->power_limit_w);
    else if (r->power_w >= 0) gpu_text_append(text, len, &used, " | %.0f W", r->power_w);
    if (r->util_pct >= 0) gpu_text_append(text, len, &used, " | util %d%%", r->util_pct);
    if (r->have_throttle) {
        char words[160];
        gpu_text_append(text, len, &used, " | throttle %s", gpu_throttle_describe(r->throttle, words, sizeof words));
    }
}

/* The same reading as fields of the open log record (keys in the head comment). */
static inline void gpu_reading_log(const GpuReading *r, Logger *lg) {
    if (r->mem_total_gib > 0) {
        log_double(lg, "gpu_mem_used_gib", r->mem_used_gib);
        log_double(lg, "gpu_mem_total_gib", r->mem_total_gib);
    }
    log_int(lg, "gpu_nvml", r->nvml);
    if (!r->nvml) return;
    if (r->sm_mhz >= 0) log_int(lg, "gpu_sm_mhz", r->sm_mhz);
    if (r->sm_max_mhz >= 0) log_int(lg, "gpu_sm_max_mhz", r->sm_max_mhz);
    if (r->mem_mhz >= 0) log_int(lg, "gpu_mem_mhz", r->mem_mhz);
    if (r->temp_c >= 0) log_int(lg, "gpu_temp_c", r->temp_c);
    if (r->power_w >= 0) log_double(lg, "gpu_power_w", r->power_w);
    if (r->power_limit_w >= 0) log_double(lg, "gpu_power_limit_w", r->power_limit_w);
    if (r->util_pct >= 0) log_int(lg, "gpu_util_pct", r->util_pct);
    if (r->have_throttle) {
        char words[160];
        log_string(lg, "gpu_throttle", gpu_throttle_describe(r->throttle, words, sizeof words));
        log_int(lg, "gpu_throttle_mask", (long long)r->throttle);
    }
}

#endif
