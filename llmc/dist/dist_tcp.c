/*
 * dist_tcp.c - the process group over TCP sockets: -pi tcp (rank 0 listens on -ps HOST[:PORT])
 * and -pi fs (rank 0 listens on a port the OS picks and publishes it in -pf DIR). No MPI.
 *
 * Topology: a star. Every rank > 0 has one connection, to rank 0; rank 0 has one to each.
 *   reduce-scatter  each rank sends its whole buffer; rank 0 sums chunk by chunk in rank order
 *                   ((r0 + r1) + r2 ...: deterministic, and with 2 ranks the same bits as any
 *                   order, so the same as MPI's) and sends each rank its run of the sum
 *   all-gather      each rank sends its run; rank 0 sends everyone the whole
 *   gather          each rank sends its run to rank 0
 *   broadcast       rank 0 sends to each; barrier: a header each way
 * Every message starts with a header (magic, kind, collective number, payload bytes), checked on
 * arrival: ranks that are out of step stop naming both collectives.
 *
 * Faults: every socket is nonblocking and every wait is a poll() bounded by --dist-timeout
 * (d->timeout_s, counted from the last byte that moved; the other ranks wait a grace period
 * longer than rank 0, which decides). A connection that closes names its rank at once. Rank 0,
 * before it exits, finishes any message it had begun to send and then sends each other rank an
 * ABORT header naming the failed rank, which that rank reads in place of its next message (or
 * while it sends) and exits naming it. So every rank exits 1 with an error naming the rank that
 * died or hung.
 *
 * Heartbeat: during work rank 0 announced (dist_busy_begin: it runs no collective then) a thread
 * of rank 0 sends each other rank a BUSY header every dist_heartbeat_s, between messages; a rank
 * reads it wherever a header may come (in place of its next message's, or unasked), counts its
 * deadline from it and reads on. A heartbeat cut short (the peer does not read) is finished by
 * dist_busy_end within --dist-timeout, or that rank is named as hung.
 *
 * Startup: a rank > 0 connects (retrying until the deadline), sends a hello (rank, size, the fs
 * token, its host name); rank 0 accepts until all P - 1 have said hello, then answers each with
 * its local rank (ranks on the same host, counted in rank order).
 */
#include "llmc/dist/dist_ops.h"
#include "llmc/core/atomicfile.h"
#include "llmc/core/check.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { DEFAULT_PORT = 12345, HELLO_MAGIC = 0x6c6c6d48, HDR_MAGIC = 0x6c6c6d54, VERSION = 1 };
enum { K_DATA = 1, K_ABORT = 2, K_BUSY = 3 };
enum { WHY_CLOSED = 1, WHY_SILENT = 2, WHY_STEP = 3 };
enum { OK = 0, BAD_TOKEN = 1, BAD_SIZE = 2, DUP_RANK = 3 };

typedef struct {
    uint32_t magic, kind;
    uint64_t collective, bytes, arg; /* arg (ABORT): the failed rank | why << 32; (BUSY): DistBusy */
} Hdr;

typedef struct {
    uint32_t magic, version;
    int32_t rank, size;
    char token[40], host[64];
} Hello;

typedef struct {
    uint32_t magic, status;
    int32_t local_rank, size;
} Welcome;

struct Io;
typedef struct {
    int *fd; /* by rank: rank 0 has one to each other rank, the others fd[0] only; -1 elsewhere */
    float *chunk; /* rank 0's receive buffers for a reduce-scatter: one chunk per rank */
    /* rank 0's heartbeat (dist_busy_begin): the thread, and per rank the BUSY header in flight */
    pthread_t beat;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, what;
    struct Io *beat_io; /* (size) */
    int *gone;          /* (size) a rank whose connection failed a heartbeat: none sent to it any more */
    int heard;          /* a rank > 0: the work of rank 0's last heartbeat since its last message; -1: none */
} Tcp;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void nap_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- moving bytes ----------------------------------------------------------------------
 * An Io is one peer's part of a step: up to two segments out (a header, a payload) and two in
 * (a header checked on arrival, then the payload it announces). xfer() moves every Io's bytes at
 * once. */
typedef struct {
    char *p;
    size_t n;
} Seg;
typedef struct Io {
    int peer;
    Seg out[2], in[2];
    int nout, nin, oi, ii;   /* segments, and the one in progress */
    size_t oo, io;           /* bytes of it done */
    Hdr hdr_out, hdr_in;
    int has_hdr;             /* in[0] is a header (hdr_in) */
    size_t expect;           /* payload bytes the incoming header must announce */
} Io;

static Tcp *tcp_of(Dist *d) { return (Tcp *)d->transport; }

static void io_send(Dist *d, Io *io, int peer, const void *payload, size_t bytes) {
    io->peer = peer;
    io->hdr_out = (Hdr){HDR_MAGIC, K_DATA, d->collectives, bytes, 0};
    io->out[0] = (Seg){(char *)&io->hdr_out, sizeof(Hdr)};
    io->out[1] = (Seg){(char *)payload, bytes};
    io->nout = 2;
}
static void io_recv(Io *io, int peer, void *payload, size_t bytes) {
    io->peer = peer;
    io->in[0] = (Seg){(char *)&io->hdr_in, sizeof(Hdr)};
    io->in[1] = (Seg){(char *)payload, bytes};
    io->nin = 2;
    io->has_hdr = 1;
    io->expect = bytes;
}

static const char *why_text(int why) {
    return why == WHY_CLOSED ? "closed its connection (it died, or stopped on an error of its own)"
           : why == WHY_SILENT ? "moved no data within --dist-timeout (hung, stopped or dead)"
                               : "is out of step with rank 0 (in another collective)";
}

