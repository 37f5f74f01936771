"""Where decode pods go and which CPUs they bind: the NUMA planner applied to candidate nodes."""

from __future__ import annotations

from dataclasses import dataclass

from ..api.models import InferenceDeploymentSpec
from ..numa import NodeTopology, NumaPlan, NumaPlanError, plan_cpus
from . import same_node
from .accelerators import profile as accelerator_profile
from .facts import ClusterFacts, NodeFacts


@dataclass(frozen=True)
class DecodePlacement:
    plan: NumaPlan
    # Nodes on which `plan` holds; empty when no node published its topology (then the engine
    # re-plans from the cpuset it receives).
    nodes: tuple[str, ...]


def _matches(node: NodeFacts, selector: dict[str, str]) -> bool:
    return all(node.labels.get(k) == v for k, v in selector.items())


ACCELERATOR_RESOURCES = ("nvidia.com/gpu", "habana.ai/gaudi", "huawei.com/Ascend910")


def candidate_nodes(spec: InferenceDeploymentSpec, facts: ClusterFacts) -> list[NodeFacts]:
    decode = spec.decode
    selector = dict(decode.node_selector)
    nodes = [n for n in facts.nodes if _matches(n, selector)]
    # The shared pod also asks the prefill engine's and the router's cores.
    cpus = same_node.pod_cpus(spec) if same_node.shares_pod(spec) else decode.cpus
    if decode.placement == "sameNode" and spec.prefill:
        accel = accelerator_profile(spec.prefill.accelerator)
        prefill_selector = {**accel.node_selector, **spec.prefill.node_selector}
        nodes = [n for n in nodes if _matches(n, prefill_selector)
                 and n.allocatable_int(accel.resource) >= spec.prefill.accelerator.count]
    return [n for n in nodes if n.allocatable_int("cpu") >= cpus]


def _has_accelerator(node: NodeFacts) -> bool:
    return any(node.allocatable_int(r) > 0 for r in ACCELERATOR_RESOURCES)


def place_decode(spec: InferenceDeploymentSpec, facts: ClusterFacts) -> DecodePlacement:
    """Raises NumaPlanError, with the rule that fails, when no candidate node can hold the plan.

    anyNode prefers nodes without accelerators: their host cores are not needed by a prefill
    engine.
    """
    decode = spec.decode
    if same_node.shares_pod(spec):
        same_node.check_replicas(spec)
    reserved = decode.reserved_cpus_per_numa_node
    matching = candidate_nodes(spec, facts)
    if facts.nodes and not matching:
        raise NumaPlanError(
            f"no node can hold a decode pod of {decode.cpus} CPUs"
            + (f" (a pod of {same_node.pod_cpus(spec)} with the prefill engine and router)"
               if same_node.shares_pod(spec) else "")
            + (" next to the prefill accelerators (placement sameNode)"
               if decode.placement == "sameNode" else "")
            + (f" with labels {decode.node_selector}" if decode.node_selector else ""))
    candidates = [n for n in matching if n.topology is not None]
    if decode.placement == "anyNode" and any(not _has_accelerator(n) for n in candidates):
        candidates = [n for n in candidates if not _has_accelerator(n)]
    plans: dict[str, list[tuple[str, NumaPlan]]] = {}
    errors: list[str] = []
    for node in sorted(candidates, key=lambda n: n.name):
        try:
            plan = plan_cpus(node.topology, decode.cpus, decode.numa_nodes, reserved)
        except NumaPlanError as error:
            errors.append(str(error))
            continue
        plans.setdefault(plan.cpu_list, []).append((node.name, plan))
    if plans:
        group = max(plans.values(), key=len)
        return DecodePlacement(group[0][1], tuple(name for name, _ in group))
    if errors:
        raise NumaPlanError(errors[0])
    # No topology published anywhere: plan on an even, node-by-node numbering of the request.
    numa = decode.numa_nodes or 1
    if decode.cpus % numa:
        raise NumaPlanError(
            f"{decode.cpus} CPUs cannot be spread evenly over {numa} NUMA nodes")
    virtual = NodeTopology.uniform("unknown", numa, decode.cpus // numa + reserved)
    return DecodePlacement(plan_cpus(virtual, decode.cpus, numa, reserved), ())
