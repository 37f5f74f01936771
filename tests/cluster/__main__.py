"""`python -m tests.cluster up|down|status`: the test cluster by hand (make cluster-up/-down)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .harness import (
    CACHE,
    ControlPlane,
    HarnessError,
    ensure_binaries,
    recorded_pids,
    stop_recorded,
)

DEFAULT_WORKDIR = Path(os.environ.get("HETEROSERVE_CLUSTER_DIR", CACHE / "cluster"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR,
                        help="where PKI, logs, etcd data and the kubeconfig live "
                             "(default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            build_s = ensure_binaries()
            started = time.monotonic()
            plane = ControlPlane(args.workdir, log=lambda m: print(m, file=sys.stderr))
            kubeconfig = plane.start()
            print(f"build: {build_s:.0f} s, cluster start: {time.monotonic() - started:.1f} s",
                  file=sys.stderr)
            print(kubeconfig)
        elif args.command == "down":
            stop_recorded(args.workdir)
            print(f"stopped the cluster in {args.workdir}", file=sys.stderr)
        else:
            for pid, name in recorded_pids(args.workdir):
                print(f"{pid}\t{name}")
    except HarnessError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
