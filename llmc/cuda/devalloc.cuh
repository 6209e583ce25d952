/*
 * devalloc.cuh - the device caching allocator: every device allocation of llmc/cuda (the model's
 * arenas and scratch, the cuBLASLt workspace and its tuning copies, the decoder's cache) goes
 * through one DevAlloc (CudaContext.alloc), which you can see into: reserved vs allocated bytes,
 * the largest free block (fragmentation), every live allocation with its memory class
 * (llmc/core/mem.h) and the step and phase it was made in, a history for a timeline, a JSON
 * snapshot (devalloc_write_snapshot) and a leak check (devalloc_check_leaks).
 *
 * Size classes, not expandable segments: cudasim does not model the driver's virtual-memory API
 * (cuMemCreate / cuMemMap), and the trainer allocates its arenas once, so the segments rarely
 * need to grow. The rules (all sizes in bytes; the test works sequences out by hand from them):
 *   - a request is rounded up to a multiple of DEVALLOC_ROUND (512; 0 bytes count as 1);
 *   - a rounded size up to DEVALLOC_SMALL (1 MiB) is small, a larger one large: each is cut only
 *     from free blocks of its own pool (a small request never splits a large cached block);
 *   - best fit: the smallest free block of the request's pool that holds it (ties: the lowest
 *     segment, then the lowest offset); the block is split, the rest stays free in the pool;
 *   - with no block that fits, a new segment of exactly the rounded size is reserved (cudaMalloc);
 *     when that fails, the wholly free segments are released (cudaFree) and it is tried once more;
 *   - a freed block joins its free neighbours in its segment; segments stay reserved (cached
 *     for reuse) until devalloc_release_cached or devalloc_destroy.
 * Segments are not rounded up to a larger granule (2 MiB, as PyTorch's): the memory plan
 * (--plan, --memory-budget, the device-fit search) prices the bytes requested, and a granule
 * would hold up to 2 MiB more per pool than it, enough to make a plan that fits a device fail.
 * reserved = the segments' bytes; allocated = the live blocks' (rounded) bytes; requested = the
 * bytes asked for (by class in class_requested: what the memory plan prices); largest_free =
 * the largest free block inside the reserved segments (reserved - allocated when nothing is
 * fragmented, less when the free bytes are in pieces).
 * Host code, one thread; O(blocks) per call (the trainer holds a few dozen blocks). Under cudasim
 * an overrun past a block is caught only at its segment's end (a block that got a new segment).
 */
#ifndef LLMC_CUDA_DEVALLOC_CUH
#define LLMC_CUDA_DEVALLOC_CUH

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "llmc/core/atomicfile.h"
#include "llmc/core/check.h"
#include "llmc/core/mem.h"

enum { DEVALLOC_ROUND = 512, DEVALLOC_SMALL = 1 << 20 };
enum { DEVALLOC_MAX_EVENTS = 1 << 16 }; /* the history kept for the timeline; later events are counted, not kept */

typedef struct {
    int segment, used;       /* used 0: a free block */
    size_t offset, size;     /* in the segment; size a multiple of DEVALLOC_ROUND */
    size_t requested;        /* the bytes asked for (used blocks) */
    int mem_class, step;     /* of the allocation (used blocks) */
    const char *phase;
    int prev, next;          /* neighbours in the segment, by offset; -1 none */
} DevBlock;

typedef struct {
    char *base;
    size_t size;
    int small;    /* the small pool's */
    int live;     /* 0: released (its slot kept, so segment numbers stay) */
} DevSegment;

typedef struct {
    int step, mem_class;
    const char *phase;
    long long bytes;            /* + allocated, - freed (rounded) */
    size_t allocated, reserved; /* after it */
} DevEvent;

typedef struct {
    DevSegment *segs;
    int nsegs, cap_segs;
    DevBlock *blocks; /* slots; a slot with segment -1 is unused */
    int nblocks, cap_blocks;
    size_t reserved, allocated, requested, peak_reserved, peak_allocated;
    size_t class_allocated[MEM_NUM_CLASSES], class_requested[MEM_NUM_CLASSES];
    long long allocs, frees, reused; /* reused: allocations served from cached segments */
    int step;                        /* where the caller is (devalloc_set_phase): recorded with each allocation */
    const char *phase;
    DevEvent *events;
    size_t nevents, events_dropped;
    /* the leak check's baseline (devalloc_check_leaks) */
    size_t leak_base[MEM_NUM_CLASSES];
    int leak_base_step;
} DevAlloc;

inline void devalloc_init(DevAlloc *a) {
    memset(a, 0, sizeof *a);
    a->phase = "setup";
    a->leak_base_step = -1;
}

