"""Compile a BPF C source with bcc in a child process, or take the result from the cache.

The compiler (bcc's libbcc: clang and LLVM) and the kernel's BTF (read through bpftool's JSON,
about 120 MiB of Python objects) are needed once per source, kernel and options, and never again
while tracing: the child process (`python -m ckptrace.probes.bpf_compile`) reads the BTF offsets
the source needs, compiles with bcc's rewriter, and prints the object as JSON; it exits, and its
memory with it. The object goes into the cache (probes/bpf_cache.py) for the next run, which
loads it with no compile at all (probes/bpf_runtime.py).

The object: each function's instructions as bcc emitted them, with the position of every
instruction that names a map (bcc writes the child's map descriptor there; the loader writes its
own), each map's type, sizes, flags and bcc's description of its key and value types, the
license and kernel version bcc loads with, and what the kernel's BTF offered (`kernel`: whether
the scheduler counters are recorded, and why not).
"""
from __future__ import annotations

import base64
import ctypes as ct
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from ckptrace.core.errors import CkptraceError, EbpfUnavailable, NotPermitted
from ckptrace.probes import bpf_cache
from ckptrace.probes.bpf_runtime import MAP_TYPES, decode_type

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
INCLUDE = re.compile(r'^#include "([A-Za-z0-9_.-]+)"[ \t]*$', re.M)
LD_IMM64, CALL = 0x18, 0x85
PSEUDO_MAP_FD, PSEUDO_MAP_VALUE, PSEUDO_CALL = 1, 2, 1
MAX_INSNS = 1 << 20  # the kernel's own limit per program
ERRORS = {"EbpfUnavailable": EbpfUnavailable, "NotPermitted": NotPermitted}
TIMEOUT_S = 600
ERROR_PREFIX = "ckptrace: error: "


def bcc_version() -> str:
    """bcc's version, read from its package without importing it (importing maps its compiler)."""
    spec = importlib.util.find_spec("bcc")
    if spec is None or not spec.submodule_search_locations:
        from ckptrace.probes import kernel
        kernel.import_bcc()  # raises its one-line error
        return "unknown"
    try:
        text = (Path(spec.submodule_search_locations[0]) / "version.py").read_text()
    except OSError:
        return "unknown"
    m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", text)
    return m.group(1) if m else "unknown"


def assemble(source: Path) -> str:
    """The source as bcc compiles it: each `#include "NAME"` of a header beside it replaced by the
    header's text, recursively, each header once. bcc rewrites map calls (threads.lookup) only in
    the file it is given, never in a header it includes, so the headers reach it inside that file;
    they are read from beside the source, so an installed package finds its own."""
    seen = {source.name}

    def inline(m: re.Match) -> str:
        name = m.group(1)
        path = source.parent / name
        if not path.is_file():
            return m.group(0)  # not ours (none today): the compiler's include path finds it
        if name in seen:
            return f"/* {name}: included above */"
        seen.add(name)
        return f"/* ---- {name} ---- */\n{INCLUDE.sub(inline, path.read_text())}\n/* ---- end of {name} ---- */"

    return INCLUDE.sub(inline, source.read_text())


def compiled(source: Path, cflags: list[str], headers: Path, status=None, note=None) -> dict:
    """The compiled object of `source` with `cflags` (and the BTF-derived flags the child adds):
    from the cache, or compiled now in a child process and cached. `status(text)` shows progress
    while compiling; `note(text)` says once why the cache was not used."""
    key = bpf_cache.key(source, cflags, headers, bcc_version())
    where = bpf_cache.folder()
    dfd = None
    if where is not None:
        try:
            dfd = bpf_cache.open_folder(where)
        except bpf_cache.Unusable as e:
            if note:
                note(f"the compiled-program cache is not used ({e}); each run compiles")
    try:
        if dfd is not None:
            payload = bpf_cache.read(dfd, key)
            if payload is not None:
                try:
                    return decode(payload)
                except ValueError:
                    pass  # damaged: compiled again and replaced below
        if status:
            status("compiling the BPF program (cached for the next run)")
        obj = _run_child(source, cflags)
        if dfd is not None:
            try:
                bpf_cache.write(dfd, key, encode(obj))
            except OSError as e:
                if note:
                    note(f"the compiled program could not be cached ({e.strerror or e})")
        return obj
    finally:
        if dfd is not None:
            os.close(dfd)


