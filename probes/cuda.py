"""The CUDA copy path's probe points: what a state copy span's CUDA calls are, and where they live.

Only a target that maps the CUDA runtime or driver library (libcudart.so*, libcuda.so*) gets them:
elf_objects.py looks for these names in those libraries alone, so a CPU-only target has no CUDA point,
no CUDA program attached and no CUDA column in its trace. Each point is a C function of the
library, named as the library exports it; its role says which programs of checkpoint.bpf.c time it
(probes/loader.py PROGRAMS) and what it adds to the span it is called in.
"""
from __future__ import annotations

import os

LIBRARIES = ("libcudart.so", "libcuda.so")  # file name prefixes: libcudart.so.12, libcuda.so.1, ...

# point (the exported function) -> role
POINTS: dict[str, str] = {
    # copies, runtime: (dst, src, bytes, kind, [stream]); kind 2 is device-to-host
    **dict.fromkeys(("cudaMemcpy", "cudaMemcpyAsync", "cudaMemcpy_ptds", "cudaMemcpyAsync_ptsz"), "copy_rt"),
    # copies, driver, device-to-host: (dst, src, bytes, [stream])
    **dict.fromkeys(("cuMemcpyDtoH_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoH_v2_ptds", "cuMemcpyDtoHAsync_v2_ptsz"),
                    "copy_dtoh"),
    # copies, driver, host-to-device, device-to-device and unified (direction unknown): (dst, src, bytes, ...)
    **dict.fromkeys(("cuMemcpyHtoD_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoD_v2_ptds", "cuMemcpyHtoDAsync_v2_ptsz",
                     "cuMemcpyDtoD_v2", "cuMemcpyDtoDAsync_v2", "cuMemcpyDtoD_v2_ptds", "cuMemcpyDtoDAsync_v2_ptsz",
                     "cuMemcpy", "cuMemcpyAsync", "cuMemcpy_ptds", "cuMemcpyAsync_ptsz"), "copy_other"),
    # waiting for the device
    **dict.fromkeys(("cudaStreamSynchronize", "cudaStreamSynchronize_ptsz", "cudaDeviceSynchronize",
                     "cuStreamSynchronize", "cuStreamSynchronize_ptsz", "cuCtxSynchronize"), "sync"),
    # pinned host memory: (p, bytes, flags) registered; (&p, bytes, [flags]) allocated; (p) released
    **dict.fromkeys(("cudaHostRegister", "cuMemHostRegister_v2"), "pin"),
    **dict.fromkeys(("cudaMallocHost", "cudaHostAlloc", "cuMemAllocHost_v2", "cuMemHostAlloc"), "pin_out"),
    **dict.fromkeys(("cudaHostUnregister", "cuMemHostUnregister", "cudaFreeHost", "cuMemFreeHost"), "unpin"),
}
# Where a fault on a copy's destination is seen, whichever thread takes it: checkpoint.bpf.c gpu_fault.
FAULT_TRACEPOINTS = ("exceptions:page_fault_user", "exceptions:page_fault_kernel")
# ... or, where those x86 tracepoints don't exist (arm64), the software perf event (gpu_fault_perf)
FAULT_PERF_EVENT = "perf:page-faults"


def is_library(path: str) -> bool:
    """Whether the object at `path` is a CUDA runtime or driver library (by its file name)."""
    return os.path.basename(path).startswith(LIBRARIES)
