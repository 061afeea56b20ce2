#!/usr/bin/env bash
# Set up ckptrace on Debian 12 (as root), then run the demo or the tests: setup.sh [demo|test|install]
#
# Idempotent: a second run checks each step, finds it done, and changes nothing.
# Overrides, for testing the header step on a fake tree: CKPTRACE_MODULES_DIR (default
# /lib/modules), CKPTRACE_USR_SRC (default /usr/src), CKPTRACE_KERNEL_RELEASE (default uname -r).
set -euo pipefail
umask 022  # the venv must stay readable by other users (tests run the CLI as nobody)

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$REPO/.venv
STAMP=$VENV/.ckptrace-setup-stamp

APT_PACKAGES=(python3-bpfcc libbpfcc bpfcc-tools linux-headers-amd64 bpftool bpftrace python3-venv
              python3-pip g++ make cmake libc6-dev util-linux)
# Headless Chromium for the dashboard tests; ccache lets the pool-on llama-server build reuse pool-off
# objects; a real Prometheus scrapes `ckptrace serve` in its tests (run by the test, not as a service);
# clang and libc++ for the libc++ builds (the sample workload's and build.sh --libcxx's llama-server).
# g++-aarch64-linux-gnu: small aarch64 programs whose call sites tests/test_symbols_aarch64.py checks.
# qemu-system-arm boots the Debian arm64 VM of tests/test_aarch64_vm.py; debian-archive-keyring checks
# the arm64 packages its image is unpacked from (tests/aarch64_vm.py: the host's apt, no emulation).
APT_TEST_PACKAGES=(chromium fonts-liberation ccache prometheus clang libc++-dev libc++abi-dev g++-aarch64-linux-gnu
                   qemu-system-arm debian-archive-keyring)

step() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

