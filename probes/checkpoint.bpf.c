/* Kernel side of `ckptrace record`: checkpoint/iteration spans from uprobes, fault counts from the
 * thread's own counters, sampled fault service time, and mmap/munmap/mremap of one process.
 *
 * Options arrive only as integer -D defines chosen by the recorder, never as user text:
 *   MAX_TARGETS     most processes traced at once; which ones is the `targets` map (tgid -> 1),
 *                   filled by the recorder (integers in a map, never text in this source)
 *   RSS_STEP        emit an `rss` row when a process's resident bytes moved by at least this
 *                   many bytes since its last row (0: no RSS rows)
 *   RSS_PER_FAULT   1: RSS from kmem:rss_stat, a program on every fault (record --rss-per-fault);
 *                   0: from the mm's counters at a few events (TASK_MM_OFF, MM_RSS_OFF,
 *                   MM_RSS_STRIDE from the BTF, RSS_PAGE_SHIFT; without them no RSS rows)
 *   MIN_FLT_OFF     byte offset of task_struct.min_flt in the RUNNING kernel (from its BTF; the
 *   MAJ_FLT_OFF     installed headers are for another kernel version, so never take it from them)
 *   RINGBUF_PAGES   ring buffer size in kernel pages (power of two)
 *   BATCH_BY_REFERENCE  1: llama_decode's llama_batch arrives by its address in the second
 *                   argument register (AAPCS64), 0: in memory at sp + 8 (x86-64); probes/arch.py
 *   SCHED_COUNTERS  1: read the scheduler counters below (0 on a kernel without them)
 *   MAX_THREADS     entries of the per-thread map; a thread's entry goes when it exits
 *   SUM_EXEC_RUNTIME_OFF, EXEC_START_OFF, RUN_DELAY_OFF, NVCSW_OFF, NIVCSW_OFF   task_struct offsets
 *   SE_CFS_RQ_OFF, CFS_RQ_RQ_OFF, RQ_CLOCK_OFF, RQ_CLOCK_TASK_OFF       to find the thread's rq
 *   BATCH_TOKENS_OFF, BATCH_OUTPUT_OFF   llama_batch_ext's token vector: its offset in the struct,
 *                   and offsetof(token, output)
 *   TOKEN_SIZE_STDCXX, TOKEN_SIZE_LIBCXX  sizeof(llama_batch_ext::token) by standard library
 * Per process, the `targets` map's value holds TARGET_* flags (checkpoint.h) the recorder set from
 * its probe plan.
 * A process that maps libcudart or libcuda also gets the CUDA programs (cuda.bpf.h and the "CUDA" section below);
 * every other process never reaches them.
 */
#include <uapi/linux/ptrace.h>
#include <uapi/linux/bpf_perf_event.h>
#include "checkpoint.h"
#include "tstate.bpf.h"
#include "cuda.bpf.h"
#include "emit.bpf.h"
#include "memory.bpf.h"

struct logits_buf {
    u8 b[256];
};
BPF_PERCPU_ARRAY(scratch, struct logits_buf, 1);
#define BATCH_SCAN 256 /* tokens of a llama_batch_ext whose output flag is read */
#define TOKEN_SIZE_MAX (TOKEN_SIZE_STDCXX > TOKEN_SIZE_LIBCXX ? TOKEN_SIZE_STDCXX : TOKEN_SIZE_LIBCXX)
struct tokens_buf {
    u8 b[BATCH_SCAN * TOKEN_SIZE_MAX];
};
BPF_PERCPU_ARRAY(token_scratch, struct tokens_buf, 1);

/* ---- checkpoints: common_prompt_checkpoint::update_tgt / update_dft ---- */

static __always_inline void open_ckpt(struct tstate *s, u32 draft, u32 in_create)
{
    if (s->ckpt)
        count(C_ABANDONED);
    s->ckpt = new_id();
    s->ck_draft = draft;
    s->ck_in_create = in_create;
    /* the server's speculative rounds call update_tgt directly, not from create_checkpoint */
    s->ck_spec = (target_flags() & TARGET_CREATE) && !s->cr_open;
    s->ck_bytes = 0;
    s->ck_sp = 0;
    s->phase = P_NONE;
    open_span(&s->ck, s);
}

/* No checkpoint open on this thread any more (closed, or abandoned). */
static __always_inline void ckpt_reset(struct tstate *s)
{
    s->ckpt = 0;
    s->phase = P_NONE;
    s->ck_draft = 0;
    s->ck_spec = 0;
    s->ck_in_create = 0;
    s->ck_sp = 0;
}

