"""Intel Gaudi (HPU) through the Habana device plugin (seed 003).

The seed's container runs with HABANA_VISIBLE_DEVICES=all, the vader single-copy workaround for
Open MPI, and `--cap-add=sys_nice`; the host reserves vm.nr_hugepages=15000 (2 MiB pages) for 8
cards, so each card's pod share is 15000 / 8 = 1875 pages.

HABANA_VISIBLE_DEVICES is not set here: in Kubernetes the Habana device plugin sets it to the
cards it allocated to the pod, and `all` would override that with every card of the node.
"""

from __future__ import annotations

from ...api.models import AcceleratorSpec
from . import AcceleratorProfile

RESOURCE = "habana.ai/gaudi"
HUGEPAGES_PER_CARD_MI = 15000 // 8 * 2  # 1875 pages of 2 MiB
PRODUCT_LABEL = "habana.ai/gaudi.product"


def profile(accelerator: AcceleratorSpec) -> AcceleratorProfile:
    env = {"OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
    if accelerator.module_ids:
        env["HABANA_VISIBLE_MODULES"] = ",".join(map(str, accelerator.module_ids))
    if accelerator.count > 1:
        env["PT_HPU_ENABLE_LAZY_COLLECTIVES"] = "true"
    selector = {PRODUCT_LABEL: accelerator.product} if accelerator.product else {}
    return AcceleratorProfile(
        resource=RESOURCE,
        limits={RESOURCE: str(accelerator.count),
                "hugepages-2Mi": f"{accelerator.count * HUGEPAGES_PER_CARD_MI}Mi"},
        node_selector=selector,
        tolerations=[{"key": RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        env=env,
        volumes=[{"name": "hugepages", "emptyDir": {"medium": "HugePages-2Mi"}}],
        mounts=[{"name": "hugepages", "mountPath": "/hugepages-2Mi"}],
        capabilities=("SYS_NICE",),
        torch_device="hpu",
    )
