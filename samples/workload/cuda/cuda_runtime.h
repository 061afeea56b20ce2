// The CUDA runtime API as the stub libcudart.so.12 (runtime.c) implements it: the subset of CUDA
// 12's cuda_runtime_api.h that the sample workload and samples/workload/gpucopy.cu call, with the
// same names, types and ABI. Built against the real headers instead, the same sources run on a GPU.
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
} cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

typedef struct CUstream_st * cudaStream_t;
#define cudaStreamLegacy ((cudaStream_t) 0x1)
#define cudaStreamPerThread ((cudaStream_t) 0x2)

#define cudaHostRegisterDefault 0x00
#define cudaHostAllocDefault 0x00

// The real struct is larger; its first member is the name, the only one the stub fills.
struct cudaDeviceProp {
    char name[256];
    char rest_[4096];
};

const char * cudaGetErrorString(cudaError_t error);
cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDeviceCount(int * count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int * device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp * prop, int device);
cudaError_t cudaDriverGetVersion(int * version);
cudaError_t cudaRuntimeGetVersion(int * version);
cudaError_t cudaDeviceReset(void);

cudaError_t cudaMalloc(void ** p, size_t bytes);
cudaError_t cudaFree(void * p);
cudaError_t cudaMemset(void * p, int value, size_t bytes);

cudaError_t cudaMemcpy(void * dst, const void * src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void * dst, const void * src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaDeviceSynchronize(void);

cudaError_t cudaHostRegister(void * p, size_t bytes, unsigned int flags);
cudaError_t cudaHostUnregister(void * p);
cudaError_t cudaMallocHost(void ** p, size_t bytes);
cudaError_t cudaHostAlloc(void ** p, size_t bytes, unsigned int flags);
cudaError_t cudaFreeHost(void * p);

#ifdef __cplusplus
}
#endif
