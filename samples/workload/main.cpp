// ckpt-workload: drives the sample server's checkpoint path and writes its own ground truth.
//
// Truth lines (--truth FILE), CLOCK_MONOTONIC ns, written between update_slots() calls so the
// writing is outside every timed region. minflt_total in the summary is the main thread's
// minor+major faults over all iterations.

#include "common.h"
#include "truth.h"
#include "llama.h"
#include "server.h"

#include <errno.h>
#include <getopt.h>
#ifdef SAMPLE_BACKEND_DL
#include <dlfcn.h>
#endif
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

static const char * prog = "ckpt-workload";



[[noreturn]] static void usage_error(const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: error: ", prog);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see --help)\n");
    va_end(ap);
    exit(2);
}

static int64_t parse_int(const char * opt, const char * s, int64_t lo, int64_t hi) {
    char * end = nullptr;
    errno = 0;
    const long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        usage_error("%s takes an integer from %lld to %lld, got '%s'", opt, (long long) lo, (long long) hi, s);
    }
    return v;
}

static void usage(FILE * f) {
    fprintf(f,
            "usage: %s [options]\n"
            "Reproduces llama-server's checkpoint path: update_slots() creates one checkpoint per\n"
            "slot on prefill iterations (update_tgt: resize, then llama_state_seq_get_data_ext).\n"
            "\n"
            "  --slots N               slots (2)\n"
            "  --iterations N          update_slots() calls (24)\n"
            "  --decode-per-prefill K  decode iterations after each prefill (2)\n"
            "  --ckpt-mib M            checkpoint size in MiB (48; at most 32 is served from the heap)\n"
            "  --grow-mib G            checkpoint growth per prefill iteration, MiB (0)\n"
            "  --pool on|off           bounded checkpoint buffer pool (off)\n"
            "  --fill MODE             how a checkpoint buffer that must grow is made (llama.cpp PR #201's\n"
            "                          variants): zero (resize(): the zero fill, as llama.cpp), none (a\n"
            "                          fresh new uint8_t[n]: the copy faults every page in), touch (the\n"
            "                          same, one byte per page written first), half (half its pages\n"
            "                          written first); none, touch and half need --pool off (zero)\n"
            "  --pool-cap-mib M        the pool's byte cap in MiB (1/16 of physical memory)\n"
            "  --pool-count N          the pool's count cap (64)\n"
            "  --pool-trim-idle-ms T   trim the pool once a gap between update_slots() calls has\n"
            "                          lasted T ms (--gap-us), as llama-server trims when idle (never)\n"
            "  --keep K                checkpoints kept per slot (1)\n"
            "  --request-prefills R    every R prefills each slot starts a new request: its\n"
            "                          checkpoints are freed and --grow-mib starts over (0 = never)\n"
            "  --prompt-tokens P       prompt tokens per slot per prefill batch (64)\n"
            "  --decode-us U           llama_decode() compute per 64-token ubatch, us (2000)\n"
            "  --noise-threads N       threads resizing and copying state outside update_tgt (0)\n"
            "  --draft                 also update the draft state (update_dft) per checkpoint\n"
            "  --truth FILE            write ground-truth JSON lines to FILE\n"
            "  --wait-signal           print 'ready pid=PID' to stderr, wait for SIGUSR1\n"
            "  --mremap                grow a 1 MiB mapping to 4 MiB with mremap() before the first\n"
            "                          iteration (a 'mremap' truth line)\n"
            "  --pause-in-checkpoint   the first checkpoint prints 'paused in checkpoint pid=PID'\n"
            "                          after its fill and waits for SIGUSR1 (attach tests)\n"
            "  --exit-code N           exit status at the end (0)\n"
            "  --gap-us U              sleep between update_slots() calls, us (0): a steady rate\n"
            "  --thread-churn N        per iteration, N short-lived threads each mmap/munmap once (0)\n"
            "upstream generation (ckpt-workload-upstream, -libcxx, -inlined builds only):\n"
            "  --restore-every N       from the 2nd prefill, every Nth: each slot restores its last\n"
            "                          checkpoint first (load_tgt -> llama_state_seq_set_data_ext)\n"
            "  --spec                  decode iterations: a speculative checkpoint per slot\n"
            "  --spec-state-kib K      create_checkpoint also stashes K KiB of speculative state\n"
            "  --prompt-save           each prefill: slot 0 saves its prompt state (prompt cache)\n"
            "  --prompt-save-inlined   each prefill: the last slot saves it too, in get_available_slot\n"
            "                          (the save inlined there, as upstream's GCC build has it)\n"
            "  --slot-file PATH        each prefill: slot 0 saved to PATH and restored from it\n"
            "                          (llama_state_seq_save_file, then load_file twice: the count, the rest)\n"
            "CUDA build (ckpt-workload-cuda, against the stub libcudart) only:\n"
            "  --cuda-dst MODE         where each checkpoint's state copy goes: pageable (the filled\n"
            "                          buffer), fresh (no fill: never-touched memory), pinned (the\n"
            "                          buffer registered with cudaHostRegister around the copy), or\n"
            "                          cycle (each in turn) (pageable)\n"
            "  --cuda-tensors N        device-to-host copies (each then synchronized) per state copy (4)\n"
            "  --cuda-api API          runtime (cudaMemcpyAsync) or driver (cuMemcpyDtoHAsync_v2) (runtime)\n"
            "  --help                  this text\n",
            prog);
}

