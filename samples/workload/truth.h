// The workload's own clocks and fault counter, the ground truth a tracer is checked against.
#pragma once

#include <stdint.h>
#include <sys/resource.h>
#include <time.h>

// CLOCK_MONOTONIC, the clock bpf_ktime_get_ns() reads.
static inline int64_t now_ns() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// The calling thread's on-CPU time (CLOCK_THREAD_CPUTIME_ID): what a tracer reads from
// task_struct.se.sum_exec_runtime. Unlike the wall clock, preemption does not move it.
static inline int64_t thread_cpu_ns() {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// The calling thread's own fault counter, what a tracer reads from task_struct.min_flt/maj_flt.
static inline int64_t thread_faults() {
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    return ru.ru_minflt + ru.ru_majflt;
}
