"""vLLM on Gaudi through the seed's start scripts (seed 003):

    bash scripts/start_gaudi_vllm_server.sh -w <weights> -n <cards> -m <module ids>
        -b <max_num_seqs> -i <in_min,in_max> -o <out_min,out_max> -l <max_model_len>
        -t <max_batched_tokens> -d <dtype> -p <port> -u <host> -c <recipe cache>
        [-r max_bs,max_seq] [-s]

and, for DeepSeek-R1 FP8 on all 8 cards (section 3.1, vllm-fork's deepseek_r1 branch):

    cd quickstart && bash start_vllm.sh -w <weights> [-q] -u <host> -p <port> -b <max_num_seqs>
        -l <max_model_len> -c <recipe cache> [-s]

The recipe cache is valid only for the same model, engine configuration and software version, so
its node-local directory is keyed by a hash of exactly those: not of the flags that only say where
and how to start (-p, -u, -c, -m) or how much to warm up (-s, -r). The seed restarts with `-s` or
`-r` on the cache a full warmup filled, so those must find the same directory. First warmup takes
about 10 minutes (70B) to an hour (DeepSeek-R1): the startup probe allows an hour.

Security: the seed's containers run as root with `--cap-add=sys_nice` (seed 1.2.1, 3.2; 3.1 adds
CAP_IPC_LOCK with `--ulimit memlock=-1` for the 8-card scale-out). A capability only acts for
UID 0 (Kubernetes sets no ambient capabilities), so the engine runs as root, as the seed's image
does, with every other capability dropped, no privilege escalation and the default seccomp
profile (which with SYS_NICE in the bounding set also allows mbind/set_mempolicy). The recipe
cache is a hostPath the kubelet creates root:root 0755 (DirectoryOrCreate): writable by the
engine's user, root, with no fsGroup (which hostPath volumes ignore) and no chown step. Pod
Security: "privileged" (SYS_NICE is not on baseline's list; the cache is a hostPath).
"""

from __future__ import annotations

from ...api.models import InferenceDeploymentSpec
from .. import images
from ..accelerators import AcceleratorProfile
from ..meta import digest
from ..security import ROOT, SecurityProfile
from . import EngineContainer, user_env

DEFAULT_PORT = 30001
SCRIPT = "scripts/start_gaudi_vllm_server.sh"
WORKDIR = "/workspace/vllm-fork"
# The deepseek_r1 branch's quickstart script, run from its directory as in the seed.
START_VLLM = "start_vllm.sh"
START_VLLM_WORKDIR = f"{WORKDIR}/quickstart"
START_VLLM_PORT = 8688
RECIPE_CACHE_HOST_ROOT = "/var/lib/heteroserve/gaudi-recipe-cache"
DTYPES = {"auto": "bfloat16", "bfloat16": "bfloat16", "half": "float16", "float16": "float16",
          "float32": "bfloat16"}
# Flags that do not change the compiled recipes: (flag, takes a value).
NOT_IN_CACHE_KEY = {"-p": True, "-u": True, "-c": True, "-m": True, "-r": True, "-s": False}
SECURITY = SecurityProfile(
    user=ROOT, add_capabilities=("SYS_NICE",),
    reason="the seed's --cap-add=sys_nice, which acts only for root (the seed's image runs as "
           "root); the recipe cache hostPath is root's")
# Seed 3.1 (start_vllm.sh, 8 cards over the host NICs): locked memory for the RDMA buffers.
START_VLLM_SECURITY = SecurityProfile(
    user=ROOT, add_capabilities=("SYS_NICE", "IPC_LOCK"),
    reason=SECURITY.reason + "; seed 3.1's CAP_IPC_LOCK (memlock -1) for the 8-card scale-out")


def _start_vllm(spec: InferenceDeploymentSpec) -> bool:
    return spec.prefill.engine.script == "start_vllm"


def script_args(spec: InferenceDeploymentSpec, port: int) -> list[str]:
    engine, accelerator = spec.prefill.engine, spec.prefill.accelerator
    if _start_vllm(spec):
        return start_vllm_args(spec, port)
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


def start_vllm_args(spec: InferenceDeploymentSpec, port: int) -> list[str]:
    """`start_vllm.sh <-w> [-u:p:l:b:c:sq]`, in the seed's order."""
    engine = spec.prefill.engine
    args = ["-w", spec.model.path]
    if engine.quantization == "inc-fp8":
        args.append("-q")
    args += ["-u", "0.0.0.0", "-p", str(port)]
    if engine.max_num_seqs is not None:
        args += ["-b", str(engine.max_num_seqs)]
    args += ["-l", str(spec.model.max_model_len)]
    warmup = engine.warmup
    if warmup and warmup.recipe_cache:
        args += ["-c", warmup.recipe_cache_path]
    if warmup and warmup.skip:
        args.append("-s")
    return args + list(engine.args)


def recipe_cache_key(spec: InferenceDeploymentSpec, image: str, args: list[str]) -> str:
    """A hash of what the compiled recipes depend on: model, script, image and the shape flags
    (-n -b -i -o -l -t -d -q and extra arguments), never -p -u -c -m -r -s."""
    kept, index = [], 0
    while index < len(args):
        flag = args[index]
        if flag in NOT_IN_CACHE_KEY:
            index += 2 if NOT_IN_CACHE_KEY[flag] else 1
            continue
        kept.append(flag)
        index += 1
    script = START_VLLM if _start_vllm(spec) else SCRIPT
    return digest({"model": spec.model.path, "script": script, "args": kept, "image": image})


def prefill(spec: InferenceDeploymentSpec, accelerator: AcceleratorProfile) -> EngineContainer:
    engine = spec.prefill.engine
    start_vllm = _start_vllm(spec)
    port = engine.port or (START_VLLM_PORT if start_vllm else DEFAULT_PORT)
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
        command=["bash", START_VLLM if start_vllm else SCRIPT],
        args=args,
        port=port,
        env={**accelerator.env, **user_env(engine.env)},
        startup_seconds=3600,
        working_dir=START_VLLM_WORKDIR if start_vllm else WORKDIR,
        volumes=volumes,
        mounts=mounts,
        shm_size=engine.shm_size or "64Gi",
        security=START_VLLM_SECURITY if start_vllm else SECURITY,
    )
