"""`ckptrace doctor`: check, one real call at a time, that this machine can record."""
from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import asdict, dataclass
from typing import Callable

import click

from ckptrace.core.errors import CkptraceError, EbpfUnavailable, NotPermitted
from ckptrace.probes import arch, kernel


@dataclass
class Check:
    check: str
    ok: bool
    detail: str
    fix: str = ""


def _run(name: str, fn: Callable[[], str]) -> Check:
    try:
        return Check(name, True, fn())
    except CkptraceError as e:
        return Check(name, False, getattr(e, "what", str(e)), getattr(e, "fix", ""))


def _not_tried(name: str, because: Check) -> Check:
    return Check(name, False, f"not tried: the {because.check} check failed", because.fix)


def _bpf_syscall() -> str:
    kernel.bpf_syscall()
    return "created and closed a BPF array map"


def _tracefs() -> str:
    return f"mounted at {kernel.tracefs_dir()}"


def _uprobes() -> str:
    if kernel.UPROBE_PMU.exists():
        return f"uprobe PMU type {kernel.UPROBE_PMU.read_text().strip()}"
    if kernel.uprobes_supported():
        return "tracefs uprobe_events"
    raise kernel.error_with_fix(EbpfUnavailable, "the kernel has no uprobes",
                        "boot a kernel built with CONFIG_UPROBE_EVENTS=y")


def _tracepoint(category: str, event: str) -> Callable[[], str]:
    def check() -> str:
        if kernel.tracepoint_exists(category, event):
            return "present"
        raise kernel.error_with_fix(EbpfUnavailable, f"{category}:{event} is not in tracefs events",
                            "boot a kernel that has it (syscalls:* need CONFIG_FTRACE_SYSCALLS=y)")
    return check


def _btf() -> str:
    off = kernel.task_struct_offsets()
    sched, note = kernel.sched_offsets()
    # Optional: without them recording works and the CPU/wait columns are 'not recorded'.
    counters = (f"se.sum_exec_runtime +{sched['sum_exec_runtime']}, sched_info.run_delay "
                f"+{sched['run_delay']}" if sched else f"no CPU/wait columns ({note.split(':')[0]})")
    return f"{kernel.BTF_PATH}: task_struct.min_flt +{off['min_flt']}, maj_flt +{off['maj_flt']}; {counters}"


def _bcc() -> str:
    return f"bcc {kernel.bcc_version()} for {sys.executable}"


def _headers() -> str:
    d = kernel.kernel_headers_dir()
    real = d.resolve()
    return f"{d}" + (f" -> {real}" if real != d else "")


def _compile() -> str:
    kernel.compile_trivial()
    return "bcc compiled a trivial program and the kernel loaded it"


def _x86_only(category: str, event: str) -> bool:
    """exceptions:page_fault_user is x86's: elsewhere its absence costs only --fault-sample."""
    return (category, event) == kernel.FAULT_TRACEPOINT and not arch.running().fault_tracepoints


def _raw_tracepoints() -> str:
    names = tuple(n for n in kernel.RAW_TRACEPOINTS
                  if not (n == kernel.FAULT_TRACEPOINT[1] and _x86_only(*kernel.FAULT_TRACEPOINT)))
    kernel.attach_raw_tracepoints(names)
    return "attached " + ", ".join(names)


def run_checks() -> list[Check]:
    """Every check doctor prints, in order. Recording works only if all pass."""
    u = os.uname()
    checks = [Check("kernel", True, f"Linux {u.release} {platform.machine()}")]
    priv = _run("privileges", kernel.privileges)
    checks += [priv, _run("PID namespace", kernel.pid_namespace), _run("bpf() syscall", _bpf_syscall)]
    tracefs = _run("tracefs", _tracefs)
    checks += [tracefs, _run("uprobes", _uprobes)]
    for category, event in kernel.TRACEPOINTS:
        name = f"tracepoint {category}:{event}"
        if _x86_only(category, event) and not (tracefs.ok and kernel.tracepoint_exists(category, event)):
            checks.append(Check(name, True, f"not on {platform.machine()} (x86 only): --fault-sample is "
                                "unavailable; CUDA destination faults come from the page-faults perf event"))
            continue
        checks.append(_run(name, _tracepoint(category, event)) if tracefs.ok
                      else _not_tried(name, tracefs))
    checks.append(_run("BTF", _btf))
    bcc = _run("bcc", _bcc)
    checks += [bcc, _run("kernel headers", _headers)]
    # Loading programs needs both; trying without privileges only adds libbcc noise.
    for name, fn in (("compile", _compile), ("raw tracepoints", _raw_tracepoints)):
        blocker = next((c for c in (priv, bcc) if not c.ok), None)
        checks.append(_not_tried(name, blocker) if blocker else _run(name, fn))
    return checks


def format_check(c: Check) -> str:
    if c.ok:
        return f"ok   {c.check}: {c.detail}"
    return f"FAIL {c.check}: {c.detail}; fix: {c.fix}"


@click.command(epilog="""\b
Examples:
  sudo ckptrace doctor
  sudo ckptrace doctor --json | jq '.checks[] | select(.ok | not)'
""")
@click.option("--json", "as_json", is_flag=True, help="Print {schema_version, checks: [{check, ok, detail, fix}]} as JSON.")
def command(as_json: bool) -> None:
    """Check that this machine can record: privileges, the host's PID namespace, bpf(), tracefs,
    uprobes, each tracepoint the recorder uses, BTF offsets, bcc, kernel headers, and compiling a
    program.

    Prints one line per check, ok or what is wrong and the exact fix. Exits 1 when recording
    can't work.
    """
    checks = run_checks()
    if as_json:
        from ckptrace.renderers.json import versioned

        click.echo(json.dumps(versioned({"checks": [asdict(c) for c in checks]}), indent=2))
    else:
        for c in checks:
            click.echo(format_check(c))
    failed = [c for c in checks if not c.ok]
    if failed:
        first = failed[0]
        cls = NotPermitted if first.check == "privileges" else EbpfUnavailable
        raise cls(f"recording can't work here ({len(failed)} of {len(checks)} checks failed); "
                  f"first: {first.check}: {first.detail}; fix: {first.fix}")
