// libcuda.so.1 stand-in: the CUDA driver's copy path on the CPU, for tests and CI without a GPU.
//
// "Device memory" is host memory the stub hands out and remembers; "the device" is one engine
// thread running queued operations in order (every stream shares it). A device-to-host copy goes
// the way the driver's documentation says it does:
// - into pinned memory (registered with cuMemHostRegister or allocated with cuMemAllocHost /
//   cuMemHostAlloc): the engine writes the destination itself; the async call returns at once and
//   cuStreamSynchronize waits for it;
// - into pageable memory: staged, in chunks of CKPT_CUDA_STUB_STAGING_KIB (2048), through a pinned
//   staging buffer: the engine copies a chunk into it, then the host copies it on into the
//   destination, the calling thread or (CKPT_CUDA_STUB_WORKER=1) the driver's own worker thread;
//   the call returns when the last chunk is in, async or not.
// The truth (cudastub.h) says what each call did, measured by the stub itself.

#define _GNU_SOURCE
#include "cuda.h"
#include "cudastub.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default"))) __attribute__((noinline))

EXPORT int64_t cudastub_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t thread_faults(void) {
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    return ru.ru_minflt + ru.ru_majflt;
}

static int gettid_(void) { return (int) syscall(SYS_gettid); }

// ---- address ranges: device allocations and pinned host memory ----

#define MAX_RANGES 4096
struct ranges {
    uintptr_t lo[MAX_RANGES], hi[MAX_RANGES];
    int n;
};
static struct ranges device_mem, pinned_mem;
static pthread_mutex_t ranges_mu = PTHREAD_MUTEX_INITIALIZER;

static int ranges_add(struct ranges * rs, const void * p, size_t n) {
    pthread_mutex_lock(&ranges_mu);
    int ok = rs->n < MAX_RANGES;
    if (ok) {
        rs->lo[rs->n] = (uintptr_t) p;
        rs->hi[rs->n] = (uintptr_t) p + n;
        rs->n++;
    }
    pthread_mutex_unlock(&ranges_mu);
    return ok;
}

// Removes the range starting at p; its length, or 0 when there is none.
static size_t ranges_remove(struct ranges * rs, const void * p) {
    size_t n = 0;
    pthread_mutex_lock(&ranges_mu);
    for (int i = 0; i < rs->n; i++) {
        if (rs->lo[i] == (uintptr_t) p) {
            n = rs->hi[i] - rs->lo[i];
            rs->n--;
            rs->lo[i] = rs->lo[rs->n];
            rs->hi[i] = rs->hi[rs->n];
            break;
        }
    }
    pthread_mutex_unlock(&ranges_mu);
    return n;
}

// Whether [p, p + n) lies inside one range.
static int ranges_hold(struct ranges * rs, const void * p, size_t n) {
    int found = 0;
    pthread_mutex_lock(&ranges_mu);
    for (int i = 0; i < rs->n && !found; i++) {
        found = (uintptr_t) p >= rs->lo[i] && (uintptr_t) p + n <= rs->hi[i];
    }
    pthread_mutex_unlock(&ranges_mu);
    return found;
}

// ---- the device: one engine thread running queued operations in order ----

struct op {
    void * dst;
    const void * src;
    size_t n;
    int fill;  // -1: copy src; else memset with this byte
    struct op * next;
};
static pthread_mutex_t q_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_work = PTHREAD_COND_INITIALIZER, q_done_cv = PTHREAD_COND_INITIALIZER;
static struct op *q_head, *q_tail;
static uint64_t q_submitted, q_done;

static void * engine_main(void * arg) {
    (void) arg;
    for (;;) {
        pthread_mutex_lock(&q_mu);
        while (q_head == NULL) {
            pthread_cond_wait(&q_work, &q_mu);
        }
        struct op * o = q_head;
        q_head = o->next;
        if (q_head == NULL) {
            q_tail = NULL;
        }
        pthread_mutex_unlock(&q_mu);
        if (o->fill < 0) {
            memcpy(o->dst, o->src, o->n);
        } else {
            memset(o->dst, o->fill, o->n);
        }
        free(o);
        pthread_mutex_lock(&q_mu);
        q_done++;
        pthread_cond_broadcast(&q_done_cv);
        pthread_mutex_unlock(&q_mu);
    }
    return NULL;
}

