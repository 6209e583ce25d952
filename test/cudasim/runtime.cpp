/*
 * runtime.cpp - the cudasim execution engine and CUDA runtime API subset (see cudasim.h).
 *
 * Kernel execution: blocks run in order x fastest, then y, then z, on the calling OS thread.
 * A block's threads are fibers with their own mmap'd stacks (guard page below each) that run
 * one at a time, in thread order, until they block in a barrier or warp primitive or return.
 * A barrier releases when every thread of the block has arrived; a warp primitive completes
 * when every lane named in the mask has arrived at a primitive of the same kind and mask.
 * If no fiber can run and some have not returned, the block is deadlocked: that is reported.
 *
 * Memory checking: every cudaMalloc/cudaMallocManaged/cudaMallocHost block sits between two
 * PROT_NONE pages, and the slack between the 256-byte aligned data and those pages is filled
 * with a canary; cudaFree turns the whole mapping PROT_NONE (and releases its memory), so any
 * later access faults. The SIGSEGV handler names the allocation and the faulting thread.
 * CUDASIM_DEVICE_MEMORY_MB shrinks the simulated device (cudaMemGetInfo, the cudaMalloc limit).
 * Shared memory allocations are separated by canaries checked every time a fiber yields, so an
 * overrun is attributed to the thread that just ran.
 */
#include "cudasim.h"

#include <csignal>
#include <functional>
#include <cstdarg>
#include <cstdlib>
#include <map>
#include <string>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>
#include <vector>

namespace cudasim {
ThreadCtx *g_thread = nullptr;
BlockCtx g_block;

namespace {

/* ---- device shape (H200-like) ------------------------------------------------------------- */
const size_t kSmemDefaultLimit = 48 * 1024;       /* dynamic smem without opt-in */
const size_t kSmemOptinLimit = 227 * 1024;        /* sharedMemPerBlockOptin */
const size_t kSmemPerSM = 228 * 1024;
const size_t kStaticSmemLimit = 48 * 1024;        /* ptxas limit for static __shared__ */
/* CUDASIM_DEVICE_MEMORY_MB=<n>: a smaller device (tests of what the trainer does when memory is short) */
static size_t device_memory_bytes() {
    const char *e = getenv("CUDASIM_DEVICE_MEMORY_MB");
    return e && atoll(e) > 0 ? (size_t)atoll(e) << 20 : 141ull * 1000 * 1000 * 1000;
}
const size_t kTotalGlobalMem = device_memory_bytes();
const int kNumSMs = 132;

Stats g_stats;

/* ---- context switching -------------------------------------------------------------------- */
#if defined(__x86_64__)
extern "C" void cudasim_ctx_switch(void **save_sp, void *load_sp);
asm(".text\n"
    ".globl cudasim_ctx_switch\n"
    ".type cudasim_ctx_switch,@function\n"
    "cudasim_ctx_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size cudasim_ctx_switch, .-cudasim_ctx_switch\n");
#define CUDASIM_ASM_SWITCH 1
#else
#define CUDASIM_ASM_SWITCH 0
#endif

enum FiberState : unsigned char { F_RUNNABLE, F_BARRIER, F_WARP, F_DONE };

struct Fiber : ThreadCtx {
    int linear, lane, warp;
    FiberState state;
    bool started;
    void *sp;
#if !CUDASIM_ASM_SWITCH
    ucontext_t uc;
#endif
    char *stack_lo; /* usable stack [stack_lo, stack_lo + stack_size) */
    /* the primitive this fiber waits in (or last waited in) */
    const char *file;
    int line;
    int op, arg, width, pred;
    unsigned mask;
    size_t size;
    unsigned char val[16];
    void *out;
    bool is_signed;
    /* WOP_COLLECTIVE: the instruction, its emulation and this lane's operands */
    const char *coll_name;
    void (*coll_fn)(void *const *);
    void *coll_ctx;
    /* cp.async copies issued and not yet waited for; group -1: not committed yet */
    struct CpAsync {
        void *dst;
        unsigned char data[16];
        size_t bytes;
        long group;
        const char *file;
        int line;
    };
    std::vector<CpAsync> cp_pending;
    long cp_groups; /* groups committed so far */
};

struct SharedAlloc {
    const void *key;
    const char *name;
    size_t offset, size;
};

const size_t kGuard = 64;
const unsigned char kSharedCanary = 0xA5;
const unsigned char kGlobalCanary = 0xCD;
const unsigned char kPoison = 0xFF;

struct Launch {
    const char *name = nullptr;
    const char *file = nullptr;
    int line = 0;
    dim3 grid, block;
    size_t smem = 0;
    void (*entry)(void *) = nullptr;
    void *ctx = nullptr;
    /* block in progress */
    std::vector<Fiber> fibers;
    int nthreads = 0, ndone = 0;
    int barrier_count = 0, barrier_op = 0, barrier_acc = 0, barrier_result = 0;
    const char *barrier_file = nullptr;
    int barrier_line = 0;
    /* shared memory arena of the block */
    unsigned char *arena = nullptr;
    size_t arena_cap = 0, arena_used = 0, static_bytes = 0;
    std::vector<SharedAlloc> allocs;
    unsigned char *dyn = nullptr;
};
Launch g_launch;
bool g_in_kernel = false;
void *g_sched_sp = nullptr;
#if !CUDASIM_ASM_SWITCH
ucontext_t g_sched_uc;
#endif
Fiber *g_cur = nullptr;

/* The first thread of the block in progress that is in state s (nullptr if none). */
const Fiber *first_fiber_in(FiberState s) {
    for (const Fiber &g : g_launch.fibers)
        if (g.state == s) return &g;
    return nullptr;
}
/* How a report of a thread gone while another waits at __syncthreads ends. */
#define CUDASIM_EARLY_RETURN_HINT                                                                                   \
    "every thread of the block must reach each __syncthreads.\n  HINT: do not return early from a kernel that " \
    "synchronizes; guard the work instead."

size_t g_stack_size = 0;
const size_t kPage = 4096;
std::vector<char *> g_stacks; /* mapping bases; usable stack starts one page above */

/* ---- error reporting ---------------------------------------------------------------------- */
void where_prefix(char *buf, size_t n, const Fiber *f) {
    if (!g_in_kernel) {
        snprintf(buf, n, "in host code");
        return;
    }
    int k = snprintf(buf, n, "in kernel '%s' (launched at %s:%d) block (%u,%u,%u)", g_launch.name,
                     g_launch.file, g_launch.line, g_block.bid.x, g_block.bid.y, g_block.bid.z);
    if (f && k > 0 && (size_t)k < n)
        snprintf(buf + k, n - k, " thread (%u,%u,%u) [warp %d lane %d]", f->tid.x, f->tid.y,
                 f->tid.z, f->warp, f->lane);
}

[[noreturn]] void vfail(const Fiber *f, const char *fmt, va_list ap) {
    char where[512];
    where_prefix(where, sizeof where, f);
    fflush(stdout);
    fprintf(stderr, "cudasim ERROR %s:\n  ", where);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    _exit(CUDASIM_ERROR_EXIT);
}

[[noreturn]] __attribute__((format(printf, 2, 3))) void fail(const Fiber *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(f, fmt, ap);
}

const char *op_name(int op) {
    static const char *names[WOP_COUNT] = {
        "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync", "__ballot_sync",
        "__any_sync", "__all_sync", "__syncwarp", "__reduce_add_sync", "__reduce_min_sync",
        "__reduce_max_sync", "__reduce_and_sync", "__reduce_or_sync", "__reduce_xor_sync",
        "__match_any_sync", "warp-collective instruction"};
    return op >= 0 && op < WOP_COUNT ? names[op] : "?";
}

void describe(const Fiber &f, char *buf, size_t n) {
    switch (f.state) {
    case F_DONE: snprintf(buf, n, "has exited (returned from the kernel)"); break;
    case F_BARRIER: snprintf(buf, n, "waits at __syncthreads (%s:%d)", f.file, f.line); break;
    case F_WARP:
        snprintf(buf, n, "waits at %s(mask=0x%08x) (%s:%d)", op_name(f.op), f.mask, f.file, f.line);
        break;
    default: snprintf(buf, n, "is runnable"); break;
    }
}

/* ---- shared memory ------------------------------------------------------------------------ */
void check_shared_guards(const Fiber *culprit) {
    Launch &L = g_launch;
    for (size_t i = 0; i < L.allocs.size(); i++) {
        const SharedAlloc &a = L.allocs[i];
        const unsigned char *after = L.arena + a.offset + a.size;
        const unsigned char *before = L.arena + a.offset - kGuard;
        for (size_t j = 0; j < kGuard; j++) {
            if (after[j] != kSharedCanary)
                fail(culprit, "shared memory written out of bounds: byte %zu past the end of %s "
                     "(%zu bytes) was overwritten.\n  HINT: check the index range of writes to it.",
                     j, a.name, a.size);
            if (before[j] != kSharedCanary)
                fail(culprit, "shared memory written out of bounds: byte %zu before the start of %s "
                     "(%zu bytes) was overwritten.\n  HINT: check for negative indices.",
                     kGuard - j, a.name, a.size);
        }
    }
}

void *arena_take(const void *key, size_t size, size_t align, const char *name) {
    Launch &L = g_launch;
    if (align < 16) align = 16;
    /* aligned as an address (the arena itself need not be), like the GPU's shared window */
    uintptr_t at = (uintptr_t)L.arena + L.arena_used + kGuard;
    size_t off = (size_t)((at + align - 1) / align * align - (uintptr_t)L.arena);
    size_t need = off + size + kGuard;
    if (need > L.arena_cap) fail(g_cur, "shared memory arena exhausted allocating %s (%zu bytes)", name, size);
    memset(L.arena + L.arena_used, kSharedCanary, off - L.arena_used);
    memset(L.arena + off, kPoison, size); /* shared memory starts undefined: NaN-poisoned */
    memset(L.arena + off + size, kSharedCanary, kGuard);
    L.arena_used = off + size;
    L.allocs.push_back(SharedAlloc{key, name, off, size});
    return L.arena + off;
}

/* ---- fibers ------------------------------------------------------------------------------- */
size_t stack_size() {
    if (!g_stack_size) {
        const char *e = getenv("CUDASIM_STACK_KB");
        long kb = e ? strtol(e, nullptr, 10) : 256;
        if (kb < 16) kb = 16;
        g_stack_size = ((size_t)kb * 1024 + kPage - 1) / kPage * kPage;
    }
    return g_stack_size;
}

char *stack_for(int i) {
    while ((int)g_stacks.size() <= i) {
        size_t len = stack_size() + kPage;
        void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) fail(nullptr, "cannot map a %zu-byte fiber stack", len);
        mprotect(p, kPage, PROT_NONE); /* guard page: overflow faults */
        g_stacks.push_back((char *)p);
    }
    return g_stacks[i] + kPage;
}

void switch_to_scheduler(Fiber *f);
void on_fiber_exit(Fiber *f);

void fiber_main() {
    g_launch.entry(g_launch.ctx);
    on_fiber_exit(g_cur);
    switch_to_scheduler(g_cur);
    __builtin_unreachable();
}

#if CUDASIM_ASM_SWITCH
void start_fiber(Fiber &f) {
    /* Frame popped by cudasim_ctx_switch: 6 callee-saved registers, then the return address
     * (fiber_main); the slot above is the fake return address of fiber_main, at an address
     * that is 8 mod 16 as after a call. */
    uintptr_t top = ((uintptr_t)f.stack_lo + stack_size()) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = nullptr;
    *--sp = (void *)&fiber_main;
    for (int i = 0; i < 6; i++) *--sp = nullptr;
    f.sp = sp;
}
void resume(Fiber &f) { cudasim_ctx_switch(&g_sched_sp, f.sp); }
void switch_to_scheduler(Fiber *f) { cudasim_ctx_switch(&f->sp, g_sched_sp); }
#else
void start_fiber(Fiber &f) {
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.stack_lo;
    f.uc.uc_stack.ss_size = stack_size();
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, (void (*)())fiber_main, 0);
}
void resume(Fiber &f) { swapcontext(&g_sched_uc, &f.uc); }
void switch_to_scheduler(Fiber *f) { swapcontext(&f->uc, &g_sched_uc); }
#endif

