#include "llmc/core/logger.h"
#include "llmc/core/atomicfile.h"
#include "llmc/core/check.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
 * from before max_step (a resume from a later step belongs to the steps being dropped). A last
 * line without its newline is a record cut off (a kill or full disk mid-write): dropped, so that
 * the next record does not glue onto it. */
static void truncate_log(const char *path, int max_step) {
    struct stat st;
    if (stat(path, &st) != 0) return; /* no log yet */
    char err[4400];
    FILE *in = fopen_regular(path, err, sizeof err);
    if (!in) llmc_die("log: %s", err);
    AtomicFile af;
    atomic_open(&af, path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long long lineno = 0;
    while ((n = getline(&line, &cap, in)) > 0) {
        lineno++;
        if (line[n - 1] != '\n') {
            printf("note: log '%s': its last line (line %lld, %zd bytes) was cut off mid-write (no newline): "
                   "dropped\n", path, lineno, n);
            break;
        }
        const char *s = strstr(line, "\"step\":");
        if (s && atoi(s + 7) > max_step) continue;
        const char *r = strstr(line, "\"resumed_from\":");
        if (r && atoi(r + 15) >= max_step) continue;
        fputs(line, af.f);
    }
    free(line);
    int bad = ferror(in);
    fclose(in);
    if (bad) {
        atomic_abort(&af);
        llmc_die("cannot read the log '%s' to resume it", path);
    }
    atomic_commit(&af);
}

void logger_open(Logger *lg, const char *dir, int resume_step) {
    memset(lg, 0, sizeof *lg);
    if (!dir || !dir[0]) return;
    snprintf(lg->path, sizeof lg->path, "%s/log.jsonl", dir);
    struct stat st;
    if (stat(lg->path, &st) == 0 && !S_ISREG(st.st_mode))
        llmc_die("log '%s' is %s, not a regular file", lg->path, file_kind_name(st.st_mode));
    if (resume_step >= 0) truncate_log(lg->path, resume_step);
    lg->f = fopen(lg->path, resume_step >= 0 ? "ab" : "wb");
    if (!lg->f) llmc_die("cannot open the log '%s': %s", lg->path, strerror(errno));
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

/* k: the formatted number, or null where it is not finite (JSON has no inf or nan) */
static void number(Logger *lg, const char *k, const char *formatted, int finite) {
    key(lg, k);
    fputs(finite ? formatted : "null", lg->f);
}

void log_float(Logger *lg, const char *k, float value) {
    if (!lg->f) return;
    char buf[32];
    format_float_roundtrip(buf, value);
    number(lg, k, buf, isfinite(value));
}

void log_double(Logger *lg, const char *k, double value) {
    if (!lg->f) return;
    char buf[32];
    format_double_roundtrip(buf, value);
    number(lg, k, buf, isfinite(value));
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
    /* a full disk or an I/O error ends the run: a log that silently stops is a lost result */
    if (fflush(lg->f) != 0 || ferror(lg->f)) llmc_die("writing the log '%s' failed: %s", lg->path, strerror(errno));
}

void logger_close(Logger *lg) {
    if (lg->f && fclose(lg->f) != 0) {
        lg->f = NULL;
        llmc_die("writing the log '%s' failed: %s", lg->path, strerror(errno));
    }
    lg->f = NULL;
}
