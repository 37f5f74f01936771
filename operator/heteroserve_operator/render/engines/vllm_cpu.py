"""The sysHAX CPU vLLM (seed 000/001):

    NRC=4 INFERENCE_OP_MODE=fused OMP_NUM_THREADS=160 CUSTOM_CPU_AFFINITY=0-159 SYSHAX_QUANTIZE=q4_0
    vllm serve <path> --served-model-name=<name> --host 0.0.0.0 --port 8002 --dtype=half
        --block_size=16 --preemption_mode=swap --max_model_len=8192

block_size and preemption_mode must match the GPU engine's (the KV moves between them).

The seed runs this container `--privileged`. What the engine needs of that is its NUMA binding:
with a CPU binding set, the sysHAX CPU vLLM (a vLLM V0 CPU backend, like vLLM's
VLLM_CPU_OMP_THREADS_BIND) moves its pages to the bound NUMA node with migrate_pages and binds
its memory with set_mempolicy, reading the policy back with get_mempolicy. The runtime's default
seccomp profile never allows migrate_pages (whatever the capabilities; vLLM CPU failed to start
so, "numa_migrate_pages failed. errno: 1", vllm-project/vllm#10556), and the others only with
CAP_SYS_NICE. For the engine's own pages the kernel itself asks no capability. So the container
keeps UID 1000, no capabilities and no privilege escalation, and only its seccomp profile is
Unconfined (Pod Security "privileged", docs/security.md; a Localhost profile that adds those
syscalls to the default would pass "restricted", where a node has one).

The image has no heteroserve-bind: bind_wrapper.foreign_image puts it in front of `vllm serve`.
"""

from __future__ import annotations

from ...api.models import InferenceDeploymentSpec
from ...numa import NumaPlan
from .. import images
from ..security import SecurityProfile
from . import DECODE_PORT, EngineContainer, bind_wrapper, user_env
from .cpu_env import decode_environment

SECURITY = SecurityProfile(
    seccomp="Unconfined",
    reason="the seed's --privileged, reduced to what the CPU binding needs: migrate_pages, "
           "set_mempolicy and get_mempolicy on its own pages, which the default seccomp profile "
           "refuses (migrate_pages always); UID 1000, no capabilities")


def decode(spec: InferenceDeploymentSpec, plan: NumaPlan) -> EngineContainer:
    engine = spec.decode.engine
    prefill_engine = spec.prefill.engine if spec.prefill else None
    block = (prefill_engine.block_size if prefill_engine and prefill_engine.block_size else 16)
    preemption = (prefill_engine.preemption_mode if prefill_engine and
                  prefill_engine.preemption_mode else "swap")
    return bind_wrapper.foreign_image(EngineContainer(
        image=engine.image or images.SYSHAX_VLLM_CPU,
        command=["vllm", "serve", spec.model.path],
        args=[f"--served-model-name={spec.model.name}", "--host", "0.0.0.0",
              "--port", str(engine.port or DECODE_PORT), f"--dtype={spec.model.dtype}",
              f"--block_size={block}", f"--preemption_mode={preemption}",
              f"--max_model_len={spec.model.max_model_len}", *engine.args],
        port=engine.port or DECODE_PORT,
        env={**decode_environment(spec.decode, plan), **user_env(engine.env)},
        startup_seconds=1800,
        security=SECURITY,
    ), plan)