static __always_inline int ckpt_enter(struct pt_regs *ctx, u32 draft)
{
    u32 tid;
    struct tstate *s = entry_state(&tid);
    if (!s)
        return 0;
    open_ckpt(s, draft, 0);
    s->ck_sp = PT_REGS_SP(ctx);
    return 0;
}

int ckpt_enter_tgt(struct pt_regs *ctx) { return ckpt_enter(ctx, 0); }
int ckpt_enter_dft(struct pt_regs *ctx) { return ckpt_enter(ctx, 1); }

/* The open checkpoint's frame is gone: a probe of this thread runs with the stack pointer above
 * the one update_tgt was entered with, so an exception or a longjmp left it and it will never
 * return. Counted abandoned, no row (its fill and copy rows that ended stay); what the thread
 * does next is no longer the checkpoint's. */
static __always_inline void unwound(struct tstate *s, u64 sp)
{
    if (!s->ckpt || !s->ck_sp || sp <= s->ck_sp)
        return;
    count(C_ABANDONED);
    ckpt_reset(s);
}

/* ik_llama.cpp: no update_tgt. server_context::create_checkpoint asks llama_state_seq_get_size,
 * builds the buffer (std::vector<uint8_t>(n): operator new, then memset) and copies into it with
 * llama_state_seq_get_data: the checkpoint is that size query's entry to that copy's return, the
 * same calls update_tgt makes. A size query anywhere else (a prompt save) opens nothing. */
int ckpt_enter_size(struct pt_regs *ctx)
{
    u32 tid;
    struct tstate *s = return_state(&tid);
    if (!s || !s->cr_open || s->ckpt)
        return 0;
    open_ckpt(s, 0, 1);
    return 0;
}

static __always_inline void close_ckpt(u32 tid, struct tstate *s, u64 now)
{
    s->phase = P_CHECKPOINT; /* so the row's phase says what it is, whatever was open */
    emit_span(K_CHECKPOINT, tid, s, &s->ck, now, s->ck_bytes, 0);
    if (s->cr_open)
        s->cr_bytes += s->ck_bytes;
    ckpt_reset(s);
}

int ckpt_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u32 tid;
    struct tstate *s = return_state(&tid);
    if (!s || !s->ckpt) {
        count(C_PARTIAL);
        return 0;
    }
    close_ckpt(tid, s, now);
    rss_sample(tid, now);
    return 0;
}

/* ---- fill: std::vector<unsigned char>::_M_default_append(n), only inside a checkpoint ---- */

/* The calling thread's state when it is inside a checkpoint with no fill or copy open; else 0
 * (growth elsewhere in the process is not a checkpoint fill). */
static __always_inline struct tstate *fill_state(struct pt_regs *ctx)
{
    u32 tid;
    struct tstate *s = return_state(&tid);
    if (s)
        unwound(s, PT_REGS_SP(ctx));
    if (!s || !s->ckpt || s->phase != P_NONE)
        return 0;
    return s;
}

static __always_inline int open_fill(struct tstate *s, u64 bytes)
{
    s->phase = P_FILL;
    s->ph_bytes = bytes;
    s->ph_addr = 0;
    open_span(&s->ph, s);
    return 0;
}

int fill_enter(struct pt_regs *ctx)
{
    struct tstate *s = fill_state(ctx);
    return s ? open_fill(s, PT_REGS_PARM2(ctx)) : 0;
}

/* libc++ builds: std::__1::vector<unsigned char>::resize(n) with the growth (__append) inlined.
 * Only a call that grows is a fill: n above the size its begin/end pointers give now. */
int fill_enter_resize(struct pt_regs *ctx)
{
    struct tstate *s = fill_state(ctx);
    if (!s)
        return 0;
    u64 be[2] = {};
    if (bpf_probe_read_user(be, sizeof(be), (void *)PT_REGS_PARM1(ctx)) != 0 || be[1] < be[0])
        return 0;
    u64 n = PT_REGS_PARM2(ctx);
    if (n <= be[1] - be[0])
        return 0; /* no growth: a pool hit or a shrink */
    return open_fill(s, n - (be[1] - be[0]));
}

/* A growth inlined into update_tgt (clang + libc++): a uprobe on each `call memset` in it opens the
 * fill (memset(dst, 0, n): n in the third argument register), and fill_return, attached as a plain
 * uprobe to the instruction after the call, closes it. */
int fill_enter_call(struct pt_regs *ctx)
{
    struct tstate *s = fill_state(ctx);
    return s ? open_fill(s, PT_REGS_PARM3(ctx)) : 0;
}

