/* Thread state: what a traced thread has open (struct tstate), its spans' starting counters, and
 * the reads every program makes of the running thread (scheduler counters, fault counters). */
#ifndef CKPTRACE_TSTATE_BPF_H
#define CKPTRACE_TSTATE_BPF_H

#include "checkpoint.h"

/* The thread's scheduler counters at one instant (see sched_read). */
/* cpu_ns of a span whose readings were wrong (see emit_call); the recorder writes it as null. */
#define CPU_UNKNOWN 0xffffffffffffffffULL
/* How far an end reading may sit below its start for the span to read 0: one tick's steal at
 * 100 Hz (sched_read's bound), never a span's real CPU time. */
#define SCHED_SLACK_NS 10000000ULL

struct sched_now {
    u64 cpu;   /* wraps: only a difference of two means anything */
    u64 torn;  /* 1: every try of sched_read was torn, cpu is no reading */
    u64 wait;
    u64 nvcsw;
    u64 nivcsw;
};

struct span {
    u64 start;
    u64 faults0;
    u64 timed0;
    u64 timed_ns0;
    struct sched_now sc0;
};

struct tstate {
    u64 iter;          /* open update_slots call, 0 = none */
    u64 ckpt;          /* open update_tgt/update_dft call, 0 = none */
    struct span it, ck, ph, dec;
    struct span cr, ax, rc; /* create_checkpoint; restore/spec_state/prompt_save; set_data_ext */
    struct span sl;    /* a slot file's save or load (llama_state_seq_save_file / _load_file) */
    u32 sl_kind;       /* 0, K_SLOT_SAVE or K_SLOT_RESTORE */
    u64 cr_bytes;      /* state bytes the checkpoints inside the open create_checkpoint copied */
    u64 ax_bytes;      /* bytes the open restore / prompt save copied */
    u64 ax_vec;        /* common_speculative_get_state's std::vector<uint8_t> & (its size at return) */
    u32 cr_open;
    u32 ax_kind;       /* 0, K_RESTORE, K_SPEC_STATE or K_PROMPT_SAVE */
    u32 ax_draft;
    u32 ax_in_copy;    /* a prompt save's state copy is open: 1 in a prompt_save span, 2 at a call site */
    u32 rc_open;
    u32 ck_spec;
    u32 ck_in_create;  /* opened by the size query inside create_checkpoint: the copy's return closes it */
    u64 ck_bytes;
    u64 ph_bytes;
    u64 ph_addr;
    u64 rc_size;       /* the open set_data_ext call's size argument: what it was given to read */
    u32 ph_flags;      /* the open copy's llama_state_seq_flags (its fifth argument) */
    u32 rc_flags;      /* the open set_data_ext call's */
    u64 it_tokens;
    u64 it_prompt;
    u64 timed;         /* faults timed so far on this thread, and their summed ns */
    u64 timed_ns;
    u64 sc_len;        /* pending mmap/mremap length and start between syscall enter and exit */
    u64 sc_start;
    u64 sc_old_addr;   /* pending mremap: the range it moves or resizes from */
    u64 sc_old_len;
    u32 phase;         /* P_NONE, P_FILL or P_COPY inside a checkpoint */
    u32 ck_draft;
    u32 dec_open;
    u32 dec_tokens;
    u32 dec_prompt;
    u32 sc_kind;
    /* CUDA calls inside the open state copy span (copy or restore_copy), see the CUDA section */
    u64 gpu_t0;        /* entry of the outermost open copy call, and of the open wait */
    u64 gpu_s0;
    u64 gpu_bytes;
    u64 gpu_pinned;
    u64 gpu_pageable;
    u64 gpu_enqueue_ns;
    u64 gpu_sync_ns;
    u32 gpu_copies;
    u32 gpu_syncs;
    u32 gpu_depth;     /* copy calls open (a runtime call's own driver call is the second) */
    u32 gpu_sync_depth;
    u32 gpu_slot;      /* 1 + this span's destination range in dst_ranges; 0: none */
    u32 pin_depth;     /* pin calls open; their pointer (or out-pointer) and size by depth */
    u64 pin_arg[2];
    u64 pin_size[2];
    u32 pin_out[2];
    u64 ck_sp;         /* the stack pointer at the open checkpoint's entry (0: not known) */
};

BPF_HASH(threads, u32, struct tstate, MAX_THREADS);
BPF_HASH(targets, u32, u32, MAX_TARGETS); /* the processes traced: tgid -> TARGET_* flags */
BPF_PERCPU_ARRAY(zero_state, struct tstate, 1); /* the initial value: too big for the BPF stack */
BPF_ARRAY(counters, u64, N_COUNTERS);

static __always_inline void count(u32 idx)
{
    u64 *v = counters.lookup(&idx);
    if (v)
        __sync_fetch_and_add(v, 1);
}

static __always_inline u64 new_id(void)
{
    u32 idx = C_NEXT_ID;
    u64 *v = counters.lookup(&idx);
    if (!v)
        return 0;
    return __sync_fetch_and_add(v, 1) + 1;
}

static __always_inline u64 kread(u64 addr)
{
    u64 v = 0;
    bpf_probe_read_kernel(&v, sizeof(v), (void *)addr);
    return v;
}

#if SCHED_COUNTERS
/* One try of sched_read: 1 when no tick or switch moved exec_start or clock_task between the reads. */
static __always_inline int sched_try(u64 task, u64 *sum, u64 *e2, u64 *now, u64 *steal)
{
    u64 e1 = kread(task + EXEC_START_OFF);
    u64 rq = kread(kread(task + SE_CFS_RQ_OFF) + CFS_RQ_RQ_OFF);
    *sum = kread(task + SUM_EXEC_RUNTIME_OFF);
    u64 ct = kread(rq + RQ_CLOCK_TASK_OFF);
    *steal = kread(rq + RQ_CLOCK_OFF) - ct;
    *now = bpf_ktime_get_ns();
    *e2 = kread(task + EXEC_START_OFF);
    return e1 == *e2 && ct == kread(rq + RQ_CLOCK_TASK_OFF);
}
#endif