void block_current() {
    Fiber *f = g_cur;
    g_stats.switches++;
    switch_to_scheduler(f);
}

/* ---- warp primitives ---------------------------------------------------------------------- */
int lanes_in_warp(int warp) {
    int n = g_launch.nthreads - warp * 32;
    return n > 32 ? 32 : n;
}

void complete_warp_op(Fiber *base, unsigned mask) {
    Fiber &first = base[__builtin_ctz(mask)];
    int op = first.op;
    if (op == WOP_COLLECTIVE) { /* warp_collective: mask is always the whole warp */
        void *ctx[32];
        for (int l = 0; l < 32; l++) ctx[l] = base[l].coll_ctx;
        first.coll_fn(ctx);
        for (int l = 0; l < 32; l++) base[l].state = F_RUNNABLE;
        g_stats.warp_ops++;
        return;
    }
    size_t size = first.size;
    uint64_t acc = 0;
    unsigned bits = 0;
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1)) continue;
        const Fiber &g = base[l];
        uint32_t v32;
        memcpy(&v32, g.val, 4);
        bits |= (v32 != 0) << l;
        if (op == WOP_REDUCE_ADD) acc = (uint32_t)(acc + v32);
        else if (op == WOP_REDUCE_MIN || op == WOP_REDUCE_MAX) {
            bool firstlane = l == __builtin_ctz(mask);
            bool less = g.is_signed ? (int32_t)v32 < (int32_t)acc : v32 < (uint32_t)acc;
            if (firstlane || (op == WOP_REDUCE_MIN ? less : (!less && v32 != (uint32_t)acc))) acc = v32;
        } else if (op == WOP_REDUCE_AND) acc = (l == __builtin_ctz(mask)) ? v32 : (acc & v32);
        else if (op == WOP_REDUCE_OR) acc |= v32;
        else if (op == WOP_REDUCE_XOR) acc ^= v32;
    }
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1)) continue;
        Fiber &g = base[l];
        uint32_t r = 0;
        const void *src = &r;
        int w = g.width, seg = l & ~(w - 1), s = l;
        switch (op) {
        case WOP_SHFL_IDX: s = seg + (g.arg & (w - 1)); break;
        case WOP_SHFL_UP: s = l - g.arg >= seg ? l - g.arg : l; break;
        case WOP_SHFL_DOWN: s = l + g.arg < seg + w ? l + g.arg : l; break;
        case WOP_SHFL_XOR: s = l ^ g.arg; if (s >= seg + w) s = l; break;
        case WOP_BALLOT: r = bits; break;
        case WOP_ANY: r = bits != 0; break;
        case WOP_ALL: r = bits == mask; break;
        case WOP_SYNCWARP: break;
        case WOP_MATCH_ANY: {
            uint32_t mine;
            memcpy(&mine, g.val, 4);
            for (int j = 0; j < 32; j++) {
                uint32_t other;
                memcpy(&other, base[j].val, 4);
                if ((mask >> j & 1) && other == mine) r |= 1u << j;
            }
            break;
        }
        default: r = (uint32_t)acc; break;
        }
        if (op <= WOP_SHFL_XOR) {
            if (s < 0 || s >= 32 || !(mask >> s & 1))
                fail(&g, "%s (%s:%d) reads lane %d, which is not named in mask 0x%08x: the result "
                     "is undefined on the GPU.\n  HINT: use a mask naming every lane it reads.",
                     op_name(op), g.file, g.line, s, mask);
            src = base[s].val;
        }
        memcpy(g.out, src, op <= WOP_SHFL_XOR ? size : 4);
        g.state = F_RUNNABLE;
    }
    g_stats.warp_ops++;
}