// Queues an operation; its ticket, which wait_for() waits for (FIFO: and for all before it).
static uint64_t submit(void * dst, const void * src, size_t n, int fill) {
    struct op * o = (struct op *) calloc(1, sizeof(*o));
    if (o == NULL) {
        abort();
    }
    o->dst = dst;
    o->src = src;
    o->n = n;
    o->fill = fill;
    pthread_mutex_lock(&q_mu);
    if (q_tail) {
        q_tail->next = o;
    } else {
        q_head = o;
    }
    q_tail = o;
    uint64_t ticket = ++q_submitted;
    pthread_cond_signal(&q_work);
    pthread_mutex_unlock(&q_mu);
    return ticket;
}

static void wait_for(uint64_t ticket) {
    pthread_mutex_lock(&q_mu);
    while (q_done < ticket) {
        pthread_cond_wait(&q_done_cv, &q_mu);
    }
    pthread_mutex_unlock(&q_mu);
}

static void wait_all(void) {
    pthread_mutex_lock(&q_mu);
    uint64_t ticket = q_submitted;
    pthread_mutex_unlock(&q_mu);
    wait_for(ticket);
}

// ---- the driver's worker thread: copies staged chunks into pageable destinations ----

static pthread_mutex_t job_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t job_cv = PTHREAD_COND_INITIALIZER;
static struct {
    void * dst;
    const void * src;
    size_t n;
    int pending;
    int64_t faults;
} job;

static void * worker_main(void * arg) {
    (void) arg;
    // Its stack and the code it runs are faulted in now, so the faults counted around a copy are
    // the destination's alone.
    volatile char warm[32768];
    memset((char *) warm, 1, sizeof(warm));
    thread_faults();
    pthread_mutex_lock(&job_mu);
    for (;;) {
        while (!job.pending) {
            pthread_cond_wait(&job_cv, &job_mu);
        }
        const int64_t f0 = thread_faults();
        memcpy(job.dst, job.src, job.n);
        job.faults = thread_faults() - f0;
        job.pending = 0;
        pthread_cond_broadcast(&job_cv);
    }
    return NULL;
}

// ---- configuration and the staging buffer (CKPT_CUDA_STUB_* variables, read once) ----

static size_t stage_bytes = (size_t) 2048 << 10;
static uint8_t * staging;
static int use_worker;
static int truth_fd = -1;
static pthread_mutex_t staging_mu = PTHREAD_MUTEX_INITIALIZER;  // one staged copy at a time
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void truth_flush(void);

static void start(void) {
    const char * kib = getenv("CKPT_CUDA_STUB_STAGING_KIB");
    if (kib && atol(kib) > 0) {
        stage_bytes = (size_t) atol(kib) << 10;
    }
    use_worker = getenv("CKPT_CUDA_STUB_WORKER") && strcmp(getenv("CKPT_CUDA_STUB_WORKER"), "1") == 0;
    const char * truth = getenv("CKPT_CUDA_STUB_TRUTH");
    if (truth && *truth) {
        truth_fd = open(truth, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (truth_fd < 0) {
            fprintf(stderr, "cuda stub: cannot write CKPT_CUDA_STUB_TRUTH %s\n", truth);
            abort();
        }
        atexit(truth_flush);
    }
    // Pinned staging: mapped, touched and locked before any copy uses it.
    staging = (uint8_t *) mmap(NULL, stage_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (staging == MAP_FAILED) {
        abort();
    }
    memset(staging, 0xee, stage_bytes);
    mlock(staging, stage_bytes);
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, engine_main, NULL) != 0) {
        abort();
    }
    if (use_worker && pthread_create(&t, &attr, worker_main, NULL) != 0) {
        abort();
    }
    pthread_attr_destroy(&attr);
}

static void init(void) { pthread_once(&once, start); }

// ---- the truth ----

static __thread int nest;  // runtime calls open on this thread
static __thread struct {
    const char * kind;
    const char * class_;
    int async;
    int64_t nonresident, caller_faults, worker_faults;
} last;  // what this thread's last copy did

static pthread_mutex_t truth_mu = PTHREAD_MUTEX_INITIALIZER;
static char * truth_buf;
static size_t truth_len, truth_cap;

static void truth_write_locked(void) {
    size_t at = 0;
    while (at < truth_len) {
        ssize_t w = write(truth_fd, truth_buf + at, truth_len - at);
        if (w <= 0) {
            break;
        }
        at += (size_t) w;
    }
    truth_len = 0;
}

static void truth_flush(void) {
    pthread_mutex_lock(&truth_mu);
    if (truth_fd >= 0) {
        truth_write_locked();
    }
    pthread_mutex_unlock(&truth_mu);
}