/* Sends what is left of io's current message to its peer within seconds (best effort). */
static void finish_quietly(Dist *d, Io *io, double seconds) {
    int fd = tcp_of(d)->fd[io->peer];
    double end = now_s() + seconds;
    while (io->oi < io->nout && now_s() < end) {
        Seg *s = &io->out[io->oi];
        if (io->oo == s->n) {
            io->oi++, io->oo = 0;
            continue;
        }
        struct pollfd p = {fd, POLLOUT, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        ssize_t k = send(fd, s->p + io->oo, s->n - io->oo, MSG_NOSIGNAL);
        if (k <= 0 && errno != EAGAIN && errno != EINTR) return;
        if (k > 0) io->oo += (size_t)k;
    }
}

/* A rank failed (culprit, why): rank 0 tells the others, then every rank stops naming it. */
static void fail(Dist *d, Io *io, int n, int culprit, int why, const char *what, const char *detail) {
    if (d->rank == 0) {
        Tcp *t = tcp_of(d);
        for (int r = 1; r < d->size; r++) {
            if (r == culprit || t->fd[r] < 0) continue;
            Io abort = {0};
            for (int i = 0; i < n; i++) /* a message begun: finish it, so the header starts one */
                if (io[i].peer == r && (io[i].oi > 0 || io[i].oo > 0)) finish_quietly(d, &io[i], 2.0);
            abort.peer = r;
            abort.hdr_out = (Hdr){HDR_MAGIC, K_ABORT, d->collectives, 0, (uint64_t)culprit | (uint64_t)why << 32};
            abort.out[0] = (Seg){(char *)&abort.hdr_out, sizeof(Hdr)};
            abort.nout = 1;
            finish_quietly(d, &abort, 1.0);
        }
    }
    llmc_die("rank %d: the %s (collective #%llu) over -pi tcp/fs failed: rank %d %s%s%s", d->rank, what, d->collectives,
             culprit, why_text(why), detail[0] ? "; " : "", detail);
}

/* A header arrived from peer: an ABORT (from rank 0) names the failed rank; a BUSY one (rank 0's
 * heartbeat) returns 1, to be read past; else it must be this collective's with the payload
 * expected (returns 0). (io, n: the step's transfers, for fail) */
static int check_header(Dist *d, Io *io, int n, int peer, const Hdr *h, const char *what, size_t expect) {
    char detail[160];
    if (h->magic != HDR_MAGIC) {
        snprintf(detail, sizeof detail, "its message does not start with a header (a stray connection, or a bug)");
        fail(d, io, n, peer, WHY_STEP, what, detail);
    }
    if (h->kind == K_BUSY && d->rank != 0) {
        tcp_of(d)->heard = (int)h->arg;
        return 1;
    }
    if (h->kind == K_ABORT && d->rank != 0) {
        int culprit = (int)(h->arg & 0xffffffffu), why = (int)(h->arg >> 32);
        llmc_die("rank %d: the %s (collective #%llu) over -pi tcp/fs failed: rank %d %s (reported by rank 0)", d->rank, what,
                 d->collectives, culprit, why_text(why));
    }
    if (h->kind != K_DATA || h->collective != d->collectives || h->bytes != expect) {
        snprintf(detail, sizeof detail, "it sent collective #%llu with %llu bytes where this rank expects #%llu with %zu",
                 (unsigned long long)h->collective, (unsigned long long)h->bytes, d->collectives, expect);
        fail(d, io, n, peer, WHY_STEP, what, detail);
    }
    tcp_of(d)->heard = -1;
    return 0;
}

/* Reads a message nobody expects from peer (rank 0: its connection closed, or it is out of
 * step; the others: rank 0's ABORT, or its heartbeat) and fails accordingly; returns after a
 * heartbeat when may_return (it came while this rank only sends), else reads on past it (a
 * failed send: rank 0's ABORT may follow). */
static void unexpected(Dist *d, Io *io, int n, int peer, const char *what, int may_return) {
    const int fd = tcp_of(d)->fd[peer];
    for (;;) {
        Hdr h;
        size_t got = 0;
        double end = now_s() + 1.0;
        while (got < sizeof h && now_s() < end) {
            ssize_t k = recv(fd, (char *)&h + got, sizeof h - got, 0);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) break;
            if (k > 0) got += (size_t)k;
            else {
                struct pollfd p = {fd, POLLIN, 0};
                poll(&p, 1, 50);
            }
        }
        if (got != sizeof h || !check_header(d, io, n, peer, &h, what, (size_t)-1)) break;
        if (may_return) return;
    }
    fail(d, io, n, peer, WHY_CLOSED, what, "");
}

/* Tests only: LLMC_TEST_EXIT_BEFORE=R:WHAT makes rank R exit (status 3) as it enters the first
 * collective named WHAT ("broadcast", "barrier", ...), telling no one; rank 0 first waits (up to
 * --dist-timeout) until R's connection has closed, so it meets the closed connection inside that
 * collective whatever the timing. test_dist.py: a peer that dies while rank 0 is only sending to
 * it (a broadcast) is named. */
static void test_exit_before(Dist *d, const char *what) {
    static int done;
    const char *e = getenv("LLMC_TEST_EXIT_BEFORE");
    int rank, at = 0;
    if (done || !e || sscanf(e, "%d:%n", &rank, &at) != 1 || at == 0 || strcmp(e + at, what) != 0) return;
    done = 1;
    if (d->rank == rank) {
        fprintf(stderr, "rank %d: LLMC_TEST_EXIT_BEFORE: exiting as the %s begins\n", rank, what);
        _exit(3);
    }
    if (d->rank == 0 && rank > 0 && rank < d->size) {
        struct pollfd p = {tcp_of(d)->fd[rank], POLLIN, 0};
        poll(&p, 1, (int)(d->timeout_s * 1e3));
    }
}

