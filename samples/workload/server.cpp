// libsample-server.so: stand-in for libllama-server-impl.so, the loop that creates checkpoints.

#include "server.h"
#include "truth.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

server_context_impl::server_context_impl(llama_context * c, const server_params & p) : ctx(c), params(p) {
    slots = std::vector<server_slot>(params.n_slots);  // a slot holds a checkpoint: not movable
    for (int32_t i = 0; i < params.n_slots; i++) {
        slots[i].id = i;
    }
    batch = llama_batch_init(params.n_slots * params.n_prompt_tokens, 0, 1);
#ifdef SAMPLE_UPSTREAM
    batch_ext = new llama_batch_ext((size_t) params.n_slots * params.n_prompt_tokens, params.n_slots);
    spec_impl.state_bytes = params.spec_state_bytes;
#endif
}

server_context_impl::~server_context_impl() {
    llama_batch_free(batch);
#ifdef SAMPLE_UPSTREAM
    delete batch_ext;
#endif
}

#ifdef SAMPLE_UPSTREAM
// As upstream's server_slot::prompt_save: size the cache entry, copy the whole state into it. Inlined
// into both callers, as upstream's GCC build inlines prompt_save into get_available_slot.
static inline __attribute__((always_inline)) bool save_prompt(server_slot & slot, llama_context * ctx,
                                                              common_restore_truth & t) {
    const int32_t id = slot.id;
    std::vector<uint8_t> & prompt_cache = slot.prompt_cache;
    t = common_restore_truth();
    t.tid = (int) syscall(SYS_gettid);
    t.start_ns = now_ns();
    const int64_t c_start = thread_cpu_ns();
    const int64_t f0 = thread_faults();
    const size_t size = llama_state_seq_get_size_ext(ctx, id, 0);
    sample_grow(prompt_cache, size);
    t.copy_start_ns = now_ns();
    const int64_t c0 = thread_cpu_ns();
    t.bytes = llama_state_seq_get_data_ext(ctx, prompt_cache.data(), size, id, 0);
    t.copy_cpu_ns = thread_cpu_ns() - c0;
    t.copy_ns = now_ns() - t.copy_start_ns;
    t.faults = thread_faults() - f0;
    t.cpu_ns = thread_cpu_ns() - c_start;
    t.end_ns = now_ns();
    return t.bytes == size;
}

__attribute__((noinline)) bool server_slot::prompt_save(llama_context * ctx, common_restore_truth & t) {
    return save_prompt(*this, ctx, t);
}

// Upstream's get_available_slot saves the slot's old prompt before it takes a new one: the save
// has no function of its own here, only its state copy.
__attribute__((noinline)) void server_context_impl::get_available_slot(server_slot & slot, common_restore_truth & t) {
    save_prompt(slot, ctx, t);
}
#endif

size_t server_context_impl::max_state_bytes(const server_params & p, int64_t n_iterations) {
    const int64_t n_prefill = n_iterations > 0 ? (n_iterations - 1) / (p.decode_per_prefill + 1) + 1 : 1;
    return p.ckpt_bytes + (size_t) (n_prefill - 1) * p.grow_bytes;
}

