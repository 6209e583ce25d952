/* sumfile.c - CRC-32 of whole files and "<path>.sum" checksum files (sumfile.h). */
#include "llmc/core/sumfile.h"
#include "llmc/core/atomicfile.h"
#include "llmc/core/check.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

long long sumfile_size(FILE *f) {
    struct stat st;
    return fstat(fileno(f), &st) == 0 ? (long long)st.st_size : -1;
}

FILE *sumfile_open_for_reading(const char *path, const char *what) {
    char err[4400];
    FILE *f = fopen_regular(path, err, sizeof err);
    if (!f) llmc_die("%s: %s", what, err);
    return f;
}

uint32_t sumfile_crc_update(uint32_t crc, const void *p, size_t n) {
    return (uint32_t)crc32_z(crc, (const Bytef *)p, n);
}

void sumfile_path(const char *path, char *out, size_t len) { snprintf(out, len, "%s.sum", path); }

int sumfile_read(const char *model_path, uint32_t *crc, long long *bytes) {
    char sum[4200];
    sumfile_path(model_path, sum, sizeof sum);
    struct stat st;
    if (stat(sum, &st) != 0) return 0;
    FILE *f = sumfile_open_for_reading(sum, "checksum file");
    char line[256] = "";
    unsigned c = 0;
    int n = 0;
    int ok = fgets(line, sizeof line, f) && sscanf(line, "llmc-sum 1 crc32 %8x bytes %lld%n", &c, bytes, &n) == 2 &&
             (line[n] == '\n' || line[n] == '\0');
    fclose(f);
    if (!ok) llmc_die("checksum file '%s' is malformed (expected 'llmc-sum 1 crc32 <hex> bytes <n>')", sum);
    *crc = c;
    return 1;
}

void sumfile_write(const char *model_path, uint32_t crc, long long bytes) {
    char sum[4200];
    sumfile_path(model_path, sum, sizeof sum);
    AtomicFile af;
    atomic_open(&af, sum);
    if (fprintf(af.f, "llmc-sum 1 crc32 %08x bytes %lld\n", (unsigned)crc, bytes) < 0)
        llmc_die("writing '%s' failed: %s", af.tmp_path, strerror(errno));
    atomic_commit(&af);
}

uint32_t sumfile_checksum(const char *path) {
    FILE *f = sumfile_open_for_reading(path, "model checkpoint");
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = (unsigned char *)mallocCheck(CHUNK, "checksum buffer");
    uint32_t crc = sumfile_crc_update(0, NULL, 0);
    size_t n;
    while ((n = fread(buf, 1, CHUNK, f)) > 0) crc = sumfile_crc_update(crc, buf, n);
    int bad = ferror(f);
    free(buf);
    fclose(f);
    if (bad) llmc_die("cannot read model checkpoint '%s'", path);
    return crc;
}

