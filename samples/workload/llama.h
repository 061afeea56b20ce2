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

#ifdef __cplusplus
}
#endif