__attribute__((noinline)) void server_context_impl::create_checkpoint(server_slot & slot) {
    server_state_truth create{"create", n_iter, slot.id, {}};
    create.t.tid = (int) syscall(SYS_gettid);
    create.t.start_ns = now_ns();
    // As the real server: make room first, so a pooled buffer can come straight back.
    if (!slot.checkpoints.empty() && (int32_t) slot.checkpoints.size() >= params.n_keep) {
        slot.checkpoints.pop_front();
        create.evictions++;
    }
    auto & cur = slot.checkpoints.emplace_back();
    cur.update_tgt(ctx, slot.id, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    last_checkpoints.push_back({n_iter, slot.id, false, cur.truth_tgt});
    if (params.draft) {
        cur.update_dft(ctx, slot.id, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
        last_checkpoints.push_back({n_iter, slot.id, true, cur.truth_dft});
    }
#ifdef SAMPLE_UPSTREAM  // the upstream build's truth: the whole call, its speculative state
    if (params.spec_state_bytes) {
        server_state_truth st{"spec_state", n_iter, slot.id, {}};
        st.t.tid = create.t.tid;
        st.t.start_ns = now_ns();
        common_speculative_get_state(&spec_impl, slot.id, cur.data_spec);
        st.t.end_ns = now_ns();
        st.t.bytes = cur.data_spec.size();
        last_states.push_back(st);
        create.t.bytes += st.t.bytes;  // the server's checkpoint size() counts data_spec too
    }
#endif
    create.t.end_ns = now_ns();
    for (const auto & c : last_checkpoints) {
        if (c.slot == slot.id && c.iter == n_iter) {
            create.t.bytes += c.t.bytes;
        }
    }
    last_states.push_back(create);
}

#ifdef SAMPLE_UPSTREAM
// As the server's slot save and restore tasks: save the slot's tokens and state to the file, then
// ask the file for its token count and load it back. Each call timed around it, its bytes its own.
void server_context_impl::slot_file_round_trip(server_slot & slot) {
    std::vector<int32_t> tokens(params.n_prompt_tokens, 1);
    auto timed = [&](const char * type, auto call) {
        server_state_truth st{type, n_iter, slot.id, {}};
        st.t.tid = (int) syscall(SYS_gettid);
        st.t.start_ns = now_ns();
        st.t.bytes = call();
        st.t.end_ns = now_ns();
        last_states.push_back(st);
    };
    timed("slot_save", [&] { return llama_state_seq_save_file(ctx, params.slot_file, slot.id, tokens.data(), tokens.size()); });
    size_t n = 0;
    timed("slot_restore", [&] { return llama_state_seq_load_file(ctx, params.slot_file, slot.id, nullptr, 0, &n); });
    timed("slot_restore", [&] { return llama_state_seq_load_file(ctx, params.slot_file, slot.id, tokens.data(), tokens.size(), &n); });
}
#endif

__attribute__((noinline)) void server_context_impl::update_slots() {
    const int64_t start = now_ns();
    const int64_t cpu_start = thread_cpu_ns();
    const bool prefill = n_iter % (params.decode_per_prefill + 1) == 0;
    n_iter++;
    last_checkpoints.clear();
    last_states.clear();

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
#ifdef SAMPLE_UPSTREAM
        // A prompt that shares a prefix with the last one: each slot goes back to its checkpoint.
        if (params.restore_every > 0 && n_prefill > 1 && (n_prefill - 1) % params.restore_every == 0) {
            for (auto & slot : slots) {
                if (!slot.checkpoints.empty()) {
                    const auto & ck = slot.checkpoints.back();
                    ck.load_tgt(ctx, slot.id, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
                    last_states.push_back({"restore", n_iter, slot.id, ck.truth_load});
                }
            }
        }
        if (params.prompt_save) {
            server_state_truth st{"prompt_save", n_iter, 0, {}};
            slots[0].prompt_save(ctx, st.t);
            last_states.push_back(st);
        }
        if (params.prompt_save_inlined) {
            server_state_truth st{"prompt_save_inlined", n_iter, slots.back().id, {}};
            get_available_slot(slots.back(), st.t);
            last_states.push_back(st);
        }
        if (params.slot_file) {
            slot_file_round_trip(slots[0]);
        }
#endif
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
#ifdef SAMPLE_UPSTREAM
        if (params.spec) {  // a speculative round: each slot saves its state first (pre_decode)
            for (auto & slot : slots) {
                slot.spec_ckpt.update_tgt(ctx, slot.id, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
                last_checkpoints.push_back({n_iter, slot.id, false, slot.spec_ckpt.truth_tgt, true});
                n_ckpt++;
            }
        }
#endif
        for (auto & slot : slots) {
            const int32_t k = batch.n_tokens++;
            batch.token[k] = (llama_token) ((slot.n_past * 31 + slot.id) % 32000);
            batch.pos[k] = slot.n_past++;
            batch.n_seq_id[k] = 1;
            batch.seq_id[k][0] = slot.id;
            batch.logits[k] = 1;
        }
    }
#ifdef SAMPLE_UPSTREAM
    batch_ext->tokens.clear();
    for (int32_t k = 0; k < batch.n_tokens; k++) {
        batch_ext->add_token(batch.seq_id[k][0], batch.token[k], batch.pos[k], batch.logits[k] != 0);
    }
    const int32_t ret = llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch_ext);
#else
    const int32_t ret = llama_decode(ctx, batch);
#endif
    if (ret != 0) {
        fprintf(stderr, "sample-server: batch decode failed\n");
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
