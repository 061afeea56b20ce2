"""A compiled BPF object loaded into the kernel and run, without a compiler in this process.

bcc's Python module links libbcc, which carries clang and LLVM: importing it maps about 60 MiB
and a compile leaves about 60 MiB more behind, for as long as a recorder or `serve` runs. The
compile happens elsewhere (probes/bpf_compile.py: in a child process, or the cached result of
one); this module does the rest with libbcc_bpf, bcc's own runtime library without the compiler
(the same C calls bcc's Python module makes): create the maps, relocate their descriptors into
the instructions, load each program (the verifier's log captured, as bcc prints it), attach
uprobes and tracepoints, read and write maps, drain the ring buffer.

`Program` offers the part of bcc's `BPF` object the recorder uses, with the same names and
semantics, except that a uprobe is attached at a file offset (the probe plan's), not at an
address for bcc to convert.
"""
from __future__ import annotations

import ctypes as ct
import errno
import functools
import os
import re

from ckptrace.core.errors import EbpfUnavailable

KPROBE, TRACEPOINT, PERF_EVENT, RAW_TRACEPOINT = 2, 5, 7, 17  # enum bpf_prog_type
MAP_HASH, MAP_ARRAY, MAP_PERCPU_ARRAY, MAP_RINGBUF = 1, 2, 6, 27  # enum bpf_map_type
MAP_TYPES = {MAP_HASH, MAP_ARRAY, MAP_PERCPU_ARRAY, MAP_RINGBUF}  # what the cache may hold (see bpf_compile)
PROBE_ENTRY, PROBE_RETURN = 0, 1  # bcc's enum bpf_probe_attach_type
LIBRARY = "libbcc_bpf.so.0"
_RINGBUF_CB = ct.CFUNCTYPE(ct.c_int, ct.c_void_p, ct.c_void_p, ct.c_int)
_EVENT_CHARS = re.compile(rb"[^a-zA-Z0-9_]")

# bcc's table key/leaf descriptions name C types; these are bcc's own ctypes for them.
C_TYPES = {
    "_Bool": ct.c_bool, "char": ct.c_char, "unsigned char": ct.c_ubyte, "signed char": ct.c_byte,
    "short": ct.c_short, "unsigned short": ct.c_ushort, "int": ct.c_int, "unsigned int": ct.c_uint,
    "long": ct.c_long, "unsigned long": ct.c_ulong, "long long": ct.c_longlong,
    "unsigned long long": ct.c_ulonglong, "float": ct.c_float, "double": ct.c_double,
    "__int128": ct.c_int64 * 2, "unsigned __int128": ct.c_uint64 * 2,
}