int fill_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u32 tid;
    struct tstate *s = return_state(&tid);
    if (!s || !s->ckpt || s->phase != P_FILL)
        return 0;
    emit_span(K_FILL, tid, s, &s->ph, now, s->ph_bytes, 0);
    s->phase = P_NONE;
    return 0;
}

/* ---- copy: llama_state_seq_get_data_ext(ctx, dst, size, seq_id, flags) ---- */

int copy_enter(struct pt_regs *ctx)
{
    u32 tid;
    struct tstate *s = return_state(&tid);
    if (s)
        unwound(s, PT_REGS_SP(ctx));
    if (s && !s->ckpt && s->ax_kind == K_PROMPT_SAVE && !s->ax_in_copy) {
        s->ax_in_copy = 1; /* a prompt save's copy: a copy row of its own (ckpt 0, phase prompt_save) */
        s->ph_addr = PT_REGS_PARM2(ctx);
        gpu_reset(s);
        s->ph_flags = (u32)PT_REGS_PARM5(ctx);
        open_span(&s->ph, s);
        return 0;
    }
    if (!s || !s->ckpt || s->phase != P_NONE)
        return 0;
    s->phase = P_COPY;
    s->ph_bytes = PT_REGS_PARM3(ctx);
    s->ph_addr = PT_REGS_PARM2(ctx);
    gpu_reset(s);
    s->ph_flags = (u32)PT_REGS_PARM5(ctx); /* (ctx, dst, size, seq_id, flags), with or without _ext */
    open_span(&s->ph, s);
    return 0;
}

int copy_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u32 tid;
    struct tstate *s = return_state(&tid);
    if (s && s->ax_in_copy == 1) {
        s->ax_in_copy = 0;
        u64 saved = PT_REGS_RC(ctx);
        s->ax_bytes += saved;
        emit_call(K_COPY, tid, s, &s->ph, now, saved, s->ph_addr, s->ph_flags, O_NOT_RECORDED);
        return 0;
    }
    if (!s || !s->ckpt || s->phase != P_COPY)
        return 0;
    u64 copied = PT_REGS_RC(ctx);
    s->ck_bytes += copied;
    emit_call(K_COPY, tid, s, &s->ph, now, copied, s->ph_addr, s->ph_flags, O_NOT_RECORDED);
    s->phase = P_NONE;
    if (s->ck_in_create)
        close_ckpt(tid, s, now); /* ik_llama.cpp: the copy ends the checkpoint */
    return 0;
}

/* A prompt save inlined into its caller (upstream's GCC build inlines server_slot::prompt_save into
 * get_available_slot): a uprobe on its call to llama_state_seq_get_data_ext opens the copy, one on
 * the instruction after it closes it with the bytes copied (the return value, still in rax). */
int save_call_enter(struct pt_regs *ctx)
{
    u32 tid;
    struct tstate *s = entry_state(&tid);
    if (!s || s->ckpt || s->ax_in_copy)
        return 0;
    s->ax_in_copy = 2;
    s->ph_addr = PT_REGS_PARM2(ctx);
    gpu_reset(s);
    s->ph_flags = (u32)PT_REGS_PARM5(ctx); /* at the call instruction the arguments are in place */
    open_span(&s->ph, s);
    return 0;
}

int save_call_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u32 tid;
    struct tstate *s = return_state(&tid);
    if (!s || s->ax_in_copy != 2)
        return 0;
    s->ax_in_copy = 0;
    emit_call(K_COPY, tid, s, &s->ph, now, PT_REGS_RC(ctx), s->ph_addr, s->ph_flags, O_NOT_RECORDED);
    return 0;
}

/* ---- iterations: server_context_impl::update_slots() ---- */

int iter_enter(struct pt_regs *ctx)
{
    u32 tid;
    struct tstate *s = entry_state(&tid);
    if (!s)
        return 0;
    unwound(s, PT_REGS_SP(ctx));
    if (s->iter)
        count(C_ABANDONED);
    s->iter = new_id();
    s->it_tokens = 0;
    s->it_prompt = 0;
    open_span(&s->it, s);
    return 0;
}

int iter_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u32 tid;
    struct tstate *s = return_state(&tid);
    if (s)
        unwound(s, PT_REGS_SP(ctx));
    if (!s || !s->iter) {
        count(C_PARTIAL);
        return 0;
    }
    emit_span(K_ITERATION, tid, s, &s->it, now, 0, 0);
    s->iter = 0;
    rss_sample(tid, now);
    return 0;
}

