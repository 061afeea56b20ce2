// A checkpoint whose buffer realloc-style mremap moves and grows, for tests/test_memory.py: the
// two probe points a recording needs (update_tgt, llama_state_seq_get_data_ext) and nothing else.
// argv[1]: a JSON line of truth (addresses and times, CLOCK_MONOTONIC) is written there.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

struct llama_context;

extern "C" __attribute__((noinline)) size_t llama_state_seq_get_data_ext(llama_context *, uint8_t * dst, size_t size,
                                                                         int, unsigned int) {
    memset(dst, 7, size);
    return size;
}

struct common_prompt_checkpoint {
    void * buf = nullptr;
    void update_tgt(llama_context * ctx, int seq_id, unsigned int flags);
};

static const size_t MIB = (size_t) 1 << 20;

// The buffer is mapped inside the checkpoint: a checkpoint buffer (phase checkpoint).
__attribute__((noinline)) void common_prompt_checkpoint::update_tgt(llama_context * ctx, int seq_id, unsigned int flags) {
    buf = mmap(nullptr, 8 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    llama_state_seq_get_data_ext(ctx, (uint8_t *) buf, 8 * MIB, seq_id, flags);
}

static long long now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char ** argv) {
    FILE * truth = argc > 1 ? fopen(argv[1], "w") : nullptr;
    if (!truth) {
        return 2;
    }
    common_prompt_checkpoint c;
    c.update_tgt(nullptr, 0, 0);
    // Somewhere else to move it to (reserved outside any checkpoint: not a buffer), grown by half.
    void * to = mmap(nullptr, 12 * MIB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    const long long moved_ns = now_ns();
    void * moved = mremap(c.buf, 8 * MIB, 12 * MIB, MREMAP_MAYMOVE | MREMAP_FIXED, to);
    const long long unmap_ns = now_ns();
    if (c.buf == MAP_FAILED || to == MAP_FAILED || moved != to || munmap(moved, 12 * MIB) != 0) {
        return 1;
    }
    fprintf(truth, "{\"mapped\": %llu, \"moved_to\": %llu, \"moved_ns\": %lld, \"unmap_ns\": %lld}\n",
            (unsigned long long) (uintptr_t) c.buf, (unsigned long long) (uintptr_t) moved, moved_ns, unmap_ns);
    return fclose(truth) == 0 ? 0 : 1;
}
