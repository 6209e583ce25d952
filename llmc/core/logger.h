/* logger.h - DIR/log.jsonl: one JSON object per line, flushed per line.
 * Training lines: step, train_loss, lr, grad_norm, step_ms, tokens_per_s (+ backend extras).
 * Validation lines: step, val_loss. Every line ends with "time" (Unix seconds, 3 decimals). Floats are printed with the fewest digits that read back
 * to the same float (float32) or double, so nothing is lost. Usage:
 *   log_begin(&lg); log_int(&lg, "step", 3); log_float(&lg, "train_loss", x); log_end(&lg); */
#ifndef LLMC_LOGGER_H
#define LLMC_LOGGER_H
#include <stdio.h>
#ifdef __cplusplus
extern "C" {
#endif
typedef struct {
    FILE *f;     /* NULL: logging disabled */
    int fields;  /* fields written in the current line */
    char path[4096];
} Logger;
/* dir NULL or "": disabled. resume_step >= 0: keep the existing lines with step <= resume_step
 * (rewritten atomically) and append; < 0: start a new file. */
void logger_open(Logger *lg, const char *dir, int resume_step);
void log_begin(Logger *lg);
void log_int(Logger *lg, const char *key, long long value);
void log_float(Logger *lg, const char *key, float value);
void log_double(Logger *lg, const char *key, double value);
void log_string(Logger *lg, const char *key, const char *value);
/* A nested object as the value of key (one level): log_object_begin, fields, log_object_end. */
void log_object_begin(Logger *lg, const char *key);
void log_object_end(Logger *lg);
/* Ends the line with "time" (Unix seconds, millisecond resolution) and flushes it. */
void log_end(Logger *lg);
void logger_close(Logger *lg);
/* Shortest decimal text that parses back to exactly this float (buf >= 32). */
void format_float_roundtrip(char *buf, float x);
#ifdef __cplusplus
}
#endif
#endif
