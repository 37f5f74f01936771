"""The KV hand-off's command-line flags, the same on both builtin engines, and the KvExports
they configure."""

from __future__ import annotations

import argparse

from .export import DEFAULT_TIMEOUT_SECONDS, KvExports, load_kv_token, shm_directory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kv-token-file", default=None,
                        help="the deployment's KV hand-off token: enables exporting KV for a "
                        "pull (a prefill for a remote decode) and pulling it (the decode)")
    parser.add_argument("--kv-handle-timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS,
                        help="seconds a kept KV waits for its pull before it is freed")
    parser.add_argument("--kv-advertise-host", default=None,
                        help="the address decode engines pull this engine's KV from (default: "
                        "the one the router reached it at; in a pod whose router sidecar uses "
                        "loopback, the pod IP)")
    parser.add_argument("--kv-shm-dir", default=None,
                        help="a memory-backed directory that the other engine of the hand-off "
                        "mounts too (same node): the KV goes through a file there, not TCP")


def exports_from(args: argparse.Namespace) -> KvExports:
    """ValueError for an unreadable token file or a missing directory."""
    token = load_kv_token(args.kv_token_file) if args.kv_token_file else None
    return KvExports(token, args.kv_handle_timeout, shm_dir=shm_directory(args.kv_shm_dir),
                     advertise_host=args.kv_advertise_host)
