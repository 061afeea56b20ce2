/* Memory: mmap/munmap/mremap rows, resident memory (RSS) rows, and the sampled fault timing's
 * per-CPU slot. */
#ifndef CKPTRACE_MEMORY_BPF_H
#define CKPTRACE_MEMORY_BPF_H

#include "tstate.bpf.h"
#include "emit.bpf.h"

#ifndef RSS_PER_FAULT
#define RSS_PER_FAULT 0
#endif

/* A fault's own accounting comes within microseconds; a longer gap is a sample that lost its pair. */
#define MAX_FAULT_NS 1000000ULL

/* A sampled fault waiting for its rss_stat; per CPU so rss_stat needs no hash lookup. */
struct armed {
    u32 tid;
    u32 pad;
    u64 t0;
};
BPF_PERCPU_ARRAY(armed_fault, struct armed, 1);

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
    struct ckpt_event *e = reserve_event();
    if (!e)
        return;
    e->start_ns = e->end_ns = now;
    e->bytes = rss;
    e->pid = tgid;
    e->tid = tid;
    e->kind = K_RSS;
    submit_event(e);
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

/* mmap/munmap/mremap rows: the call's arguments held from its entry to its exit, per thread. */
static __always_inline int syscall_enter(u32 kind, u64 len, u64 old_addr, u64 old_len)
{
    u32 tid;
    struct tstate *s = entry_state(&tid);
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
    struct tstate *s = return_state(&tid);
    if (!s || s->sc_kind != kind)
        return 0;
    s->sc_kind = 0;
    if (ret < 0 && ret > -4096)
        return 0; /* failed: nothing was mapped */
    emit_syscall(kind, tid, s, s->sc_start, s->sc_len, (u64)ret, s->sc_old_addr, s->sc_old_len);
    return 0;
}

#endif
