"""A Debian 12 arm64 virtual machine for tests/test_aarch64_vm.py: built once from Debian's packages,
cached outside the checkout, booted headless under qemu-system-aarch64 (TCG emulation).

The image: `debootstrap` of bookworm arm64 run through qemu-user-static, then Debian's arm64 kernel
and headers, bcc, g++ and make installed in that chroot; ckptrace's Python dependencies are PyPI's
aarch64 wheels unpacked on the host (`pip install --target --platform`: nothing of them runs here).
An initramfs with only the modules the boot needs (MODULES=list: virtio, ext4, 9p) keeps
`mkinitramfs` under qemu-user short. The folder is `${CKPTRACE_CACHE:-/var/cache/ckptrace}/aarch64-vm/KEY`,
KEY a hash of everything that goes into the image (suite, packages, dependencies, the guest's init).

What the build changes on the host while it runs, and undoes after: binfmt_misc mounted if it was
not, a binfmt entry `ckptrace-aarch64` (qemu-aarch64-static for arm64 ELF, flag F), /proc mounted
inside the chroot. Nothing is installed into the host: qemu-aarch64-static is the host's if it has
one, else Debian's qemu-user-static package unpacked into the cache (installing that package would
register handlers for every foreign architecture on a systemd host, for good).

A run: the working tree shared read-only by virtio-9p (tag `src`), a fresh host folder shared
writable (tag `out`); the guest's init mounts both, runs `out/job.sh` as root, writes its status to
`out/job.rc` and powers off. Runs and builds of one image take its lock, one at a time: the disk
keeps what a run leaves (the BPF cache, the workload's build), so the next boot reuses it.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

SUITE = "bookworm"
MIRROR = os.environ.get("CKPTRACE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# debootstrap's minimal base, then these in the chroot (no recommends): the kernel and its headers
# (bcc compiles against them), bcc's Python bindings, bpftool (task_struct offsets from BTF), the compiler the workload is built with.
BASE_INCLUDE = ["initramfs-tools", "kmod", "ca-certificates"]
PACKAGES = ["linux-image-arm64", "linux-headers-arm64", "python3", "python3-bpfcc", "libbpfcc",
            "bpftool", "g++", "make", "libc6-dev", "util-linux", "procps"]
# Modules the initramfs loads: the disk (virtio-blk on virtio-mmio/pci), its filesystem, the 9p shares.
INITRAMFS_MODULES = ["virtio_mmio", "virtio_pci", "virtio_blk", "ext4", "9pnet_virtio", "9p"]
PYTHON_TAG = "3.11"  # bookworm's python3
WHEEL_PLATFORMS = ["manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_28_aarch64",
                   "manylinux_2_34_aarch64"]
DEPS_DIR = "/opt/ckptrace-deps"  # in the guest: PYTHONPATH for ckptrace's dependencies

# The guest's init (no systemd: a shell): mounts, the job, power off. Its status line and the
# job's own output go to the serial console and to out/.
GUEST_INIT = r"""#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -o remount,rw /
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
modprobe 9pnet_virtio; modprobe 9p
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
# qemu-aarch64-static is not among them: installing qemu-user-static would register binfmt handlers
# for every foreign architecture on a systemd host, for good; its .deb is unpacked into the cache instead.
HOST_TOOLS = {"qemu-system-aarch64": "qemu-system-arm", "debootstrap": "debootstrap", "mkfs.ext4": "e2fsprogs"}
# arm64 ELF, as qemu-user-static's own binfmt entry has it (Debian's /usr/lib/binfmt.d/qemu-aarch64.conf)
_ELF_MAGIC = r"\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00"
_ELF_MASK = r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff"
BINFMT_NAME = "ckptrace-aarch64"


def cache_root() -> Path:
    return Path(os.environ.get("CKPTRACE_CACHE") or "/var/cache/ckptrace") / "aarch64-vm"


def _dependencies() -> list[str]:
    import tomllib
    root = Path(__file__).resolve().parent.parent
    return tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]


def image_key() -> str:
    spec = {"suite": SUITE, "base": BASE_INCLUDE, "packages": PACKAGES, "initramfs": INITRAMFS_MODULES,
            "python": PYTHON_TAG, "platforms": WHEEL_PLATFORMS, "deps": _dependencies(), "init": GUEST_INIT}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def missing_host_tools() -> list[str]:
    """The Debian packages this host lacks for building and booting the VM."""
    return sorted({pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None})


def _log(msg: str) -> None:
    print(f"aarch64-vm: {msg}", file=sys.stderr, flush=True)


def _run(argv: list[str], log, **kw) -> None:
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, **kw)


def _qemu_user(log) -> str:
    """qemu-aarch64-static: the host's if installed, else Debian's qemu-user-static package
    downloaded (`apt-get download`) and unpacked into the cache, not installed."""
    if shutil.which("qemu-aarch64-static"):
        return shutil.which("qemu-aarch64-static")
    folder = cache_root() / "qemu-user-static"
    exe = folder / "usr/bin/qemu-aarch64-static"
    if exe.is_file():
        return str(exe)
    tmp = cache_root() / "qemu-user-static.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _run(["apt-get", "download", "-q", "qemu-user-static"], log, cwd=tmp)
    debs = list(tmp.glob("qemu-user-static_*.deb"))
    if len(debs) != 1:
        raise RuntimeError(f"apt-get download qemu-user-static gave {debs}")
    _run(["dpkg-deb", "-x", str(debs[0]), str(tmp / "root")], log)
    shutil.rmtree(folder, ignore_errors=True)
    (tmp / "root").rename(folder)
    shutil.rmtree(tmp)
    return str(exe)


