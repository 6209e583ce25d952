/*
 * fuzz_common.c - fuzz_call() and the temporary directory of fuzz.h.
 *
 * The link wraps (-Wl,--wrap=NAME, mk/fuzz.mk's FUZZ_WRAP) send every call of NAME in the
 * binary to __wrap_NAME here, which calls the real one (__real_NAME). While fuzz_call() runs a
 * parser ("armed"), each wrapper also records what was acquired and forgets what was released;
 * __wrap_exit jumps back into fuzz_call(), which releases what is still recorded, newest first.
 * Outside fuzz_call() the wrappers only pass the call on.
 */
#include "test/fuzz/fuzz.h"

#include <dirent.h>
#include <fcntl.h>
#include <glob.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void __real_exit(int status) __attribute__((noreturn));
void *__real_malloc(size_t n);
void *__real_calloc(size_t count, size_t size);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
FILE *__real_fopen(const char *path, const char *mode);
int __real_fclose(FILE *f);
int __real_open(const char *path, int flags, ...);
int __real_close(int fd);
void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
int __real_munmap(void *addr, size_t len);
int __real_glob(const char *pattern, int flags, int (*errfunc)(const char *, int), glob_t *g);
void __real_globfree(glob_t *g);

void fuzz_fail(const char *fmt, ...) {
    va_list ap;
    fputs("fuzz target: broken promise: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

/* ---- what the parser under fuzz_call() holds --------------------------------------------- */

typedef enum { HELD_HEAP, HELD_FILE, HELD_FD, HELD_MAP, HELD_GLOB } HeldKind;

typedef struct {
    HeldKind kind;
    void *p;      /* heap block, FILE *, mapping address, or gl_pathv */
    size_t len;   /* mapping length */
    int fd;
    glob_t g;     /* a copy of the caller's glob_t (the caller's may be on a stack that is gone) */
} Held;

static Held *held;
static size_t nheld, capheld;
static int armed;
static jmp_buf *exit_jump;
static int exit_status;

static void hold(Held h) {
    if (nheld == capheld) {
        capheld = capheld ? 2 * capheld : 256;
        held = __real_realloc(held, capheld * sizeof *held);
        if (!held) fuzz_fail("out of memory tracking resources");
    }
    held[nheld++] = h;
}

/* Forgets the newest record of kind with pointer p (or descriptor fd); no record is fine
 * (acquired before fuzz_call, or inside the C library). */
static void unhold(HeldKind kind, const void *p, int fd) {
    for (size_t i = nheld; i-- > 0;) {
        if (held[i].kind != kind) continue;
        if (kind == HELD_FD ? held[i].fd != fd : held[i].p != p) continue;
        held[i] = held[--nheld];
        return;
    }
}

/* After an exit(): what the process's exit would have released. */
static void release_all(void) {
    while (nheld > 0) {
        Held *h = &held[--nheld];
        switch (h->kind) {
        case HELD_HEAP: __real_free(h->p); break;
        case HELD_FILE: __real_fclose((FILE *)h->p); break;
        case HELD_FD: __real_close(h->fd); break;
        case HELD_MAP: __real_munmap(h->p, h->len); break;
        case HELD_GLOB: __real_globfree(&h->g); break;
        }
    }
}

/* Drops every record without releasing anything, and wipes the table so that it does not
 * keep a leaked block reachable in LeakSanitizer's eyes. */
static void forget_all(void) {
    if (held) memset(held, 0, capheld * sizeof *held);
    nheld = 0;
}

int fuzz_call(void (*fn)(void *), void *arg) {
    if (armed) fuzz_fail("fuzz_call is not reentrant");
    jmp_buf env;
    forget_all();
    exit_jump = &env;
    if (setjmp(env) == 0) {
        armed = 1;
        fn(arg);
        armed = 0;
        forget_all();
        return -1;
    }
    armed = 0;
    release_all();
    forget_all();
    return exit_status;
}

/* ---- the wrappers ------------------------------------------------------------------------ */

void __wrap_exit(int status) {
    if (!armed) __real_exit(status);
    exit_status = status;
    fflush(stdout);
    fflush(stderr);
    longjmp(*exit_jump, 1);
}

void *__wrap_malloc(size_t n) {
    void *p = __real_malloc(n);
    if (armed && p) hold((Held){.kind = HELD_HEAP, .p = p});
    return p;
}

void *__wrap_calloc(size_t count, size_t size) {
    void *p = __real_calloc(count, size);
    if (armed && p) hold((Held){.kind = HELD_HEAP, .p = p});
    return p;
}

void *__wrap_realloc(void *p, size_t n) {
    void *q = __real_realloc(p, n);
    if (armed && p && (q || n == 0)) unhold(HELD_HEAP, p, 0); /* moved, or freed by realloc(p, 0) */
    if (armed && q) hold((Held){.kind = HELD_HEAP, .p = q});
    return q;
}

void __wrap_free(void *p) {
    if (armed && p) unhold(HELD_HEAP, p, 0);
    __real_free(p);
}

FILE *__wrap_fopen(const char *path, const char *mode) {
    FILE *f = __real_fopen(path, mode);
    if (armed && f) hold((Held){.kind = HELD_FILE, .p = f});
    return f;
}

int __wrap_fclose(FILE *f) {
    if (armed && f) unhold(HELD_FILE, f, 0);
    return __real_fclose(f);
}

int __wrap_open(const char *path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    int fd = __real_open(path, flags, mode);
    if (armed && fd >= 0) hold((Held){.kind = HELD_FD, .fd = fd});
    return fd;
}

int __wrap_close(int fd) {
    if (armed) unhold(HELD_FD, NULL, fd);
    return __real_close(fd);
}

void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    void *p = __real_mmap(addr, len, prot, flags, fd, off);
    if (armed && p != MAP_FAILED) hold((Held){.kind = HELD_MAP, .p = p, .len = len});
    return p;
}

int __wrap_munmap(void *addr, size_t len) {
    if (armed) unhold(HELD_MAP, addr, 0);
    return __real_munmap(addr, len);
}

int __wrap_glob(const char *pattern, int flags, int (*errfunc)(const char *, int), glob_t *g) {
    int rc = __real_glob(pattern, flags, errfunc, g);
    if (armed && g->gl_pathv) hold((Held){.kind = HELD_GLOB, .p = g->gl_pathv, .g = *g});
    return rc;
}

void __wrap_globfree(glob_t *g) {
    if (armed) unhold(HELD_GLOB, g->gl_pathv, 0);
    __real_globfree(g);
}

/* ---- the temporary directory ------------------------------------------------------------- */

static char tmpdir[4096];

static void remove_tmpdir(void) {
    DIR *d = opendir(tmpdir);
    if (d) {
        struct dirent *e;
        char path[8192];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(path, sizeof path, "%s/%s", tmpdir, e->d_name);
                unlink(path);
            }
        closedir(d);
    }
    rmdir(tmpdir);
}

const char *fuzz_tmpdir(void) {
    if (tmpdir[0]) return tmpdir;
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/llmc_fuzz_XXXXXX", base && base[0] ? base : "/tmp");
    if (!mkdtemp(tmpdir)) fuzz_fail("cannot create a temporary directory from '%s'", tmpdir);
    atexit(remove_tmpdir);
    return tmpdir;
}

void fuzz_write_file(const char *name, const void *data, size_t size, char *path, size_t pathlen) {
    snprintf(path, pathlen, "%s/%s", fuzz_tmpdir(), name);
    FILE *f = __real_fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || __real_fclose(f) != 0)
        fuzz_fail("cannot write '%s'", path);
}

int fuzz_file_target(const char *name, const uint8_t *data, size_t size, void (*fn)(void *)) {
    char path[4200];
    fuzz_write_file(name, data, size, path, sizeof path);
    FuzzFile in = {path, data, size};
    fuzz_call(fn, &in);
    return 0;
}
