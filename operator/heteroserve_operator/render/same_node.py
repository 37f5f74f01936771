"""The same-node pod: heteroserve's prefill and CPU decode engines as two containers of one pod.

sysHAX runs its CPU engine with `--ipc container:vllm_gpu` so that prefill and decode share
memory; two pods cannot, short of `hostIPC` or a hostPath on the node (docs/architecture.md says
why neither). Containers of one pod can: they mount one memory-backed emptyDir (a tmpfs) at
`KV_SHM_DIR`, and both engines get `--kv-shm-dir` on it, so a split request's KV is handed over
through a file there instead of TCP (docs/kv-handoff.md). Only heteroserve's own pair hands KV
over, so only `decode.placement: sameNode` with both builtin engines renders this way; every other
engine keeps a decode Deployment of its own (pod affinity to the prefill pods for sameNode).

What that changes, decided here and in workloads.py:
- replicas: every prefill pod carries one decode engine, so `decode.replicas` must equal
  `prefill.replicas` (refused otherwise, with the reason in status);
- CPUs: the pod is Guaranteed (every container requests integer CPUs equal to its limits) so the
  static CPU manager gives the decode engine exclusive cores; the prefill engine and router share
  the cores the NUMA plan reserves (`host_cpus`);
- memory: the channel's tmpfs pages are charged to the container that writes them, the prefill
  engine, whose memory grows by the channel's size limit (`channel_bytes`).

Pure: spec in, numbers and manifest pieces out.
"""

from __future__ import annotations

import math
from typing import Any

from ..api.models import InferenceDeploymentSpec
from ..numa import NumaPlan, NumaPlanError
from . import kv_token

KV_SHM_DIR = "/var/run/heteroserve/kv"
VOLUME = "kv-shm"
# The decode engine's container, its port and its own /dev/shm in the shared pod (the prefill
# engine keeps the names "engine" and "dshm").
DECODE_CONTAINER = "decode-engine"
DECODE_PORT_NAME = "decode"
DECODE_SHM_VOLUME = "decode-dshm"
ROUTER_CPUS = 1

# The CPU engine's `--kv-cache-gib` default (heteroserve_engines.cpu_engine; the operator may not
# import the engine, tests/unit/test_render.py checks they agree).
CPU_ENGINE_KV_CACHE_GIB = 1.0
# Stream framing per KV in flight (docs/kv-handoff.md, "The stream"): the header's token ids as
# JSON (at most 7 digits and a comma each, vocabularies below 10^7) ...
FRAMING_BYTES_PER_TOKEN = 8
# ... plus the preamble, the rest of the header, 12 bytes per layer frame and the trailer.
FRAMING_BYTES_PER_KV = 4096
MIB = 2**20


def shares_pod(spec: InferenceDeploymentSpec) -> bool:
    """Both tiers are heteroserve's engines (the pair that hands KV over) and decode is placed
    on the prefill nodes: the decode engine runs in the prefill pod."""
    return bool(kv_token.kv_handoff(spec) and spec.decode.placement == "sameNode")


def engine_args(spec: InferenceDeploymentSpec) -> list[str]:
    """The flag both engines get in the shared pod; none elsewhere (they then use TCP)."""
    return ["--kv-shm-dir", KV_SHM_DIR] if shares_pod(spec) else []


def check_replicas(spec: InferenceDeploymentSpec) -> None:
    """Raises NumaPlanError (the placement's error: Degraded, NumaPlanFailed) when the decode
    replicas cannot be one per prefill pod."""
    if spec.decode.replicas != spec.prefill.replicas:
        raise NumaPlanError(
            f"decode.replicas is {spec.decode.replicas} but prefill.replicas is "
            f"{spec.prefill.replicas}: with placement sameNode heteroserve's engines run in one "
            "pod (a decode engine beside each prefill engine, sharing memory for the KV "
            "hand-off), so decode.replicas must equal prefill.replicas")


def kv_cache_gib(spec: InferenceDeploymentSpec) -> float:
    """The decode engine's KV cache: its `--kv-cache-gib` in decode.engine.args, else the
    engine's default."""
    args = list(spec.decode.engine.args)
    value = None
    for index, arg in enumerate(args):
        if arg == "--kv-cache-gib" and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith("--kv-cache-gib="):
            value = arg.partition("=")[2]
    try:
        return float(value) if value is not None else CPU_ENGINE_KV_CACHE_GIB
    except ValueError:
        raise NumaPlanError(f"decode.engine.args: --kv-cache-gib {value} is not a number"
                            ) from None


def channel_bytes(spec: InferenceDeploymentSpec) -> int:
    """The shared directory's size limit, in whole MiB.

    A KV file lives from the exporter's write until the decode engine has copied it into its
    KV cache (it maps the file and unlinks it at once; the pages go when the copy is done). Its
    size is 2 (K, V) x layers x KV heads x head size x 2 bytes (float16) x prompt tokens, plus
    framing. The operator does not read the model, so it bounds the sum over the KVs in flight
    by where they go: all of them land in the decode engine's KV cache, which holds float16
    like the stream. The framing is added for the most prompts one CPU engine is sent at once
    (router.offload.cpuMaxBatchSize), each as long as maxModelLen:

        kvCacheGiB x 2^30 + cpuMaxBatchSize x (8 x maxModelLen + 4096) bytes

    A tmpfs allocates only what is written: the limit is a ceiling, not a reservation. A write
    beyond it fails (ENOSPC), the pull fails, and the decode engine computes that prompt itself.
    """
    in_flight = spec.router.offload.cpu_max_batch_size
    framing = in_flight * (FRAMING_BYTES_PER_TOKEN * spec.model.max_model_len
                           + FRAMING_BYTES_PER_KV)
    total = kv_cache_gib(spec) * 2**30 + framing
    return math.ceil(total / MIB) * MIB


def volume(spec: InferenceDeploymentSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod volume and the mount both engine containers get."""
    return ({"name": VOLUME, "emptyDir": {"medium": "Memory",
                                          "sizeLimit": f"{channel_bytes(spec) // MIB}Mi"}},
            {"name": VOLUME, "mountPath": KV_SHM_DIR})


def host_cpus(spec: InferenceDeploymentSpec, plan: NumaPlan) -> int:
    """The prefill engine's CPUs in the shared pod: the cores the NUMA plan leaves free at the
    end of each NUMA node it uses (decode.reservedCpusPerNumaNode, Kunpeng BoostKit's cores of
    the GPU engine and router), less the router's; at least one."""
    return _host_cpus(spec, len(plan.numa_node_ids))


def pod_cpus(spec: InferenceDeploymentSpec) -> int:
    """What the shared pod asks of a node at least (with decode.numaNodes unset, the plan may
    span more NUMA nodes and reserve more)."""
    return spec.decode.cpus + _host_cpus(spec, spec.decode.numa_nodes or 1) + ROUTER_CPUS


def _host_cpus(spec: InferenceDeploymentSpec, numa_nodes: int) -> int:
    return max(1, spec.decode.reserved_cpus_per_numa_node * numa_nodes - ROUTER_CPUS)
