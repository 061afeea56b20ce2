// Checkpoints that throw or longjmp out of the probed functions, for tests/test_unwind.py: the
// probe points of a checkpoint (update_tgt, the vector growth behind resize(), the state copy,
// update_slots around them) and callers that catch. Traced or not, it must print the same lines
// and exit with the same status.
// argv[1]: how checkpoint i (from 0) ends when i is odd: ok, copy (the copy throws), tgt
// (update_tgt throws after its copy), alloc (resize() throws std::bad_alloc inside the growth),
// longjmp (longjmp out of the copy to update_slots), abort (all complete, then abort()); even
// checkpoints complete. argv[2]: how many. argv[3] (any): wait for a line on stdin first (to be
// attached to). Exit status 3 when any checkpoint was cut short, so a lost status shows.
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <new>
#include <stdexcept>
#include <vector>

struct llama_context;

static const char * mode = "ok";
static int current = 0;
static jmp_buf escape;
static const size_t STATE = (size_t) 1 << 20;  // bytes copied per checkpoint

extern "C" __attribute__((noinline)) size_t llama_state_seq_get_data_ext(llama_context *, uint8_t * dst, size_t size,
                                                                         int, unsigned int) {
    memset(dst, 7, size);
    if (current % 2 == 1 && strcmp(mode, "copy") == 0) {
        throw std::runtime_error("copy failed");
    }
    if (current % 2 == 1 && strcmp(mode, "longjmp") == 0) {
        longjmp(escape, 1);
    }
    return size;
}

struct common_prompt_checkpoint {
    std::vector<uint8_t> data_tgt;
    void update_tgt(llama_context * ctx, int seq_id, unsigned int flags);
};

__attribute__((noinline)) void common_prompt_checkpoint::update_tgt(llama_context * ctx, int seq_id,
                                                                    unsigned int flags) {
    // alloc: a size no allocator gives (64 TiB): operator new throws inside the growth
    const bool huge = current % 2 == 1 && strcmp(mode, "alloc") == 0;
    data_tgt.resize(huge ? (size_t) 1 << 46 : STATE);
    llama_state_seq_get_data_ext(ctx, data_tgt.data(), data_tgt.size(), seq_id, flags);
    if (current % 2 == 1 && strcmp(mode, "tgt") == 0) {
        throw std::runtime_error("update_tgt failed");
    }
}

struct server_context_impl {
    int ok = 0, cut = 0;
    void update_slots();
};

// One checkpoint per call, into a new buffer (so every one grows it); its failure caught here.
__attribute__((noinline)) void server_context_impl::update_slots() {
    common_prompt_checkpoint c;
    if (setjmp(escape) != 0) {
        printf("checkpoint %d: longjmp\n", current);
        cut++;
        return;
    }
    try {
        c.update_tgt(nullptr, 0, 0);
        printf("checkpoint %d: ok %zu\n", current, c.data_tgt.size());
        ok++;
    } catch (const std::bad_alloc &) {
        printf("checkpoint %d: caught bad_alloc\n", current);
        cut++;
    } catch (const std::exception & e) {
        printf("checkpoint %d: caught %s\n", current, e.what());
        cut++;
    }
}

int main(int argc, char ** argv) {
    mode = argc > 1 ? argv[1] : "ok";
    const int n = argc > 2 ? atoi(argv[2]) : 10;
    if (argc > 3) {
        printf("pid %d waiting\n", (int) getpid());
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof(line), stdin)) {
            return 2;
        }
    }
    server_context_impl server;
    for (current = 0; current < n; current++) {
        server.update_slots();
    }
    printf("done: %d ok, %d cut short\n", server.ok, server.cut);
    fflush(stdout);
    if (strcmp(mode, "abort") == 0) {
        abort();
    }
    return server.cut ? 3 : 0;
}
