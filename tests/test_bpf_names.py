"""The names both sides share: every BPF program and map the Python side loads, attaches or reads
exists in probes/checkpoint.bpf.c (with its headers, as bcc compiles it), and every program and
map there is used by Python or listed below with the reason it isn't (TRACEPOINT_PROBE programs
are all attached by bpf_runtime.Program at load, so they are used by being there). Read from the source: a
name typed wrong on either side fails here, not at attach time on some target."""
from __future__ import annotations

import re
from pathlib import Path

from ckptrace.probes import bpf_compile, drain, loader

PROBES = Path(loader.__file__).parent
# The modules that hold the loaded program: the loader, the drain of a recording, the live session.
PYTHON = [PROBES / "loader.py", PROBES / "drain.py", PROBES.parent / "live" / "session.py"]

# Maps only the kernel side reads: no Python use expected.
KERNEL_ONLY_MAPS = {
    "zero_state": "a zeroed struct tstate that state_of copies (too big for the BPF stack)",
    "armed_fault": "per-CPU slot from fault_enter to fault_accounted",
    "rss_by_mm": "resident bytes per mm, kept between kmem:rss_stat events",
    "rss_last": "resident bytes in a process's last row (RSS at defaults)",
    "scratch": "per-CPU buffer for llama_decode's logits flags",
    "token_scratch": "per-CPU buffer for llama_process's tokens",
    "gpu_open": "count of open CUDA destination ranges, a fault's first test",
}
MAP_DECL = re.compile(r"^BPF_[A-Z_]+\((\w+),", re.M)
PROGRAM_DEF = re.compile(r"^int (\w+)\(", re.M)  # top level, not static: a program bcc emits
TRACEPOINT_DEF = re.compile(r"^TRACEPOINT_PROBE\((\w+),\s*(\w+)\)", re.M)


def c_names(text: str) -> tuple[set[str], set[str], set[str]]:
    """(programs, tracepoints as "category:event", maps) declared in the assembled C source."""
    return (set(PROGRAM_DEF.findall(text)), {f"{c}:{e}" for c, e in TRACEPOINT_DEF.findall(text)},
            set(MAP_DECL.findall(text)))


def python_programs() -> set[str]:
    """Every program name the recorder loads or attaches by name."""
    names = {fn for pair in loader.PROGRAMS.values() for fn in pair if fn}
    names |= {fn for pair in loader.GPU_PROGRAMS.values() for fn in pair if fn}
    names |= {loader.GPU_FAULT_PROGRAM, loader.GPU_FAULT_PERF_PROGRAM}
    names |= {fn for _, fn in drain.FAULT_PROGRAMS}
    return names


def python_maps(texts: list[str]) -> set[str]:
    """Every map the Python side indexes: bpf[b"name"], or `for table in (b"a", b"b")`."""
    names = set()
    for text in texts:
        names |= set(re.findall(r'bpf\[b"(\w+)"\]', text))
        for group in re.findall(r"for table in \(([^)]*)\)", text):
            names |= set(re.findall(r'b"(\w+)"', group))
    return names


def python_tracepoints(text: str) -> set[str]:
    """The auto-attached tracepoints the recorder names (to skip them): b"category:event"."""
    return set(re.findall(r'b"(\w+:\w+)"', text))


def mismatches(c_text: str, py_texts: list[str]) -> list[str]:
    """What fails the contract, one line each (empty: the names agree)."""
    programs, tracepoints, maps = c_names(c_text)
    out = [f"program {n} is used by Python, not defined in the C" for n in sorted(python_programs() - programs)]
    out += [f"program {n} is defined in the C, not used by Python" for n in sorted(programs - python_programs())]
    used_maps = python_maps(py_texts)
    out += [f"map {n} is used by Python, not declared in the C" for n in sorted(used_maps - maps)]
    out += [f"map {n} is declared in the C, not used by Python nor listed as kernel-only"
            for n in sorted(maps - used_maps - set(KERNEL_ONLY_MAPS))]
    out += [f"map {n} is listed as kernel-only but is used by Python" for n in sorted(used_maps & set(KERNEL_ONLY_MAPS))]
    out += [f"map {n} is listed as kernel-only but not declared" for n in sorted(set(KERNEL_ONLY_MAPS) - maps)]
    out += [f"tracepoint {n} is named by Python, no TRACEPOINT_PROBE in the C"
            for n in sorted(python_tracepoints("\n".join(py_texts)) - tracepoints)]
    return out


def _texts() -> tuple[str, list[str]]:
    return bpf_compile.assemble(loader.BPF_SOURCE), [p.read_text() for p in PYTHON]


def test_every_name_python_uses_is_in_the_c_and_back():
    c_text, py_texts = _texts()
    programs, tracepoints, maps = c_names(c_text)
    assert len(programs) > 30 and len(tracepoints) >= 7 and len(maps) > 15, "has the source's layout changed?"
    assert mismatches(c_text, py_texts) == []


def test_the_check_fails_on_a_name_out_of_step():
    """A program renamed in the C, a map renamed in Python, a map nobody reads: each is caught."""
    c_text, py_texts = _texts()
    renamed = c_text.replace("int ckpt_return(struct pt_regs *ctx)", "int ckpt_returns(struct pt_regs *ctx)")
    assert mismatches(renamed, py_texts) == ["program ckpt_return is used by Python, not defined in the C",
                                             "program ckpt_returns is defined in the C, not used by Python"]
    py_renamed = [t.replace('bpf[b"rss_seed"]', 'bpf[b"rss_seeds"]') for t in py_texts]
    assert mismatches(c_text, py_renamed) == [
        "map rss_seeds is used by Python, not declared in the C",
        "map rss_seed is declared in the C, not used by Python nor listed as kernel-only"]
    extra = c_text + "\nBPF_ARRAY(forgotten, u64, 1);\n"
    assert mismatches(extra, py_texts) == ["map forgotten is declared in the C, not used by Python nor listed as kernel-only"]
    no_tp = c_text.replace("TRACEPOINT_PROBE(kmem, rss_stat)", "TRACEPOINT_PROBE(kmem, rss_stat_x)")
    assert mismatches(no_tp, py_texts) == ["tracepoint kmem:rss_stat is named by Python, no TRACEPOINT_PROBE in the C"]


def test_every_event_is_reserved_zeroed_through_one_function():
    """reserve_event clears what it reserves; a row reserved elsewhere would ship stale bytes."""
    c_text, _ = _texts()
    assert c_text.count("ringbuf_reserve(") == 1 and "perf_submit" not in c_text and "PERF_OUTPUT" not in c_text
    body = c_text[c_text.index("static __always_inline struct ckpt_event *reserve_event(void)"):]
    body = body[:body.index("\n}\n")]
    assert "ringbuf_reserve(" in body and "__builtin_memset(e, 0, sizeof(*e));" in body
    assert c_text.count("ringbuf_submit(") == 1  # submit_event: every reserved event goes out through it