@functools.cache
def library() -> ct.CDLL:
    """libbcc_bpf with the signatures of bcc 0.26's libbpf.h; EbpfUnavailable when missing."""
    try:
        lib = ct.CDLL(LIBRARY, use_errno=True)
    except OSError:
        raise EbpfUnavailable(f"{LIBRARY} (bcc's runtime library) is not installed: install libbpfcc "
                              "(apt-get install libbpfcc python3-bpfcc)") from None
    sig = {
        "bcc_create_map": (ct.c_int, [ct.c_int, ct.c_char_p, ct.c_int, ct.c_int, ct.c_int, ct.c_int]),
        "bcc_prog_load": (ct.c_int, [ct.c_int, ct.c_char_p, ct.c_void_p, ct.c_int, ct.c_char_p, ct.c_uint,
                                     ct.c_int, ct.c_char_p, ct.c_uint]),
        "bpf_update_elem": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_void_p, ct.c_ulonglong]),
        "bpf_lookup_elem": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_void_p]),
        "bpf_delete_elem": (ct.c_int, [ct.c_int, ct.c_void_p]),
        "bpf_get_first_key": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_size_t]),
        "bpf_get_next_key": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_void_p]),
        "bpf_attach_uprobe": (ct.c_int, [ct.c_int, ct.c_int, ct.c_char_p, ct.c_char_p, ct.c_ulonglong, ct.c_int,
                                         ct.c_uint32]),
        "bpf_detach_uprobe": (ct.c_int, [ct.c_char_p]),
        "bpf_attach_tracepoint": (ct.c_int, [ct.c_int, ct.c_char_p, ct.c_char_p]),
        "bpf_detach_tracepoint": (ct.c_int, [ct.c_char_p, ct.c_char_p]),
        "bpf_attach_raw_tracepoint": (ct.c_int, [ct.c_int, ct.c_char_p]),
        "bpf_close_perf_event_fd": (ct.c_int, [ct.c_int]),
        "bpf_attach_perf_event": (ct.c_int, [ct.c_int, ct.c_uint32, ct.c_uint32, ct.c_uint64, ct.c_uint64, ct.c_int,
                                             ct.c_int, ct.c_int]),
        "bpf_new_ringbuf": (ct.c_void_p, [ct.c_int, _RINGBUF_CB, ct.c_void_p]),
        "bpf_add_ringbuf": (ct.c_int, [ct.c_void_p, ct.c_int, _RINGBUF_CB, ct.c_void_p]),
        "bpf_consume_ringbuf": (ct.c_int, [ct.c_void_p]),
        "bpf_free_ringbuf": (None, [ct.c_void_p]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def decode_type(desc):
    """A ctypes type from bcc's JSON description of a C type (as bcc's BPF._decode_table_type)."""
    if isinstance(desc, str):
        return C_TYPES[desc]
    anon, fields = [], []
    for t in desc[1]:
        if len(t) == 2:
            fields.append((t[0], decode_type(t[1])))
        elif len(t) == 3 and isinstance(t[2], list):
            fields.append((t[0], decode_type(t[1]) * t[2][0]))
        elif len(t) == 3 and isinstance(t[2], int):
            fields.append((t[0], decode_type(t[1]), t[2]))
        elif len(t) == 3 and t[2] in ("union", "struct", "struct_packed"):
            name = t[0] or f"__anon{len(anon)}"
            if not t[0]:
                anon.append(name)
            fields.append((name, decode_type(t)))
        else:
            raise ValueError(f"cannot decode the C type {t!r}")
    kind = desc[2] if len(desc) > 2 else "struct"
    body = {"_anonymous_": anon, "_fields_": fields}
    if kind == "struct_packed":
        body["_pack_"] = 1
    return type(str(desc[0]), (ct.Union if kind == "union" else ct.Structure,), body)


class Table:
    """One BPF map: bcc's table interface for hash and array maps (lookup, update, delete,
    iteration), and the ring buffer's open_ring_buffer."""

    def __init__(self, program: Program, name: str, fd: int, spec: dict):
        self.program, self.name, self.fd, self.spec = program, name, fd, spec
        self.map_type, self.max_entries = spec["type"], spec["max_entries"]
        self.Key = decode_type(spec["key_desc"]) if spec["key_size"] else None
        self.Leaf = decode_type(spec["leaf_desc"]) if spec["leaf_size"] else None

    def _plain(self, what: str) -> None:
        if self.map_type not in (MAP_HASH, MAP_ARRAY):
            raise TypeError(f"table {self.name}: {what} is for hash and array maps")

    def __getitem__(self, key):
        self._plain("lookup")
        leaf = self.Leaf()
        if library().bpf_lookup_elem(self.fd, ct.byref(key), ct.byref(leaf)) < 0:
            raise KeyError(key)
        return leaf

    def __setitem__(self, key, leaf) -> None:
        self._plain("update")
        if library().bpf_update_elem(self.fd, ct.byref(key), ct.byref(leaf), 0) < 0:
            err = ct.get_errno()
            raise OSError(err, f"could not update table {self.name}: {os.strerror(err)}")

    def __delitem__(self, key) -> None:
        self._plain("delete")
        if self.map_type == MAP_ARRAY:  # bcc: an array's entry is zeroed, never removed
            self[key] = self.Leaf()
        elif library().bpf_delete_elem(self.fd, ct.byref(key)) < 0:
            raise KeyError(key)

    def keys(self):
        """Every key, in the kernel's order (an array: 0 to max_entries - 1)."""
        self._plain("iteration")
        if self.map_type == MAP_ARRAY:
            return [self.Key(i) for i in range(self.max_entries)]
        out, key = [], self.Key()
        lib = library()
        if lib.bpf_get_first_key(self.fd, ct.byref(key), ct.sizeof(key)) < 0:
            return out
        while True:
            out.append(key)
            nxt = self.Key()
            if lib.bpf_get_next_key(self.fd, ct.byref(key), ct.byref(nxt)) < 0:
                return out
            key = nxt

    def values(self) -> list:
        out = []
        for k in self.keys():
            try:
                out.append(self[k])
            except KeyError:  # deleted by the kernel since it was listed
                pass
        return out

    def items(self) -> list:
        out = []
        for k in self.keys():
            try:
                out.append((k, self[k]))
            except KeyError:
                pass
        return out

    def __len__(self) -> int:
        return self.max_entries if self.map_type == MAP_ARRAY else len(self.keys())

    def open_ring_buffer(self, callback) -> None:
        """Call callback(ctx, data, size) for each record at Program.ring_buffer_consume()."""
        if self.map_type != MAP_RINGBUF:
            raise TypeError(f"table {self.name} is not a ring buffer")
        self.program._add_ring(self.fd, callback)


class Program:
    """A compiled object (probes/bpf_compile.py's dict) in the kernel: its maps created and its
    tracepoint__ programs attached now, as bcc's BPF() does (but those named in `skip`, b"category:event":
    attaching one only to detach it costs 0.1 to 0.3 s on a busy machine); other programs load on
    first use."""

    def __init__(self, obj: dict, skip: frozenset = frozenset()):
        self.obj = obj
        self.funcs: dict[str, int] = {}  # name -> program fd
        self.tables: dict[str, Table] = {}
        self.uprobes: dict[tuple, list[int]] = {}  # (ret, path, offset, pid) -> perf event fds
        self.tracepoints: dict[bytes, int] = {}
        self.raw_tracepoints: dict[bytes, int] = {}
        self.perf_events: dict[tuple[int, int], list[int]] = {}  # (type, config) -> one fd per CPU
        self._ring = None
        self._callbacks = []  # the ctypes callbacks the ring buffer calls: kept alive here
        lib = library()
        try:
            for spec in obj["maps"]:
                fd = lib.bcc_create_map(spec["type"], spec["name"][:15].encode(), spec["key_size"],
                                        spec["leaf_size"], spec["max_entries"], spec["flags"])
                if fd < 0:
                    err = ct.get_errno()
                    raise EbpfUnavailable(f"the kernel refused to create the BPF map {spec['name']}: "
                                          f"{os.strerror(err)}")
                self.tables[spec["name"]] = Table(self, spec["name"], fd, spec)
            autoload = []  # bcc's: TRACEPOINT_PROBE(category, event) is attached at load
            for name in obj["functions"]:
                if name.startswith("tracepoint__"):
                    category, event = name[len("tracepoint__"):].split("__", 1)
                    if f"{category}:{event}".encode() not in skip:
                        autoload.append((f"{category}:{event}".encode(), name.encode()))
            self.attach_tracepoints(autoload)
        except BaseException:
            self.cleanup()
            raise

    def __getitem__(self, name: bytes) -> Table:
        return self.tables[name.decode()]

    def load_func(self, name: bytes, prog_type: int) -> int:
        """The program's fd, loading it (the kernel's verifier runs now) on first use. A refusal
        raises a bare Exception, as bcc's load_func does; bcc's runtime printed the verifier's
        log to stderr (the recorder's _quietly reads the reason from it)."""
        key = name.decode()
        if key in self.funcs:
            return self.funcs[key]
        func = self.obj["functions"].get(key)
        if func is None:
            raise Exception(f"Unknown program {key}")
        insns = bytearray(func["insns"])
        for at, index in func["relocs"]:  # ld_imm64 of a map: its imm is the map's fd in this process
            fd = self.tables[self.obj["maps"][index]["name"]].fd
            insns[at * 8 + 4:at * 8 + 8] = fd.to_bytes(4, "little", signed=True)
        buf = (ct.c_char * len(insns)).from_buffer(insns)
        fd = library().bcc_prog_load(prog_type, name[:15], buf, len(insns), self.obj["license"].encode(),
                                     self.obj["kern_version"], 0, None, 0)
        if fd < 0:
            err = ct.get_errno()
            raise Exception(f"Failed to load BPF program {key}: {os.strerror(err)}")
        self.funcs[key] = fd
        return fd

    def _uprobe(self, fn_name: bytes, path: str, offset: int, pid: int, ret: bool) -> None:
        fd = self.load_func(fn_name, KPROBE)
        full = path.encode()  # as this process reaches it: symbols.resolve_pid chose it by device and inode
        ev = self._event_name(ret, full, offset, pid)
        pfd = library().bpf_attach_uprobe(fd, PROBE_RETURN if ret else PROBE_ENTRY, ev, full, offset, pid, 0)
        if pfd < 0:
            err = ct.get_errno()
            hint = ("; another tracer holds a uprobe at this address with another reference counter "
                    "offset (bcc 0.26's Python passes a random one: docs/kernel-facts.md)") if err == errno.EINVAL else ""
            raise Exception(f"Failed to attach BPF to uprobe: {os.strerror(err)}{hint}")
        self.uprobes.setdefault((ret, full, offset, pid), []).append(pfd)

    @staticmethod
    def _event_name(ret: bool, path: bytes, offset: int, pid: int) -> bytes:
        return b"%s_%s_0x%x_%d" % (b"r" if ret else b"p", _EVENT_CHARS.sub(b"_", path), offset, pid)

    def attach_uprobe(self, path: str, offset: int, fn_name: bytes, pid: int = -1) -> None:
        """Run fn_name at file offset `offset` of the object at `path` in process `pid`."""
        self._uprobe(fn_name, path, offset, pid, ret=False)

    def attach_uretprobe(self, path: str, offset: int, fn_name: bytes, pid: int = -1) -> None:
        """Run fn_name when the function at `offset` of `path` returns, in process `pid`."""
        self._uprobe(fn_name, path, offset, pid, ret=True)

    def detach_uprobe(self, path: str, offset: int, pid: int = -1, ret: bool = False) -> None:
        """Remove what attach_uprobe (ret: attach_uretprobe) put there; KeyError if nothing."""
        full = path.encode()
        if (ret, full, offset, pid) not in self.uprobes:
            raise KeyError((path, offset, pid, ret))
        self._close_uprobes([(ret, full, offset, pid)])

    def detach_process(self, pid: int) -> None:
        """Remove every uprobe attached in process `pid`."""
        self._close_uprobes([k for k in self.uprobes if k[3] == pid])

    def _close_uprobes(self, keys: list) -> None:
        """Close these uprobes' perf events together, from up to 32 threads: each close waits for
        the kernel to be done with the probe (RCU grace periods of its own, 0.1 to 0.25 s each on a
        busy 2-core VM), and closes made at once share their waits (24 took 1.9 s instead of 3.2
        to 5.2 one by one; 256 took 26-29 s instead of 77-84 s, so 64 processes' 1,024 do not
        take minutes). The one detach path: a process that exits, serve's end, record's end."""
        lib = library()
        fds = [pfd for k in keys for pfd in self.uprobes.pop(k)]
        _close_all(fds)
        for ret, full, offset, pid in keys:
            lib.bpf_detach_uprobe(self._event_name(ret, full, offset, pid))  # a tracefs event, where one was made

    def detach_uretprobe(self, path: str, offset: int, pid: int = -1) -> None:
        self.detach_uprobe(path, offset, pid, ret=True)

    def attach_tracepoint(self, tp: bytes, fn_name: bytes) -> None:
        self.attach_tracepoints([(tp, fn_name)])

    def attach_tracepoints(self, pairs: list[tuple[bytes, bytes]]) -> None:
        """Attach each (b"category:event", program); the programs are loaded one by one (a
        verifier's log is read from stderr), the attaches made together: enabling a tracepoint
        waits for the other CPUs (its code is patched in), 0.05 to 0.1 s each on a busy 2-core VM."""
        fds = [self.load_func(fn, TRACEPOINT) for _, fn in pairs]
        lib = library()

        def attach(i: int) -> int:
            category, event = pairs[i][0].split(b":")
            return lib.bpf_attach_tracepoint(fds[i], category, event)
        results = _together(attach, range(len(pairs)))
        for (tp, _), fd in zip(pairs, results):
            if fd >= 0:
                self.tracepoints[tp] = fd
        for (tp, fn), fd in zip(pairs, results):
            if fd < 0:
                raise Exception(f"Failed to attach BPF program {fn.decode()} to tracepoint {tp.decode()}")

    def detach_tracepoint(self, tp: bytes) -> None:
        fd = self.tracepoints.pop(tp)
        library().bpf_close_perf_event_fd(fd)
        library().bpf_detach_tracepoint(*tp.split(b":"))

    def attach_raw_tracepoint(self, tp: bytes, fn_name: bytes) -> None:
        if tp in self.raw_tracepoints:
            raise Exception(f"Raw tracepoint {tp.decode()} has been attached")
        fd = library().bpf_attach_raw_tracepoint(self.load_func(fn_name, RAW_TRACEPOINT), tp)
        if fd < 0:
            raise Exception("Failed to attach BPF to raw tracepoint")
        self.raw_tracepoints[tp] = fd

    def detach_raw_tracepoint(self, tp: bytes) -> None:
        os.close(self.raw_tracepoints.pop(tp))

    def attach_perf_event(self, ev_type: int, ev_config: int, fn_name: bytes, sample_period: int = 1) -> None:
        """Run fn_name on every `sample_period`-th event (type, config) of any process, on every
        online CPU (as bcc's attach_perf_event with cpu=-1)."""
        if (ev_type, ev_config) in self.perf_events:
            raise Exception(f"perf event {ev_type}:{ev_config} has been attached")
        fd = self.load_func(fn_name, PERF_EVENT)
        lib, fds = library(), []
        for cpu in online_cpus():
            pfd = lib.bpf_attach_perf_event(fd, ev_type, ev_config, sample_period, 0, -1, cpu, -1)
            if pfd < 0:
                err = ct.get_errno()
                _close_all(fds)
                raise Exception(f"Failed to attach BPF program {fn_name.decode()} to perf event "
                                f"{ev_type}:{ev_config} on CPU {cpu}: {os.strerror(err)}")
            fds.append(pfd)
        self.perf_events[(ev_type, ev_config)] = fds

    def detach_perf_event(self, ev_type: int, ev_config: int) -> None:
        _close_all(self.perf_events.pop((ev_type, ev_config)))

    def _add_ring(self, map_fd: int, callback) -> None:
        cb = _RINGBUF_CB(lambda ctx, data, size: callback(ctx, data, size))
        self._callbacks.append(cb)
        lib = library()
        if self._ring is None:
            self._ring = lib.bpf_new_ringbuf(map_fd, cb, None)
            if not self._ring:
                raise Exception("Could not open ring buffer")
        elif lib.bpf_add_ringbuf(self._ring, map_fd, cb, None) < 0:
            raise Exception("Could not open ring buffer")

    def ring_buffer_consume(self) -> None:
        if self._ring is not None:
            library().bpf_consume_ringbuf(self._ring)

    def cleanup(self) -> None:
        """Detach everything and close every descriptor (the kernel then frees the programs and
        maps); safe to call twice."""
        lib = library()
        self._close_uprobes(list(self.uprobes))
        tps = list(self.tracepoints)
        _close_all([self.tracepoints.pop(tp) for tp in tps])
        for tp in tps:
            lib.bpf_detach_tracepoint(*tp.split(b":"))
        for tp in list(self.raw_tracepoints):
            self.detach_raw_tracepoint(tp)
        for ev in list(self.perf_events):
            self.detach_perf_event(*ev)
        if self._ring is not None:
            lib.bpf_free_ringbuf(self._ring)
            self._ring = None
        for fd in self.funcs.values():
            os.close(fd)
        self.funcs = {}
        for table in self.tables.values():
            os.close(table.fd)
        self.tables = {}


THREADS = 32  # at most, while attaching tracepoints or closing probes; gone when done


def online_cpus(path: str = "/sys/devices/system/cpu/online") -> list[int]:
    """The online CPUs, from the kernel's list ("0-3,5")."""
    with open(path) as f:
        text = f.read().strip()
    cpus: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        cpus += range(int(lo), int(hi or lo) + 1)
    return cpus


def _close_all(fds: list[int]) -> None:
    """Close perf event descriptors concurrently (see Program._close_uprobes)."""
    _together(library().bpf_close_perf_event_fd, fds)


def _together(call, items) -> list:
    """call(item) for each item, in threads at once (ctypes lets the GIL go during the call):
    the kernel's waits for the other CPUs overlap."""
    items = list(items)
    if len(items) <= 1:
        return [call(i) for i in items]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(len(items), THREADS), thread_name_prefix="ckptrace-bpf") as pool:
        return list(pool.map(call, items))