static void xfer(Dist *d, Io *io, int n, const char *what) {
    test_exit_before(d, what);
    Tcp *t = tcp_of(d);
    struct pollfd *p = (struct pollfd *)mallocCheck((size_t)n * sizeof *p, "poll set");
    int *which = (int *)mallocCheck((size_t)n * sizeof(int), "poll set");
    double limit = d->timeout_s + (d->rank == 0 ? 0.0 : (d->timeout_s / 2 < 10.0 ? d->timeout_s / 2 : 10.0));
    double last = now_s();
    for (;;) {
        int np = 0;
        for (int i = 0; i < n; i++) {
            Io *x = &io[i];
            while (x->oi < x->nout && x->oo == x->out[x->oi].n) x->oi++, x->oo = 0;
            while (x->ii < x->nin && x->io == x->in[x->ii].n) x->ii++, x->io = 0;
            if (x->oi == x->nout && x->ii == x->nin) continue;
            p[np] = (struct pollfd){t->fd[x->peer], (short)(POLLIN | (x->oi < x->nout ? POLLOUT : 0)), 0};
            which[np++] = i;
        }
        if (np == 0) break;
        double left = limit - (now_s() - last);
        if (left <= 0) {
            Io *x = &io[which[0]];
            char detail[128];
            if (t->heard >= 0)
                snprintf(detail, sizeof detail, "waited %g s since its last heartbeat (it said it was %s)", limit,
                         dist_busy_name(t->heard));
            else snprintf(detail, sizeof detail, "waited %g s", limit);
            fail(d, io, n, x->peer, WHY_SILENT, what, detail);
        }
        int k = poll(p, (nfds_t)np, (int)(left * 1e3) + 1);
        if (k < 0 && errno != EINTR) llmc_die("rank %d: poll failed in the %s: %s", d->rank, what, strerror(errno));
        for (int j = 0; j < np && k > 0; j++) {
            Io *x = &io[which[j]];
            int fd = p[j].fd;
            if (p[j].revents & (POLLIN | POLLHUP | POLLERR)) {
                if (x->ii == x->nin) { /* (rank 0's heartbeat: read, and the clock restarts) */
                    unexpected(d, io, n, x->peer, what, 1);
                    last = now_s();
                    continue;
                }
                Seg *s = &x->in[x->ii];
                ssize_t got = recv(fd, s->p + x->io, s->n - x->io, 0);
                if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
                    char detail[96] = "";
                    if (got < 0) snprintf(detail, sizeof detail, "%s", strerror(errno));
                    fail(d, io, n, x->peer, WHY_CLOSED, what, detail);
                }
                if (got > 0) {
                    x->io += (size_t)got, last = now_s();
                    if (x->has_hdr && x->ii == 0 && x->io == s->n &&
                        check_header(d, io, n, x->peer, &x->hdr_in, what, x->expect))
                        x->io = 0; /* a heartbeat: the message's own header comes next */
                }
            }
            if ((p[j].revents & POLLOUT) && x->oi < x->nout) {
                Seg *s = &x->out[x->oi];
                ssize_t put = send(fd, s->p + x->oo, s->n - x->oo, MSG_NOSIGNAL);
                if (put < 0 && errno != EAGAIN && errno != EINTR) {
                    if (d->rank != 0) unexpected(d, io, n, x->peer, what, 0); /* rank 0's ABORT may be waiting */
                    fail(d, io, n, x->peer, WHY_CLOSED, what, strerror(errno));
                }
                if (put > 0) x->oo += (size_t)put, last = now_s();
            }
        }
    }
    free(p);
    free(which);
}

/* ---- the collectives (dist_ops.h) ---- */
enum { CHUNK_FLOATS = 1 << 18 };

static void tcp_reduce_scatter_f32(Dist *d, const float *send, float *recv, const int *counts, const char *what) {
    const int P = d->size;
    size_t total = 0;
    for (int r = 0; r < P; r++) total += (size_t)counts[r];
    Io *io = (Io *)callocCheck((size_t)P, sizeof(Io), "transfers");
    if (d->rank != 0) { /* everything to rank 0, this rank's run of the sum back */
        io_send(d, io, 0, send ? send : recv, total * sizeof(float));
        io_recv(io, 0, recv, (size_t)counts[d->rank] * sizeof(float));
        xfer(d, io, 1, what);
        free(io);
        return;
    }
    float *sum = recv;
    if (send) { /* not in place: the sum in a buffer of its own */
        sum = (float *)mallocCheck((total ? total : 1) * sizeof(float), "reduce-scatter sum");
        memcpy(sum, send, total * sizeof(float));
    }
    Tcp *t = tcp_of(d);
    for (size_t c0 = 0; c0 < total || c0 == 0; c0 += CHUNK_FLOATS) {
        size_t c = total - c0 < CHUNK_FLOATS ? total - c0 : CHUNK_FLOATS;
        for (int r = 1; r < P; r++) { /* the header comes with the first chunk only */
            Io *x = &io[r - 1];
            memset(x, 0, sizeof *x);
            x->peer = r;
            if (c0 == 0) {
                io_recv(x, r, t->chunk + (size_t)(r - 1) * CHUNK_FLOATS, c * sizeof(float));
                x->expect = total * sizeof(float);
            } else {
                x->in[0] = (Seg){(char *)(t->chunk + (size_t)(r - 1) * CHUNK_FLOATS), c * sizeof(float)};
                x->nin = 1;
            }
        }
        xfer(d, io, P - 1, what);
        for (int r = 1; r < P; r++) { /* in rank order */
            const float *in = t->chunk + (size_t)(r - 1) * CHUNK_FLOATS;
            for (size_t i = 0; i < c; i++) sum[c0 + i] += in[i];
        }
        if (total == 0) break;
    }
    size_t off = (size_t)counts[0];
    for (int r = 1; r < P; r++) {
        memset(&io[r - 1], 0, sizeof(Io));
        io_send(d, &io[r - 1], r, sum + off, (size_t)counts[r] * sizeof(float));
        off += (size_t)counts[r];
    }
    xfer(d, io, P - 1, what);
    if (send) {
        memcpy(recv, sum, (size_t)counts[0] * sizeof(float));
        free(sum);
    }
    free(io);
}

