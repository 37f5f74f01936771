"""Pod and container security contexts: each engine profile declares what its image needs
(`SecurityProfile`), and the Pod Security level its pods then need follows from that.

heteroserve's own images (and every engine that runs so) get Pod Security "restricted": UID and
GID 1000, no root, every capability dropped, no privilege escalation, the runtime's default
seccomp profile. The exceptions, each with the seed's reason, are the profiles' `SECURITY`
constants and docs/security.md. Three kernel facts decide them:

- A capability added to a non-root container is inert: Kubernetes sets no ambient
  capabilities, so a process that is not UID 0 execs with an empty effective set. A capability
  that must act (Gaudi's SYS_NICE) needs UID 0.
- The runtime's default seccomp profile (containerd's and Docker's) allows get_mempolicy, mbind
  and set_mempolicy only to a container whose bounding set holds CAP_SYS_NICE (older containerd:
  never), and never allows migrate_pages or move_pages, whatever the capabilities.
- Pod Security "baseline" admits added capabilities only from a short list (DAC_OVERRIDE is on
  it; SYS_NICE and IPC_LOCK are not), no Unconfined seccomp and no hostPath volumes;
  "restricted" admits no root, no capability but NET_BIND_SERVICE, and needs RuntimeDefault or
  Localhost seccomp.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

# Non-root UID/GID used by heteroserve's images (and a safe default for vLLM images run non-root).
RUN_AS_USER = 1000
ROOT = 0

PodSecurityLevel = Literal["restricted", "baseline", "privileged"]
# Strictest first.
LEVELS: tuple[PodSecurityLevel, ...] = ("restricted", "baseline", "privileged")
# Pod Security Standards, baseline: the capabilities a container may add.
BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
# ... and restricted.
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})


@dataclass(frozen=True)
class SecurityProfile:
    """What one engine container needs of the kernel: its user, the capabilities it adds to an
    otherwise empty set, and its seccomp profile. Never privileged, never privilege escalation.

    `reason`: why the profile needs more than restricted (docs/security.md lists them)."""

    user: int = RUN_AS_USER
    add_capabilities: tuple[str, ...] = ()
    seccomp: Literal["RuntimeDefault", "Unconfined"] = "RuntimeDefault"
    reason: str = ""

    @property
    def runs_as_root(self) -> bool:
        return self.user == ROOT

    @property
    def restricted(self) -> bool:
        return self.level == "restricted"

    @property
    def level(self) -> PodSecurityLevel:
        """The strictest Pod Security level that admits this container (volumes aside: a
        hostPath needs "privileged" whatever the container)."""
        added = set(self.add_capabilities)
        if self.seccomp == "Unconfined" or not added <= BASELINE_CAPABILITIES:
            return "privileged"
        if self.runs_as_root or not added <= RESTRICTED_CAPABILITIES:
            return "baseline"
        return "restricted"

    def with_capabilities(self, capabilities: tuple[str, ...]) -> SecurityProfile:
        """This profile plus the capabilities an accelerator profile adds."""
        added = tuple(dict.fromkeys((*self.add_capabilities, *capabilities)))
        return replace(self, add_capabilities=added)


RESTRICTED = SecurityProfile()


def strictest_admitting(*levels: PodSecurityLevel) -> PodSecurityLevel:
    """The level a pod needs: the loosest its parts need."""
    return max(levels, key=LEVELS.index)


def pod_security_context(engine: SecurityProfile = RESTRICTED) -> dict[str, Any]:
    """The pod's context. Non-root engines: restricted at pod level (UID/GID 1000, fsGroup 1000
    for the volumes), whatever the container adds. A root engine's pod: only the seccomp default
    at pod level; each container says its user (the router stays UID 1000)."""
    if engine.runs_as_root:
        return {"seccompProfile": {"type": "RuntimeDefault"}}
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER, "seccompProfile": {"type": "RuntimeDefault"}}


def container_security_context(profile: SecurityProfile = RESTRICTED) -> dict[str, Any]:
    """A restricted profile adds nothing to the pod's context; the others say their user and
    seccomp profile on the container itself."""
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if profile.add_capabilities:
        capabilities["add"] = list(profile.add_capabilities)
    context: dict[str, Any] = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": False,
                               "capabilities": capabilities}
    if profile.runs_as_root:
        context.update(runAsUser=ROOT, runAsGroup=ROOT, runAsNonRoot=False, privileged=False)
    if profile.seccomp != "RuntimeDefault":
        context["seccompProfile"] = {"type": profile.seccomp}
    return context


def restricted_container_context() -> dict[str, Any]:
    """For heteroserve's own containers in a pod whose engine runs as root (the router, the
    binding's init container): restricted on the container itself."""
    return {**container_security_context(), "runAsNonRoot": True, "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER, "seccompProfile": {"type": "RuntimeDefault"}}


# Engines on Ascend NPUs (KsanaLLM's NPU image, vLLM-Ascend): the CANN toolkit in those images is
# installed by root without --install-for-all, which Huawei's install guide says only its
# installing user may then run; the driver's device nodes (/dev/davinci*, davinci_manager,
# devmm_svm, hisi_hdc) and /var/log/npu belong to the driver's running user (HwHiAiUser by
# default, a UID that differs per host), mode 0660. Root with DAC_OVERRIDE opens them; nothing
# else of the seed's `-u root --privileged --cap-add SYS_ADMIN --cap-add SYS_PTRACE
# --security-opt seccomp:unconfined` is needed to serve (SYS_ADMIN and SYS_PTRACE serve the
# profilers and debuggers of its development container; the device plugin hands out the devices
# that --privileged exposed).
ASCEND_CANN = SecurityProfile(
    user=ROOT, add_capabilities=("DAC_OVERRIDE",),
    reason="CANN installed by root in the image runs for root only; the NPU device nodes and "
           "/var/log/npu belong to the driver's user (HwHiAiUser), 0660: root with DAC_OVERRIDE")