/* ---- batches: llama_decode(ctx, llama_batch batch) ----
 * llama_batch is 56 bytes. The x86-64 SysV ABI passes it in memory: at the first instruction it
 * sits just above the return address, at sp + 8. AAPCS64 (BATCH_BY_REFERENCE, probes/arch.py)
 * passes a struct over 16 bytes by reference: the address of the caller's copy is in x1. */
struct batch_head {
    s32 n_tokens;
    s32 pad;
    u64 token, embd, pos, n_seq_id, seq_id, logits;
};

int decode_enter(struct pt_regs *ctx)
{
    u32 tid;
    struct tstate *s = entry_state(&tid);
    if (!s)
        return 0;
    unwound(s, PT_REGS_SP(ctx));
    struct batch_head b = {};
#if BATCH_BY_REFERENCE
    bpf_probe_read_user(&b, sizeof(b), (void *)PT_REGS_PARM2(ctx));
#else
    bpf_probe_read_user(&b, sizeof(b), (void *)(PT_REGS_SP(ctx) + 8));
#endif
    u32 n = b.n_tokens > 0 ? (u32)b.n_tokens : 0;
    u32 prompt = 0;
    if (!b.logits) {
        prompt = n > 0 ? n - 1 : 0; /* no logits array: only the last token is output */
    } else {
        u32 zero = 0;
        struct logits_buf *lb = scratch.lookup(&zero);
        if (lb) {
            u8 *buf = lb->b;
            u64 len = n < 256 ? n : 256;
            /* mask in asm: clang would drop a C mask it can prove redundant, the verifier can't */
            asm volatile("%0 &= 511" : "+r"(len));
            if (len > 256)
                len = 256;
            /* Bytes past len read as 1 (an output token), so the count runs over whole words
             * with no branch and no loop: Linux 6.1's verifier rejects the byte loop clang
             * makes of a scan that stops at len (its back-edge a fall-through, see sched_read),
             * and walks every len of one that doesn't. */
            __builtin_memset(buf, 1, sizeof(lb->b));
            if (len > 0 && bpf_probe_read_user(buf, len, (void *)b.logits) == 0) {
                u64 *w = (u64 *)buf;
#pragma unroll
                for (u32 i = 0; i < sizeof(lb->b) / 8; i++) {
                    /* 0x80 in each zero byte: a prompt token asks for no logits */
                    u64 z = ~(((w[i] & 0x7f7f7f7f7f7f7f7fULL) + 0x7f7f7f7f7f7f7f7fULL) | w[i] | 0x7f7f7f7f7f7f7f7fULL);
                    prompt += ((z >> 7) * 0x0101010101010101ULL) >> 56;
                }
            }
        }
    }
    s->dec_tokens = n;
    s->dec_prompt = prompt;
    s->dec_open = 1;
    open_span(&s->dec, s);
    return 0;
}

int decode_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u32 tid;
    struct tstate *s = return_state(&tid);
    if (!s || !s->dec_open) {
        count(C_PARTIAL);
        return 0;
    }
    s->dec_open = 0;
    s->it_tokens += s->dec_tokens;
    s->it_prompt += s->dec_prompt;
    emit_span(K_DECODE, tid, s, &s->dec, now, 0, 0);
    return 0;
}

/* ---- batches: llama_process(ctx, type, llama_batch_ext *batch) ----
 * The tokens are a std::vector<llama_batch_ext::token> at BATCH_TOKENS_OFF; a prompt token is one
 * whose `output` flag is false (the server asks for output only at a prompt's last token and for
 * generated ones). Read only when the vector looks like the layout (whole tokens, at most
 * n_tokens_max of them, the struct's first field); else tokens are 0 and C_BATCH_UNREAD counts it. */
