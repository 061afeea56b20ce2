#!/usr/bin/env bash
# Build llama-server (CPU) from PyPI's pinned llama-cpp-python sdist, cached outside the checkout.
#
# Usage: build.sh [--pool] [--static]
#   --pool    apply samples/llama-server/pool.patch (a bounded checkpoint-buffer pool)
#   --static  link everything into one executable (-DBUILD_SHARED_LIBS=OFF)
#
# Cache: ${CKPTRACE_CACHE:-/var/cache/ckptrace}/llama-server/<version>-<off|pool-<sha12>>[-static]/
# A finished build (stamp file .built, written last) is reused at once; a partial one is
# resumed (the cmake build is incremental). Progress goes to stderr; the last line on stdout
# is the absolute path of the llama-server binary.
#
# Flags, and why:
#   GGML_NATIVE=OFF  portable, and avoids the AMX matmul crash seen with tiny models here
#   LLAMA_CURL/OPENSSL=OFF  nothing to fetch at run time; no extra build dependencies
#   Release, no strip: symbols stay, as in a normal release build, so ckptrace can probe them
# CKPTRACE_PYTHON: the Python whose pip downloads the sdist (default python3 on PATH).
# If ccache is installed it is used (ggml picks it up), which makes the pool build cheap
# after the pool-off one: only the patched files compile again.
set -euo pipefail

VERSION=0.3.36
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PATCH="$HERE/pool.patch"
JOBS="${CKPTRACE_BUILD_JOBS:-2}"

pool=0
static=0
for arg in "$@"; do
    case "$arg" in
        --pool) pool=1 ;;
        --static) static=1 ;;
        -h|--help) sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build.sh: unknown option '$arg' (use --pool and/or --static)" >&2; exit 2 ;;
    esac
done

log() { echo "build.sh: $*" >&2; }

for tool in cmake make c++ tar patch sha256sum flock; do
    command -v "$tool" >/dev/null || { log "missing '$tool': install it (Debian: build-essential cmake patch util-linux)"; exit 1; }
done

ROOT="${CKPTRACE_CACHE:-/var/cache/ckptrace}/llama-server"
if [ "$pool" = 1 ]; then
    [ -f "$PATCH" ] || { log "no $PATCH"; exit 1; }
    key="$VERSION-pool-$(sha256sum "$PATCH" | cut -c1-12)"
else
    key="$VERSION-off"
fi
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

# The sdist is shared by every key of one version.
SDIST_DIR="$ROOT/sdist-$VERSION"
sdist="$SDIST_DIR/llama_cpp_python-$VERSION.tar.gz"
exec 8>"$ROOT/.sdist.lock"
flock 8  # the pool-off and pool-on builds may start together
if [ ! -f "$sdist" ]; then
    PIP=("${CKPTRACE_PYTHON:-python3}" -m pip)  # ckptrace passes its own Python (with pip)
    log "fetching llama-cpp-python==$VERSION sdist"
    mkdir -p "$SDIST_DIR"
    # Only llama-cpp-python itself must be a source archive; its build tools (needed by
    # pip to read the sdist's metadata) may come as wheels.
    rm -rf "$SDIST_DIR.tmp"
    "${PIP[@]}" download --no-deps --no-binary llama-cpp-python -d "$SDIST_DIR.tmp" \
        "llama-cpp-python==$VERSION" >&2
    mv "$SDIST_DIR.tmp"/llama_cpp_python-"$VERSION".tar.gz "$SDIST_DIR"/
    rm -rf "$SDIST_DIR.tmp"
fi
flock -u 8

# Source tree: extracted (and patched) once; .src-ready marks it complete.
if [ ! -f "$DIR/.src-ready" ]; then
    log "extracting vendor/llama.cpp into $DIR/src"
    rm -rf "$DIR/src" "$DIR/build" "$DIR/src.tmp"
    mkdir -p "$DIR/src.tmp"
    tar -xzf "$sdist" -C "$DIR/src.tmp" --strip-components=3 \
        "llama_cpp_python-$VERSION/vendor/llama.cpp"
    if [ "$pool" = 1 ]; then
        log "applying pool.patch"
        patch -p1 -d "$DIR/src.tmp" --forward --no-backup-if-mismatch < "$PATCH" >&2
    fi
    mv "$DIR/src.tmp" "$DIR/src"
    touch "$DIR/.src-ready"
fi

shared=ON
[ "$static" = 1 ] && shared=OFF
if [ ! -f "$DIR/build/Makefile" ]; then  # (re)configure until a configure has finished
    log "configuring (BUILD_SHARED_LIBS=$shared)"
    cmake -S "$DIR/src" -B "$DIR/build" \
        -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS="$shared" \
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF >&2
fi

# ccache: paths relative to the cache folder, so the off and pool builds share objects.
export CCACHE_BASEDIR="$DIR" CCACHE_NOHASHDIR=1
start=$(date +%s)
log "building llama-server with -j$JOBS (about 10 minutes on 2 cores the first time)"
cmake --build "$DIR/build" -j"$JOBS" --target llama-server >&2
log "built in $(( $(date +%s) - start )) s"
[ -x "$BIN" ] || { log "no binary at $BIN after the build"; exit 1; }
date -u +%FT%TZ > "$DIR/.built"
echo "$BIN"
