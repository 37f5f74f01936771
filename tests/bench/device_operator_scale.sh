#!/usr/bin/env bash
# The operator-scale benchmark (tests/bench/operator_scale.py) on the GPU server's 16 host cores
# (the `device` machine: no network, no Go, a carried working tree), where the control plane is
# not starved of CPU as it is on a 2-vCPU machine. The control-plane binaries are built here
# (tests/cluster/build-tools.sh), then carried xz-compressed in two calls on one warm machine,
# because together they are larger than one call may carry:
#   call 1 carries .devcarry/cp1 (kube-apiserver.xz, kube-controller-manager.xz, etcd.xz) and
#          .devcarry/opwhl (the Python wheels the image lacks) and runs `device_operator_scale.sh stage`;
#   call 2 carries .devcarry/cp2 (kube-scheduler.xz, kwok.xz, kubectl.xz, the kwok-stages folder,
#          and in wheels/ the rest of the wheels: cryptography, cffi, pycparser)
#          and runs
#          `device_operator_scale.sh run [operator_scale arguments]`, writing $OUT/operator-scale.txt
#          (docs/benchmarks.md's fourth round: `run --objects 1000 --nodes 100 --idle-seconds 30
#          --resync-seconds 45 --fresh-cluster [--also-operator prev=DIR]`).
set -euo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export HETEROSERVE_CACHE=/tmp/hs-cache
bin=$HETEROSERVE_CACHE/bin
mkdir -p "$bin" /tmp/hs-bin
unpack() {
  for f in "$1"/*.xz; do
    [ -e "$f" ] || continue
    name=$(basename "$f" .xz)
    xz -dc "$f" > "$bin/$name"
    chmod +x "$bin/$name"
  done
}
if [ "${1:-}" = stage ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .devcarry/opwhl/*.whl
  unpack .devcarry/cp1
  exit 0
fi
if [ "${1:-}" != run ]; then
  echo "usage: device_operator_scale.sh stage | run [operator_scale arguments]" >&2
  exit 2
fi
shift
unpack .devcarry/cp2
# The wheels that did not fit beside the first call's binaries.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .devcarry/cp2/wheels/*.whl
# kwok's stage files (tests/cluster/build-tools.sh writes them beside the binaries)
rm -rf "$HETEROSERVE_CACHE/kwok-stages" && cp -r .devcarry/cp2/kwok-stages "$HETEROSERVE_CACHE/"
# helm renders only the chart's peering CRDs, which this benchmark does not install; the
# harness checks that every tool it knows is present.
[ -e "$bin/helm" ] || { printf '#!/bin/sh\necho "helm is not carried to this machine" >&2; exit 1\n' > "$bin/helm"; chmod +x "$bin/helm"; }
ln -sf "$bin/kubectl" /tmp/hs-bin/kubectl
# py-spy, when carried (cp2/py-spy.xz), for operator_scale's --py-spy
[ -e "$bin/py-spy" ] && ln -sf "$bin/py-spy" /tmp/hs-bin/py-spy
export PATH=/tmp/hs-bin:$PATH PYTHONPATH=/tmp/site:$PWD/operator:$PWD/engines:$PWD/local:$PWD
export PYTHONUNBUFFERED=1
lscpu | grep -E "Model name|^CPU\(s\)|L3" | tee "$out/machine.txt"
python3 -m tests.bench.operator_scale "$@" 2>&1 | tee "$out/operator-scale.txt"