/* Completes f's group if every named lane has arrived; returns whether it did. */
bool check_warp_group(Fiber *f) {
    Fiber *base = &g_launch.fibers[f->warp * 32];
    unsigned mask = f->mask;
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1)) continue;
        Fiber &g = base[l];
        if (&g == f) continue;
        if (g.state == F_DONE)
            fail(f, "%s(mask=0x%08x) (%s:%d) names lane %d, which has exited: a warp primitive "
                 "needs every named lane to execute it.\n  HINT: compute the mask with "
                 "__ballot_sync before lanes leave, or keep all lanes alive.",
                 op_name(f->op), mask, f->file, f->line, l);
        if (g.state != F_WARP) return false; /* not there yet */
        if (g.op == WOP_COLLECTIVE && f->op == WOP_COLLECTIVE && g.coll_fn != f->coll_fn)
            fail(f, "%s (%s:%d) meets lane %d at %s (%s:%d): every lane of a warp must execute the same "
                 "warp-collective instruction (.sync.aligned).", f->coll_name, f->file, f->line, l,
                 g.coll_name, g.file, g.line);
        if (g.op != f->op || g.mask != mask || g.width != f->width || g.size != f->size)
            fail(f, "%s(mask=0x%08x, width %d) (%s:%d) meets lane %d at %s(mask=0x%08x, width %d) "
                 "(%s:%d): lanes named in one mask must execute the same primitive with the same mask.",
                 op_name(f->op), mask, f->width, f->file, f->line, l, op_name(g.op), g.mask, g.width,
                 g.file, g.line);
    }
    complete_warp_op(base, mask);
    return true;
}

/* ---- block scheduling --------------------------------------------------------------------- */
void on_fiber_exit(Fiber *f) {
    Launch &L = g_launch;
    if (!f->cp_pending.empty())
        fail(f, "this thread returned from the kernel with %zu cp.async copies not waited for (the "
             "first issued at %s:%d): their data may land at any time.\n  HINT: end with "
             "cp.async.wait_group 0 (cp_async_wait<0>()).", f->cp_pending.size(),
             f->cp_pending[0].file, f->cp_pending[0].line);
    f->state = F_DONE;
    L.ndone++;
    if (L.barrier_count > 0) {
        const Fiber *w = first_fiber_in(F_BARRIER);
        fail(f, "this thread returned from the kernel while thread (%u,%u,%u) waits at __syncthreads (%s:%d): "
             CUDASIM_EARLY_RETURN_HINT, w->tid.x, w->tid.y, w->tid.z, w->file, w->line);
    }
    /* a lane waiting in a warp primitive that names this one can never complete */
    Fiber *base = &L.fibers[f->warp * 32];
    for (int l = 0; l < lanes_in_warp(f->warp); l++)
        if (base[l].state == F_WARP && (base[l].mask >> f->lane & 1))
            fail(&base[l], "%s(mask=0x%08x) (%s:%d) names lane %d (thread (%u,%u,%u)), which "
                 "returned from the kernel without executing it.", op_name(base[l].op), base[l].mask,
                 base[l].file, base[l].line, f->lane, f->tid.x, f->tid.y, f->tid.z);
}

[[noreturn]] void report_deadlock() {
    Launch &L = g_launch;
    char buf[256];
    fflush(stdout);
    char where[512];
    where_prefix(where, sizeof where, nullptr);
    fprintf(stderr, "cudasim ERROR %s:\n  deadlock: no thread of the block can proceed.\n", where);
    int shown = 0;
    for (const Fiber &f : L.fibers) {
        if (f.state == F_DONE || shown >= 8) continue;
        describe(f, buf, sizeof buf);
        fprintf(stderr, "  thread (%u,%u,%u) [warp %d lane %d] %s\n", f.tid.x, f.tid.y, f.tid.z,
                f.warp, f.lane, buf);
        if (f.state == F_WARP) {
            const Fiber *base = &L.fibers[f.warp * 32];
            for (int l = 0; l < 32; l++) {
                if (!(f.mask >> l & 1)) continue;
                if (l >= lanes_in_warp(f.warp)) {
                    fprintf(stderr, "    -> lane %d named in the mask does not exist (the block has %d threads)\n",
                            l, L.nthreads);
                    break;
                }
                if (base[l].state != F_WARP) {
                    describe(base[l], buf, sizeof buf);
                    fprintf(stderr, "    -> but lane %d named in the mask %s\n", l, buf);
                    break;
                }
            }
        }
        shown++;
    }
    fprintf(stderr, "  HINT: barriers and warp primitives must be reached by every thread they "
                    "name, at the same call site.\n");
    fflush(stderr);
    _exit(CUDASIM_ERROR_EXIT);
}

void run_block() {
    Launch &L = g_launch;
    int n = L.nthreads;
    L.ndone = 0;
    L.barrier_count = 0;
    L.arena_used = 0;
    L.static_bytes = 0;
    L.allocs.clear();
    L.dyn = nullptr;
    if (L.smem) L.dyn = (unsigned char *)arena_take(&L, L.smem, 128, "dynamic shared memory (extern __shared__)");
    for (int t = 0; t < n; t++) {
        Fiber &f = L.fibers[t];
        f.tid = make_uint3(t % L.block.x, t / L.block.x % L.block.y, t / (L.block.x * L.block.y));
        f.linear = t, f.lane = t % 32, f.warp = t / 32;
        f.state = F_RUNNABLE;
        f.started = false;
        f.stack_lo = stack_for(t);
        f.cp_pending.clear();
        f.cp_groups = 0;
    }
    while (L.ndone < n) {
        bool progressed = false;
        for (int t = 0; t < n; t++) {
            Fiber &f = L.fibers[t];
            if (f.state != F_RUNNABLE) continue;
            if (!f.started) start_fiber(f), f.started = true;
            g_cur = &f;
            g_thread = &f;
            resume(f);
            if (!L.allocs.empty()) check_shared_guards(&f);
            progressed = true;
        }
        if (!progressed) report_deadlock();
    }
    g_cur = nullptr;
    g_thread = nullptr;
    g_stats.blocks++;
    g_stats.threads += n;
}

/* ---- SIGSEGV: name the thread and what it touched ------------------------------------------ */
struct Alloc {
    char *map;
    size_t map_len;
    char *user;
    size_t size;
    bool freed;
    int kind; /* 0 device, 1 managed, 2 pinned host */
    unsigned long long id;
};
std::map<uintptr_t, Alloc> g_allocs; /* by mapping base */
unsigned long long g_alloc_serial = 0;
size_t g_live_bytes = 0, g_freed_mapped = 0; /* g_live_bytes: device and managed memory (pinned host memory is not the device's) */
const char *kKindName[3] = {"cudaMalloc", "cudaMallocManaged", "cudaMallocHost"};

const Alloc *alloc_of_mapping(uintptr_t a) {
    auto it = g_allocs.upper_bound(a);
    if (it == g_allocs.begin()) return nullptr;
    --it;
    const Alloc &al = it->second;
    return a < (uintptr_t)al.map + al.map_len ? &al : nullptr;
}

void segv_handler(int sig, siginfo_t *si, void *uctx) {
    uintptr_t a = (uintptr_t)si->si_addr;
    const char *rw = "access";
#if defined(__x86_64__) && defined(REG_ERR)
    rw = (((ucontext_t *)uctx)->uc_mcontext.gregs[REG_ERR] & 2) ? "write" : "read";
#else
    (void)uctx;
#endif
    const Fiber *f = g_in_kernel ? g_cur : nullptr;
    for (char *s : g_stacks)
        if (a >= (uintptr_t)s && a < (uintptr_t)s + kPage)
            fail(f, "fiber stack overflow (stack %zu KiB).\n  HINT: large per-thread arrays need "
                 "CUDASIM_STACK_KB=<bigger>.", stack_size() / 1024);
    if (const Alloc *al = alloc_of_mapping(a)) {
        if (al->freed)
            fail(f, "invalid %s of address %p: use after free - it lies at offset %lld of a %zu-byte "
                 "%s allocation (#%llu) that was released by cudaFree.", rw, (void *)a,
                 (long long)(a - (uintptr_t)al->user), al->size, kKindName[al->kind], al->id);
        if (a < (uintptr_t)al->user)
            fail(f, "out-of-bounds %s of address %p: %lld bytes before the start of a %zu-byte %s "
                 "allocation (#%llu, at %p).", rw, (void *)a, (long long)((uintptr_t)al->user - a),
                 al->size, kKindName[al->kind], al->id, (void *)al->user);
        fail(f, "out-of-bounds %s of address %p: %lld bytes past the end of a %zu-byte %s "
             "allocation (#%llu, at %p; valid indices end at byte %zu).", rw, (void *)a,
             (long long)(a - (uintptr_t)al->user - al->size), al->size, kKindName[al->kind], al->id,
             (void *)al->user, al->size);
    }
    fail(f, "%s (signal %d) at address %p, which is not in any device allocation.", sig == SIGBUS ? "bus error" : "segmentation fault", sig, (void *)a);
}

