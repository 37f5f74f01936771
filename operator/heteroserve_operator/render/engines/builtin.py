"""heteroserve's own engines: the PyTorch prefill engine (any torch device) and the CPU decode
engine (compiled kernels, NUMA-pinned)."""

from __future__ import annotations

from ...api.models import InferenceDeploymentSpec
from ...numa import NumaPlan
from .. import images, kv_token, same_node
from ..accelerators import AcceleratorProfile
from . import DECODE_PORT, PREFILL_PORT, EngineContainer, bind_wrapper, user_env
from .cpu_env import decode_environment


def prefill(spec: InferenceDeploymentSpec, accelerator: AcceleratorProfile) -> EngineContainer:
    engine = spec.prefill.engine
    return EngineContainer(
        image=engine.image or images.PREFILL_ENGINE,
        command=["heteroserve-prefill-engine"],
        args=["--model", spec.model.path, "--served-model-name", spec.model.name,
              "--device", accelerator.torch_device,
              "--tensor-parallel-size", str(spec.prefill.accelerator.count),
              "--max-model-len", str(spec.model.max_model_len),
              "--host", "0.0.0.0", "--port", str(engine.port or PREFILL_PORT),
              *kv_token.engine_args(spec), *kv_token.export_args(spec),
              *same_node.engine_args(spec), *engine.args],
        port=engine.port or PREFILL_PORT,
        env={**accelerator.env, **user_env(engine.env)},
        field_env=kv_token.export_env(spec),
        shm_size=engine.shm_size or "8Gi",
        kv_token=kv_token.kv_handoff(spec),
    )


def bind_command(plan: NumaPlan) -> list[str]:
    """`heteroserve-bind` in front of the engine: the binding is computed in the container from
    the cpuset the kubelet granted (two replicas on one node get different exclusive cores under
    the static CPU manager), checked against the plan's shape, then exported; the rendered
    binding variables are only the plan's fallback (docs/cpu-engine.md, bind_wrapper.py)."""
    return bind_wrapper.bind_command(plan)


def decode(spec: InferenceDeploymentSpec, plan: NumaPlan) -> EngineContainer:
    engine = spec.decode.engine
    return EngineContainer(
        image=engine.image or images.CPU_ENGINE,
        command=[*bind_command(plan), "heteroserve-cpu-engine"],
        args=["--model", spec.model.path, "--served-model-name", spec.model.name,
              "--max-model-len", str(spec.model.max_model_len),
              "--host", "0.0.0.0", "--port", str(engine.port or DECODE_PORT),
              *kv_token.engine_args(spec),
              *same_node.engine_args(spec), *engine.args],
        port=engine.port or DECODE_PORT,
        # NRC unset: the engine chooses the rows per one-token product by row width
        # (docs/cpu-engine.md); the Kunpeng guidance is for the sysHAX kernels.
        env={**decode_environment(spec.decode, plan, guided_nrc=False), **user_env(engine.env)},
        startup_seconds=600,
        shm_size="1Gi",
        kv_token=kv_token.kv_handoff(spec),
    )
