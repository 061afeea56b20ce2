"""Probe-point resolution against the real sample builds, small ELF files compiled here, and binutils."""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from ckptrace.core.errors import SymbolError, TargetError
from ckptrace.probes import elf_objects, points, symbols
from ckptrace.probes.elf_objects import qualified_name
from ckptrace.probes.symbols import resolve_binary, resolve_pid
from ckptrace.probes.symbols_text import format_plan
from helpers import AS_NOBODY, assert_one_line_error, ckptrace, waiting_workload, why_nobody_cannot_run_ckptrace

REQUIRED = {"update_tgt", "resize_grow", "state_copy"}
LLAMA_DECODE_ERA_LACKS = ("load_tgt", "load_dft", "state_restore", "spec_state", "prompt_save", "slot_save",
                         "slot_restore")
SAMPLE_POINTS = {"update_tgt", "update_dft", "resize_grow", "state_copy", "update_slots", "llama_decode",
                 "create_checkpoint"}
UPDATE_TGT = "_ZN24common_prompt_checkpoint10update_tgtEP13llama_contextij"


@pytest.fixture(scope="module")
def pie(workload):
    return str(workload)


@pytest.fixture(scope="module")
def static(static_workload):
    return str(static_workload)


def compile_cpp(tmp: Path, name: str, source: str, *flags: str) -> Path:
    src = tmp / f"{name}.cpp"
    src.write_text(source)
    out = tmp / name
    subprocess.run(["g++", "-O2", str(src), "-o", str(out), *flags], check=True, cwd=tmp)
    return out


def readelf_build_id(path: str) -> str:
    out = subprocess.run(["readelf", "-nW", path], capture_output=True, text=True, check=True).stdout
    m = re.search(r"Build ID: ([0-9a-f]+)", out)
    return m.group(1) if m else ""


