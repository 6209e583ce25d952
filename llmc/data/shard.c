#define _POSIX_C_SOURCE 200809L
#include "llmc/data/shard.h"
#include "llmc/core/atomicfile.h"
#include "llmc/core/check.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int shard_read_header(const char *path, ShardInfo *info, char *err, size_t errlen) {
    char dummy[8];
    if (!err) err = dummy, errlen = sizeof dummy;
    char why[4200];
    FILE *f = fopen_regular(path, why, sizeof why); /* a FIFO or device would block */
    if (!f) {
        snprintf(err, errlen, "data shard: %s", why);
        return -1;
    }
    int32_t h[SHARD_HEADER_INTS];
    size_t got = fread(h, sizeof(int32_t), SHARD_HEADER_INTS, f);
    struct stat st;
    int stat_ok = fstat(fileno(f), &st) == 0;
    fclose(f);
    if (got != SHARD_HEADER_INTS) {
        snprintf(err, errlen, "data shard '%s' is %zu bytes, shorter than its 1024-byte header", path,
                 got * sizeof(int32_t));
        return -1;
    }
    if (h[0] == SHARD_MAGIC_U16 && h[1] == SHARD_VERSION_U16) {
        info->token_bytes = 2;
    } else if (h[0] == SHARD_MAGIC_U32 && h[1] == SHARD_VERSION_U32) {
        info->token_bytes = 4;
    } else if (h[0] == SHARD_MAGIC_U16 || h[0] == SHARD_MAGIC_U32) {
        snprintf(err, errlen, "data shard '%s' has magic %d but unsupported version %d", path, h[0], h[1]);
        return -1;
    } else {
        snprintf(err, errlen, "'%s' is not a data shard: magic %d, expected %d (uint16) or %d (uint32)",
                 path, h[0], SHARD_MAGIC_U16, SHARD_MAGIC_U32);
        return -1;
    }
    if (h[2] < 0) {
        snprintf(err, errlen, "data shard '%s' has a negative token count %d", path, h[2]);
        return -1;
    }
    info->ntok = (size_t)h[2];
    int64_t want = (int64_t)SHARD_HEADER_BYTES + (int64_t)info->ntok * info->token_bytes;
    if (!stat_ok || (int64_t)st.st_size != want) {
        snprintf(err, errlen, "data shard '%s' is %lld bytes but its header says %zu tokens (%lld bytes)%s",
                 path, stat_ok ? (long long)st.st_size : -1LL, info->ntok, (long long)want,
                 stat_ok && st.st_size < want ? ": truncated" : "");
        return -1;
    }
    return 0;
}

void shard_write(const char *path, const uint32_t *tokens, size_t ntok, int token_bytes) {
    if (token_bytes != 2 && token_bytes != 4) llmc_die("shard_write('%s'): token_bytes must be 2 or 4", path);
    if (ntok > (size_t)INT32_MAX) llmc_die("shard '%s': %zu tokens exceed the 2^31-1 per shard limit", path, ntok);
    int32_t h[SHARD_HEADER_INTS] = {0};
    h[0] = token_bytes == 2 ? SHARD_MAGIC_U16 : SHARD_MAGIC_U32;
    h[1] = token_bytes == 2 ? SHARD_VERSION_U16 : SHARD_VERSION_U32;
    h[2] = (int32_t)ntok;
    AtomicFile af;
    atomic_open(&af, path);
    fwriteCheck(h, sizeof h, 1, af.f, af.tmp_path);
    enum { CHUNK = 1 << 16 };
    uint16_t buf16[CHUNK];
    for (size_t i = 0; i < ntok; i += CHUNK) {
        size_t n = ntok - i < CHUNK ? ntok - i : CHUNK;
        if (token_bytes == 4) {
            fwriteCheck(tokens + i, 4, n, af.f, af.tmp_path);
            continue;
        }
        for (size_t j = 0; j < n; j++) {
            if (tokens[i + j] > 0xFFFF) {
                atomic_abort(&af);
                llmc_die("shard '%s': token %u at position %zu does not fit in uint16; use 4-byte tokens",
                         path, tokens[i + j], i + j);
            }
            buf16[j] = (uint16_t)tokens[i + j];
        }
        fwriteCheck(buf16, 2, n, af.f, af.tmp_path);
    }
    atomic_commit(&af);
}