/* Where the caller is: every later allocation records this step and phase (a static string). */
inline void devalloc_set_phase(DevAlloc *a, int step, const char *phase) {
    a->step = step;
    a->phase = phase;
}

inline size_t devalloc_round(size_t bytes) {
    if (bytes == 0) bytes = 1;
    return (bytes + DEVALLOC_ROUND - 1) / DEVALLOC_ROUND * DEVALLOC_ROUND;
}

inline size_t devalloc_largest_free(const DevAlloc *a) {
    size_t best = 0;
    for (int i = 0; i < a->nblocks; i++)
        if (a->blocks[i].segment >= 0 && !a->blocks[i].used && a->blocks[i].size > best) best = a->blocks[i].size;
    return best;
}

static inline void *devalloc_grow(void *p, size_t bytes, const char *what) {
    void *q = realloc(p, bytes);
    if (!q) llmc_die("out of host memory: %zu bytes for the %s", bytes, what);
    return q;
}

static inline int devalloc_new_block(DevAlloc *a) {
    for (int i = 0; i < a->nblocks; i++)
        if (a->blocks[i].segment < 0) return i;
    if (a->nblocks == a->cap_blocks) {
        a->cap_blocks = a->cap_blocks ? 2 * a->cap_blocks : 64;
        a->blocks = (DevBlock *)devalloc_grow(a->blocks, (size_t)a->cap_blocks * sizeof *a->blocks, "device allocator blocks");
    }
    return a->nblocks++;
}

static inline void devalloc_event(DevAlloc *a, int mem_class, long long bytes) {
    if (a->nevents == DEVALLOC_MAX_EVENTS) {
        a->events_dropped++;
        return;
    }
    if (!a->events) a->events = (DevEvent *)mallocCheck(DEVALLOC_MAX_EVENTS * sizeof *a->events, "device allocator history");
    DevEvent e = {a->step, mem_class, a->phase, bytes, a->allocated, a->reserved};
    a->events[a->nevents++] = e;
}

/* cudaFree of every wholly free segment (their slots stay, marked released). Returns the bytes released. */
inline size_t devalloc_release_cached(DevAlloc *a) {
    size_t released = 0;
    for (int i = 0; i < a->nblocks; i++) {
        DevBlock *b = &a->blocks[i];
        if (b->segment < 0 || b->used || b->offset != 0 || b->size != a->segs[b->segment].size) continue;
        DevSegment *s = &a->segs[b->segment];
        cudaCheck(cudaFree(s->base));
        s->live = 0;
        a->reserved -= s->size;
        released += s->size;
        b->segment = -1;
    }
    return released;
}

/* A new segment of size bytes holding one free block; -1 when the device has no room (after
 * releasing the cached segments). */
static inline int devalloc_reserve(DevAlloc *a, size_t size, int small) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation && devalloc_release_cached(a) > 0) {
        (void)cudaGetLastError(); /* the failed attempt's sticky error */
        e = cudaMalloc(&p, size);
    }
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return -1;
    }
    cudaCheck(e);
    if (a->nsegs == a->cap_segs) {
        a->cap_segs = a->cap_segs ? 2 * a->cap_segs : 16;
        a->segs = (DevSegment *)devalloc_grow(a->segs, (size_t)a->cap_segs * sizeof *a->segs, "device allocator segments");
    }
    const int si = a->nsegs++;
    a->segs[si] = {(char *)p, size, small, 1};
    const int bi = devalloc_new_block(a);
    a->blocks[bi] = {si, 0, 0, size, 0, 0, 0, NULL, -1, -1};
    a->reserved += size;
    if (a->reserved > a->peak_reserved) a->peak_reserved = a->reserved;
    return bi;
}

