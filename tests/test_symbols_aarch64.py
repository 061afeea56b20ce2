"""aarch64 programs read on another machine: the architecture comes from the ELF header, never the
host's. Small programs cross-compiled here (g++-aarch64-linux-gnu) with binutils' aarch64 objdump,
nm and readelf as the truth; PyPI's xllamacpp aarch64 wheel (llama.cpp build 11549) for `symbols`."""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import sys
import subprocess
from pathlib import Path

import pytest

from ckptrace.probes import callsites, libraries, points
from ckptrace.probes.symbols import resolve_binary
import aarch64_vm
from helpers import ckptrace

CXX = "aarch64-linux-gnu-g++"
OBJDUMP, READELF, NM = "aarch64-linux-gnu-objdump", "aarch64-linux-gnu-readelf", "aarch64-linux-gnu-nm"
needs_cross = pytest.mark.skipif(not shutil.which(CXX), reason=f"{CXX} not installed (scripts/setup.sh test installs it)")
UPDATE_TGT = "_ZN24common_prompt_checkpoint10update_tgtEP13llama_contextij"
UPDATE_DFT = UPDATE_TGT.replace("10update_tgt", "10update_dft")
# update_tgt with its buffer's growth inlined: a memset call (and a second, tail-called), as clang
# with libc++ builds it; update_dft with one
GROW = r"""
#include <cstring>
struct llama_context;
struct common_prompt_checkpoint { void update_tgt(llama_context *, int, unsigned);
                                  void update_dft(llama_context *, int, unsigned); unsigned char *p; };
extern "C" size_t llama_state_seq_get_data_ext(llama_context *, unsigned char *, size_t, int, unsigned);
__attribute__((noinline)) void common_prompt_checkpoint::update_tgt(llama_context *c, int n, unsigned f) {
    p = new unsigned char[n]; memset(p, 0, n); llama_state_seq_get_data_ext(c, p, n, 0, f); memset(p, 1, n / 2); }
__attribute__((noinline)) void common_prompt_checkpoint::update_dft(llama_context *c, int n, unsigned f) {
    p = new unsigned char[n]; memset(p, 0, n); llama_state_seq_get_data_ext(c, p, n, 0, f); p[0] ^= 1; }
extern "C" __attribute__((noipa)) size_t llama_state_seq_get_data_ext(llama_context *, unsigned char *d, size_t n,
                                                                      int, unsigned) { return d ? n : 0; }
int main(int c, char **) { common_prompt_checkpoint k; k.update_tgt(0, c * 4096, 0); k.update_dft(0, c, 0);
    return k.p[0]; }
"""
XLLAMACPP_BUILD_ID = "cc4e17f68d1088e0a7bf80ef07ef9965944285ae"


def run(*args: str) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout


def cross_compile(tmp: Path, name: str, source: str, *flags: str) -> str:
    src = tmp / f"{name}.cpp"
    src.write_text(source)
    out = tmp / name
    subprocess.run([CXX, "-O2", str(src), "-o", str(out), *flags], check=True, cwd=tmp)
    return str(out)


def body(path: str, function: str) -> list[tuple[int, str]]:
    """(address, instruction) of a function as binutils' aarch64 objdump disassembles it."""
    out = run(OBJDUMP, "-d", "--no-show-raw-insn", f"--disassemble={function}", path)
    return [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"^\s*([0-9a-f]+):\t(.*)$", out, re.M)]


def nm_address(path: str, mangled: str) -> int:
    return int(re.search(rf"^([0-9a-f]+) [TtWwi] {re.escape(mangled)}$", run(NM, path), re.M).group(1), 16)


def sites(plan) -> list[tuple[int, int]]:
    calls, ends = plan.by_point("fill_call"), plan.by_point("fill_call_end")
    return sorted(zip(sorted(p.vaddr for p in calls), sorted(p.vaddr for p in ends)))


