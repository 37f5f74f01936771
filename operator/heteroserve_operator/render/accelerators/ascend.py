"""Huawei Ascend NPUs through the MindCluster device plugin.

Without the Ascend Docker Runtime the driver is mounted from the host by hand (KsanaLLM's NPU
`docker run`): the driver libraries, npu-smi, and the install info files. The plugin itself hands
out /dev/davinciN and sets ASCEND_VISIBLE_DEVICES.
"""

from __future__ import annotations

from ...api.models import AcceleratorSpec
from . import AcceleratorProfile

RESOURCE = "huawei.com/Ascend910"
CHIP_LABEL = "node.kubernetes.io/npu.chip.name"
HOST_MOUNTS = {
    "ascend-driver": "/usr/local/Ascend/driver",
    "ascend-dcmi": "/usr/local/dcmi",
    "npu-smi": "/usr/local/bin/npu-smi",
    "ascend-install-info": "/etc/ascend_install.info",
}


def profile(accelerator: AcceleratorSpec) -> AcceleratorProfile:
    selector = {CHIP_LABEL: accelerator.product} if accelerator.product else {}
    volumes = [{"name": name, "hostPath": {"path": path}} for name, path in HOST_MOUNTS.items()]
    mounts = [{"name": name, "mountPath": path, "readOnly": True}
              for name, path in HOST_MOUNTS.items()]
    return AcceleratorProfile(
        resource=RESOURCE,
        limits={RESOURCE: str(accelerator.count)},
        node_selector=selector,
        tolerations=[{"key": RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        env={"LD_LIBRARY_PATH": "/usr/local/Ascend/driver/lib64:/usr/local/Ascend/driver/lib64/"
             "common:/usr/local/Ascend/driver/lib64/driver"},
        volumes=volumes,
        mounts=mounts,
        torch_device="npu",
    )
