"""What each BPF program the recorder attaches costs per hit on this host, and per checkpoint.

A small C program (compiled here) makes hits in a timed loop on its own thread CPU clock: calls of
a function (a uprobe, a uretprobe, or both), mmap + munmap of one page (the syscall tracepoints),
or first writes to the pages of a fresh anonymous mapping (page faults: kmem:rss_stat,
exceptions:page_fault_user). Each point is measured with no program, with an empty program (the
kernel's own cost of the hook: the uprobe trap, the tracepoint's arguments, rss_stat's sum over
CPUs), and with the recorder's own program from probes/checkpoint.bpf.c (the process in its
`targets` map, so the programs take their real path and emit their rows), interleaved over rounds,
the median per configuration. ns per hit = (loop time with it - loop time with none) / hits.

Hits per checkpoint are counted, not assumed: the sample workload (64 MiB fresh buffers, pool off)
runs under a bpftrace script that counts, for its pid only, every uprobe and uretprobe ckptrace
puts on it and each tracepoint's hits; divided by the checkpoints its truth file reports. Run as
root:

    .venv/bin/python benchmarks/bench_probe_cost.py --rounds 9
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ckptrace.probes import bpf_compile, bpf_runtime, kernel, loader
from ckptrace.probes.record_session import RecordOptions
from ckptrace.probes.targets import Targets
from ckptrace.samples import workload_binary

# bench_sidecar.py beside this script: its folder is on sys.path when run
from bench_sidecar import perf_events

CKPTRACE = Path(sys.executable).with_name("ckptrace")

TRIGGER_C = r"""
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifdef __x86_64__
/* starts with push %rbp, as the probed functions of the sample and of llama.cpp do (a uprobe's
 * cost depends on the instruction it replaces: push is emulated, others single-stepped) */
__asm__(".globl ckpt_hit\n.type ckpt_hit, @function\nckpt_hit:\n push %rbp\n mov %rsp, %rbp\n"
        " pop %rbp\n ret\n.size ckpt_hit, .-ckpt_hit\n");
void ckpt_hit(void);
#else
__attribute__((noinline)) void ckpt_hit(void) { __asm__ volatile("" ::: "memory"); }
#endif

static long long ns(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }

