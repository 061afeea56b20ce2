"""Find the calls a function makes to memset (or another named function), by disassembling it
(capstone; x86-64 and aarch64, the architecture the ELF header names, never the host's).

Where a compiler inlined the vector growth behind resize() into update_tgt (clang with libc++ at
-O2/-O3 does), no growth function is left to probe, but its zero fill is still a call to memset:
a uprobe on the call instruction sees the fill begin (dst in the first argument register, bytes
in the third) and one on the instruction after it sees the fill end. The callee is named the way
the dynamic linker binds it: a PLT stub's GOT slot and its relocation (JUMP_SLOT; GLOB_DAT for
-fno-plt calls; IRELATIVE for a static binary's IFUNC), or a function symbol at a direct call's
target. The same finds the state copy of a prompt save inlined into its caller
(points.Profile.save_callee).

x86-64: `call rel32` (to a PLT stub: `endbr64; bnd jmp *slot(%rip)`) or `call *slot(%rip)`.
aarch64: `bl` (to a PLT stub: `[bti c;] adrp x16, page; ldr x17, [x16, #off]; add; br x17`) or,
-fno-plt, `adrp xN, page; ldr xM, [xN, #off]; blr xM` (PAC: `blraa`/`blraaz`...); every
instruction 4 bytes, a function's `bti c`/`paciasp` entry is no call."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ckptrace.probes import elfsafe

FILL_CALLEES = ("memset", "__memset_chk")
# A hostile file's function can hold millions of calls (a 15 MB one, 3M): the scan stops, and the
# object's call sites are left unprobed with one line, past either bound (docs/security.md).
MAX_CALLS = 1 << 16  # call instructions examined in one function (a real update_tgt: tens)
MAX_SITES = 256  # calls to the named callees kept from one function (a real update_tgt: one or two)
_CHECK_EVERY = 4096  # instructions between checks of the file's read deadline (elfsafe.TIME_S)
_WINDOW = 1 << 14  # bytes of code decoded at once
_LONGEST = 16  # bytes of the longest instruction (x86: 15; aarch64: 4)


@dataclass(frozen=True)
class Arch:
    """What differs between the architectures a call site is found on."""
    machine: str  # as uname -m says it
    glob_dat: int  # relocation types that fill a GOT slot
    jump_slot: int
    irelative: int
    plt_scan: int  # instructions of a PLT stub read before its indirect jump


ARCHES = {
    "EM_X86_64": Arch("x86_64", 6, 7, 37, 4),  # endbr64, bnd, push... before the jmp *slot
    "EM_AARCH64": Arch("aarch64", 1025, 1026, 1032, 6),  # bti c, adrp, ldr, add, (autia1716), br
}
_AARCH64_CALLS = ("bl", "blr", "blraa", "blraaz", "blrab", "blrabz")
_AARCH64_JUMPS = ("br", "braa", "braaz", "brab", "brabz")


class TooManyCalls(elfsafe.BadObject):
    """A function past MAX_CALLS or MAX_SITES: its call sites are not probed."""


@dataclass(frozen=True)
class CallSite:
    call: int  # vaddr of the call instruction
    after: int  # vaddr of the instruction after it: where the callee returns to
    callee: str  # as objdump names it: memset@plt, memset


def arch_of(elf) -> Arch | None:
    """The ELF file's architecture, if call sites can be found in it (64-bit little-endian x86-64
    or aarch64), whatever the host is."""
    if elf.elfclass != 64 or not elf.little_endian:
        return None
    return ARCHES.get(elf["e_machine"])


def supported(elf) -> bool:
    return arch_of(elf) is not None


def calls_to(elf, start: int, size: int, functions: dict[int, str], names=FILL_CALLEES,
             owner: str = "the function") -> list[CallSite]:
    """The calls to a function of `names` in the function at `start` of `size` bytes, in address
    order. `functions`: address -> name of the object's functions named in `names` (a direct
    call's target, or a static binary's IFUNC resolver). A tail call (jmp/b memset) is no call
    site: it never returns here. [] on another architecture. TooManyCalls past MAX_CALLS call
    instructions or MAX_SITES calls to `names` (`owner` names the function in its line)."""
    arch = arch_of(elf)
    if arch is None or size <= 0:
        return []
    code = elfsafe.read_code(elf, start, size)
    if code is None:
        return []
    scan = _scan_x86 if arch.machine == "x86_64" else _scan_aarch64
    slots: dict[int, list[tuple[int, int]]] = {}  # GOT slot -> [(call, after)]
    direct: list[tuple[int, int, str]] = []
    stubs: dict[int, int | None] = {}  # PLT stub -> its slot (each stub read once)
    calls = 0
    for call, after, target, slot in scan(elf, code, start):
        calls += 1
        if calls > MAX_CALLS:
            raise TooManyCalls(f"{owner} makes more than {MAX_CALLS} calls (at most {MAX_CALLS} are read)")
        if target is not None:
            if target in functions:
                direct.append((call, after, functions[target]))
                continue
            if target not in stubs:
                stubs[target] = _stub_slot(elf, arch, target)
            slot = stubs[target]
        if slot is not None:
            slots.setdefault(slot, []).append((call, after))
        if len(direct) > MAX_SITES:
            break  # counted below
    bound = _slot_names(elf, arch, set(slots), functions)
    out = [CallSite(c, a, name) for c, a, name in direct if name in names]
    for slot, sites in slots.items():
        name = bound.get(slot)
        if name in names:
            out += [CallSite(c, a, f"{name}@plt") for c, a in sites]
    if len(out) > MAX_SITES:
        raise TooManyCalls(f"{owner} makes more than {MAX_SITES} calls to {' or '.join(names)} "
                           f"(at most {MAX_SITES} are probed)")
    return sorted(out, key=lambda s: s.call)


def _disasm(elf, md, code: bytes, start: int):
    """The instructions of `code` at `start`, decoded a window at a time: capstone's disasm decodes
    its whole buffer before yielding the first (about 2 KB each with details: a 15 MB function
    took 6 GB), so memory stays one window's whatever the function's size and wherever the scan
    stops. Ends where capstone stops (bytes it can't decode), as one disasm of it all would; the
    file's read deadline (elfsafe.TIME_S) is checked as it goes."""
    off, n = 0, 0
    while off < len(code):
        window = code[off:off + _WINDOW]
        last = off + len(window) >= len(code)
        end, cut = off, False
        for insn in md.disasm(window, start + off):
            stop = insn.address - start + insn.size
            if not last and stop > off + len(window) - _LONGEST:
                cut = True  # it may run past the window: decoded again from its start
                break
            end = stop
            n += 1
            if n % _CHECK_EVERY == 0:
                elfsafe.check(elf)
            yield insn
        if not cut or end == off:
            return  # the end, or bytes capstone can't decode
        off = end


# ---- x86-64 ----------------------------------------------------------------------------------

def _x86():
    from capstone import CS_ARCH_X86, CS_MODE_64, Cs

    md = Cs(CS_ARCH_X86, CS_MODE_64)
    md.detail = True
    return md


def _scan_x86(elf, code: bytes, start: int):
    """(call, after, direct target or None, GOT slot or None) of each call instruction."""
    from capstone import CS_GRP_CALL
    from capstone.x86 import X86_OP_IMM, X86_OP_MEM, X86_REG_RIP

    for insn in _disasm(elf, _x86(), code, start):
        if not insn.group(CS_GRP_CALL) or len(insn.operands) != 1:
            continue
        op, after = insn.operands[0], insn.address + insn.size
        if op.type == X86_OP_IMM:
            yield insn.address, after, op.imm, None
        elif op.type == X86_OP_MEM and op.mem.base == X86_REG_RIP and op.mem.index == 0:
            yield insn.address, after, None, after + op.mem.disp  # call *slot(%rip)


def _x86_stub_slot(elf, target: int, scan: int) -> int | None:
    """The GOT slot a PLT stub at `target` jumps through (jmp *slot(%rip)), or None."""
    from capstone import CS_GRP_JUMP
    from capstone.x86 import X86_OP_MEM, X86_REG_RIP

    code = elfsafe.read_code(elf, target, 16)
    if code is None:
        return None
    for i, insn in enumerate(_x86().disasm(code, target)):
        if i >= scan:
            break
        if insn.group(CS_GRP_JUMP) and len(insn.operands) == 1:
            op = insn.operands[0]
            if op.type == X86_OP_MEM and op.mem.base == X86_REG_RIP and op.mem.index == 0:
                return insn.address + insn.size + op.mem.disp
            return None
    return None


# ---- aarch64 ---------------------------------------------------------------------------------

def _aarch64():
    """(Cs, operand types IMM, REG, MEM): capstone 6 renamed ARM64 to AARCH64 (CS_ARCH_AARCH64,
    capstone.aarch64, AARCH64_OP_*) and renumbered the operand types; capstone 5 has the old names."""
    import importlib

    import capstone

    new = hasattr(capstone, "CS_ARCH_AARCH64")  # by name: only one of the two exists in each version
    ops = importlib.import_module("capstone.aarch64" if new else "capstone.arm64")
    arch = getattr(capstone, "CS_ARCH_AARCH64" if new else "CS_ARCH_ARM64")
    prefix = "AARCH64_OP_" if new else "ARM64_OP_"
    md = capstone.Cs(arch, capstone.CS_MODE_ARM)  # little-endian
    md.detail = True
    md.skipdata = True  # a literal pool's word is skipped (4 bytes), not the end of the function
    return md, tuple(getattr(ops, prefix + t) for t in ("IMM", "REG", "MEM"))


_CALLEE_SAVED = frozenset(f"x{n}" for n in range(19, 30)) | {"sp"}  # AAPCS64: kept across a call


class _Registers:
    """What an adrp/ldr pair put in each register, in program order: ("page", address) after
    `adrp xN, page`, ("slot", GOT slot) after `ldr xM, [xN, #off]` from such a page, copied by
    `mov`. Forgotten when anything else writes the register, and at a call unless the register
    is callee-saved (-fno-plt code keeps memset's address in x19-x28 across calls)."""

    def __init__(self, md, kinds):
        self.md = md
        self.imm, self.reg, self.mem = kinds
        self.known: dict[str, tuple[str, int]] = {}

    def name(self, reg: int) -> str:
        n = self.md.reg_name(reg) or ""
        return "x" + n[1:] if n[:1] == "w" and n[1:].isdigit() else n  # w20 is x20's low half

    def step(self, insn) -> None:
        ops, mn = insn.operands, insn.mnemonic
        regs = [op.type == self.reg for op in ops]
        if mn == "adrp" and len(ops) == 2 and regs[0] and ops[1].type == self.imm:
            self.known[self.name(ops[0].reg)] = ("page", ops[1].imm)
            return
        if mn == "ldr" and len(ops) == 2 and regs[0] and ops[1].type == self.mem and not ops[1].mem.index:
            base = self.known.get(self.name(ops[1].mem.base))
            if base and base[0] == "page" and self.md.reg_name(ops[0].reg)[:1] == "x":
                self.known[self.name(ops[0].reg)] = ("slot", base[1] + ops[1].mem.disp)
                return
        if mn == "mov" and len(ops) == 2 and all(regs):
            src = self.known.get(self.name(ops[1].reg))
            dst = self.name(ops[0].reg)
            if src and dst[:1] == "x" and self.md.reg_name(ops[0].reg)[:1] == "x":
                self.known[dst] = src
                return
        if mn in _AARCH64_CALLS:
            self.known = {r: v for r, v in self.known.items() if r in _CALLEE_SAVED}
        if self.known:
            try:
                written = insn.regs_access()[1]
            except Exception:  # capstone without access data for this instruction: forget all
                self.known.clear()
                return
            for r in written:
                self.known.pop(self.name(r), None)

    def slot(self, op) -> int | None:
        kind, value = self.known.get(self.name(op.reg), ("", 0)) if op.type == self.reg else ("", 0)
        return value if kind == "slot" else None


def _scan_aarch64(elf, code: bytes, start: int):
    """(call, after, direct target or None, GOT slot or None) of each bl/blr."""
    md, kinds = _aarch64()
    regs = _Registers(md, kinds)
    for insn in _disasm(elf, md, code, start):
        if insn.mnemonic in _AARCH64_CALLS and insn.operands:
            op, after = insn.operands[0], insn.address + 4
            if insn.mnemonic == "bl" and op.type == regs.imm:
                yield insn.address, after, op.imm, None
            else:
                slot = regs.slot(op)
                yield insn.address, after, None, slot
        regs.step(insn)


def _aarch64_stub_slot(elf, target: int, scan: int) -> int | None:
    """The GOT slot a PLT stub at `target` branches through (adrp, ldr, br), or None."""
    code = elfsafe.read_code(elf, target, 4 * scan)
    if code is None:
        return None
    md, kinds = _aarch64()
    regs = _Registers(md, kinds)
    for i, insn in enumerate(md.disasm(code, target)):
        if i >= scan:
            break
        if insn.mnemonic in _AARCH64_JUMPS and insn.operands:
            return regs.slot(insn.operands[0])
        regs.step(insn)
    return None


def _stub_slot(elf, arch: Arch, target: int) -> int | None:
    stub = _x86_stub_slot if arch.machine == "x86_64" else _aarch64_stub_slot
    return stub(elf, target, arch.plt_scan)


# ---- relocations -----------------------------------------------------------------------------

def _slot_names(elf, arch: Arch, slots: set[int], functions: dict[int, str]) -> dict[int, str]:
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
            if typ in (arch.jump_slot, arch.glob_dat) and sym:
                if symtab is None:
                    symtab = elf.get_section(sec["sh_link"])
                out[slot] = symtab.get_symbol(sym).name.split("@", 1)[0]
            elif typ == arch.irelative and int(rel["addend"][k]) in functions:
                out[slot] = functions[int(rel["addend"][k])]
    return out
