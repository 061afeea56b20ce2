// libsample-common.so: stand-in for libllama-common.so, common_prompt_checkpoint and its pool.

#include "common.h"
#include "truth.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>

#ifdef SAMPLE_CUDA
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <atomic>

const char * const SAMPLE_CUDA_DST_NAMES[3] = {"pageable", "fresh", "pinned"};
static int cuda_dst_mode = SAMPLE_CUDA_PAGEABLE;
static std::atomic<int> cuda_dst_next{0};

void common_checkpoint_cuda_dst(int mode) { cuda_dst_mode = mode; }

// This checkpoint's destination: the mode, or with SAMPLE_CUDA_CYCLE each mode in turn.
static int cuda_dst_for_next() {
    return cuda_dst_mode == SAMPLE_CUDA_CYCLE ? cuda_dst_next++ % 3 : cuda_dst_mode;
}

static void cuda_check(cudaError_t e, const char * what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "sample-common: %s failed: %s\n", what, cudaGetErrorString(e));
        abort();
    }
}

sample_raw_buffer::~sample_raw_buffer() {
    if (p) {
        munmap(p, n);
    }
}

uint8_t * sample_raw_buffer::fresh(size_t bytes) {
    if (p) {
        munmap(p, n);
    }
    void * q = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (q == MAP_FAILED) {
        fprintf(stderr, "sample-common: cannot map %zu bytes\n", bytes);
        abort();
    }
    p = (uint8_t *) q;
    n = bytes;
    return p;
}
#endif


const char * const SAMPLE_FILL_NAMES[4] = {"zero", "none", "touch", "half"};
const char * const SAMPLE_BUFFER_NAMES[5] = {"reused", "grown", "fresh", "touched", "partial"};
static int fill_mode = SAMPLE_FILL_ZERO;

void common_checkpoint_fill(int mode) { fill_mode = mode; }

// --fill none|touch|half: a fresh buffer made without the zero fill (new[] of this size is an
// mmap() of its own: above glibc's threshold), then none, all or half of its pages touched.
static uint8_t * fresh_without_fill(std::unique_ptr<uint8_t[]> & own, size_t size, common_checkpoint_truth & t) {
    own.reset();  // the last one goes first, as a resize's old buffer would
    own.reset(new uint8_t[size]);  // default-initialised: nothing written
    const size_t touched = fill_mode == SAMPLE_FILL_TOUCH ? size : fill_mode == SAMPLE_FILL_HALF ? size / 2 : 0;
    const int64_t f0 = thread_faults();
    volatile uint8_t * p = own.get();
    for (size_t i = 0; i < touched; i += 4096) {
        p[i] = 1;
    }
    if (touched == size) {
        p[size - 1] = 1;  // the last page, which the stride may step over
    }
    t.touch_faults = thread_faults() - f0;
    t.buffer = fill_mode == SAMPLE_FILL_TOUCH ? SAMPLE_BUF_TOUCHED
             : fill_mode == SAMPLE_FILL_HALF ? SAMPLE_BUF_PARTIAL : SAMPLE_BUF_FRESH;
    return own.get();
}

// --pause-in-checkpoint: the first checkpoint stops between its fill and its copy, says so on
// stderr and waits for SIGUSR1 (blocked by main before any thread starts), so a tracer can be
// attached while a checkpoint is open.
static bool pause_first_checkpoint = false;

void common_checkpoint_pause_first(bool on) { pause_first_checkpoint = on; }

static void pause_here() {
    pause_first_checkpoint = false;
    fprintf(stderr, "paused in checkpoint pid=%d\n", (int) getpid());
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    int sig = 0;
    sigwait(&usr1, &sig);
}

