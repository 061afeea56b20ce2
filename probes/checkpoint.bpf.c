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
 * A process that maps libcudart or libcuda also gets the CUDA programs (the "CUDA" section below);
 * every other process never reaches them.
 */
#include <uapi/linux/ptrace.h>
#include <uapi/linux/bpf_perf_event.h>
#include "checkpoint.h"

#ifndef RSS_PER_FAULT
#define RSS_PER_FAULT 0
#endif

/* A fault's own accounting comes within microseconds; a longer gap is a sample that lost its pair. */
#define MAX_FAULT_NS 1000000ULL

/* cpu_ns of a span whose readings were wrong (see emit_call); the recorder writes it as null. */
#define CPU_UNKNOWN 0xffffffffffffffffULL
/* How far an end reading may sit below its start for the span to read 0: one tick's steal at
 * 100 Hz (sched_read's bound), never a span's real CPU time. */
#define SCHED_SLACK_NS 10000000ULL

/* The thread's scheduler counters at one instant (see sched_read). */
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

/* A sampled fault waiting for its rss_stat; per CPU so rss_stat needs no hash lookup. */
struct armed {
    u32 tid;
    u32 pad;
    u64 t0;
};

BPF_HASH(threads, u32, struct tstate, MAX_THREADS);
BPF_HASH(targets, u32, u32, MAX_TARGETS); /* the processes traced: tgid -> TARGET_* flags */
/* Resident bytes per traced mm, as kmem:rss_stat reports them member by member. Keyed by the
 * tracepoint's mm_id (a hash of the mm pointer), learnt from events the process's own threads
 * raise, so changes made to it by another task (reclaim) count too. */
struct rss_state {
    s64 member[4];     /* MM_FILEPAGES, MM_ANONPAGES, MM_SWAPENTS, MM_SHMEMPAGES, bytes */
    s64 last;          /* resident bytes in the last row emitted, -1 = none yet */
    u32 pid;
    u32 pad;
};
BPF_HASH(rss_by_mm, u32, struct rss_state, 1024);
/* A launched command, held before its exec: no RSS rows until it has exec'd (its mm before that
 * is the recorder's forked child's). tgid -> 1, removed by sched_process_exec. */
BPF_HASH(rss_before_exec, u32, u32, MAX_TARGETS);
/* Each traced process's counters as /proc/PID/status showed them at attach, written by the
 * recorder: the starting point before every member has changed once. */
BPF_HASH(rss_seed, u32, struct rss_state, MAX_TARGETS);
BPF_PERCPU_ARRAY(zero_state, struct tstate, 1); /* the initial value: too big for the BPF stack */
BPF_ARRAY(counters, u64, N_COUNTERS);
BPF_ARRAY(event_layout, struct ckpt_event, 1); /* lets user space read the layout from the compiler */
BPF_PERCPU_ARRAY(armed_fault, struct armed, 1);
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
/* Submitted without wakeup: the recorder drains on its own clock, so the traced thread never pays
 * for waking it (or gets preempted by it on a small machine). */
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);

/* CUDA targets. Per process (entries made by the recorder for processes that map libcudart or
 * libcuda): its pinned host ranges, and the destination ranges of its open state copy spans, which
 * the page fault programs count faults on. */
#define MAX_PINNED 64 /* pinned ranges remembered per process */
#define MAX_DST 8     /* state copy spans with a destination range open at once, per process */
#define KIND_D2H 2    /* cudaMemcpyDeviceToHost */
struct pin_set {
    u64 lo[MAX_PINNED];
    u64 hi[MAX_PINNED]; /* 0: a free slot */
};
BPF_HASH(pinned, u32, struct pin_set, MAX_TARGETS);
struct dst_range {
    u64 lo;
    u64 hi;      /* 0: not open */
    u64 faults;  /* page faults on [lo, hi) while open, by any thread of the process */
    u64 others;  /* ... by other threads than tid */
    u64 tid;     /* the span's thread; 0: a free slot (64 bits: claimed by a 64-bit compare-and-swap) */
};
struct dst_set {
    struct dst_range r[MAX_DST];
};
BPF_HASH(dst_ranges, u32, struct dst_set, MAX_TARGETS);
BPF_ARRAY(gpu_open, u64, 1); /* destination ranges open now, all processes: a fault's first test */

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