void install_handlers() {
    static bool done = false;
    if (done) return;
    done = true;
    static char altstack[64 * 1024];
    stack_t ss;
    ss.ss_sp = altstack;
    ss.ss_size = sizeof altstack;
    ss.ss_flags = 0;
    sigaltstack(&ss, nullptr);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = segv_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
}

/* ---- global memory ------------------------------------------------------------------------ */
void check_global_canaries() {
    for (auto &kv : g_allocs) {
        const Alloc &al = kv.second;
        if (al.freed) continue;
        const unsigned char *lo = (const unsigned char *)al.map + kPage;
        const unsigned char *hi = (const unsigned char *)al.map + al.map_len - kPage;
        for (const unsigned char *p = lo; p < (const unsigned char *)al.user; p++)
            if (*p != kGlobalCanary)
                fail(nullptr, "global memory written out of bounds: %lld bytes before the %zu-byte %s "
                     "allocation #%llu (%p).\n  HINT: rerun the failing kernel under gdb, or shrink the "
                     "bug to a block; the write happened inside this kernel.",
                     (long long)((const unsigned char *)al.user - p), al.size, kKindName[al.kind], al.id, (void *)al.user);
        for (const unsigned char *p = (const unsigned char *)al.user + al.size; p < hi; p++)
            if (*p != kGlobalCanary)
                fail(nullptr, "global memory written out of bounds: byte %lld past the end of the %zu-byte "
                     "%s allocation #%llu (%p).\n  HINT: the write happened inside this kernel; check "
                     "its bounds guard (idx < N).",
                     (long long)(p - ((const unsigned char *)al.user + al.size)), al.size, kKindName[al.kind], al.id, (void *)al.user);
    }
}

cudaError_t g_last_error = cudaSuccess;
cudaError_t set_error(cudaError_t e) {
    if (e != cudaSuccess) g_last_error = e;
    return e;
}
__attribute__((format(printf, 2, 3))) cudaError_t api_error(cudaError_t e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fprintf(stderr, "cudasim: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " -> %s\n", cudaGetErrorName(e));
    va_end(ap);
    return set_error(e);
}

cudaError_t guarded_alloc(void **out, size_t size, int kind) {
    install_handlers();
    if (!out) return api_error(cudaErrorInvalidValue, "%s: NULL output pointer", kKindName[kind]);
    *out = nullptr;
    if (size == 0) return cudaSuccess; /* CUDA returns NULL for 0 bytes */
    if (kind != 2 && g_live_bytes + size > kTotalGlobalMem)
        return api_error(cudaErrorMemoryAllocation, "%s(%zu): exceeds the simulated device memory", kKindName[kind], size);
    size_t user_len = (size + 255) / 256 * 256;
    size_t data_len = (user_len + kPage - 1) / kPage * kPage;
    size_t map_len = data_len + 2 * kPage;
    char *map = (char *)mmap(nullptr, map_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED)
        return api_error(cudaErrorMemoryAllocation, "%s(%zu): host mmap failed", kKindName[kind], size);
    mprotect(map + kPage, data_len, PROT_READ | PROT_WRITE);
    char *user = map + kPage + (data_len - user_len);
    memset(map + kPage, kGlobalCanary, user - (map + kPage));
    memset(user + size, kGlobalCanary, user_len - size);
    /* device memory starts undefined: poison it (NaN for floats) unless it is huge */
    if (size <= ((size_t)256 << 20)) memset(user, kPoison, size);
    Alloc al{map, map_len, user, size, false, kind, ++g_alloc_serial};
    g_allocs[(uintptr_t)map] = al;
    if (kind != 2) g_live_bytes += size;
    *out = user;
    return cudaSuccess;
}

Alloc *find_alloc_start(const void *p) {
    const Alloc *al = alloc_of_mapping((uintptr_t)p);
    return al && al->user == p ? const_cast<Alloc *>(al) : nullptr;
}

cudaError_t guarded_free(void *p, int kind, const char *fn) {
    if (!p) return cudaSuccess;
    Alloc *al = find_alloc_start(p);
    if (!al || (kind == 2) != (al->kind == 2))
        return api_error(cudaErrorInvalidValue, "%s(%p): not the start of a live %s allocation", fn, p,
                         kind == 2 ? "cudaMallocHost" : "cudaMalloc/cudaMallocManaged");
    if (al->freed) return api_error(cudaErrorInvalidValue, "%s(%p): double free of allocation #%llu", fn, p, al->id);
    al->freed = true;
    if (al->kind != 2) g_live_bytes -= al->size;
    mprotect(al->map, al->map_len, PROT_NONE);
    madvise(al->map, al->map_len, MADV_DONTNEED);
    g_freed_mapped += al->map_len;
    /* keep freed mappings as traps; forget the oldest ones past 64 GiB of address space */
    while (g_freed_mapped > ((size_t)64 << 30)) {
        auto victim = g_allocs.end();
        for (auto it = g_allocs.begin(); it != g_allocs.end(); ++it)
            if (it->second.freed && (victim == g_allocs.end() || it->second.id < victim->second.id)) victim = it;
        if (victim == g_allocs.end()) break;
        munmap(victim->second.map, victim->second.map_len);
        g_freed_mapped -= victim->second.map_len;
        g_allocs.erase(victim);
    }
    return cudaSuccess;
}

/* Checks that [p, p+n) is inside one live allocation when `device` says it must be. */
cudaError_t check_range(const void *p, size_t n, const char *fn, const char *role) {
    const Alloc *al = alloc_of_mapping((uintptr_t)p);
    if (!al)
        return api_error(cudaErrorInvalidValue, "%s: %s pointer %p is not device memory (not from cudaMalloc)", fn, role, p);
    if (al->freed)
        return api_error(cudaErrorInvalidValue, "%s: %s pointer %p lies in allocation #%llu, which was freed", fn, role, p, al->id);
    uintptr_t a = (uintptr_t)p, u = (uintptr_t)al->user;
    if (a < u || a + n > u + al->size)
        return api_error(cudaErrorInvalidValue, "%s: %s range [%p, +%zu) is outside the %zu-byte allocation #%llu at %p",
                         fn, role, p, n, al->size, al->id, (void *)al->user);
    return cudaSuccess;
}

bool is_device_ptr(const void *p) {
    const Alloc *al = alloc_of_mapping((uintptr_t)p);
    return al && al->kind != 2;
}

/* perform = false: only the checks (a copy recorded during stream capture runs at each launch) */
cudaError_t do_memcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, const char *fn, bool perform = true) {
    if (n == 0) return cudaSuccess;
    if (!dst || !src) return api_error(cudaErrorInvalidValue, "%s: NULL pointer", fn);
    bool dd = false, sd = false;
    switch (kind) {
    case cudaMemcpyHostToHost: break;
    case cudaMemcpyHostToDevice: dd = true; break;
    case cudaMemcpyDeviceToHost: sd = true; break;
    case cudaMemcpyDeviceToDevice: dd = sd = true; break;
    case cudaMemcpyDefault: dd = alloc_of_mapping((uintptr_t)dst) != nullptr; sd = alloc_of_mapping((uintptr_t)src) != nullptr; break;
    default: return api_error(cudaErrorInvalidMemcpyDirection, "%s: kind %d", fn, (int)kind);
    }
    cudaError_t e;
    if (dd && (e = check_range(dst, n, fn, "destination")) != cudaSuccess) return e;
    if (sd && (e = check_range(src, n, fn, "source")) != cudaSuccess) return e;
    if (!dd && is_device_ptr(dst))
        return api_error(cudaErrorInvalidValue, "%s: destination %p is device memory but the kind says host", fn, dst);
    if (!sd && is_device_ptr(src))
        return api_error(cudaErrorInvalidValue, "%s: source %p is device memory but the kind says host", fn, src);
    if (perform) memmove(dst, src, n);
    return cudaSuccess;
}