int process_enter(struct pt_regs *ctx)
{
    u32 tid;
    if (!target_tid(&tid))
        return 0;
    if (PT_REGS_PARM2(ctx) != 1) /* LLAMA_PROCESS_TYPE_DECODE; an encode is no server batch */
        return 0;
    struct tstate *s = state_of(tid);
    if (!s)
        return 0;
    u64 batch = PT_REGS_PARM3(ctx);
    u64 size = (target_flags() & TARGET_LIBCXX) ? TOKEN_SIZE_LIBCXX : TOKEN_SIZE_STDCXX;
    u64 max = 0, be[2] = {};
    u32 n = 0, prompt = 0;
    if (bpf_probe_read_user(&max, sizeof(max), (void *)batch) == 0 &&
        bpf_probe_read_user(be, sizeof(be), (void *)(batch + BATCH_TOKENS_OFF)) == 0 &&
        be[1] >= be[0] && (be[1] - be[0]) % size == 0 &&
        (be[1] - be[0]) / size <= max && max <= 0x7fffffff) {
        n = (be[1] - be[0]) / size;
        u32 zero = 0;
        struct tokens_buf *tb = token_scratch.lookup(&zero);
        u32 scan = n < BATCH_SCAN ? n : BATCH_SCAN;
        u64 len = (u64)scan * size;
        asm volatile("%0 &= 32767" : "+r"(len));
        if (len > sizeof(tb->b))
            len = sizeof(tb->b);
        if (tb && len > 0 && bpf_probe_read_user(tb->b, len, (void *)be[0]) == 0) {
            for (u32 i = 0; i < BATCH_SCAN; i++) {
                if (i >= scan)
                    break;
                u64 off = (u64)i * size + BATCH_OUTPUT_OFF;
                asm volatile("%0 &= 32767" : "+r"(off)); /* a bound the verifier keeps */
                if (off >= sizeof(tb->b))
                    break;
                if (tb->b[off] == 0)
                    prompt++;
            }
        }
    } else {
        count(C_BATCH_UNREAD);
    }
    s->dec_tokens = n;
    s->dec_prompt = prompt;
    s->dec_open = 1;
    open_span(&s->dec, s);
    return 0;
}

/* ---- create_checkpoint: evictions, update_tgt/update_dft and the speculative state ---- */

int create_enter(struct pt_regs *ctx)
{
    u32 tid;
    struct tstate *s = entry_state(&tid);
    if (!s)
        return 0;
    if (s->cr_open)
        count(C_ABANDONED);
    s->cr_open = 1;
    s->cr_bytes = 0;
    open_span(&s->cr, s);
    return 0;
}

int create_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u32 tid;
    struct tstate *s = return_state(&tid);
    if (!s || !s->cr_open) {
        count(C_PARTIAL);
        return 0;
    }
    if (s->ckpt && s->ck_in_create) {
        count(C_ABANDONED); /* a size query whose copy never came (the allocation threw) */
        ckpt_reset(s);
    }
    emit_span(K_CREATE, tid, s, &s->cr, now, s->cr_bytes, 0);
    s->cr_open = 0;
    return 0;
}

/* ---- restores (load_tgt/load_dft), the speculative state, prompt-cache saves ---- */

static __always_inline int aux_enter(u32 kind, u32 draft, u64 vec)
{
    u32 tid;
    struct tstate *s = entry_state(&tid);
    if (!s)
        return 0;
    if (s->ax_kind)
        count(C_ABANDONED);
    s->ax_kind = kind;
    s->ax_draft = draft;
    s->ax_bytes = 0;
    s->ax_vec = vec;
    s->ax_in_copy = 0;
    open_span(&s->ax, s);
    return 0;
}

int restore_enter_tgt(struct pt_regs *ctx) { return aux_enter(K_RESTORE, 0, 0); }
int restore_enter_dft(struct pt_regs *ctx) { return aux_enter(K_RESTORE, 1, 0); }
int spec_state_enter(struct pt_regs *ctx) { return aux_enter(K_SPEC_STATE, 0, PT_REGS_PARM3(ctx)); }
int prompt_save_enter(struct pt_regs *ctx) { return aux_enter(K_PROMPT_SAVE, 0, 0); }

int aux_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u32 tid;
    struct tstate *s = return_state(&tid);
    if (!s || !s->ax_kind) {
        count(C_PARTIAL);
        return 0;
    }
    u64 bytes = s->ax_bytes;
    u32 outcome = O_NOT_RECORDED;
    if (s->ax_kind == K_SPEC_STATE) {
        u64 be[2] = {};
        bytes = 0; /* the vector's size after the call: what the state takes */
        if (s->ax_vec && bpf_probe_read_user(be, sizeof(be), (void *)s->ax_vec) == 0 && be[1] >= be[0])
            bytes = be[1] - be[0];
        if (s->cr_open)
            s->cr_bytes += bytes; /* part of the checkpoint the server makes (its size() counts data_spec) */
    } else if (s->ax_kind == K_RESTORE && (target_flags() & TARGET_LOAD_BOOL)) {
        outcome = (PT_REGS_RC(ctx) & 0xff) ? O_OK : O_FAILED; /* bool load_tgt/load_dft */
    }
    emit_call(s->ax_kind, tid, s, &s->ax, now, bytes, 0, 0, outcome);
    s->ax_kind = 0;
    s->ax_draft = 0;
    s->ax_in_copy = 0;
    return 0;
}