def _run_child(source: Path, cflags: list[str]) -> dict:
    request = json.dumps({"source": str(source), "cflags": cflags})
    try:
        p = subprocess.run([sys.executable, "-m", "ckptrace.probes.bpf_compile"], input=request.encode(),
                           capture_output=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise EbpfUnavailable(f"compiling the BPF program took more than {TIMEOUT_S} s") from None
    try:
        reply = json.loads(p.stdout)
    except ValueError:
        last = (p.stderr.decode(errors="replace").strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        if last.startswith(ERROR_PREFIX):  # the child's own line (kernel._exit_on_fatal_compile_error): LLVM stopped
            raise EbpfUnavailable(last[len(ERROR_PREFIX):]) from None
        raise EbpfUnavailable(f"the BPF compiler process failed: {last}") from None
    if "error" in reply:
        err = reply["error"]
        raise ERRORS.get(err.get("class"), EbpfUnavailable)(str(err.get("message")))
    return decode(json.dumps(reply["object"]).encode())


def encode(obj: dict) -> bytes:
    """The object as JSON (instructions in base64)."""
    doc = {**obj, "functions": {n: {"insns": base64.b64encode(f["insns"]).decode(), "relocs": f["relocs"]}
                                for n, f in obj["functions"].items()}}
    return json.dumps(doc, sort_keys=True).encode()


def decode(data: bytes) -> dict:
    """An object from encode()'s JSON, every field checked; ValueError when anything is off."""
    try:
        doc = json.loads(data)
        maps, funcs = doc["maps"], doc["functions"]
        out = {"license": doc["license"], "kern_version": doc["kern_version"], "kernel": doc["kernel"],
               "maps": [], "functions": {}}
        _check(isinstance(out["license"], str) and len(out["license"]) < 128, "license")
        _check(_int(out["kern_version"], 0, 1 << 32), "kern_version")
        kernel = out["kernel"]
        _check(isinstance(kernel, dict) and isinstance(kernel.get("sched"), bool)
               and isinstance(kernel.get("sched_note"), str) and isinstance(kernel.get("rss"), bool), "kernel")
        _check(isinstance(maps, list) and len(maps) < 1024, "maps")
        for m in maps:
            spec = {k: m[k] for k in ("name", "type", "key_size", "leaf_size", "max_entries", "flags",
                                      "key_desc", "leaf_desc")}
            _check(isinstance(spec["name"], str) and NAME.fullmatch(spec["name"]) is not None, "map name")
            _check(spec["type"] in MAP_TYPES, f"map type {spec['type']!r}")
            for k, hi in (("key_size", 1 << 16), ("leaf_size", 1 << 24), ("max_entries", 1 << 31),
                          ("flags", 1 << 16)):
                _check(_int(spec[k], 0, hi), f"map {k}")
            for k, size in (("key_desc", "key_size"), ("leaf_desc", "leaf_size")):
                if spec[size]:
                    _check(ct.sizeof(decode_type(spec[k])) == spec[size], f"map {spec['name']} {k}")
            out["maps"].append(spec)
        _check(isinstance(funcs, dict) and len(funcs) < 4096, "functions")
        for name, f in funcs.items():
            _check(NAME.fullmatch(name) is not None, "function name")
            insns = base64.b64decode(f["insns"], validate=True)
            _check(0 < len(insns) <= 8 * MAX_INSNS and len(insns) % 8 == 0, f"{name}: instructions")
            relocs = f["relocs"]
            _check(isinstance(relocs, list), f"{name}: relocations")
            for r in relocs:
                _check(isinstance(r, list) and len(r) == 2 and _int(r[0], 0, len(insns) // 8 - 1)
                       and _int(r[1], 0, len(maps) - 1), f"{name}: relocation")
                _check(insns[r[0] * 8] == LD_IMM64 and insns[r[0] * 8 + 1] >> 4 in (PSEUDO_MAP_FD, PSEUDO_MAP_VALUE),
                       f"{name}: relocation of a non-map instruction")
            out["functions"][name] = {"insns": insns, "relocs": [list(r) for r in relocs]}
        return out
    except (KeyError, TypeError, AttributeError, ValueError, RecursionError) as e:
        raise ValueError(f"not a compiled BPF object: {e}") from None


def _int(v, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(what)


# --------------------------------------------------------------------------------------------
# The child: compile with bcc, print the object


def _compile(source: Path, cflags: list[str]) -> dict:
    from ckptrace.probes import kernel

    extra, sched, sched_note = kernel.btf_cflags()
    bcc = kernel.import_bcc()
    from bcc.libbcc import lib

    for name, res, args in (
            ("bpf_num_tables", ct.c_size_t, [ct.c_void_p]),
            ("bpf_table_name", ct.c_char_p, [ct.c_void_p, ct.c_size_t]),
            ("bpf_table_fd_id", ct.c_int, [ct.c_void_p, ct.c_size_t]),
            ("bpf_table_key_size_id", ct.c_size_t, [ct.c_void_p, ct.c_size_t]),
            ("bpf_table_leaf_size_id", ct.c_size_t, [ct.c_void_p, ct.c_size_t]),
            ("bpf_table_key_desc_id", ct.c_char_p, [ct.c_void_p, ct.c_size_t]),
            ("bpf_table_leaf_desc_id", ct.c_char_p, [ct.c_void_p, ct.c_size_t])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    flags = [f.encode() for f in [*cflags, *extra]]
    array = (ct.c_char_p * len(flags))(*flags)
    failure = None
    sys.stderr.flush()
    terminal = os.dup(2)  # the pipe to the parent: LLVM's fatal error is one line there (see _run_child)
    try:
        with kernel.captured_output() as out, kernel.fatal_compile_errors_reported(bcc, terminal):
            module = lib.bpf_module_create_c_from_string(assemble(source).encode(), 0, array, len(flags), True, None)
            if not module:
                failure = Exception(f"Failed to compile BPF module {source}")
    finally:
        os.close(terminal)
    if failure is not None:
        raise kernel.bpf_failure(out[0], failure)
    try:
        maps, by_fd = [], {}
        for i in range(lib.bpf_num_tables(module)):
            name = lib.bpf_table_name(module, i).decode()
            by_fd[lib.bpf_table_fd_id(module, i)] = len(maps)
            maps.append({"name": name, "type": lib.bpf_table_type_id(module, i),
                         "key_size": lib.bpf_table_key_size_id(module, i),
                         "leaf_size": lib.bpf_table_leaf_size_id(module, i),
                         "max_entries": lib.bpf_table_max_entries_id(module, i),
                         "flags": lib.bpf_table_flags_id(module, i),
                         "key_desc": json.loads(lib.bpf_table_key_desc_id(module, i) or b'""'),
                         "leaf_desc": json.loads(lib.bpf_table_leaf_desc_id(module, i) or b'""')})
        functions = {}
        for i in range(lib.bpf_num_functions(module)):
            name = lib.bpf_function_name(module, i)
            insns = ct.string_at(lib.bpf_function_start(module, name), lib.bpf_function_size(module, name))
            functions[name.decode()] = {"insns": insns, "relocs": _relocations(name.decode(), insns, by_fd)}
        return {"license": lib.bpf_module_license(module).decode(), "kern_version": lib.bpf_module_kern_version(module),
                "kernel": {"sched": sched, "sched_note": sched_note,
                           "rss": not isinstance(kernel.rss_counters(), str)},
                "maps": maps, "functions": functions}
    finally:
        lib.bpf_module_destroy(module)


def _relocations(name: str, insns: bytes, by_fd: dict[int, int]) -> list[list[int]]:
    """[instruction index, map index] of every 64-bit load of a map's descriptor (or a value in
    it). Anything a loader would have to resolve otherwise (BTF ids, calls between programs) is
    refused: such an object could not be loaded from the cache as it was compiled."""
    out = []
    i, n = 0, len(insns) // 8
    while i < n:
        code, src = insns[i * 8], insns[i * 8 + 1] >> 4
        if code == LD_IMM64:
            if src in (PSEUDO_MAP_FD, PSEUDO_MAP_VALUE):
                fd = int.from_bytes(insns[i * 8 + 4:i * 8 + 8], "little", signed=True)
                if fd not in by_fd:
                    raise EbpfUnavailable(f"BPF program {name}: instruction {i} loads descriptor {fd}, not a map of it")
                out.append([i, by_fd[fd]])
            elif src:
                raise EbpfUnavailable(f"BPF program {name}: instruction {i} needs a loader ckptrace does not have "
                                      f"(pseudo source {src})")
            i += 2
            continue
        if code == CALL and src == PSEUDO_CALL:
            raise EbpfUnavailable(f"BPF program {name}: calls another BPF function (not supported by the cache)")
        i += 1
    return out


def main() -> None:
    request = json.loads(sys.stdin.buffer.read())
    try:
        obj = _compile(Path(request["source"]), list(request["cflags"]))
        reply = {"object": json.loads(encode(obj))}
    except CkptraceError as e:
        reply = {"error": {"class": type(e).__name__, "message": str(e)}}
    sys.stdout.write(json.dumps(reply))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
