"""The CPU binding computed inside the decode container, for every CPU engine.

Under the kubelet's static CPU manager the kubelet, not the operator, chooses which cores a
Guaranteed container gets; the operator's plan says only how many on how many NUMA nodes. So the
decode container runs `heteroserve-bind` (engines/heteroserve_engines/bind) in front of its
engine: it reads the cpuset it was granted, checks the plan's shape and the seeds' rules on it,
exports OMP_NUM_THREADS, CUSTOM_CPU_AFFINITY and GOMP_CPU_AFFINITY and execs the engine's own
command. The plan's list stays in the env as the fallback the wrapper replaces; every other
variable (sysHAX's INFERENCE_OP_MODE, SYSHAX_QUANTIZE, NRC) passes through unchanged.

heteroserve's CPU engine image has the entrypoint installed (`bind_command`). Images heteroserve
does not build (sysHAX's CPU vLLM, sysInfer's server) cannot, so their pods get it as a file
(`foreign_image`): an init container from heteroserve's CPU engine image, restricted, writes the
standard-library-only zipapp (heteroserve_engines.bind.zipapp) into an emptyDir that the engine
container mounts read-only, and the engine's command becomes `python3 <zipapp> ... -- <the
seed's command>`. The zipapp needs a `python3` of 3.8 or later on the image's PATH and nothing
else: sysHAX's image runs Python (`vllm serve`); sysInfer's image is taken to ship python3 (no test
here pulls it). An image without one fails to start, and the container's state says why.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...numa import NumaPlan
from .. import images
from ..security import restricted_container_context
from . import EngineContainer

ENTRYPOINT = "heteroserve-bind"
VOLUME = "heteroserve-bind"
DIRECTORY = "/var/run/heteroserve/bind"
ZIPAPP = f"{DIRECTORY}/heteroserve-bind.pyz"
INIT_CONTAINER = "heteroserve-bind"
# The init container counts toward the pod's QoS class: requests equal limits keep the decode
# pod Guaranteed. The pod asks max(init, sum of the others), so this adds nothing.
INIT_RESOURCES = {"cpu": "1", "memory": "128Mi"}


def plan_options(plan: NumaPlan) -> list[str]:
    """The plan's shape: the planner gives every NUMA node the same number of CPUs (the seeds'
    rule)."""
    per_node = len(plan.cpus_by_numa_node[0][1])
    return ["--numa-nodes", str(len(plan.cpus_by_numa_node)),
            "--threads-per-node", str(per_node)]


def bind_command(plan: NumaPlan) -> list[str]:
    """heteroserve's CPU engine image: the installed entrypoint, then `--` and the engine."""
    return [ENTRYPOINT, *plan_options(plan), "--"]


def init_container(image: str = images.CPU_ENGINE) -> dict[str, Any]:
    return {
        "name": INIT_CONTAINER,
        "image": image,
        "command": ["python", "-m", "heteroserve_engines.bind.zipapp", ZIPAPP],
        "resources": {"requests": dict(INIT_RESOURCES), "limits": dict(INIT_RESOURCES)},
        "volumeMounts": [{"name": VOLUME, "mountPath": DIRECTORY}],
        "securityContext": restricted_container_context(),
    }


def foreign_image(engine: EngineContainer, plan: NumaPlan) -> EngineContainer:
    """`engine` (an image without heteroserve-bind) started through the zipapp an init
    container copies in."""
    return replace(
        engine,
        command=["python3", ZIPAPP, *plan_options(plan), "--", *engine.command],
        volumes=[*engine.volumes, {"name": VOLUME, "emptyDir": {"sizeLimit": "16Mi"}}],
        mounts=[*engine.mounts, {"name": VOLUME, "mountPath": DIRECTORY, "readOnly": True}],
        init_containers=[*engine.init_containers, init_container()],
    )
