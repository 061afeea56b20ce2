/* Event emission: every row goes through reserve_event, which clears what it reserves. */
#ifndef CKPTRACE_EMIT_BPF_H
#define CKPTRACE_EMIT_BPF_H

#include "tstate.bpf.h"
#include "cuda.bpf.h"

BPF_ARRAY(event_layout, struct ckpt_event, 1); /* lets user space read the layout from the compiler */
/* Submitted without wakeup: the recorder drains on its own clock, so the traced thread never pays
 * for waking it (or gets preempted by it on a small machine). */
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);

/* A copy row's CUDA figures (every other row's stay 0). */
static __always_inline void gpu_fields(u32 kind, struct tstate *s, struct ckpt_event *e)
{
    if (kind != K_COPY && kind != K_RESTORE_COPY)
        return;
    e->gpu_bytes = s->gpu_bytes;
    e->gpu_pinned_bytes = s->gpu_pinned;
    e->gpu_pageable_bytes = s->gpu_pageable;
    e->gpu_enqueue_ns = s->gpu_enqueue_ns;
    e->gpu_sync_ns = s->gpu_sync_ns;
    e->gpu_copies = s->gpu_copies;
    e->gpu_syncs = s->gpu_syncs;
    gpu_close_range(s, e);
}

/* A new event, all zero (a reserved record holds whatever an earlier one left, so a field a row
 * does not set ships 0); 0 when the ring buffer is full, counted lost. Every event is reserved
 * here and sent with submit_event. */
static __always_inline struct ckpt_event *reserve_event(void)
{
    struct ckpt_event *e = events.ringbuf_reserve(sizeof(struct ckpt_event));
    if (!e) {
        count(C_LOST);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    return e;
}

static __always_inline void submit_event(struct ckpt_event *e)
{
    events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

/* A span's row; `flags`: the call's llama_state_seq_flags (copies), `outcome`: enum ckpt_outcome. */
static __always_inline void emit_call(u32 kind, u32 tid, struct tstate *s, struct span *sp, u64 now,
                                      u64 bytes, u64 addr, u32 flags, u32 outcome)
{
    struct ckpt_event *e = reserve_event();
    if (!e)
        return;
    e->start_ns = sp->start;
    e->end_ns = now;
    e->ckpt = s->ckpt;
    e->iter = s->iter;
    e->bytes = bytes;
    e->addr = addr;
    e->faults = thread_faults() - sp->faults0;
    e->fault_timed = s->timed - sp->timed0;
    e->fault_timed_ns = s->timed_ns - sp->timed_ns0;
    struct sched_now sc = {};
    sched_read(&sc);
    /* Steal time accounted between the two reads can put the end a few us below the start
     * (sched_read's one-tick bound): a span that short had no measurable CPU, so 0. An end
     * further below, or a torn read, is a wrong reading: unknown (CPU_UNKNOWN), never 0. */
    s64 d = sc.cpu - sp->sc0.cpu; /* signed: a start below 0 and an end above it differ right */
    if (sc.torn || sp->sc0.torn || d < -(s64)SCHED_SLACK_NS)
        e->cpu_ns = CPU_UNKNOWN;
    else
        e->cpu_ns = d > 0 ? d : 0;
    e->wait_ns = sc.wait - sp->sc0.wait;
    e->nvcsw = sc.nvcsw - sp->sc0.nvcsw;
    e->nivcsw = sc.nivcsw - sp->sc0.nivcsw;
    e->tid = tid;
    e->pid = bpf_get_current_pid_tgid() >> 32;
    e->kind = kind;
    e->phase = phase_of(s);
    e->draft = (kind == K_RESTORE || kind == K_RESTORE_COPY) ? s->ax_draft : s->ck_draft;
    e->spec = kind == K_CHECKPOINT ? s->ck_spec : 0;
    e->state_flags = flags;
    e->outcome = outcome;
    if (kind == K_DECODE) {
        e->tokens = s->dec_tokens;
        e->prompt_tokens = s->dec_prompt;
    } else if (kind == K_ITERATION) {
        e->tokens = s->it_tokens;
        e->prompt_tokens = s->it_prompt;
    }
    gpu_fields(kind, s, e);
    submit_event(e);
}

static __always_inline void emit_span(u32 kind, u32 tid, struct tstate *s, struct span *sp, u64 now,
                                      u64 bytes, u64 addr)
{
    emit_call(kind, tid, s, sp, now, bytes, addr, 0, O_NOT_RECORDED);
}

static __always_inline void emit_syscall(u32 kind, u32 tid, struct tstate *s, u64 start, u64 bytes, u64 addr,
                                         u64 old_addr, u64 old_bytes)
{
    struct ckpt_event *e = reserve_event();
    if (!e)
        return;
    e->start_ns = start;
    e->end_ns = bpf_ktime_get_ns();
    e->ckpt = s->ckpt;
    e->iter = s->iter;
    e->bytes = bytes;
    e->addr = addr;
    e->old_addr = old_addr;
    e->old_bytes = old_bytes;
    e->tid = tid;
    e->pid = bpf_get_current_pid_tgid() >> 32;
    e->kind = kind;
    e->phase = phase_of(s);
    submit_event(e);
}

#endif
