#!/usr/bin/env bash
# Writes the pruned peer sources that tests/bench/device_cpu_bench.sh carries to the device
# machine (which has no network): only what llama-bench and llama-batched-bench need on a CPU.
#
#   tests/bench/prune_peer_source.sh llama SRC [DEST]   # SRC: vendor/llama.cpp of the
#       llama-cpp-python sdist (pip download llama-cpp-python==0.3.36 --no-deps
#       --no-binary :all:), DEST default .llama-src (about 19 MB)
#   tests/bench/prune_peer_source.sh ik SRC [DEST]      # SRC: an ik_llama.cpp checkout (git
#       archive of a commit), DEST default .ik-llama-src (about 12 MB)
#
# Kept: the top CMakeLists.txt, LICENSE, cmake, common, include, src, vendor (ik: cpp-httplib and
# nlohmann only), ggml with its CPU backend alone (llama.cpp: ggml/src/ggml-cpu; ik_llama.cpp:
# its iqk kernels and llamafile), and the two tools, whose folder's CMakeLists.txt is rewritten
# to build them alone. DEST/COMMIT names the source (printed in the benchmark's header):
# COMMIT=... overrides what is written (ik: default `git -C SRC rev-parse --short=9 HEAD`).
# DEST must not exist (nothing is overwritten).
set -euo pipefail
usage() { echo "usage: $0 llama|ik SRC [DEST]" >&2; exit 2; }
[ $# -ge 2 ] || usage
kind=$1 src=$2
case $kind in
  llama) dest=${3:-.llama-src} tools=tools ;;
  ik) dest=${3:-.ik-llama-src} tools=examples ;;
  *) usage ;;
esac
for f in CMakeLists.txt ggml/CMakeLists.txt src include common "$tools/llama-bench" \
         "$tools/batched-bench"; do
  [ -e "$src/$f" ] || { echo "$src is not a $kind source: it has no $f" >&2; exit 2; }
done
[ -e "$dest" ] && { echo "$dest exists: remove it first" >&2; exit 2; }
mkdir -p "$dest/$tools"
cp -r "$src"/{CMakeLists.txt,LICENSE,cmake,common,ggml,include,src} "$dest"/
cp -r "$src/$tools/llama-bench" "$src/$tools/batched-bench" "$dest/$tools"/
rm -f "$dest/ggml/.gitignore"
# every backend folder but the CPU's (ik_llama.cpp's CPU backend is ggml/src's own files with
# iqk/ and llamafile/, so all of its ggml-* folders go)
find "$dest/ggml/src" -mindepth 1 -maxdepth 1 -type d -name 'ggml-*' ! -name ggml-cpu \
  -exec rm -rf {} +
if [ "$kind" = llama ]; then
  cp -r "$src/vendor" "$dest"/
  printf '%s\n' 'find_package(Threads REQUIRED)' 'llama_add_compile_flags()' \
    'add_subdirectory(batched-bench)' 'add_subdirectory(llama-bench)' > "$dest/tools/CMakeLists.txt"
  # the sdist's PKG-INFO (SRC is its vendor/llama.cpp) names the release
  commit=${COMMIT:-$(sed -n 's/^Version: \(.*\)/llama-cpp-python \1/p' "$src/../../PKG-INFO" \
                       2>/dev/null | head -1)}
  [ -n "$commit" ] && [ -z "${COMMIT:-}" ] && commit="$commit's vendor/llama.cpp"
else
  mkdir -p "$dest/vendor"
  cp -r "$src/vendor/cpp-httplib" "$src/vendor/nlohmann" "$dest/vendor"/
  # and the other backends' single files beside them
  rm -rf "$dest"/ggml/src/{ggml-cann.cpp,ggml-cuda.cu,ggml-sycl.cpp,ggml-vulkan.cpp,vulkan-shaders}
  rm -f "$dest"/ggml/src/ggml-metal.{m,metal}
  printf '%s\n' '# pruned for heteroserve'"'"'s benchmark: only the two tools it runs' \
    'find_package(Threads REQUIRED)' 'include_directories(${CMAKE_CURRENT_SOURCE_DIR})' \
    'add_subdirectory(batched-bench)' 'add_subdirectory(llama-bench)' \
    > "$dest/examples/CMakeLists.txt"
  # its proofs of concept are not carried
  sed -i 's|^\( *\)add_subdirectory(pocs)|\1# add_subdirectory(pocs)  (pruned for heteroserve)|' \
    "$dest/CMakeLists.txt"
  commit=${COMMIT:-$(git -C "$src" rev-parse --short=9 HEAD 2>/dev/null || true)}
  [ -n "$commit" ] && [ -z "${COMMIT:-}" ] && commit="$commit (ikawrakow/ik_llama.cpp)"
  [ -n "$commit" ] && commit="$commit, pruned to ggml's CPU backend with the iqk kernels, src,\
 include, common, vendor/{cpp-httplib,nlohmann}, cmake and examples/llama-bench +\
 examples/batched-bench"
fi
echo "${commit:-unknown}" > "$dest/COMMIT"
echo "$dest: $(du -sh "$dest" | cut -f1), COMMIT: $(cat "$dest/COMMIT")"
