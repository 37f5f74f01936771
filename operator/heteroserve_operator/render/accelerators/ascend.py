"""Huawei Ascend NPUs through the MindCluster device plugin.

Without the Ascend Docker Runtime the driver is mounted from the host by hand, as KsanaLLM's NPU
`docker run` does (seed 004): the driver libraries, npu-smi from /usr/local/sbin, the install
info file, and the NPU log tree /var/log/npu (slog configuration, slog, profiling and dump
directories, also seen at /usr/slog). The plugin itself hands out /dev/davinciN and sets
ASCEND_VISIBLE_DEVICES.
"""

from __future__ import annotations

from ...api.models import AcceleratorSpec
from . import AcceleratorProfile

RESOURCE = "huawei.com/Ascend910"
CHIP_LABEL = "node.kubernetes.io/npu.chip.name"
# volume name -> host path, and where it is mounted: [(container path, read-only)].
HOST_MOUNTS: dict[str, tuple[str, list[tuple[str, bool]]]] = {
    "ascend-driver": ("/usr/local/Ascend/driver", [("/usr/local/Ascend/driver", True)]),
    "ascend-dcmi": ("/usr/local/dcmi", [("/usr/local/dcmi", True)]),
    "npu-smi": ("/usr/local/sbin/npu-smi", [("/usr/local/sbin/npu-smi", True)]),
    "ascend-install-info": ("/etc/ascend_install.info", [("/etc/ascend_install.info", True)]),
    # The driver and CANN write their logs here (seed: -v /var/log/npu/...:/var/log/npu/...
    # and -v /var/log/npu/:/usr/slog).
    "npu-log": ("/var/log/npu", [("/var/log/npu", False), ("/usr/slog", False)]),
}


def profile(accelerator: AcceleratorSpec) -> AcceleratorProfile:
    selector = {CHIP_LABEL: accelerator.product} if accelerator.product else {}
    volumes = [{"name": name, "hostPath": {"path": path}}
               for name, (path, _targets) in HOST_MOUNTS.items()]
    # readOnly only when true: the apiserver drops a false one, and the drift check would see
    # its absence as drift on every reconcile.
    mounts = [{"name": name, "mountPath": target, **({"readOnly": True} if read_only else {})}
              for name, (_path, targets) in HOST_MOUNTS.items()
              for target, read_only in targets]
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
