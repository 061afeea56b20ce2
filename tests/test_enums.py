"""The kernel's enums (probes/checkpoint.h) and their Python copies agree, name for name."""
from __future__ import annotations

import re
from pathlib import Path

from ckptrace.probes import drain, loader
from ckptrace.core.trace import KINDS, PHASES

HEADER = Path(loader.__file__).with_name("checkpoint.h")


def c_enum(name: str) -> dict[str, int]:
    """Enumerator -> value of `enum name { ... }` in the header (implicit values counted on)."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", "", HEADER.read_text(), flags=re.S)
    body = re.search(rf"\benum\s+{name}\s*\{{(.*?)\}}", text, re.S)
    assert body, f"no enum {name} in {HEADER.name}"
    out, value = {}, -1
    for item in filter(None, (x.strip() for x in body.group(1).split(","))):
        m = re.fullmatch(r"(\w+)(?:\s*=\s*(\d+))?", item)
        assert m, f"enum {name}: can't read {item!r}"
        value = int(m.group(2)) if m.group(2) else value + 1
        out[m.group(1)] = value
    return out


def names_in_order(enum: dict[str, int], prefix: str) -> list[str]:
    items = sorted((v, k) for k, v in enum.items() if k.startswith(prefix))
    assert [v for v, _ in items] == list(range(len(items))), f"{prefix}* values are not 0..n-1"
    return [k.removeprefix(prefix).lower() for _, k in items]


def test_kinds_are_the_kernel_row_kinds():
    assert KINDS == names_in_order(c_enum("ckpt_kind"), "K_")


def test_phases_are_the_kernel_phases():
    assert PHASES == names_in_order(c_enum("ckpt_phase"), "P_")


def test_recorder_counter_and_kind_indices_match_the_header():
    counters, kinds = c_enum("ckpt_counter"), c_enum("ckpt_kind")
    python = {k: v for m in (loader, drain) for k, v in vars(m).items() if re.fullmatch(r"[CK]_[A-Z_]+", k)}
    assert {"C_LOST", "C_PARTIAL", "C_ABANDONED", "K_CHECKPOINT", "K_ITERATION"} <= set(python)
    for name, value in python.items():
        assert value == {**counters, **kinds}.get(name), name
    assert max(v for k, v in python.items() if k.startswith("C_")) < counters["N_COUNTERS"]


def test_recorder_target_flags_match_the_header():
    flags = c_enum("ckpt_target_flag")
    python = {k: v for k, v in vars(loader).items() if re.fullmatch(r"TARGET_[A-Z_]+", k)}
    assert python == flags


def test_cpu_unknown_is_the_recorders():
    """A span's cpu_ns the probe found wrong (checkpoint.bpf.c) is the value the recorder nulls."""
    text = "".join(p.read_text() for p in sorted(HEADER.parent.glob("*.[ch]")))
    m = re.search(r"#define\s+CPU_UNKNOWN\s+(0x[0-9a-fA-F]+)ULL", text)
    assert m and int(m.group(1), 16) == drain.CPU_UNKNOWN
