/* Every malloc, calloc, realloc, aligned allocation and free a process makes while logging is on, and a
 * replay of them: the page faults a CPU step's heap takes (ckptbench/measure/malloclog.py says why).
 *
 * Built by malloclog.py (cc -O2 -shared -fPIC) and preloaded into the workers (LD_PRELOAD).  Calls go
 * straight to glibc's own entry points (__libc_malloc and the rest), so the heap is glibc's as in any
 * process; with logging off a call costs one flag test more.  Nothing here allocates through malloc: the
 * log and the replay's table are anonymous mappings.
 *
 * mlog_on(1) starts a log (the last one dropped), mlog_on(0) stops it; mlog_events() is its length
 * (mlog_dropped(): calls past its capacity, not logged).  mlog_replay(thread_clock, &faults, &priced,
 * &seconds) makes the logged calls again in order, each free on the block the replay made where the
 * process freed the logged one (a free of a block made before the log is skipped, a block still live at
 * the end is freed then), writes one byte of every page each block spans (the step's ops write all of
 * theirs) and returns the allocations replayed.  `faults` gets the minor page faults it took (getrusage,
 * before and after); `priced` and `seconds` the faults of the blocks of a page or more that faulted and
 * what those took, made and written, and freed (by this thread's CPU clock where `thread_clock`, else the
 * monotonic one): a fault's price in the step's own pattern.  Smaller calls are not read one by one: two
 * system calls each would cost more than the calls.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

enum { MALLOC = 1, FREE, REALLOC, MEMALIGN };
typedef struct { uint64_t kind, size, ptr, old; } event_t;

#define CAPACITY (1u << 23) /* events a log holds: 8 M, 256 MiB reserved, touched only as used */
#define PREFAULT (2u << 20)   /* bytes of it written when it is mapped: 64 K events, more than a step's */
static event_t *log_;
static volatile int on;
static uint64_t n;

static void note(uint64_t kind, uint64_t size, void *ptr, void *old) {
    if (!on) return;
    uint64_t i = __atomic_fetch_add(&n, 1, __ATOMIC_RELAXED);
    if (i < CAPACITY) log_[i] = (event_t){kind, size, (uint64_t)ptr, (uint64_t)old};
}

void *malloc(size_t size) { void *p = __libc_malloc(size); if (p) note(MALLOC, size, p, 0); return p; }
void *calloc(size_t a, size_t b) { void *p = __libc_calloc(a, b); if (p) note(MALLOC, a * b, p, 0); return p; }
void free(void *p) { if (p) note(FREE, 0, p, 0); __libc_free(p); }
void *realloc(void *old, size_t size) {
    void *p = __libc_realloc(old, size);
    if (p || !size) note(REALLOC, size, p, old);
    return p;
}
void *memalign(size_t align, size_t size) {
    void *p = __libc_memalign(align, size);
    if (p) note(MEMALIGN, size, p, (void *)align);
    return p;
}
void *aligned_alloc(size_t align, size_t size) { return memalign(align, size); }
int posix_memalign(void **out, size_t align, size_t size) {
    if (!align || align % sizeof(void *) || (align & (align - 1))) return EINVAL;
    void *p = memalign(align, size);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}

void mlog_on(int x) {
    if (x) {
        if (!log_) {
            void *m = mmap(0, (size_t)CAPACITY * sizeof(event_t), PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (m == MAP_FAILED) return;
            memset(m, 0, PREFAULT); /* the log's first pages faulted now, not in the step it logs */
            log_ = m;
        }
        n = 0;
    }
    on = x;
}

uint64_t mlog_events(void) { return n < CAPACITY ? n : CAPACITY; }
uint64_t mlog_dropped(void) { return n < CAPACITY ? 0 : n - CAPACITY; }

static long minflt(void) { struct rusage u; getrusage(RUSAGE_SELF, &u); return u.ru_minflt; }
static double now(clockid_t id) { struct timespec t; clock_gettime(id, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

static void touch(void *p, uint64_t size) {
    if (!size) return;
    uintptr_t a = (uintptr_t)p, end = a + size;
    for (uintptr_t page = a & ~(uintptr_t)4095; page < end; page += 4096)
        *(volatile char *)(page < a ? a : page) = 1;
}

/* open addressing: a logged pointer -> the replay's block for it (low bit: it faulted), 0 once freed */
static uint64_t *keys, *vals, slots;
static uint64_t find(uint64_t key) {
    uint64_t h = (key >> 4) * 0x9E3779B97F4A7C15ull & (slots - 1);
    while (keys[h] && keys[h] != key) h = (h + 1) & (slots - 1);
    return h;
}
static void put(uint64_t key, uint64_t val) { uint64_t h = find(key); keys[h] = key; vals[h] = val; }
static uint64_t take(uint64_t key) {
    uint64_t h = find(key), got = keys[h] == key ? vals[h] : 0;
    vals[h] = 0;
    return got;
}

uint64_t mlog_replay(int thread_clock, long *faults, long *priced, double *seconds) {
    clockid_t id = thread_clock ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
    uint64_t events = mlog_events(), made = 0;
    *faults = *priced = 0;
    *seconds = 0;
    for (slots = 1; slots < 4 * events + 16; slots <<= 1) {}
    size_t bytes = slots * sizeof(uint64_t);
    void *table = mmap(0, 2 * bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (table == MAP_FAILED) return 0;
    keys = table;
    vals = keys + slots;
    memset(keys, 0, 2 * bytes); /* the table's own faults, before the count starts */
    long start = minflt();
    for (uint64_t i = 0; i < events; i++) {
        event_t e = log_[i];
        if (e.kind == FREE) {
            uint64_t mine = take(e.ptr);
            if (mine & 1) { /* a block that faulted: its free (an unmap) is part of its price */
                double t0 = now(id);
                __libc_free((void *)(mine & ~1ull));
                *seconds += now(id) - t0;
            } else if (mine) {
                __libc_free((void *)mine);
            }
            continue;
        }
        int big = e.size >= 4096;
        long f0 = big ? minflt() : 0;
        double t0 = big ? now(id) : 0;
        void *p = 0;
        if (e.kind == REALLOC) {
            uint64_t mine = e.old ? take(e.old) & ~1ull : 0;
            p = mine ? __libc_realloc((void *)mine, e.size) : (e.size ? __libc_malloc(e.size) : 0);
        } else if (e.kind == MEMALIGN) {
            p = __libc_memalign(e.old, e.size);
        } else {
            p = __libc_malloc(e.size);
        }
        if (!p) continue;
        touch(p, e.size);
        uint64_t faulted = 0;
        if (big) {
            long took = minflt() - f0;
            if (took) { *seconds += now(id) - t0; *priced += took; faulted = 1; }
        }
        if (e.ptr) { put(e.ptr, (uint64_t)p | faulted); made++; } else __libc_free(p);
    }
    *faults = minflt() - start;
    for (uint64_t h = 0; h < slots; h++)
        if (keys[h] && vals[h]) __libc_free((void *)(vals[h] & ~1ull));
    munmap(table, 2 * bytes);
    return made;
}
