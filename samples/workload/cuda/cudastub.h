// Sample-only: what the stub runtime (runtime.c) shares with the stub driver (driver.c), which does
// the work and keeps the truth. Not part of CUDA; nothing but the two stub libraries uses it.
//
// The stub's truth (CKPT_CUDA_STUB_TRUTH=FILE) is one JSON object per line for each call the
// program made (a runtime call's own driver calls are not lines of their own), CLOCK_MONOTONIC ns:
//   copy: {"call","api","tid","start_ns","end_ns","kind":"d2h|h2d|d2d|h2h","async","bytes","dst",
//          "class":"pinned|pageable_resident|pageable_fresh|device|host","nonresident_pages",
//          "caller_faults","worker_faults"}
//     class: a device-to-host copy's destination: inside a pinned range (registered or allocated
//     pinned), or pageable and fully resident (mincore) when the copy started, or not;
//     caller_faults / worker_faults: the page faults the calling thread / the driver's worker thread
//     took while writing the destination (getrusage(RUSAGE_THREAD) around each write);
//   wait: {"call","api","tid","start_ns","end_ns"}   (cudaStreamSynchronize, cuCtxSynchronize, ...)
//   pin, unpin: {"call","api","tid","start_ns","end_ns","ptr","bytes"}
// Lines are kept in memory and written at exit (and whenever 1 MiB has gathered), so writing them
// is not inside the calls they time.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int64_t cudastub_now(void);
// A runtime call is open on this thread: the driver calls it makes are not truth lines of their own.
void cudastub_enter(void);
void cudastub_leave(void);
// The truth line of a runtime call, from what its driver call did.
void cudastub_truth_copy(const char * call, int64_t start_ns, int64_t end_ns, size_t bytes, const void * dst);
void cudastub_truth_call(const char * call, const char * what, int64_t start_ns, int64_t end_ns,
                         const void * ptr, size_t bytes);

#ifdef __cplusplus
}
#endif