static void tcp_allgatherv(Dist *d, void *buf, const int *counts, const int *displs, DistType type, const char *what) {
    const int P = d->size;
    const size_t es = dist_type_size(type);
    size_t total = 0;
    for (int r = 0; r < P; r++) {
        if (r && displs[r] != displs[r - 1] + counts[r - 1]) llmc_die("internal: -pi tcp/fs all-gathers runs back to back");
        total += (size_t)counts[r];
    }
    char *base = (char *)buf + (size_t)displs[0] * es, *run = (char *)buf + (size_t)displs[d->rank] * es;
    Io *io = (Io *)callocCheck((size_t)P, sizeof(Io), "transfers");
    if (d->rank != 0) {
        io_send(d, io, 0, run, (size_t)counts[d->rank] * es);
        io_recv(io, 0, base, total * es);
        xfer(d, io, 1, what);
    } else {
        for (int r = 1; r < P; r++) io_recv(&io[r - 1], r, (char *)buf + (size_t)displs[r] * es, (size_t)counts[r] * es);
        xfer(d, io, P - 1, what);
        memset(io, 0, (size_t)P * sizeof(Io));
        for (int r = 1; r < P; r++) io_send(d, &io[r - 1], r, base, total * es);
        xfer(d, io, P - 1, what);
    }
    free(io);
}

static void tcp_allgatherv_begin(Dist *d, float *buf, const int *counts, const int *displs, DistRequest *req) {
    tcp_allgatherv(d, buf, counts, displs, DIST_F32, "parameter all-gather");
    req->active = 0; /* complete */
}
static void tcp_wait(Dist *d, DistRequest *req, const char *what) { (void)d, (void)req, (void)what; }

static void tcp_gatherv_f32(Dist *d, const float *shard, float *full, const int *counts, const int *displs, const char *what) {
    const int P = d->size;
    Io *io = (Io *)callocCheck((size_t)P, sizeof(Io), "transfers");
    if (d->rank != 0) {
        io_send(d, io, 0, shard, (size_t)counts[d->rank] * sizeof(float));
        xfer(d, io, 1, what);
    } else {
        if (full + displs[0] != shard) memmove(full + displs[0], shard, (size_t)counts[0] * sizeof(float));
        for (int r = 1; r < P; r++) io_recv(&io[r - 1], r, full + displs[r], (size_t)counts[r] * sizeof(float));
        xfer(d, io, P - 1, what);
    }
    free(io);
}

static void tcp_bcast(Dist *d, void *buf, size_t bytes, const char *what) {
    const int P = d->size;
    Io *io = (Io *)callocCheck((size_t)P, sizeof(Io), "transfers");
    if (d->rank != 0) io_recv(io, 0, buf, bytes);
    else
        for (int r = 1; r < P; r++) io_send(d, &io[r - 1], r, buf, bytes);
    xfer(d, io, d->rank ? 1 : P - 1, what);
    free(io);
}

static void tcp_barrier(Dist *d, const char *what) {
    const int P = d->size;
    Io *io = (Io *)callocCheck((size_t)P, sizeof(Io), "transfers");
    if (d->rank != 0) {
        io_send(d, io, 0, NULL, 0);
        io_recv(io, 0, NULL, 0);
        xfer(d, io, 1, what);
    } else {
        for (int r = 1; r < P; r++) io_recv(&io[r - 1], r, NULL, 0);
        xfer(d, io, P - 1, what);
        memset(io, 0, (size_t)P * sizeof(Io));
        for (int r = 1; r < P; r++) io_send(d, &io[r - 1], r, NULL, 0);
        xfer(d, io, P - 1, what);
    }
    free(io);
}

/* ---- rank 0's heartbeat (dist_busy_begin) ---- */

/* Sends what the socket takes now of rank r's BUSY header in flight (a new one when none is and
 * start is set); a rank whose connection failed gets none any more (its next collective names it). */
static void beat_once(Dist *d, int r, int start) {
    Tcp *t = tcp_of(d);
    Io *io = &t->beat_io[r];
    if (t->gone[r]) return;
    if (io->oo == io->out[0].n) {
        if (!start) return;
        io->hdr_out = (Hdr){HDR_MAGIC, K_BUSY, d->collectives, 0, (uint64_t)t->what};
        io->out[0] = (Seg){(char *)&io->hdr_out, sizeof(Hdr)};
        io->peer = r, io->nout = 1, io->oi = 0, io->oo = 0; /* (fail finishes it when begun) */
    }
    while (io->oo < io->out[0].n) {
        ssize_t k = send(t->fd[r], io->out[0].p + io->oo, io->out[0].n - io->oo, MSG_NOSIGNAL);
        if (k < 0 && (errno == EAGAIN || errno == EINTR)) return; /* the rest at the next beat */
        if (k <= 0) {
            t->gone[r] = 1;
            return;
        }
        io->oo += (size_t)k;
    }
}

