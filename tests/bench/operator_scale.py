"""Operator scale benchmark (a script, not a test): N InferenceDeployments on M fake nodes, with
the cluster-alone floor measured side by side in the same run.

    .venv/bin/python -m tests.bench.operator_scale --objects 1000 --nodes 100

Starts its own test control plane (kwok nodes: 4/5 CPU servers of 64 CPUs over 2 NUMA nodes,
1/5 Kunpeng GPU servers of 160 CPUs over 4 NUMA nodes with 8 GPUs) and runs two phases on it, one
after the other, each in a fresh namespace:

- floor: no operator. Every object's rendered children (the same render the operator makes, KV
  token Secret included) are applied by server-side apply from 8 threads, one object after the
  other per thread, as a perfect controller with no reads and no status would. An object is
  ready when all its Deployments are Available and its router Service has a ready endpoint (what
  the operator's Ready waits for).
- operator: the operator as a process; the InferenceDeployments are created from 8 threads; an
  object is ready when its Ready condition is True.

Both phases poll once a second (LISTs; a watch that drops under load would lose transitions).
Between them the floor's namespace is deleted and waited for, so that both phases start on empty
nodes. The floor's latency of an object is counted from the start of its phase (all the work is
handed over at once); the operator's from its create call (as users see it), and also from the
start of its phase (the stricter figure). `--order operator-first` swaps the phases, to check that
the order does not decide the ratio; `--fresh-cluster` runs each phase on a control plane of its
own (on one cluster the later phases ran slower whatever ran in them). Keep the resync out of
the converging phase (`--resync-seconds` above the phase's length, `--idle-seconds` reaching
past it: e.g. 45 and 30 for the 1,000-object run): a resync in the middle of convergence reads
every object's children once more (the product's resync is 5 minutes).

Printed: the floor and the operator's time to Ready (p50/p99), the ratio p99/floor, the
operator's API writes, reads and reconciles per object while converging, its writes and
reconciles while idle (including resyncs), its peak RSS, and the CPU seconds each process of the
cluster used in each phase (on a 2-core machine the CPU is what both phases compete for).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from tests.cluster.catalogue import FakeNode, NumaZone
from tests.cluster.harness import ControlPlane, ensure_binaries, free_port, recorded_pids

GROUP, VERSION, PLURAL = "heteroserve.io", "v1alpha1", "inferencedeployments"
REPO = Path(__file__).resolve().parents[2]
CLOCK_TICK = os.sysconf("SC_CLK_TCK")


def bench_nodes(count: int) -> list[FakeNode]:
    nodes = []
    for index in range(count):
        if index % 5 == 0:
            nodes.append(FakeNode(
                name=f"gpu-{index:03d}", description="Kunpeng + 8 GPUs", arch="arm64",
                capacity={"cpu": "160", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"},
                numa=[NumaZone(f"{n * 40}-{n * 40 + 39}", "256Gi",
                               {"nvidia.com/gpu": "2"}) for n in range(4)]))
        else:
            nodes.append(FakeNode(
                name=f"cpu-{index:03d}", description="x86 CPU server", arch="amd64",
                capacity={"cpu": "64", "memory": "256Gi", "pods": "110"}, threads_per_core=2,
                numa=[NumaZone("0-15,32-47", "128Gi"), NumaZone("16-31,48-63", "128Gi")]))
    return nodes


def spec(index: int) -> dict:
    if index % 20 < 3:
        return {"model": {"name": f"m{index}", "path": "/models/m.gguf"},
                "prefill": {"accelerator": {"type": "nvidia", "count": 1},
                            "engine": {"kind": "builtin"}, "memory": "8Gi"},
                "decode": {"cpus": 4, "numaNodes": 2, "memory": "4Gi"}}
    return {"model": {"name": f"m{index}", "path": "/models/m.gguf"},
            "decode": {"cpus": 2, "numaNodes": 1, "memory": "2Gi"}, "router": {"policy": "cpu"}}


def name_of(index: int) -> str:
    return f"infd-{index:04d}"


def metric(port: int, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def metric_samples(port: int, name: str) -> dict[str, float]:
    """The samples of a labelled metric: {"label=value,...": value}."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1:].rsplit("} ", 1)
            out[labels.replace('"', "")] = float(value)
    return out


def by_label(before: dict[str, float], after: dict[str, float], per: float) -> str:
    """The change of each sample (per `per`), largest first: "verb=APPLY,kind=Service 1.00"."""
    changed = {k: (v - before.get(k, 0.0)) / per for k, v in after.items()}
    return "; ".join(f"{k} {v:.2f}" for k, v in sorted(changed.items(), key=lambda kv: -kv[1])
                     if v)


