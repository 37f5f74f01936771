"""The prefill engine's exact CPU-engine numerics (`--activation-quantization avx512vnni`,
prefill/exact.py) on a torch device against the CPU engine itself: for random prompts of the
given lengths, the share of K/V values (every layer) and of last-token logits that are
bit-identical, and the time of each side's prefill. A script, not a timed test.

    python -m tests.bench.exact_kv [--device cuda] [--model FILE] [--lengths 16,64,256]
        [--prompts 3] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import heteroserve_cpu as hc
import numpy as np
import torch

from heteroserve_engines.cpu_engine.__main__ import default_model
from heteroserve_engines.cpu_engine.gguf_model import load_model
from heteroserve_engines.prefill.exact import ExactModel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default=None)
    parser.add_argument("--lengths", default="16,64,256")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    path = args.model or default_model()
    device = torch.device(args.device)
    cpus = sorted(os.sched_getaffinity(0))[:args.threads]
    cpu, config, reader = load_model(path, hc.Pool(cpus, len(cpus)), kernels="avx512vnni")
    exact = ExactModel(reader, config, device)
    rng = np.random.default_rng(0)
    kvd = config.n_head_kv * config.head_dim
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "host"
    print(f"device {device} ({name}); "
          f"CPU engine avx512vnni on {len(cpus)} thread(s); {config.name}; {args.prompts} random "
          f"prompts per length\n")
    print("| prompt tokens | K/V values bit-identical | logits bit-identical | CPU engine "
          "prefill (ms) | exact torch prefill (ms) |")
    print("|---|---|---|---|---|")
    failed = False
    for length in [int(v) for v in args.lengths.split(",")]:
        same_kv, same_logits, cpu_ms, exact_ms = [], [], [], []
        blocks = -(-length // 16)
        cpu.alloc_kv(blocks, 16)
        tables = np.arange(blocks, dtype=np.int32)[None, :]
        for _ in range(args.prompts):
            ids = [1] + [int(t) for t in rng.integers(100, config.n_vocab - 100, length - 1)]
            started = time.perf_counter()
            theirs = cpu.forward(np.asarray(ids, np.int32), np.arange(length, dtype=np.int32),
                                 np.zeros(length, np.int32), tables,
                                 np.asarray([length - 1], np.int32))[0]
            cpu_ms.append((time.perf_counter() - started) * 1e3)
            empty = [torch.zeros(0, kvd, dtype=torch.float16, device=device)] * config.n_layer
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            logits, keys, values = exact.forward(ids, 0, empty, empty)
            ours = logits.cpu().numpy()
            exact_ms.append((time.perf_counter() - started) * 1e3)
            equal = total = 0
            for layer in range(config.n_layer):
                k, v = cpu.read_kv(layer, np.arange(length, dtype=np.int32))
                for rows, mine in ((k, keys[layer]), (v, values[layer])):
                    a = np.frombuffer(rows, "<f2")
                    b = mine.cpu().numpy().reshape(-1)
                    equal += int((a.view(np.uint16) == b.view(np.uint16)).sum())
                    total += a.size
            same_kv.append(equal / total)
            same_logits.append(float((ours.view(np.uint32) == theirs.view(np.uint32)).mean()))
        failed |= min(same_kv) < 1 or min(same_logits) < 1
        print(f"| {length} | {100 * min(same_kv):.4f} % (least of {args.prompts}) | "
              f"{100 * min(same_logits):.4f} % | {statistics.median(cpu_ms):.1f} | "
              f"{statistics.median(exact_ms):.1f} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
