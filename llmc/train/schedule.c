#include "llmc/train/schedule.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[] = {"cosine", "linear", "constant", "wsd"};

int lr_schedule_parse(const char *name) {
    for (int i = 0; i < 4; i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

const char *lr_schedule_name(int kind) { return kind >= 0 && kind < 4 ? names[kind] : "?"; }

float lr_at(int kind, int step, int total_steps, int warmup, float peak, float final_frac) {
    if (step < warmup) return peak * (float)(step + 1) / (float)warmup;
    float min_lr = peak * final_frac;
    int span = total_steps - warmup;
    /* one step after the warmup (-x 1): it runs at the peak, not at min (-q 0 would train at LR 0) */
    float p = span > 1 ? (float)(step - warmup) / (float)(span - 1) : 0.0f;
    if (p > 1.0f) p = 1.0f;
    switch (kind) {
    case LR_COSINE: return min_lr + (peak - min_lr) * 0.5f * (1.0f + cosf((float)M_PI * p));
    case LR_LINEAR: return peak - (peak - min_lr) * p;
    case LR_WSD: {
        int cooldown = total_steps / 5;
        int start = total_steps - cooldown;
        if (step < start || cooldown < 1) return peak;
        float q = cooldown > 1 ? (float)(step - start) / (float)(cooldown - 1) : 1.0f;
        if (q > 1.0f) q = 1.0f;
        return min_lr + (peak - min_lr) * (1.0f - sqrtf(q));
    }
    default: return peak;
    }
}

long long batch_ramp_step_tokens(long long ramp, long long start, long long full, long long seen) {
    if (seen >= ramp || start >= full) return full;
    long long t = start + (long long)((__int128)(full - start) * seen / ramp);
    t -= t % start;
    return t < start ? start : t > full ? full : t;
}

static int parse_positive(const char *s, const char *end, long long *out) {
    char *e;
    errno = 0;
    if (s == end || *s < '0' || *s > '9') return -1;
    long long v = strtoll(s, &e, 10);
    if (e != end || errno || v <= 0) return -1;
    *out = v;
    return 0;
}

int batch_ramp_parse(const char *text, long long *tokens, long long *start) {
    const char *colon = strchr(text, ':');
    *start = 0;
    if (!colon) return parse_positive(text, text + strlen(text), tokens);
    return parse_positive(text, colon, tokens) || parse_positive(colon + 1, colon + 1 + strlen(colon + 1), start) ? -1 : 0;
}
