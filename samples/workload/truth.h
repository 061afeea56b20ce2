// The workload's own clock and fault counter, the ground truth a tracer is checked against.
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

// The calling thread's own fault counter, what a tracer reads from task_struct.min_flt/maj_flt.
static inline int64_t thread_faults() {
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    return ru.ru_minflt + ru.ru_majflt;
}
