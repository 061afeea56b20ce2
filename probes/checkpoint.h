/* Event layout shared by checkpoint.bpf.c and the recorder (which reads it from the compiler). */
#ifndef CKPTRACE_CHECKPOINT_H
#define CKPTRACE_CHECKPOINT_H

/* Row kinds; the order is ckptrace.core.trace.KINDS. */
enum ckpt_kind {
    K_CHECKPOINT = 0,
    K_FILL = 1,
    K_COPY = 2,
    K_ITERATION = 3,
    K_DECODE = 4,
    K_MMAP = 5,
    K_MUNMAP = 6,
    K_MREMAP = 7,
    K_CREATE = 8,
    K_RESTORE = 9,
    K_RESTORE_COPY = 10,
    K_SPEC_STATE = 11,
    K_PROMPT_SAVE = 12,
    K_RSS = 13,
    K_SLOT_SAVE = 14,
    K_SLOT_RESTORE = 15,
};

/* Innermost open span of a thread; the order is ckptrace.core.trace.PHASES. */
enum ckpt_phase {
    P_NONE = 0,
    P_ITERATION = 1,
    P_CHECKPOINT = 2,
    P_FILL = 3,
    P_COPY = 4,
    P_CREATE = 5,
    P_RESTORE = 6,
    P_RESTORE_COPY = 7,
    P_SPEC_STATE = 8,
    P_PROMPT_SAVE = 9,
    P_SLOT_SAVE = 10,
    P_SLOT_RESTORE = 11,
};

/* Flags in the `targets` map's value, per traced process, from its probe plan. */
enum ckpt_target_flag {
    TARGET_TRACED = 1,
    TARGET_CREATE = 2, /* create_checkpoint is probed: an update_tgt outside it is speculative */
    TARGET_LIBCXX = 4, /* built with libc++: llama_batch_ext's token is TOKEN_SIZE_LIBCXX bytes */
    TARGET_LOAD_BOOL = 8, /* load_tgt/load_dft return whether the state was restored (build 11549 on) */
};

/* A call's outcome as it reported it (ckpt_event.outcome). */
enum ckpt_outcome {
    O_NOT_RECORDED = 0, /* the call reports nothing (a void load_tgt) */
    O_OK = 1,           /* restored: load_* returned true; a set_data copy read all it was given */
    O_FAILED = 2,       /* load_* returned false; a set_data copy read less than it was given */
};

/* Kernel-side counters, index into the `counters` array. */
enum ckpt_counter {
    C_LOST = 0,      /* ring buffer full: event dropped */
    C_PARTIAL = 1,   /* a return whose entry was not seen (attached mid-span): dropped */
    C_NEXT_ID = 2,   /* id allocator for checkpoints and iterations */
    C_ABANDONED = 3, /* an entry that never returned before the next one (exception), or a
                      * thread that exited inside a span */
    C_MAP_FULL = 4,  /* the per-thread map was full: that thread's event was not seen */
    C_THREADS_SEEN = 5,   /* threads taken into the per-thread map */
    C_THREADS_PRUNED = 6, /* ... and removed again when they exited */
    C_THREADS_PEAK = 7,   /* most threads in the map at once */
    C_BATCH_UNREAD = 8, /* a llama_batch_ext whose token vector did not look like the layout: tokens 0 */
    C_GPU_RANGES_FULL = 9, /* a CUDA copy span found no free destination range: its dst faults not counted */
    C_PINNED_FULL = 10,    /* a pinned host range not remembered (MAX_PINNED at once): copies into it
                            * count as pageable */
    N_COUNTERS = 11,
};

struct ckpt_event {
    u64 start_ns;
    u64 end_ns;
    u64 ckpt;
    u64 iter;
    u64 bytes;
    u64 addr;
    u64 faults;
    u64 fault_timed;
    u64 fault_timed_ns;
    u64 cpu_ns;   /* the thread's on-CPU time over the span (0 when not recorded; CPU_UNKNOWN: read wrong) */
    u64 wait_ns;  /* its run-queue wait over the span */
    u64 nvcsw;    /* voluntary / involuntary context switches over the span */
    u64 nivcsw;
    u32 tid;
    u32 kind;
    u32 tokens;
    u32 prompt_tokens;
    u32 phase;
    u32 draft;
    u32 pid;      /* the process (tgid) of the row */
    u32 spec;  /* checkpoint for a speculative round: update_tgt outside create_checkpoint */
    u64 old_addr;   /* mremap: the range it moved or resized from (0 for other kinds) */
    u64 old_bytes;
    /* CUDA targets (trace version 4): the CUDA calls inside a copy or restore_copy span, 0 for
     * other rows. Only the outermost call counts (a runtime call's own driver call is inside it). */
    u64 gpu_bytes;          /* bytes of the copy calls */
    u64 gpu_pinned_bytes;   /* of those, device-to-host into pinned host memory */
    u64 gpu_pageable_bytes; /* of those, device-to-host into pageable host memory */
    u64 gpu_enqueue_ns;     /* time inside the copy calls */
    u64 gpu_sync_ns;        /* time inside the synchronize calls (waiting for the device) */
    u64 gpu_dst_faults;     /* page faults on the pageable destination range, by any thread */
    u64 gpu_driver_faults;  /* of those, taken by other threads than the span's (the driver's) */
    u32 gpu_copies;
    u32 gpu_syncs;
    u32 state_flags; /* copy, restore_copy: the llama_state_seq_flags the call was given */
    u32 outcome;     /* restore, restore_copy: enum ckpt_outcome */
};

#endif