@needs_cross
@pytest.mark.parametrize("flags", [(), ("-mbranch-protection=standard",)], ids=["plain", "bti-pac"])
def test_bl_to_memset_plt_agrees_with_objdump(tmp_path, flags):
    exe = cross_compile(tmp_path, "grow", GROW, *flags)
    want = [(a, a + 4) for f in (UPDATE_TGT, UPDATE_DFT) for a, text in body(exe, f)
            if re.match(r"bl\s+[0-9a-f]+ <memset@plt>", text)]
    assert len(want) == 2, want  # update_tgt's second memset is a tail call (b): no call site
    plan = resolve_binary(exe)
    assert sites(plan) == sorted(want)
    assert all(p.symbol.endswith("(call memset@plt)") for p in plan.by_point("fill_call"))
    assert plan.fill == "memset call sites in update_tgt and update_dft (inlined growth)"
    tgt = plan.by_point("update_tgt")[0]
    assert tgt.vaddr == nm_address(exe, UPDATE_TGT)
    m = re.search(rf"^([0-9a-f]+) <{UPDATE_TGT}> \(File Offset: 0x([0-9a-f]+)\):",
                  run(OBJDUMP, "-d", "-F", f"--disassemble={UPDATE_TGT}", exe), re.M)
    assert tgt.offset == int(m.group(2), 16)
    if flags:  # the uprobe sits on the landing pad / the return address signing, as on any entry
        assert body(exe, UPDATE_TGT)[0][1].strip() in ("paciasp", "bti\tc"), body(exe, UPDATE_TGT)[:2]


@needs_cross
def test_no_plt_calls_through_glob_dat_slots(tmp_path):
    # -fno-plt: adrp/ldr load memset's GOT slot (R_AARCH64_GLOB_DAT) into a register, kept in a
    # callee-saved one across the first call, then blr. The same source with a PLT is the count.
    plt = cross_compile(tmp_path, "plt", GROW)
    exe = cross_compile(tmp_path, "noplt", GROW, "-fno-plt")
    n = sum(bool(re.match(r"bl\s+[0-9a-f]+ <memset@plt>", t)) for f in (UPDATE_TGT, UPDATE_DFT) for _, t in body(plt, f))
    assert re.search(r"R_AARCH64_GLOB_DAT\s+0+\s+memset", run(READELF, "-rW", exe))
    instructions = {a: t for f in (UPDATE_TGT, UPDATE_DFT) for a, t in body(exe, f)}
    plan = resolve_binary(exe)
    found = sites(plan)
    assert len(found) == n == 2
    assert all(instructions[c].startswith("blr\t") and e == c + 4 for c, e in found), found


@needs_cross
def test_a_static_binarys_memset_is_found_through_its_ifunc(tmp_path):
    # static glibc: memset is an IFUNC reached through a .plt stub whose slot has an
    # R_AARCH64_IRELATIVE relocation with the resolver as its addend; binutils' chain is the truth
    exe = cross_compile(tmp_path, "grow", GROW, "-static")
    memset_at = nm_address(exe, "memset")
    irelative = {int(m.group(1), 16): int(m.group(2), 16) for m in
                 re.finditer(r"^([0-9a-f]+)\s+\S+\s+R_AARCH64_IRELATIVE\s+([0-9a-f]+)", run(READELF, "-rW", exe), re.M)}
    plt = run(OBJDUMP, "-d", "--no-show-raw-insn", "-j", ".plt", exe)
    stubs = {int(m.group(1), 16): int(m.group(2), 16) + int(m.group(3))
             for m in re.finditer(r"^\s*([0-9a-f]+):\tadrp\s+x16, ([0-9a-f]+).*\n\s*[0-9a-f]+:\tldr\s+x17, "
                                  r"\[x16, #(\d+)\]", plt, re.M)}
    want = [(a, a + 4) for f in (UPDATE_TGT, UPDATE_DFT) for a, t in body(exe, f)
            if (m := re.match(r"bl\s+([0-9a-f]+) ", t)) and irelative.get(stubs.get(int(m.group(1), 16))) == memset_at]
    assert len(want) == 2
    assert sites(resolve_binary(exe)) == sorted(want)


