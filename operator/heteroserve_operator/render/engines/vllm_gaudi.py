"""vLLM on Gaudi through the seed's start script (seed 003):

    bash start_gaudi_vllm_server.sh -w <weights> -n <cards> -m <module ids> -b <max_num_seqs>
        -i <in_min,in_max> -o <out_min,out_max> -l <max_model_len> -t <max_batched_tokens>
        -d <dtype> -p <port> -u <host> -c <recipe cache> [-r max_bs,max_seq] [-s]

The recipe cache is valid only for the same model, engine configuration and software version, so
its node-local directory is keyed by a hash of exactly those. First warmup takes about 10 minutes
(70B) to an hour (DeepSeek-R1): the startup probe allows an hour.
"""

from __future__ import annotations

from ...api.models import InferenceDeploymentSpec
from .. import images
from ..accelerators import AcceleratorProfile
from ..meta import digest
from . import EngineContainer, user_env

DEFAULT_PORT = 30001
SCRIPT = "scripts/start_gaudi_vllm_server.sh"
WORKDIR = "/workspace/vllm-fork"
RECIPE_CACHE_HOST_ROOT = "/var/lib/heteroserve/gaudi-recipe-cache"
DTYPES = {"auto": "bfloat16", "bfloat16": "bfloat16", "half": "float16", "float16": "float16",
          "float32": "bfloat16"}


def script_args(spec: InferenceDeploymentSpec, port: int) -> list[str]:
    engine, accelerator = spec.prefill.engine, spec.prefill.accelerator
    args = ["-w", spec.model.path, "-n", str(accelerator.count)]
    if accelerator.module_ids:
        args += ["-m", ",".join(map(str, accelerator.module_ids))]
    if engine.max_num_seqs is not None:
        args += ["-b", str(engine.max_num_seqs)]
    if engine.input_range:
        args += ["-i", f"{engine.input_range.min},{engine.input_range.max}"]
    if engine.output_range:
        args += ["-o", f"{engine.output_range.min},{engine.output_range.max}"]
    args += ["-l", str(spec.model.max_model_len)]
    if engine.max_num_batched_tokens is not None:
        args += ["-t", str(engine.max_num_batched_tokens)]
    args += ["-d", DTYPES[spec.model.dtype], "-p", str(port), "-u", "0.0.0.0"]
    warmup = engine.warmup
    if warmup and warmup.recipe_cache:
        args += ["-c", warmup.recipe_cache_path]
    if warmup and warmup.reduced_max_batch_size and warmup.reduced_max_seq_len:
        args += ["-r", f"{warmup.reduced_max_batch_size},{warmup.reduced_max_seq_len}"]
    if warmup and warmup.skip:
        args.append("-s")
    return args + list(engine.args)


def recipe_cache_key(spec: InferenceDeploymentSpec, image: str, args: list[str]) -> str:
    return digest({"model": spec.model.path, "args": args, "image": image})


def prefill(spec: InferenceDeploymentSpec, accelerator: AcceleratorProfile) -> EngineContainer:
    engine = spec.prefill.engine
    port = engine.port or DEFAULT_PORT
    image = engine.image or images.VLLM_GAUDI
    args = script_args(spec, port)
    volumes, mounts = [], []
    if engine.warmup and engine.warmup.recipe_cache:
        key = recipe_cache_key(spec, image, args)
        volumes.append({"name": "recipe-cache", "hostPath": {
            "path": f"{RECIPE_CACHE_HOST_ROOT}/{key}", "type": "DirectoryOrCreate"}})
        mounts.append({"name": "recipe-cache", "mountPath": engine.warmup.recipe_cache_path})
    return EngineContainer(
        image=image,
        command=["bash", SCRIPT],
        args=args,
        port=port,
        env={**accelerator.env, **user_env(engine.env)},
        startup_seconds=3600,
        working_dir=WORKDIR,
        volumes=volumes,
        mounts=mounts,
        shm_size=engine.shm_size or "64Gi",
    )