/* ---- llama_state_seq_set_data_ext(ctx, src, size, seq_id, flags): a restore's copy, anywhere ---- */

int restore_copy_enter(struct pt_regs *ctx)
{
    u32 tid;
    struct tstate *s = entry_state(&tid);
    if (!s)
        return 0;
    if (s->rc_open)
        count(C_ABANDONED);
    s->rc_open = 1;
    gpu_reset(s);
    s->rc_size = PT_REGS_PARM3(ctx);
    s->rc_flags = (u32)PT_REGS_PARM5(ctx);
    open_span(&s->rc, s);
    return 0;
}

int restore_copy_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u32 tid;
    struct tstate *s = return_state(&tid);
    if (!s || !s->rc_open) {
        count(C_PARTIAL);
        return 0;
    }
    u64 n = PT_REGS_RC(ctx);
    if (s->ax_kind == K_RESTORE)
        s->ax_bytes += n;
    /* llama_state_seq_set_data(_ext) returns the bytes it read, 0 when it failed */
    emit_call(K_RESTORE_COPY, tid, s, &s->rc, now, n, 0, s->rc_flags, n == s->rc_size ? O_OK : O_FAILED);
    s->rc_open = 0;
    return 0;
}

/* ---- slot files: llama_state_seq_save_file / llama_state_seq_load_file (POST /slots/ID?action=...) ----
 * Each returns the bytes it wrote or read (load_file without a token buffer only reads the header:
 * the server asks it for the token count first), 0 on failure. */

static __always_inline int slot_enter(u32 kind)
{
    u32 tid;
    struct tstate *s = entry_state(&tid);
    if (!s)
        return 0;
    if (s->sl_kind)
        count(C_ABANDONED);
    s->sl_kind = kind;
    open_span(&s->sl, s);
    return 0;
}

int slot_save_enter(struct pt_regs *ctx) { return slot_enter(K_SLOT_SAVE); }
int slot_restore_enter(struct pt_regs *ctx) { return slot_enter(K_SLOT_RESTORE); }

int slot_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u32 tid;
    struct tstate *s = return_state(&tid);
    if (!s || !s->sl_kind) {
        count(C_PARTIAL);
        return 0;
    }
    u64 n = PT_REGS_RC(ctx);
    emit_call(s->sl_kind, tid, s, &s->sl, now, n, 0, 0, n ? O_OK : O_FAILED);
    s->sl_kind = 0;
    return 0;
}

/* ---- page faults: service time, sampled, only inside checkpoints ----
 * No tracepoint marks the end of a fault. We take the time from exceptions:page_fault_user to the
 * next kmem:rss_stat on the same thread, i.e. until the new page is accounted: a lower bound that
 * leaves out trap entry/exit and the hypervisor's own faults. Counts come from min_flt instead,
 * so these programs are the only per-fault work, and they stay tiny. */
/* Both programs run on every fault of every process while they are attached, so the recorder
 * attaches them only during sampled time slices (--fault-sample), and the common path here is a
 * tgid compare, or one per-CPU slot read in rss_stat. */
int fault_enter(struct bpf_raw_tracepoint_args *ctx)
{
    u32 tid;
    struct tstate *s = return_state(&tid);
    if (!s || !s->ckpt)
        return 0;
    u32 zero = 0;
    struct armed *a = armed_fault.lookup(&zero);
    if (!a)
        return 0;
    a->tid = tid;
    a->t0 = bpf_ktime_get_ns();
    return 0;
}

int fault_accounted(struct bpf_raw_tracepoint_args *ctx)
{
    u32 zero = 0;
    struct armed *a = armed_fault.lookup(&zero);
    if (!a || !a->tid)
        return 0;
    u32 tid = (u32)bpf_get_current_pid_tgid();
    if (a->tid != tid)
        return 0;
    u64 d = bpf_ktime_get_ns() - a->t0;
    a->tid = 0;
    if (d > MAX_FAULT_NS)
        return 0; /* not this fault's accounting (it never came): don't pair across faults */
    struct tstate *s = threads.lookup(&tid);
    if (!s)
        return 0;
    s->timed += 1;
    s->timed_ns += d;
    return 0;
}

/* ---- CUDA (targets that map libcudart or libcuda): cuda.bpf.h says what these add ---- */

/* cudaMemcpy(dst, src, n, kind), cudaMemcpyAsync(dst, src, n, kind, stream) */
int gpu_copy_rt(struct pt_regs *ctx)
{
    return gpu_copy_enter(PT_REGS_PARM1(ctx), PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx) == KIND_D2H);
}