static void *heartbeat_main(void *arg) {
    Dist *d = (Dist *)arg;
    Tcp *t = tcp_of(d);
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        for (int r = 1; r < d->size; r++) beat_once(d, r, 1);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double at = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + dist_heartbeat_s(d);
        ts.tv_sec = (time_t)at;
        ts.tv_nsec = (long)((at - (double)ts.tv_sec) * 1e9);
        while (!t->stop && pthread_cond_timedwait(&t->cv, &t->mu, &ts) == 0) {}
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* Starts (what >= 0) or stops the heartbeat; stopping finishes every header cut short within
 * --dist-timeout (the stream must stay whole), or names the rank that would not read it. */
static void tcp_busy(Dist *d, int what) {
    Tcp *t = tcp_of(d);
    if (what >= 0) {
        t->what = what, t->stop = 0;
        /* the first heartbeat now, before the work starts: the others hear that rank 0 is busy
         * whatever the thread's start-up takes (the thread then beats every dist_heartbeat_s) */
        pthread_mutex_lock(&t->mu);
        for (int r = 1; r < d->size; r++) beat_once(d, r, 1);
        pthread_mutex_unlock(&t->mu);
        if (pthread_create(&t->beat, NULL, heartbeat_main, d) != 0) llmc_die("rank 0: cannot start the heartbeat thread");
        return;
    }
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->beat, NULL);
    const double end = now_s() + d->timeout_s;
    for (int r = 1; r < d->size; r++) {
        Io *io = &t->beat_io[r];
        while (!t->gone[r] && io->oo < io->out[0].n && now_s() < end) {
            struct pollfd p = {t->fd[r], POLLOUT, 0};
            poll(&p, 1, 50);
            beat_once(d, r, 0);
        }
        if (!t->gone[r] && io->oo < io->out[0].n)
            fail(d, t->beat_io + 1, d->size - 1, r, WHY_SILENT, "heartbeat", "it did not read rank 0's heartbeat");
    }
}

static void tcp_finalize(Dist *d) {
    Tcp *t = tcp_of(d);
    for (int r = 0; r < d->size; r++)
        if (t->fd[r] >= 0) close(t->fd[r]);
    free(t->fd);
    free(t->chunk);
    free(t->beat_io);
    free(t->gone);
    free(t);
    d->transport = NULL;
}

/* Expert parallelism's all-to-all, through rank 0 (every rank talks to it): the others send it
 * their counts, then their runs packed in destination order; rank 0 hands each rank the runs
 * addressed to it, in source-rank order. */
static void tcp_alltoallv(Dist *d, const void *send, const int *scounts, const int *sdispls, void *recv, const int *rcounts,
                          const int *rdispls, DistType type, const char *what) {
    const int P = d->size;
    const size_t es = dist_type_size(type);
    const char *src = (const char *)send;
    char *dst = (char *)recv;
    Io *io = (Io *)callocCheck((size_t)P, sizeof(Io), "transfers");
    if (d->rank != 0) {
        size_t out = 0, in = 0;
        for (int r = 0; r < P; r++) out += (size_t)scounts[r], in += (size_t)rcounts[r];
        char *pack = (char *)mallocCheck(out * es + 1, "all-to-all packing"), *got = (char *)mallocCheck(in * es + 1, "all-to-all packing");
        for (size_t r = 0, o = 0; r < (size_t)P; o += (size_t)scounts[r] * es, r++)
            memcpy(pack + o, src + (size_t)sdispls[r] * es, (size_t)scounts[r] * es);
        io_send(d, io, 0, scounts, (size_t)P * sizeof(int));
        xfer(d, io, 1, what);
        memset(io, 0, sizeof(Io));
        io_send(d, io, 0, pack, out * es);
        io_recv(io, 0, got, in * es);
        xfer(d, io, 1, what);
        for (size_t r = 0, o = 0; r < (size_t)P; o += (size_t)rcounts[r] * es, r++)
            memcpy(dst + (size_t)rdispls[r] * es, got + o, (size_t)rcounts[r] * es);
        free(pack), free(got), free(io);
        return;
    }
    int *cnt = (int *)mallocCheck((size_t)P * P * sizeof(int), "all-to-all counts"); /* cnt[s P + r]: s to r */
    memcpy(cnt, scounts, (size_t)P * sizeof(int));
    for (int s = 1; s < P; s++) io_recv(&io[s - 1], s, cnt + (size_t)s * P, (size_t)P * sizeof(int));
    xfer(d, io, P - 1, what);
    char **in = (char **)callocCheck((size_t)P, sizeof(char *), "all-to-all buffers");
    char **out = (char **)callocCheck((size_t)P, sizeof(char *), "all-to-all buffers");
    memset(io, 0, (size_t)P * sizeof(Io));
    for (int s = 1; s < P; s++) {
        size_t n = 0;
        for (int r = 0; r < P; r++) n += (size_t)cnt[(size_t)s * P + r];
        in[s] = (char *)mallocCheck(n * es + 1, "all-to-all buffers");
        io_recv(&io[s - 1], s, in[s], n * es);
    }
    xfer(d, io, P - 1, what);
    memset(io, 0, (size_t)P * sizeof(Io));
    for (int r = 0; r < P; r++) {
        size_t n = 0;
        for (int s = 0; s < P; s++) n += (size_t)cnt[(size_t)s * P + r];
        if (r == 0) {
            for (int s = 0; s < P; s++)
                if (cnt[(size_t)s * P] != rcounts[s])
                    llmc_die("internal: -pi tcp/fs all-to-all: rank %d sends %d to rank 0, which expects %d", s, cnt[(size_t)s * P], rcounts[s]);
        }
        char *o = r == 0 ? NULL : (out[r] = (char *)mallocCheck(n * es + 1, "all-to-all buffers"));
        size_t at = 0;
        for (int s = 0; s < P; s++) { /* s's run to r: at sdispls[r] (rank 0), else after its runs to ranks < r */
            size_t before = 0;
            for (int q = 0; q < r; q++) before += (size_t)cnt[(size_t)s * P + q];
            const char *from = s == 0 ? src + (size_t)sdispls[r] * es : in[s] + before * es;
            const size_t k = (size_t)cnt[(size_t)s * P + r] * es;
            if (r == 0) memcpy(dst + (size_t)rdispls[s] * es, from, k);
            else memcpy(o + at, from, k), at += k;
        }
        if (r) io_send(d, &io[r - 1], r, out[r], n * es);
    }
    xfer(d, io, P - 1, what);
    for (int r = 0; r < P; r++) free(in[r]), free(out[r]);
    free(in), free(out), free(cnt), free(io);
}