// The body of update_tgt()/update_dft(), inlined into each so that the resize and the copy are
// calls made from inside the probed function, as in llama.cpp's common.cpp.
#ifdef SAMPLE_CUDA
#define RAW_PARAM , sample_raw_buffer & raw
#define RAW_ARG(r) , r
#else
#define RAW_PARAM
#define RAW_ARG(r)
#endif
static inline __attribute__((always_inline)) void update_state(std::vector<uint8_t> & data,
                                                               common_checkpoint_truth & t,
                                                               llama_context * ctx, int seq_id,
                                                               unsigned int flags,
                                                               std::unique_ptr<uint8_t[]> & own RAW_PARAM) {
    t = common_checkpoint_truth();
    t.tid = (int) syscall(SYS_gettid);
    t.start_ns = now_ns();
    const int64_t c_start = thread_cpu_ns();

    const size_t size = llama_state_seq_get_size_ext(ctx, seq_id, flags);
    auto & pool = common_state_buffer_pool::instance();
    if (data.empty() && pool.enabled()) {
        data = pool.get(size);
    }
    t.pool_hit = data.size() >= size;
    t.buffer = t.pool_hit ? SAMPLE_BUF_REUSED : SAMPLE_BUF_GROWN;
    t.bytes = size;

    // Wall clock outside, thread CPU clock inside, around exactly the call a tracer times.
    uint8_t * dst = nullptr;
#ifdef SAMPLE_CUDA
    t.cuda_dst = cuda_dst_for_next();
    if (t.cuda_dst == SAMPLE_CUDA_FRESH) {
        t.pool_hit = false;
        t.buffer = SAMPLE_BUF_FRESH;
        dst = raw.fresh(size);  // no fill: the copy is the first to touch these pages
    }
#endif
    if (dst == nullptr && !t.pool_hit && fill_mode != SAMPLE_FILL_ZERO) {
        dst = fresh_without_fill(own, size, t);
    }
    if (dst == nullptr) {
        const int64_t f0 = thread_faults();
        t.fill_start_ns = now_ns();
        const int64_t c0 = thread_cpu_ns();
        sample_grow(data, size);  // grows through _M_default_append: zero fill of fresh mmap()ed pages
        const int64_t c1 = thread_cpu_ns();
        const int64_t t1 = now_ns();
        const int64_t f1 = thread_faults();
        t.fill_ns = t1 - t.fill_start_ns;
        t.fill_cpu_ns = c1 - c0;
        t.fill_faults = f1 - f0;
        dst = data.data();
    }
    if (pause_first_checkpoint) {
        pause_here();
    }
#ifdef SAMPLE_CUDA
    if (t.cuda_dst == SAMPLE_CUDA_PINNED) {
        cuda_check(cudaHostRegister(dst, size, cudaHostRegisterDefault), "cudaHostRegister");
    }
#endif

    t.dst = (uintptr_t) dst;
    const int64_t f2 = thread_faults();
    t.copy_start_ns = now_ns();
    const int64_t c2 = thread_cpu_ns();
    const size_t n = llama_state_seq_get_data_ext(ctx, dst, size, seq_id, flags);
    const int64_t c3 = thread_cpu_ns();
    const int64_t t3 = now_ns();
    const int64_t f3 = thread_faults();
    t.copy_ns = t3 - t.copy_start_ns;
    t.copy_cpu_ns = c3 - c2;
    t.copy_faults = f3 - f2;
#ifdef SAMPLE_CUDA
    if (t.cuda_dst == SAMPLE_CUDA_PINNED) {
        cuda_check(cudaHostUnregister(dst), "cudaHostUnregister");
    }
#endif

    if (n != size) {
        fprintf(stderr, "sample-common: state copy wrote %zu of %zu bytes\n", n, size);
        abort();
    }
    t.cpu_ns = thread_cpu_ns() - c_start;
    t.end_ns = now_ns();
}

__attribute__((noinline)) void common_prompt_checkpoint::update_tgt(llama_context * ctx, int seq_id,
                                                                    unsigned int flags) {
    update_state(data_tgt, truth_tgt, ctx, seq_id, flags, own_tgt RAW_ARG(raw_tgt));
}

__attribute__((noinline)) void common_prompt_checkpoint::update_dft(llama_context * ctx, int seq_id,
                                                                    unsigned int flags) {
    update_state(data_dft, truth_dft, ctx, seq_id, flags, own_dft RAW_ARG(raw_dft));
}

#ifdef SAMPLE_UPSTREAM
static void load_state(const std::vector<uint8_t> & data, common_restore_truth & t, llama_context * ctx, int seq_id,
                       unsigned int flags) {
    t = common_restore_truth();
    t.tid = (int) syscall(SYS_gettid);
    t.start_ns = now_ns();
    const int64_t c_start = thread_cpu_ns();
    const int64_t f0 = thread_faults();
    if (!data.empty()) {  // as upstream: nothing saved, nothing restored
        t.copy_start_ns = now_ns();
        const int64_t c0 = thread_cpu_ns();
        t.bytes = llama_state_seq_set_data_ext(ctx, data.data(), data.size(), seq_id, flags);
        t.copy_cpu_ns = thread_cpu_ns() - c0;
        t.copy_ns = now_ns() - t.copy_start_ns;
        if (t.bytes != data.size()) {
            fprintf(stderr, "sample-common: restore wrote %zu of %zu bytes\n", t.bytes, data.size());
            abort();
        }
    }
    t.faults = thread_faults() - f0;
    t.cpu_ns = thread_cpu_ns() - c_start;
    t.end_ns = now_ns();
}

__attribute__((noinline)) void common_prompt_checkpoint::load_tgt(llama_context * ctx, int seq_id,
                                                                  unsigned int flags) const {
    load_state(data_tgt, truth_load, ctx, seq_id, flags);
}

