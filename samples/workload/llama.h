// Stand-in for llama.h: the types and the few functions the checkpoint path calls, same layout
// and signatures as llama.cpp, so probes written for the real libllama.so apply unchanged.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct llama_context;  // opaque to callers, as in llama.h

typedef int32_t llama_pos;
typedef int32_t llama_token;
typedef int32_t llama_seq_id;
typedef uint32_t llama_state_seq_flags;

#define LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY 1

// Exactly llama.h's layout: llama_decode() takes it by value (56 bytes, passed on the stack).
typedef struct llama_batch {
    int32_t n_tokens;

    llama_token  *  token;
    float        *  embd;
    llama_pos    *  pos;
    int32_t      *  n_seq_id;
    llama_seq_id ** seq_id;
    int8_t       *  logits;
} llama_batch;

llama_batch llama_batch_init(int32_t n_tokens, int32_t embd, int32_t n_seq_max);
void        llama_batch_free(llama_batch batch);

int32_t llama_decode(struct llama_context * ctx, llama_batch batch);

size_t llama_state_seq_get_size_ext(struct llama_context * ctx, llama_seq_id seq_id,
                                    llama_state_seq_flags flags);
size_t llama_state_seq_get_data_ext(struct llama_context * ctx, uint8_t * dst, size_t size,
                                    llama_seq_id seq_id, llama_state_seq_flags flags);

// Sample-only: a context with n_seq sequences whose state buffers hold max_state_bytes each,
// allocated and touched up front so the copy out of them never faults on the source side.
// llama_decode() spins decode_us microseconds per ubatch of up to 64 tokens.
struct llama_context * sample_llama_init(int32_t n_seq, size_t max_state_bytes, int64_t decode_us);
// Stand-in for the state growing with the context; must not exceed max_state_bytes.
void sample_llama_set_state_bytes(struct llama_context * ctx, size_t state_bytes);
// Tokens decoded and logits requested so far (for the ground truth).
// The resident state of one sequence (what llama_state_seq_get_data_ext copies), unprobed.
const uint8_t * sample_llama_state(const struct llama_context * ctx, int32_t seq_id);
int64_t sample_llama_n_decoded(const struct llama_context * ctx);
int64_t sample_llama_n_outputs(const struct llama_context * ctx);
void sample_llama_free(struct llama_context * ctx);

size_t llama_state_seq_set_data_ext(struct llama_context * ctx, const uint8_t * src, size_t size,
                                    llama_seq_id seq_id, llama_state_seq_flags flags);
// Slot files (POST /slots/ID?action=save|restore): the tokens and the sequence's state. load_file
// with no token buffer reads only the header (the token count), as the server asks first.
size_t llama_state_seq_save_file(struct llama_context * ctx, const char * filepath, llama_seq_id seq_id,
                                 const int32_t * tokens, size_t n_token_count);
size_t llama_state_seq_load_file(struct llama_context * ctx, const char * filepath, llama_seq_id dest_seq_id,
                                 int32_t * tokens_out, size_t n_token_capacity, size_t * n_token_count_out);

#ifdef SAMPLE_CUDA
// The CUDA build (ckpt-workload-cuda): each sequence's state lives in device memory and the state
// copy is one cudaMemcpyAsync device-to-host plus a cudaStreamSynchronize per "tensor", as ggml-cuda's
// get_tensor does; this many tensors per copy (4).
void sample_llama_set_cuda_tensors(struct llama_context * ctx, int32_t n_tensors);
// driver != 0: the same copies through the driver API (cuMemcpyDtoHAsync_v2, cuStreamSynchronize), as a
// build with the runtime linked statically makes them: only libcuda is a library to probe there.
void sample_llama_set_cuda_driver_api(struct llama_context * ctx, int driver);
#endif

#ifdef __cplusplus
}
#endif

#ifdef SAMPLE_UPSTREAM
// The upstream generation's batch (llama.cpp src/llama-batch.h, build 11434): the same layout, so
// the recorder's read of its token vector is checked here. The server fills it and passes it to
// llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch).
#include <array>
#include <unordered_set>
#include <vector>

struct llama_memory_i;
struct llama_batch_ext {
    const size_t n_tokens_max;
    const size_t n_embd_inp = 0;
    const size_t n_embd_inp_enc = 0;
    const llama_seq_id n_seq_max;
    llama_memory_i * mem = nullptr;
    const llama_token n_vocab = 32000;
    const size_t n_pos_per_embd = 1;
    size_t n_embd = 0;

    struct token {
        llama_token id = -1;
        bool has_embd = false;
        size_t embd_off = 0;
        bool output = false;
        int32_t decision_order = 0;
        std::unordered_set<llama_seq_id> seq_ids;
        std::array<llama_pos, 4> pos = {0, 0, 0, 0};
    };
    std::vector<token> tokens;
    std::vector<float> embd;

    llama_batch_ext(size_t n_max, llama_seq_id n_seq) : n_tokens_max(n_max), n_seq_max(n_seq) {}
    int32_t add_token(llama_seq_id seq_id, llama_token id, llama_pos pos, bool output);
    bool set_decision_order(int32_t idx, int32_t order);  // build 11434's marker
};

enum llama_process_type {
    LLAMA_PROCESS_TYPE_ENCODE,
    LLAMA_PROCESS_TYPE_DECODE,
};

extern "C" int32_t llama_process(struct llama_context * ctx, enum llama_process_type type,
                                 struct llama_batch_ext * batch);
#endif
