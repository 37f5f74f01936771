#!/usr/bin/env bash
# The CPU engine against llama.cpp on the GPU server's host cores (the `device` machine: no
# network, a carried working tree), by the rules of issue 12 (see cpu_engine_vs_llamacpp's
# docstring). Carry: .llama-src (llama.cpp's source from the llama-cpp-python 0.3.36 sdist,
# vendor/llama.cpp pruned to ggml's CPU backend, src, include, common, vendor, cmake and
# tools/llama-bench + tools/batched-bench), .whl (gguf, nanobind, scikit-build-core and their
# needs) and .bench-carry/smollm2-tokenizer.json (SmolLM2's tokenizer metadata: the model file is
# too large to carry). Optionally .ik-llama-src (ik_llama.cpp, the second peer: its source pruned
# to ggml's CPU backend with the iqk kernels, src, include, common, vendor/{cpp-httplib,nlohmann},
# cmake and examples/llama-bench + examples/batched-bench; COMMIT names its commit): where it is
# carried (and IK is not 0) its tools are built too and every model runs as a triple. Each pruned
# copy names what it is in a COMMIT file (printed in the table's header); both are written by
# tests/bench/prune_peer_source.sh.
# The copied tree's .git can be older than the tree itself: pass HETEROSERVE_COMMIT=<hash> (the
# header prints it; the engine-sources digest beside it is computed from the files that ran).
#
#   MODELS=135m:q4_0,1.1b:q4_0,8b:q4_0 LONG=512,2048 PAIRS=3 tests/bench/device_cpu_bench.sh
#
# Installs and builds what a fresh machine lacks (a warm machine keeps /tmp between calls, so a
# second call skips it): the engine wheel, llama.cpp's tools built natively with AMX (checked by
# a short llama-bench run, -mno-amx-* only where that fails), ik_llama.cpp's tools (natively, in
# the background at the same time, each build with half the cores), and the synthetic models
# (written in the background meanwhile). Built tools can outlive the machine: SAVE_BINS=1 writes
# $OUT/llama-bins.tgz (both bin folders with their libraries and build.txt descriptions), in
# parts of 15 MiB (llama-bins.tgz.part0, part1, ...) where it is larger: the device returns no
# file over 16 MiB, nor more than 8 files, so the call's logs then come back as one logs.tgz.
# Carried back as .bench-carry/llama-bins.tgz (or its parts, under the same names), a fresh
# machine unpacks it instead of building, provided its CPU (model name and flags) is the one it
# was built on. Then the engine-vs-llama.cpp table
# for MODELS (with ik_llama.cpp where built), and, where LONG names depths, the long-context
# table on the 1.1B q4_0 (ik_llama.cpp too where built). SPIN_AB=default,200/0 (entries as
# tests/bench/cpu_engine_spin_ab.py's --spins) then A/Bs the pool's spin settings on the 1.1B q4_0's
# batch-1 decode, SPIN_REPEATS processes an entry (default 5), the stolen share beside each.
# First of all the kernel tests (engines/cpu/tests/kernel_test.c, built here: every variant this
# CPU grants against the reference, amx included wherever AMX is granted): a failure stops the run
# before any number is measured.
# Writes $OUT/kernel-test.txt, $OUT/bench.txt, $OUT/long-context.txt, $OUT/build.txt and
# $OUT/ik-build.txt (and prints them), and $OUT/spin-ab.txt with SPIN_AB.
set -euo pipefail
if [ "${MODELS+set}" = set ] && [ -z "$MODELS" ]; then # unset takes the default list; empty is a slip
  echo "MODELS is set but empty: name the models (e.g. MODELS=1.1b:q4_0), or unset it for" \
       "the default list" >&2
  exit 2
fi
threads=${THREADS:-$(nproc)}
out=${OUT:-/tmp/out}
models=${MODELS:-135m:q4_0,135m:q8_0,1.1b:q4_0,8b:q4_0,8b:q8_0}
pairs=${PAIRS:-3}
tok=.bench-carry/smollm2-tokenizer.json
build=/tmp/llama-build
ik_build=/tmp/ik-llama-build
saved_bins=.bench-carry/llama-bins.tgz
cores=$(nproc)
cpu_id() { grep -m2 -E '^(model name|flags)' /proc/cpuinfo | md5sum | cut -d' ' -f1; }
# the saved tools' tarball, whole or in its parts (in order: part0, part1, ..., part9)
saved() { if [ -f "$saved_bins" ]; then cat "$saved_bins"; else cat "$saved_bins".part?; fi; }
have_saved() { [ -f "$saved_bins" ] || [ -f "$saved_bins.part0" ]; }
with_ik=0
[ -d .ik-llama-src ] && [ "${IK:-1}" != 0 ] && with_ik=1
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
# tools built on an earlier machine of the same CPU (SAVE_BINS=1), where this one has none yet
if have_saved && [ ! -f $build/build.txt ]; then
  if [ "$(saved | tar -xzf - -O tmp/llama-bins.cpu 2>/dev/null)" = "$(cpu_id)" ]; then
    saved | tar -xzf - -C / && echo "llama.cpp/ik_llama.cpp tools: unpacked from $saved_bins"
  else
    echo "$saved_bins: built on another CPU (or unreadable): building here"
  fi