/* The running thread's scheduler counters. `cpu` is on-CPU time up to this instant, in a frame
 * where only differences mean anything (below 0, wrapped, while the thread's on-CPU time is under
 * sched_clock's lead on ktime: 2.9 s in an arm64 guest booted under load; see emit_call): the
 * kernel accounts se.sum_exec_runtime lazily (at ticks and switches) and keeps
 * se.sum_exec_runtime - se.exec_start constant while the thread runs, so the exact figure is that
 * constant plus the rq's clock_task now. clock_task is sched_clock minus
 * the steal time the rq has accounted (rq->clock - rq->clock_task), and bpf_ktime_get_ns() runs at
 * sched_clock's rate; so ktime - (clock - clock_task) is clock_task now up to a constant, whatever
 * CPU the thread is on. What it leaves out is steal not yet accounted (at most one tick's). */
static __always_inline void sched_read(struct sched_now *n)
{
#if SCHED_COUNTERS
    u64 task = bpf_get_current_task();
    u64 sum = 0, e2 = 0, now = 0, steal = 0;
    /* A tick or a switch between the reads moves exec_start: read again, at most 3 tries. Written
     * out, not a loop: clang lays a loop with two exits out with its back-edge as a fall-through,
     * which Linux 6.1's verifier rejects ("back-edge from insn N to N+1"; Debian 12's kernel). */
    n->torn = !sched_try(task, &sum, &e2, &now, &steal) && !sched_try(task, &sum, &e2, &now, &steal)
              && !sched_try(task, &sum, &e2, &now, &steal); /* every try torn: no reading */
    n->cpu = sum - e2 + now - steal;
    n->wait = kread(task + RUN_DELAY_OFF); /* waits are added at switch-in: exact while running */
    n->nvcsw = kread(task + NVCSW_OFF);
    n->nivcsw = kread(task + NIVCSW_OFF);
#endif
}

/* min_flt + maj_flt of the current thread: what getrusage(RUSAGE_THREAD) reports. */
static __always_inline u64 thread_faults(void)
{
    u64 task = bpf_get_current_task();
    u64 mn = 0, mj = 0;
    bpf_probe_read_kernel(&mn, sizeof(mn), (void *)(task + MIN_FLT_OFF));
    bpf_probe_read_kernel(&mj, sizeof(mj), (void *)(task + MAJ_FLT_OFF));
    return mn + mj;
}

static __always_inline int target_tid(u32 *tid)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!targets.lookup(&tgid))
        return 0;
    *tid = (u32)id;
    return 1;
}

static __always_inline u64 counter(u32 idx)
{
    u64 *v = counters.lookup(&idx);
    return v ? *v : 0;
}

/* The calling process's TARGET_* flags (0 for a process not traced). */
static __always_inline u32 target_flags(void)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u32 *f = targets.lookup(&tgid);
    return f ? *f : 0;
}

static __always_inline struct tstate *state_of(u32 tid)
{
    struct tstate *s = threads.lookup(&tid);
    if (s)
        return s;
    u32 idx = 0;
    struct tstate *zero = zero_state.lookup(&idx); /* the initial state: too big for the stack */
    if (!zero)
        return 0;
    if (threads.insert(&tid, zero) == 0) {
        count(C_THREADS_SEEN);
        u32 peak = C_THREADS_PEAK;
        u64 *p = counters.lookup(&peak);
        u64 live = counter(C_THREADS_SEEN) - counter(C_THREADS_PRUNED);
        if (p && live > *p)
            *p = live; /* racy between CPUs by one thread at most: a gauge, not an account */
    }
    s = threads.lookup(&tid);
    if (!s)
        count(C_MAP_FULL); /* what this thread does next is not seen, and that is said */
    return s;
}

static __always_inline void open_span(struct span *sp, struct tstate *s)
{
    sched_read(&sp->sc0);
    sp->faults0 = thread_faults();
    sp->timed0 = s->timed;
    sp->timed_ns0 = s->timed_ns;
    sp->start = bpf_ktime_get_ns(); /* last, so the span excludes our own bookkeeping */
}

static __always_inline u32 phase_of(struct tstate *s)
{
    if (s->ckpt)
        return s->phase ? s->phase : P_CHECKPOINT;
    if (s->sl_kind)
        return s->sl_kind == K_SLOT_SAVE ? P_SLOT_SAVE : P_SLOT_RESTORE;
    if (s->rc_open)
        return P_RESTORE_COPY;
    if (s->ax_kind == K_RESTORE)
        return P_RESTORE;
    if (s->ax_kind == K_SPEC_STATE)
        return P_SPEC_STATE;
    if (s->ax_kind == K_PROMPT_SAVE)
        return P_PROMPT_SAVE;
    if (s->cr_open)
        return P_CREATE;
    return s->iter ? P_ITERATION : P_NONE;
}

/* An entry program's thread: traced, with its state (made if new); 0 otherwise. */
static __always_inline struct tstate *entry_state(u32 *tid)
{
    if (!target_tid(tid))
        return 0;
    return state_of(*tid);
}

/* A return program's thread: traced, with the state its entry made; 0 otherwise. */
static __always_inline struct tstate *return_state(u32 *tid)
{
    if (!target_tid(tid))
        return 0;
    return threads.lookup(tid);
}

#endif