/* ---- CUDA: what a state copy span's CUDA calls add to its row ---- */

static __always_inline struct dst_range *dst_slot(struct tstate *s, u32 tgid)
{
    if (!s->gpu_slot || s->gpu_slot > MAX_DST)
        return 0;
    u64 i = s->gpu_slot - 1;
    asm volatile("%0 &= 7" : "+r"(i)); /* MAX_DST - 1: a bound the verifier keeps (clang drops a C one) */
    struct dst_set *ds = dst_ranges.lookup(&tgid);
    return ds ? &ds->r[i] : 0;
}

/* The span's destination range closes: its fault counts go to the row (e: 0 to drop them). */
static __always_inline void gpu_close_range(struct tstate *s, struct ckpt_event *e)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct dst_range *r = dst_slot(s, tgid);
    if (r) {
        if (e) {
            e->gpu_dst_faults = r->faults;
            e->gpu_driver_faults = r->others;
        }
        r->hi = 0;
        r->lo = 0;
        r->tid = 0; /* free: last */
        u32 zero = 0;
        u64 *open = gpu_open.lookup(&zero);
        if (open)
            __sync_fetch_and_add(open, -1);
    }
    s->gpu_slot = 0;
}

/* A state copy span opens: nothing of its CUDA calls yet. */
static __always_inline void gpu_reset(struct tstate *s)
{
    gpu_close_range(s, 0); /* one left open by a span that never returned */
    s->gpu_bytes = 0;
    s->gpu_pinned = 0;
    s->gpu_pageable = 0;
    s->gpu_enqueue_ns = 0;
    s->gpu_sync_ns = 0;
    s->gpu_copies = 0;
    s->gpu_syncs = 0;
    s->gpu_depth = 0;
    s->gpu_sync_depth = 0;
}

static __always_inline void gpu_fields(u32 kind, struct tstate *s, struct ckpt_event *e)
{
    e->gpu_dst_faults = 0;
    e->gpu_driver_faults = 0;
    if (kind != K_COPY && kind != K_RESTORE_COPY) {
        e->gpu_bytes = e->gpu_pinned_bytes = e->gpu_pageable_bytes = 0;
        e->gpu_enqueue_ns = e->gpu_sync_ns = 0;
        e->gpu_copies = e->gpu_syncs = 0;
        return;
    }
    e->gpu_bytes = s->gpu_bytes;
    e->gpu_pinned_bytes = s->gpu_pinned;
    e->gpu_pageable_bytes = s->gpu_pageable;
    e->gpu_enqueue_ns = s->gpu_enqueue_ns;
    e->gpu_sync_ns = s->gpu_sync_ns;
    e->gpu_copies = s->gpu_copies;
    e->gpu_syncs = s->gpu_syncs;
    gpu_close_range(s, e);
}