static const DistOps tcp_ops = {"TCP", tcp_reduce_scatter_f32, tcp_allgatherv, tcp_allgatherv_begin, tcp_wait,
                                tcp_gatherv_f32, tcp_bcast, tcp_barrier, tcp_busy, tcp_finalize, tcp_alltoallv};

/* ---- startup ---------------------------------------------------------------------------- */

/* HOST[:PORT] or [IPv6]:PORT of -ps. */
static void parse_server(const char *s, char *host, size_t len, char *port) {
    const char *colon = NULL, *h = s;
    size_t hl;
    if (s[0] == '[') {
        const char *end = strchr(s, ']');
        if (!end || (end[1] && end[1] != ':')) llmc_die("flag -ps (--server-ip) '%s': an IPv6 address is written [ADDR]:PORT", s);
        h = s + 1, hl = (size_t)(end - h), colon = end[1] ? end + 1 : NULL;
    } else {
        colon = strchr(s, ':');
        if (colon && strchr(colon + 1, ':')) llmc_die("flag -ps (--server-ip) '%s': write an IPv6 address as [ADDR]:PORT", s);
        hl = colon ? (size_t)(colon - s) : strlen(s);
    }
    if (hl == 0 || hl >= len) llmc_die("flag -ps (--server-ip) '%s': expected HOST[:PORT] (rank 0's address)", s);
    memcpy(host, h, hl);
    host[hl] = 0;
    long p = DEFAULT_PORT;
    if (colon) {
        char *end;
        errno = 0;
        p = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || *end || errno || p < 1 || p > 65535)
            llmc_die("flag -ps (--server-ip) '%s': the port must be a number 1 .. 65535", s);
    }
    snprintf(port, 8, "%ld", p);
}

static void set_socket_options(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* Rank 0's listening socket on port (of host's address family; "0": the OS picks one). */
static int listen_on(const char *host, const char *port, const char *flag, int *bound) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (host) { /* the family -ps names; listen on every address of it */
        struct addrinfo *r0 = NULL;
        int e = getaddrinfo(host, port, &hints, &r0);
        if (e) llmc_die("flag %s: cannot resolve '%s': %s", flag, host, gai_strerror(e));
        hints.ai_family = r0->ai_family;
        freeaddrinfo(r0);
    } else hints.ai_family = AF_INET;
    int e = getaddrinfo(NULL, port, &hints, &res);
    if (e) llmc_die("flag %s: cannot listen on port %s: %s", flag, port, gai_strerror(e));
    int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol), one = 1;
    if (fd < 0) llmc_die("rank 0: socket() failed: %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 128) != 0)
        llmc_die("flag %s: rank 0 cannot listen on port %s: %s (another run using it? pick another port)", flag, port,
                 strerror(errno));
    freeaddrinfo(res);
    struct sockaddr_storage a;
    socklen_t al = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &al);
    *bound = ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port : ((struct sockaddr_in *)&a)->sin_port);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

/* Reads or writes exactly n bytes of fd before the deadline; 0 on success, -1 (errno, or
 * ETIMEDOUT / ECONNRESET for a closed connection) otherwise. */
static int move_exact(int fd, void *buf, size_t n, int out, double deadline) {
    size_t done = 0;
    while (done < n) {
        double left = deadline - now_s();
        if (left <= 0) return errno = ETIMEDOUT, -1;
        struct pollfd p = {fd, (short)(out ? POLLOUT : POLLIN), 0};
        if (poll(&p, 1, (int)(left * 1e3) + 1) <= 0) continue;
        ssize_t k = out ? send(fd, (char *)buf + done, n - done, MSG_NOSIGNAL) : recv(fd, (char *)buf + done, n - done, 0);
        if (k == 0) return errno = ECONNRESET, -1;
        if (k < 0 && errno != EAGAIN && errno != EINTR) return -1;
        if (k > 0) done += (size_t)k;
    }
    return 0;
}

/* One connection attempt to host:port (family: AF_UNSPEC, or AF_INET for -pi fs, whose rank 0
 * listens on IPv4) within the deadline; the socket, or -1 (err says why). */
static int connect_once(const char *host, const char *port, int family, double deadline, char *err, size_t errlen) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_family = family;
    int e = getaddrinfo(host, port, &hints, &res);
    if (e) {
        snprintf(err, errlen, "cannot resolve '%s': %s", host, gai_strerror(e));
        return -1;
    }
    int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
    if (fd >= 0) {
        set_socket_options(fd);
        int r = connect(fd, res->ai_addr, res->ai_addrlen);
        if (r != 0 && errno == EINPROGRESS) {
            struct pollfd p = {fd, POLLOUT, 0};
            double left = deadline - now_s();
            int soerr = ETIMEDOUT;
            socklen_t sl = sizeof soerr;
            if (left > 0 && poll(&p, 1, (int)(left * 1e3) + 1) > 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
            r = soerr ? -1 : 0;
            errno = soerr;
        }
        if (r != 0) {
            snprintf(err, errlen, "%s:%s: %s", host, port, strerror(errno));
            close(fd);
            fd = -1;
        }
    } else snprintf(err, errlen, "socket(): %s", strerror(errno));
    freeaddrinfo(res);
    return fd;
}