static void truth_line(const char * line, int n) {
    if (truth_fd < 0 || n <= 0) {
        return;
    }
    pthread_mutex_lock(&truth_mu);
    if (truth_len + (size_t) n > truth_cap) {
        truth_cap = (truth_len + (size_t) n) * 2 + 4096;
        truth_buf = (char *) realloc(truth_buf, truth_cap);
        if (truth_buf == NULL) {
            abort();
        }
    }
    memcpy(truth_buf + truth_len, line, (size_t) n);
    truth_len += (size_t) n;
    if (truth_len >= (1u << 20)) {
        truth_write_locked();
    }
    pthread_mutex_unlock(&truth_mu);
}

static void copy_line(const char * call, const char * api, int64_t t0, int64_t t1, size_t bytes, const void * dst) {
    char line[640];
    int n = snprintf(line, sizeof(line),
                     "{\"call\":\"%s\",\"api\":\"%s\",\"tid\":%d,\"start_ns\":%lld,\"end_ns\":%lld,\"kind\":\"%s\","
                     "\"async\":%s,\"bytes\":%zu,\"dst\":%llu,\"class\":\"%s\",\"nonresident_pages\":%lld,"
                     "\"caller_faults\":%lld,\"worker_faults\":%lld}\n",
                     call, api, gettid_(), (long long) t0, (long long) t1, last.kind ? last.kind : "none",
                     last.async ? "true" : "false", bytes, (unsigned long long) (uintptr_t) dst,
                     last.class_ ? last.class_ : "none", (long long) last.nonresident, (long long) last.caller_faults,
                     (long long) last.worker_faults);
    truth_line(line, n);
}

static void call_line(const char * call, const char * api, const char * what, int64_t t0, int64_t t1,
                      const void * ptr, size_t bytes) {
    char line[384];
    int n = snprintf(line, sizeof(line),
                     "{\"call\":\"%s\",\"api\":\"%s\",\"what\":\"%s\",\"tid\":%d,\"start_ns\":%lld,\"end_ns\":%lld,"
                     "\"ptr\":%llu,\"bytes\":%zu}\n",
                     call, api, what, gettid_(), (long long) t0, (long long) t1, (unsigned long long) (uintptr_t) ptr,
                     bytes);
    truth_line(line, n);
}

EXPORT void cudastub_enter(void) { nest++; }
EXPORT void cudastub_leave(void) { nest--; }

EXPORT void cudastub_truth_copy(const char * call, int64_t t0, int64_t t1, size_t bytes, const void * dst) {
    copy_line(call, "runtime", t0, t1, bytes, dst);
}

EXPORT void cudastub_truth_call(const char * call, const char * what, int64_t t0, int64_t t1, const void * ptr,
                                size_t bytes) {
    call_line(call, "runtime", what, t0, t1, ptr, bytes);
}

// A driver call made by the program itself (not from inside a runtime call) is a truth line.
#define DRIVER_COPY(call, expr, bytes, dst)                                                                          \
    do {                                                                                                             \
        const int outer_ = nest == 0;                                                                                \
        const int64_t t0_ = outer_ ? cudastub_now() : 0;                                                             \
        CUresult r_ = (expr);                                                                                        \
        if (outer_) {                                                                                                \
            copy_line(call, "driver", t0_, cudastub_now(), bytes, dst);                                              \
        }                                                                                                            \
        return r_;                                                                                                   \
    } while (0)

#define DRIVER_CALL(call, what, expr, ptr, bytes)                                                                    \
    do {                                                                                                             \
        const int outer_ = nest == 0;                                                                                \
        const int64_t t0_ = outer_ ? cudastub_now() : 0;                                                             \
        CUresult r_ = (expr);                                                                                        \
        if (outer_) {                                                                                                \
            call_line(call, "driver", what, t0_, cudastub_now(), ptr, bytes);                                        \
        }                                                                                                            \
        return r_;                                                                                                   \
    } while (0)

// ---- copies ----

enum { H2H, H2D, D2H, D2D };
static const char * const KIND_NAMES[] = {"h2h", "h2d", "d2h", "d2d"};

// Pages of [p, p + n) not resident now (mincore).
static int64_t nonresident_pages(const void * p, size_t n) {
    const uintptr_t page = (uintptr_t) sysconf(_SC_PAGESIZE);
    const uintptr_t lo = (uintptr_t) p & ~(page - 1), hi = ((uintptr_t) p + n + page - 1) & ~(page - 1);
    const size_t pages = (hi - lo) / page;
    unsigned char * vec = (unsigned char *) malloc(pages ? pages : 1);
    if (vec == NULL || mincore((void *) lo, hi - lo, vec) != 0) {
        free(vec);
        return -1;
    }
    int64_t out = 0;
    for (size_t i = 0; i < pages; i++) {
        out += !(vec[i] & 1);
    }
    free(vec);
    return out;
}

