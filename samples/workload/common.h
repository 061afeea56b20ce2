// Stand-in for llama.cpp's common.h: the prompt checkpoint and the bounded state buffer pool.
#pragma once

#include "llama.h"

#include <stddef.h>
#include <stdint.h>

#include <memory>
#include <mutex>
#include <vector>

// As in the real build, resize() is inline but its growth, _M_default_append, is an out-of-line
// weak symbol: instantiated once in each library (vector_u8.cpp), called through the PLT.
// SAMPLE_INLINE_FILL: a build whose growth has no symbol of its own (as when a compiler inlines
// it): every growth goes through sample_grow, which never instantiates resize().
// SAMPLE_MEMSET_FILL: resize() with its growth inlined into every caller (the Makefile raises the
// inliner's limit), as clang does with libc++ in the real upstream build: operator new, a call to
// memset for the zero fill, the old bytes copied and the old buffer freed, all inside update_tgt.
#if !defined(SAMPLE_INLINE_FILL) && !defined(SAMPLE_MEMSET_FILL)
extern template class std::vector<unsigned char>;
#endif

static inline void sample_grow(std::vector<uint8_t> & v, size_t n) {
#ifdef SAMPLE_INLINE_FILL
    if (n > v.size()) {
        v.insert(v.end(), n - v.size(), (uint8_t) 0);
    } else {
        v.erase(v.begin() + (std::ptrdiff_t) n, v.end());
    }
#else
    v.resize(n);
#endif
}

// Ground truth for one load_tgt()/load_dft() call or one prompt save: entry to return, and the
// state copy inside (llama_state_seq_set_data_ext / llama_state_seq_get_data_ext).
struct common_restore_truth {
    int64_t start_ns = 0;
    int64_t end_ns = 0;
    int64_t cpu_ns = 0;
    int64_t copy_start_ns = 0;
    int64_t copy_ns = 0;
    int64_t copy_cpu_ns = 0;
    int64_t faults = 0;
    size_t bytes = 0;
    int tid = 0;
};

// Ground truth for one update_tgt()/update_dft() call, measured by the call itself.
struct common_checkpoint_truth {
    int64_t start_ns = 0;  // entry to return of update_tgt()/update_dft()
    int64_t end_ns = 0;
    int64_t fill_start_ns = 0;  // around data_tgt.resize()
    int64_t fill_ns = 0;
    int64_t copy_start_ns = 0;  // around llama_state_seq_get_data_ext()
    int64_t copy_ns = 0;
    int64_t cpu_ns = 0;  // CLOCK_THREAD_CPUTIME_ID deltas over the same three regions
    int64_t fill_cpu_ns = 0;
    int64_t copy_cpu_ns = 0;
    int64_t fill_faults = 0;  // getrusage(RUSAGE_THREAD) ru_minflt + ru_majflt deltas
    int64_t copy_faults = 0;
    size_t bytes = 0;
    bool pool_hit = false;  // the resize did not have to grow the buffer
    int buffer = 0;  // what the destination's pages did, by the workload's own account (sample_buffer)
    int64_t touch_faults = 0;
    uintptr_t dst = 0;  // where the copy went  // --fill touch|half: faults of the pre-touch, outside the fill and the copy
    int tid = 0;
    int cuda_dst = -1;  // the CUDA build: where the copy went (sample_cuda_dst), -1 otherwise
};

// --fill: how a buffer that must grow is made, the variants llama.cpp PR #201 discusses. zero:
// resize() (the zero fill, as llama.cpp); none: a fresh `new uint8_t[n]`, never touched, so the
// copy faults every page in; touch: the same, one byte per page written first (pre-touched);
// half: only the first half of its pages touched (the copy finds it partly resident).
enum sample_fill { SAMPLE_FILL_ZERO = 0, SAMPLE_FILL_NONE = 1, SAMPLE_FILL_TOUCH = 2, SAMPLE_FILL_HALF = 3 };
extern const char * const SAMPLE_FILL_NAMES[4];
void common_checkpoint_fill(int mode);
// What the destination's pages did, as the workload knows it (truth "buffer"): a pooled buffer
// reused as it was, a buffer the fill grew, a fresh one the copy faulted in, pre-touched, half touched.
enum sample_buffer { SAMPLE_BUF_REUSED = 0, SAMPLE_BUF_GROWN = 1, SAMPLE_BUF_FRESH = 2, SAMPLE_BUF_TOUCHED = 3,
                     SAMPLE_BUF_PARTIAL = 4 };
extern const char * const SAMPLE_BUFFER_NAMES[5];