@needs_cross
def test_library_search_follows_the_binarys_architecture(tmp_path, monkeypatch):
    # libck.so twice: this machine's first in LD_LIBRARY_PATH, the aarch64 one by RUNPATH $ORIGIN/sub.
    # The program's architecture decides; a library found nowhere is said, and costs nothing else.
    lib = "struct llama_context; extern \"C\" unsigned long llama_state_seq_get_data_ext(llama_context *, " \
          "unsigned char *d, unsigned long n, int, unsigned) { return d ? n : 0; }\n"
    (tmp_path / "sub").mkdir()
    (tmp_path / "host").mkdir()
    cross_compile(tmp_path / "sub", "libck.so", lib, "-shared", "-fPIC")
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-x", "c++", "-", "-o", str(tmp_path / "host" / "libck.so")],
                   input=lib, text=True, check=True)
    (tmp_path / "none.cpp").write_text("extern \"C\" int ck_none(void) { return 1; }\n")
    subprocess.run([CXX, "-shared", "-fPIC", str(tmp_path / "none.cpp"), "-o", str(tmp_path / "sub" / "libnone.so")],
                   check=True)
    prog = GROW.split('extern "C" __attribute__((noipa))')[0] + 'extern "C" int ck_none(void);\n' + \
        "int main" + GROW.split("int main")[1]
    prog = prog.replace("return k.p[0];", "return k.p[0] + ck_none();")
    exe = cross_compile(tmp_path, "prog", prog, "-Lsub", "-lck", "-lnone", "-Wl,--enable-new-dtags,-rpath,$ORIGIN/sub")
    os.remove(tmp_path / "sub" / "libnone.so")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path / "host"))
    notes: list[str] = []
    plan = resolve_binary(exe, note=notes.append)
    assert plan.by_point("state_copy")[0].object == str((tmp_path / "sub" / "libck.so").resolve())
    assert plan.by_point("update_tgt")[0].object == exe
    # this machine's aarch64 C runtime, if any, is a cross compiler's (not where ld.so looks): not found
    missed, why = notes[0].split(" not searched: ", 1)
    assert len(notes) == 1 and "libnone.so" in missed.split(", "), notes
    assert why.startswith(f"not found (needed by {exe}): no 64-bit aarch64 ")
    assert "/lib/aarch64-linux-gnu, /usr/lib/aarch64-linux-gnu" in why
    assert "the other objects' are resolved without" in why
    assert "libnone.so" in [n.split(":", 1)[0] for n in plan.not_searched]
    assert "libck.so" not in missed


def test_default_folders_and_ld_so_conf(tmp_path):
    assert libraries.default_dirs("EM_AARCH64", 64)[:2] == ("/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu")
    assert libraries.default_dirs("EM_X86_64", 64)[:2] == ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu")
    assert libraries.default_dirs("EM_NONE", 32) == ("/lib", "/usr/lib")
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "b.conf").write_text("# arm64 multiarch\n/usr/lib/aarch64-linux-gnu\n")
    (tmp_path / "conf.d" / "a.conf").write_text("/opt/a /opt/b\ninclude loop.conf\n")
    (tmp_path / "conf.d" / "loop.conf").write_text("include loop.conf\n/opt/loop\n")
    (tmp_path / "ld.so.conf").write_text("include conf.d/*.conf\n/usr/local/lib\nhwcap 0 nosegneg\n")
    dirs = libraries.ld_so_conf(str(tmp_path / "ld.so.conf"))
    assert dirs == ["/opt/a", "/opt/b", "/opt/loop", "/usr/lib/aarch64-linux-gnu", "/usr/local/lib"]
    assert libraries.ld_so_conf(str(tmp_path / "missing.conf")) == []


def test_relocation_types_per_architecture():
    # elf.h: R_X86_64_GLOB_DAT 6, JUMP_SLOT 7, IRELATIVE 37; R_AARCH64_GLOB_DAT 1025, JUMP_SLOT 1026,
    # IRELATIVE 1032
    x86, a64 = callsites.ARCHES["EM_X86_64"], callsites.ARCHES["EM_AARCH64"]
    assert (x86.glob_dat, x86.jump_slot, x86.irelative) == (6, 7, 37)
    assert (a64.glob_dat, a64.jump_slot, a64.irelative) == (1025, 1026, 1032)


