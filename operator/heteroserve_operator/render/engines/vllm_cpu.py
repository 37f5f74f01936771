"""The sysHAX CPU vLLM (seed 000/001):

    NRC=4 INFERENCE_OP_MODE=fused OMP_NUM_THREADS=160 CUSTOM_CPU_AFFINITY=0-159 SYSHAX_QUANTIZE=q4_0
    vllm serve <path> --served-model-name=<name> --host 0.0.0.0 --port 8002 --dtype=half
        --block_size=16 --preemption_mode=swap --max_model_len=8192

block_size and preemption_mode must match the GPU engine's (the KV moves between them).
"""

from __future__ import annotations

from ...api.models import InferenceDeploymentSpec
from ...numa import NumaPlan
from .. import images
from . import DECODE_PORT, EngineContainer, user_env
from .cpu_env import decode_environment


def decode(spec: InferenceDeploymentSpec, plan: NumaPlan) -> EngineContainer:
    engine = spec.decode.engine
    prefill_engine = spec.prefill.engine if spec.prefill else None
    block = (prefill_engine.block_size if prefill_engine and prefill_engine.block_size else 16)
    preemption = (prefill_engine.preemption_mode if prefill_engine and
                  prefill_engine.preemption_mode else "swap")
    return EngineContainer(
        image=engine.image or images.SYSHAX_VLLM_CPU,
        command=["vllm", "serve", spec.model.path],
        args=[f"--served-model-name={spec.model.name}", "--host", "0.0.0.0",
              "--port", str(engine.port or DECODE_PORT), f"--dtype={spec.model.dtype}",
              f"--block_size={block}", f"--preemption_mode={preemption}",
              f"--max_model_len={spec.model.max_model_len}", *engine.args],
        port=engine.port or DECODE_PORT,
        env={**decode_environment(spec.decode, plan), **user_env(engine.env)},
        startup_seconds=1800,
    )
