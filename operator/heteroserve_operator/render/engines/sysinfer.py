"""The sysInfer OpenAI server (seed 002):

    OMP_NUM_THREADS=88 GOMP_CPU_AFFINITY=0-21,24-45,48-69,72-93 \
    ./server /app/Baichuan2-13B-Chat-Q4_0.gguf -t 0.0 -n 4096

It listens on 7860 and has no health route (TCP check). It reads only the binding variables:
the sysHAX knobs (INFERENCE_OP_MODE, SYSHAX_QUANTIZE, NRC) are not passed, the model file carries
its quantization.

The seed runs it with Docker's defaults (no --privileged, no capability, the default seccomp
profile, which refuses the NUMA memory calls without SYS_NICE); libgomp binds its threads with
sched_setaffinity, allowed to any process on CPUs of its own cpuset. So it runs restricted.
The image has no heteroserve-bind: bind_wrapper.foreign_image puts it in front of `./server`
(run from /app, the working directory, as in the seed).
"""

from __future__ import annotations

from ...api.models import InferenceDeploymentSpec
from ...numa import NumaPlan
from .. import images
from . import EngineContainer, bind_wrapper, user_env
from .cpu_env import binding_environment

PORT = 7860


def decode(spec: InferenceDeploymentSpec, plan: NumaPlan) -> EngineContainer:
    engine = spec.decode.engine
    port = engine.port or PORT
    return bind_wrapper.foreign_image(EngineContainer(
        image=engine.image or images.SYSINFER,
        command=["./server"],
        args=[spec.model.path, "-t", "0.0", "-n", str(spec.model.max_model_len), *engine.args],
        port=port,
        env={**binding_environment(plan), **user_env(engine.env)},
        health_path=None,
        metrics_path=None,
        working_dir="/app",
        startup_seconds=900,
    ), plan)
