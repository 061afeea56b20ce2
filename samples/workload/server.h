// Stand-in for llama-server's server_context_impl: slots, checkpoints, one batch per iteration.
#pragma once

#include "common.h"
#include "llama.h"

#include <stdint.h>

#include <list>
#include <vector>

struct server_params {
    int32_t n_slots = 2;
    int32_t decode_per_prefill = 2;  // iteration i (from 0) is a prefill when i % (K + 1) == 0
    int32_t n_prompt_tokens = 64;    // per slot per prefill batch
    int32_t n_keep = 1;              // checkpoints kept per slot
    size_t ckpt_bytes = 48u << 20;
    size_t grow_bytes = 0;  // added per prefill iteration
    int32_t request_prefills = 0;  // > 0: every that many prefills each slot starts a new request
    bool draft = false;
    // The upstream generation (a SAMPLE_UPSTREAM build): what its server does besides checkpoints.
    int32_t restore_every = 0;  // from the 2nd prefill, every Nth: each slot first restores its last checkpoint
    bool spec = false;          // decode iterations: a speculative checkpoint per slot (update_tgt in pre_decode)
    size_t spec_state_bytes = 0;  // create_checkpoint stashes this much speculative state
    bool prompt_save = false;   // each prefill: slot 0 saves its prompt state to the cache
    bool prompt_save_inlined = false;  // each prefill: the last slot saves it in get_available_slot, inlined
    const char * slot_file = nullptr;  // each prefill: slot 0 saved to this file and restored from it
};

struct server_iteration_truth {
    int64_t iter = 0;  // counts update_slots() calls, from 1
    bool prefill = false;
    int64_t start_ns = 0;
    int64_t end_ns = 0;
    int64_t cpu_ns = 0;  // CLOCK_THREAD_CPUTIME_ID over the same call
    int32_t n_checkpoints = 0;
    int32_t n_tokens = 0;
    int32_t n_prompt_tokens = 0;
    int tid = 0;
};

struct server_checkpoint_truth {
    int64_t iter;
    int32_t slot;
    bool draft;
    common_checkpoint_truth t;
    bool spec = false;
};

// A restore (load_tgt), a prompt save, a speculative state or a whole create_checkpoint call.
struct server_state_truth {
    const char * type;  // "restore", "prompt_save", "prompt_save_inlined", "spec_state", "create",
                        // "slot_save", "slot_restore" (its two load_file calls: the count, then the rest)
    int64_t iter;
    int32_t slot;
    common_restore_truth t;
    int32_t evictions = 0;  // create: old checkpoints erased first
};

struct server_slot {
    int32_t id = 0;
    llama_pos n_past = 0;
    std::list<common_prompt_checkpoint> checkpoints;
#ifdef SAMPLE_UPSTREAM
    common_prompt_checkpoint spec_ckpt;
    std::vector<uint8_t> prompt_cache;  // stand-in for server_prompt_cache's buffer
    bool prompt_save(llama_context * ctx, common_restore_truth & t);
#endif
};

struct server_context_impl {
    server_context_impl(llama_context * ctx, const server_params & params);
    ~server_context_impl();

    void update_slots();  // one iteration: the checkpoints, then one llama_decode()
    void create_checkpoint(server_slot & slot);
#ifdef SAMPLE_UPSTREAM
    void get_available_slot(server_slot & slot, common_restore_truth & t);
    void slot_file_round_trip(server_slot & slot);
#endif

    static size_t max_state_bytes(const server_params & params, int64_t n_iterations);

    llama_context * ctx;
    server_params params;
    std::vector<server_slot> slots;
    llama_batch batch;
#ifdef SAMPLE_UPSTREAM
    llama_batch_ext * batch_ext = nullptr;
    common_speculative spec_impl;
#endif
    int64_t n_iter = 0;
    int64_t n_prefill = 0;

    // Filled by update_slots(), written out by the caller once it has returned.
    server_iteration_truth last_iteration;
    std::vector<server_checkpoint_truth> last_checkpoints;
    std::vector<server_state_truth> last_states;
};