@contextlib.contextmanager
def _binfmt(interp: str):
    """`interp` registered for arm64 ELF while the chroot is built, removed after."""
    root = Path("/proc/sys/fs/binfmt_misc")
    mounted = False
    if not (root / "register").exists():
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(root)], check=True)
        mounted = True
    entry = root / BINFMT_NAME
    try:
        if entry.exists():  # left by a build that was killed
            entry.write_text("-1")
        # F: the kernel opens the interpreter now, so it works inside the chroot
        (root / "register").write_text(f":{BINFMT_NAME}:M::{_ELF_MAGIC}:{_ELF_MASK}:{interp}:F")
        yield
    finally:
        if entry.exists():
            entry.write_text("-1")
        if mounted:
            subprocess.run(["umount", str(root)], check=False)


@contextlib.contextmanager
def _mounted_proc(rootfs: Path):
    target = rootfs / "proc"
    subprocess.run(["mount", "-t", "proc", "proc", str(target)], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


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
        subprocess.run(["umount", "-l", str(work / "rootfs" / "proc")], check=False,
                       stderr=subprocess.DEVNULL)
        shutil.rmtree(work)
    rootfs = work / "rootfs"
    rootfs.mkdir(parents=True)
    times = {}
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive",
           "HOME": "/root"}
    with _binfmt(_qemu_user(log)):
        t = time.monotonic()
        _run(["debootstrap", "--arch=arm64", "--variant=minbase", f"--include={','.join(BASE_INCLUDE)}",
              SUITE, str(rootfs), MIRROR], log, env=env)
        times["debootstrap_s"] = round(time.monotonic() - t)
        _log(f"debootstrap done in {times['debootstrap_s']} s")
        # Before the kernel's package makes the initramfs: only the modules the boot needs.
        (rootfs / "etc/initramfs-tools/conf.d/ckptrace-vm.conf").write_text("MODULES=list\nCOMPRESS=gzip\n")
        with (rootfs / "etc/initramfs-tools/modules").open("a") as f:
            f.write("".join(m + "\n" for m in INITRAMFS_MODULES))
        t = time.monotonic()
        with _mounted_proc(rootfs):
            _run(["chroot", str(rootfs), "apt-get", "install", "-y", "-q", "--no-install-recommends"]
                 + PACKAGES, log, env=env)
            _run(["chroot", str(rootfs), "apt-get", "clean"], log, env=env)
        times["apt_s"] = round(time.monotonic() - t)
        _log(f"packages installed in {times['apt_s']} s")
    shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
    t = time.monotonic()
    _install_wheels(rootfs / DEPS_DIR.lstrip("/"), log)
    times["wheels_s"] = round(time.monotonic() - t)
    init = rootfs / "sbin/ckptrace-vm-init"
    init.write_text(GUEST_INIT)
    init.chmod(0o755)
    boot = sorted((rootfs / "boot").glob("vmlinuz-*"))
    initrd = sorted((rootfs / "boot").glob("initrd.img-*"))
    if len(boot) != 1 or len(initrd) != 1:
        raise RuntimeError(f"expected one kernel and one initramfs in /boot, found {boot} {initrd}")
    shutil.copy(boot[0], work / "vmlinuz")
    shutil.copy(initrd[0], work / "initrd.img")
    used = int(subprocess.run(["du", "-sb", str(rootfs)], check=True, capture_output=True,
                              text=True).stdout.split()[0])
    size = used + used // 2 + (1 << 30)  # room for the workload's build, the BPF cache, the runs' files
    t = time.monotonic()
    _run(["mkfs.ext4", "-q", "-F", "-L", "ckptrace-vm", "-d", str(rootfs), str(work / "disk.img"),
          str(size // 1024) + "k"], log)
    times["mkfs_s"] = round(time.monotonic() - t)
    shutil.rmtree(rootfs)
    return {"kernel": boot[0].name.removeprefix("vmlinuz-"), "disk_bytes": size, **times}


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
    _log(f"building the Debian 12 arm64 image in {dest} (log: {logpath}); about 10-20 minutes once")
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
         mem_mib: int = 2048) -> subprocess.CompletedProcess:
    """Boots the image once: `job` (a shell script) runs as root in the guest with the working tree
    at /src (read-only) and `out` at /out; returns QEMU's run (its output: the serial console)."""
    (out / "job.sh").write_text(job)
    argv = [QEMU, "-M", "virt", "-accel", "tcg,thread=multi", "-cpu", "max,pauth-impdef=on",
            "-smp", str(smp), "-m", str(mem_mib), "-nographic", "-no-reboot", "-nic", "none",
            "-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"),
            "-append", "root=/dev/vda rw rootfstype=ext4 console=ttyAMA0 init=/sbin/ckptrace-vm-init panic=-1",
            "-drive", f"file={image / 'disk.img'},format=raw,if=virtio",
            "-virtfs", f"local,path={src},mount_tag=src,security_model=none,readonly=on",
            "-virtfs", f"local,path={out},mount_tag=out,security_model=none"]
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          errors="replace", timeout=timeout)


if __name__ == "__main__":  # build (or find) the image: python3 tests/aarch64_vm.py
    with image_lock():
        print(ensure_image())
