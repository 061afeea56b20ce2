// The CUDA driver API as the stub libcuda.so.1 (driver.c) implements it: the subset of CUDA 12's
// cuda.h that the copy path calls, with the same names, types and ABI (CUresult is an int-sized
// enum, CUdeviceptr 64 bits, streams opaque pointers), so a program built against this header
// runs against the real driver unchanged and the same uprobes apply to both.
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
} CUresult;

typedef unsigned long long CUdeviceptr;
typedef struct CUstream_st * CUstream;
typedef int CUdevice;

CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int * version);
CUresult cuGetErrorString(CUresult error, const char ** str);

CUresult cuMemAlloc_v2(CUdeviceptr * dptr, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemsetD8_v2(CUdeviceptr dptr, unsigned char value, size_t n);

// Copies. DtoH: device to host; HtoD: host to device; DtoD; and the unified cuMemcpy(Async), whose
// direction the driver infers from the addresses.
CUresult cuMemcpyDtoH_v2(void * dst, CUdeviceptr src, size_t bytes);
CUresult cuMemcpyDtoHAsync_v2(void * dst, CUdeviceptr src, size_t bytes, CUstream stream);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void * src, size_t bytes);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void * src, size_t bytes, CUstream stream);
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);

// Waiting for the device.
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuCtxSynchronize(void);

// Pinned (page-locked) host memory.
CUresult cuMemHostRegister_v2(void * p, size_t bytes, unsigned int flags);
CUresult cuMemHostUnregister(void * p);
CUresult cuMemAllocHost_v2(void ** pp, size_t bytes);
CUresult cuMemHostAlloc(void ** pp, size_t bytes, unsigned int flags);
CUresult cuMemFreeHost(void * p);

#ifdef __cplusplus
}
#endif