def objdump_file_offset(path: str, mangled: str) -> int:
    """The function's file offset as binutils computes it (objdump -F), independent of our code."""
    out = subprocess.run(["objdump", "-d", "-F", f"--disassemble={mangled}", path],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(rf"^([0-9a-f]+) <{re.escape(mangled)}> \(File Offset: 0x([0-9a-f]+)\):", out, re.M)
    assert m, out[:500]
    return int(m.group(2), 16)


def nm_address(path: str, mangled: str) -> int:
    out = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
    m = re.search(rf"^([0-9a-f]+) [TtWw] {re.escape(mangled)}$", out, re.M)
    assert m, f"{mangled} not in nm {path}"
    return int(m.group(1), 16)


# --- the sample workload ---------------------------------------------------------------------


def test_backends_in_the_executables_folder_are_resolved_before_they_are_mapped(tmp_path):
    """A GGML_BACKEND_DL build dlopens libggml-*.so from its folder at start: resolve_binary takes
    them and what they need (the cuda-dl build's backend brings the CUDA libraries, and with them
    the copy points), once each; a copy of the program without the backend beside it has none."""
    from ckptrace.samples import workload_binary

    exe = workload_binary(variant="cuda-dl")
    plan = resolve_binary(str(exe))
    names = [os.path.basename(o.path) for o in plan.objects]
    assert {"libggml-cuda.so", "libcudart.so.12", "libcuda.so.1"} <= set(names) and len(names) == len(set(names))
    cuda = [(p.point, os.path.basename(p.object)) for p in plan.points if p.point.startswith("cu")]
    assert ("cudaMemcpyAsync", "libcudart.so.12") in cuda and len(cuda) == len(set(cuda))
    alone = tmp_path / exe.name
    shutil.copy2(exe, alone)
    plan = resolve_binary(str(alone))
    assert not any(os.path.basename(o.path).startswith(("libcud", "libggml")) for o in plan.objects)
    assert not plan.gpu_points


def test_pie_sample_all_points_and_both_copies_of_the_growth(pie):
    plan = resolve_binary(pie)
    names = {os.path.basename(o.path) for o in plan.objects}
    assert {"ckpt-workload", "libsample-llama.so", "libsample-common.so",
            "libsample-server.so"} <= names
    assert plan.objects[0].path == os.path.realpath(pie)
    where = {(p.point, os.path.basename(p.object)) for p in plan.points}
    assert ("update_tgt", "libsample-common.so") in where
    assert ("state_copy", "libsample-llama.so") in where
    assert ("update_slots", "libsample-server.so") in where
    grow = {os.path.basename(p.object) for p in plan.by_point("resize_grow")}
    assert {"libsample-server.so", "libsample-common.so"} <= grow
    assert all(p.binding == "WEAK" for p in plan.by_point("resize_grow"))
    # the default build is the llama_decode generation without the restore path
    assert plan.profile.name == "llama_decode" and plan.stdlib == "libstdc++"
    assert plan.missing_optional == list(LLAMA_DECODE_ERA_LACKS)
    for p in plan.points:
        assert os.path.isabs(p.object) and os.path.exists(p.object)
        assert p.build_id == readelf_build_id(p.object) != ""
    tgt = plan.by_point("update_tgt")[0]
    assert tgt.mangled == UPDATE_TGT
    assert tgt.symbol == "common_prompt_checkpoint::update_tgt(llama_context*, int, unsigned int)"


def test_static_non_pie_sample_everything_in_the_executable(static):
    plan = resolve_binary(static)
    exe = os.path.realpath(static)
    with open(exe, "rb") as f:
        assert ELFFile(f)["e_type"] == "ET_EXEC"
    found = {p.point for p in plan.points}
    assert found == SAMPLE_POINTS
    assert all(p.object == exe for p in plan.points)
    # Non-PIE: the link address is not the file offset, so the two must differ here.
    assert all(p.vaddr != p.offset for p in plan.points)


@pytest.mark.parametrize("which", ["pie", "static"])
def test_offsets_agree_with_objdump_and_nm(which, request):
    plan = resolve_binary(request.getfixturevalue(which))
    for p in plan.points:
        assert p.vaddr == nm_address(p.object, p.mangled)
        assert p.offset == objdump_file_offset(p.object, p.mangled), p


def test_bcc_turns_our_vaddr_into_our_offset(static, pie):
    """The recorder passes vaddr to attach_uprobe(addr=); libbcc must land on our file offset."""
    bcc = pytest.importorskip("bcc")
    for plan in (resolve_binary(static), resolve_binary(pie)):
        for p in plan.points:
            path, off = bcc.BPF._check_path_symbol(p.object.encode(), b"", p.vaddr, -1)
            assert (path.decode(), off) == (p.object, p.offset)


def test_verify_with_bcc_for_a_live_non_pie_process(static):
    pytest.importorskip("bcc")
    with waiting_workload(static) as proc:
        plan = resolve_pid(proc.pid)
        symbols.verify_with_bcc(plan, proc.pid)
        symbols.verify_with_bcc(plan)


def test_verify_with_bcc_refuses_a_root_it_cannot_read(static, nobody_dir):
    """As nobody, /proc/1/root is unreadable: bcc would keep the vaddr as the file offset (a
    non-PIE probe in the wrong place), and verify_with_bcc says so instead."""
    pytest.importorskip("bcc")
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as nobody")
    why = why_nobody_cannot_run_ckptrace()
    if why:
        pytest.skip(why)
    exe = nobody_dir / "ckpt-workload-static"
    shutil.copy(static, exe)
    os.chmod(exe, 0o755)
    code = ("import sys; from ckptrace.probes.symbols import resolve_binary, verify_with_bcc; "
            "plan = resolve_binary(sys.argv[1]); verify_with_bcc(plan); print('own namespace ok', flush=True); "
            "verify_with_bcc(plan, 1)")
    r = subprocess.run([*AS_NOBODY, sys.executable, "-c", code, str(exe)], capture_output=True, text=True,
                       cwd=nobody_dir, timeout=120)
    assert r.returncode != 0 and r.stdout == "own namespace ok\n", r.stdout + r.stderr
    assert re.search(r"SymbolError: bcc would probe update_tgt at file offset 0x[0-9a-f]+ of .*, not 0x",
                     r.stderr), r.stderr



def test_live_process_matches_the_binary(pie):
    with waiting_workload(pie) as proc:
        live = resolve_pid(proc.pid)
    static_plan = resolve_binary(pie)
    key = lambda p: (p.point, p.object, p.vaddr, p.offset, p.build_id)  # noqa: E731
    assert sorted(map(key, live.points)) == sorted(map(key, static_plan.points))
    assert live.pid == proc.pid
    assert live.target == os.path.realpath(pie)


def test_live_process_whose_library_was_deleted(static, tmp_path):
    exe = tmp_path / "ckpt-workload-static"
    shutil.copy(static, exe)
    with waiting_workload(exe) as proc:
        exe.unlink()
        with pytest.raises(TargetError, match=r"ckpt-workload-static was deleted"):
            resolve_pid(proc.pid)


def test_dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    with pytest.raises(TargetError, match=rf"^no process with PID {proc.pid}$"):
        resolve_pid(proc.pid)


# --- failures that must read as one clear line -----------------------------------------------


def test_stripped_copy_says_stripped(static, tmp_path):
    out = tmp_path / "stripped"
    subprocess.run(["strip", static, "-o", str(out)], check=True)
    with pytest.raises(SymbolError) as e:
        resolve_binary(str(out))
    msg = str(e.value)
    assert "common_prompt_checkpoint::update_tgt not found" in msg
    assert "stripped? no .symtab in stripped" in msg
    assert "\n" not in msg


def test_binary_without_llama_symbols():
    with pytest.raises(SymbolError, match=r"^update_tgt: .* not found in true, .*nearest: "):
        resolve_binary("/bin/true")


NEAR_MISS = r"""
#include <cstddef>
struct llama_context;
struct common_prompt_checkpoint { void update_tgx(llama_context*, int); };
__attribute__((noinline)) void common_prompt_checkpoint::update_tgx(llama_context*, int) { asm(""); }
extern "C" __attribute__((noinline)) size_t llama_state_seq_get_dat(void*, unsigned char*) { asm(""); return 0; }
int main() { common_prompt_checkpoint c; c.update_tgx(nullptr, 1); return (int)llama_state_seq_get_dat(0, 0); }
"""


def test_missing_point_lists_nearest_candidates(tmp_path):
    exe = compile_cpp(tmp_path, "nearmiss", NEAR_MISS)
    with pytest.raises(SymbolError) as e:
        resolve_binary(str(exe))
    msg = str(e.value)
    assert "nearest: common_prompt_checkpoint::update_tgx(llama_context*, int)" in msg
    assert "also missing: state_copy" in msg
    # near misses are names, not points: no generation is claimed, and no inlining is guessed
    assert "no point of any known llama.cpp generation's checkpoint path was found" in msg
    assert "inlined" not in msg
    assert "stripped?" not in msg  # nearmiss has its .symtab; libc has none, and no llama.cpp names either


def test_not_elf_and_missing_file(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    with pytest.raises(TargetError, match=r"notes.txt is not an ELF program or library"):
        resolve_binary(str(text))
    with pytest.raises(TargetError, match=r"nope: no such file"):
        resolve_binary(str(tmp_path / "nope"))
    with pytest.raises(TargetError, match=r"is a directory"):
        resolve_binary(str(tmp_path))


# --- library search, like ld.so --------------------------------------------------------------

LIB = r"""
#include <vector>
#include <cstddef>
struct llama_context;
extern "C" size_t llama_state_seq_get_data_ext(void*, unsigned char* d, size_t n, int, unsigned) { return d ? n : 0; }
struct common_prompt_checkpoint { std::vector<unsigned char> v; void update_tgt(llama_context*, int, unsigned); };
void common_prompt_checkpoint::update_tgt(llama_context* c, int s, unsigned f) {
  v.resize(v.size() + 100); llama_state_seq_get_data_ext(c, v.data(), v.size(), s, f); }
"""
MAIN = r"""
#include <vector>
struct llama_context;
struct common_prompt_checkpoint { std::vector<unsigned char> v; void update_tgt(llama_context*, int, unsigned); };
int main() { common_prompt_checkpoint c; c.update_tgt(nullptr, 0, 0); return 0; }
"""


@pytest.fixture(scope="module")
def rpath_tree(tmp_path_factory):
    """prog + sub/libck.so, found through DT_RPATH $ORIGIN/sub; libck.so at a high link address."""
    root = tmp_path_factory.mktemp("rpath")
    (root / "sub").mkdir()
    # -Ttext-segment moves the library's link addresses away from its file offsets.
    compile_cpp(root / "sub", "libck.so", LIB, "-shared", "-fPIC", "-Wl,-Ttext-segment=0x200000")
    compile_cpp(root, "prog", MAIN, f"-L{root}/sub", "-lck", "-Wl,-rpath,$ORIGIN/sub",
                "-Wl,--disable-new-dtags")
    return root


def test_rpath_origin_and_shared_library_link_address(rpath_tree):
    dyn = subprocess.run(["readelf", "-dW", str(rpath_tree / "prog")], capture_output=True,
                         text=True, check=True).stdout
    assert "(RPATH)" in dyn and "$ORIGIN/sub" in dyn
    plan = resolve_binary(str(rpath_tree / "prog"))
    lib = str((rpath_tree / "sub" / "libck.so").resolve())
    tgt = plan.by_point("update_tgt")[0]
    assert tgt.object == lib
    assert tgt.vaddr - tgt.offset == 0x200000
    assert tgt.offset == objdump_file_offset(lib, tgt.mangled)
    # no batch entry point at all: no generation agrees; the nearest is named, recording goes on
    assert plan.profile.name == "unknown" and "nearest: llama_decode" in plan.profile.generation
    assert plan.profile.matched == ["update_tgt", "fill", "state_copy"]
    assert plan.missing_optional == ["update_dft", "update_slots", "create_checkpoint", *LLAMA_DECODE_ERA_LACKS,
                                     "llama_decode", points.NO_ITERATION_NOTE]
    text = format_plan(plan)
    assert "profile: unknown (no known generation agrees" in text
    assert "found: update_tgt, fill, state_copy" in text
    assert "- llama_decode: no batch token counts" in text  # what each missing point costs


# A fork between generations: ik_llama.cpp's checkpoint path (create_checkpoint sizes, builds and
# copies the buffer itself) with upstream's llama_process batches, which ik 0.1.5 lacks.
FORK = r"""
#include <cstddef>
#include <cstring>
#include <vector>
struct llama_context; struct llama_batch_ext;
extern "C" __attribute__((noinline)) size_t llama_state_seq_get_size(llama_context *, int, unsigned) { asm(""); return 4096; }
extern "C" __attribute__((noinline)) size_t llama_state_seq_get_data(llama_context *, unsigned char *d, size_t n, int, unsigned) {
    asm(""); return d ? n : 0; }
extern "C" __attribute__((noinline)) int llama_process(llama_context *, int, llama_batch_ext *) { asm(""); return 0; }
struct server_slot { std::vector<unsigned char> data; };
struct server_context { bool create_checkpoint(server_slot &); };
__attribute__((noinline)) bool server_context::create_checkpoint(server_slot & s) {
    size_t n = llama_state_seq_get_size(nullptr, 0, 1);
    s.data = std::vector<unsigned char>(n);
    return llama_state_seq_get_data(nullptr, s.data.data(), n, 0, 1) == n; }
int main(int c, char **) { server_context ctx; server_slot s; llama_process(nullptr, c, nullptr);
    return ctx.create_checkpoint(s) ? 0 : 1; }
"""


def test_an_unknown_generation_names_its_nearest_and_records_with_its_points(tmp_path):
    exe = compile_cpp(tmp_path, "fork", FORK)
    plan = resolve_binary(str(exe))
    prof = plan.profile
    # ik's points, but llama_process, which ik lacks: no generation agrees; ik is the nearest
    assert prof.name == "unknown" and prof.nearest == "ik-0.1.5"
    assert "no known generation agrees (nearest: ik-0.1.5" in prof.generation
    assert {"ik_create_checkpoint", "ik_state_size", "fill", "ik_state_copy"} <= set(prof.matched)
    assert {p.point for p in plan.points} >= {"create_checkpoint", "state_size", "state_copy", "fill_call"}
    assert not plan.by_point("llama_process")  # upstream's batch call is not the nearest profile's
    costs = plan.costs()
    assert set(costs) == set(prof.missing) and "ik_update_slots" in costs
    assert "iterations come from batch boundaries" in costs["ik_update_slots"]
    r = ckptrace("symbols", str(exe))
    assert r.returncode == 0, r.stderr
    assert "profile: unknown (no known generation agrees (nearest: ik-0.1.5" in r.stdout
    assert "- ik_apply_checkpoint: restores are not spans of their own" in r.stdout
    assert "inlined" not in r.stdout.split("fill:", 1)[0]


def test_a_fork_without_its_copy_says_so_and_guesses_nothing(tmp_path):
    exe = compile_cpp(tmp_path, "fork", FORK.replace("llama_state_seq_get_data", "llama_state_seq_read_data"))
    with pytest.raises(SymbolError) as e:
        resolve_binary(str(exe))
    msg = str(e.value)
    assert msg.startswith("ik_state_copy: llama_state_seq_get_data not found in fork, ")
    n = len(points.PROFILE["ik-0.1.5"].points)
    assert f"nearest generation: ik-0.1.5 (3 of its {n} points found: ik_create_checkpoint, ik_state_size, fill)" in msg
    assert "without ik_state_copy no checkpoint is seen, nothing can be recorded" in msg
    assert "inlined" not in msg and "no .symtab in fork" not in msg


def test_missing_library_and_ld_library_path(rpath_tree, tmp_path, monkeypatch):
    # A copy of prog elsewhere: $ORIGIN/sub no longer holds the library.
    prog = tmp_path / "prog"
    shutil.copy(rpath_tree / "prog", prog)
    # Not found: said in one note, left out; its points (here the required ones) are what is missing.
    notes: list[str] = []
    with pytest.raises(SymbolError, match=r"^update_tgt: .* not found in prog, .*; 1 object not searched \(noted above\)$"):
        resolve_binary(str(prog), note=notes.append)
    assert len(notes) == 1 and notes[0].startswith(f"libck.so not searched: not found (needed by {prog}): no 64-bit "
                                                   f"{platform.machine()} library of that name in the RPATH/RUNPATH, "), notes
    monkeypatch.setenv("LD_LIBRARY_PATH", str(rpath_tree / "sub"))
    plan = resolve_binary(str(prog))
    assert plan.by_point("update_tgt")[0].object == str((rpath_tree / "sub" / "libck.so").resolve())


# --- pieces ------------------------------------------------------------------------------------


def test_numpy_scan_matches_pyelftools(pie):
    """The vectorised symbol scan finds what pyelftools' own symbol iteration finds."""
    lib = str(Path(pie).parent / "libsample-common.so")
    needles = [b"update_", b"_M_default_append", b"llama_"]
    with open(lib, "rb") as f:
        elf = ELFFile(f)
        for sec in elf.iter_sections():
            if sec["sh_type"] not in ("SHT_SYMTAB", "SHT_DYNSYM"):
                continue
            ours = sorted((n, v) for n, v, *_ in elf_objects.defined_functions_matching(elf, sec, needles))
            theirs = sorted(
                (s.name, s["st_value"]) for s in sec.iter_symbols()
                if s["st_info"]["type"] in ("STT_FUNC", "STT_LOOS")  # STT_LOOS == STT_GNU_IFUNC
                and s["st_shndx"] != "SHN_UNDEF" and s["st_value"] != 0
                and any(n.decode() in s.name for n in needles))
            assert ours == theirs and ours


@pytest.mark.parametrize("demangled, qualified", [
    ("common_prompt_checkpoint::update_tgt(llama_context*, int, unsigned int)",
     "common_prompt_checkpoint::update_tgt"),
    ("std::vector<unsigned char, std::allocator<unsigned char> >::_M_default_append(unsigned long)",
     "std::vector<unsigned char, std::allocator<unsigned char> >::_M_default_append"),
    ("llama_decode", "llama_decode"),
    ("server_context_impl::update_slots() [clone .constprop.0]", "server_context_impl::update_slots"),
    ("void foo<int>(int)", "foo<int>"),
    ("(anonymous namespace)::helper(int)", "(anonymous namespace)::helper"),
])
def test_qualified_name(demangled, qualified):
    assert qualified_name(demangled) == qualified


def test_table_fits_80_columns_and_json_round_trips(pie):
    plan = resolve_binary(pie)
    text = format_plan(plan)
    assert max(map(len, text.splitlines())) <= 80
    assert "libsample-server.so" in text and "resize_grow" in text
    d = json.loads(json.dumps(plan.to_dict()))
    assert {p["point"] for p in d["points"]} >= REQUIRED
    assert d["objects"][0]["path"] == plan.target


# --- the command line, as a user runs it -------------------------------------------------------


def run_cli(*args):
    return ckptrace("symbols", *args)


def test_cli_table_and_json(pie):
    r = run_cli(pie)
    assert r.returncode == 0, r.stderr
    assert "update_tgt" in r.stdout and "libsample-common.so" in r.stdout
    assert max(map(len, r.stdout.splitlines())) <= 80
    r = run_cli("--json", pie)
    assert r.returncode == 0
    d = json.loads(r.stdout)
    grow = [p for p in d["points"] if p["point"] == "resize_grow"]
    assert len(grow) >= 2


def test_cli_pid(static):
    with waiting_workload(static) as proc:
        r = run_cli("--pid", str(proc.pid), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["pid"] == proc.pid


@pytest.mark.parametrize("args, pattern", [
    (["/bin/true"], r"^ckptrace: error: update_tgt: "),
    (["/etc/hostname"], r"^ckptrace: error: /etc/hostname is not an ELF"),
    (["--pid", "2147483646"], r"^ckptrace: error: no process with PID 2147483646$"),
])
def test_cli_errors_are_one_line(args, pattern):
    line = assert_one_line_error(run_cli(*args), code=1)
    assert re.match(pattern, line), line


@pytest.mark.parametrize("args", [[], ["/bin/true", "--pid", "1"]])
def test_cli_needs_exactly_one_target(args):
    r = run_cli(*args)
    assert r.returncode == 2
    assert "exactly one of BINARY or --pid" in r.stderr
    assert "Traceback" not in r.stderr


# --- a growth inlined into update_tgt: its memset call sites ---------------------------------

def objdump_calls(path: str, function: str, callee: str) -> list[tuple[int, int]]:
    """(call, next instruction) of each call to `callee` in `function`, as binutils disassembles it."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--disassemble={function}", path],
                         capture_output=True, text=True, check=True).stdout
    addrs = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"^\s*([0-9a-f]+):\t(.*)$", out, re.M)]
    return [(a, addrs[i + 1][0]) for i, (a, text) in enumerate(addrs)
            if re.match(rf"call\s+[0-9a-f]+ <{re.escape(callee)}>", text)]


def test_memset_call_sites_agree_with_objdump():
    from ckptrace.samples import workload_binary

    binary = str(workload_binary(variant="inlined-memset"))
    plan = resolve_binary(binary)
    assert not plan.by_point("resize_grow") and plan.profile.name == "11434" and "fill" in plan.profile.matched
    want = [c for f in (UPDATE_TGT, UPDATE_TGT.replace("10update_tgt", "10update_dft"))
            for c in objdump_calls(binary, f, "memset@plt")]
    assert len(want) == 4  # the growth's and the in-capacity zero fill, in each
    assert sorted(p.vaddr for p in plan.by_point("fill_call")) == sorted(c for c, _ in want)
    assert sorted(p.vaddr for p in plan.by_point("fill_call_end")) == sorted(a for _, a in want)
    assert plan.fill == "memset call sites in update_tgt and update_dft (inlined growth)"
    assert "fill: memset call sites in update_tgt and update_dft (inlined growth)" in format_plan(plan)
    assert not any("fill" in m for m in plan.missing_optional)


def test_a_static_binarys_memset_is_found_through_its_ifunc(tmp_path):
    # static glibc: memset is an IFUNC called through a PLT slot with an IRELATIVE relocation whose
    # addend is the resolver; binutils' chain is the truth: call -> stub's slot -> readelf's addend
    exe = str(compile_cpp(tmp_path, "grow", """
        #include <cstring>
        struct common_prompt_checkpoint { void update_tgt(void *, int, unsigned); unsigned char *p; };
        __attribute__((noinline)) void common_prompt_checkpoint::update_tgt(void *, int n, unsigned) {
            p = new unsigned char[n]; memset(p, 0, n); p[0] = 1; }
        extern "C" size_t llama_state_seq_get_data_ext(void *, unsigned char *, size_t, int, unsigned) { return 0; }
        int main(int c, char **) { common_prompt_checkpoint k; k.update_tgt(0, c * 4096, 0);
            return (int) llama_state_seq_get_data_ext(0, k.p, 0, 0, 0); }
    """, "-static"))
    run = lambda *a: subprocess.run(a, capture_output=True, text=True, check=True).stdout  # noqa: E731
    memset_at = int(re.search(r"^([0-9a-f]+) i memset$", run("nm", exe), re.M).group(1), 16)
    irelative = {int(m.group(1), 16): int(m.group(2), 16)
                 for m in re.finditer(r"^([0-9a-f]+)\s+\S+\s+R_X86_64_IRELATIVE\s+([0-9a-f]+)", run("readelf", "-rW", exe), re.M)}
    stubs = {int(m.group(1), 16): int(m.group(2), 16)
             for m in re.finditer(r"^\s*([0-9a-f]+):\tjmp\s+\*0x[0-9a-f]+\(%rip\)\s+# ([0-9a-f]+)",
                                  run("objdump", "-d", "--no-show-raw-insn", "-j", ".plt", exe), re.M)}
    body = run("objdump", "-d", "--no-show-raw-insn", f"--disassemble={UPDATE_TGT.replace('P13llama_contextij', 'Pvij')}", exe)
    lines = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"^\s*([0-9a-f]+):\t(.*)$", body, re.M)]
    want = [(a, lines[i + 1][0]) for i, (a, text) in enumerate(lines)
            if (m := re.match(r"call\s+([0-9a-f]+) ", text)) and irelative.get(stubs.get(int(m.group(1), 16))) == memset_at]
    assert len(want) == 1
    plan = resolve_binary(exe)
    assert [(p.vaddr, e.vaddr) for p, e in zip(plan.by_point("fill_call"), plan.by_point("fill_call_end"))] == want
    assert plan.by_point("fill_call")[0].symbol.endswith("(call memset@plt)")


def test_without_capstone_the_fill_is_derived_and_said(monkeypatch):
    from ckptrace.samples import workload_binary

    monkeypatch.setitem(sys.modules, "capstone", None)  # as if not installed: import fails
    plan = resolve_binary(str(workload_binary(variant="inlined-memset")))
    assert not plan.fill_probed and points.NO_DISASSEMBLER_NOTE in plan.missing_optional
    assert "fill" in plan.costs()