/* Host memory from cudaMallocHost/cudaHostAlloc (page-locked: an async copy need not wait). */
bool is_pinned_host(const void *p) {
    const Alloc *al = alloc_of_mapping((uintptr_t)p);
    return al && al->kind == 2 && !al->freed;
}

/* Does this copy make the host wait? Between host and device, unless cudaMemcpyAsync's host side
 * is pinned. */
bool memcpy_waits(const void *dst, const void *src, cudaMemcpyKind kind, bool async) {
    bool dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice, sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyDefault) dd = is_device_ptr(dst), sd = is_device_ptr(src);
    if (dd == sd) return false; /* host to host, device to device */
    return !async || !is_pinned_host(dd ? src : dst);
}

std::map<const void *, int> g_max_dyn_smem;
double now_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
struct SimEvent {
    double ms;
    bool recorded;
};
struct SimStream {
    int magic;
};
int g_device = 0;

/* ---- stream capture ---------------------------------------------------------------------------
 * One capture at a time (host code is single-threaded). While a stream captures, kernel launches,
 * cudaMemcpyAsync/cudaMemsetAsync and cublasLtMatmul on it are recorded (arguments by value) and
 * not executed; cudaGraphLaunch replays them in order. A synchronising or otherwise unsafe call
 * (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, cudaMemcpy, cudaMemset,
 * cudaMalloc/cudaFree outside cudaStreamCaptureModeRelaxed, an async copy with pageable host
 * memory, work on the legacy default stream) fails as on a GPU and invalidates the capture, so
 * cudaStreamEndCapture fails too. */
struct Capture {
    bool active = false, invalid = false;
    cudaStream_t stream = nullptr;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    std::vector<std::function<void()>> ops;
};
Capture g_capture;
struct SimGraph {
    int magic;
    std::vector<std::function<void()>> ops;
};
const int kGraphMagic = 0x47524150, kGraphExecMagic = 0x47455845;

bool is_legacy_stream(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy; }

cudaError_t capture_refuse(cudaError_t e, const char *fn, const char *why) {
    g_capture.invalid = true;
    return api_error(e, "%s while stream %p is capturing (a CUDA graph's region): %s; the capture is invalidated", fn,
                     (void *)g_capture.stream, why);
}

/* A call that makes the host wait: counted; during a capture, an error. */
cudaError_t host_sync(const char *fn) {
    g_stats.host_syncs++;
    if (g_capture.active) return capture_refuse(cudaErrorStreamCaptureUnsupported, fn, "the host cannot wait inside a capture");
    return cudaSuccess;
}

/* cudaMalloc/cudaFree-style calls: refused by a capture except in relaxed mode. */
cudaError_t capture_unsafe(const char *fn) {
    if (g_capture.active && g_capture.mode != cudaStreamCaptureModeRelaxed)
        return capture_refuse(cudaErrorStreamCaptureUnsupported, fn, "not permitted outside cudaStreamCaptureModeRelaxed");
    return cudaSuccess;
}

/* The allocation and free entry points (named fn): capture_unsafe, then guarded_alloc/_free. */
cudaError_t api_alloc(const char *fn, void **out, size_t size, int kind) {
    const cudaError_t e = capture_unsafe(fn);
    return e != cudaSuccess ? e : guarded_alloc(out, size, kind);
}
cudaError_t api_free(const char *fn, void *p, int kind) {
    const cudaError_t e = capture_unsafe(fn);
    return e != cudaSuccess ? e : guarded_free(p, kind, fn);
}

} // namespace

/* ---- entry points used by cudasim.h --------------------------------------------------------- */
Stats stats() { return g_stats; }

namespace detail {
CaptureAction capture_action(cudaStream_t stream, const char *what, const char *file, int line) {
    if (!g_capture.active) return CAPTURE_EXECUTE;
    char why[512];
    if (stream == g_capture.stream) {
        if (!g_capture.invalid) return CAPTURE_RECORD;
        snprintf(why, sizeof why, "%s (%s:%d) on an invalidated capture", what, file ? file : "?", line);
        set_error(cudaErrorStreamCaptureInvalidated);
        return CAPTURE_REFUSED;
    }
    if (is_legacy_stream(stream) && g_capture.mode != cudaStreamCaptureModeRelaxed) {
        snprintf(why, sizeof why, "the legacy default stream synchronises with the capturing stream (%s:%d)", file ? file : "?", line);
        capture_refuse(cudaErrorStreamCaptureImplicit, what, why);
        return CAPTURE_REFUSED;
    }
    return CAPTURE_EXECUTE; /* another stream: not part of the graph */
}
void capture_record(std::function<void()> op) { g_capture.ops.push_back(std::move(op)); }
bool capture_active() { return g_capture.active; }
} // namespace detail

