#!/usr/bin/env bash
# The CPU engine benchmark on the GPU server's host cores (the `device` machine: no network, a
# carried working tree). Carry: .llama-src (llama.cpp's source from the llama-cpp-python 0.3.36
# sdist, tools/ pruned to llama-bench and llama-batched-bench), .whl (the gguf wheel) and
# .bench-carry/smollm2-tokenizer.json (SmolLM2's tokenizer metadata: the model file is too large
# to carry). Builds the engine wheel and llama.cpp (-march=native minus AMX, as on the development
# machine), then runs tests.bench.cpu_engine_vs_llamacpp and tests.bench.cpu_engine_long_context with
# llama.cpp's C++ tools as the peer.
# Writes the tables to $OUT/bench.txt and $OUT/long-context.txt (and prints them).
set -euo pipefail
threads=${THREADS:-$(nproc)}
out=${OUT:-/tmp/out}
mkdir -p "$out"
python3 -m pip install -q --no-index --find-links .whl gguf 2>&1 | tail -1 || true
python3 -m pip install -q --no-build-isolation ./engines/cpu
flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake -S .llama-src -B /tmp/llama-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" > "$out/llama-cmake.log"
ninja -C /tmp/llama-build llama-bench llama-batched-bench > "$out/llama-build.log"
lscpu > "$out/lscpu.txt"
HETEROSERVE_CACHE=/tmp/hs-cache PYTHONPATH=engines:. python3 -m tests.bench.cpu_engine_vs_llamacpp \
  --threads "$threads" --synthetic-only .bench-carry/smollm2-tokenizer.json \
  --llama-bin /tmp/llama-build/bin | tee "$out/bench.txt"
HETEROSERVE_CACHE=/tmp/hs-cache PYTHONPATH=engines:. python3 -m tests.bench.cpu_engine_long_context \
  --threads "$threads" --llama-bin /tmp/llama-build/bin \
  --model /tmp/hs-cache/bench/synthetic-llama-135m-q4_0.gguf \
  --model /tmp/hs-cache/bench/synthetic-llama-1.1b-q4_0.gguf | tee "$out/long-context.txt"
