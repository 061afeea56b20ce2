"""A Debian 12 arm64 virtual machine for tests/test_aarch64_vm.py: built once from Debian's packages,
cached outside the checkout, booted headless under qemu-system-aarch64 (TCG emulation).

The image is built without running any arm64 code on the host: the host's apt resolves and
downloads bookworm's arm64 packages (the Essential set, Debian's arm64 kernel and headers, bcc,
bpftool, g++, make) into a private apt folder, and `dpkg-deb -x` unpacks each one. No maintainer
script runs (under qemu-user they took 25 minutes): what the guest needs of theirs is done here
(the accounts from base-passwd, the alternatives awk, cc, c++, cpp and which) or at the image's
first boot inside the VM (ldconfig, depmod), which the build does once and keeps on the disk. The
initramfs is made here too: busybox-static and the modules the boot needs (virtio, ext4, 9p, with
their dependencies read from each module's .modinfo), in a gzip'ed cpio. ckptrace's Python
dependencies are PyPI's aarch64 wheels unpacked on the host (`pip install --target --platform`).
The folder is `${CKPTRACE_CACHE:-/var/cache/ckptrace}/aarch64-vm/KEY`, KEY a hash of everything
that goes into the image (suite, packages, dependencies, the guest's init and the initramfs').
Nothing on the host changes but that folder: no chroot, no binfmt handler, no mount.

A run: the working tree shared read-only by virtio-9p (tag `src`), a fresh host folder shared
writable (tag `out`); the guest's init mounts both, runs `out/job.sh` as root, writes its status to
`out/job.rc` and powers off. Runs and builds of one image take its lock, one at a time: the disk
keeps what a run leaves (the BPF cache, the workload's build), so the next boot reuses it.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = "bookworm"
MIRROR = os.environ.get("CKPTRACE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"  # the host's debian-archive-keyring
# Unpacked with their dependencies (no recommends), besides the Essential set: the kernel and its
# headers (bcc compiles against them), bcc's Python bindings, bpftool (task_struct offsets from BTF),
# the compiler the workload is built with, mount (not Essential), kmod (depmod, modprobe),
# busybox-static (the initramfs).
PACKAGES = ["linux-image-arm64", "linux-headers-arm64", "python3", "python3-bpfcc", "libbpfcc",
            "bpftool", "g++", "make", "libc6-dev", "util-linux", "mount", "procps", "kmod", "busybox-static"]
# What their postinst scripts would have made with update-alternatives, as plain links.
ALTERNATIVES = {"usr/bin/awk": "mawk", "usr/bin/which": "which.debianutils", "usr/bin/cc": "gcc",
                "usr/bin/c++": "g++", "lib/cpp": "/usr/bin/cpp"}
# Modules the initramfs loads (with what they depend on): the disk (virtio-blk on virtio-mmio/pci),
# its filesystem (and the crc32c ext4 asks the crypto API for: a softdep, not a dependency), the 9p shares.
INITRAMFS_MODULES = ["virtio_mmio", "virtio_pci", "virtio_blk", "crc32c_generic", "ext4", "9pnet_virtio", "9p"]
PYTHON_TAG = "3.11"  # bookworm's python3
WHEEL_PLATFORMS = ["manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_28_aarch64",
                   "manylinux_2_34_aarch64"]
DEPS_DIR = "/opt/ckptrace-deps"  # in the guest: PYTHONPATH for ckptrace's dependencies

# The initramfs' /init (busybox): the modules, the disk, then the guest's init on it.
INITRAMFS_INIT = r"""#!/bin/busybox sh
B=/bin/busybox
$B mount -t devtmpfs devtmpfs /dev
for m in $($B cat /modules); do $B insmod /m/$m.ko || echo "initramfs: insmod $m failed"; done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do $B usleep 100000; i=$((i + 1)); done
$B mount -t ext4 -o rw /dev/vda /root || { echo "initramfs: cannot mount /dev/vda"; $B poweroff -f; }
$B umount /dev
exec $B switch_root /root /sbin/ckptrace-vm-init
"""

# The guest's init (no systemd: a shell): the first boot's configuration (kept on the disk), mounts,
# the job, power off. Its status line and the job's own output go to the serial console and to out/.
GUEST_INIT = r"""#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
# What the packages' maintainer scripts would have done, once (the image was unpacked, not installed).
[ -s /etc/ld.so.cache ] || ldconfig
[ -s /lib/modules/$(uname -r)/modules.dep ] || depmod -a
mkdir -p /src /out
mount -t 9p -o trans=virtio,version=9p2000.L,ro src /src
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 out /out
echo "ckptrace-vm: booted in $(cut -d' ' -f1 /proc/uptime) s, kernel $(uname -r) $(uname -m), page $(getconf PAGESIZE)"
/bin/sh /out/job.sh </dev/null >/out/job.log 2>&1
rc=$?
echo "$rc" >/out/job.rc
echo "ckptrace-vm: job exit $rc after $(cut -d' ' -f1 /proc/uptime) s"
sync
umount /out
mount -o remount,ro /
echo o >/proc/sysrq-trigger
sleep 60
"""

QEMU = "qemu-system-aarch64"
HOST_TOOLS = {"qemu-system-aarch64": "qemu-system-arm", "mkfs.ext4": "e2fsprogs", "apt-get": "apt",
              "dpkg-deb": "dpkg"}


def cache_root() -> Path:
    return Path(os.environ.get("CKPTRACE_CACHE") or "/var/cache/ckptrace") / "aarch64-vm"


def _dependencies() -> list[str]:
    import tomllib
    root = Path(__file__).resolve().parent.parent
    return tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]


def image_key() -> str:
    spec = {"suite": SUITE, "packages": PACKAGES, "alternatives": ALTERNATIVES, "initramfs": INITRAMFS_MODULES,
            "initramfs_init": INITRAMFS_INIT, "python": PYTHON_TAG, "platforms": WHEEL_PLATFORMS,
            "deps": _dependencies(), "init": GUEST_INIT, "method": "unpacked"}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def missing_host_tools() -> list[str]:
    """The Debian packages this host lacks for building and booting the VM."""
    missing = {pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None}
    if not Path(KEYRING).is_file():
        missing.add("debian-archive-keyring")
    return sorted(missing)


def _log(msg: str) -> None:
    print(f"aarch64-vm: {msg}", file=sys.stderr, flush=True)


def _run(argv: list[str], log, **kw) -> None:
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, **kw)


def _download(apt: Path, log) -> list[Path]:
    """The packages' arm64 .debs and their dependencies', by the host's apt with a private state
    (its own sources, lists, archive folder and an empty dpkg status), nothing of the host's."""
    for d in ("etc/apt/apt.conf.d", "etc/apt/preferences.d", "etc/apt/sources.list.d",
              "var/lib/apt/lists/partial", "var/cache/apt/archives/partial", "var/lib/dpkg"):
        (apt / d).mkdir(parents=True, exist_ok=True)
    (apt / "var/lib/dpkg/status").write_text("")
    (apt / "etc/apt/sources.list").write_text(f"deb [arch=arm64 signed-by={KEYRING}] {MIRROR} {SUITE} main\n")
    conf = apt / "apt.conf"
    conf.write_text(f'''Dir "{apt}/";
Dir::State::status "{apt}/var/lib/dpkg/status";
Dir::Etc::main "{conf}";
Dir::Etc::Parts "{apt}/etc/apt/apt.conf.d";
Dir::Etc::PreferencesParts "{apt}/etc/apt/preferences.d";
Dir::Etc::SourceParts "{apt}/etc/apt/sources.list.d";
Dir::Etc::SourceList "{apt}/etc/apt/sources.list";
APT::Architecture "arm64";
APT::Architectures {{ "arm64"; }};
APT::Install-Recommends "false";
Acquire::Languages "none";
''')
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8", "APT_CONFIG": str(conf)}
    _run(["apt-get", "update", "-q"], log, env=env)
    _run(["apt-get", "install", "--download-only", "-q", "-y", "?essential"] + PACKAGES, log, env=env)
    return sorted((apt / "var/cache/apt/archives").glob("*.deb"))