/* -pi fs: the rendezvous file of this run in DIR. */
static void rendezvous_path(const DistFlags *f, char *path, size_t len) {
    const char *id = getenv("LLMC_RUN_ID"), *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    char sid[128];
    if (id && *id) snprintf(sid, sizeof sid, "%s", id);
    else if (job && *job) snprintf(sid, sizeof sid, "%s.%s", job, step ? step : "0");
    else snprintf(sid, sizeof sid, "default");
    for (char *c = sid; *c; c++)
        if (*c == '/') *c = '_';
    if ((size_t)snprintf(path, len, "%s/llmc-rendezvous-%s", f->fs_path, sid) >= len) llmc_die("flag -pf (--fs-path): the path is too long");
}

static void random_token(char *token, size_t len) {
    unsigned char b[16];
    FILE *u = fopen("/dev/urandom", "rb");
    if (!u || fread(b, 1, sizeof b, u) != sizeof b) llmc_die("rank 0: cannot read /dev/urandom for the -pi fs token");
    fclose(u);
    for (int i = 0; i < 16 && (size_t)(2 * i + 2) < len; i++) snprintf(token + 2 * i, 3, "%02x", b[i]);
}

/* Rank 0: listens, (fs) publishes the address, accepts every other rank's hello, answers each
 * with its local rank. */
static void serve(Dist *d, const DistFlags *f, int fs, double deadline) {
    Tcp *t = tcp_of(d);
    const int P = d->size;
    char host[256], port[8] = "0", token[40] = "", path[4200] = "";
    int bound = 0;
    if (!fs) parse_server(f->server, host, sizeof host, port);
    if (fs) {
        rendezvous_path(f, path, sizeof path);
        unlink(path); /* an earlier run's: nobody may read it any more */
        random_token(token, sizeof token);
    }
    int lfd = listen_on(fs ? NULL : host, port, fs ? "-pf (--fs-path)" : "-ps (--server-ip)", &bound);
    if (fs) {
        char me[256];
        if (gethostname(me, sizeof me) != 0) snprintf(me, sizeof me, "localhost");
        me[sizeof me - 1] = 0;
        AtomicFile af;
        atomic_open(&af, path);
        fprintf(af.f, "llmc-rendezvous %d\nhost %s\nport %d\ntoken %s\nranks %d\n", VERSION, me, bound, token, P);
        atomic_commit(&af);
    }
    char (*hosts)[64] = (char (*)[64])callocCheck((size_t)P, 64, "host names");
    if (gethostname(hosts[0], 63) != 0) snprintf(hosts[0], 64, "?");
    int joined = 1;
    while (joined < P) {
        double left = deadline - now_s();
        if (left <= 0) {
            char missing[256] = "";
            size_t k = 0;
            for (int r = 1; r < P; r++)
                if (t->fd[r] < 0 && k < sizeof missing - 16) k += (size_t)snprintf(missing + k, sizeof missing - k, "%s%d", k ? ", " : "", r);
            if (fs) unlink(path);
            llmc_die("rank 0: -pi %s: rank(s) %s did not connect within --dist-timeout %g s (not started, or started with "
                     "another %s or -pn)", fs ? "fs" : "tcp", missing, d->timeout_s, fs ? "-pf" : "-ps");
        }
        struct pollfd p = {lfd, POLLIN, 0};
        if (poll(&p, 1, (int)(left * 1e3) + 1) <= 0) continue;
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) continue;
        set_socket_options(fd);
        Hello h;
        double hello_by = now_s() + 10.0 < deadline ? now_s() + 10.0 : deadline;
        if (move_exact(fd, &h, sizeof h, 0, hello_by) != 0 || h.magic != HELLO_MAGIC || h.version != VERSION) {
            close(fd); /* not one of ours */
            continue;
        }
        h.token[sizeof h.token - 1] = h.host[sizeof h.host - 1] = 0;
        Welcome w = {HELLO_MAGIC, OK, 0, P};
        if (strcmp(h.token, token) != 0) w.status = BAD_TOKEN; /* (fs) a stale file's reader: it reads again */
        else if (h.size != P) w.status = BAD_SIZE;
        else if (h.rank < 1 || h.rank >= P || t->fd[h.rank] >= 0) w.status = DUP_RANK;
        if (w.status != OK) {
            move_exact(fd, &w, sizeof w, 1, now_s() + 1.0);
            close(fd);
            if (fs && w.status != BAD_TOKEN) unlink(path);
            if (w.status == BAD_SIZE)
                llmc_die("rank 0: a rank connected with -pn %d, this one has -pn %d: start every rank with the same -pn", h.size, P);
            if (w.status == DUP_RANK)
                llmc_die("rank 0: two processes connected as rank %d (-pr): give each process its own -pr 1 .. %d", h.rank, P - 1);
            continue;
        }
        w.local_rank = -1; /* taken: the local rank follows once every rank is in */
        if (move_exact(fd, &w, sizeof w, 1, now_s() + 10.0) != 0) {
            close(fd);
            continue;
        }
        t->fd[h.rank] = fd;
        snprintf(hosts[h.rank], 64, "%s", h.host);
        joined++;
    }
    close(lfd);
    if (fs) unlink(path); /* every rank is in: the file has done its job */
    for (int r = 1; r < P; r++) {
        Welcome w = {HELLO_MAGIC, OK, 0, P};
        for (int q = 0; q < r; q++) w.local_rank += strcmp(hosts[q], hosts[r]) == 0;
        if (move_exact(t->fd[r], &w, sizeof w, 1, deadline + 10.0) != 0)
            llmc_die("rank 0: rank %d closed its connection while the ranks were starting: %s", r, strerror(errno));
    }
    free(hosts);
}