namespace detail {

int barrier(int op, int pred, const char *file, int line) {
    Fiber *f = g_cur;
    if (!g_in_kernel || !f) fail(nullptr, "__syncthreads called outside a kernel (%s:%d)", file, line);
    Launch &L = g_launch;
    g_stats.barriers++;
    if (L.ndone > 0) {
        const Fiber *gone = first_fiber_in(F_DONE);
        fail(f, "__syncthreads (%s:%d) reached after thread (%u,%u,%u) of this block returned from the kernel: "
             CUDASIM_EARLY_RETURN_HINT, file, line, gone->tid.x, gone->tid.y, gone->tid.z);
    }
    if (L.barrier_count == 0) {
        L.barrier_file = file, L.barrier_line = line, L.barrier_op = op;
        L.barrier_acc = op == BAR_AND ? 1 : 0;
    } else if (L.barrier_line != line || strcmp(L.barrier_file, file) != 0 || L.barrier_op != op) {
        fail(f, "divergent barriers: this thread is at __syncthreads (%s:%d) while other threads of "
             "the block wait at __syncthreads (%s:%d).\n  HINT: __syncthreads inside a branch "
             "requires the branch to be taken by the whole block.", file, line, L.barrier_file, L.barrier_line);
    }
    if (op == BAR_COUNT) L.barrier_acc += pred;
    else if (op == BAR_AND) L.barrier_acc &= pred;
    else if (op == BAR_OR) L.barrier_acc |= pred;
    f->file = file, f->line = line;
    if (++L.barrier_count == L.nthreads) {
        L.barrier_result = L.barrier_acc;
        L.barrier_count = 0;
        for (Fiber &g : L.fibers)
            if (g.state == F_BARRIER) g.state = F_RUNNABLE;
        return L.barrier_result;
    }
    f->state = F_BARRIER;
    block_current();
    return L.barrier_result;
}

void warp_exchange(int op, unsigned mask, const void *val, size_t size, int arg, int width,
                   void *out, const char *file, int line, bool is_signed) {
    Fiber *f = g_cur;
    if (!g_in_kernel || !f) fail(nullptr, "%s called outside a kernel (%s:%d)", op_name(op), file, line);
    if (!(mask >> f->lane & 1))
        fail(f, "%s (%s:%d) called with mask 0x%08x, which does not name the calling lane %d.",
             op_name(op), file, line, mask, f->lane);
    int nl = lanes_in_warp(f->warp);
    if (nl < 32 && (mask >> nl) != 0)
        fail(f, "%s (%s:%d) mask 0x%08x names lanes %d..31, which do not exist: the block has %d "
             "threads, so warp %d has only %d.\n  HINT: use a block size that is a multiple of 32 "
             "or a mask from __ballot_sync.", op_name(op), file, line, mask, nl, g_launch.nthreads,
             f->warp, nl);
    if (op <= WOP_SHFL_XOR && (width < 1 || width > 32 || (width & (width - 1))))
        fail(f, "%s (%s:%d): width %d is not a power of two in [1, 32].", op_name(op), file, line, width);
    f->op = op, f->mask = mask, f->arg = arg, f->width = width, f->size = size, f->out = out;
    f->file = file, f->line = line, f->is_signed = is_signed;
    memcpy(f->val, val, size);
    f->state = F_WARP;
    if (!check_warp_group(f)) block_current(); /* the last lane to arrive completes the group */
}

void warp_collective(const char *name, void (*fn)(void *const *), void *ctx, const char *file, int line) {
    Fiber *f = g_cur;
    if (!g_in_kernel || !f) fail(nullptr, "%s called outside a kernel (%s:%d)", name, file, line);
    if (lanes_in_warp(f->warp) < 32)
        fail(f, "%s (%s:%d) in a warp of %d threads (the block has %d): the instruction is "
             ".sync.aligned and needs all 32 lanes.\n  HINT: use a block size that is a multiple of 32.",
             name, file, line, lanes_in_warp(f->warp), g_launch.nthreads);
    f->coll_name = name, f->coll_fn = fn, f->coll_ctx = ctx;
    f->op = WOP_COLLECTIVE, f->mask = 0xffffffffu, f->arg = 0, f->width = 32, f->size = 0, f->out = nullptr;
    f->file = file, f->line = line, f->is_signed = false;
    f->state = F_WARP;
    if (!check_warp_group(f)) block_current();
}

void cp_async(void *dst, const void *src, size_t bytes, const char *file, int line) {
    Fiber *f = g_cur;
    if (!g_in_kernel || !f) fail(nullptr, "cp.async called outside a kernel (%s:%d)", file, line);
    if (bytes != 4 && bytes != 8 && bytes != 16)
        fail(f, "cp.async (%s:%d) of %zu bytes: the copy size is 4, 8 or 16.", file, line, bytes);
    check_aligned(dst, bytes, "cp.async shared destination", file, line);
    check_aligned(src, bytes, "cp.async global source", file, line);
    const unsigned char *a = g_launch.arena;
    if ((const unsigned char *)dst < a || (const unsigned char *)dst + bytes > a + g_launch.arena_used)
        fail(f, "cp.async (%s:%d): destination %p is not in the block's shared memory.", file, line, dst);
    Fiber::CpAsync c;
    c.dst = dst, c.bytes = bytes, c.group = -1, c.file = file, c.line = line;
    memcpy(c.data, src, bytes); /* the source is read at issue (a fault names this thread) */
    f->cp_pending.push_back(c);
}

void cp_async_commit() {
    Fiber *f = g_cur;
    if (!g_in_kernel || !f) fail(nullptr, "cp.async.commit_group called outside a kernel");
    for (Fiber::CpAsync &c : f->cp_pending)
        if (c.group < 0) c.group = f->cp_groups;
    f->cp_groups++; /* an empty group is a group too (wait_group N counts it) */
}

void cp_async_wait(int pending, const char *file, int line) {
    Fiber *f = g_cur;
    if (!g_in_kernel || !f) fail(nullptr, "cp.async.wait_group called outside a kernel (%s:%d)", file, line);
    if (pending < 0) fail(f, "cp.async.wait_group %d (%s:%d): N must be >= 0.", pending, file, line);
    /* groups older than the `pending` most recent ones complete; uncommitted copies stay */
    const long done_below = f->cp_groups - pending;
    std::vector<Fiber::CpAsync> keep;
    for (const Fiber::CpAsync &c : f->cp_pending) {
        if (c.group >= 0 && c.group < done_below) memcpy(c.dst, c.data, c.bytes);
        else keep.push_back(c);
    }
    f->cp_pending.swap(keep);
}

unsigned active_mask() {
    Fiber *f = g_cur;
    if (!f) return 0;
    unsigned m = 0;
    const Fiber *base = &g_launch.fibers[f->warp * 32];
    for (int l = 0; l < lanes_in_warp(f->warp); l++)
        if (base[l].state != F_DONE) m |= 1u << l;
    return m;
}

void *shared_alloc(const void *key, size_t size, size_t align, const char *name) {
    Launch &L = g_launch;
    if (!g_in_kernel) fail(nullptr, "__shared__ variable %s used outside a kernel", name);
    for (const SharedAlloc &a : L.allocs)
        if (a.key == key) return L.arena + a.offset;
    L.static_bytes += size;
    if (L.static_bytes > kStaticSmemLimit)
        fail(g_cur, "static __shared__ memory of the kernel exceeds %zu bytes with %s (%zu bytes): "
             "ptxas rejects this.\n  HINT: use dynamic shared memory and cudaFuncSetAttribute.",
             kStaticSmemLimit, name, size);
    if (L.static_bytes + L.smem > kSmemOptinLimit)
        fail(g_cur, "static (%zu) + dynamic (%zu) shared memory exceeds the %zu-byte per-block "
             "limit of sm_90.", L.static_bytes, L.smem, kSmemOptinLimit);
    return arena_take(key, size, align, name);
}

void *dynamic_shared() {
    if (!g_in_kernel) fail(nullptr, "extern __shared__ memory used outside a kernel");
    return g_launch.dyn ? g_launch.dyn : g_launch.arena; /* 0 bytes: any address, never valid */
}

void device_error(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fail(g_in_kernel ? g_cur : nullptr, "%s (%s:%d)", msg, file, line);
}

void check_aligned(const void *p, size_t align, const char *what, const char *file, int line) {
    if ((uintptr_t)p % align)
        fail(g_in_kernel ? g_cur : nullptr, "misaligned address %p in %s (%s:%d): a %zu-byte access "
             "needs %zu-byte alignment (cudaErrorMisalignedAddress on the GPU).", p, what, file, line,
             align, align);
}

bool launch_begin(const char *name, const void *kaddr, dim3 g, dim3 b, size_t smem,
                  cudaStream_t stream, const char *file, int line) {
    (void)stream;
    install_handlers();
    if (g_in_kernel) fail(g_cur, "kernel '%s' launched from device code (dynamic parallelism is not supported)", name);
    unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    const char *why = nullptr;
    char buf[256];
    cudaError_t err = cudaErrorInvalidConfiguration;
    if (threads == 0 || g.x == 0 || g.y == 0 || g.z == 0) why = "a zero grid or block dimension";
    else if (threads > 1024) snprintf(buf, sizeof buf, "%llu threads per block > 1024", threads), why = buf;
    else if (b.x > 1024 || b.y > 1024 || b.z > 64) why = "block dimensions above (1024, 1024, 64)";
    else if (g.x > 2147483647u || g.y > 65535 || g.z > 65535) why = "grid dimensions above (2^31-1, 65535, 65535)";
    else if (smem > kSmemOptinLimit) {
        snprintf(buf, sizeof buf, "%zu bytes of dynamic shared memory > %zu (the sm_90 per-block maximum)", smem, kSmemOptinLimit);
        why = buf, err = cudaErrorInvalidValue;
    } else if (smem > kSmemDefaultLimit) {
        auto it = kaddr ? g_max_dyn_smem.find(kaddr) : g_max_dyn_smem.end();
        if (kaddr && (it == g_max_dyn_smem.end() || (size_t)it->second < smem)) {
            snprintf(buf, sizeof buf, "%zu bytes of dynamic shared memory > %zu without "
                     "cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, >= %zu)",
                     smem, it == g_max_dyn_smem.end() ? kSmemDefaultLimit : (size_t)it->second, smem);
            why = buf, err = cudaErrorInvalidValue;
        }
    }
    if (why) {
        fflush(stdout);
        fprintf(stderr, "cudasim: launch of kernel '%s' at %s:%d rejected: grid (%u,%u,%u) block "
                "(%u,%u,%u) smem %zu: %s -> %s\n", name, file, line, g.x, g.y, g.z, b.x, b.y, b.z,
                smem, why, cudaGetErrorName(err));
        set_error(err);
        return false;
    }
    Launch &L = g_launch;
    L.name = name, L.file = file, L.line = line, L.grid = g, L.block = b, L.smem = smem;
    L.nthreads = (int)threads;
    if ((int)L.fibers.size() < L.nthreads) L.fibers.resize(L.nthreads);
    if (!L.arena) {
        L.arena_cap = 512 * 1024;
        L.arena = (unsigned char *)malloc(L.arena_cap);
    }
    return true;
}

void launch_run(void (*entry)(void *), void *ctx) {
    Launch &L = g_launch;
    L.entry = entry, L.ctx = ctx;
    g_in_kernel = true;
    g_stats.launches++;
    g_block.gdim = L.grid;
    g_block.bdim = L.block;
    for (unsigned z = 0; z < L.grid.z; z++)
        for (unsigned y = 0; y < L.grid.y; y++)
            for (unsigned x = 0; x < L.grid.x; x++) {
                g_block.bid = make_uint3(x, y, z);
                run_block();
            }
    check_global_canaries();
    g_in_kernel = false;
}

} // namespace detail
} // namespace cudasim