struct options {
    server_params sp;
    int64_t iterations = 24;
    bool pool = false;
    int fill = SAMPLE_FILL_ZERO;
    int64_t decode_us = 2000;
    int32_t noise_threads = 0;
    std::string truth;
    bool wait_signal = false;
    bool pause_in_checkpoint = false;
    bool mremap = false;
    int exit_code = 0;
    int64_t gap_us = 0;
    int32_t thread_churn = 0;
    int cuda_dst = -1;  // -1: not given
    int32_t cuda_tensors = 0;  // 0: not given
    int cuda_driver_api = -1;  // -1: not given
    int64_t pool_cap_mib = -1;  // -1: PR #201's cap
    int64_t pool_count = (int64_t) common_state_buffer_pool::default_count_cap;
    int64_t pool_trim_idle_ms = -1;  // -1: never
};

static options parse_options(int argc, char ** argv) {
    enum {
        O_SLOTS = 1000, O_ITER, O_DPP, O_CKPT, O_GROW, O_POOL, O_KEEP, O_PROMPT, O_DECODE_US,
        O_NOISE, O_TRUTH, O_WAIT, O_PAUSE, O_MREMAP, O_EXIT, O_DRAFT, O_HELP, O_REQUEST, O_GAP, O_CHURN, O_RESTORE, O_SPEC,
        O_SPEC_STATE, O_PROMPT_SAVE, O_PROMPT_SAVE_INLINED, O_CUDA_DST, O_CUDA_TENSORS, O_CUDA_API, O_POOL_CAP,
        O_POOL_COUNT, O_POOL_TRIM, O_SLOT_FILE, O_FILL
    };
    static const struct option longopts[] = {
        {"slots", required_argument, nullptr, O_SLOTS},
        {"iterations", required_argument, nullptr, O_ITER},
        {"decode-per-prefill", required_argument, nullptr, O_DPP},
        {"ckpt-mib", required_argument, nullptr, O_CKPT},
        {"grow-mib", required_argument, nullptr, O_GROW},
        {"pool", required_argument, nullptr, O_POOL},
        {"keep", required_argument, nullptr, O_KEEP},
        {"prompt-tokens", required_argument, nullptr, O_PROMPT},
        {"decode-us", required_argument, nullptr, O_DECODE_US},
        {"noise-threads", required_argument, nullptr, O_NOISE},
        {"truth", required_argument, nullptr, O_TRUTH},
        {"wait-signal", no_argument, nullptr, O_WAIT},
        {"pause-in-checkpoint", no_argument, nullptr, O_PAUSE},
        {"mremap", no_argument, nullptr, O_MREMAP},
        {"exit-code", required_argument, nullptr, O_EXIT},
        {"draft", no_argument, nullptr, O_DRAFT},
        {"help", no_argument, nullptr, O_HELP},
        {"request-prefills", required_argument, nullptr, O_REQUEST},
        {"gap-us", required_argument, nullptr, O_GAP},
        {"thread-churn", required_argument, nullptr, O_CHURN},
        {"restore-every", required_argument, nullptr, O_RESTORE},
        {"spec", no_argument, nullptr, O_SPEC},
        {"spec-state-kib", required_argument, nullptr, O_SPEC_STATE},
        {"prompt-save", no_argument, nullptr, O_PROMPT_SAVE},
        {"prompt-save-inlined", no_argument, nullptr, O_PROMPT_SAVE_INLINED},
        {"cuda-dst", required_argument, nullptr, O_CUDA_DST},
        {"cuda-tensors", required_argument, nullptr, O_CUDA_TENSORS},
        {"cuda-api", required_argument, nullptr, O_CUDA_API},
        {"pool-cap-mib", required_argument, nullptr, O_POOL_CAP},
        {"pool-count", required_argument, nullptr, O_POOL_COUNT},
        {"pool-trim-idle-ms", required_argument, nullptr, O_POOL_TRIM},
        {"slot-file", required_argument, nullptr, O_SLOT_FILE},
        {"fill", required_argument, nullptr, O_FILL},
        {nullptr, 0, nullptr, 0},
    };
    options o;
    int64_t ckpt_mib = 48;
    int64_t grow_mib = 0;
    opterr = 0;  // one line of our own instead of getopt's
    int c;
    while ((c = getopt_long(argc, argv, ":", longopts, nullptr)) != -1) {
        switch (c) {
            case O_SLOTS: o.sp.n_slots = (int32_t) parse_int("--slots", optarg, 1, 64); break;
            case O_ITER: o.iterations = parse_int("--iterations", optarg, 1, 1000000); break;
            case O_DPP: o.sp.decode_per_prefill = (int32_t) parse_int("--decode-per-prefill", optarg, 0, 1000000); break;
            case O_CKPT: ckpt_mib = parse_int("--ckpt-mib", optarg, 1, 4096); break;
            case O_GROW: grow_mib = parse_int("--grow-mib", optarg, 0, 1024); break;
            case O_POOL:
                if (strcmp(optarg, "on") == 0) {
                    o.pool = true;
                } else if (strcmp(optarg, "off") == 0) {
                    o.pool = false;
                } else {
                    usage_error("--pool takes 'on' or 'off', got '%s'", optarg);
                }
                break;
            case O_KEEP: o.sp.n_keep = (int32_t) parse_int("--keep", optarg, 1, 64); break;
            case O_PROMPT: o.sp.n_prompt_tokens = (int32_t) parse_int("--prompt-tokens", optarg, 1, 65536); break;
            case O_DECODE_US: o.decode_us = parse_int("--decode-us", optarg, 0, 10000000); break;
            case O_NOISE: o.noise_threads = (int32_t) parse_int("--noise-threads", optarg, 0, 16); break;
            case O_TRUTH:
                if (optarg[0] == '\0') {
                    usage_error("--truth needs a file name");
                }
                o.truth = optarg;
                break;
            case O_WAIT: o.wait_signal = true; break;
            case O_PAUSE: o.pause_in_checkpoint = true; break;
            case O_MREMAP: o.mremap = true; break;
            case O_EXIT: o.exit_code = (int) parse_int("--exit-code", optarg, 0, 255); break;
            case O_DRAFT: o.sp.draft = true; break;
            case O_REQUEST: o.sp.request_prefills = (int32_t) parse_int("--request-prefills", optarg, 0, 1000000); break;
            case O_HELP: usage(stdout); exit(0);
            case O_GAP: o.gap_us = parse_int("--gap-us", optarg, 0, 10000000); break;
            case O_CHURN: o.thread_churn = (int32_t) parse_int("--thread-churn", optarg, 0, 256); break;
            case O_RESTORE: o.sp.restore_every = (int32_t) parse_int("--restore-every", optarg, 1, 1000000); break;
            case O_SPEC: o.sp.spec = true; break;
            case O_SPEC_STATE: o.sp.spec_state_bytes = (size_t) parse_int("--spec-state-kib", optarg, 1, 1 << 20) << 10; break;
            case O_PROMPT_SAVE: o.sp.prompt_save = true; break;
            case O_PROMPT_SAVE_INLINED: o.sp.prompt_save_inlined = true; break;
            case O_CUDA_DST: {
                static const char * const modes[] = {"pageable", "fresh", "pinned", "cycle"};
                for (int m = 0; m < 4; m++) {
                    if (strcmp(optarg, modes[m]) == 0) {
                        o.cuda_dst = m;
                    }
                }
                if (o.cuda_dst < 0) {
                    usage_error("--cuda-dst takes pageable, fresh, pinned or cycle, got '%s'", optarg);
                }
                break;
            }
            case O_CUDA_TENSORS: o.cuda_tensors = (int32_t) parse_int("--cuda-tensors", optarg, 1, 4096); break;
            case O_CUDA_API:
                if (strcmp(optarg, "runtime") == 0 || strcmp(optarg, "driver") == 0) {
                    o.cuda_driver_api = strcmp(optarg, "driver") == 0;
                } else {
                    usage_error("--cuda-api takes runtime or driver, got '%s'", optarg);
                }
                break;
            case O_POOL_CAP: o.pool_cap_mib = parse_int("--pool-cap-mib", optarg, 0, 1 << 20); break;
            case O_POOL_COUNT: o.pool_count = parse_int("--pool-count", optarg, 0, 1 << 20); break;
            case O_POOL_TRIM: o.pool_trim_idle_ms = parse_int("--pool-trim-idle-ms", optarg, 0, 1000000); break;
            case O_SLOT_FILE: o.sp.slot_file = optarg; break;
            case O_FILL: {
                o.fill = -1;
                for (int m = 0; m < 4; m++) {
                    if (strcmp(optarg, SAMPLE_FILL_NAMES[m]) == 0) {
                        o.fill = m;
                    }
                }
                if (o.fill < 0) {
                    usage_error("--fill takes zero, none, touch or half, got '%s'", optarg);
                }
                break;
            }
            case ':': usage_error("%s needs a value", argv[optind - 1]);
            default: usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) {
        usage_error("unexpected argument '%s'", argv[optind]);
    }
    if (o.fill != SAMPLE_FILL_ZERO && o.pool) {
        usage_error("--fill %s needs --pool off (a buffer made without the fill is never pooled)",
                    SAMPLE_FILL_NAMES[o.fill]);
    }
#ifndef SAMPLE_CUDA
    if (o.cuda_dst >= 0 || o.cuda_tensors || o.cuda_driver_api >= 0) {
        usage_error("--cuda-dst, --cuda-tensors and --cuda-api need the CUDA build (ckpt-workload-cuda)");
    }
#endif
#ifndef SAMPLE_UPSTREAM
    if (o.sp.restore_every || o.sp.spec || o.sp.spec_state_bytes || o.sp.prompt_save || o.sp.prompt_save_inlined ||
        o.sp.slot_file) {
        usage_error("--restore-every, --spec, --spec-state-kib, --prompt-save(-inlined) and --slot-file need the "
                    "upstream build (ckpt-workload-upstream)");
    }
#endif
    if (o.sp.n_slots * o.sp.n_prompt_tokens > 1 << 20) {
        usage_error("--slots times --prompt-tokens must be at most 1048576");
    }
    o.sp.ckpt_bytes = (size_t) ckpt_mib << 20;
    o.sp.grow_bytes = (size_t) grow_mib << 20;
    const size_t max_bytes = server_context_impl::max_state_bytes(o.sp, o.iterations);
    if (max_bytes > ((size_t) 16 << 30)) {
        usage_error("checkpoints would grow to %zu MiB; lower --grow-mib or --iterations", max_bytes >> 20);
    }
    if (ckpt_mib <= 32) {
        fprintf(stderr, "%s: warning: checkpoints of %lld MiB are not above glibc's 32 MiB mmap threshold, "
                        "so freed buffers may be reused from the heap\n", prog, (long long) ckpt_mib);
    }
    return o;
}

// Noise: the same resize (through the same _M_default_append) and the same state copy, on other
// threads and outside update_tgt(), so a tracer that does not nest by thread counts them.
struct noise {
    std::atomic<bool> stop{false};
    std::atomic<int64_t> calls{0};
    std::atomic<int32_t> started{0};
};

static void noise_loop(noise * n, llama_context * ctx) {
    bool first = true;
    while (!n->stop.load()) {
        std::vector<uint8_t> v;
        // The main thread grows the state (--grow-mib) and shrinks it (--request-prefills) between
        // our size and copy calls: the copy then fails (0, buffer too small) or copies less. Size
        // again and retry, as a caller of llama.cpp would; fail only if the size did not move.
        for (;;) {
            const size_t size = llama_state_seq_get_size_ext(ctx, 0, 0);
            sample_grow(v, size);
            const size_t got = llama_state_seq_get_data_ext(ctx, v.data(), size, 0, 0);
            if (got != 0 && got <= size) {
                break;
            }
            if (llama_state_seq_get_size_ext(ctx, 0, 0) == size) {
                abort();
            }
        }
        n->calls++;
        if (first) {
            n->started++;
            first = false;
        }
        usleep(2000);
    }
}

// The same work on pages that are already resident: zero, then copy the state into, `bytes` of a
// buffer touched long before, timed on the thread's CPU clock. Called between update_slots() calls
// with plain memset/memcpy, so no probe is inside. span CPU - this = what the fresh pages cost.
struct resident_reference {
    int64_t fill_cpu_ns = 0;
    int64_t copy_cpu_ns = 0;
};

static resident_reference measure_resident(uint8_t * scratch, const uint8_t * state, size_t bytes) {
    resident_reference r;
    const int64_t c0 = thread_cpu_ns();
    memset(scratch, 0, bytes);
    __asm__ volatile("" : : "r"(scratch) : "memory");  // the zeroing is not dead to the compiler
    const int64_t c1 = thread_cpu_ns();
    memcpy(scratch, state, bytes);
    __asm__ volatile("" : : "r"(scratch) : "memory");
    const int64_t c2 = thread_cpu_ns();
    r.fill_cpu_ns = c1 - c0;
    r.copy_cpu_ns = c2 - c1;
    return r;
}

static void write_checkpoint(FILE * f, const server_checkpoint_truth & c, const resident_reference & r) {
    const common_checkpoint_truth & t = c.t;
    fprintf(f,
            "{\"type\":\"checkpoint\",\"iter\":%lld,\"slot\":%d,\"tid\":%d,\"bytes\":%zu,\"draft\":%s,"
            "\"start_ns\":%lld,\"end_ns\":%lld,\"cpu_ns\":%lld,\"fill_start_ns\":%lld,\"fill_ns\":%lld,"
            "\"fill_cpu_ns\":%lld,\"copy_start_ns\":%lld,\"copy_ns\":%lld,\"copy_cpu_ns\":%lld,"
            "\"fill_faults\":%lld,\"copy_faults\":%lld,\"pool_hit\":%s,\"spec\":%s,"
            "\"resident_fill_cpu_ns\":%lld,\"resident_copy_cpu_ns\":%lld,\"buffer\":\"%s\",\"touch_faults\":%lld,"
            "\"dst\":%llu",
            (long long) c.iter, c.slot, t.tid, t.bytes, c.draft ? "true" : "false", (long long) t.start_ns,
            (long long) t.end_ns, (long long) t.cpu_ns, (long long) t.fill_start_ns, (long long) t.fill_ns,
            (long long) t.fill_cpu_ns, (long long) t.copy_start_ns, (long long) t.copy_ns, (long long) t.copy_cpu_ns,
            (long long) t.fill_faults, (long long) t.copy_faults, t.pool_hit ? "true" : "false",
            c.spec ? "true" : "false", (long long) r.fill_cpu_ns, (long long) r.copy_cpu_ns,
            SAMPLE_BUFFER_NAMES[t.buffer], (long long) t.touch_faults, (unsigned long long) t.dst);
#ifdef SAMPLE_CUDA
    fprintf(f, ",\"cuda_dst\":\"%s\"", SAMPLE_CUDA_DST_NAMES[t.cuda_dst]);  // where the copy went
#endif
    fputs("}\n", f);
    fflush(f);
}

// A restore, prompt save, speculative state or create_checkpoint call, as the call measured it.
static void write_state(FILE * f, const server_state_truth & s) {
    const common_restore_truth & t = s.t;
    fprintf(f,
            "{\"type\":\"%s\",\"iter\":%lld,\"slot\":%d,\"tid\":%d,\"bytes\":%zu,\"start_ns\":%lld,"
            "\"end_ns\":%lld,\"cpu_ns\":%lld,\"copy_start_ns\":%lld,\"copy_ns\":%lld,\"copy_cpu_ns\":%lld,"
            "\"faults\":%lld,\"evictions\":%d}\n",
            s.type, (long long) s.iter, s.slot, t.tid, t.bytes, (long long) t.start_ns, (long long) t.end_ns,
            (long long) t.cpu_ns, (long long) t.copy_start_ns, (long long) t.copy_ns, (long long) t.copy_cpu_ns,
            (long long) t.faults, s.evictions);
    fflush(f);
}

// Memory after an iteration: what the checkpoints and the pool hold (buffer capacities, the
// bytes a tracer sees mapped, less glibc's page of chunk header each) and the resident set from
// /proc/self/statm, the figures `ckptrace analyze` reports as held and RSS.
static void write_memory(FILE * f, const server_context_impl & srv, int64_t iter) {
    size_t held = 0, buffers = 0;
    for (const auto & slot : srv.slots) {
        for (const auto & c : slot.checkpoints) {
            for (const auto * v : {&c.data_tgt, &c.data_dft}) {
                held += v->capacity();
                buffers += v->capacity() > 0;
            }
        }
    }
    const common_state_buffer_pool_stats ps = common_state_buffer_pool::instance().stats();
    long pages = 0, resident = 0;
    FILE * statm = fopen("/proc/self/statm", "r");
    if (statm == nullptr || fscanf(statm, "%ld %ld", &pages, &resident) != 2) {
        resident = -1;
    }
    if (statm != nullptr) {
        fclose(statm);
    }
    fprintf(f,
            "{\"type\":\"memory\",\"iter\":%lld,\"t_ns\":%lld,\"held_bytes\":%zu,\"held_buffers\":%zu,"
            "\"pool_bytes\":%zu,\"pool_buffers\":%zu,\"rss_bytes\":%lld}\n",
            (long long) iter, (long long) now_ns(), held + ps.bytes_held, buffers + ps.n_held, ps.bytes_held,
            ps.n_held, resident < 0 ? -1LL : (long long) resident * sysconf(_SC_PAGESIZE));
    fflush(f);
}

static void write_iteration(FILE * f, const server_iteration_truth & it) {
    fprintf(f,
            "{\"type\":\"iteration\",\"iter\":%lld,\"kind\":\"%s\",\"start_ns\":%lld,\"end_ns\":%lld,"
            "\"cpu_ns\":%lld,\"checkpoints\":%d,\"tokens\":%d,\"prompt_tokens\":%d,\"tid\":%d}\n",
            (long long) it.iter, it.prefill ? "prefill" : "decode", (long long) it.start_ns, (long long) it.end_ns,
            (long long) it.cpu_ns, it.n_checkpoints, it.n_tokens, it.n_prompt_tokens, it.tid);
    fflush(f);
}

// --mremap: one mapping grown in place or moved, so a tracer's mremap rows can be checked.
static void grow_a_mapping(FILE * truth) {
    const size_t from = (size_t) 1 << 20, to = (size_t) 4 << 20;
    void * p = mmap(nullptr, from, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    const int64_t start = now_ns();
    void * q = p == MAP_FAILED ? MAP_FAILED : mremap(p, from, to, MREMAP_MAYMOVE);
    const int64_t end = now_ns();
    if (q == MAP_FAILED) {
        fprintf(stderr, "%s: mmap/mremap failed: %s\n", prog, strerror(errno));
        exit(1);
    }
    if (truth) {
        fprintf(truth, "{\"type\":\"mremap\",\"tid\":%d,\"addr\":%llu,\"bytes\":%zu,\"start_ns\":%lld,\"end_ns\":%lld}\n",
                (int) syscall(SYS_gettid), (unsigned long long) (uintptr_t) q, to, (long long) start, (long long) end);
        fflush(truth);
    }
    munmap(q, to);
}

// --thread-churn: threads that live for one mmap/munmap each, so a tracer's per-thread state
// must be freed when they exit (their mmap makes them known to it). All N have mapped before any
// unmaps and exits: N + 1 threads are known to the tracer at once, every iteration.
static void churn_threads(int32_t n) {
    std::atomic<int32_t> mapped{0};
    std::vector<std::thread> ts;
    for (int32_t i = 0; i < n; i++) {
        ts.emplace_back([&mapped, n] {
            void * p = mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            mapped++;
            while (mapped.load() < n) {
                usleep(100);
            }
            if (p != MAP_FAILED) {
                munmap(p, 1 << 16);
            }
        });
    }
    for (auto & t : ts) {
        t.join();
    }
}

static double median(std::vector<int64_t> v) {
    if (v.empty()) {
        return 0.0;
    }
    std::sort(v.begin(), v.end());
    const size_t m = v.size() / 2;
    return v.size() % 2 ? (double) v[m] : (v[m - 1] + v[m]) / 2.0;
}

#ifdef SAMPLE_BACKEND_DL
#define SAMPLE_CUDA_DL_DEFINE(f) decltype(sample_dl_##f) sample_dl_##f;
SAMPLE_CUDA_DL_FUNCTIONS(SAMPLE_CUDA_DL_DEFINE)
#undef SAMPLE_CUDA_DL_DEFINE

// As ggml_backend_load_all() in a GGML_BACKEND_DL build (llama.cpp's official images): the backend
// is a library in the executable's folder, dlopen'ed at start; the CUDA libraries it needs are
// mapped only then, and the CUDA calls (cuda/cuda_dl.h) reach them through it.
static void load_backend() {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    std::string dir = n > 0 ? std::string(exe, (size_t) n) : std::string("./x");
    std::string path = dir.substr(0, dir.rfind('/')) + "/libggml-cuda.so";
    void * h = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (h == nullptr) {
        fprintf(stderr, "%s: error: cannot load the backend %s: %s\n", prog, path.c_str(), dlerror());
        exit(2);
    }
#define SAMPLE_CUDA_DL_BIND(f) \
    if ((*(void **) &sample_dl_##f = dlsym(h, #f)) == nullptr) { \
        fprintf(stderr, "%s: error: the backend %s has no %s\n", prog, path.c_str(), #f); \
        exit(2); \
    }
    SAMPLE_CUDA_DL_FUNCTIONS(SAMPLE_CUDA_DL_BIND)
#undef SAMPLE_CUDA_DL_BIND
}
#endif

int main(int argc, char ** argv) {
    const options o = parse_options(argc, argv);

    FILE * truth = nullptr;
    if (!o.truth.empty()) {
        truth = fopen(o.truth.c_str(), "w");
        if (truth == nullptr) {
            fprintf(stderr, "%s: error: cannot write --truth %s: %s\n", prog, o.truth.c_str(), strerror(errno));
            return 2;
        }
    }

    // Blocked before any thread starts, so only sigwait() below takes it.
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    if (o.wait_signal || o.pause_in_checkpoint) {
        pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
    }
    common_checkpoint_pause_first(o.pause_in_checkpoint);
    common_checkpoint_fill(o.fill);

    auto & pool = common_state_buffer_pool::instance();
    pool.set_enabled(o.pool);
    pool.set_caps(o.pool_cap_mib >= 0 ? (size_t) o.pool_cap_mib << 20 : pool.byte_cap(), (size_t) o.pool_count);

    const size_t max_bytes = server_context_impl::max_state_bytes(o.sp, o.iterations);
#ifdef SAMPLE_BACKEND_DL
    load_backend();
#endif
    llama_context * ctx = sample_llama_init(o.sp.n_slots, max_bytes, o.decode_us);
#ifdef SAMPLE_CUDA
    common_checkpoint_cuda_dst(o.cuda_dst >= 0 ? o.cuda_dst : SAMPLE_CUDA_PAGEABLE);
    if (o.cuda_tensors) {
        sample_llama_set_cuda_tensors(ctx, o.cuda_tensors);
    }
    sample_llama_set_cuda_driver_api(ctx, o.cuda_driver_api == 1);
#endif
    // The resident reference's buffer: touched (non-zero, so no shared zero page) and kept in.
    std::vector<uint8_t> scratch;
    if (truth) {
        scratch.assign(max_bytes, 0xa5);
        mlock(scratch.data(), scratch.size());
    }
    auto * srv = new server_context_impl(ctx, o.sp);

    if (o.wait_signal) {
        fprintf(stderr, "ready pid=%d\n", (int) getpid());
        int sig = 0;
        sigwait(&usr1, &sig);
    }

    if (o.mremap) {
        grow_a_mapping(truth);
    }

    noise nz;
    std::vector<std::thread> noise_threads;
    for (int32_t i = 0; i < o.noise_threads; i++) {
        noise_threads.emplace_back(noise_loop, &nz, ctx);
    }
    // Each noise thread has done one full round before the first checkpoint.
    while (nz.started.load() < o.noise_threads) {
        usleep(1000);
    }

    int64_t n_ckpt = 0, n_prefill = 0, n_hits = 0;
    size_t bytes_first = 0;
    std::vector<int64_t> fill_ns, copy_ns, faults;
    const int64_t f0 = thread_faults();
    const int64_t t0 = now_ns();
    for (int64_t i = 0; i < o.iterations; i++) {
        srv->update_slots();
        const auto & it = srv->last_iteration;
        n_prefill += it.prefill;
        for (const auto & c : srv->last_checkpoints) {
            if (!c.draft) {
                n_ckpt++;
                if (bytes_first == 0) {
                    bytes_first = c.t.bytes;
                }
            }
            n_hits += c.t.pool_hit;
            fill_ns.push_back(c.t.fill_ns);
            copy_ns.push_back(c.t.copy_ns);
            faults.push_back(c.t.fill_faults + c.t.copy_faults);
            if (truth) {
                write_checkpoint(truth, c, measure_resident(scratch.data(), sample_llama_state(ctx, c.slot), c.t.bytes));
            }
        }
        if (truth) {
            for (const auto & st : srv->last_states) {
                write_state(truth, st);
            }
            write_iteration(truth, it);
            write_memory(truth, *srv, it.iter);
        }
        churn_threads(o.thread_churn);
        int64_t gap = o.gap_us;
        if (o.pool_trim_idle_ms >= 0 && gap >= o.pool_trim_idle_ms * 1000) {  // idle long enough: trim
            usleep((useconds_t) (o.pool_trim_idle_ms * 1000));
            pool.trim();
            gap -= o.pool_trim_idle_ms * 1000;
        }
        if (gap) {
            usleep((useconds_t) gap);
        }
    }
    const int64_t wall = now_ns() - t0;
    const int64_t minflt = thread_faults() - f0;

    nz.stop = true;
    for (auto & t : noise_threads) {
        t.join();
    }

    delete srv;  // the last checkpoints go to the pool (when on), which trim() then frees
    const common_state_buffer_pool_stats ps = pool.stats();
    pool.trim();
    sample_llama_free(ctx);

    if (truth) {
        fprintf(truth,
                "{\"type\":\"summary\",\"checkpoints\":%lld,\"iterations\":%lld,\"prefill_iterations\":%lld,"
                "\"pool\":%s,\"fill\":\"%s\",\"slots\":%d,\"keep\":%d,\"draft\":%s,\"ckpt_bytes_first\":%zu,\"grow_bytes\":%zu,"
                "\"wall_ns\":%lld,\"minflt_total\":%lld,\"pool_hits\":%lld,\"pool_hwm\":%zu,"
                "\"pool_byte_cap\":%zu,\"pool_count_cap\":%lld,\"pool_gets\":%lld,\"pool_get_hits\":%lld,"
                "\"pool_accepted\":%lld,\"pool_declined\":%lld,\"pool_evicted\":%lld,\"pool_bytes_hwm\":%zu,"
                "\"pool_trims\":%lld,\"pool_trimmed_bytes\":%zu,\"noise_threads\":%d,\"noise_calls\":%lld,\"pid\":%d,\"exit_code\":%d,"
                "\"churn_threads\":%lld}\n",
                (long long) n_ckpt, (long long) o.iterations, (long long) n_prefill, o.pool ? "true" : "false", SAMPLE_FILL_NAMES[o.fill],
                o.sp.n_slots, o.sp.n_keep, o.sp.draft ? "true" : "false", bytes_first, o.sp.grow_bytes,
                (long long) wall, (long long) minflt, (long long) n_hits, ps.n_hwm, pool.byte_cap(),
                (long long) o.pool_count, (long long) (ps.hits + ps.misses), (long long) ps.hits,
                (long long) ps.accepted, (long long) ps.declined, (long long) ps.evicted, ps.bytes_hwm,
                (long long) ps.trims, ps.trimmed_bytes, o.noise_threads, (long long) nz.calls.load(), (int) getpid(), o.exit_code,
                (long long) o.thread_churn * o.iterations);
        fclose(truth);
    }
    fprintf(stderr,
            "%s: %lld checkpoints of %.1f MiB in %lld iterations (%lld prefill), pool %s: %lld of %zu updates hit, "
            "median fill %.2f ms, copy %.2f ms, %.0f faults, wall %.3f s\n",
            prog, (long long) n_ckpt, bytes_first / 1048576.0, (long long) o.iterations, (long long) n_prefill,
            o.pool ? "on" : "off", (long long) n_hits, fill_ns.size(), median(fill_ns) / 1e6, median(copy_ns) / 1e6,
            median(faults), wall / 1e9);
    return o.exit_code;
}
