/*
 * test_dev_alloc.cu - the device caching allocator (llmc/cuda/devalloc.cuh) on hand-worked
 * allocation sequences: every figure below follows from its rules (512-byte rounding, small and
 * large pools split at 1 MiB, best fit, new segments of the rounded size, coalescing), not from a run.
 * Through cudasim: make build/cudasim/test/test_dev_alloc && build/cudasim/test/test_dev_alloc
 * (CUDASIM_DEVICE_MEMORY_MB=8 for the out-of-memory part: the suite line sets it).
 */
#include <string.h>

#include "llmc/cuda/common.cuh"
#include "test/testing.h"

static const size_t KiB = 1024, MiB = 1024 * 1024;

static void expect(const DevAlloc *a, const char *name, size_t reserved, size_t allocated, size_t largest_free) {
    const size_t lf = devalloc_largest_free(a);
    test_report(a->reserved == reserved && a->allocated == allocated && lf == largest_free, name,
                "reserved %zu (want %zu), allocated %zu (want %zu), largest free %zu (want %zu)", a->reserved, reserved,
                a->allocated, allocated, lf, largest_free);
}

/* Offset of p in its segment and the segment's number, from the allocator's blocks. */
static int where(const DevAlloc *a, const void *p, size_t *offset) {
    for (int i = 0; i < a->nblocks; i++) {
        const DevBlock *b = &a->blocks[i];
        if (b->segment >= 0 && b->used && a->segs[b->segment].base + b->offset == (const char *)p) {
            *offset = b->offset;
            return b->segment;
        }
    }
    return -1;
}

static void expect_at(const DevAlloc *a, const char *name, const void *p, int segment, size_t offset) {
    size_t off = 0;
    int s = where(a, p, &off);
    test_report(s == segment && off == offset, name, "segment %d offset %zu (want %d, %zu)", s, off, segment, offset);
}

