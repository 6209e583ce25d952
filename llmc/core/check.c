#include "llmc/core/check.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int error_rank = -1; /* llmc_set_error_rank: the prefix of fatal messages, -1: none */

void llmc_set_error_rank(int rank, int ranks) { error_rank = ranks > 1 ? rank : -1; }

/* The fatal report in one write(): ranks sharing a terminal or a pipe cannot cut into each other's
 * lines (a write to a pipe of at most PIPE_BUF bytes is atomic; longer reports are cut to that).
 * "error: " first, then "rank N: " when several ranks run, unless the message names this rank
 * first itself. */
static void write_error(const char *text) {
    char prefix[32] = "", line[4096];
    if (error_rank >= 0) {
        snprintf(prefix, sizeof prefix, "rank %d: ", error_rank);
        if (strncmp(text, prefix, strlen(prefix)) == 0) prefix[0] = '\0';
    }
    int n = snprintf(line, sizeof line, "error: %s%s\n", prefix, text);
    if (n < 0) return;
    if ((size_t)n >= sizeof line) memcpy(line + sizeof line - 5, "...\n", 5), n = (int)sizeof line - 1;
    fflush(stdout);
    fflush(stderr);
    for (size_t put = 0; put < (size_t)n;) { /* a signal may cut a write to a terminal short */
        ssize_t k = write(STDERR_FILENO, line + put, (size_t)n - put);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        put += (size_t)k;
    }
}

void llmc_die(const char *fmt, ...) {
    char text[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    write_error(text);
    exit(1);
}

int errf(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

void llmc_check_failed(const char *statement, const char *detail, const char *hint,
                       const char *func, const char *file, int line) {
    char text[4096];
    if (hint && strncmp(hint, "HINT: ", 6) == 0) hint += 6; /* callers may include the word */
    snprintf(text, sizeof text, "%s\n  statement: %s\n  at: %s (%s:%d)%s%s", detail, statement, func, file, line,
             hint && hint[0] ? "\n  HINT: " : "", hint && hint[0] ? hint : "");
    write_error(text);
    exit(1);
}

FILE *fopen_check(const char *path, const char *mode, const char *func, const char *file, int line) {
    FILE *f = fopen(path, mode);
    if (f) return f;
    char detail[1024];
    snprintf(detail, sizeof detail, "cannot open '%s' (mode %s): %s", path, mode, strerror(errno));
    llmc_check_failed("fopen", detail,
                      mode[0] == 'r' ? "check that the path exists and is readable"
                                     : "check that the directory exists and is writable",
                      func, file, line);
}

void fread_check(void *dst, size_t size, size_t count, FILE *f, const char *path,
                 const char *func, const char *file, int line) {
    size_t got = fread(dst, size, count, f);
    if (got == count) return;
    char detail[1024];
    snprintf(detail, sizeof detail, "'%s' is shorter than expected: read %zu of %zu items of %zu bytes%s",
             path, got, count, size, ferror(f) ? " (read error)" : " (end of file)");
    llmc_check_failed("fread", detail, "the file is truncated or not of the expected format",
                      func, file, line);
}

void fwrite_check(const void *src, size_t size, size_t count, FILE *f, const char *path,
                  const char *func, const char *file, int line) {
    size_t put = fwrite(src, size, count, f);
    if (put == count) return;
    char detail[1024];
    snprintf(detail, sizeof detail, "writing '%s' failed after %zu of %zu items: %s",
             path, put, count, strerror(errno));
    llmc_check_failed("fwrite", detail, "check free disk space and permissions", func, file, line);
}

void *malloc_check(size_t bytes, const char *what, const char *func, const char *file, int line) {
    void *p = malloc(bytes ? bytes : 1);
    if (p) return p;
    char detail[512];
    snprintf(detail, sizeof detail, "out of memory allocating %zu bytes (%.1f MiB) for %s",
             bytes, bytes / 1048576.0, what);
    llmc_check_failed("malloc", detail, "use a smaller batch (-b), sequence length (-t) or model",
                      func, file, line);
}

void *calloc_check(size_t count, size_t size, const char *what, const char *func, const char *file, int line) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (p) return p;
    char detail[512];
    snprintf(detail, sizeof detail, "out of memory allocating %zu x %zu bytes for %s", count, size, what);
    llmc_check_failed("calloc", detail, "use a smaller batch (-b), sequence length (-t) or model",
                      func, file, line);
}

const char *file_kind_name(unsigned mode) {
    switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    default: return "not a regular file";
    }
}

FILE *fopen_regular(const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        const int e = errno;
        struct stat ls;
        if (e == ENOENT && lstat(path, &ls) == 0 && S_ISLNK(ls.st_mode))
            snprintf(err, errlen, "cannot open '%s': a symbolic link to nothing (its target does not exist)", path);
        else if (e == ELOOP)
            snprintf(err, errlen, "cannot open '%s': a symbolic link loop (%s)", path, strerror(e));
        else
            snprintf(err, errlen, "cannot open '%s': %s", path, strerror(e));
        return NULL;
    }
    struct stat st = {0};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "'%s' is %s, not a regular file", path, file_kind_name(st.st_mode));
        close(fd);
        return NULL;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

int regular_file_status(const char *path, char *err, size_t errlen) {
    struct stat ls;
    if (lstat(path, &ls) != 0 && (errno == ENOENT || errno == ENOTDIR)) return 0;
    FILE *f = fopen_regular(path, err, errlen);
    if (!f) return -1;
    fclose(f);
    return 1;
}