def rss_peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """utime + stime of each named process (its own threads; the components do not fork)."""
    out = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / CLOCK_TICK
        except (OSError, IndexError, ValueError):
            out[name] = float("nan")
    return out


def apiserver_metrics(plane: ControlPlane) -> dict[str, float]:
    """apiserver_request_total, the seconds spent serving requests by (verb, resource), and the
    watch events sent by kind: where the apiserver's time goes."""
    text = plane.kubectl("get", "--raw", "/metrics").stdout
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name not in ("apiserver_request_total", "apiserver_request_duration_seconds_sum",
                        "apiserver_watch_events_total"):
            continue
        labels = dict(part.split("=", 1) for part in rest.rsplit("}", 1)[0].split(",")
                      if "=" in part)
        value = float(line.rsplit(" ", 1)[1])
        if name == "apiserver_request_total":
            out["requests"] = out.get("requests", 0.0) + value
            continue
        key = (f"watch events {labels.get('kind') or labels.get('resource', '?')}"
               if name == "apiserver_watch_events_total"
               else f"seconds {labels.get('verb')} {labels.get('resource')}")
        out[key.replace('"', "")] = out.get(key.replace('"', ""), 0.0) + value
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def poll_until(ready_names: Callable[[], set[str]], ready: dict[str, float], wanted: int,
               timeout: float, t0: float) -> None:
    """Calls `ready_names` once a second, stamping each name the first time it appears."""
    while time.monotonic() - t0 < timeout:
        try:
            names = ready_names()
        except Exception as error:  # keep polling through apiserver hiccups
            print(f"poll failed: {error}", file=sys.stderr)
            names = set()
        now = time.monotonic()
        for name in names:
            ready.setdefault(name, now)
        if len(ready) >= wanted:
            return
        time.sleep(1)
    print(f"only {len(ready)}/{wanted} ready after {timeout} s", file=sys.stderr)


class Meter:
    """CPU seconds of each process and apiserver requests between start() and stop()."""

    def __init__(self, plane: ControlPlane, pids: dict[str, int]):
        self.plane, self.pids = plane, pids

    def start(self) -> None:
        self.cpu0, self.api0 = cpu_seconds(self.pids), apiserver_metrics(self.plane)

    def stop(self, phase: Phase) -> None:
        cpu1, api1 = cpu_seconds(self.pids), apiserver_metrics(self.plane)
        phase.cpu = {name: cpu1[name] - self.cpu0.get(name, 0.0) for name in cpu1}
        phase.api = {key: value - self.api0.get(key, 0.0) for key, value in api1.items()
                     if value - self.api0.get(key, 0.0) > 0}
        phase.requests = phase.api.get("requests", 0.0)


class Phase:
    """What one phase measured (CPU and requests: from its start until every object is
    ready)."""

    def __init__(self, label: str):
        self.label = label
        self.rows: list[tuple[str, str]] = []
        self.latencies: list[float] = []        # per object, from the phase's start
        self.from_create: list[float] = []      # operator: per object, from its create call
        self.cpu: dict[str, float] = {}
        self.requests = 0.0
        self.api: dict[str, float] = {}
        self.seconds = 0.0