/* cuMemcpyDtoH_v2(dst, src, n), cuMemcpyDtoHAsync_v2(dst, src, n, stream) */
int gpu_copy_dtoh(struct pt_regs *ctx) { return gpu_copy_enter(PT_REGS_PARM1(ctx), PT_REGS_PARM3(ctx), 1); }

/* cuMemcpyHtoD_v2, cuMemcpyDtoD_v2, cuMemcpy (unified: no direction known) and their async forms */
int gpu_copy_other(struct pt_regs *ctx) { return gpu_copy_enter(0, PT_REGS_PARM3(ctx), 0); }

int gpu_copy_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u32 tid;
    struct tstate *s = return_state(&tid);
    if (!s || !s->gpu_depth)
        return 0;
    if (--s->gpu_depth == 0)
        s->gpu_enqueue_ns += now - s->gpu_t0;
    return 0;
}

/* cudaStreamSynchronize, cudaDeviceSynchronize, cuStreamSynchronize, cuCtxSynchronize */
int gpu_sync_enter(struct pt_regs *ctx)
{
    u32 tid;
    struct tstate *s = gpu_span(&tid);
    if (!s || s->gpu_depth || s->gpu_sync_depth++ > 0)
        return 0;
    s->gpu_syncs++;
    s->gpu_s0 = bpf_ktime_get_ns();
    return 0;
}

int gpu_sync_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u32 tid;
    struct tstate *s = return_state(&tid);
    if (!s || !s->gpu_sync_depth)
        return 0;
    if (--s->gpu_sync_depth == 0)
        s->gpu_sync_ns += now - s->gpu_s0;
    return 0;
}

/* cudaHostRegister(p, size, flags), cuMemHostRegister_v2(p, size, flags) */
int gpu_pin_enter(struct pt_regs *ctx) { return pin_open(PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0); }

/* cudaMallocHost(&p, size), cudaHostAlloc(&p, size, flags), cuMemAllocHost_v2, cuMemHostAlloc */
int gpu_pin_out_enter(struct pt_regs *ctx) { return pin_open(PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 1); }

int gpu_pin_return(struct pt_regs *ctx)
{
    u32 tid;
    struct tstate *s = return_state(&tid);
    if (!s || !s->pin_depth)
        return 0;
    u64 d = --s->pin_depth;
    if (d >= 2 || (u32)PT_REGS_RC(ctx) != 0)
        return 0; /* deeper than we keep, or it failed */
    asm volatile("%0 &= 1" : "+r"(d)); /* a bound the verifier keeps */
    u64 p = s->pin_arg[d], n = s->pin_size[d];
    if (s->pin_out[d]) {
        u64 out = p;
        p = 0;
        bpf_probe_read_user(&p, sizeof(p), (void *)out);
    }
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct pin_set *ps = pinned.lookup(&tgid);
    if (!ps || !p || !n)
        return 0;
    int free_at = -1;
    for (int i = 0; i < MAX_PINNED; i++) {
        if (ps->hi[i] && ps->lo[i] == p)
            return 0; /* the runtime call's own driver call remembered it */
        if (!ps->hi[i] && free_at < 0)
            free_at = i;
    }
    if (free_at < 0 || free_at >= MAX_PINNED) {
        count(C_PINNED_FULL);
        return 0;
    }
    ps->lo[free_at] = p;
    ps->hi[free_at] = p + n;
    return 0;
}

/* cudaHostUnregister(p), cuMemHostUnregister(p), cudaFreeHost(p), cuMemFreeHost(p) */
int gpu_unpin(struct pt_regs *ctx)
{
    u32 tid;
    if (!target_tid(&tid))
        return 0;
    u64 p = PT_REGS_PARM1(ctx);
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct pin_set *ps = pinned.lookup(&tgid);
    if (!ps || !p)
        return 0;
    for (int i = 0; i < MAX_PINNED; i++) {
        if (ps->hi[i] && ps->lo[i] == p) {
            ps->hi[i] = 0;
            ps->lo[i] = 0;
        }
    }
    return 0;
}

int gpu_fault(struct fault_args *args) { return dst_fault(args->address); }

/* Where the exceptions tracepoints don't exist (arm64; probes/arch.py): the `page-faults` software
 * perf event, a sample per fault on every CPU, the faulting address in ctx->addr. */
int gpu_fault_perf(struct bpf_perf_event_data *ctx) { return dst_fault(ctx->addr); }