/* ============================ CUDA runtime API subset ====================================== */
using namespace cudasim;
using namespace cudasim::detail;

extern "C" {

cudaError_t cudaMalloc(void **devPtr, size_t size) { return api_alloc("cudaMalloc", devPtr, size, 0); }
cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
    (void)flags;
    return api_alloc("cudaMallocManaged", devPtr, size, 1);
}
cudaError_t cudaMallocHost(void **ptr, size_t size) { return api_alloc("cudaMallocHost", ptr, size, 2); }
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags) {
    (void)flags;
    return api_alloc("cudaHostAlloc", ptr, size, 2);
}
cudaError_t cudaFree(void *devPtr) { return api_free("cudaFree", devPtr, 0); }
cudaError_t cudaFreeHost(void *ptr) { return api_free("cudaFreeHost", ptr, 2); }

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    if (memcpy_waits(dst, src, kind, false) || g_capture.active) {
        cudaError_t e = host_sync("cudaMemcpy");
        if (e != cudaSuccess) return e;
    }
    return do_memcpy(dst, src, count, kind, "cudaMemcpy");
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
    const bool waits = memcpy_waits(dst, src, kind, true);
    switch (capture_action(stream, "cudaMemcpyAsync", nullptr, 0)) {
    case CAPTURE_REFUSED: return cudaGetLastError();
    case CAPTURE_RECORD: {
        if (waits) /* pageable host memory: the copy is synchronous, which a graph cannot hold */
            return capture_refuse(cudaErrorStreamCaptureUnsupported, "cudaMemcpyAsync", "the host side is pageable memory (not from cudaMallocHost)");
        cudaError_t e = do_memcpy(dst, src, count, kind, "cudaMemcpyAsync", false);
        if (e == cudaSuccess) capture_record([=]() { do_memcpy(dst, src, count, kind, "cudaMemcpyAsync (graph)"); });
        return e;
    }
    case CAPTURE_EXECUTE: break;
    }
    if (waits) g_stats.host_syncs++;
    return do_memcpy(dst, src, count, kind, "cudaMemcpyAsync");
}
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cudaMemcpyKind kind) {
    for (size_t r = 0; r < height; r++) {
        cudaError_t e = do_memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width, kind, "cudaMemcpy2D");
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}
cudaError_t cudaMemcpyToSymbol(const void *symbol, const void *src, size_t count, size_t offset, enum cudaMemcpyKind kind) {
    (void)kind;
    memmove((char *)symbol + offset, src, count);
    return cudaSuccess;
}
cudaError_t cudaMemcpyFromSymbol(void *dst, const void *symbol, size_t count, size_t offset, enum cudaMemcpyKind kind) {
    (void)kind;
    memmove(dst, (const char *)symbol + offset, count);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
    if (capture_action(nullptr, "cudaMemset", nullptr, 0) == CAPTURE_REFUSED) return cudaGetLastError();
    if (count == 0) return cudaSuccess;
    cudaError_t e = check_range(devPtr, count, "cudaMemset", "destination");
    if (e != cudaSuccess) return e;
    memset(devPtr, value, count);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
    switch (capture_action(stream, "cudaMemsetAsync", nullptr, 0)) {
    case CAPTURE_REFUSED: return cudaGetLastError();
    case CAPTURE_RECORD: {
        cudaError_t e = count ? check_range(devPtr, count, "cudaMemsetAsync", "destination") : cudaSuccess;
        if (e == cudaSuccess) capture_record([=]() { if (count) memset(devPtr, value, count); });
        return e;
    }
    case CAPTURE_EXECUTE: break;
    }
    if (count == 0) return cudaSuccess;
    cudaError_t e = check_range(devPtr, count, "cudaMemsetAsync", "destination");
    if (e != cudaSuccess) return e;
    memset(devPtr, value, count);
    return cudaSuccess;
}
cudaError_t cudaMemPrefetchAsync(const void *, size_t, struct cudaMemLocation, unsigned int, cudaStream_t) {
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
    *pStream = (cudaStream_t) new SimStream{0x5757};
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    (void)flags;
    return cudaStreamCreate(pStream);
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    SimStream *s = (SimStream *)stream;
    if (!s || s->magic != 0x5757) return api_error(cudaErrorInvalidResourceHandle, "cudaStreamDestroy(%p)", (void *)stream);
    s->magic = 0;
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return host_sync("cudaStreamSynchronize"); }
cudaError_t cudaStreamQuery(cudaStream_t stream) {
    if (g_capture.active && (stream == g_capture.stream || is_legacy_stream(stream)))
        return capture_refuse(cudaErrorStreamCaptureUnsupported, "cudaStreamQuery", "a capturing stream cannot be queried");
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
/* Streams run their work in order as it is queued, so the host function runs now (in a graph
 * capture: when the graph is launched). */
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData) {
    switch (capture_action(stream, "cudaLaunchHostFunc", nullptr, 0)) {
    case CAPTURE_REFUSED: return cudaGetLastError();
    case CAPTURE_RECORD: capture_record([=]() { fn(userData); }); return cudaSuccess;
    default: fn(userData); return cudaSuccess;
    }
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
    *event = (cudaEvent_t) new SimEvent{0.0, false};
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    (void)flags;
    return cudaEventCreate(event);
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    (void)stream;
    SimEvent *e = (SimEvent *)event;
    e->ms = now_ms(), e->recorded = true;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return host_sync("cudaEventSynchronize"); }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    SimEvent *a = (SimEvent *)start, *b = (SimEvent *)end;
    if (!a->recorded || !b->recorded) return api_error(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: event not recorded");
    *ms = (float)(b->ms - a->ms);
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
    delete (SimEvent *)event;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return host_sync("cudaDeviceSynchronize"); }

/* ---- CUDA graphs from stream capture (see Capture) ---- */
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    if (g_capture.active)
        return api_error(cudaErrorIllegalState, "cudaStreamBeginCapture(%p): stream %p is already capturing (one capture at a time here)",
                         (void *)stream, (void *)g_capture.stream);
    if (is_legacy_stream(stream))
        return api_error(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture: the legacy default stream cannot be captured");
    g_capture = Capture();
    g_capture.active = true;
    g_capture.stream = stream;
    g_capture.mode = mode;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph) {
    if (!pGraph) return api_error(cudaErrorInvalidValue, "cudaStreamEndCapture: NULL graph pointer");
    *pGraph = nullptr;
    if (!g_capture.active || stream != g_capture.stream)
        return api_error(cudaErrorIllegalState, "cudaStreamEndCapture(%p): the stream is not capturing", (void *)stream);
    const bool invalid = g_capture.invalid;
    SimGraph *g = new SimGraph{kGraphMagic, std::move(g_capture.ops)};
    g_capture = Capture();
    if (invalid) {
        delete g;
        return api_error(cudaErrorStreamCaptureInvalidated, "cudaStreamEndCapture(%p): the capture was invalidated by an earlier call", (void *)stream);
    }
    *pGraph = (cudaGraph_t)g;
    return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus) {
    if (!pCaptureStatus) return api_error(cudaErrorInvalidValue, "cudaStreamIsCapturing: NULL status pointer");
    *pCaptureStatus = !g_capture.active || stream != g_capture.stream ? cudaStreamCaptureStatusNone
                      : g_capture.invalid                             ? cudaStreamCaptureStatusInvalidated
                                                                      : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}
