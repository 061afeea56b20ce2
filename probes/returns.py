"""The return instructions of a probed function (capstone, x86-64), so its end is seen by plain
uprobes instead of a uretprobe.

A uretprobe replaces the function's return address on the stack with the kernel's trampoline,
and C++ unwinding can't find unwind information for that address: an exception thrown through a
function with a uretprobe ends in std::terminate, even when a caller would catch it. A uprobe on
each `ret` of the function changes nothing on the stack. The function's body is its symbol's
range plus GCC's cold parts (`NAME.cold`, the unlikely paths split off); every instruction there
is decoded in order. A function whose end can't be found that way (a tail call: a jump out of
its body, or an indirect jump through memory; another machine; no symbol size) gets None, and
the recorder keeps a uretprobe for it (docs/limits.md)."""
from __future__ import annotations

import numpy as np

from ckptrace.probes import elfsafe

_EM_X86_64 = "EM_X86_64"
_STT_FUNC = 2
MAX_COLD = 16  # cold parts of one function (GCC makes one)


def return_sites(path: str, vaddr: int, mangled: str) -> list[tuple[int, int]] | None:
    """[(vaddr, file offset)] of each return instruction of the function at `vaddr` in `path`
    (its symbol `mangled`), or None where its returns can't all be found statically."""
    f, elf = elfsafe.open_elf(path)
    with f:
        try:
            return _sites(elf, vaddr, mangled)
        except elfsafe.BadObject:
            return None
        except Exception:  # a file that changed since it was resolved, or code capstone can't take
            return None


def _sites(elf, vaddr: int, mangled: str) -> list[tuple[int, int]] | None:
    if elf["e_machine"] != _EM_X86_64 or elf.elfclass != 64 or not elf.little_endian:
        return None
    ranges = _body(elf, vaddr, mangled.split("@", 1)[0])
    if not ranges:
        return None
    from capstone import CS_ARCH_X86, CS_GRP_JUMP, CS_GRP_RET, CS_MODE_64, Cs
    from capstone.x86 import X86_OP_IMM, X86_OP_MEM, X86_REG_RIP

    md = Cs(CS_ARCH_X86, CS_MODE_64)
    md.detail = True
    inside = lambda a: any(lo <= a < hi for lo, hi in ranges)  # noqa: E731
    rets = []
    for lo, hi in ranges:
        code = elfsafe.read_code(elf, lo, hi - lo) if hi - lo <= elfsafe.MAX_CODE else None
        if code is None:
            return None
        end = lo
        for insn in md.disasm(code, lo):
            end = insn.address + insn.size
            if insn.group(CS_GRP_RET):
                rets.append(insn.address)
            elif insn.group(CS_GRP_JUMP) and len(insn.operands) == 1:
                op = insn.operands[0]
                if op.type == X86_OP_IMM and not inside(op.imm):
                    return None  # a tail call (or a jump to code we did not read): it returns elsewhere
                if op.type == X86_OP_MEM and op.mem.base == X86_REG_RIP:
                    return None  # jmp *slot(%rip): a tail call through the GOT
                # jmp *%reg / *(table,%reg,8): a switch's jump table, its targets in this body
        if end < hi and any(b not in (0x90, 0xCC, 0x00) for b in code[end - lo:]):
            return None  # bytes capstone could not decode: we can't say we saw every return
    out = []
    for a in rets:
        off = elfsafe.file_offset(elf, a)
        if off is None:
            return None
        out.append((a, off))
    return out or None


def _body(elf, vaddr: int, name: str) -> list[tuple[int, int]]:
    """[lo, hi) of the function at `vaddr` and of its cold parts (NAME.cold, NAME.cold.1, ...)."""
    symtab = next((s for s in elf.iter_sections() if s["sh_type"] == "SHT_SYMTAB"), None) or \
        next((s for s in elf.iter_sections() if s["sh_type"] == "SHT_DYNSYM"), None)
    if symtab is None:
        return []
    dt = np.dtype([("st_name", "<u4"), ("st_info", "u1"), ("st_other", "u1"), ("st_shndx", "<u2"),
                   ("st_value", "<u8"), ("st_size", "<u8")])
    syms = np.frombuffer(elfsafe.table(elf, symtab, dt.itemsize), dtype=dt)
    funcs = syms[((syms["st_info"] & 0xF) == _STT_FUNC) & (syms["st_shndx"] != 0)]
    size = int(funcs["st_size"][funcs["st_value"] == vaddr].max(initial=0))
    if not size:
        return []
    ranges = [(vaddr, vaddr + size)]
    strtab = elfsafe.table(elf, elf.get_section(symtab["sh_link"]))
    needle = name.encode() + b".cold"
    at, names = 0, []
    while len(names) < MAX_COLD and (at := strtab.find(needle, at)) >= 0:
        if at == 0 or strtab[at - 1] == 0:  # the whole name, not the tail of another
            names.append(at)
        at += len(needle)
    for k in np.flatnonzero(np.isin(funcs["st_name"], np.array(names, dtype="<u4"))) if names else []:
        lo, n = int(funcs["st_value"][k]), int(funcs["st_size"][k])
        if n:
            ranges.append((lo, lo + n))
    return ranges