/* -pi fs: reads rank 0's address from the rendezvous file; 0 when it is not there (yet). */
static int read_rendezvous(const char *path, char *host, size_t hl, char *port, char *token, int *ranks) {
    FILE *fp = fopen(path, "r");
    if (!fp) return 0;
    int version = 0, p = 0;
    char h[256] = "", tok[40] = "";
    int n = fscanf(fp, "llmc-rendezvous %d host %255s port %d token %39s ranks %d", &version, h, &p, tok, ranks);
    fclose(fp);
    if (n != 5 || version != VERSION) return 0;
    snprintf(host, hl, "%s", h);
    snprintf(port, 8, "%d", p);
    snprintf(token, 40, "%s", tok);
    return 1;
}

/* A rank > 0: connects to rank 0 (retrying until the deadline), says hello, takes its answer. */
static void join(Dist *d, const DistFlags *f, int fs, double deadline) {
    Tcp *t = tcp_of(d);
    char host[256], port[8], token[40] = "", err[512] = "not tried", path[4200] = "";
    if (fs) rendezvous_path(f, path, sizeof path);
    else parse_server(f->server, host, sizeof host, port);
    Hello h = {HELLO_MAGIC, VERSION, d->rank, d->size, "", ""};
    if (gethostname(h.host, sizeof h.host - 1) != 0) snprintf(h.host, sizeof h.host, "?");
    while (now_s() < deadline) {
        int ranks = d->size;
        if (fs && !read_rendezvous(path, host, sizeof host, port, token, &ranks)) {
            snprintf(err, sizeof err, "no rendezvous file %s yet", path);
            nap_ms(50);
            continue;
        }
        if (ranks != d->size)
            llmc_die("rank %d: -pn %d, but rank 0 (in %s) has -pn %d: start every rank with the same -pn", d->rank, d->size, path, ranks);
        int fd = connect_once(host, port, fs ? AF_INET : AF_UNSPEC, deadline, err, sizeof err);
        if (fd < 0) {
            nap_ms(50);
            continue;
        }
        snprintf(h.token, sizeof h.token, "%s", token);
        Welcome w;
        double ack_by = now_s() + 10.0 < deadline ? now_s() + 10.0 : deadline;
        if (move_exact(fd, &h, sizeof h, 1, deadline) != 0 || move_exact(fd, &w, sizeof w, 0, ack_by) != 0 ||
            w.magic != HELLO_MAGIC) {
            snprintf(err, sizeof err, "%s:%s accepted the connection but did not answer as rank 0 of llmc (%s)", host, port,
                     strerror(errno));
            close(fd);
            nap_ms(50);
            continue;
        }
        if (w.status == BAD_TOKEN) { /* a stale file: another run's rank 0 */
            snprintf(err, sizeof err, "%s names a rank 0 of another run", path);
            close(fd);
            nap_ms(50);
            continue;
        }
        if (w.status == BAD_SIZE)
            llmc_die("rank %d: -pn %d, but rank 0 has -pn %d: start every rank with the same -pn", d->rank, d->size, w.size);
        if (w.status == DUP_RANK)
            llmc_die("rank %d: another process already joined as -pr %d: give each process its own -pr", d->rank, d->rank);
        /* taken; rank 0 sends the local rank once every rank is in */
        if (move_exact(fd, &w, sizeof w, 0, deadline + 10.0) != 0 || w.magic != HELLO_MAGIC || w.local_rank < 0)
            llmc_die("rank %d: -pi %s: rank 0 took this rank but did not finish starting the group within --dist-timeout %g s "
                     "(%s): see rank 0's error", d->rank, fs ? "fs" : "tcp", d->timeout_s, strerror(errno));
        t->fd[0] = fd;
        d->local_rank = w.local_rank;
        return;
    }
    if (fs)
        llmc_die("rank %d: -pi fs: found no rank 0 through -pf (--fs-path) %s within --dist-timeout %g s (last: %s): is rank 0 "
                 "running with the same -pf (and LLMC_RUN_ID / Slurm job)?", d->rank, f->fs_path, d->timeout_s, err);
    llmc_die("rank %d: -pi tcp: could not reach rank 0 at -ps (--server-ip) %s within --dist-timeout %g s (last: %s): is rank 0 "
             "running, and is the address right?", d->rank, f->server, d->timeout_s, err);
}

void dist_tcp_join(Dist *d, const DistFlags *f, int size, int rank) {
    const int fs = strcmp(f->init, "fs") == 0;
    d->size = size;
    d->rank = rank;
    Tcp *t = (Tcp *)callocCheck(1, sizeof *t, "tcp transport");
    t->fd = (int *)mallocCheck((size_t)d->size * sizeof(int), "tcp transport");
    for (int r = 0; r < d->size; r++) t->fd[r] = -1;
    t->beat_io = (Io *)callocCheck((size_t)d->size, sizeof(Io), "heartbeat");
    t->gone = (int *)callocCheck((size_t)d->size, sizeof(int), "heartbeat");
    t->heard = -1;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    d->transport = t;
    d->ops = &tcp_ops;
    snprintf(d->launcher, sizeof d->launcher, "-pi %s", fs ? "fs" : "tcp");
    double deadline = now_s() + d->timeout_s;
    if (rank == 0) {
        t->chunk = (float *)mallocCheck((size_t)(d->size - 1) * CHUNK_FLOATS * sizeof(float), "reduce-scatter chunks");
        serve(d, f, fs, deadline);
    } else join(d, f, fs, deadline);
}