install_apt() {
    local missing=() p
    for p in "$@"; do
        [[ $(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true) == installed ]] \
            || missing+=("$p")
    done
    if ((${#missing[@]} == 0)); then
        step "apt: all $# packages present"
        return
    fi
    step "apt: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # A fresh cloud image may be running unattended-upgrades: wait for its dpkg lock.
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" </dev/null
    # Debian's prometheus package starts a service on every address (:9090); the tests run their own
    # on 127.0.0.1. Stop and disable only the one this run installed (a machine's own stays as it was).
    if [[ " ${missing[*]} " == *" prometheus "* && -d /run/systemd/system ]]; then
        step "apt: stopping and disabling the prometheus service the package started (the tests run their own)"
        systemctl disable --now prometheus.service >/dev/null 2>&1 || true
    fi
}

# bcc compiles against /lib/modules/$(uname -r)/build. A kernel without a Debian headers package
# (this VM's) gets the newest Debian headers instead: docs/kernel-facts.md says why that is safe for
# what we compile (tracepoint arguments come from tracefs, task_struct offsets from BTF).
link_headers() {
    local modules=${CKPTRACE_MODULES_DIR:-/lib/modules} usr_src=${CKPTRACE_USR_SRC:-/usr/src}
    local release=${CKPTRACE_KERNEL_RELEASE:-$(uname -r)}
    local kdir=$modules/$release headers common
    if [[ -d $kdir/build/include ]]; then
        step "kernel headers: $kdir/build present"
        return
    fi
    if [[ -d $kdir/build && ! -L $kdir/build ]]; then
        die "$kdir/build is a folder without include/: remove it or install the headers of $release"
    fi
    headers=$(find "$usr_src" -maxdepth 1 -name 'linux-headers-*-amd64' -type d 2>/dev/null \
              | sort -V | tail -n 1)
    [[ -n $headers ]] || die "no $usr_src/linux-headers-*-amd64: apt-get install linux-headers-amd64"
    common=${headers%-amd64}-common
    [[ -d $common ]] || die "$common is missing: apt-get install --reinstall ${headers##*/}"
    mkdir -p "$kdir"
    ln -sfn "$headers" "$kdir/build"
    if [[ -L $kdir/source || ! -e $kdir/source ]]; then  # never replace a real folder
        ln -sfn "$common" "$kdir/source"
    fi
    step "kernel headers: kernel $release has none; linked $kdir/build -> $headers" \
         "and $kdir/source -> $(readlink "$kdir/source") (another version's headers:" \
         "safe for what ckptrace compiles, see docs/kernel-facts.md)"
}

mount_fs() {  # mount_fs TYPE DIR
    if mountpoint -q "$2"; then
        step "$1: mounted at $2"
    else
        mount -t "$1" nodev "$2" || die "could not mount $1 at $2"
        step "$1: mounted it at $2 (it was not)"
    fi
}

setup_venv() {
    if [[ -x $VENV/bin/python ]]; then
        # bcc is only in Debian's dist-packages: the venv must be Debian's python with them.
        grep -qx 'include-system-site-packages = true' "$VENV/pyvenv.cfg" \
            && grep -qx 'home = /usr/bin' "$VENV/pyvenv.cfg" \
            || die "$VENV was not made from /usr/bin/python3 with --system-site-packages, so it" \
                   "can't see bcc: remove it (rm -rf $VENV) and run this again"
        step "venv: $VENV present"
    else
        /usr/bin/python3 -m venv --system-site-packages "$VENV"
        step "venv: created $VENV (sees Debian's bcc)"
    fi
    # The editable install maps each package folder when it is made: a new package folder
    # (setup.py finds them) needs a new install, as does a change of the dependencies.
    local want
    want=$({ cat "$REPO/pyproject.toml" "$REPO/setup.py"
             cd "$REPO" && find . \( -path ./.venv -o -path ./build \) -prune -o -name __init__.py -print | sort; } \
           | sha256sum | cut -d' ' -f1)
    if [[ -f $STAMP && $(<"$STAMP") == "$want" && -x $VENV/bin/ckptrace ]]; then
        step "python packages: up to date with pyproject.toml, setup.py and the package folders"
    else
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$REPO[test]"
        echo "$want" >"$STAMP"
        step "python packages: installed ckptrace[test] (editable) into $VENV"
    fi
    "$VENV/bin/python" -c 'import bcc' 2>/dev/null \
        || die "bcc is not importable from $VENV/bin/python: apt-get install python3-bpfcc"
}

build_sample() {
    local binary
    binary=$("$VENV/bin/python" -c 'from ckptrace.samples import workload_binary; print(workload_binary())')
    step "sample workload: $binary"
}

# The suite runs as two pytest sessions at once, one per CPU of a 2-core machine: the tests of
# real llama-servers and of the arm64 VM (their builds and the guest start in the background as
# that session begins; the VM's tests first, while the builds go) and all the others. Neither
# waits for the other's builds or guest. Each prints its own per-file times at its end.
SLOW_TESTS="llama or aarch64_vm"

run_tests() {
    cd "$REPO"
    if [[ ${CI:-} == true ]]; then
        # In CI a skipped eBPF test is a failure (tests/conftest.py enforces it).
        export CKPTRACE_REQUIRE_EBPF=1
        step "tests: CI=true, eBPF tests must run (CKPTRACE_REQUIRE_EBPF=1)"
    fi
    # --durations=15: the slowest tests, where the time of a fresh machine's run goes
    local pytest=("$VENV/bin/python" -m pytest -q -ra --durations=15)
    local log slow rest rc=0 rest_rc=0 start=$SECONDS
    log=$(mktemp --tmpdir ckptrace-tests-XXXXXX.log)
    step "tests: two sessions at once: ${pytest[*]} -m \"not ($SLOW_TESTS)\" (its output when it ends:" \
         "$log), and ${pytest[*]} -m \"$SLOW_TESTS\" (here, as it goes)"
    # Both in the background (a background job ignores SIGINT: conftest.py's handler for it
    # makes it a no-op in pytest), so a Ctrl-C or SIGTERM here reaches this shell, which ends
    # both with SIGTERM (each session's teardowns run: conftest.py) and waits for them.
    "${pytest[@]}" -m "not ($SLOW_TESTS)" >"$log" 2>&1 &
    rest=$!
    "${pytest[@]}" -m "$SLOW_TESTS" &
    slow=$!
    trap 'kill -TERM $slow $rest 2>/dev/null; wait; cat "$log"; rm -f "$log"; die "tests: stopped"' INT TERM
    wait $slow || rc=$?
    step "tests: the llama-server and arm64 VM tests took $((SECONDS - start)) s (exit code $rc); the others:"
    wait $rest || rest_rc=$?
    trap - INT TERM
    cat "$log"
    rm -f "$log"
    step "tests: the suite took $((SECONDS - start)) s"
    if ((rc != 0 && rc != 5)) || ((rest_rc != 0 && rest_rc != 5)); then
        die "tests failed (pytest exit codes $rc and $rest_rc)"
    fi
    ((rc == 0 && rest_rc == 0)) || die "pytest collected no tests (exit codes $rc and $rest_rc)"
    step "tests: passed"
}

main() {
    local mode=${1:-}
    case $mode in
        demo|test|install) ;;
        *) echo "usage: bash scripts/setup.sh demo|test|install" >&2; exit 2 ;;
    esac
    [[ $(id -u) == 0 ]] || die "run as root: sudo bash scripts/setup.sh $mode"
    [[ -r /etc/debian_version && $(dpkg --print-architecture) == amd64 ]] \
        || die "this set-up is for Debian 12 on x86_64 (amd64)"
    if [[ $mode == test ]]; then
        install_apt "${APT_PACKAGES[@]}" "${APT_TEST_PACKAGES[@]}"
    else
        install_apt "${APT_PACKAGES[@]}"
    fi
    link_headers
    mount_fs tracefs /sys/kernel/tracing
    mount_fs debugfs /sys/kernel/debug  # bcc also looks under /sys/kernel/debug/tracing
    setup_venv
    build_sample
    case $mode in
        demo) step "demo: $VENV/bin/ckptrace demo"; exec "$VENV/bin/ckptrace" demo ;;
        test) run_tests ;;
        install) step "done; check this machine with: $VENV/bin/ckptrace doctor" ;;
    esac
}

# Sourcing the file (tests) defines the functions without running anything.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    main "$@"
fi