def _unpack(debs: list[Path], rootfs: Path, log) -> None:
    def one(deb: Path) -> str:
        p = subprocess.run(["dpkg-deb", "-x", str(deb), str(rootfs)], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True)
        return f"dpkg-deb -x {deb.name}: {p.stderr.strip()}" if p.returncode else ""
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        errors = [e for e in pool.map(one, debs) if e]
    log.write(f"unpacked {len(debs)} packages\n")
    if errors:
        raise RuntimeError("; ".join(errors))


def _configure(rootfs: Path) -> None:
    """What the maintainer scripts would have made that the guest needs before its first boot."""
    for name in ("passwd", "group"):  # base-passwd's postinst starts from these
        shutil.copy(rootfs / f"usr/share/base-passwd/{name}.master", rootfs / "etc" / name)
    for link, target in ALTERNATIVES.items():
        (rootfs / link).symlink_to(target)
    for d in ("proc", "sys", "dev", "tmp", "run", "root", "src", "out"):
        (rootfs / d).mkdir(exist_ok=True)
    (rootfs / "etc/hostname").write_text("ckptrace-vm\n")


def _modinfo(ko: Path) -> dict[str, str]:
    """A module's .modinfo section (key=value strings), read from its ELF64 section headers."""
    import struct
    data = ko.read_bytes()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def section(i):
        name, _type, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        return name, off, size
    _, stroff, _ = section(shstrndx)
    for i in range(shnum):
        name, off, size = section(i)
        if data[stroff + name:data.index(b"\0", stroff + name)] == b".modinfo":
            fields = (f.split(b"=", 1) for f in data[off:off + size].split(b"\0") if b"=" in f)
            return {k.decode(): v.decode(errors="replace") for k, v in fields}
    return {}


