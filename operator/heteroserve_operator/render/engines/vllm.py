"""`vllm serve` on NVIDIA GPUs (and the shared argument list of vLLM-based engines).

Flags as in the sysHAX guide (seed 000/001): --served-model-name, --host 0.0.0.0, --port,
--dtype, --swap_space, --block_size, --preemption_mode, --max_model_len, --tensor-parallel-size,
--gpu_memory_utilization; underscores where the guide writes them so.

Restricted (render/security.py): the seed runs the GPU container unprivileged; vLLM on GPUs needs
no capability, no memory policy and no root (its caches go under HOME=/tmp).
"""

from __future__ import annotations

from ...api.models import InferenceDeploymentSpec
from .. import images
from ..accelerators import AcceleratorProfile
from . import PREFILL_PORT, EngineContainer, user_env


def serve_args(spec: InferenceDeploymentSpec, port: int) -> list[str]:
    engine = spec.prefill.engine
    args = [
        f"--served-model-name={spec.model.name}",
        "--host", "0.0.0.0",
        "--port", str(port),
        f"--dtype={spec.model.dtype}",
    ]
    if engine.swap_space is not None:
        args.append(f"--swap_space={engine.swap_space}")
    if engine.block_size is not None:
        args.append(f"--block_size={engine.block_size}")
    if engine.preemption_mode is not None:
        args.append(f"--preemption_mode={engine.preemption_mode}")
    args.append(f"--max_model_len={spec.model.max_model_len}")
    if engine.max_num_seqs is not None:
        args.append(f"--max-num-seqs={engine.max_num_seqs}")
    if engine.max_num_batched_tokens is not None:
        args.append(f"--max-num-batched-tokens={engine.max_num_batched_tokens}")
    args += ["--tensor-parallel-size", str(spec.prefill.accelerator.count)]
    if engine.gpu_memory_utilization is not None:
        args.append(f"--gpu_memory_utilization={engine.gpu_memory_utilization}")
    return args + list(engine.args)


def prefill(spec: InferenceDeploymentSpec, accelerator: AcceleratorProfile,
            default_image: str = images.VLLM) -> EngineContainer:
    engine = spec.prefill.engine
    return EngineContainer(
        image=engine.image or default_image,
        command=["vllm", "serve", spec.model.path],
        args=serve_args(spec, engine.port or PREFILL_PORT),
        port=engine.port or PREFILL_PORT,
        env={**accelerator.env, **user_env(engine.env)},
        shm_size=engine.shm_size or "64Gi",
    )