int main(void) {
    char mode[16];
    long n;
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready %d\n", (int) getpid());
    while (scanf("%15s %ld", mode, &n) == 2) {
        long page = sysconf(_SC_PAGESIZE);
        char *buf = NULL;
        if (!strcmp(mode, "faults")) {
            buf = mmap(NULL, n * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            madvise(buf, n * page, MADV_NOHUGEPAGE); /* one fault per page, as the checkpoint's */
        }
        long long w0 = ns(CLOCK_MONOTONIC), c0 = ns(CLOCK_THREAD_CPUTIME_ID);
        if (!strcmp(mode, "calls"))
            for (long i = 0; i < n; i++) ckpt_hit();
        else if (!strcmp(mode, "mmaps"))
            for (long i = 0; i < n; i++) munmap(mmap(NULL, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), page);
        else if (buf)
            for (long i = 0; i < n; i++) buf[i * page] = 1;
        long long c1 = ns(CLOCK_THREAD_CPUTIME_ID), w1 = ns(CLOCK_MONOTONIC);
        if (buf) munmap(buf, n * page);
        printf("%lld %lld\n", w1 - w0, c1 - c0);
    }
    return 0;
}
"""

EMPTY_C = """
int empty_uprobe(void *ctx) { return 0; }
int empty_tracepoint(void *ctx) { return 0; }
int empty_raw(void *ctx) { return 0; }
"""  # one per program type: a loaded program has one

# (name, mode, hits per loop, [(kind, where, recorder program)]): kind is uprobe, uretprobe,
# tracepoint or raw (raw tracepoint); where the function (in the trigger) or the tracepoint.
POINTS = [
    ("uprobe (a span's entry: ckpt_enter_tgt)", "calls", 4000, [("uprobe", "ckpt_hit", "ckpt_enter_tgt")]),
    ("uprobe + uretprobe (a span: ckpt_enter_tgt, ckpt_return, one row)", "calls", 4000,
     [("uprobe", "ckpt_hit", "ckpt_enter_tgt"), ("uretprobe", "ckpt_hit", "ckpt_return")]),
    ("syscalls mmap enter + exit, munmap enter (two rows)", "mmaps", 3000,
     [("tracepoint", "syscalls:sys_enter_mmap", "tracepoint__syscalls__sys_enter_mmap"),
      ("tracepoint", "syscalls:sys_exit_mmap", "tracepoint__syscalls__sys_exit_mmap"),
      ("tracepoint", "syscalls:sys_enter_munmap", "tracepoint__syscalls__sys_enter_munmap")]),
    ("kmem:rss_stat (--rss-per-fault), a traced process's fault", "faults", 16384,
     [("tracepoint", "kmem:rss_stat", "tracepoint__kmem__rss_stat")]),
    ("kmem:rss_stat (--rss-per-fault), another process's fault", "faults", 16384,
     [("tracepoint", "kmem:rss_stat", "tracepoint__kmem__rss_stat")]),
    ("exceptions:page_fault_user (CUDA targets' gpu_fault, no range open)", "faults", 16384,
     [("tracepoint", "exceptions:page_fault_user", "gpu_fault")]),
    ("legacy --fault-sample interval (raw page_fault_user + rss_stat), outside a checkpoint", "faults", 16384,
     [("raw", "page_fault_user", "fault_enter"), ("raw", "rss_stat", "fault_accounted")]),
]


def others_hooks(seen: dict[str, int] | None = None) -> dict[str, int]:
    """Programs other processes hold on tracepoints now (the most seen, with `seen`): they run in
    every loop, the one with no program of ours too, so their cost is in the base, not ours."""
    p = subprocess.run(["bpftool", "-j", "perf", "list"], capture_output=True, text=True)
    now: dict[str, int] = {}
    for e in json.loads(p.stdout or "[]"):
        if e["pid"] != os.getpid() and e["fd_type"] in ("tracepoint", "raw_tracepoint"):
            name = e.get("tracepoint") or e["fd_type"]
            now[name] = now.get(name, 0) + 1
    out = dict(seen or {})
    for k, v in now.items():
        out[k] = max(out.get(k, 0), v)
    return out


class Trigger:
    def __init__(self, exe: Path):
        self.proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = int(self.proc.stdout.readline().split()[1])
        self.exe = exe

    def loop(self, mode: str, n: int) -> tuple[int, int]:
        self.proc.stdin.write(f"{mode} {n}\n")
        self.proc.stdin.flush()
        wall, cpu = self.proc.stdout.readline().split()
        return int(wall), int(cpu)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


def func_offset(exe: Path, name: str) -> int:
    """File offset of a function in the trigger (non-PIE: vaddr - segment vaddr + segment offset)."""
    from elftools.elf.elffile import ELFFile

    with open(exe, "rb") as f:
        elf = ELFFile(f)
        sym = next(s for s in elf.get_section_by_name(".symtab").iter_symbols() if s.name == name)
        addr = sym["st_value"]
        seg = next(s for s in elf.iter_segments() if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1
                   and s["p_vaddr"] <= addr < s["p_vaddr"] + s["p_memsz"])
        return addr - seg["p_vaddr"] + seg["p_offset"]


def attach(prog, exe: Path, pid: int, probes: list, empty: bool) -> list:
    done = []
    for kind, where, fn in probes:
        name = f"empty_{kind.replace('uretprobe', 'uprobe')}".encode() if empty else fn.encode()
        if kind in ("uprobe", "uretprobe"):
            off = func_offset(exe, where)
            (prog.attach_uprobe if kind == "uprobe" else prog.attach_uretprobe)(str(exe), off, name, pid=pid)
            done.append((kind, (str(exe), off, pid)))
        elif kind == "tracepoint":
            prog.attach_tracepoint(where.encode(), name)
            done.append((kind, where.encode()))
        else:
            prog.attach_raw_tracepoint(where.encode(), name)
            done.append((kind, where.encode()))
    return done


def detach(prog, done: list) -> None:
    for kind, what in done:
        if kind == "uprobe":
            prog.detach_uprobe(*what)
        elif kind == "uretprobe":
            prog.detach_uretprobe(*what)
        elif kind == "tracepoint":
            prog.detach_tracepoint(what)
        else:
            prog.detach_raw_tracepoint(what)


def recorder_program(per_fault: bool):
    """The recorder's program as record builds it (defaults, or --rss-per-fault), with no
    tracepoint attached yet; its ring buffer read (and dropped) between loops."""
    opts = RecordOptions(output=Path("/dev/null"), rss_per_fault=per_fault)
    prog = loader.load_program(Targets([]), opts, preload=False)
    for tp in list(prog.tracepoints):
        prog.detach_tracepoint(tp)
    prog[b"events"].open_ring_buffer(lambda ctx, data, size: 0)
    return prog


def empty_program(tmp: Path):
    src = tmp / "empty.bpf.c"
    src.write_text(EMPTY_C)
    return bpf_runtime.Program(bpf_compile.compiled(src, [], kernel.kernel_headers_dir()))


def measure(rounds: int, tmp: Path, others: dict[str, int]) -> list[dict]:
    exe = tmp / "trigger"
    (tmp / "trigger.c").write_text(TRIGGER_C)
    subprocess.run(["cc", "-O2", "-no-pie", "-o", str(exe), str(tmp / "trigger.c")], check=True)
    progs = {"recorder": recorder_program(False), "per_fault": recorder_program(True), "empty": empty_program(tmp)}
    trig = Trigger(exe)
    out = []
    try:
        for name, mode, n, probes in POINTS:
            per_fault = "rss_stat" in name and "legacy" not in name
            real = progs["per_fault" if per_fault else "recorder"]
            target = "another process" not in name
            times = {"none": [], "empty": [], "program": []}
            for r in range(rounds):
                others.update(others_hooks(others))
                order = list(times)[r % 3:] + list(times)[:r % 3]
                for config in order:
                    prog = progs["empty"] if config == "empty" else real
                    if config == "program" and target:
                        real[b"targets"][ctypes.c_uint32(trig.pid)] = ctypes.c_uint32(loader.TARGET_TRACED)
                    done = [] if config == "none" else attach(prog, exe, trig.pid, probes, config == "empty")
                    try:
                        times[config].append(trig.loop(mode, n))
                    finally:
                        detach(prog, done)
                        real.ring_buffer_consume()
                        try:
                            del real[b"targets"][ctypes.c_uint32(trig.pid)]
                        except KeyError:
                            pass
            med = {c: {k: statistics.median(t[i] for t in v) / n for i, k in enumerate(("wall", "cpu"))}
                   for c, v in times.items()}
            out.append({"point": name, "hits_per_loop": n, "ns_per_hit_none_cpu": med["none"]["cpu"],
                        "empty_ns": med["empty"]["cpu"] - med["none"]["cpu"],
                        "program_ns": med["program"]["cpu"] - med["none"]["cpu"],
                        "program_over_empty_ns": med["program"]["cpu"] - med["empty"]["cpu"],
                        "wall_program_ns": med["program"]["wall"] - med["none"]["wall"]})
            print(f"  {name}: {out[-1]['program_ns']:.0f} ns per hit ({out[-1]['empty_ns']:.0f} empty)",
                  file=sys.stderr, flush=True)
    finally:
        trig.close()
        for p in progs.values():
            p.cleanup()
    return out


def count_hits(tmp: Path, iterations: int) -> dict:
    """Hits per checkpoint of each probe ckptrace puts on the sample (64 MiB fresh buffers), counted
    by bpftrace for the workload's pid, and its faults."""
    truth = tmp / "hits.jsonl"
    wl = subprocess.Popen([str(workload_binary()), "--wait-signal", "--iterations", str(iterations),
                           "--ckpt-mib", "64", "--pool", "off", "--decode-us", "500", "--truth", str(truth)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    pid = int(wl.stderr.readline().strip().split("=")[1])
    plan = json.loads(subprocess.run([str(CKPTRACE), "symbols", "--pid", str(pid), "--json"], capture_output=True,
                                     text=True, check=True).stdout)
    lines = []
    for p in plan["points"]:
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p["mangled"]) and '"' not in p["object"]:
            for kind in ("uprobe", "uretprobe"):
                lines.append(f'{kind}:"{p["object"]}":{p["mangled"]} /pid == {pid}/ {{ @["{kind} {p["point"]}"] = count(); }}')
    for tp in ("syscalls:sys_enter_mmap", "syscalls:sys_exit_mmap", "syscalls:sys_enter_munmap",
               "syscalls:sys_enter_mremap", "syscalls:sys_exit_mremap", "kmem:rss_stat",
               "exceptions:page_fault_user", "sched:sched_process_exit"):
        lines.append(f'tracepoint:{tp} /pid == {pid}/ {{ @["{tp}"] = count(); }}')
    script = tmp / "hits.bt"
    script.write_text("\n".join(lines) + "\n")
    bt = subprocess.Popen(["bpftrace", "-f", "json", str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True)
    deadline = time.monotonic() + 120
    while perf_events(bt.pid) < len(lines):  # every probe in (one perf event each)
        if bt.poll() is not None or time.monotonic() > deadline:
            bt.kill()
            sys.exit("bench_probe_cost: bpftrace did not attach its probes")
        time.sleep(0.01)
    wl.send_signal(signal.SIGUSR1)
    wl.wait(600)
    bt.send_signal(signal.SIGINT)
    counts = {}
    for line in bt.stdout:
        if not line.strip():
            continue
        doc = json.loads(line)
        if doc.get("type") == "map":
            counts.update(doc["data"].get("@", {}))
    bt.wait(120)
    rows = [json.loads(x) for x in truth.read_text().splitlines()]
    ck = [r for r in rows if r["type"] == "checkpoint" and not r.get("draft")]
    faults = statistics.median(r["fill_faults"] + r["copy_faults"] for r in ck)
    return {"checkpoints": len(ck), "iterations": iterations, "faults_per_checkpoint": faults,
            "checkpoint_cpu_ms": statistics.median(r["cpu_ns"] for r in ck) / 1e6,
            "per_checkpoint": {k: v / len(ck) for k, v in sorted(counts.items())}}




def per_checkpoint(hits: dict, costs: list[dict]) -> list[dict]:
    """Each program's cost per 64 MiB fresh checkpoint: its ns per hit times its hits there (POINTS'
    order: entry, span, syscalls, rss_stat, rss_stat of another process, gpu_fault, legacy)."""
    h = hits["per_checkpoint"]
    entry, pair = costs[0], costs[1]
    uprobes = sum(v for k, v in h.items() if k.startswith("uprobe "))
    uretprobes = sum(v for k, v in h.items() if k.startswith("uretprobe "))
    sys_hits = sum(h.get(k, 0) for k in ("syscalls:sys_enter_mmap", "syscalls:sys_exit_mmap",
                                          "syscalls:sys_enter_munmap", "syscalls:sys_enter_mremap",
                                          "syscalls:sys_exit_mremap"))
    faults = h.get("exceptions:page_fault_user", hits["faults_per_checkpoint"])
    rss_hits = h.get("kmem:rss_stat", 0)
    sysc, rss, gpu, legacy = costs[2], costs[3], costs[5], costs[6]

    def row(program, hook, n, vs_none, vs_empty, when):
        return {"program": program, "hook": hook, "hits_per_checkpoint": n, "ns_per_hit": vs_none,
                "ns_per_hit_over_empty": vs_empty, "us_per_checkpoint": n * vs_none / 1e3, "attached": when}
    return [
        row("span entries (ckpt_enter_tgt measured)", "uprobe", uprobes, entry["program_ns"],
            entry["program_over_empty_ns"], "always"),
        row("span returns (ckpt_return measured)", "uretprobe", uretprobes, pair["program_ns"] - entry["program_ns"],
            pair["program_over_empty_ns"] - entry["program_over_empty_ns"], "always"),
        row("mmap/munmap/mremap (per tracepoint hit)", "syscalls tracepoints", sys_hits, sysc["program_ns"] / 3,
            sysc["program_over_empty_ns"] / 3, "always"),
        row("rss_stat", "kmem:rss_stat", rss_hits, rss["program_ns"], rss["program_over_empty_ns"],
            "--rss-per-fault"),
        row("gpu_fault", "exceptions:page_fault_user", faults, gpu["program_ns"], gpu["program_over_empty_ns"],
            "CUDA targets"),
        row("fault_enter + fault_accounted", "raw page_fault_user + rss_stat", faults, legacy["program_ns"],
            legacy["program_over_empty_ns"], "--fault-sample"),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--iterations", type=int, default=12, help="of the workload whose hits are counted")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not shutil.which("bpftrace"):
        sys.exit("bench_probe_cost: bpftrace is not installed (it counts the hits): apt-get install bpftrace")
    load0 = os.getloadavg()
    others = others_hooks()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        hits = count_hits(tmp, args.iterations)
        costs = measure(args.rounds, tmp, others)
    load1 = os.getloadavg()
    uname = os.uname()
    result = {"host": f"{uname.nodename} Linux {uname.release} {uname.machine}, {os.cpu_count()} CPUs",
              "loadavg_before": load0, "loadavg_after": load1, "rounds": args.rounds, "hits": hits, "costs": costs,
              "others_hooks": others, "per_checkpoint": per_checkpoint(hits, costs)}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"host: {result['host']}; load average before {load0[0]:.2f}, after {load1[0]:.2f}")
    print(f"64 MiB fresh checkpoint: {hits['faults_per_checkpoint']:.0f} faults; hits per checkpoint "
          f"({hits['checkpoints']} checkpoints):")
    for k, v in hits["per_checkpoint"].items():
        print(f"  {k}: {v:.2f}")
    print("ns per hit on the thread's CPU clock (median of rounds): none | empty program | recorder's program")
    for c in costs:
        print(f"  {c['point']}: base {c['ns_per_hit_none_cpu']:.0f} | +{c['empty_ns']:.0f} | +{c['program_ns']:.0f}")
    if others:
        print("other processes' programs on tracepoints meanwhile (the most seen; they ran in every "
              "loop, the base too): "
              + ", ".join(f"{k} {v}" for k, v in sorted(others.items())))
    print(f"per 64 MiB fresh checkpoint (untraced {hits['checkpoint_cpu_ms']:.1f} ms of CPU):")
    print("| program | hook | hits per checkpoint | ns per hit (vs none) | ns per hit (vs empty) | "
          "per checkpoint | share | attached |")
    print("|---|---|---|---|---|---|---|---|")
    for r in result["per_checkpoint"]:
        share = r["us_per_checkpoint"] / 1e3 / hits["checkpoint_cpu_ms"]
        print(f"| {r['program']} | {r['hook']} | {r['hits_per_checkpoint']:.2f} | {r['ns_per_hit']:.0f} | "
              f"{r['ns_per_hit_over_empty']:.0f} | {r['us_per_checkpoint']:.1f} us | {share:.2%} | {r['attached']} |")


if __name__ == "__main__":
    main()
