#include "logger.h"
#include "atomicfile.h"
#include "check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void format_float_roundtrip(char *buf, float x) {
    if (!isfinite(x)) {
        strcpy(buf, isnan(x) ? "NaN" : (x > 0 ? "Infinity" : "-Infinity"));
        return;
    }
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, 32, "%.*g", digits, (double)x);
        if (strtof(buf, NULL) == x) return;
    }
}

static void format_double_roundtrip(char *buf, double x) {
    if (!isfinite(x)) {
        strcpy(buf, isnan(x) ? "NaN" : (x > 0 ? "Infinity" : "-Infinity"));
        return;
    }
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, 32, "%.*g", digits, x);
        if (strtod(buf, NULL) == x) return;
    }
}

/* Keeps the lines of an existing log whose "step" is <= max_step, and the records of resumes
 * from before max_step (a resume from a later step belongs to the steps being dropped). */
static void truncate_log(const char *path, int max_step) {
    FILE *in = fopen(path, "rb");
    if (!in) return;
    AtomicFile af;
    atomic_open(&af, path);
    char line[65536];
    while (fgets(line, sizeof line, in)) {
        const char *s = strstr(line, "\"step\":");
        if (s && atoi(s + 7) > max_step) continue;
        const char *r = strstr(line, "\"resumed_from\":");
        if (r && atoi(r + 15) >= max_step) continue;
        fputs(line, af.f);
    }
    fclose(in);
    atomic_commit(&af);
}

void logger_open(Logger *lg, const char *dir, int resume_step) {
    memset(lg, 0, sizeof *lg);
    if (!dir || !dir[0]) return;
    snprintf(lg->path, sizeof lg->path, "%s/log.jsonl", dir);
    if (resume_step >= 0) truncate_log(lg->path, resume_step);
    lg->f = fopenCheck(lg->path, resume_step >= 0 ? "ab" : "wb");
}

void log_begin(Logger *lg) {
    if (!lg->f) return;
    fputc('{', lg->f);
    lg->fields = 0;
}

static void key(Logger *lg, const char *k) { fprintf(lg->f, "%s\"%s\":", lg->fields++ ? "," : "", k); }

void log_int(Logger *lg, const char *k, long long value) {
    if (!lg->f) return;
    key(lg, k);
    fprintf(lg->f, "%lld", value);
}

void log_float(Logger *lg, const char *k, float value) {
    if (!lg->f) return;
    char buf[32];
    format_float_roundtrip(buf, value);
    key(lg, k);
    fputs(isfinite(value) ? buf : "null", lg->f);
}

void log_double(Logger *lg, const char *k, double value) {
    if (!lg->f) return;
    char buf[32];
    format_double_roundtrip(buf, value);
    key(lg, k);
    fputs(isfinite(value) ? buf : "null", lg->f);
}

void log_string(Logger *lg, const char *k, const char *value) {
    if (!lg->f) return;
    key(lg, k);
    fputc('"', lg->f);
    for (const char *p = value; *p; p++) {
        if (*p == '"' || *p == '\\') fputc('\\', lg->f);
        if ((unsigned char)*p < 0x20) fprintf(lg->f, "\\u%04x", *p);
        else fputc(*p, lg->f);
    }
    fputc('"', lg->f);
}

void log_object_begin(Logger *lg, const char *k) {
    if (!lg->f) return;
    key(lg, k);
    fputc('{', lg->f);
    lg->fields = 0;
}

void log_object_end(Logger *lg) {
    if (!lg->f) return;
    fputc('}', lg->f);
    lg->fields = 1; /* the object was a field of the enclosing line */
}

void log_end(Logger *lg) {
    if (!lg->f) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    key(lg, "time");
    fprintf(lg->f, "%lld.%03ld", (long long)ts.tv_sec, ts.tv_nsec / 1000000);
    fputs("}\n", lg->f);
    fflush(lg->f);
}

void logger_close(Logger *lg) {
    if (lg->f) fclose(lg->f);
    lg->f = NULL;
}