/* ---- mmap / munmap / mremap of the target, attributed to the thread's phase ---- */

TRACEPOINT_PROBE(syscalls, sys_enter_mmap) { return syscall_enter(K_MMAP, args->len, 0, 0); }
TRACEPOINT_PROBE(syscalls, sys_exit_mmap) { return syscall_exit(K_MMAP, args->ret); }
/* mremap: the old range too, so a moved buffer stops counting where it was (analyzers/memory.py) */
TRACEPOINT_PROBE(syscalls, sys_enter_mremap)
{
    return syscall_enter(K_MREMAP, args->new_len, args->addr, args->old_len);
}
TRACEPOINT_PROBE(syscalls, sys_exit_mremap) { return syscall_exit(K_MREMAP, args->ret); }

TRACEPOINT_PROBE(syscalls, sys_enter_munmap)
{
    u32 tid;
    struct tstate *s = entry_state(&tid);
    if (!s)
        return 0;
    u64 now = bpf_ktime_get_ns();
    rss_sample(tid, now); /* before the pages go */
    emit_syscall(K_MUNMAP, tid, s, now, args->len, args->addr, 0, 0);
    return 0;
}

/* ---- resident memory per fault (record --rss-per-fault): kmem:rss_stat, one row per RSS_STEP ----
 * The tracepoint fires on every RSS counter change of every process (each fault), so the common
 * path (a process not traced) is one hash lookup of its tgid, and a row is emitted only when the process's resident bytes (file +
 * anon + shmem, as in /proc/PID/status VmRSS) moved by RSS_STEP since its last row. */
TRACEPOINT_PROBE(kmem, rss_stat)
{
    u32 mm = args->mm_id;
    int m = args->member;
    if (m < 0 || m > 3)
        return 0;
    struct rss_state *st;
    if (args->curr) {
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        if (!targets.lookup(&tgid))
            return 0; /* every other process's fault: this one lookup and nothing else */
        st = rss_by_mm.lookup(&mm);
        if (st && st->pid != tgid) {
            /* A freed mm's id reused by another process's mm: forget the old one. */
            rss_by_mm.delete(&mm);
            st = 0;
        }
        if (!st) {
            if (rss_before_exec.lookup(&tgid))
                return 0;
            struct rss_state fresh = {};
            struct rss_state *seed = rss_seed.lookup(&tgid);
            if (seed) {
                fresh = *seed; /* the counters at attach belong to the mm it had then: used once */
                rss_seed.delete(&tgid);
            }
            fresh.last = -1;
            fresh.pid = tgid;
            rss_by_mm.update(&mm, &fresh);
            st = rss_by_mm.lookup(&mm);
            if (!st)
                return 0;
        }
    } else {
        st = rss_by_mm.lookup(&mm);
        if (!st)
            return 0; /* another task's change to an mm not seen from its own threads */
    }
    s64 size = args->size;
    if (m == 0)
        st->member[0] = size;
    else if (m == 1)
        st->member[1] = size;
    else if (m == 2)
        st->member[2] = size;
    else
        st->member[3] = size;
    /* Rows only from the process's own threads on its current mm: not from an mm it exec'd away
     * from (torn down by the exec after the switch), nor its teardown at exit. A change another
     * task made (reclaim) shows in the next row its own threads cause. */
    u32 pid = st->pid;
    if (!args->curr)
        return 0;
    s64 rss = st->member[0] + st->member[1] + st->member[3];
    s64 moved = rss - st->last;
    if (st->last >= 0 && moved < RSS_STEP && moved > -RSS_STEP)
        return 0;
    st->last = rss;
    struct ckpt_event *e = reserve_event();
    if (!e)
        return 0;
    e->start_ns = e->end_ns = bpf_ktime_get_ns();
    e->bytes = rss > 0 ? rss : 0;
    e->pid = pid;
    e->tid = (u32)bpf_get_current_pid_tgid();
    e->kind = K_RSS;
    submit_event(e);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    rss_before_exec.delete(&tgid);
    return 0;
}

/* ---- a thread's entry leaves the map when the thread exits, so the map holds live threads ---- */

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u32 tid;
    if (!target_tid(&tid))
        return 0;
    rss_forget(tid);
    struct tstate *s = threads.lookup(&tid);
    if (!s)
        return 0;
    if (s->ckpt || s->iter || s->dec_open)
        count(C_ABANDONED); /* exited inside a span: it never returns */
    gpu_close_range(s, 0);
    if (threads.delete(&tid) == 0)
        count(C_THREADS_PRUNED);
    return 0;
}
