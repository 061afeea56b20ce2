// libsample-llama.so: stand-in for libllama.so, a context with resident per-sequence state.

#include "llama.h"
#include "truth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <atomic>

#ifdef SAMPLE_CUDA
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>

static void cuda_check(cudaError_t e, const char * what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "sample-llama: %s failed: %s\n", what, cudaGetErrorString(e));
        abort();
    }
}

static void cu_check(CUresult r, const char * what) {
    if (r != CUDA_SUCCESS) {
        const char * s = "unknown error";
        cuGetErrorString(r, &s);
        fprintf(stderr, "sample-llama: %s failed: %s\n", what, s);
        abort();
    }
}
#endif

struct llama_context {
    int32_t n_seq;
    size_t max_state_bytes;
    std::atomic<size_t> state_bytes;
    int64_t decode_us;
    uint8_t ** state;  // one buffer per sequence, max_state_bytes each
    std::atomic<int64_t> n_decoded;
    std::atomic<int64_t> n_outputs;
#ifdef SAMPLE_CUDA
    uint8_t ** dev_state;  // each sequence's state in device memory, where the copy reads it
    int32_t cuda_tensors = 4;
    int cuda_driver_api = 0;
#endif
};

extern "C" {

llama_context * sample_llama_init(int32_t n_seq, size_t max_state_bytes, int64_t decode_us) {
    auto * ctx = new llama_context();
    ctx->n_seq = n_seq;
    ctx->max_state_bytes = max_state_bytes;
    ctx->state_bytes = max_state_bytes;
    ctx->decode_us = decode_us;
    ctx->state = (uint8_t **) calloc(n_seq, sizeof(uint8_t *));
    for (int32_t s = 0; s < n_seq; s++) {
        ctx->state[s] = (uint8_t *) malloc(max_state_bytes);
        if (ctx->state[s] == nullptr) {
            fprintf(stderr, "sample-llama: cannot allocate %zu bytes of state\n", max_state_bytes);
            abort();
        }
        // Non-zero so every page is a real, private page (not the shared zero page), and
        // locked in where allowed so the source stays resident under memory pressure.
        memset(ctx->state[s], 0x5a + s, max_state_bytes);
        mlock(ctx->state[s], max_state_bytes);
    }
#ifdef SAMPLE_CUDA
    ctx->dev_state = (uint8_t **) calloc(n_seq, sizeof(uint8_t *));
    for (int32_t s = 0; s < n_seq; s++) {
        cuda_check(cudaMalloc((void **) &ctx->dev_state[s], max_state_bytes), "cudaMalloc");
        cuda_check(cudaMemcpy(ctx->dev_state[s], ctx->state[s], max_state_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
#endif
    return ctx;
}

void sample_llama_set_state_bytes(llama_context * ctx, size_t state_bytes) {
    if (state_bytes > ctx->max_state_bytes) {
        fprintf(stderr, "sample-llama: state of %zu bytes exceeds the %zu allocated\n", state_bytes,
                ctx->max_state_bytes);
        abort();
    }
    ctx->state_bytes = state_bytes;
}

const uint8_t * sample_llama_state(const llama_context * ctx, int32_t seq_id) { return ctx->state[seq_id]; }

int64_t sample_llama_n_decoded(const llama_context * ctx) { return ctx->n_decoded; }
int64_t sample_llama_n_outputs(const llama_context * ctx) { return ctx->n_outputs; }

#ifdef SAMPLE_CUDA
void sample_llama_set_cuda_tensors(llama_context * ctx, int32_t n_tensors) { ctx->cuda_tensors = n_tensors; }
void sample_llama_set_cuda_driver_api(llama_context * ctx, int driver) { ctx->cuda_driver_api = driver; }
#endif

void sample_llama_free(llama_context * ctx) {
#ifdef SAMPLE_CUDA
    for (int32_t s = 0; s < ctx->n_seq; s++) {
        cudaFree(ctx->dev_state[s]);
    }
    free(ctx->dev_state);
#endif
    for (int32_t s = 0; s < ctx->n_seq; s++) {
        free(ctx->state[s]);
    }
    free(ctx->state);
    delete ctx;
}

llama_batch llama_batch_init(int32_t n_tokens, int32_t embd, int32_t n_seq_max) {
    llama_batch batch = {};
    if (embd) {
        batch.embd = (float *) calloc((size_t) n_tokens * embd, sizeof(float));
    } else {
        batch.token = (llama_token *) calloc(n_tokens, sizeof(llama_token));
    }
    batch.pos = (llama_pos *) calloc(n_tokens, sizeof(llama_pos));
    batch.n_seq_id = (int32_t *) calloc(n_tokens, sizeof(int32_t));
    batch.seq_id = (llama_seq_id **) calloc(n_tokens + 1, sizeof(llama_seq_id *));
    for (int32_t i = 0; i < n_tokens; i++) {
        batch.seq_id[i] = (llama_seq_id *) calloc(n_seq_max, sizeof(llama_seq_id));
    }
    batch.logits = (int8_t *) calloc(n_tokens, sizeof(int8_t));
    return batch;
}

void llama_batch_free(llama_batch batch) {
    free(batch.token);
    free(batch.embd);
    free(batch.pos);
    free(batch.n_seq_id);
    if (batch.seq_id) {
        for (int32_t i = 0; batch.seq_id[i]; i++) {
            free(batch.seq_id[i]);
        }
    }
    free(batch.seq_id);
    free(batch.logits);
}

// Tokens decoded, outputs counted, and the compute: one unit per ubatch of up to 64 tokens.
static int32_t decode_tokens(llama_context * ctx, int32_t n_tokens, int64_t outputs, uint64_t h) {
    const int64_t n_ubatch = (n_tokens + 63) / 64;
    const int64_t until = now_ns() + n_ubatch * ctx->decode_us * 1000;
    while (now_ns() < until) {
        h = h * 6364136223846793005ull + 1442695040888963407ull;
    }
    __asm__ volatile("" : : "r"(h));
    ctx->n_decoded += n_tokens;
    ctx->n_outputs += outputs;
    return 0;
}

__attribute__((noinline)) int32_t llama_decode(llama_context * ctx, llama_batch batch) {
    if (batch.n_tokens <= 0 || batch.pos == nullptr || batch.seq_id == nullptr) {
        return -1;
    }
    int64_t outputs = 0;
    uint64_t h = 1469598103934665603ull;
    for (int32_t i = 0; i < batch.n_tokens; i++) {
        const llama_seq_id s = batch.seq_id[i][0];
        if (s < 0 || s >= ctx->n_seq) {
            return -1;
        }
        h = (h ^ (uint64_t) (batch.token ? batch.token[i] : 0) ^ (uint64_t) batch.pos[i]) * 1099511628211ull;
        outputs += batch.logits ? (batch.logits[i] != 0) : (i == batch.n_tokens - 1);
    }
    return decode_tokens(ctx, batch.n_tokens, outputs, h);
}

__attribute__((noinline)) size_t llama_state_seq_get_size_ext(llama_context * ctx, llama_seq_id seq_id,
                                                              llama_state_seq_flags flags) {
    (void) flags;
    if (seq_id < 0 || seq_id >= ctx->n_seq) {
        return 0;
    }
    return ctx->state_bytes;
}

__attribute__((noinline)) size_t llama_state_seq_get_data_ext(llama_context * ctx, uint8_t * dst,
                                                              size_t size, llama_seq_id seq_id,
                                                              llama_state_seq_flags flags) {
    (void) flags;
    if (seq_id < 0 || seq_id >= ctx->n_seq) {
        return 0;
    }
    const size_t n = ctx->state_bytes;
    // llama.cpp's buffer writer fails (and the call returns 0) when dst is too small.
    if (size < n) {
        return 0;
    }
#ifdef SAMPLE_CUDA
    // As ggml-cuda's get_tensor, tensor by tensor: an async copy on the per-thread stream, then wait.
    const size_t per = (n + (size_t) ctx->cuda_tensors - 1) / (size_t) ctx->cuda_tensors;
    for (size_t off = 0; off < n; off += per) {
        const size_t len = std::min(per, n - off);
        if (ctx->cuda_driver_api) {
            cu_check(cuMemcpyDtoHAsync_v2(dst + off, (CUdeviceptr) (uintptr_t) (ctx->dev_state[seq_id] + off), len,
                                          (CUstream) cudaStreamPerThread), "cuMemcpyDtoHAsync_v2");
            cu_check(cuStreamSynchronize((CUstream) cudaStreamPerThread), "cuStreamSynchronize");
            continue;
        }
        cuda_check(cudaMemcpyAsync(dst + off, ctx->dev_state[seq_id] + off, len, cudaMemcpyDeviceToHost,
                                   cudaStreamPerThread), "cudaMemcpyAsync");
        cuda_check(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize");
    }
#else
    memcpy(dst, ctx->state[seq_id], n);
#endif
    return n;
}

#ifdef SAMPLE_UPSTREAM
// Restores: the state copied back into the context (what load_tgt and the prompt cache call).
__attribute__((noinline)) size_t llama_state_seq_set_data_ext(llama_context * ctx, const uint8_t * src,
                                                              size_t size, llama_seq_id seq_id,
                                                              llama_state_seq_flags flags) {
    (void) flags;
    if (seq_id < 0 || seq_id >= ctx->n_seq || size > ctx->max_state_bytes) {
        return 0;
    }
    memcpy(ctx->state[seq_id], src, size);
    return size;
}

// The file: the token count, the tokens, the state; each call returns the bytes it wrote or read.
__attribute__((noinline)) size_t llama_state_seq_save_file(llama_context * ctx, const char * filepath,
                                                           llama_seq_id seq_id, const int32_t * tokens,
                                                           size_t n_token_count) {
    if (seq_id < 0 || seq_id >= ctx->n_seq) {
        return 0;
    }
    FILE * f = fopen(filepath, "wb");
    if (!f) {
        return 0;
    }
    const uint32_t n = (uint32_t) n_token_count;
    bool ok = fwrite(&n, sizeof(n), 1, f) == 1 && fwrite(tokens, sizeof(int32_t), n, f) == n &&
              fwrite(ctx->state[seq_id], 1, ctx->state_bytes, f) == ctx->state_bytes;
    ok = fclose(f) == 0 && ok;
    return ok ? sizeof(n) + n * sizeof(int32_t) + ctx->state_bytes : 0;
}

__attribute__((noinline)) size_t llama_state_seq_load_file(llama_context * ctx, const char * filepath,
                                                           llama_seq_id dest_seq_id, int32_t * tokens_out,
                                                           size_t n_token_capacity, size_t * n_token_count_out) {
    if (dest_seq_id < 0 || dest_seq_id >= ctx->n_seq) {
        return 0;
    }
    FILE * f = fopen(filepath, "rb");
    if (!f) {
        return 0;
    }
    uint32_t n = 0;
    size_t got = fread(&n, sizeof(n), 1, f) == 1 ? sizeof(n) : 0;
    *n_token_count_out = n;
    if (got && tokens_out) {
        const size_t state = ctx->state_bytes;
        got = n <= n_token_capacity && fread(tokens_out, sizeof(int32_t), n, f) == n &&
              fread(ctx->state[dest_seq_id], 1, state, f) == state ? got + n * sizeof(int32_t) + state : 0;
    }
    fclose(f);
    return got;
}
#endif

}  // extern "C"

#ifdef SAMPLE_UPSTREAM
int32_t llama_batch_ext::add_token(llama_seq_id seq_id, llama_token id, llama_pos pos, bool output) {
    if (tokens.size() >= n_tokens_max) {
        return -1;
    }
    token t;
    t.id = id;
    t.output = output;
    t.seq_ids.insert(seq_id);
    t.pos[0] = pos;
    tokens.push_back(std::move(t));
    return (int32_t) tokens.size() - 1;
}

__attribute__((noinline)) bool llama_batch_ext::set_decision_order(int32_t idx, int32_t order) {
    if (idx < 0 || (size_t) idx >= tokens.size()) {
        return false;
    }
    tokens[idx].decision_order = order;
    return true;
}

extern "C" __attribute__((noinline)) int32_t llama_process(llama_context * ctx, llama_process_type type,
                                                           llama_batch_ext * batch) {
    if (type != LLAMA_PROCESS_TYPE_DECODE || batch == nullptr || batch->tokens.empty()) {
        return -1;
    }
    int64_t outputs = 0;
    uint64_t h = 1469598103934665603ull;
    for (const auto & t : batch->tokens) {
        const llama_seq_id s = *t.seq_ids.begin();
        if (s < 0 || s >= ctx->n_seq) {
            return -1;
        }
        h = (h ^ (uint64_t) t.id ^ (uint64_t) t.pos[0]) * 1099511628211ull;
        outputs += t.output;
    }
    return decode_tokens(ctx, (int32_t) batch->tokens.size(), outputs, h);
}
#endif
