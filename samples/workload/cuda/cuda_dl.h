// The CUDA build laid out as a GGML_BACKEND_DL build (ckpt-workload-cuda-dl): the program links
// no CUDA library; its calls go through pointers that main.cpp's load_backend() sets once the
// backend library (which needs libcudart and libcuda, as ggml's CUDA backend does) is dlopen'ed at
// start. Included first (-include) into every source of that build.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#define SAMPLE_CUDA_DL_FUNCTIONS(X) \
    X(cudaGetErrorString) X(cudaMalloc) X(cudaMemcpy) X(cudaFree) X(cudaMemcpyAsync) X(cudaStreamSynchronize) \
    X(cudaHostRegister) X(cudaHostUnregister) X(cuGetErrorString) X(cuMemcpyDtoHAsync_v2) X(cuStreamSynchronize)

#define SAMPLE_CUDA_DL_POINTER(f) extern decltype(&::f) sample_dl_##f;
SAMPLE_CUDA_DL_FUNCTIONS(SAMPLE_CUDA_DL_POINTER)
#undef SAMPLE_CUDA_DL_POINTER

#define cudaGetErrorString (*sample_dl_cudaGetErrorString)
#define cudaMalloc (*sample_dl_cudaMalloc)
#define cudaMemcpy (*sample_dl_cudaMemcpy)
#define cudaFree (*sample_dl_cudaFree)
#define cudaMemcpyAsync (*sample_dl_cudaMemcpyAsync)
#define cudaStreamSynchronize (*sample_dl_cudaStreamSynchronize)
#define cudaHostRegister (*sample_dl_cudaHostRegister)
#define cudaHostUnregister (*sample_dl_cudaHostUnregister)
#define cuGetErrorString (*sample_dl_cuGetErrorString)
#define cuMemcpyDtoHAsync_v2 (*sample_dl_cuMemcpyDtoHAsync_v2)
#define cuStreamSynchronize (*sample_dl_cuStreamSynchronize)
