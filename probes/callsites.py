"""Find the calls a function makes to memset (or another named function), by disassembling it
(capstone, x86-64).

Where a compiler inlined the vector growth behind resize() into update_tgt (clang with libc++ at
-O2/-O3 does), no growth function is left to probe, but its zero fill is still a call to memset:
a uprobe on the call instruction sees the fill begin (dst in rdi, bytes in rdx) and one on the
instruction after it sees the fill end. The callee is named the way the dynamic linker binds it:
a PLT stub's GOT slot and its relocation (JUMP_SLOT; GLOB_DAT for -fno-plt calls; IRELATIVE for
a static binary's IFUNC), or a function symbol at a direct call's target. The same finds the
state copy of a prompt save inlined into its caller (symbols.Profile.save_callee)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ckptrace.probes import elfsafe

FILL_CALLEES = ("memset", "__memset_chk")
_EM_X86_64 = "EM_X86_64"
_R_GLOB_DAT, _R_JUMP_SLOT, _R_IRELATIVE = 6, 7, 37  # x86-64 relocation types that fill a GOT slot
_PLT_SCAN = 4  # instructions of a PLT stub read before its jmp *slot (endbr64, bnd, push...)


@dataclass(frozen=True)
class CallSite:
    call: int  # vaddr of the call instruction
    after: int  # vaddr of the instruction after it: where the callee returns to
    callee: str  # as objdump names it: memset@plt, memset


def supported(elf) -> bool:
    return elf["e_machine"] == _EM_X86_64 and elf.elfclass == 64 and elf.little_endian


def calls_to(elf, start: int, size: int, functions: dict[int, str], names=FILL_CALLEES) -> list[CallSite]:
    """The calls to a function of `names` in the function at `start` of `size` bytes, in address
    order. `functions`: address -> name of the object's functions named in `names` (a direct
    call's target, or a static binary's IFUNC resolver). A tail call (jmp memset) is no call
    site: it never returns here. [] on another architecture."""
    if not supported(elf) or size <= 0:
        return []
    from capstone import CS_ARCH_X86, CS_GRP_CALL, CS_MODE_64, Cs
    from capstone.x86 import X86_OP_IMM, X86_OP_MEM, X86_REG_RIP

    md = Cs(CS_ARCH_X86, CS_MODE_64)
    md.detail = True
    code = _read(elf, start, size)
    if code is None:
        return []
    slots: dict[int, list[tuple[int, int]]] = {}  # GOT slot -> [(call, after)]
    direct: list[tuple[int, int, str]] = []
    for insn in md.disasm(code, start):
        if not insn.group(CS_GRP_CALL) or len(insn.operands) != 1:
            continue
        op, after = insn.operands[0], insn.address + insn.size
        if op.type == X86_OP_IMM:
            target = op.imm
            if target in functions:
                direct.append((insn.address, after, functions[target]))
                continue
            slot = _stub_slot(md, elf, target)
            if slot is not None:
                slots.setdefault(slot, []).append((insn.address, after))
        elif op.type == X86_OP_MEM and op.mem.base == X86_REG_RIP and op.mem.index == 0:
            slots.setdefault(after + op.mem.disp, []).append((insn.address, after))  # call *slot(%rip)
    bound = _slot_names(elf, set(slots), functions)
    out = [CallSite(c, a, name) for c, a, name in direct if name in names]
    for slot, calls in slots.items():
        name = bound.get(slot)
        if name in names:
            out += [CallSite(c, a, f"{name}@plt") for c, a in calls]
    return sorted(out, key=lambda s: s.call)


def _read(elf, vaddr: int, size: int) -> bytes | None:
    """`size` bytes at `vaddr` from the executable PT_LOAD holding them (None: not mapped code).
    A function whose symbol claims more than elfsafe.MAX_CODE bytes is a hostile file's."""
    if size > elfsafe.MAX_CODE:
        raise elfsafe.BadObject(f"a function at {vaddr:#x} claims {size} bytes: more than "
                                f"{elfsafe.MAX_CODE // elfsafe.MiB} MiB of code")
    for seg in elf.iter_segments():
        if seg["p_type"] != "PT_LOAD" or not seg["p_flags"] & 1:
            continue
        lo = seg["p_vaddr"]
        if lo <= vaddr and vaddr + size <= lo + seg["p_filesz"]:
            elf.stream.seek(vaddr - lo + seg["p_offset"])
            return elf.stream.read(size)
    return None


def _stub_slot(md, elf, target: int) -> int | None:
    """The GOT slot a PLT stub at `target` jumps through (jmp *slot(%rip)), or None."""
    from capstone import CS_GRP_JUMP
    from capstone.x86 import X86_OP_MEM, X86_REG_RIP

    code = _read(elf, target, 16)
    if code is None:
        return None
    for i, insn in enumerate(md.disasm(code, target)):
        if i >= _PLT_SCAN:
            break
        if insn.group(CS_GRP_JUMP) and len(insn.operands) == 1:
            op = insn.operands[0]
            if op.type == X86_OP_MEM and op.mem.base == X86_REG_RIP and op.mem.index == 0:
                return insn.address + insn.size + op.mem.disp
            return None
    return None


def _slot_names(elf, slots: set[int], functions: dict[int, str]) -> dict[int, str]:
    """GOT slot -> the symbol its relocation binds it to (an IRELATIVE slot: the IFUNC's name)."""
    out: dict[int, str] = {}
    if not slots:
        return out
    for sec in elf.iter_sections():
        if sec["sh_type"] != "SHT_RELA" or sec["sh_entsize"] != 24:
            continue
        data = elfsafe.table(elf, sec, 24)
        rel = np.frombuffer(data, dtype=np.dtype([("off", "<u8"), ("info", "<u8"), ("addend", "<i8")]),
                            count=len(data) // 24)
        keep = np.flatnonzero(np.isin(rel["off"], np.fromiter(slots, dtype=np.uint64)))
        symtab = None
        for k in keep:
            typ, sym = int(rel["info"][k] & 0xFFFFFFFF), int(rel["info"][k] >> 32)
            slot = int(rel["off"][k])
            if typ in (_R_JUMP_SLOT, _R_GLOB_DAT) and sym:
                if symtab is None:
                    symtab = elf.get_section(sec["sh_link"])
                out[slot] = symtab.get_symbol(sym).name.split("@", 1)[0]
            elif typ == _R_IRELATIVE and int(rel["addend"][k]) in functions:
                out[slot] = functions[int(rel["addend"][k])]
    return out