#ifdef SAMPLE_CUDA
// The CUDA build's checkpoint destinations (--cuda-dst): the buffer as llama.cpp has it (filled,
// so resident), the fill dropped (memory never touched: the case llama.cpp PR #201 measured ~140x
// slower), the filled buffer registered as pinned memory around the copy; or each in turn.
enum sample_cuda_dst { SAMPLE_CUDA_PAGEABLE = 0, SAMPLE_CUDA_FRESH = 1, SAMPLE_CUDA_PINNED = 2, SAMPLE_CUDA_CYCLE = 3 };
extern const char * const SAMPLE_CUDA_DST_NAMES[3];
void common_checkpoint_cuda_dst(int mode);

// A fresh destination (SAMPLE_CUDA_FRESH): its own mapping, never touched before the copy.
struct sample_raw_buffer {
    uint8_t * p = nullptr;
    size_t n = 0;
    sample_raw_buffer() = default;
    sample_raw_buffer(const sample_raw_buffer &) = delete;
    sample_raw_buffer & operator=(const sample_raw_buffer &) = delete;
    ~sample_raw_buffer();
    uint8_t * fresh(size_t bytes);  // unmaps the last one, maps a new one
};
#endif

struct common_prompt_checkpoint {
    std::vector<uint8_t> data_tgt;
    std::vector<uint8_t> data_dft;

    common_checkpoint_truth truth_tgt;
    common_checkpoint_truth truth_dft;
    std::unique_ptr<uint8_t[]> own_tgt;  // --fill none|touch|half: the buffer made without a fill
    std::unique_ptr<uint8_t[]> own_dft;
#ifdef SAMPLE_CUDA
    sample_raw_buffer raw_tgt;
    sample_raw_buffer raw_dft;
#endif

    common_prompt_checkpoint() = default;
    common_prompt_checkpoint(const common_prompt_checkpoint &) = delete;
    common_prompt_checkpoint & operator=(const common_prompt_checkpoint &) = delete;
    ~common_prompt_checkpoint();  // hands its buffers to the pool when the pool is on

    void update_tgt(llama_context * ctx, int seq_id, unsigned int flags);
    void update_dft(llama_context * ctx, int seq_id, unsigned int flags);
#ifdef SAMPLE_UPSTREAM
    std::vector<uint8_t> data_spec;  // the speculative state stashed with the checkpoint
    mutable common_restore_truth truth_load;
    void load_tgt(llama_context * ctx, int seq_id, unsigned int flags) const;
    void load_dft(llama_context * ctx, int seq_id, unsigned int flags) const;
#endif
};

#ifdef SAMPLE_UPSTREAM
// Stand-in for the speculative decoder's state (common/speculative.cpp): `state_bytes` of it.
struct common_speculative {
    size_t state_bytes = 0;
};
bool common_speculative_get_state(common_speculative * spec, int seq_id, std::vector<uint8_t> & data);
#endif

// Test hook: the next checkpoint pauses after its fill until SIGUSR1 (see common.cpp).
void common_checkpoint_pause_first(bool on);

struct common_state_buffer_pool_stats {
    int64_t hits = 0;
    int64_t misses = 0;
    int64_t accepted = 0;
    int64_t declined = 0;
    int64_t evicted = 0;
    size_t n_hwm = 0;
    size_t bytes_hwm = 0;  // the most bytes (buffer sizes) it held at once
    size_t bytes_held = 0;
    int64_t trims = 0;  // trim() calls that freed something
    size_t trimmed_bytes = 0;
    size_t n_held = 0;  // buffers in the pool now
};

// A process-wide bounded pool of checkpoint buffers (llama.cpp PR #201's design). Buffers above the
// size floor are kept resident for reuse instead of going back to glibc, which would munmap()
// them; the byte cap, count cap and smallest-first displacement keep what it holds bounded.
class common_state_buffer_pool {
  public:
    static constexpr size_t size_floor = 32u << 20;  // below glibc's mmap threshold pooling saves nothing
    static constexpr size_t default_count_cap = 64;

    // Leaky on purpose: checkpoints destroyed during exit may still call put().
    static common_state_buffer_pool & instance();

    void set_enabled(bool on);
    bool enabled() const;
    // Test knobs (--pool-cap-mib, --pool-count): other caps than PR #201's, so a prediction can be
    // checked where a cap binds without holding gigabytes.
    void set_caps(size_t bytes, size_t count);

    // The smallest pooled buffer whose size() >= size, or an empty vector.
    std::vector<uint8_t> get(size_t size);
    // Keeps src if the caps allow, else leaves it with the caller.
    void put(std::vector<uint8_t> && src);
    void trim();

    size_t byte_cap() const { return cap_bytes; }
    common_state_buffer_pool_stats stats() const;

  private:
    common_state_buffer_pool();

    mutable std::mutex mtx;
    bool on = false;
    size_t cap_bytes;
    size_t count_cap = default_count_cap;
    std::vector<std::vector<uint8_t>> bufs;
    common_state_buffer_pool_stats st;
};
