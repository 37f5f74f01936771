#!/usr/bin/env bash
# The CPU engine against llama.cpp on the GPU server's host cores (the `device` machine: no
# network, a carried working tree), by the rules of issue 12 (see cpu_engine_vs_llamacpp's
# docstring). Carry: .llama-src (llama.cpp's source from the llama-cpp-python 0.3.36 sdist,
# vendor/llama.cpp pruned to ggml's CPU backend, src, include, common, vendor, cmake and
# tools/llama-bench + tools/batched-bench), .whl (gguf, nanobind, scikit-build-core and their
# needs) and .bench-carry/smollm2-tokenizer.json (SmolLM2's tokenizer metadata: the model file is
# too large to carry).
#
#   MODELS=135m:q4_0,1.1b:q4_0,8b:q4_0 LONG=512,2048 PAIRS=3 tests/bench/device_cpu_bench.sh
#
# Installs and builds what a fresh machine lacks (a warm machine keeps /tmp between calls, so a
# second call skips it): the engine wheel, llama.cpp's tools built natively with AMX (checked by
# a short llama-bench run, -mno-amx-* only where that fails), and the synthetic models (written
# in the background meanwhile). Then the engine-vs-llama.cpp table for MODELS, and, where LONG
# names depths, the long-context table on the 1.1B q4_0.
# First of all the kernel tests (engines/cpu/tests/kernel_test.c, built here: every variant this
# CPU grants against the reference, amx included wherever AMX is granted): a failure stops the run
# before any number is measured.
# Writes $OUT/kernel-test.txt, $OUT/bench.txt, $OUT/long-context.txt and $OUT/build.txt (and
# prints them).
set -euo pipefail
threads=${THREADS:-$(nproc)}
out=${OUT:-/tmp/out}
models=${MODELS:-135m:q4_0,135m:q8_0,1.1b:q4_0,8b:q4_0,8b:q8_0}
pairs=${PAIRS:-3}
tok=.bench-carry/smollm2-tokenizer.json
build=/tmp/llama-build
mkdir -p "$out"
export HETEROSERVE_CACHE=/tmp/hs-cache PYTHONPATH=engines:. PYTHONUNBUFFERED=1
bench=(python3 -m tests.bench.cpu_engine_vs_llamacpp --threads "$threads" --tokenizer "$tok")
t0=$(date +%s)
kt=/tmp/hs-kernel-test
{ cmake -S engines/cpu -B $kt -DHS_BUILD_KERNEL_TEST=ON &&
  cmake --build $kt --target kernel_test -j "$threads"; } > "$out/kernel-test-build.log" 2>&1 ||
  { cat "$out/kernel-test-build.log"; echo "kernel test: build failed"; exit 1; }
$kt/kernel_test > "$out/kernel-test.txt" ||
  { cat "$out/kernel-test.txt"; echo "kernel test failed: nothing measured"; exit 1; }
grep -E "^variant|passed" "$out/kernel-test.txt"
python3 -c "import gguf, nanobind, scikit_build_core" 2>/dev/null ||
  python3 -m pip install -q --no-index --find-links .whl gguf nanobind scikit-build-core
# the check model first (llama.cpp's build is checked on it), the others in the background
python3 -c "from tests.bench.cpu_engine_vs_llamacpp import model_path as m; m('135m:q4_0', '$tok')"
python3 -c "
from tests.bench.cpu_engine_vs_llamacpp import model_path
for spec in '$models'.split(','): print(model_path(spec, '$tok')[1])" > "$out/models.log" 2>&1 &
gen=$!
if ! python3 -c "import heteroserve_cpu" 2>/dev/null; then
  CMAKE_BUILD_PARALLEL_LEVEL=$threads python3 -m pip install -q --no-build-isolation ./engines/cpu \
    > "$out/engine-build.log" 2>&1 &
  engine=$!
else
  engine=
fi
if [ ! -f $build/build.txt ]; then
  "${bench[@]}" --build-llama .llama-src --llama-build $build > "$out/build.txt" 2>&1 ||
    { cat "$out/build.txt"; tail -40 $build/build.log; exit 1; }
  cp "$out/build.txt" $build/build.txt
fi
cp $build/build.txt "$out/build.txt"
bin=$(tail -1 "$out/build.txt")
[ -n "$engine" ] && { wait "$engine" || { cat "$out/engine-build.log"; exit 1; }; }
wait "$gen" || { cat "$out/models.log"; exit 1; }
echo "setup: $(( $(date +%s) - t0 )) s"; cat "$out/build.txt"
lscpu > "$out/lscpu.txt"
grep -E "Model name|L3|Flags" "$out/lscpu.txt" | cut -c1-160
"${bench[@]}" --llama-bin "$bin" --models "$models" --pairs "$pairs" | tee "$out/bench.txt"
echo "bench done: $(( $(date +%s) - t0 )) s"
if [ -n "${LONG:-}" ]; then
  python3 -m tests.bench.cpu_engine_long_context --threads "$threads" --llama-bin "$bin" \
    --depths "$LONG" --pairs "$pairs" --model "$HETEROSERVE_CACHE/bench/synthetic-tiled-llama-1.1b-q4_0.gguf" \
    | tee "$out/long-context.txt"
  echo "long context done: $(( $(date +%s) - t0 )) s"
fi