/* bytes of class mem_class, or NULL when the device has no room (nothing changed then). */
inline void *devalloc_try_malloc(DevAlloc *a, int mem_class, size_t bytes) {
    const size_t size = devalloc_round(bytes);
    const int small = size <= DEVALLOC_SMALL;
    int best = -1;
    for (int i = 0; i < a->nblocks; i++) {
        const DevBlock *b = &a->blocks[i];
        if (b->segment < 0 || b->used || b->size < size || a->segs[b->segment].small != small) continue;
        if (best < 0) { best = i; continue; }
        const DevBlock *o = &a->blocks[best];
        if (b->size < o->size || (b->size == o->size && (b->segment < o->segment || (b->segment == o->segment && b->offset < o->offset))))
            best = i;
    }
    if (best >= 0) a->reused++;
    else {
        best = devalloc_reserve(a, size, small);
        if (best < 0) return NULL;
    }
    if (a->blocks[best].size > size) { /* split: the rest stays free, after it */
        const int r = devalloc_new_block(a);
        DevBlock *b = &a->blocks[best]; /* (after the slots may have moved) */
        a->blocks[r] = {b->segment, 0, b->offset + size, b->size - size, 0, 0, 0, NULL, best, b->next};
        if (b->next >= 0) a->blocks[b->next].prev = r;
        b->next = r;
        b->size = size;
    }
    DevBlock *b = &a->blocks[best];
    b->used = 1;
    b->requested = bytes;
    b->mem_class = mem_class;
    b->step = a->step;
    b->phase = a->phase;
    a->allocated += size;
    a->requested += bytes;
    a->class_allocated[mem_class] += size;
    a->class_requested[mem_class] += bytes;
    if (a->allocated > a->peak_allocated) a->peak_allocated = a->allocated;
    a->allocs++;
    devalloc_event(a, mem_class, (long long)size);
    return a->segs[b->segment].base + b->offset;
}

/* As devalloc_try_malloc, and dies naming the class and the allocator's state when the device is full. */
inline void *devalloc_malloc(DevAlloc *a, int mem_class, size_t bytes) {
    void *p = devalloc_try_malloc(a, mem_class, bytes);
    if (!p) {
        size_t free_b = 0, total_b = 0;
        cudaCheck(cudaMemGetInfo(&free_b, &total_b));
        llmc_die("device out of memory: %zu bytes for memory class '%s' (the allocator holds %zu bytes reserved, %zu "
                 "allocated, largest free block %zu; the device has %zu of %zu bytes free). HINT: --plan shows what the "
                 "run needs; lower -b, raise -r or give --memory-budget",
                 bytes, mem_class_names[mem_class], a->reserved, a->allocated, devalloc_largest_free(a), free_b, total_b);
    }
    return p;
}

static inline void devalloc_merge(DevAlloc *a, int keep, int gone) { /* gone follows keep; both free */
    DevBlock *k = &a->blocks[keep], *g = &a->blocks[gone];
    k->size += g->size;
    k->next = g->next;
    if (g->next >= 0) a->blocks[g->next].prev = keep;
    g->segment = -1;
}

/* Frees p (from devalloc_malloc; NULL is a no-op): its block joins its free neighbours. */
inline void devalloc_free(DevAlloc *a, void *p) {
    if (!p) return;
    int i = 0;
    for (; i < a->nblocks; i++) {
        const DevBlock *b = &a->blocks[i];
        if (b->segment >= 0 && b->used && a->segs[b->segment].base + b->offset == (char *)p) break;
    }
    if (i == a->nblocks) llmc_die("internal: device free of %p, which the device allocator did not allocate (or freed already)", p);
    DevBlock *b = &a->blocks[i];
    a->allocated -= b->size;
    a->requested -= b->requested;
    a->class_allocated[b->mem_class] -= b->size;
    a->class_requested[b->mem_class] -= b->requested;
    a->frees++;
    b->used = 0;
    devalloc_event(a, b->mem_class, -(long long)b->size);
    if (b->next >= 0 && !a->blocks[b->next].used) devalloc_merge(a, i, b->next);
    if (b->prev >= 0 && !a->blocks[b->prev].used) devalloc_merge(a, b->prev, i);
}

/* Releases every segment (live blocks included: the end of the process's device use). */
inline void devalloc_destroy(DevAlloc *a) {
    for (int s = 0; s < a->nsegs; s++)
        if (a->segs[s].live) cudaCheck(cudaFree(a->segs[s].base));
    free(a->segs);
    free(a->blocks);
    free(a->events);
    memset(a, 0, sizeof *a);
}

/* The leak check, once at the end of every step: the allocated bytes of each class after step
 * base_step (the baseline) must not grow at any later step; a growth dies naming the class and
 * where its newest block was made. Steps before base_step are the warm-up. */
inline void devalloc_check_leaks(DevAlloc *a, int step, int base_step) {
    if (step == base_step) {
        memcpy(a->leak_base, a->class_allocated, sizeof a->leak_base);
        a->leak_base_step = step;
        return;
    }
    if (a->leak_base_step < 0 || step < base_step) return;
    for (int c = 0; c < MEM_NUM_CLASSES; c++) {
        if (a->class_allocated[c] <= a->leak_base[c]) continue;
        const DevBlock *newest = NULL;
        for (int i = 0; i < a->nblocks; i++) {
            const DevBlock *b = &a->blocks[i];
            if (b->segment >= 0 && b->used && b->mem_class == c && (!newest || b->step > newest->step)) newest = b;
        }
        llmc_die("memory leak: device allocator class '%s' grew from %zu bytes allocated after step %d to %zu bytes "
                 "after step %d (its newest live block: %zu bytes made at step %d, phase %s)",
                 mem_class_names[c], a->leak_base[c], a->leak_base_step, a->class_allocated[c], step,
                 newest ? newest->requested : 0, newest ? newest->step : -1, newest ? newest->phase : "?");
    }
}

