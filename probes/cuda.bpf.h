/* CUDA targets (processes that map libcudart or libcuda): what a state copy span's CUDA calls add
 * to its row.
 * Inside a state copy span (a checkpoint's or a prompt save's copy, a restore's copy), each copy
 * call adds its bytes and its time (enqueue: for pageable memory the driver returns only when the
 * copy is done, so the whole staged copy), each synchronize call its wait for the device. Only the
 * outermost call counts: the runtime's cudaMemcpyAsync calls the driver's cuMemcpyDtoHAsync_v2, a
 * wait inside a copy call is the copy's. A device-to-host copy's destination is pinned when it lies
 * in a range the process registered or allocated pinned while traced, else pageable: the span's
 * destination range (lowest to highest byte its pageable copies wrote) is then open to the fault
 * programs until the span returns. Calls outside a state copy span cost one lookup.
 * Per process (entries made by the recorder): its pinned host ranges, and the destination ranges of
 * its open state copy spans, which the page fault programs count faults on. */
#ifndef CKPTRACE_CUDA_BPF_H
#define CKPTRACE_CUDA_BPF_H

#include "tstate.bpf.h"

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

static __always_inline struct tstate *gpu_span(u32 *tid)
{
    struct tstate *s = return_state(tid);
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

/* Pinned host memory, anywhere in the process: a range is remembered when its call returns 0. */
static __always_inline int pin_open(u64 arg, u64 size, u32 out)
{
    u32 tid;
    struct tstate *s = entry_state(&tid);
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

#endif
