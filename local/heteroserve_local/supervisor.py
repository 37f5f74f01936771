"""Runs a `LocalPlan`: each process in its own process group, its output lines prefixed with its
name, restarted with backoff when it crashes, stopped in order on Ctrl-C or SIGTERM.

- Start: every process at once (the router waits for its upstreams by itself); progress is
  printed while they load, then the OpenAI base URL. A process that exits, or is not ready within
  its rendered startup limit, before it was ever ready ends the run: a model that cannot load
  will not load on a retry, and its own output says why.
- Crash after it was ready: restarted after 1, 2, 4 ... 30 s (the kubelet's CrashLoopBackOff,
  faster); an uptime of a minute makes the next crash a first one again.
- Stop: SIGTERM to the router first (it refuses new requests and ends in-flight streams with a
  final chunk after its drainSeconds), then to the engines; SIGKILL after a grace. A second
  Ctrl-C kills at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

import httpx

from .plan import LocalPlan, LocalProcess

BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 30.0
STABLE_SECONDS = 60.0
STOP_GRACE_SECONDS = 10.0  # after SIGTERM (for the router: after its drain), before SIGKILL
PROGRESS_SECONDS = 10.0
POLL_SECONDS = 0.25
HEALTH_TIMEOUT_SECONDS = 1.0


class SupervisorError(RuntimeError):
    """The processes cannot be started (a port is taken, a file cannot be written)."""


def restart_delay(failures: int) -> float:
    """Seconds before restarting after the `failures`-th crash in a row (1, 2, 4 ... 30)."""
    return min(BACKOFF_FIRST_SECONDS * 2 ** max(failures - 1, 0), BACKOFF_MAX_SECONDS)


class Child:
    """One planned process and its current incarnation."""

    def __init__(self, process: LocalProcess):
        self.process = process
        self.popen: subprocess.Popen | None = None
        self.started = 0.0
        self.ready = False  # since its last start
        self.ever_ready = False
        self.failures = 0  # crashes in a row
        self.restart_at: float | None = None
        self.reader: threading.Thread | None = None


class Supervisor:
    def __init__(self, plan: LocalPlan, run_dir: Path, drain_seconds: float,
                 out: TextIO = sys.stdout):
        self.plan, self.run_dir, self.drain_seconds = plan, run_dir, drain_seconds
        self.out = out
        self.children = [Child(p) for p in plan.processes]
        self.stopping = False
        self.forced = False
        self._lock = threading.Lock()

    # -- output ----------------------------------------------------------------------------------
    def say(self, message: str) -> None:
        self._write(f"heteroserve: {message}\n")

    def _write(self, text: str) -> None:
        with self._lock:
            self.out.write(text)
            self.out.flush()

    def _relay_output(self, name: str, stream) -> None:
        width = max(len(c.process.name) for c in self.children)
        for line in iter(stream.readline, b""):
            self._write(f"{name:>{width}} | {line.decode(errors='replace').rstrip()}\n")
        stream.close()

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> int:
        """0 after a requested stop; 1 when a process could not start."""
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            self._check_ports()
            self._write_files()
            for child in self.children:
                self._start(child)
            return self._watch()
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum, _frame) -> None:
        if self.stopping:
            self.forced = True
        self.stopping = True

    def _check_ports(self) -> None:
        for process in self.plan.processes:
            host = urlsplit(process.health_url).hostname
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((host, process.port))
                except OSError as error:
                    where = ("--port" if process.tier is None
                             else f"{process.name}.engine.port in the spec (-f)")
                    raise SupervisorError(
                        f"port {process.port} for {process.name} on {host} is not free "
                        f"({error.strerror}): stop what holds it, or change {where}") from None

    def _write_files(self) -> None:
        for process in self.plan.processes:
            for folder in process.dirs:
                # Owner-only, as the engines' KV files in it are (both run as this user).
                Path(folder).mkdir(mode=0o700, parents=True, exist_ok=True)
                os.chmod(folder, 0o700)
            for path, text in process.files.items():
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                # Owner-only: a run's files include the KV token.
                descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(descriptor, "w") as out:
                    out.write(text)

    def _start(self, child: Child) -> None:
        process = child.process
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **process.env}
        # Own session: the terminal's Ctrl-C reaches the supervisor only, which stops the
        # processes in order.
        popen = subprocess.Popen(process.argv, env=env, cwd=process.cwd,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        child.popen, child.started, child.ready, child.restart_at = (
            popen, time.monotonic(), False, None)
        (self.run_dir / f"{process.name}.pid").write_text(f"{popen.pid}\n")
        child.reader = threading.Thread(target=self._relay_output,
                                        args=(process.name, popen.stdout), daemon=True)
        child.reader.start()
        self.say(f"{process.name} (pid {popen.pid}): {process.summary} ...")

    def _watch(self) -> int:
        began = last_progress = time.monotonic()
        all_ready = False
        while not self.stopping:
            now = time.monotonic()
            for child in self.children:
                failed = self._tend(child, now)
                if failed:
                    self.say(failed)
                    return 1
            if not all_ready and all(c.ready for c in self.children):
                all_ready = True
                self.say(f"serving {self.plan.model} after {now - began:.1f} s: OpenAI API on "
                         f"{self.plan.base_url} (Ctrl-C stops)")
            elif not all_ready and now - last_progress >= PROGRESS_SECONDS:
                last_progress = now
                waiting = ", ".join(c.process.name for c in self.children if not c.ready)
                self.say(f"still starting: {waiting} ({now - began:.0f} s)")
            time.sleep(POLL_SECONDS)
        return 0

    def _tend(self, child: Child, now: float) -> str | None:
        """One look at a child: reap and schedule a restart, restart, or check readiness.
        Returns why the run must end, if it must."""
        name = child.process.name
        if child.popen is None:
            if child.restart_at is not None and now >= child.restart_at:
                self._start(child)
            return None
        code = child.popen.poll()
        if code is not None:
            pid = child.popen.pid
            _signal_group(child.popen, signal.SIGKILL)  # what it left behind (engine workers)
            child.popen = None
            if not child.ever_ready:
                return (f"{name} exited ({_describe(code)}) before it was ready; its output "
                        "above says why")
            child.failures = 1 if now - child.started >= STABLE_SECONDS else child.failures + 1
            delay = restart_delay(child.failures)
            child.restart_at = now + delay
            self.say(f"{name} (pid {pid}) exited ({_describe(code)}); restarting in "
                     f"{delay:.0f} s")
            return None
        if child.ready:
            return None
        if _answers(child.process.health_url):
            child.ready = True
            verb = "ready again" if child.ever_ready else "ready"
            child.ever_ready = True
            self.say(f"{name} {verb} after {now - child.started:.1f} s")
        elif now - child.started > child.process.startup_seconds:
            limit = f"not ready within {child.process.startup_seconds:.0f} s"
            if not child.ever_ready:
                return f"{name} was {limit} ({child.process.health_url}); stopping"
            self.say(f"{name} was {limit}; killing it for a restart")
            _signal_group(child.popen, signal.SIGKILL)
        return None

    # -- stop ------------------------------------------------------------------------------------
    def _stop_all(self) -> None:
        routers = [c for c in self.children if c.process.tier is None]
        engines = [c for c in self.children if c.process.tier is not None]
        self._stop(routers, self.drain_seconds + STOP_GRACE_SECONDS)
        self._stop(engines, STOP_GRACE_SECONDS)
        for child in self.children:
            if child.reader:
                child.reader.join(timeout=2)

    def _stop(self, children: list[Child], grace: float) -> None:
        running = [c for c in children if c.popen is not None and c.popen.poll() is None]
        if not running:
            return
        names = ", ".join(c.process.name for c in running)
        self.say(f"stopping {names}")
        for child in running:
            _signal_group(child.popen, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while (not self.forced and time.monotonic() < deadline
               and any(c.popen.poll() is None for c in running)):
            time.sleep(0.1)
        for child in running:
            if child.popen.poll() is None:
                self.say(f"{child.process.name} did not stop; killing it")
            _signal_group(child.popen, signal.SIGKILL)  # also what it left in its group
            child.popen.wait()


def _signal_group(popen: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, sig)


def _answers(url: str) -> bool:
    parts = urlsplit(url)
    try:
        if parts.scheme == "tcp":
            with socket.create_connection((parts.hostname, parts.port),
                                          timeout=HEALTH_TIMEOUT_SECONDS):
                return True
        return httpx.get(url, timeout=HEALTH_TIMEOUT_SECONDS).status_code == 200
    except (OSError, httpx.HTTPError):
        return False


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
