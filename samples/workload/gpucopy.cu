// gpucopy: the GPU check's program (samples/gpu_check.py). Copies --mib (149) MiB device-to-host
// into fresh pageable memory (never touched), resident pageable memory (filled once before) and
// pinned memory (cudaMallocHost), round after round, and times every copy itself.
//
// The copy is made the way llama.cpp makes a state copy (ggml-cuda's get_tensor: cudaMemcpyAsync on
// the per-thread stream, then cudaStreamSynchronize, per tensor), inside functions named like the
// checkpoint path's (common_prompt_checkpoint::update_tgt calling llama_state_seq_get_data_ext), so
// `ckptrace record` takes each copy as a checkpoint's copy span and splits it by its CUDA calls.
//
// Host code only: nvcc builds it (-cudart shared: the runtime must be a shared library the probes
// can find), and so does g++ against the real runtime's headers, or against the stub CUDA libraries
// (samples/workload/cuda) on a machine without a GPU.
//
// Output (--json FILE, one object per line, CLOCK_MONOTONIC ns, the trace's clock):
//   {"type":"device","name","mib","rounds","tensors","pid"}
//   {"type":"copy","mode":"fresh|resident|pinned","round","warmup","tid","bytes","start_ns","end_ns","copy_ns"}
// the copy's clock read right around the llama_state_seq_get_data_ext call.

#include <cuda_runtime.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ns() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void check(cudaError_t e, const char * what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "gpucopy: %s failed: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

struct llama_context {
    uint8_t * dev;
    size_t bytes;
    int tensors;
};

// As ggml-cuda's get_tensor, tensor by tensor: an async copy on the per-thread stream, then wait.
extern "C" __attribute__((noinline)) size_t llama_state_seq_get_data_ext(llama_context * ctx, uint8_t * dst,
                                                                         size_t size, int32_t seq_id,
                                                                         uint32_t flags) {
    (void) seq_id;
    (void) flags;
    if (size < ctx->bytes) {
        return 0;
    }
    const size_t per = (ctx->bytes + (size_t) ctx->tensors - 1) / (size_t) ctx->tensors;
    for (size_t off = 0; off < ctx->bytes; off += per) {
        const size_t len = ctx->bytes - off < per ? ctx->bytes - off : per;
        check(cudaMemcpyAsync(dst + off, ctx->dev + off, len, cudaMemcpyDeviceToHost, cudaStreamPerThread),
              "cudaMemcpyAsync");
        check(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize");
    }
    return ctx->bytes;
}

struct copy_timing {
    int64_t start_ns = 0;
    int64_t end_ns = 0;
};

struct common_prompt_checkpoint {
    uint8_t * dst = nullptr;
    copy_timing timing;
    void update_tgt(llama_context * ctx, int seq_id, unsigned int flags);
};

// The checkpoint: only the copy (the destination is chosen by the caller), timed around the call.
__attribute__((noinline)) void common_prompt_checkpoint::update_tgt(llama_context * ctx, int seq_id,
                                                                    unsigned int flags) {
    timing.start_ns = now_ns();
    const size_t n = llama_state_seq_get_data_ext(ctx, dst, ctx->bytes, seq_id, flags);
    timing.end_ns = now_ns();
    if (n != ctx->bytes) {
        fprintf(stderr, "gpucopy: the copy wrote %zu of %zu bytes\n", n, ctx->bytes);
        exit(1);
    }
}

static uint8_t * map_fresh(size_t n) {
    void * p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "gpucopy: cannot map %zu bytes: %s\n", n, strerror(errno));
        exit(1);
    }
    return (uint8_t *) p;
}

static long arg(int argc, char ** argv, int & i, long lo, long hi) {
    if (i + 1 >= argc) {
        fprintf(stderr, "gpucopy: error: %s needs a value\n", argv[i]);
        exit(2);
    }
    char * end = nullptr;
    const long v = strtol(argv[++i], &end, 10);
    if (*end || v < lo || v > hi) {
        fprintf(stderr, "gpucopy: error: %s takes an integer from %ld to %ld\n", argv[i - 1], lo, hi);
        exit(2);
    }
    return v;
}

