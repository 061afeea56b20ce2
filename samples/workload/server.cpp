// libsample-server.so: stand-in for libllama-server-impl.so, the loop that creates checkpoints.

#include "server.h"
#include "truth.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

server_context_impl::server_context_impl(llama_context * c, const server_params & p) : ctx(c), params(p) {
    slots.resize(params.n_slots);
    for (int32_t i = 0; i < params.n_slots; i++) {
        slots[i].id = i;
    }
    batch = llama_batch_init(params.n_slots * params.n_prompt_tokens, 0, 1);
}

server_context_impl::~server_context_impl() { llama_batch_free(batch); }

size_t server_context_impl::max_state_bytes(const server_params & p, int64_t n_iterations) {
    const int64_t n_prefill = n_iterations > 0 ? (n_iterations - 1) / (p.decode_per_prefill + 1) + 1 : 1;
    return p.ckpt_bytes + (size_t) (n_prefill - 1) * p.grow_bytes;
}

__attribute__((noinline)) void server_context_impl::create_checkpoint(server_slot & slot) {
    // As the real server: make room first, so a pooled buffer can come straight back.
    if (!slot.checkpoints.empty() && (int32_t) slot.checkpoints.size() >= params.n_keep) {
        slot.checkpoints.pop_front();
    }
    auto & cur = slot.checkpoints.emplace_back();
    cur.update_tgt(ctx, slot.id, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    last_checkpoints.push_back({n_iter, slot.id, false, cur.truth_tgt});
    if (params.draft) {
        cur.update_dft(ctx, slot.id, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
        last_checkpoints.push_back({n_iter, slot.id, true, cur.truth_dft});
    }
}

__attribute__((noinline)) void server_context_impl::update_slots() {
    const int64_t start = now_ns();
    const int64_t cpu_start = thread_cpu_ns();
    const bool prefill = n_iter % (params.decode_per_prefill + 1) == 0;
    n_iter++;
    last_checkpoints.clear();

    int32_t n_ckpt = 0;
    batch.n_tokens = 0;
    if (prefill) {
        // A new request (--request-prefills): the slot's checkpoints go, its context starts over.
        int64_t in_request = n_prefill;
        if (params.request_prefills > 0) {
            in_request = n_prefill % params.request_prefills;
            if (in_request == 0 && n_prefill > 0) {
                for (auto & slot : slots) {
                    slot.checkpoints.clear();
                }
            }
        }
        // Stand-in for the sequence state growing as the context fills.
        sample_llama_set_state_bytes(ctx, params.ckpt_bytes + (size_t) in_request * params.grow_bytes);
        n_prefill++;
        for (auto & slot : slots) {
            create_checkpoint(slot);
            n_ckpt++;
        }
        for (auto & slot : slots) {
            for (int32_t i = 0; i < params.n_prompt_tokens; i++) {
                const int32_t k = batch.n_tokens++;
                batch.token[k] = (llama_token) ((slot.n_past * 31 + slot.id) % 32000);
                batch.pos[k] = slot.n_past++;
                batch.n_seq_id[k] = 1;
                batch.seq_id[k][0] = slot.id;
                batch.logits[k] = i == params.n_prompt_tokens - 1;
            }
        }
    } else {
        for (auto & slot : slots) {
            const int32_t k = batch.n_tokens++;
            batch.token[k] = (llama_token) ((slot.n_past * 31 + slot.id) % 32000);
            batch.pos[k] = slot.n_past++;
            batch.n_seq_id[k] = 1;
            batch.seq_id[k][0] = slot.id;
            batch.logits[k] = 1;
        }
    }
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "sample-server: llama_decode failed\n");
        abort();
    }

    last_iteration.iter = n_iter;
    last_iteration.prefill = prefill;
    last_iteration.n_checkpoints = n_ckpt;
    last_iteration.n_tokens = batch.n_tokens;
    last_iteration.n_prompt_tokens = prefill ? batch.n_tokens : 0;
    last_iteration.tid = (int) syscall(SYS_gettid);
    last_iteration.start_ns = start;
    last_iteration.cpu_ns = thread_cpu_ns() - cpu_start;
    last_iteration.end_ns = now_ns();
}