/* The snapshot as JSON into f: the totals, the classes, the segments, every live allocation
 * (class, size requested, block, segment, offset, step, phase) in segment and offset order, and
 * the history of allocations and frees. at_step / at_phase: when it was taken. */
inline void devalloc_print_snapshot(const DevAlloc *a, FILE *f, int at_step, const char *at_phase) {
    fprintf(f, "{\"format\": \"llmc-memory-snapshot\", \"version\": 1, \"device\": \"GPU\", \"step\": %d, \"phase\": \"%s\",\n",
            at_step, at_phase);
    fprintf(f, " \"rules\": {\"round\": %d, \"small_max\": %d},\n", DEVALLOC_ROUND, DEVALLOC_SMALL);
    int nseg = 0;
    for (int s = 0; s < a->nsegs; s++) nseg += a->segs[s].live;
    fprintf(f, " \"totals\": {\"reserved\": %zu, \"allocated\": %zu, \"requested\": %zu, \"largest_free\": %zu, "
               "\"peak_reserved\": %zu, \"peak_allocated\": %zu, \"segments\": %d, \"allocs\": %lld, \"frees\": %lld, \"reused\": %lld},\n",
            a->reserved, a->allocated, a->requested, devalloc_largest_free(a), a->peak_reserved, a->peak_allocated, nseg, a->allocs,
            a->frees, a->reused);
    fprintf(f, " \"classes\": {");
    int first = 1;
    for (int c = 0; c < MEM_NUM_CLASSES; c++) {
        if (!a->class_allocated[c]) continue;
        fprintf(f, "%s\"%s\": {\"requested\": %zu, \"allocated\": %zu}", first ? "" : ", ", mem_class_names[c], a->class_requested[c],
                a->class_allocated[c]);
        first = 0;
    }
    fprintf(f, "},\n \"segments\": [");
    first = 1;
    for (int s = 0; s < a->nsegs; s++) {
        if (!a->segs[s].live) continue;
        fprintf(f, "%s\n  {\"segment\": %d, \"size\": %zu, \"pool\": \"%s\"}", first ? "" : ",", s, a->segs[s].size,
                a->segs[s].small ? "small" : "large");
        first = 0;
    }
    fprintf(f, "],\n \"allocations\": [");
    first = 1;
    for (int s = 0; s < a->nsegs; s++) {
        if (!a->segs[s].live) continue;
        int head = -1; /* the segment's first block, then along next */
        for (int i = 0; i < a->nblocks && head < 0; i++)
            if (a->blocks[i].segment == s && a->blocks[i].prev < 0) head = i;
        for (int i = head; i >= 0; i = a->blocks[i].next) {
            const DevBlock *b = &a->blocks[i];
            if (!b->used) continue;
            fprintf(f, "%s\n  {\"class\": \"%s\", \"size\": %zu, \"block\": %zu, \"segment\": %d, \"offset\": %zu, \"step\": %d, \"phase\": \"%s\"}",
                    first ? "" : ",", mem_class_names[b->mem_class], b->requested, b->size, s, b->offset, b->step, b->phase);
            first = 0;
        }
    }
    fprintf(f, "],\n \"events_dropped\": %zu,\n \"events\": [", a->events_dropped);
    for (size_t i = 0; i < a->nevents; i++) {
        const DevEvent *e = &a->events[i];
        fprintf(f, "%s\n  {\"step\": %d, \"phase\": \"%s\", \"class\": \"%s\", \"bytes\": %lld, \"allocated\": %zu, \"reserved\": %zu}",
                i ? "," : "", e->step, e->phase, mem_class_names[e->mem_class], e->bytes, e->allocated, e->reserved);
    }
    fprintf(f, "]}\n");
}

/* The snapshot written to path atomically (a temporary file renamed over it). */
inline void devalloc_write_snapshot(const DevAlloc *a, const char *path, int at_step, const char *at_phase) {
    AtomicFile af;
    atomic_open(&af, path);
    devalloc_print_snapshot(a, af.f, at_step, at_phase);
    if (ferror(af.f)) {
        atomic_abort(&af);
        llmc_die("--memory-snapshot '%s': writing the snapshot failed", path);
    }
    atomic_commit(&af);
}

#endif