static void sequence(void) {
    DevAlloc a;
    devalloc_init(&a);
    devalloc_set_phase(&a, 3, "forward");
    /* 1000 bytes -> a 1024-byte block, its own small segment of exactly that */
    void *p1 = devalloc_malloc(&a, MEM_ACTIVATIONS, 1000);
    expect(&a, "1000 B: a 1024-byte small segment", 1024, 1024, 0);
    /* 3 MiB -> a large segment of 3 MiB, freed: cached, one free block */
    devalloc_set_phase(&a, 3, "backward");
    void *big = devalloc_malloc(&a, MEM_GRADIENTS, 3 * MiB);
    expect(&a, "3 MiB: a 3 MiB large segment", 1024 + 3 * MiB, 1024 + 3 * MiB, 0);
    devalloc_free(&a, big);
    expect(&a, "3 MiB freed: cached", 1024 + 3 * MiB, 1024, 3 * MiB);
    /* 1 MiB + 1 (large, 1049088 rounded) and 1.5 MiB split the cached block: 523776 bytes left at its end */
    void *x = devalloc_malloc(&a, MEM_OP_SCRATCH, 1 * MiB + 1);
    expect(&a, "1 MiB + 1 B: rounded to 1049088, split from the cached 3 MiB", 1024 + 3 * MiB, 1024 + 1049088, 3 * MiB - 1049088);
    void *y = devalloc_malloc(&a, MEM_OP_SCRATCH, 3 * MiB / 2);
    expect(&a, "1.5 MiB after it", 1024 + 3 * MiB, 1024 + 1049088 + 3 * MiB / 2, 523776);
    expect_at(&a, "1.5 MiB at offset 1049088 of segment 1", y, 1, 1049088);
    /* free the first: 1049088 free before y, 523776 after: fragmented */
    devalloc_free(&a, x);
    expect(&a, "the first freed: two free pieces around the 1.5 MiB block", 1024 + 3 * MiB, 1024 + 3 * MiB / 2, 1049088);
    /* 1.25 MiB fits neither piece (1572864 free bytes in the segment, in two): a new segment */
    void *z = devalloc_malloc(&a, MEM_OP_SCRATCH, 5 * MiB / 4);
    expect(&a, "1.25 MiB: no free piece holds it, a new 1.25 MiB segment", 1024 + 3 * MiB + 5 * MiB / 4,
           1024 + 3 * MiB / 2 + 5 * MiB / 4, 1049088);
    /* free the 1.5 MiB block: it joins both neighbours, the 3 MiB segment is one free block again */
    devalloc_free(&a, y);
    expect(&a, "the 1.5 MiB block freed: joined with both neighbours", 1024 + 3 * MiB + 5 * MiB / 4, 1024 + 5 * MiB / 4, 3 * MiB);
    /* 2 MiB reuses it (best fit: the only large free block), 1 MiB left; 600 KiB is small: a new small
     * segment, not a cut of the large pool's 1 MiB */
    void *w = devalloc_malloc(&a, MEM_OP_SCRATCH, 2 * MiB);
    expect_at(&a, "2 MiB from the cached segment 1", w, 1, 0);
    const int segs = a.nsegs;
    void *sm = devalloc_malloc(&a, MEM_OP_SCRATCH, 600 * KiB);
    expect(&a, "600 KiB: its own small segment, the large pool's 1 MiB free block left alone",
           1024 + 3 * MiB + 5 * MiB / 4 + 600 * KiB, 1024 + 2 * MiB + 5 * MiB / 4 + 600 * KiB, 1 * MiB);
    test_report(a.nsegs == segs + 1 && a.reused == 3, "x, y and the 2 MiB block were cut from a cached segment", "segments %d, reused %lld",
                a.nsegs, a.reused);

    /* the snapshot: the live blocks in segment and offset order, with class, size, step and phase */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    devalloc_print_snapshot(&a, f, 3, "end");
    fclose(f);
    const char *want[] = {
        "\"totals\": {\"reserved\": 5071872, \"allocated\": 4023296, \"requested\": 4023272, \"largest_free\": 1048576, "
        "\"peak_reserved\": 5071872, \"peak_allocated\": 4023296, \"segments\": 4, \"allocs\": 7, \"frees\": 3, \"reused\": 3}",
        "{\"class\": \"activations\", \"size\": 1000, \"block\": 1024, \"segment\": 0, \"offset\": 0, \"step\": 3, \"phase\": \"forward\"},\n"
        "  {\"class\": \"op_scratch\", \"size\": 2097152, \"block\": 2097152, \"segment\": 1, \"offset\": 0, \"step\": 3, \"phase\": \"backward\"},\n"
        "  {\"class\": \"op_scratch\", \"size\": 1310720, \"block\": 1310720, \"segment\": 2, \"offset\": 0, \"step\": 3, \"phase\": \"backward\"},\n"
        "  {\"class\": \"op_scratch\", \"size\": 614400, \"block\": 614400, \"segment\": 3, \"offset\": 0, \"step\": 3, \"phase\": \"backward\"}]",
        "\"classes\": {\"activations\": {\"requested\": 1000, \"allocated\": 1024}, \"op_scratch\": {\"requested\": 4022272, "
        "\"allocated\": 4022272}}",
        "{\"segment\": 0, \"size\": 1024, \"pool\": \"small\"},\n  {\"segment\": 1, \"size\": 3145728, \"pool\": \"large\"},\n"
        "  {\"segment\": 2, \"size\": 1310720, \"pool\": \"large\"},\n  {\"segment\": 3, \"size\": 614400, \"pool\": \"small\"}]",
        "{\"step\": 3, \"phase\": \"backward\", \"class\": \"op_scratch\", \"bytes\": -1049088, \"allocated\": 1573888, \"reserved\": 3146752}"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        test_report(strstr(text, want[i]) != NULL, "snapshot holds the hand-worked figures", "missing:\n%s\nin:\n%s", want[i], text);
    free(text);

    /* everything freed: nothing allocated, the segments cached; released: nothing reserved */
    void *all[] = {p1, w, z, sm};
    for (int i = 0; i < 4; i++) devalloc_free(&a, all[i]);
    expect(&a, "all freed: the segments stay reserved (cached), each one free block", 5071872, 0, 3 * MiB);
    size_t released = devalloc_release_cached(&a);
    test_report(released == 5071872, "release_cached gives back all 5071872 bytes", "released %zu", released);
    expect(&a, "after the release", 0, 0, 0);
    devalloc_destroy(&a);
}

/* Best fit: with cached free blocks of 3 MiB (segment 0) and 2 MiB (segment 1), 1.5 MiB goes to the
 * 2 MiB one, and the next 1.5 MiB to the 3 MiB one (the 0.5 MiB left is too small). */
static void best_fit(void) {
    DevAlloc a;
    devalloc_init(&a);
    void *three = devalloc_malloc(&a, MEM_ACTIVATIONS, 3 * MiB), *two = devalloc_malloc(&a, MEM_ACTIVATIONS, 2 * MiB);
    devalloc_free(&a, three);
    devalloc_free(&a, two);
    void *p = devalloc_malloc(&a, MEM_ACTIVATIONS, 3 * MiB / 2), *q = devalloc_malloc(&a, MEM_ACTIVATIONS, 3 * MiB / 2);
    expect_at(&a, "best fit: 1.5 MiB from the 2 MiB free block (segment 1)", p, 1, 0);
    expect_at(&a, "then 1.5 MiB from the 3 MiB one (segment 0)", q, 0, 0);
    expect(&a, "no new segment; 1.5 MiB left free in segment 0", 5 * MiB, 3 * MiB, 3 * MiB / 2);
    devalloc_destroy(&a);
}

/* The device has 8 MiB (CUDASIM_DEVICE_MEMORY_MB=8): a cached 4 MiB segment is released when a
 * 5 MiB one does not fit beside it, and a request beyond the device returns NULL with nothing changed. */
static void out_of_memory(void) {
    size_t free_b = 0, total_b = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    if (total_b != 8 * MiB) {
        test_report(0, "out of memory: run with CUDASIM_DEVICE_MEMORY_MB=8", "the device has %zu bytes", total_b);
        return;
    }
    DevAlloc a;
    devalloc_init(&a);
    void *p = devalloc_malloc(&a, MEM_PARAMETERS, 4 * MiB);
    devalloc_free(&a, p);
    expect(&a, "4 MiB freed: cached", 4 * MiB, 0, 4 * MiB);
    void *q = devalloc_try_malloc(&a, MEM_PARAMETERS, 5 * MiB); /* 5 MiB segment: only after the cached 4 MiB go */
    test_report(q != NULL, "a 5 MiB segment fits once the cached 4 MiB segment is released", "NULL");
    expect(&a, "after the release and the new segment", 5 * MiB, 5 * MiB, 0);
    void *big = devalloc_try_malloc(&a, MEM_ACTIVATIONS, 3 * MiB + 1);
    test_report(big == NULL, "3 MiB + 1 B more does not fit the 8 MiB device: NULL", "got a block");
    expect(&a, "nothing changed by the failed request", 5 * MiB, 5 * MiB, 0);
    devalloc_destroy(&a);
}

int main(void) {
    sequence();
    best_fit();
    out_of_memory();
    return test_exit_code();
}
