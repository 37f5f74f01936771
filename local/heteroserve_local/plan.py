"""The operator's render turned into local processes: what `heteroserve run` starts.

Pure: spec + this machine's facts + local options in, `LocalPlan` out; what the plan asks of the
machine (is a command installed, does a directory exist) comes in as a `Machine`. The rendered
Deployments' containers give each process its command line, environment and startup limit; their
volumes become paths on this machine (a ConfigMap: files written into the run directory; a
hostPath: that path; a memory-backed emptyDir: a folder of this run's memory directory, on
/dev/shm, shared by the processes that mount it as containers of a pod share it; a PVC: nothing,
the path must exist here as it is in the pod). Then:

- one process per tier and the router (replicas are a cluster notion; one of each here);
- engines bind loopback (the rendered 0.0.0.0): the router is the one endpoint;
- the router configuration points at the local engine ports (the decode tier's headless-Service
  DNS name becomes 127.0.0.1), listens on `--host`/`--port`, checks health every second and
  drains for `--drain-seconds`;
- `--upstream TIER=URL` replaces a tier's engine by one already running elsewhere.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import PurePath
from typing import Any

import yaml

from heteroserve_engines.protocol.router_config import TIERS, RouterConfig
from heteroserve_operator.api import InferenceDeploymentSpec
from heteroserve_operator.numa import NumaPlan, NumaPlanError
from heteroserve_operator.render import same_node
from heteroserve_operator.render.children import render
from heteroserve_operator.render.engines import bind_wrapper
from heteroserve_operator.render.facts import ClusterFacts
from heteroserve_operator.render.meta import Owner

LOOPBACK = "127.0.0.1"
ANY_ADDRESS = "0.0.0.0"
# Seconds between the router's health checks and scrapes of local engines: a restarted engine is
# noticed within a second or two (the cluster defaults follow sysHAX: 10 s).
HEALTH_INTERVAL_SECONDS = 1.0
HEALTH_TIMEOUT_SECONDS = 2.0
ROUTER_STARTUP_SECONDS = 60.0
# The tier each rendered Deployment's engine serves, by the Deployment's component label.
COMPONENT_TIERS = {"prefill": "accelerator", "decode": "cpu"}
# The engine containers of a pod: "engine" serves the pod's component; the prefill pod may also
# hold the decode engine (render/same_node.py).
ENGINE_CONTAINERS = {"engine": None, same_node.DECODE_CONTAINER: "decode"}
# A container's /dev/shm is this machine's own /dev/shm: nothing to make.
DEV_SHM = "/dev/shm"


class PlanError(ValueError):
    """The spec cannot run on this machine as asked; the message says what to change."""


@dataclass(frozen=True)
class Machine:
    """What the plan asks of this machine."""

    which: Callable[[str], str | None]  # a command -> its path, None when not installed
    is_dir: Callable[[str], bool]


@dataclass(frozen=True)
class LocalOptions:
    run_dir: PurePath  # where ConfigMap files are written
    # Where memory-backed emptyDirs become folders (one per volume): a per-run folder on
    # /dev/shm, made and removed by the caller; None: `run_dir / "memory"`.
    memory_dir: PurePath | None = None
    host: str = LOOPBACK  # the router's bind address
    port: int | None = None  # the router's port; None: the spec's router.port
    upstreams: Mapping[str, str] = field(default_factory=dict)  # tier -> base URL
    drain_seconds: float = 5.0
    prefill_device: str | None = None  # the builtin prefill engine's torch device here
    # Secret volumes' files: secret name -> {key: value} (the KV token: made by __main__, as
    # the operator's reconciler makes it in a cluster; the plan stays pure).
    secrets: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class LocalProcess:
    name: str  # "router", or the rendered component: "prefill", "decode"
    argv: tuple[str, ...]
    env: dict[str, str]  # set on top of the supervisor's own environment
    files: dict[str, str]  # path -> content, written before the process starts
    health_url: str  # http(s)://... answering 200 when ready; tcp://host:port: a connect check
    tier: str | None  # "accelerator" or "cpu"; None for the router
    port: int
    cwd: str | None = None
    startup_seconds: float = ROUTER_STARTUP_SECONDS  # longest load before it counts as failed
    summary: str = ""  # what it is doing while it starts
    # Folders made (owner-only) before it starts: the memory-backed emptyDirs it mounts.
    dirs: tuple[str, ...] = ()

    def command_line(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True)
class LocalPlan:
    model: str
    base_url: str  # the OpenAI base URL clients use
    processes: tuple[LocalProcess, ...]  # engines first, the router last
    numa_plan: NumaPlan | None


def plan(name: str, spec: InferenceDeploymentSpec, facts: ClusterFacts, options: LocalOptions,
         machine: Machine) -> LocalPlan:
    _check_upstreams(spec, options.upstreams)
    if "cpu" in options.upstreams:
        facts = ClusterFacts()  # no local decode engine: this machine's CPUs do not matter
    elif spec.decode and facts.nodes:
        usable = facts.nodes[0].topology.cpu_count
        if spec.decode.cpus > usable:
            raise PlanError(f"decode.cpus is {spec.decode.cpus} but this machine has {usable} "
                            "usable CPUs: lower decode.cpus (and decode.numaNodes), or run the "
                            "CPU engine elsewhere and pass --upstream cpu=URL")
    try:
        rendered = render(spec, Owner(name, "local", "local"), facts)
    except NumaPlanError as error:
        raise PlanError(f"no NUMA plan on this machine: {error}") from None
    configmaps = {c["metadata"]["name"]: c["data"] for c in rendered.children
                  if c["kind"] == "ConfigMap"}
    pods = {c["metadata"]["labels"]["app.kubernetes.io/component"]: c["spec"]["template"]["spec"]
            for c in rendered.children if c["kind"] == "Deployment"}
    router_port = options.port or spec.router.port
    engines: list[LocalProcess] = []
    for pod_component, pod in pods.items():
        for container in pod["containers"]:
            if container["name"] not in ENGINE_CONTAINERS:
                continue
            component = ENGINE_CONTAINERS[container["name"]] or pod_component
            tier = COMPONENT_TIERS[component]
            if tier in options.upstreams:
                continue
            engines.append(_engine(spec, component, tier, container, pod, configmaps, options,
                                   machine,
                                   rendered.placement.plan if rendered.placement else None))
    router_name = f"{name}-router"
    configmaps[router_name] = {"router.yaml": _router_config(
        configmaps[router_name]["router.yaml"], engines, options, router_port)}
    (router_pod,) = [p for p in pods.values()
                     if any(c["name"] == "router" for c in p["containers"])]
    (container,) = [c for c in router_pod["containers"] if c["name"] == "router"]
    router = _process("router", None, container, router_pod, configmaps, options, machine,
                      port=router_port, health_host=_connect_host(options.host),
                      summary=f"starting the router on {options.host}:{router_port}")
    return LocalPlan(spec.model.name, f"http://{_connect_host(options.host)}:{router_port}/v1",
                     (*engines, router), rendered.placement.plan if rendered.placement else None)


def _check_upstreams(spec: InferenceDeploymentSpec, upstreams: Mapping[str, str]) -> None:
    for tier in upstreams:
        if tier not in TIERS:
            raise PlanError(f"--upstream {tier}=...: the tiers are {' and '.join(TIERS)}")
        section = "prefill" if tier == "accelerator" else "decode"
        if getattr(spec, section) is None:
            raise PlanError(f"--upstream {tier}=...: the spec has no {section} section, so the "
                            f"router has no {tier} tier to send to")


def _engine(spec: InferenceDeploymentSpec, component: str, tier: str, container: dict,
            pod: dict, configmaps: dict[str, dict[str, str]], options: LocalOptions,
            machine: Machine, numa_plan: NumaPlan | None) -> LocalProcess:
    section = spec.prefill if component == "prefill" else spec.decode
    if component == "decode":
        summary = f"{spec.model.name} on CPUs {numa_plan.cpu_list}"
    else:
        accel = spec.prefill.accelerator
        summary = f"{spec.model.name} on {accel.count} {accel.type} accelerator(s)"
    process = _process(component, tier, container, pod, configmaps, options, machine,
                       port=container["ports"][0]["containerPort"], health_host=LOOPBACK,
                       summary=f"loading {summary} ({section.engine.kind} engine)")
    where = f"the {section.engine.kind} engine ({component}, the {tier} tier)"
    remedy = f"or run that engine elsewhere and pass --upstream {tier}=URL"
    if process.cwd and not machine.is_dir(process.cwd):
        raise PlanError(f"{where} runs in {process.cwd}, which does not exist on this machine: "
                        f"install the engine there, {remedy}")
    command = process.argv[0]
    if "/" in command and not command.startswith("/") and process.cwd:
        command = f"{process.cwd}/{command}"
    found = machine.which(command)
    if found is None:
        raise PlanError(f"{where} needs the command `{process.argv[0]}`, which is not "
                        f"installed on this machine (not on PATH): install it, {remedy}")
    if component == "prefill" and options.prefill_device and section.engine.kind == "builtin":
        # The spec's accelerator may not be on this machine: its torch device is a flag here.
        argv = list(process.argv)
        argv[argv.index("--device") + 1] = options.prefill_device
        process = replace(process, argv=tuple(argv),
                          summary=f"{process.summary} on torch device {options.prefill_device}")
    return process if "/" in process.argv[0] else _replace_argv0(process, found)


def _process(name: str, tier: str | None, container: dict, pod: dict,
             configmaps: dict[str, dict[str, str]], options: LocalOptions, machine: Machine, *,
             port: int, health_host: str, summary: str) -> LocalProcess:
    volumes = {v["name"]: v for v in pod["volumes"]}
    paths: dict[str, str] = {}  # a mount path in the container -> the path on this machine
    files: dict[str, str] = {}
    dirs: list[str] = []
    memory_dir = options.memory_dir or options.run_dir / "memory"
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})
        if (volume.get("emptyDir") or {}).get("medium") == "Memory":
            if mount["mountPath"] != DEV_SHM:
                local = str(memory_dir / mount["name"])
                paths[mount["mountPath"]] = local
                dirs.append(local)
        elif "configMap" in volume:
            local = str(options.run_dir / volume["configMap"]["name"])
            paths[mount["mountPath"]] = local
            files.update({f"{local}/{key}": text
                          for key, text in configmaps[volume["configMap"]["name"]].items()})
        elif "hostPath" in volume:
            paths[mount["mountPath"]] = volume["hostPath"]["path"]
        elif "secret" in volume:
            name_ = volume["secret"]["secretName"]
            if name_ not in options.secrets:
                raise PlanError(f"the {name} process mounts the Secret {name_}, which this run "
                                "has no value for")
            local = str(options.run_dir / name_)
            paths[mount["mountPath"]] = local
            files.update({f"{local}/{key}": value
                          for key, value in options.secrets[name_].items()})
    # HOME stays the user's: the pod's /tmp is there for a non-root image user.
    env = {e["name"]: _local_value(name, e, paths) for e in container.get("env", [])
           if e["name"] != "HOME"}
    argv = [_expand(_local_path(a, paths), env)
            for a in [*container["command"], *container.get("args", [])]]
    argv = _without_binding_entrypoint(argv)
    if tier is not None:  # engines listen on loopback only; the router is the endpoint
        argv = [LOOPBACK if a == ANY_ADDRESS else a for a in argv]
    probe = container.get("readinessProbe", {})
    health = (f"http://{health_host}:{port}{probe['httpGet']['path']}" if "httpGet" in probe
              else f"tcp://{health_host}:{port}")
    startup = container.get("startupProbe")
    startup_seconds = (startup["periodSeconds"] * startup["failureThreshold"] if startup
                       else ROUTER_STARTUP_SECONDS)
    process = LocalProcess(name, tuple(argv), env, files, health, tier, port,
                           container.get("workingDir"), startup_seconds, summary, tuple(dirs))
    if tier is None:
        found = machine.which(argv[0])
        if found is None:
            raise PlanError(f"the router command `{argv[0]}` is not installed on this machine "
                            "(pip install heteroserve)")
        process = _replace_argv0(process, found)
    return process


def _without_binding_entrypoint(argv: list[str]) -> list[str]:
    """The engine's own command. No kubelet grants a cpuset here: the NUMA plan's binding (the
    env) is exact, so the decode container's entrypoint that derives it from the container's
    grant is left out: `heteroserve-bind ... -- <engine>` (heteroserve's CPU engine image) or
    `python3 <zipapp> ... -- <engine>` (other images; the zipapp an init container writes,
    which the plan never runs, as it runs no init container)."""
    if "--" not in argv:
        return argv
    if argv[:1] == [bind_wrapper.ENTRYPOINT] or argv[1:2] == [bind_wrapper.ZIPAPP]:
        return argv[argv.index("--") + 1:]
    return argv


# The pod fields a container may read through the downward API, as they are on this machine.
LOCAL_FIELDS = {"status.podIP": LOOPBACK, "status.hostIP": LOOPBACK}


def _local_value(process: str, entry: dict[str, Any], paths: dict[str, str]) -> str:
    if "value" in entry:
        return _local_path(entry["value"], paths)
    path = entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    if path not in LOCAL_FIELDS:
        raise PlanError(f"the {process} process reads {entry['name']} from "
                        f"{entry.get('valueFrom')}, which a local run cannot provide")
    return LOCAL_FIELDS[path]


def _expand(arg: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` references in a command or argument, from the container's env
    (an unknown one stays as written, as the kubelet leaves it)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), arg)


def _replace_argv0(process: LocalProcess, path: str) -> LocalProcess:
    return replace(process, argv=(path, *process.argv[1:]))


def _local_path(value: str, paths: dict[str, str]) -> str:
    """`value`, or `--flag=value`, with a mounted container path replaced by the local one."""
    flag, eq, path = value.partition("=") if value.startswith("-") else ("", "", value)
    if not eq:
        flag, path = "", value
    for mounted, local in sorted(paths.items(), key=lambda item: -len(item[0])):
        if path == mounted or path.startswith(mounted.rstrip("/") + "/"):
            return f"{flag}{eq}{local}{path[len(mounted.rstrip('/')):]}"
    return value


def _router_config(text: str, engines: list[LocalProcess], options: LocalOptions,
                   port: int) -> str:
    document: dict[str, Any] = yaml.safe_load(text)
    document["listen"] = {"host": options.host, "port": port}
    document["drainSeconds"] = options.drain_seconds
    document["scrapeIntervalSeconds"] = HEALTH_INTERVAL_SECONDS
    document["health"] = {**document.get("health", {}),
                          "intervalSeconds": HEALTH_INTERVAL_SECONDS,
                          "timeoutSeconds": HEALTH_TIMEOUT_SECONDS}
    local = {e.tier: f"http://{LOOPBACK}:{e.port}" for e in engines}
    for tier in TIERS:
        if document.get(tier) is None:
            continue
        url = options.upstreams.get(tier) or local[tier]
        document[tier] = {**document[tier], "urls": [url], "discovery": "static"}
    try:
        config = RouterConfig.model_validate(document)
    except ValueError as error:
        raise PlanError(f"the local router configuration is not valid: {error}") from None
    return yaml.safe_dump(config.document(), sort_keys=True)


def _connect_host(host: str) -> str:
    """Where a client on this machine reaches a server bound to `host`."""
    return LOOPBACK if host in (ANY_ADDRESS, "::", "") else host