// The host's part of a staged copy: staging -> destination, on this thread or the worker's.
static void host_copy(void * dst, const void * src, size_t n) {
    if (!use_worker) {
        const int64_t f0 = thread_faults();
        memcpy(dst, src, n);
        last.caller_faults += thread_faults() - f0;
        return;
    }
    pthread_mutex_lock(&job_mu);
    job.dst = dst;
    job.src = src;
    job.n = n;
    job.pending = 1;
    pthread_cond_broadcast(&job_cv);
    while (job.pending) {
        pthread_cond_wait(&job_cv, &job_mu);
    }
    last.worker_faults += job.faults;
    pthread_mutex_unlock(&job_mu);
}

static int is_device(const void * p, size_t n) { return ranges_hold(&device_mem, p, n ? n : 1); }

static CUresult copy(void * dst, const void * src, size_t n, int kind, int async) {
    init();
    memset(&last, 0, sizeof(last));
    last.kind = KIND_NAMES[kind];
    last.async = async;
    last.class_ = kind == D2H ? "pageable_resident" : kind == H2H ? "host" : "device";
    if (n == 0) {
        return CUDA_SUCCESS;
    }
    if ((kind == D2H || kind == D2D) && !is_device(src, n)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if ((kind == H2D || kind == D2D) && !is_device(dst, n)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (kind == H2H) {
        wait_all();
        memcpy(dst, src, n);
        return CUDA_SUCCESS;
    }
    const int pinned = ranges_hold(&pinned_mem, kind == D2H ? dst : src, n);
    if (kind != D2H || pinned) {
        // The engine reads or writes the host side itself (pinned memory, or a host-to-device copy
        // the stub does not stage): async calls return at once.
        if (kind == D2H) {
            last.class_ = "pinned";
        }
        const uint64_t ticket = submit(dst, src, n, -1);
        if (!async || (kind == H2D && !pinned)) {
            wait_for(ticket);
        }
        return CUDA_SUCCESS;
    }
    // Device to pageable host memory: staged, and done when the call returns.
    last.nonresident = nonresident_pages(dst, n);
    last.class_ = last.nonresident > 0 ? "pageable_fresh" : "pageable_resident";
    pthread_mutex_lock(&staging_mu);
    for (size_t off = 0; off < n; off += stage_bytes) {
        const size_t len = n - off < stage_bytes ? n - off : stage_bytes;
        wait_for(submit(staging, (const uint8_t *) src + off, len, -1));
        host_copy((uint8_t *) dst + off, staging, len);
    }
    pthread_mutex_unlock(&staging_mu);
    return CUDA_SUCCESS;
}

// The direction of a unified copy, from where its addresses lie.
static int infer_kind(const void * dst, const void * src, size_t n) {
    const int d = is_device(dst, n), s = is_device(src, n);
    return s ? (d ? D2D : D2H) : (d ? H2D : H2H);
}

EXPORT CUresult cuMemcpyDtoH_v2(void * dst, CUdeviceptr src, size_t n) {
    DRIVER_COPY("cuMemcpyDtoH_v2", copy(dst, (const void *) src, n, D2H, 0), n, dst);
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void * dst, CUdeviceptr src, size_t n, CUstream s) {
    (void) s;
    DRIVER_COPY("cuMemcpyDtoHAsync_v2", copy(dst, (const void *) src, n, D2H, 1), n, dst);
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void * src, size_t n) {
    DRIVER_COPY("cuMemcpyHtoD_v2", copy((void *) dst, src, n, H2D, 0), n, (void *) dst);
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void * src, size_t n, CUstream s) {
    (void) s;
    DRIVER_COPY("cuMemcpyHtoDAsync_v2", copy((void *) dst, src, n, H2D, 1), n, (void *) dst);
}

EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    DRIVER_COPY("cuMemcpyDtoD_v2", copy((void *) dst, (const void *) src, n, D2D, 0), n, (void *) dst);
}

EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    (void) s;
    DRIVER_COPY("cuMemcpyDtoDAsync_v2", copy((void *) dst, (const void *) src, n, D2D, 1), n, (void *) dst);
}

EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    init();
    const int kind = infer_kind((void *) dst, (const void *) src, n);
    DRIVER_COPY("cuMemcpy", copy((void *) dst, (const void *) src, n, kind, 0), n, (void *) dst);
}

EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    (void) s;
    init();
    const int kind = infer_kind((void *) dst, (const void *) src, n);
    DRIVER_COPY("cuMemcpyAsync", copy((void *) dst, (const void *) src, n, kind, 1), n, (void *) dst);
}

// ---- waiting for the device ----

static CUresult sync_all(void) {
    init();
    wait_all();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream s) {
    (void) s;
    DRIVER_CALL("cuStreamSynchronize", "wait", sync_all(), NULL, 0);
}

EXPORT CUresult cuCtxSynchronize(void) { DRIVER_CALL("cuCtxSynchronize", "wait", sync_all(), NULL, 0); }

// ---- device memory ----

EXPORT CUresult cuInit(unsigned int flags) {
    (void) flags;
    init();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int * version) {
    *version = 12090;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorString(CUresult error, const char ** str) {
    switch (error) {
        case CUDA_SUCCESS: *str = "no error"; break;
        case CUDA_ERROR_INVALID_VALUE: *str = "invalid argument"; break;
        case CUDA_ERROR_OUT_OF_MEMORY: *str = "out of memory"; break;
        case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: *str = "part or all of the range is already registered"; break;
        case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: *str = "pointer does not correspond to a registered range"; break;
        default: *str = "unknown error"; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr * dptr, size_t n) {
    init();
    // Device memory lives in host memory here, touched now so a copy out of it never faults.
    void * p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memset(p, 0, n);
    if (!ranges_add(&device_mem, p, n ? n : 1)) {
        munmap(p, n ? n : 1);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = (CUdeviceptr) (uintptr_t) p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    init();
    wait_all();
    const size_t n = ranges_remove(&device_mem, (void *) dptr);
    if (n == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    munmap((void *) dptr, n);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dptr, unsigned char value, size_t n) {
    init();
    if (!is_device((void *) dptr, n)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    wait_for(submit((void *) dptr, NULL, n, value));
    return CUDA_SUCCESS;
}

// ---- pinned host memory ----

// Pinning makes every page resident (the real driver locks them in): touched, then locked.
static void pin_pages(void * p, size_t n) {
    const size_t page = (size_t) sysconf(_SC_PAGESIZE);
    volatile uint8_t * b = (volatile uint8_t *) p;
    for (size_t i = 0; i < n; i += page) {
        b[i] = b[i];
    }
    mlock(p, n);
}

static CUresult host_register(void * p, size_t n) {
    init();
    if (p == NULL || n == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (ranges_hold(&pinned_mem, p, 1)) {
        return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    pin_pages(p, n);
    return ranges_add(&pinned_mem, p, n) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult host_unregister(void * p) {
    init();
    const size_t n = ranges_remove(&pinned_mem, p);
    if (n == 0) {
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    }
    munlock(p, n);
    return CUDA_SUCCESS;
}

static CUresult host_alloc(void ** pp, size_t n) {
    init();
    void * p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pin_pages(p, n);
    if (!ranges_add(&pinned_mem, p, n ? n : 1)) {
        munmap(p, n ? n : 1);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

static CUresult host_free(void * p) {
    init();
    wait_all();
    const size_t n = ranges_remove(&pinned_mem, p);
    if (n == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    munmap(p, n);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostRegister_v2(void * p, size_t n, unsigned int flags) {
    (void) flags;
    DRIVER_CALL("cuMemHostRegister_v2", "pin", host_register(p, n), p, n);
}

EXPORT CUresult cuMemHostUnregister(void * p) { DRIVER_CALL("cuMemHostUnregister", "unpin", host_unregister(p), p, 0); }

// An allocation's truth line names the pointer it returned.
static CUresult host_alloc_call(const char * call, void ** pp, size_t n) {
    const int outer = nest == 0;
    const int64_t t0 = cudastub_now();
    CUresult r = host_alloc(pp, n);
    if (outer) {
        call_line(call, "driver", "pin", t0, cudastub_now(), r == CUDA_SUCCESS ? *pp : NULL, n);
    }
    return r;
}

EXPORT CUresult cuMemAllocHost_v2(void ** pp, size_t n) { return host_alloc_call("cuMemAllocHost_v2", pp, n); }

EXPORT CUresult cuMemHostAlloc(void ** pp, size_t n, unsigned int flags) {
    (void) flags;
    return host_alloc_call("cuMemHostAlloc", pp, n);
}

EXPORT CUresult cuMemFreeHost(void * p) { DRIVER_CALL("cuMemFreeHost", "unpin", host_free(p), p, 0); }
