// libcudart.so.12 stand-in: the CUDA runtime's copy path, each call made through the driver's
// exported entry points (stub libcuda.so.1, driver.c), as the real runtime calls into libcuda. A
// tracer that probes both layers sees every runtime copy twice, nested: it must count it once.
// Each call the program makes is one truth line (cudastub.h), written by the driver stub.

#include "cuda.h"
#include "cuda_runtime.h"
#include "cudastub.h"

#include <stdint.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default"))) __attribute__((noinline))

static __thread cudaError_t last_error = cudaSuccess;

static cudaError_t status(CUresult r) {
    cudaError_t e = (cudaError_t) r;  // the stub's codes are the same numbers in both APIs
    if (e != cudaSuccess) {
        last_error = e;
    }
    return e;
}

static CUresult dispatch(void * dst, const void * src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s, int async) {
    const CUdeviceptr d = (CUdeviceptr) (uintptr_t) dst, sp = (CUdeviceptr) (uintptr_t) src;
    CUstream st = (CUstream) s;
    switch (kind) {
        case cudaMemcpyDeviceToHost: return async ? cuMemcpyDtoHAsync_v2(dst, sp, n, st) : cuMemcpyDtoH_v2(dst, sp, n);
        case cudaMemcpyHostToDevice: return async ? cuMemcpyHtoDAsync_v2(d, src, n, st) : cuMemcpyHtoD_v2(d, src, n);
        case cudaMemcpyDeviceToDevice: return async ? cuMemcpyDtoDAsync_v2(d, sp, n, st) : cuMemcpyDtoD_v2(d, sp, n);
        case cudaMemcpyHostToHost:
        case cudaMemcpyDefault: return async ? cuMemcpyAsync(d, sp, n, st) : cuMemcpy(d, sp, n);
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static cudaError_t memcpy_call(const char * call, void * dst, const void * src, size_t n, enum cudaMemcpyKind kind,
                               cudaStream_t s, int async) {
    const int64_t t0 = cudastub_now();
    cudastub_enter();
    const CUresult r = dispatch(dst, src, n, kind, s, async);
    cudastub_leave();
    cudastub_truth_copy(call, t0, cudastub_now(), n, dst);
    return status(r);
}

EXPORT cudaError_t cudaMemcpy(void * dst, const void * src, size_t n, enum cudaMemcpyKind kind) {
    return memcpy_call("cudaMemcpy", dst, src, n, kind, cudaStreamLegacy, 0);
}

EXPORT cudaError_t cudaMemcpyAsync(void * dst, const void * src, size_t n, enum cudaMemcpyKind kind,
                                   cudaStream_t s) {
    return memcpy_call("cudaMemcpyAsync", dst, src, n, kind, s, 1);
}

// The per-thread default stream's entry points (what the headers name under
// CUDA_API_PER_THREAD_DEFAULT_STREAM): the same calls here.
EXPORT cudaError_t cudaMemcpy_ptds(void * dst, const void * src, size_t n, enum cudaMemcpyKind kind) {
    return memcpy_call("cudaMemcpy_ptds", dst, src, n, kind, cudaStreamPerThread, 0);
}

EXPORT cudaError_t cudaMemcpyAsync_ptsz(void * dst, const void * src, size_t n, enum cudaMemcpyKind kind,
                                        cudaStream_t s) {
    return memcpy_call("cudaMemcpyAsync_ptsz", dst, src, n, kind, s, 1);
}

// A call that is not a copy, timed and written as one truth line.
#define RUNTIME_CALL(call, what, expr, ptr, bytes)                                                                   \
    do {                                                                                                             \
        const int64_t t0_ = cudastub_now();                                                                          \
        cudastub_enter();                                                                                            \
        const CUresult r_ = (expr);                                                                                  \
        cudastub_leave();                                                                                            \
        cudastub_truth_call(call, what, t0_, cudastub_now(), ptr, bytes);                                            \
        return status(r_);                                                                                           \
    } while (0)

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    RUNTIME_CALL("cudaStreamSynchronize", "wait", cuStreamSynchronize((CUstream) s), NULL, 0);
}

EXPORT cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t s) {
    RUNTIME_CALL("cudaStreamSynchronize_ptsz", "wait", cuStreamSynchronize((CUstream) s), NULL, 0);
}