def _cpio(entries: list[tuple[str, int, bytes, tuple[int, int]]]) -> bytes:
    """A newc cpio archive of (name, mode, data, (rdev major, minor)) entries."""
    out = bytearray()
    def pad():
        out.extend(b"\0" * (-len(out) % 4))
    for ino, (name, mode, data, rdev) in enumerate(entries + [("TRAILER!!!", 0, b"", (0, 0))], 1):
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name) + 1, 0]
        out += b"070701" + b"".join(b"%08X" % f for f in fields) + name.encode() + b"\0"
        pad()
        out += data
        pad()
    return bytes(out)


def _initramfs(rootfs: Path, kernel: str) -> bytes:
    """busybox, the modules INITRAMFS_MODULES need (dependencies first) and INITRAMFS_INIT."""
    mods = rootfs / "lib/modules" / kernel
    by_name = {ko.name[:-3].replace("-", "_"): ko for ko in mods.rglob("*.ko")}
    order: list[str] = []
    def visit(name: str) -> None:
        name = name.replace("-", "_")
        if name in order or name not in by_name:  # not a file: built into the kernel
            return
        for dep in filter(None, _modinfo(by_name[name]).get("depends", "").split(",")):
            visit(dep)
        order.append(name)
    for m in INITRAMFS_MODULES:
        visit(m)
    entries = [("bin", 0o40755, b"", (0, 0)), ("dev", 0o40755, b"", (0, 0)), ("dev/console", 0o20600, b"", (5, 1)),
               ("root", 0o40755, b"", (0, 0)), ("m", 0o40755, b"", (0, 0)),
               ("bin/busybox", 0o100755, (rootfs / "bin/busybox").read_bytes(), (0, 0)),
               ("init", 0o100755, INITRAMFS_INIT.encode(), (0, 0)),
               ("modules", 0o100644, "".join(m + "\n" for m in order).encode(), (0, 0))]
    entries += [(f"m/{m}.ko", 0o100644, by_name[m].read_bytes(), (0, 0)) for m in order]
    return gzip.compress(_cpio(entries), 6)