def floor_phase(plane: ControlPlane, args, namespace: str, pids: dict[str, int]) -> Phase:
    from heteroserve_operator.api import InferenceDeploymentSpec
    from heteroserve_operator.kube import SECRET, KubeApi
    from heteroserve_operator.reconcile import cluster_facts
    from heteroserve_operator.render import kv_token
    from heteroserve_operator.render.children import render
    from heteroserve_operator.render.meta import Owner

    phase = Phase("floor")
    api = k8s_config.new_client_from_config(config_file=str(plane.kubeconfig))
    kube = KubeApi(api)
    apps, discovery = k8s.AppsV1Api(api), k8s.DiscoveryV1Api(api)
    facts = cluster_facts(kube.nodes(), kube.node_resource_topologies())
    # The children need a live owner (the garbage collector deletes children of a missing one);
    # a ConfigMap stands in for the InferenceDeployment.
    owner_cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}
    uid = k8s.CoreV1Api(api).create_namespaced_config_map(namespace, owner_cm).metadata.uid
    objects = []
    for index in range(args.objects):
        owner = Owner(name_of(index), namespace, uid)
        rendered = render(InferenceDeploymentSpec.model_validate(spec(index)), owner, facts)
        for child in rendered.children:
            child["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap",
                                                     "name": "owner", "uid": uid}]
        secret = None
        if rendered.kv_token_secret:
            secret = kv_token.secret(owner, secrets.token_urlsafe(32))
            secret["metadata"]["ownerReferences"] = rendered.children[0]["metadata"][
                "ownerReferences"]
        deployments = {c["metadata"]["name"] for c in rendered.children
                       if c["kind"] == "Deployment"}
        objects.append((owner.name, rendered.children, secret, deployments))
    wanted_deployments = {name: deps for name, _, _, deps in objects}
    children = sum(len(c) for _, c, _, _ in objects)

    def submit(item) -> None:
        _, manifests, secret, _ = item
        for manifest in manifests:
            if manifest["kind"] == "Deployment" and secret is not None:
                kube.create_if_absent(SECRET, secret)
                secret = None
            kube.apply(manifest)

    def ready_names() -> set[str]:
        available = {d.metadata.name for d in apps.list_namespaced_deployment(
            namespace, _request_timeout=60).items
            if any(c.type == "Available" and c.status == "True"
                   for c in (d.status.conditions or []))}
        endpoints = {s.metadata.labels.get("kubernetes.io/service-name")
                     for s in discovery.list_namespaced_endpoint_slice(
                         namespace, _request_timeout=60).items
                     if any((e.conditions and e.conditions.ready) for e in (s.endpoints or []))}
        return {name for name, deps in wanted_deployments.items()
                if deps <= available and name in endpoints}

    ready: dict[str, float] = {}
    meter = Meter(plane, pids)
    meter.start()
    t0 = time.monotonic()
    poller = threading.Thread(target=poll_until,
                              args=(ready_names, ready, args.objects, args.timeout, t0))
    poller.start()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(submit, objects))
    applied_s = time.monotonic() - t0
    poller.join()
    phase.seconds = time.monotonic() - t0
    meter.stop(phase)
    phase.latencies = [ready[n] - t0 for n in ready]
    phase.rows = [
        (f"children applied ({children} objects, 8 threads)", f"{applied_s:.1f} s"),
        ("ready", f"{len(ready)}/{args.objects}"),
    ]
    return phase


def operator_phase(plane: ControlPlane, args, namespace: str, workdir: Path,
                   pids: dict[str, int], label: str, path: str | None,
                   py_spy: str | None) -> Phase:
    phase = Phase(label)
    port = free_port()
    env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig)}
    if path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    log = open(workdir / f"{label}.log", "wb")  # noqa: SIM115
    operator = subprocess.Popen(
        [sys.executable, "-m", "heteroserve_operator", "--metrics-port", str(port),
         "--liveness", "", "--resync-seconds", str(args.resync_seconds)],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    pids["operator"] = operator.pid
    profiler = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                metric(port, "heteroserve_operator_reconciles_total")
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        # kopf lists and watches once started; let that settle before the clock runs.
        time.sleep(3)
        if py_spy:
            profiler = subprocess.Popen(
                [shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy")),
                 "record", "--pid",
                 str(operator.pid), "--format", "raw", "--output", py_spy, "--rate", "50", "--gil",
                 "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=open(f"{py_spy}.log", "wb"))  # noqa: SIM115
        api = k8s_config.new_client_from_config(config_file=str(plane.kubeconfig))
        custom = k8s.CustomObjectsApi(api)
        created: dict[str, float] = {}

        def ready_names() -> set[str]:
            items = custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, _request_timeout=60)["items"]
            return {o["metadata"]["name"] for o in items
                    if any(c["type"] == "Ready" and c["status"] == "True"
                           for c in (o.get("status") or {}).get("conditions", []))}

        def create(index: int) -> None:
            name = name_of(index)
            created[name] = time.monotonic()
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceDeployment",
                "metadata": {"name": name}, "spec": spec(index)})

        base = {name: metric(port, f"heteroserve_operator_{name}_total")
                for name in ("api_writes", "api_reads", "reconciles")}
        labelled = ("api_writes", "api_reads", "binding_scrapes")
        base_samples = {name: metric_samples(port, f"heteroserve_operator_{name}_total")
                        for name in labelled}
        ready: dict[str, float] = {}
        meter = Meter(plane, pids)
        meter.start()
        t0 = time.monotonic()
        poller = threading.Thread(target=poll_until,
                                  args=(ready_names, ready, args.objects, args.timeout, t0))
        poller.start()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, range(args.objects)))
        create_s = time.monotonic() - t0
        poller.join()
        phase.seconds = time.monotonic() - t0
        meter.stop(phase)
        if profiler:
            profiler.send_signal(signal.SIGINT)
            profiler.wait(timeout=60)
        converged = {name: metric(port, f"heteroserve_operator_{name}_total") - value
                     for name, value in base.items()}
        converged_samples = {name: metric_samples(port, f"heteroserve_operator_{name}_total")
                             for name in labelled}
        phase.latencies = [ready[n] - t0 for n in ready]
        phase.from_create = [ready[n] - created[n] for n in ready]
        # Let trailing events settle, then measure a quiet period that includes resyncs.
        time.sleep(10)
        before_idle = {name: metric(port, f"heteroserve_operator_{name}_total")
                       for name in ("api_writes", "reconciles")}
        before_idle_samples = {name: metric_samples(port, f"heteroserve_operator_{name}_total")
                               for name in labelled}
        time.sleep(args.idle_seconds)
        idle = {name: metric(port, f"heteroserve_operator_{name}_total") - value
                for name, value in before_idle.items()}
        idle_samples = {name: metric_samples(port, f"heteroserve_operator_{name}_total")
                        for name in labelled}
        n = args.objects
        phase.rows = [
            ("create calls took", f"{create_s:.1f} s"),
            ("ready", f"{len(ready)}/{args.objects}"),
            ("operator API writes per object (converging)", f"{converged['api_writes'] / n:.2f}"),
            ("operator API reads per object (converging)", f"{converged['api_reads'] / n:.2f}"),
            ("operator reconciles per object (converging)", f"{converged['reconciles'] / n:.2f}"),
            (f"operator API writes while idle ({args.idle_seconds:.0f} s, resync "
             f"{args.resync_seconds:.0f} s)", f"{idle['api_writes']:.0f}"),
            ("operator reconciles while idle", f"{idle['reconciles']:.0f}"),
            ("operator peak RSS", f"{rss_peak_mb(operator.pid):.0f} MB"),
            ("operator writes per object by verb and kind (converging)",
             by_label(base_samples["api_writes"], converged_samples["api_writes"], n)),
            ("operator reads per object by kind (converging)",
             by_label(base_samples["api_reads"], converged_samples["api_reads"], n)),
            ("operator writes while idle by verb and kind",
             by_label(before_idle_samples["api_writes"], idle_samples["api_writes"], 1)),
            ("binding scrapes by result (converging / idle)",
             by_label(base_samples["binding_scrapes"], converged_samples["binding_scrapes"], 1)
             + " / " + by_label(before_idle_samples["binding_scrapes"],
                                idle_samples["binding_scrapes"], 1)),
        ]
        return phase
    finally:
        if profiler and profiler.poll() is None:
            profiler.kill()
        operator.terminate()
        operator.wait(timeout=30)
        pids.pop("operator", None)