fi
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
ik= jobs=$cores
if [ $with_ik = 1 ] && [ ! -f $ik_build/build.txt ]; then
  jobs=$(( (cores + 1) / 2 ))
  [ -f $build/build.txt ] && jobs=$cores
  "${bench[@]}" --build-ik-llama .ik-llama-src --ik-llama-build $ik_build --jobs "$jobs" \
    > "$out/ik-build.txt" 2>&1 &
  ik=$!
  jobs=$(( cores - jobs > 0 ? cores - jobs : 1 ))
fi
if [ ! -f $build/build.txt ]; then
  "${bench[@]}" --build-llama .llama-src --llama-build $build --jobs "$jobs" \
    > "$out/build.txt" 2>&1 || { cat "$out/build.txt"; tail -40 $build/build.log; exit 1; }
  cp "$out/build.txt" $build/build.txt
fi
cp $build/build.txt "$out/build.txt"
bin=$(tail -1 "$out/build.txt")
ik_bin=
if [ $with_ik = 1 ]; then
  if [ -n "$ik" ]; then
    wait "$ik" || { cat "$out/ik-build.txt"; tail -40 $ik_build/build.log;
                    echo "ik_llama.cpp: build failed (IK=0 runs without it)"; exit 1; }
    cp "$out/ik-build.txt" $ik_build/build.txt
  fi
  cp $ik_build/build.txt "$out/ik-build.txt"
  ik_bin=$(tail -1 "$out/ik-build.txt")
fi
[ -n "$engine" ] && { wait "$engine" || { cat "$out/engine-build.log"; exit 1; }; }
wait "$gen" || { cat "$out/models.log"; exit 1; }
echo "setup: $(( $(date +%s) - t0 )) s"; cat "$out/build.txt"
[ -n "$ik_bin" ] && cat "$out/ik-build.txt"
lscpu > "$out/lscpu.txt"
grep -E "Model name|L3|Flags" "$out/lscpu.txt" | cut -c1-160
"${bench[@]}" --llama-bin "$bin" ${ik_bin:+--ik-llama-bin "$ik_bin"} --models "$models" \
  --pairs "$pairs" | tee "$out/bench.txt"
echo "bench done: $(( $(date +%s) - t0 )) s"
if [ -n "${LONG:-}" ]; then
  python3 -m tests.bench.cpu_engine_long_context --threads "$threads" --llama-bin "$bin" \
    ${ik_bin:+--ik-llama-bin "$ik_bin"} --depths "$LONG" --pairs "$pairs" --model "$HETEROSERVE_CACHE/bench/synthetic-tiled-llama-1.1b-q4_0.gguf" \
    | tee "$out/long-context.txt"
  echo "long context done: $(( $(date +%s) - t0 )) s"
fi
if [ "${SAVE_BINS:-0}" = 1 ]; then
  # the bin folders (llama.cpp's holds its shared libraries), any other library they load from
  # /tmp, the build.txt descriptions and the CPU they were built for, at their absolute paths
  cpu_id > /tmp/llama-bins.cpu
  parts=(tmp/llama-bins.cpu "${build#/}/build.txt" "${bin#/}")
  [ -n "$ik_bin" ] && parts+=("${ik_build#/}/build.txt" "${ik_bin#/}")
  libs=$(ldd "$bin"/llama-bench "$bin"/llama-batched-bench \
           ${ik_bin:+"$ik_bin"/llama-bench "$ik_bin"/llama-batched-bench} 2>/dev/null |
         awk '$3 ~ /^\/tmp\// {print substr($3, 2)}' | sort -u |
         grep -v -e "^${bin#/}/" ${ik_bin:+-e "^${ik_bin#/}/"} || true)
  tar -czf "$out/llama-bins.tgz" -C / "${parts[@]}" $libs
  size=$(du -h "$out/llama-bins.tgz" | cut -f1)
  if [ "$(stat -c %s "$out/llama-bins.tgz")" -gt $((15 << 20)) ]; then
    # the device returns files of at most 16 MiB, 8 files at most: parts, and the logs in one
    split -b 15M -d -a 1 "$out/llama-bins.tgz" "$out/llama-bins.tgz.part"
    rm "$out/llama-bins.tgz"
    (cd "$out" && tar -czf logs.tgz --remove-files ./*.log lscpu.txt)
    echo "saved the built tools: $out/llama-bins.tgz.part* ($size in all; the logs in" \
      "$out/logs.tgz); carry the parts as $saved_bins.part0, ... to skip the builds on a" \
      "machine with this CPU"
  else
    echo "saved the built tools: $out/llama-bins.tgz ($size); carry it as $saved_bins to skip" \
      "the builds on a machine with this CPU"
  fi
fi
if [ -n "${SPIN_AB:-}" ]; then
  python3 -m tests.bench.cpu_engine_spin_ab --threads "$threads" --tokenizer "$tok" \
    --model 1.1b:q4_0 --spins "$SPIN_AB" --repeats "${SPIN_REPEATS:-5}" | tee "$out/spin-ab.txt"
  echo "spin A/B done: $(( $(date +%s) - t0 )) s"
fi
