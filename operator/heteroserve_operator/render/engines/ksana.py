"""KsanaLLM (seed 004): `python serving_server.py --config_file <yaml> --port <p>`.

Its YAML carries the parallelism and batching; host 0.0.0.0 explicitly (one fork defaults to
localhost). KsanaLLM lists models at /models, not /v1/models, and has no /health route.

Security: the seed runs it `-u root --privileged` with SYS_ADMIN, SYS_PTRACE and an unconfined
seccomp profile. It runs as root here too: the image is built as root and KsanaLLM writes its log
under its working directory (`log/ksana_llm.log`, the KLLM_LOG_FILE default), inside that
root-owned tree; on NPUs, CANN and the driver's device nodes also need root (security.ASCEND_CANN,
which adds DAC_OVERRIDE). Not privileged, no SYS_ADMIN or SYS_PTRACE (profilers and debuggers),
the default seccomp profile, every other capability dropped: Pod Security "baseline" on NVIDIA,
"privileged" on Ascend (the driver is mounted from the host).

"Only Support Ascend NPU + X86 CPU" (seed 004): the NPU pods select kubernetes.io/arch=amd64.
"""

from __future__ import annotations

import yaml

from ...api.models import InferenceDeploymentSpec
from .. import images
from ..accelerators import AcceleratorProfile
from ..security import ASCEND_CANN, ROOT, SecurityProfile
from . import PREFILL_PORT, EngineContainer, user_env

CONFIG_DIR = "/etc/heteroserve/engine"
WORKDIR = "/workspace/KsanaLLM/src/ksana_llm/python"
DEFAULT_BLOCK_TOKENS = 16
DEFAULT_BATCH = 128
ARCH_LABEL = "kubernetes.io/arch"
GPU_SECURITY = SecurityProfile(
    user=ROOT, reason="the image is built as root and KsanaLLM writes log/ksana_llm.log under its "
                      "root-owned working directory")
NPU_SECURITY = SecurityProfile(user=ROOT, add_capabilities=ASCEND_CANN.add_capabilities,
                               reason=f"{GPU_SECURITY.reason}; {ASCEND_CANN.reason}")


def config(spec: InferenceDeploymentSpec) -> str:
    engine, accelerator = spec.prefill.engine, spec.prefill.accelerator
    document = {
        "setting": {
            "global": {"tensor_para_size": accelerator.count, "pipeline_para_size": 1},
            "batch_scheduler": {
                "max_batch_size": engine.max_num_seqs or DEFAULT_BATCH,
                "max_token_len": spec.model.max_model_len,
            },
            "block_manager": {"block_token_num": engine.block_size or DEFAULT_BLOCK_TOKENS},
        },
        "model_spec": {"base_model": {"model_dir": spec.model.path}},
    }
    if engine.max_num_batched_tokens:
        document["setting"]["batch_scheduler"]["max_step_tokens"] = engine.max_num_batched_tokens
    return yaml.safe_dump(document, sort_keys=False)


def prefill(spec: InferenceDeploymentSpec, accelerator: AcceleratorProfile) -> EngineContainer:
    engine = spec.prefill.engine
    npu = spec.prefill.accelerator.type == "ascend"
    return EngineContainer(
        image=engine.image or (images.KSANA_NPU if npu else images.KSANA_GPU),
        command=["python", "serving_server.py"],
        args=["--config_file", f"{CONFIG_DIR}/ksana.yaml", "--host", "0.0.0.0",
              "--port", str(engine.port or PREFILL_PORT), *engine.args],
        port=engine.port or PREFILL_PORT,
        env={**accelerator.env, **user_env(engine.env)},
        health_path=None,
        models_path="/models",
        metrics_path=None,
        working_dir=WORKDIR,
        config_files={"ksana.yaml": config(spec)},
        config_dir=CONFIG_DIR,
        shm_size=engine.shm_size or "50Gi",  # the seed's --shm-size=50g
        security=NPU_SECURITY if npu else GPU_SECURITY,
        node_selector={ARCH_LABEL: "amd64"} if npu else {},
    )