/* A span's row; `flags`: the call's llama_state_seq_flags (copies), `outcome`: enum ckpt_outcome. */
static __always_inline void emit_call(u32 kind, u32 tid, struct tstate *s, struct span *sp, u64 now,
                                      u64 bytes, u64 addr, u32 flags, u32 outcome)
{
    struct ckpt_event *e = events.ringbuf_reserve(sizeof(struct ckpt_event));
    if (!e) {
        count(C_LOST);
        return;
    }
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
    e->tokens = 0;
    e->prompt_tokens = 0;
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
    e->old_addr = 0; /* a reserved record holds whatever an earlier one left: every field is set */
    e->old_bytes = 0;
    gpu_fields(kind, s, e);
    events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

static __always_inline void emit_span(u32 kind, u32 tid, struct tstate *s, struct span *sp, u64 now,
                                      u64 bytes, u64 addr)
{
    emit_call(kind, tid, s, sp, now, bytes, addr, 0, O_NOT_RECORDED);
}

static __always_inline void emit_syscall(u32 kind, u32 tid, struct tstate *s, u64 start, u64 bytes, u64 addr,
                                         u64 old_addr, u64 old_bytes)
{
    struct ckpt_event *e = events.ringbuf_reserve(sizeof(struct ckpt_event));
    if (!e) {
        count(C_LOST);
        return;
    }
    __builtin_memset(e, 0, sizeof(*e));
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
    events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

/* ---- resident memory at defaults: the mm's own counters, read at a few events ----
 * No program runs per fault (kmem:rss_stat fires on every one: record --rss-per-fault). RSS is
 * what /proc/PID/statm shows (file + anon + shmem pages, each counter's folded value), read when a
 * checkpoint or an iteration returns and when a munmap starts (before it gives pages back, so the
 * peaks are seen); a row when it moved by RSS_STEP since the process's last one. */
#if RSS_STEP && !RSS_PER_FAULT && defined(TASK_MM_OFF)
BPF_HASH(rss_last, u32, s64, 1024); /* tgid -> resident bytes in its last row; gone at its exit */

static __always_inline s64 rss_pages(u64 mm, u32 member)
{
    s64 v = (s64)kread(mm + MM_RSS_OFF + member * MM_RSS_STRIDE);
    return v > 0 ? v : 0; /* percpu_counter_read_positive, as get_mm_counter */
}

static __always_inline void rss_sample(u32 tid, u64 now)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (rss_before_exec.lookup(&tgid))
        return; /* still the recorder's forked child, not the command */
    u64 mm = kread((u64)bpf_get_current_task() + TASK_MM_OFF);
    if (!mm)
        return;
    s64 rss = (rss_pages(mm, 0) + rss_pages(mm, 1) + rss_pages(mm, 3)) << RSS_PAGE_SHIFT;
    s64 *last = rss_last.lookup(&tgid);
    if (last) {
        s64 moved = rss - *last;
        if (moved < RSS_STEP && moved > -RSS_STEP)
            return;
        *last = rss;
    } else {
        rss_last.update(&tgid, &rss);
    }
    struct ckpt_event *e = events.ringbuf_reserve(sizeof(struct ckpt_event));
    if (!e) {
        count(C_LOST);
        return;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->start_ns = e->end_ns = now;
    e->bytes = rss;
    e->pid = tgid;
    e->tid = tid;
    e->kind = K_RSS;
    events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

static __always_inline void rss_forget(u32 tid)
{
    if (tid == bpf_get_current_pid_tgid() >> 32)
        rss_last.delete(&tid); /* the process exits: its pid may come back as another */
}
#else
static __always_inline void rss_sample(u32 tid, u64 now) {}
static __always_inline void rss_forget(u32 tid) {}
#endif

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

static __always_inline int ckpt_enter(struct pt_regs *ctx, u32 draft)
{
    u32 tid;
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = state_of(tid);
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
    s->ckpt = 0;
    s->phase = P_NONE;
    s->ck_draft = 0;
    s->ck_spec = 0;
    s->ck_in_create = 0;
    s->ck_sp = 0;
}

/* ik_llama.cpp: no update_tgt. server_context::create_checkpoint asks llama_state_seq_get_size,
 * builds the buffer (std::vector<uint8_t>(n): operator new, then memset) and copies into it with
 * llama_state_seq_get_data: the checkpoint is that size query's entry to that copy's return, the
 * same calls update_tgt makes. A size query anywhere else (a prompt save) opens nothing. */
int ckpt_enter_size(struct pt_regs *ctx)
{
    u32 tid;
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = threads.lookup(&tid);
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
    s->ckpt = 0;
    s->phase = P_NONE;
    s->ck_draft = 0;
    s->ck_spec = 0;
    s->ck_in_create = 0;
    s->ck_sp = 0;
}

int ckpt_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u32 tid;
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = threads.lookup(&tid);
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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = threads.lookup(&tid);
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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = threads.lookup(&tid);
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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = threads.lookup(&tid);
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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = threads.lookup(&tid);
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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = state_of(tid);
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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = threads.lookup(&tid);
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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = state_of(tid);
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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = threads.lookup(&tid);
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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = state_of(tid);
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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = threads.lookup(&tid);
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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = state_of(tid);
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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = threads.lookup(&tid);
    if (!s || !s->cr_open) {
        count(C_PARTIAL);
        return 0;
    }
    if (s->ckpt && s->ck_in_create) {
        count(C_ABANDONED); /* a size query whose copy never came (the allocation threw) */
        s->ckpt = 0;
        s->phase = P_NONE;
        s->ck_in_create = 0;
    }
    emit_span(K_CREATE, tid, s, &s->cr, now, s->cr_bytes, 0);
    s->cr_open = 0;
    return 0;
}

/* ---- restores (load_tgt/load_dft), the speculative state, prompt-cache saves ---- */

static __always_inline int aux_enter(u32 kind, u32 draft, u64 vec)
{
    u32 tid;
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = state_of(tid);
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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = threads.lookup(&tid);
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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = state_of(tid);
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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = threads.lookup(&tid);
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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = state_of(tid);
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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = threads.lookup(&tid);
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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = threads.lookup(&tid);
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

/* ---- CUDA (targets that map libcudart or libcuda) ----
 * Inside a state copy span (a checkpoint's or a prompt save's copy, a restore's copy), each copy
 * call adds its bytes and its time (enqueue: for pageable memory the driver returns only when the
 * copy is done, so the whole staged copy), each synchronize call its wait for the device. Only the
 * outermost call counts: the runtime's cudaMemcpyAsync calls the driver's cuMemcpyDtoHAsync_v2, a
 * wait inside a copy call is the copy's. A device-to-host copy's destination is pinned when it lies
 * in a range the process registered or allocated pinned while traced, else pageable: the span's
 * destination range (lowest to highest byte its pageable copies wrote) is then open to the fault
 * programs until the span returns. Calls outside a state copy span cost one lookup. */

static __always_inline struct tstate *gpu_span(u32 *tid)
{
    if (!target_tid(tid))
        return 0;
    struct tstate *s = threads.lookup(tid);
    if (!s || !((s->ckpt && s->phase == P_COPY) || s->ax_in_copy || s->rc_open))
        return 0;
    return s;
}

static __always_inline int is_pinned(u32 tgid, u64 p, u64 n)
{
    struct pin_set *ps = pinned.lookup(&tgid);
    if (!ps)
        return 0;
    for (int i = 0; i < MAX_PINNED; i++) {
        if (p >= ps->lo[i] && p + n <= ps->hi[i])
            return 1;
    }
    return 0;
}

/* The span's destination range grows to hold [p, p + n) (opened on its first pageable copy). */
static __always_inline void dst_extend(struct tstate *s, u32 tid, u32 tgid, u64 p, u64 n)
{
    struct dst_range *r = dst_slot(s, tgid);
    if (r) {
        if (p < r->lo)
            r->lo = p;
        if (p + n > r->hi)
            r->hi = p + n;
        return;
    }
    struct dst_set *ds = dst_ranges.lookup(&tgid);
    if (!ds)
        return;
    for (u32 i = 0; i < MAX_DST; i++) {
        /* claimed by a compare-and-swap: another thread of the process may claim at once */
        if (__sync_val_compare_and_swap(&ds->r[i].tid, 0, (u64)tid) == 0) {
            r = &ds->r[i];
            r->faults = 0;
            r->others = 0;
            r->lo = p;
            r->hi = p + n; /* open: last */
            s->gpu_slot = i + 1;
            u32 zero = 0;
            u64 *open = gpu_open.lookup(&zero);
            if (open)
                __sync_fetch_and_add(open, 1);
            return;
        }
    }
    count(C_GPU_RANGES_FULL);
}

static __always_inline int gpu_copy_enter(u64 dst, u64 n, int d2h)
{
    u32 tid;
    struct tstate *s = gpu_span(&tid);
    if (!s || s->gpu_depth++ > 0)
        return 0; /* not in a state copy, or a call inside a copy call: the outer one counts */
    s->gpu_copies++;
    s->gpu_bytes += n;
    if (d2h && n) {
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        if (is_pinned(tgid, dst, n)) {
            s->gpu_pinned += n;
        } else {
            s->gpu_pageable += n;
            dst_extend(s, tid, tgid, dst, n);
        }
    }
    s->gpu_t0 = bpf_ktime_get_ns(); /* last: the call's time excludes our bookkeeping */
    return 0;
}

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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = threads.lookup(&tid);
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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = threads.lookup(&tid);
    if (!s || !s->gpu_sync_depth)
        return 0;
    if (--s->gpu_sync_depth == 0)
        s->gpu_sync_ns += now - s->gpu_s0;
    return 0;
}

/* Pinned host memory, anywhere in the process: a range is remembered when its call returns 0. */
static __always_inline int pin_open(u64 arg, u64 size, u32 out)
{
    u32 tid;
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = state_of(tid);
    if (!s)
        return 0;
    u64 d = s->pin_depth++;
    if (d < 2) {
        asm volatile("%0 &= 1" : "+r"(d)); /* a bound the verifier keeps */
        s->pin_arg[d] = arg;
        s->pin_size[d] = size;
        s->pin_out[d] = out;
    }
    return 0;
}

/* cudaHostRegister(p, size, flags), cuMemHostRegister_v2(p, size, flags) */
int gpu_pin_enter(struct pt_regs *ctx) { return pin_open(PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0); }

/* cudaMallocHost(&p, size), cudaHostAlloc(&p, size, flags), cuMemAllocHost_v2, cuMemHostAlloc */
int gpu_pin_out_enter(struct pt_regs *ctx) { return pin_open(PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 1); }

int gpu_pin_return(struct pt_regs *ctx)
{
    u32 tid;
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = threads.lookup(&tid);
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

/* exceptions:page_fault_user and page_fault_kernel, attached only while a CUDA target is traced:
 * a fault on an open destination range counts for the span that opened it, whoever takes it (the
 * driver's threads touch the destination too, and their faults are on their own counters). Every
 * fault of every process comes here: with no range open it is one array read. */
struct fault_args {
    u64 common;
    u64 address;
    u64 ip;
    u64 error_code;
};

static __always_inline int dst_fault(u64 a)
{
    u32 zero = 0;
    u64 *open = gpu_open.lookup(&zero);
    if (!open || !*open)
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    struct dst_set *ds = dst_ranges.lookup(&tgid);
    if (!ds)
        return 0;
    for (int i = 0; i < MAX_DST; i++) {
        struct dst_range *r = &ds->r[i];
        if (a >= r->lo && a < r->hi) {
            __sync_fetch_and_add(&r->faults, 1);
            if ((u32)id != (u32)r->tid)
                __sync_fetch_and_add(&r->others, 1);
            return 0;
        }
    }
    return 0;
}

int gpu_fault(struct fault_args *args) { return dst_fault(args->address); }

/* Where the exceptions tracepoints don't exist (arm64; probes/arch.py): the `page-faults` software
 * perf event, a sample per fault on every CPU, the faulting address in ctx->addr. */
int gpu_fault_perf(struct bpf_perf_event_data *ctx) { return dst_fault(ctx->addr); }

/* ---- mmap / munmap / mremap of the target, attributed to the thread's phase ---- */

static __always_inline int syscall_enter(u32 kind, u64 len, u64 old_addr, u64 old_len)
{
    u32 tid;
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = state_of(tid);
    if (!s)
        return 0;
    s->sc_len = len;
    s->sc_old_addr = old_addr;
    s->sc_old_len = old_len;
    s->sc_kind = kind;
    s->sc_start = bpf_ktime_get_ns();
    return 0;
}

static __always_inline int syscall_exit(u32 kind, s64 ret)
{
    u32 tid;
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = threads.lookup(&tid);
    if (!s || s->sc_kind != kind)
        return 0;
    s->sc_kind = 0;
    if (ret < 0 && ret > -4096)
        return 0; /* failed: nothing was mapped */
    emit_syscall(kind, tid, s, s->sc_start, s->sc_len, (u64)ret, s->sc_old_addr, s->sc_old_len);
    return 0;
}

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
    if (!target_tid(&tid))
        return 0;
    struct tstate *s = state_of(tid);
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
    struct ckpt_event *e = events.ringbuf_reserve(sizeof(struct ckpt_event));
    if (!e) {
        count(C_LOST);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->start_ns = e->end_ns = bpf_ktime_get_ns();
    e->bytes = rss > 0 ? rss : 0;
    e->pid = pid;
    e->tid = (u32)bpf_get_current_pid_tgid();
    e->kind = K_RSS;
    events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
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
