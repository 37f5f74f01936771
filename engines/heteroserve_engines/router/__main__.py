"""`heteroserve-router`: one OpenAI endpoint over accelerator and CPU engines.

Either a configuration file (what the operator renders; `--config`), or the sysHAX workflow in
front of engines that already run:

    heteroserve-router --accelerator http://127.0.0.1:8001 --cpu http://127.0.0.1:8002 \\
        --port 8010 --model ds-32b

Flags given with --config override the file's listen address and policy.
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..protocol.router_config import RouterConfig


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="heteroserve-router", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="router configuration file (YAML)")
    parser.add_argument("--accelerator", action="append", default=[], metavar="URL",
                        help="accelerator engine base URL (repeatable)")
    parser.add_argument("--cpu", action="append", default=[], metavar="URL",
                        help="CPU engine base URL (repeatable)")
    parser.add_argument("--model", help="served model name clients send")
    parser.add_argument("--policy", choices=["auto", "accelerator", "cpu", "split"],
                        help="routing policy (default: auto)")
    parser.add_argument("--host", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default 8010)")
    parser.add_argument("--api-keys-file", help="file of accepted API keys, one per line")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])
    return parser


def config_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> RouterConfig:
    from pydantic import ValidationError

    from .settings import ConfigError, load_config

    if args.config:
        if args.accelerator or args.cpu or args.model:
            parser.error("--config already names the model and upstreams; drop --accelerator, "
                         "--cpu and --model")
        try:
            config = load_config(args.config)
        except ConfigError as error:
            parser.error(str(error))
        document = config.document()
    else:
        if not args.model:
            parser.error("give --config, or --model with --accelerator and/or --cpu URLs")
        document = {"model": args.model}
        if args.accelerator:
            document["accelerator"] = {"urls": args.accelerator}
        if args.cpu:
            document["cpu"] = {"urls": args.cpu}
    listen = dict(document.get("listen", {}))
    if args.host:
        listen["host"] = args.host
    if args.port:
        listen["port"] = args.port
    document["listen"] = listen
    if args.policy:
        document["policy"] = args.policy
    if args.api_keys_file:
        document["apiKeysFile"] = args.api_keys_file
    try:
        return RouterConfig.model_validate(document)
    except ValidationError as error:
        parser.error("; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}"
                               for e in error.errors()))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    config = config_from_args(args, parser)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every upstream request (health checks and scrapes too) at INFO.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from .server import serve

    try:
        return serve(config)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