def _install_wheels(target: Path, log) -> None:
    """PyPI's aarch64 wheels of ckptrace's dependencies, unpacked into the image (nothing runs here)."""
    argv = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile",
            "--target", str(target), "--only-binary=:all:", "--implementation", "cp",
            "--python-version", PYTHON_TAG]
    for p in WHEEL_PLATFORMS:
        argv += ["--platform", p]
    _run(argv + _dependencies(), log)


def _build(dest: Path, log) -> dict:
    work = dest.parent / f"{dest.name}.build"
    if work.exists():
        shutil.rmtree(work)
    rootfs = work / "rootfs"
    rootfs.mkdir(parents=True)
    times = {}
    t = time.monotonic()
    debs = _download(work / "apt", log)
    times["download_s"] = round(time.monotonic() - t)
    _log(f"{len(debs)} packages downloaded in {times['download_s']} s")
    t = time.monotonic()
    _unpack(debs, rootfs, log)
    shutil.rmtree(work / "apt")
    _configure(rootfs)
    times["unpack_s"] = round(time.monotonic() - t)
    _log(f"unpacked in {times['unpack_s']} s")
    t = time.monotonic()
    _install_wheels(rootfs / DEPS_DIR.lstrip("/"), log)
    times["wheels_s"] = round(time.monotonic() - t)
    init = rootfs / "sbin/ckptrace-vm-init"
    init.write_text(GUEST_INIT)
    init.chmod(0o755)
    kernels = sorted((rootfs / "boot").glob("vmlinuz-*"))
    if len(kernels) != 1:
        raise RuntimeError(f"expected one kernel in /boot, found {kernels}")
    kernel = kernels[0].name.removeprefix("vmlinuz-")
    shutil.copy(kernels[0], work / "vmlinuz")
    (work / "initrd.img").write_bytes(_initramfs(rootfs, kernel))
    used = int(subprocess.run(["du", "-sb", str(rootfs)], check=True, capture_output=True,
                              text=True).stdout.split()[0])
    size = used + used // 2 + (1 << 30)  # room for the workload's build, the BPF cache, the runs' files
    t = time.monotonic()
    _run(["mkfs.ext4", "-q", "-F", "-L", "ckptrace-vm", "-d", str(rootfs), str(work / "disk.img"),
          str(size // 1024) + "k"], log)
    times["mkfs_s"] = round(time.monotonic() - t)
    shutil.rmtree(rootfs)
    # The first boot: ldconfig and depmod in the guest (GUEST_INIT), kept on the disk.
    t = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ckptrace-aarch64-vm-") as tmp:
        (Path(tmp) / "src").mkdir()
        (Path(tmp) / "out").mkdir()
        run = boot(work, Path(tmp) / "src", Path(tmp) / "out", "true\n", timeout=900)
        log.write(run.stdout + run.stderr)
        rc = Path(tmp) / "out/job.rc"
        if not rc.exists() or rc.read_text().strip() != "0":
            raise RuntimeError(f"the image's first boot failed (QEMU exit {run.returncode}):\n{run.stdout[-3000:]}")
    times["first_boot_s"] = round(time.monotonic() - t)
    _log(f"first boot (ldconfig, depmod) in {times['first_boot_s']} s")
    return {"kernel": kernel, "packages": len(debs), "disk_bytes": size, **times}


def ensure_image() -> Path:
    """The image's folder (disk.img, vmlinuz, initrd.img, built.json), built if missing. Hold
    image_lock() around it and the run."""
    root = cache_root()
    dest = root / image_key()
    if (dest / "built.json").is_file():
        return dest
    missing = missing_host_tools()
    if missing:
        raise RuntimeError(f"missing host packages: apt-get install {' '.join(missing)}")
    root.mkdir(parents=True, exist_ok=True)
    logpath = root / f"{dest.name}.build.log"
    _log(f"building the Debian 12 arm64 image in {dest} (log: {logpath}); a few minutes once")
    start = time.monotonic()
    with logpath.open("w") as log:
        try:
            info = _build(dest, log)
        except subprocess.CalledProcessError as e:
            log.flush()
            tail = "\n".join(logpath.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"building the arm64 image failed: {e} (log: {logpath}):\n{tail}") from None
    info["cold_build_s"] = round(time.monotonic() - start)
    work = dest.parent / f"{dest.name}.build"
    (work / "built.json").write_text(json.dumps(info, indent=1) + "\n")
    if dest.exists():
        shutil.rmtree(dest)
    work.rename(dest)
    _log(f"image built in {info['cold_build_s']} s: {info}")
    return dest


@contextlib.contextmanager
def image_lock():
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{image_key()}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def boot(image: Path, src: Path, out: Path, job: str, timeout: float, smp: int = 2,
         mem_mib: int = 2048, shares: dict[str, Path] | None = None) -> subprocess.CompletedProcess:
    """Boots the image once: `job` (a shell script) runs as root in the guest with the working tree
    at /src (read-only) and `out` at /out; returns QEMU's run (its output: the serial console).
    `shares`: more host folders, read-only, by tag; the job mounts the ones it uses (`mount -t 9p
    -o trans=virtio,version=9p2000.L,ro TAG DIR`), so they are no part of the image."""
    (out / "job.sh").write_text(job)
    argv = [QEMU, "-M", "virt", "-accel", "tcg,thread=multi", "-cpu", "max,pauth-impdef=on",
            "-smp", str(smp), "-m", str(mem_mib), "-nographic", "-no-reboot", "-nic", "none",
            "-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"),
            "-append", "console=ttyAMA0 panic=-1",
            "-drive", f"file={image / 'disk.img'},format=raw,if=virtio",
            "-virtfs", f"local,path={src},mount_tag=src,security_model=none,readonly=on",
            "-virtfs", f"local,path={out},mount_tag=out,security_model=none"]
    for tag, path in (shares or {}).items():
        argv += ["-virtfs", f"local,path={path},mount_tag={tag},security_model=none,readonly=on"]
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, errors="replace") as p:
        _booted.add(p)
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise
        finally:
            _booted.discard(p)
    return subprocess.CompletedProcess(argv, p.returncode, stdout, stderr)


_booted: set[subprocess.Popen] = set()


def stop_guests() -> None:
    """Kills every guest still running (the session ended before the test that waits for it)."""
    for p in list(_booted):
        p.kill()


XLLAMACPP = "xllamacpp==2026.10.11549"


def xllamacpp_wheel() -> Path:
    """PyPI's xllamacpp manylinux aarch64 wheel (llama.cpp build 11549), downloaded once into
    `${CKPTRACE_CACHE:-/var/cache/ckptrace}/wheels/` and unpacked there: the folder holding its
    `xllamacpp` package (a PYTHONPATH entry). Pure extension module: it needs no other package."""
    where = cache_root().parent / "wheels" / f"{XLLAMACPP.replace('==', '-')}-aarch64"
    if (where / "xllamacpp" / "xllamacpp.abi3.so").exists():
        return where
    where.mkdir(parents=True, exist_ok=True)
    # One download and unpack at a time: CI's two pytest sessions may both want it (the guest's
    # prestart, test_symbols_aarch64.py).
    with open(where.parent / f"{where.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (where / "xllamacpp" / "xllamacpp.abi3.so").exists():
            subprocess.run(["python3", "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--platform",
                            "manylinux2014_aarch64", "--python-version", "3.12", "--implementation", "cp",
                            XLLAMACPP, "-d", str(where)], check=True, capture_output=True, timeout=600)
            wheel = next(where.glob("xllamacpp-*aarch64*.whl"))
            partial = Path(tempfile.mkdtemp(prefix="unpacked-", dir=where))
            subprocess.run(["python3", "-m", "zipfile", "-e", str(wheel), str(partial)], check=True)
            shutil.rmtree(where / "xllamacpp", ignore_errors=True)  # a copy cut short, without its .so
            os.replace(partial / "xllamacpp", where / "xllamacpp")
            shutil.rmtree(partial)
    return where


if __name__ == "__main__":  # build (or find) the image: python3 tests/aarch64_vm.py
    with image_lock():
        print(ensure_image())