def delete_namespace(plane: ControlPlane, namespace: str, timeout: float) -> float:
    """Deletes `namespace` and waits until it and its pods are gone; returns the seconds."""
    t0 = time.monotonic()
    plane.kubectl("delete", "namespace", namespace, "--wait=false")
    while time.monotonic() - t0 < timeout:
        if plane.kubectl("get", "namespace", namespace, check=False).returncode != 0:
            break
        time.sleep(2)
    return time.monotonic() - t0


def report(args, phases: list[Phase]) -> None:
    """One column per phase; each operator phase's ratio is to the floor of the same run."""
    floor = next(p for p in phases if p.label == "floor")
    floor_p99 = percentile(floor.latencies, 0.99)

    def row(label: str, value: Callable[[Phase], str]) -> tuple[str, list[str]]:
        return label, [value(p) for p in phases]

    def op(value: Callable[[Phase], str]) -> Callable[[Phase], str]:
        return lambda p: "" if p.label == "floor" else value(p)

    labels = list(dict.fromkeys(label for p in phases for label, _ in p.rows))
    rows = [
        row("phase", lambda p: p.label),
        *[row(label, lambda p, label=label: dict(p.rows).get(label, "")) for label in labels],
        row("time to ready p50 (floor: from the phase's start; operator: from create)",
            lambda p: f"{statistics.median(p.from_create or p.latencies):.1f} s"),
        row("**time to ready p99** (the same)",
            lambda p: f"{percentile(p.from_create or p.latencies, 0.99):.1f} s"),
        row("time to ready p99 from the phase's start",
            lambda p: f"{percentile(p.latencies, 0.99):.1f} s"),
        row("all ready after", lambda p: f"{max(p.latencies):.1f} s"),
        row("**ratio p99 / floor p99**", op(
            lambda p: f"{percentile(p.from_create, 0.99) / floor_p99:.2f}x")),
        row("ratio, both from the phase's start", op(
            lambda p: f"{percentile(p.latencies, 0.99) / floor_p99:.2f}x")),
        row("apiserver requests per object while converging",
            lambda p: f"{p.requests / args.objects:.1f}"),
    ]
    for name in sorted({n for p in phases for n in p.cpu}):
        rows.append(row(f"CPU seconds of {name} while converging",
                        lambda p, name=name: f"{p.cpu.get(name, 0.0):.0f}"))
    rows.append(row("CPU seconds of all of them while converging",
                    lambda p: f"{sum(p.cpu.values()):.0f}"))
    print(f"\n{args.objects} InferenceDeployments on {args.nodes} fake nodes; phases in the "
          f"order shown, {'each on a fresh cluster' if args.fresh_cluster else 'one cluster'}"
          "\n")
    print("| measure | " + " | ".join(p.label for p in phases) + " |")
    print("|---|" + "---|" * len(phases))
    for label, values in rows[1:]:
        print(f"| {label} | " + " | ".join(values) + " |")
    print(json.dumps({label: values for label, values in rows}), file=sys.stderr)
    # Where the apiserver spent its request time and how many watch events it sent, per phase.
    # (A watch's seconds are how long it stayed open, not work: left out.)
    keys = sorted({k for p in phases for k in p.api
                   if k != "requests" and not k.startswith("seconds WATCH")},
                  key=lambda k: -max(p.api.get(k, 0.0) for p in phases))[:25]
    print("\n| apiserver, while converging | " + " | ".join(p.label for p in phases) + " |",
          file=sys.stderr)
    for key in keys:
        print(f"| {key} | " + " | ".join(f"{p.api.get(key, 0.0):.1f}" for p in phases) + " |",
              file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument("--resync-seconds", type=float, default=30)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--order", choices=("floor-first", "operator-first"),
                        default="floor-first")
    parser.add_argument("--also-operator", metavar="LABEL=DIR", action="append", default=[],
                        help="one more operator phase, after the others, running the operator "
                        "package found in DIR (prepended to PYTHONPATH; e.g. a `git archive` of "
                        "an earlier commit's operator/ folder): a before/after in one run")
    parser.add_argument("--py-spy", metavar="FILE", default=None,
                        help="record the (first) operator with py-spy (raw/collapsed stacks) "
                        "while it converges")
    parser.add_argument("--fresh-cluster", action="store_true",
                        help="run each phase on a control plane of its own, started for it "
                        "(the same nodes), instead of one after the other in one cluster: on "
                        "one cluster the later phases ran slower whatever ran in them")
    args = parser.parse_args()
    # A SIGTERM (timeout, kill) unwinds through `finally`, which stops the cluster.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ensure_binaries()
    workdir = Path(tempfile.mkdtemp(prefix="heteroserve-bench-"))

    def start_plane(name: str) -> tuple[ControlPlane, dict[str, int]]:
        plane = ControlPlane(workdir / name, log=lambda m: print(m, file=sys.stderr),
                             nodes=bench_nodes(args.nodes))
        started = time.monotonic()
        plane.start()
        print(f"cluster with {args.nodes} nodes up in {time.monotonic() - started:.0f} s",
              file=sys.stderr)
        plane.kubectl("apply", "--server-side", "-f",
                      str(REPO / "crds" / "heteroserve.io_inferencedeployments.yaml"))
        plane.kubectl("wait", "--for=condition=Established",
                      "crd/inferencedeployments.heteroserve.io")
        return plane, {name: pid for pid, name in recorded_pids(plane.workdir)}

    plane: ControlPlane | None = None
    try:
        plane, pids = start_plane("cluster")
        order: list[tuple[str, str | None]] = [("floor", None), ("operator", None)]
        if args.order == "operator-first":
            order.reverse()
        for extra in args.also_operator:
            label, _, path = extra.partition("=")
            order.append((label, str(Path(path).resolve())))
        phases = []
        for index, (label, path) in enumerate(order):
            if args.fresh_cluster and index > 0:
                plane.stop()
                plane = None
                plane, pids = start_plane(f"cluster-{index}")
            namespace = f"bench-{index}"
            plane.kubectl("create", "namespace", namespace)
            print(f"{label} phase in namespace {namespace}", file=sys.stderr)
            if label == "floor":
                phase = floor_phase(plane, args, namespace, pids)
            else:
                phase = operator_phase(plane, args, namespace, workdir, pids, label, path,
                                       args.py_spy if index <= 1 else None)
            phases.append(phase)
            print(f"{label} phase took {phase.seconds:.0f} s", file=sys.stderr)
            if index < len(order) - 1 and not args.fresh_cluster:
                gone = delete_namespace(plane, namespace, args.timeout)
                print(f"namespace {namespace} deleted in {gone:.0f} s", file=sys.stderr)
        report(args, phases)
    finally:
        if plane is not None:
            plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