EXPORT cudaError_t cudaDeviceSynchronize(void) {
    RUNTIME_CALL("cudaDeviceSynchronize", "wait", cuCtxSynchronize(), NULL, 0);
}

EXPORT cudaError_t cudaHostRegister(void * p, size_t n, unsigned int flags) {
    RUNTIME_CALL("cudaHostRegister", "pin", cuMemHostRegister_v2(p, n, flags), p, n);
}

EXPORT cudaError_t cudaHostUnregister(void * p) {
    RUNTIME_CALL("cudaHostUnregister", "unpin", cuMemHostUnregister(p), p, 0);
}

EXPORT cudaError_t cudaFreeHost(void * p) { RUNTIME_CALL("cudaFreeHost", "unpin", cuMemFreeHost(p), p, 0); }

static cudaError_t alloc_host(const char * call, void ** pp, size_t n, unsigned int flags) {
    const int64_t t0 = cudastub_now();
    cudastub_enter();
    const CUresult r = cuMemHostAlloc(pp, n, flags);
    cudastub_leave();
    cudastub_truth_call(call, "pin", t0, cudastub_now(), r == CUDA_SUCCESS ? *pp : NULL, n);
    return status(r);
}

EXPORT cudaError_t cudaMallocHost(void ** pp, size_t n) { return alloc_host("cudaMallocHost", pp, n, 0); }

EXPORT cudaError_t cudaHostAlloc(void ** pp, size_t n, unsigned int flags) {
    return alloc_host("cudaHostAlloc", pp, n, flags);
}

// ---- the rest a program needs to run ----

EXPORT cudaError_t cudaMalloc(void ** pp, size_t n) {
    CUdeviceptr d = 0;
    const CUresult r = cuMemAlloc_v2(&d, n);
    *pp = (void *) (uintptr_t) d;
    return status(r);
}

EXPORT cudaError_t cudaFree(void * p) { return p ? status(cuMemFree_v2((CUdeviceptr) (uintptr_t) p)) : cudaSuccess; }

EXPORT cudaError_t cudaMemset(void * p, int value, size_t n) {
    return status(cuMemsetD8_v2((CUdeviceptr) (uintptr_t) p, (unsigned char) value, n));
}

EXPORT const char * cudaGetErrorString(cudaError_t e) {
    const char * s = "unknown error";
    cuGetErrorString((CUresult) e, &s);
    return s;
}

EXPORT cudaError_t cudaGetLastError(void) {
    const cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

EXPORT cudaError_t cudaGetDeviceCount(int * count) {
    *count = 1;
    return status(cuInit(0));
}

EXPORT cudaError_t cudaSetDevice(int device) { return device == 0 ? status(cuInit(0)) : status(CUDA_ERROR_INVALID_VALUE); }

EXPORT cudaError_t cudaGetDevice(int * device) {
    *device = 0;
    return cudaSuccess;
}

static cudaError_t properties(struct cudaDeviceProp * prop, int device) {
    if (device != 0) {
        return status(CUDA_ERROR_INVALID_VALUE);
    }
    memset(prop->name, 0, sizeof(prop->name));
    strncpy(prop->name, "ckptrace CUDA stub (CPU)", sizeof(prop->name) - 1);
    return cudaSuccess;
}

EXPORT cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp * prop, int device) { return properties(prop, device); }

// What CUDA 12's headers call cudaGetDeviceProperties.
EXPORT cudaError_t cudaGetDeviceProperties_v2(struct cudaDeviceProp * prop, int device) {
    return properties(prop, device);
}

EXPORT cudaError_t cudaDriverGetVersion(int * version) { return status(cuDriverGetVersion(version)); }

EXPORT cudaError_t cudaRuntimeGetVersion(int * version) {
    *version = 12090;
    return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceReset(void) { return status(cuCtxSynchronize()); }
