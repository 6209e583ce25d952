/*
 * test_dev_alloc.cu - the device caching allocator (llmc/cuda/devalloc.cuh) on hand-worked
 * allocation sequences: every figure below follows from its rules (512-byte rounding, 1 MiB small
 * limit, 2 MiB small segments, large segments in 2 MiB steps, best fit, coalescing), not from a run.
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
    /* 1000 bytes -> a 1024-byte block at the start of a new 2 MiB small segment */
    void *p1 = devalloc_malloc(&a, MEM_ACTIVATIONS, 1000);
    expect(&a, "1000 B: one small segment, a 1024-byte block", 2 * MiB, 1024, 2 * MiB - 1024);
    /* 3 MiB -> a large segment of 4 MiB; its free 1 MiB is smaller than the small segment's rest */
    devalloc_set_phase(&a, 3, "backward");
    void *p2 = devalloc_malloc(&a, MEM_GRADIENTS, 3 * MiB);
    expect(&a, "3 MiB: a 4 MiB large segment", 6 * MiB, 1024 + 3 * MiB, 2 * MiB - 1024);
    /* three 600 KiB blocks in the small segment: its free tail 2 MiB - 1024 - 3 * 600 KiB = 252928 */
    void *q[3];
    for (int i = 0; i < 3; i++) q[i] = devalloc_malloc(&a, MEM_OP_SCRATCH, 600 * KiB);
    expect(&a, "3 x 600 KiB in the small segment: the large segment's 1 MiB is the largest free block", 6 * MiB,
           1024 + 3 * MiB + 3 * 600 * KiB, 1 * MiB);
    expect_at(&a, "the third 600 KiB block at offset 1024 + 2 x 614400", q[2], 0, 1024 + 2 * 600 * KiB);
    /* free the middle one: 614400 free between two live blocks, 252928 at the end: fragmented */
    devalloc_free(&a, q[1]);
    expect(&a, "the middle block freed: two free pieces, not joined", 6 * MiB, 1024 + 3 * MiB + 2 * 600 * KiB, 1 * MiB);
    /* 700 KiB fits neither piece (867328 free bytes in the segment, in two): a new small segment */
    void *r = devalloc_malloc(&a, MEM_OP_SCRATCH, 700 * KiB);
    expect(&a, "700 KiB: no free piece holds it, a second small segment", 8 * MiB, 1024 + 3 * MiB + 2 * 600 * KiB + 700 * KiB,
           2 * MiB - 700 * KiB);
    expect_at(&a, "700 KiB at the start of segment 2", r, 2, 0);
    /* free the third: it joins the middle one and the tail: 2 MiB - 1024 - 614400 = 1481728 free in one */
    devalloc_free(&a, q[2]);
    expect(&a, "the third freed: joined with its free neighbours", 8 * MiB, 1024 + 3 * MiB + 600 * KiB + 700 * KiB,
           2 * MiB - 1024 - 600 * KiB);
    /* best fit: 600 KiB goes to segment 2's rest (1380352 bytes), the smallest free block that holds it */
    const long long cudamallocs = a.nsegs;
    void *s = devalloc_malloc(&a, MEM_OP_SCRATCH, 600 * KiB);
    expect_at(&a, "best fit: 600 KiB after the 700 KiB block in segment 2", s, 2, 700 * KiB);
    test_report(a.nsegs == cudamallocs && a.reused == 4, "served from the cached segments: no new segment", "segments %d, reused %lld",
                a.nsegs, a.reused);

    /* the snapshot: the live blocks in segment and offset order, with class, size, step and phase */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    devalloc_print_snapshot(&a, f, 3, "end");
    fclose(f);
    const char *want[] = {
        "\"totals\": {\"reserved\": 8388608, \"allocated\": 5092352, \"requested\": 5092328, \"largest_free\": 1481728, "
        "\"peak_reserved\": 8388608, \"peak_allocated\": 5092352, \"segments\": 3, \"allocs\": 7, \"frees\": 2, \"reused\": 4}",
        "{\"class\": \"activations\", \"size\": 1000, \"block\": 1024, \"segment\": 0, \"offset\": 0, \"step\": 3, \"phase\": \"forward\"},\n"
        "  {\"class\": \"op_scratch\", \"size\": 614400, \"block\": 614400, \"segment\": 0, \"offset\": 1024, \"step\": 3, \"phase\": \"backward\"},\n"
        "  {\"class\": \"gradients\", \"size\": 3145728, \"block\": 3145728, \"segment\": 1, \"offset\": 0, \"step\": 3, \"phase\": \"backward\"},\n"
        "  {\"class\": \"op_scratch\", \"size\": 716800, \"block\": 716800, \"segment\": 2, \"offset\": 0, \"step\": 3, \"phase\": \"backward\"},\n"
        "  {\"class\": \"op_scratch\", \"size\": 614400, \"block\": 614400, \"segment\": 2, \"offset\": 716800, \"step\": 3, \"phase\": \"backward\"}]",
        "\"classes\": {\"gradients\": {\"requested\": 3145728, \"allocated\": 3145728}, \"activations\": {\"requested\": 1000, "
        "\"allocated\": 1024}, \"op_scratch\": {\"requested\": 1945600, \"allocated\": 1945600}}",
        "{\"segment\": 0, \"size\": 2097152, \"pool\": \"small\"},\n  {\"segment\": 1, \"size\": 4194304, \"pool\": \"large\"},\n"
        "  {\"segment\": 2, \"size\": 2097152, \"pool\": \"small\"}]",
        "{\"step\": 3, \"phase\": \"backward\", \"class\": \"op_scratch\", \"bytes\": -614400, \"allocated\": 4477952, \"reserved\": 8388608}"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        test_report(strstr(text, want[i]) != NULL, "snapshot holds the hand-worked figures", "missing:\n%s\nin:\n%s", want[i], text);
    free(text);

    /* everything freed: nothing allocated, the segments cached; released: nothing reserved */
    void *all[] = {p1, p2, q[0], r, s};
    for (int i = 0; i < 5; i++) devalloc_free(&a, all[i]);
    expect(&a, "all freed: the segments stay reserved (cached), each one free block", 8 * MiB, 0, 4 * MiB);
    size_t released = devalloc_release_cached(&a);
    test_report(released == 8 * MiB, "release_cached gives back all 8 MiB", "released %zu", released);
    expect(&a, "after the release", 0, 0, 0);
    devalloc_destroy(&a);
}

/* The device has 8 MiB (CUDASIM_DEVICE_MEMORY_MB=8): a cached 4 MiB segment is released when a
 * 6 MiB one does not fit beside it, and a request beyond the device returns NULL with nothing changed. */
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
    void *q = devalloc_try_malloc(&a, MEM_PARAMETERS, 5 * MiB); /* 6 MiB segment: only after the cached 4 MiB go */
    test_report(q != NULL, "a 6 MiB segment fits once the cached 4 MiB segment is released", "NULL");
    expect(&a, "after the release and the new segment", 6 * MiB, 5 * MiB, 1 * MiB);
    void *big = devalloc_try_malloc(&a, MEM_ACTIVATIONS, 3 * MiB);
    test_report(big == NULL, "3 MiB more does not fit the device: NULL", "got a block");
    expect(&a, "nothing changed by the failed request", 6 * MiB, 5 * MiB, 1 * MiB);
    devalloc_destroy(&a);
}

int main(void) {
    sequence();
    out_of_memory();
    return test_exit_code();
}