int main(int argc, char ** argv) {
    long mib = 149, rounds = 5, tensors = 1;
    const char * json = nullptr;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mib") == 0) {
            mib = arg(argc, argv, i, 1, 65536);
        } else if (strcmp(argv[i], "--rounds") == 0) {
            rounds = arg(argc, argv, i, 1, 10000);
        } else if (strcmp(argv[i], "--tensors") == 0) {
            tensors = arg(argc, argv, i, 1, 4096);
        } else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
            json = argv[++i];
        } else {
            fprintf(stderr, "usage: gpucopy [--mib N] [--rounds N] [--tensors N] [--json FILE]\n");
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    FILE * out = json ? fopen(json, "w") : stdout;
    if (out == nullptr) {
        fprintf(stderr, "gpucopy: cannot write %s: %s\n", json, strerror(errno));
        return 2;
    }
    check(cudaSetDevice(0), "cudaSetDevice");
    cudaDeviceProp prop;
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");

    llama_context ctx;
    ctx.bytes = (size_t) mib << 20;
    ctx.tensors = (int) tensors;
    check(cudaMalloc((void **) &ctx.dev, ctx.bytes), "cudaMalloc");
    check(cudaMemset(ctx.dev, 0x5a, ctx.bytes), "cudaMemset");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

    // Resident: filled once, so every copy into it finds its pages in. Pinned: allocated pinned.
    uint8_t * resident = map_fresh(ctx.bytes);
    memset(resident, 0, ctx.bytes);
    uint8_t * pinned = nullptr;
    check(cudaMallocHost((void **) &pinned, ctx.bytes), "cudaMallocHost");
    memset(pinned, 0, ctx.bytes);

    fprintf(out, "{\"type\":\"device\",\"name\":\"");
    for (const char * c = prop.name; *c; c++) {  // the name as a JSON string
        fprintf(out, *c == '"' || *c == '\\' ? "\\%c" : (unsigned char) *c < 0x20 ? "?" : "%c", *c);
    }
    fprintf(out, "\",\"mib\":%ld,\"rounds\":%ld,\"tensors\":%ld,\"pid\":%d}\n", mib, rounds, tensors, (int) getpid());

    static const char * const modes[] = {"fresh", "resident", "pinned"};
    common_prompt_checkpoint ck;
    // Round 0 warms the driver up (staging buffers, first-use costs): written, marked, not compared.
    for (long r = 0; r <= rounds; r++) {
        for (int m = 0; m < 3; m++) {
            uint8_t * fresh = m == 0 ? map_fresh(ctx.bytes) : nullptr;
            ck.dst = m == 0 ? fresh : m == 1 ? resident : pinned;
            ck.update_tgt(&ctx, 0, 0);
            fprintf(out,
                    "{\"type\":\"copy\",\"mode\":\"%s\",\"round\":%ld,\"warmup\":%s,\"tid\":%d,\"bytes\":%zu,"
                    "\"start_ns\":%lld,\"end_ns\":%lld,\"copy_ns\":%lld}\n",
                    modes[m], r, r == 0 ? "true" : "false", (int) syscall(SYS_gettid), ctx.bytes,
                    (long long) ck.timing.start_ns, (long long) ck.timing.end_ns,
                    (long long) (ck.timing.end_ns - ck.timing.start_ns));
            fflush(out);
            if (fresh) {
                munmap(fresh, ctx.bytes);
            }
        }
    }
    check(cudaFreeHost(pinned), "cudaFreeHost");
    munmap(resident, ctx.bytes);
    check(cudaFree(ctx.dev), "cudaFree");
    if (json) {
        fclose(out);
    }
    return 0;
}