# --- PyPI's xllamacpp aarch64 wheel: build 11549 ----------------------------------------------

def cache() -> Path:
    return Path(os.environ.get("CKPTRACE_CACHE", "/var/cache/ckptrace")) / "wheels"


@pytest.fixture(scope="module")
def xllamacpp_aarch64() -> Path:
    """xllamacpp.abi3.so from PyPI's manylinux aarch64 wheel, downloaded once into the cache
    (the arm64 VM's test serves with the same wheel)."""
    return aarch64_vm.xllamacpp_wheel() / "xllamacpp" / "xllamacpp.abi3.so"


def test_symbols_on_the_xllamacpp_aarch64_wheel(xllamacpp_aarch64):
    so = str(xllamacpp_aarch64)
    head = open(so, "rb").read(20)
    assert head[18:20] == (183).to_bytes(2, "little")  # EM_AARCH64, whatever this machine is
    r = ckptrace("symbols", "--json", so)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["profile"]["name"] == "11549" and "build 11549" in d["profile"]["generation"]
    assert d["profile"]["missing"] == []  # every point of its generation, fill and batches included
    profile = points.PROFILE["11549"]
    assert {p["point"] for p in d["points"]} >= {points.POINT[n].point for n in profile.points if n in points.POINT}
    assert {p["build_id"] for p in d["points"]} == {XLLAMACPP_BUILD_ID}
    build_id = re.search(r"Build ID: ([0-9a-f]+)", run("readelf", "-nW", so)).group(1)
    assert build_id == XLLAMACPP_BUILD_ID
    for p in d["points"]:  # every probe point at the address nm gives its symbol
        assert p["vaddr"] == nm_address_host(so, p["mangled"]), p
    if platform.machine() != "aarch64":  # its C and C++ runtimes are not on this machine: said once
        notes = [ln for ln in r.stderr.splitlines() if "not searched" in ln]
        assert len(notes) == 1 and "libpthread.so.0" in notes[0] and "no 64-bit aarch64" in notes[0], r.stderr
    r = ckptrace("symbols", so)
    assert r.returncode == 0 and "profile: 11549 (upstream llama.cpp build 11549" in r.stdout
    assert "missing optional: none" in r.stdout


_NM: dict[str, dict[str, int]] = {}


def nm_address_host(path: str, mangled: str) -> int:
    """binutils' nm reads any architecture's symbol table."""
    if path not in _NM:
        _NM[path] = {m.group(2): int(m.group(1), 16)
                     for m in re.finditer(r"^([0-9a-f]+) [TtWwi] (\S+)$", run("nm", path), re.M)}
    return _NM[path][mangled]


# --- capstone 6 renamed ARM64 to AARCH64 ------------------------------------------------------

CAPSTONE_6 = "capstone==6.0.0a11"


@pytest.fixture(scope="module")
def capstone6() -> Path:
    """A folder holding capstone 6 (PyPI's prerelease wheel), installed once into the cache."""
    where = cache() / CAPSTONE_6.replace("==", "-")
    if not (where / "capstone").is_dir():
        partial = where.with_name(where.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary=:all:", "--target",
                        str(partial), CAPSTONE_6], check=True, capture_output=True, timeout=600)
        os.replace(partial, where)
    return where


FOUND = """
import json, sys, capstone
from ckptrace.probes.symbols import resolve_binary
plan = resolve_binary(sys.argv[1])
print(json.dumps([capstone.__version__, sorted((p.point, p.vaddr) for p in plan.points)]))
"""


@needs_cross
@pytest.mark.parametrize("flags", [(), ("-fno-plt",), ("-static",)], ids=["plt", "no-plt", "static"])
def test_capstone_6_finds_what_capstone_5_finds(tmp_path, capstone6, flags):
    exe = cross_compile(tmp_path, "grow", GROW, *flags)
    r = subprocess.run([sys.executable, "-c", FOUND, exe], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONPATH": str(capstone6)})
    version, points = json.loads(r.stdout)
    assert version.startswith("6.")
    mine = sorted([p.point, p.vaddr] for p in resolve_binary(exe).points)
    assert points == mine and sum(p == "fill_call" for p, _ in points) == 2
