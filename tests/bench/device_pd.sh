#!/usr/bin/env bash
# PD offload on the GPU server (the `device` machine: no network, a carried working tree): the
# builtin prefill engine on CUDA, the CPU engine on the host cores, the router's split between
# them. Two calls on one warm machine, because SmolLM2's GGUF (98 MB) is larger than one call
# may carry: the first carries .whl (the Python wheels the image lacks) and the model's first
# part and runs `device_pd.sh stage`; the second carries the other parts and runs
# `device_pd.sh run`. Parts: `split -b 34M -d <gguf> .devcarry/part`, then part00 in
# .devcarry/p1, part01 in .devcarry/p2, part02 in .devcarry/p3.
# Writes $OUT/split.txt and $OUT/kv-handoff.txt; `device_pd.sh router` (after stage, on the same
# warm machine, carrying p2 and p3) runs the router's overhead benchmark on the host cores
# instead and writes $OUT/router.txt; `device_pd.sh kv` runs only the hand-off benchmark;
# `device_pd.sh overload` (on a machine where a run already assembled the model, no parts
# needed) the engine's overload benchmark into $OUT/overload.txt; `device_pd.sh agreement` only
# the split's agreement with the CPU engine alone (PREFILL_ARGS, DECODER_ARGS: e.g.
# "--activation-quantization avx512vnni" and "--kernels avx512vnni" for the exact hand-off);
# `device_pd.sh exact` that exact hand-off: tests.bench.exact_kv on CUDA, then the agreement.
set -euo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
if [ "${1:-}" = stage ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  cp .devcarry/p1/part00 /tmp/part00
  exit 0
fi
export PYTHONPATH=/tmp/site:$PWD/engines:$PWD PYTHONUNBUFFERED=1
if [ -f .devcarry/p2/part01 ] || [ ! -f /tmp/smollm2.gguf ]; then
  cat /tmp/part00 .devcarry/p2/part01 .devcarry/p3/part02 > /tmp/smollm2.gguf
fi
if [ ! -d /tmp/site/heteroserve_cpu ] || [ "${REBUILD:-}" = 1 ]; then
  python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site ./engines/cpu
fi
nvidia-smi -L | tee "$out/machine.txt"
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$out/machine.txt"
if [ "${1:-}" = kv ]; then
  # The hand-off alone (TCP and shared memory, against recomputing), CUDA exporter.
  python3 -m tests.bench.kv_handoff --exporter prefill --device cuda --model /tmp/smollm2.gguf \
    --decoder-threads 8 --rounds ${ROUNDS:-3} | tee "$out/kv-handoff.txt"
  exit 0
fi
split_agreement() {
  python3 -m tests.bench.split_agreement --device cuda --model /tmp/smollm2.gguf --prompts 50 \
    --decoder-threads 8 ${PREFILL_ARGS:+--prefill-args "$PREFILL_ARGS"} \
    ${DECODER_ARGS:+--decoder-args "$DECODER_ARGS"} | tee "$out/split.txt"
}
if [ "${1:-}" = agreement ]; then
  split_agreement
  exit 0
fi
if [ "${1:-}" = exact ]; then
  # The exact hand-off: K/V from CUDA against the CPU engine's own, then the split's agreement.
  python3 -m tests.bench.exact_kv --device cuda --model /tmp/smollm2.gguf --threads 8 \
    ${EXACT_ARGS:-} | tee "$out/exact-kv.txt" || true
  PREFILL_ARGS="--activation-quantization avx512vnni" DECODER_ARGS="--kernels avx512vnni" \
    split_agreement
  exit 0
fi
if [ "${1:-}" = overload ]; then
  # The CPU engine's server under twice its saturating load and 200 abandoned requests
  # (issue 14): the engine on 8 cores, the load generator on one of its own.
  python3 -m tests.bench.engine_overload --model /tmp/smollm2.gguf --engine-cpus 2-9 \
    --client-cpus 1 ${OVERLOAD_ARGS:-} | tee "$out/overload.txt"
  exit 0
fi
if [ "${1:-}" = router ]; then
  # Router on CPU 0, the upstreams on 2-9 (as in a pod: the sidecar has a core of its own), the
  # load generator on the 7 others (one process each).
  python3 -m tests.bench.router_overhead --model /tmp/smollm2.gguf --router-cpus 0 \
    --client-cpus 1,10-15 --engine-cpus 2-9 ${ROUTER_ARGS:-} | tee "$out/router.txt"
  exit 0
fi
split_agreement
python3 -m tests.bench.kv_handoff --exporter prefill --device cuda --model /tmp/smollm2.gguf \
  --decoder-threads 8 --rounds 3 ${PREFILL_ARGS:+--exporter-args "$PREFILL_ARGS"} \
  | tee "$out/kv-handoff.txt"