__attribute__((noinline)) void common_prompt_checkpoint::load_dft(llama_context * ctx, int seq_id,
                                                                  unsigned int flags) const {
    load_state(data_dft, truth_load, ctx, seq_id, flags);
}

__attribute__((noinline)) bool common_speculative_get_state(common_speculative * spec, int seq_id,
                                                            std::vector<uint8_t> & data) {
    if (spec == nullptr || spec->state_bytes == 0) {
        return false;
    }
    sample_grow(data, spec->state_bytes);
    for (size_t i = 0; i < data.size(); i += 4096) {
        data[i] = (uint8_t) (seq_id + 1);
    }
    return true;
}
#endif

common_prompt_checkpoint::~common_prompt_checkpoint() {
    auto & pool = common_state_buffer_pool::instance();
    if (!pool.enabled()) {
        return;
    }
    // put() allocates and may throw; a destructor must not.
    try {
        pool.put(std::move(data_tgt));
        pool.put(std::move(data_dft));
    } catch (...) {
    }
}

common_state_buffer_pool & common_state_buffer_pool::instance() {
    static auto * p = new common_state_buffer_pool();
    return *p;
}

common_state_buffer_pool::common_state_buffer_pool() {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page = sysconf(_SC_PAGESIZE);
    // A failed query keeps nothing rather than everything.
    cap_bytes = (pages > 0 && page > 0) ? (size_t) pages * (size_t) page / 16 : 0;
}

void common_state_buffer_pool::set_enabled(bool v) {
    std::lock_guard<std::mutex> lock(mtx);
    on = v;
}

void common_state_buffer_pool::set_caps(size_t bytes, size_t count) {
    std::lock_guard<std::mutex> lock(mtx);
    cap_bytes = bytes;
    count_cap = count;
}

bool common_state_buffer_pool::enabled() const {
    std::lock_guard<std::mutex> lock(mtx);
    return on;
}

std::vector<uint8_t> common_state_buffer_pool::get(size_t size) {
    std::lock_guard<std::mutex> lock(mtx);
    size_t best = bufs.size();
    for (size_t i = 0; i < bufs.size(); i++) {
        if (bufs[i].size() >= size && (best == bufs.size() || bufs[i].size() < bufs[best].size())) {
            best = i;
        }
    }
    if (best == bufs.size()) {
        st.misses++;
        return {};
    }
    std::vector<uint8_t> out = std::move(bufs[best]);
    bufs.erase(bufs.begin() + best);
    st.bytes_held -= out.size();
    st.hits++;
    return out;
}

void common_state_buffer_pool::put(std::vector<uint8_t> && src) {
    const size_t bytes = src.size();
    if (bytes == 0) {
        return;
    }
    std::vector<std::vector<uint8_t>> evicted;  // freed after the lock is released
    {
        std::lock_guard<std::mutex> lock(mtx);
        if (!on || bytes < size_floor || bytes > cap_bytes) {
            st.declined++;
            return;
        }
        // When full, displace the smallest pooled buffers, and only ones smaller than this one,
        // so a pool of equal or larger buffers declines instead of churning.
        std::sort(bufs.begin(), bufs.end(),
                  [](const std::vector<uint8_t> & a, const std::vector<uint8_t> & b) { return a.size() < b.size(); });
        size_t n_evict = 0;
        size_t held = st.bytes_held;
        while ((bufs.size() - n_evict >= count_cap || held + bytes > cap_bytes) && n_evict < bufs.size() &&
               bufs[n_evict].size() < bytes) {
            held -= bufs[n_evict].size();
            n_evict++;
        }
        if (bufs.size() - n_evict >= count_cap || held + bytes > cap_bytes) {
            st.declined++;
            return;
        }
        for (size_t i = 0; i < n_evict; i++) {
            evicted.push_back(std::move(bufs[i]));
        }
        bufs.erase(bufs.begin(), bufs.begin() + n_evict);
        st.evicted += n_evict;
        st.bytes_held = held + bytes;
        bufs.push_back(std::move(src));
        st.accepted++;
        st.n_hwm = std::max(st.n_hwm, bufs.size());
        st.bytes_hwm = std::max(st.bytes_hwm, st.bytes_held);
    }
}

void common_state_buffer_pool::trim() {
    std::vector<std::vector<uint8_t>> old;
    {
        std::lock_guard<std::mutex> lock(mtx);
        old.swap(bufs);
        if (!old.empty()) {
            st.trims++;
            st.trimmed_bytes += st.bytes_held;
        }
        st.bytes_held = 0;
    }
}

common_state_buffer_pool_stats common_state_buffer_pool::stats() const {
    std::lock_guard<std::mutex> lock(mtx);
    common_state_buffer_pool_stats out = st;
    out.n_held = bufs.size();
    return out;
}