static SimGraph *graph_of(const void *h, int magic, const char *fn) {
    SimGraph *g = (SimGraph *)h;
    if (!g || g->magic != magic) {
        api_error(cudaErrorInvalidResourceHandle, "%s(%p): not a live %s", fn, h, magic == kGraphMagic ? "cudaGraph_t" : "cudaGraphExec_t");
        return nullptr;
    }
    return g;
}
/* cudaGraphDestroy / cudaGraphExecDestroy (named fn): the magic cleared, so a later use is reported. */
static cudaError_t graph_destroy(const void *h, int magic, const char *fn) {
    SimGraph *g = graph_of(h, magic, fn);
    if (!g) return cudaErrorInvalidResourceHandle;
    g->magic = 0;
    delete g;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags) {
    (void)flags;
    SimGraph *g = graph_of(graph, kGraphMagic, "cudaGraphInstantiate");
    if (!g) return cudaErrorInvalidResourceHandle;
    *pGraphExec = (cudaGraphExec_t) new SimGraph{kGraphExecMagic, g->ops}; /* independent of the graph from now on */
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
    SimGraph *g = graph_of(graphExec, kGraphExecMagic, "cudaGraphLaunch");
    if (!g) return cudaErrorInvalidResourceHandle;
    switch (capture_action(stream, "cudaGraphLaunch", nullptr, 0)) {
    case CAPTURE_REFUSED: return cudaGetLastError();
    case CAPTURE_RECORD: {
        std::vector<std::function<void()>> ops = g->ops;
        capture_record([ops]() { for (const auto &op : ops) op(); });
        return cudaSuccess;
    }
    case CAPTURE_EXECUTE: break;
    }
    g_stats.graph_launches++;
    for (const auto &op : g->ops) op();
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
    return graph_destroy(graphExec, kGraphExecMagic, "cudaGraphExecDestroy");
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) { return graph_destroy(graph, kGraphMagic, "cudaGraphDestroy"); }
cudaError_t cudaDeviceReset(void) { return cudaSuccess; }
cudaError_t cudaGetLastError(void) {
    cudaError_t e = g_last_error;
    g_last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return g_last_error; }

const char *cudaGetErrorName(cudaError_t error) {
    switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    default: return "cudaError(unknown to cudasim)";
    }
}
const char *cudaGetErrorString(cudaError_t error) {
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorIllegalState: return "the resource is not in a valid state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
    default: return "unknown error (cudasim)";
    }
}

cudaError_t cudaGetDeviceCount(int *count) {
    *count = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
    *device = g_device;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
    if (device != 0) return api_error(cudaErrorInvalidDevice, "cudaSetDevice(%d): cudasim has one device", device);
    g_device = device;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v) { *v = CUDART_VERSION; return cudaSuccess; }
cudaError_t cudaRuntimeGetVersion(int *v) { *v = CUDART_VERSION; return cudaSuccess; }

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device) {
    if (device != 0) return api_error(cudaErrorInvalidDevice, "cudaGetDeviceProperties(%d)", device);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cudasim (H200-shaped)");
    p->totalGlobalMem = kTotalGlobalMem;
    p->sharedMemPerBlock = kSmemDefaultLimit;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->memPitch = 2147483647;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9, p->minor = 0;
    p->textureAlignment = 512;
    p->multiProcessorCount = kNumSMs;
    p->canMapHostMemory = 1;
    p->concurrentKernels = 1;
    p->asyncEngineCount = 3;
    p->unifiedAddressing = 1;
    p->memoryBusWidth = 6144;
    p->l2CacheSize = 50 * 1024 * 1024;
    p->maxThreadsPerMultiProcessor = 2048;
    p->sharedMemPerMultiprocessor = kSmemPerSM;
    p->regsPerMultiprocessor = 65536;
    p->managedMemory = 1;
    p->cooperativeLaunch = 1;
    p->sharedMemPerBlockOptin = kSmemOptinLimit;
    p->maxBlocksPerMultiProcessor = 32;
    p->reservedSharedMemPerBlock = 1024;
    p->clusterLaunch = 1;
    return cudaSuccess;
}

/* The simulated device sits at PCI 0000:00:00.0 (pciDomainID/pciBusID/pciDeviceID are 0 in its
 * properties), in CUDA's "domain:bus:device.function" form. No real GPU has that address, so
 * NVML (where installed) finds no device there. */
cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device) {
    if (device != 0) return api_error(cudaErrorInvalidDevice, "cudaDeviceGetPCIBusId(device %d)", device);
    if (!pciBusId || len < 13) return api_error(cudaErrorInvalidValue, "cudaDeviceGetPCIBusId: buffer of %d bytes (needs 13)", len);
    snprintf(pciBusId, (size_t)len, "0000:00:00.0");
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    if (device != 0) return api_error(cudaErrorInvalidDevice, "cudaDeviceGetAttribute(device %d)", device);
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxBlockDimX: case cudaDevAttrMaxBlockDimY: *value = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *value = 64; break;
    case cudaDevAttrMaxGridDimX: *value = 2147483647; break;
    case cudaDevAttrMaxGridDimY: case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)kSmemDefaultLimit; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)kSmemOptinLimit; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = (int)kSmemPerSM; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = kNumSMs; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = 2048; break;
    case cudaDevAttrMaxRegistersPerBlock: case cudaDevAttrMaxRegistersPerMultiprocessor: *value = 65536; break;
    case cudaDevAttrL2CacheSize: *value = 50 * 1024 * 1024; break;
    case cudaDevAttrMaxBlocksPerMultiprocessor: *value = 32; break;
    case cudaDevAttrTotalConstantMemory: *value = 65536; break;
    case cudaDevAttrUnifiedAddressing: case cudaDevAttrManagedMemory: case cudaDevAttrConcurrentKernels: *value = 1; break;
    default:
        return api_error(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute %d is not modelled by cudasim", (int)attr);
    }
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    *free_bytes = kTotalGlobalMem - g_live_bytes;
    *total = kTotalGlobalMem;
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || (size_t)value > kSmemOptinLimit)
            return api_error(cudaErrorInvalidValue, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize, %d): above %zu", value, kSmemOptinLimit);
        g_max_dyn_smem[func] = value;
        return cudaSuccess;
    }
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
    return api_error(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute %d is not modelled by cudasim", (int)attr);
}

/* Blocks per SM from the thread, block-count and shared-memory limits of sm_90 (registers are
 * unknown here and assumed not to limit; static shared memory is unknown until the kernel runs). */
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, const void *func, int blockSize, size_t dynamicSMemSize) {
    (void)func;
    if (blockSize <= 0 || blockSize > 1024) return api_error(cudaErrorInvalidValue, "cudaOccupancyMaxActiveBlocksPerMultiprocessor: blockSize %d", blockSize);
    int warps = (blockSize + 31) / 32;
    int n = 64 / warps;
    if (n > 32) n = 32;
    size_t per_block = dynamicSMemSize + 1024;
    int by_smem = (int)(kSmemPerSM / per_block);
    if (by_smem < n) n = by_smem;
    *numBlocks = n;
    return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, const void *func, int blockSize,
                                                                   size_t dynamicSMemSize, unsigned int flags) {
    (void)flags;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(numBlocks, func, blockSize, dynamicSMemSize);
}

} /* extern "C" */
