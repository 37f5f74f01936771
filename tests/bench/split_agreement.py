"""PD offload end to end on one machine (a script, not a timed test): the builtin prefill engine
on `--device` (cuda on the GPU host) exports KV, the CPU engine decodes from it, the router's
`split` policy joins them. For a set of chat prompts at temperature 0 it prints how often the
split's first `--tokens` tokens equal the CPU engine's own, and the median time to the first
token of each path.

    python -m tests.bench.split_agreement [--device cuda] [--model FILE] [--prompts 50]
        [--decoder-threads N] [--prefill-args "..."] [--decoder-args "..."]

For a split that reproduces the CPU engine alone bit for bit: --prefill-args
"--activation-quantization avx512vnni" --decoder-args "--kernels avx512vnni".
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from tests.bench.kv_handoff import start
from tests.processes import free_port, stop_process

MODEL = "smollm2"
TOPICS = ["the sea", "a mountain", "bread", "rain", "the moon", "a library", "a bicycle",
          "winter", "coffee", "a garden"]
ASKS = ["Tell me one fact about {}.", "Write two sentences about {}.",
        "Why do people like {}?", "Describe {} to a child.", "Give three words about {}."]


def prompts(count: int) -> list[str]:
    out = [ask.format(topic) for topic in TOPICS for ask in ASKS]
    return (out * (count // len(out) + 1))[:count]


def stream_chat(url: str, content: str, tokens: int) -> tuple[float, str]:
    """(seconds to the first content chunk, the text)."""
    started, first, text = time.perf_counter(), None, []
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": tokens, "temperature": 0, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            piece = (chunk["choices"] or [{}])[0].get("delta", {}).get("content")
            if piece:
                first = first or time.perf_counter() - started
                text.append(piece)
    return first or 0.0, "".join(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default=None)
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--decoder-threads", type=int, default=1)
    parser.add_argument("--prefill-args", default="")
    parser.add_argument("--no-prefill-alone", action="store_true",
                        help="skip timing the prefill engine alone (its first token)")
    parser.add_argument("--decoder-args", default="",
                        help="more CPU engine arguments (e.g. --kernels avx512vnni)")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="split-") as name:
        folder = Path(name)
        (folder / "kv-token").write_text(secrets.token_urlsafe(24))
        common = ["--served-model-name", MODEL, "--max-model-len", "2048",
                  "--kv-token-file", str(folder / "kv-token"),
                  *(["--model", args.model] if args.model else [])]
        procs = []
        try:
            proc, prefill = start(folder, "prefill", ["heteroserve_engines.prefill", "--device",
                                                      args.device, *common,
                                                      *args.prefill_args.split()], [cpus[0]])
            procs.append(proc)
            proc, decoder = start(folder, "decoder", ["heteroserve_engines.cpu_engine", *common,
                                                      *args.decoder_args.split()],
                                  cpus[-args.decoder_threads:])
            procs.append(proc)
            port = free_port()
            config = folder / "router.yaml"
            config.write_text(yaml.safe_dump({
                "model": MODEL, "policy": "split", "listen": {"port": port},
                "health": {"intervalSeconds": 1},
                "accelerator": {"urls": [prefill], "kvExport": True},
                "cpu": {"urls": [decoder], "kvImport": True}}))
            log = open(folder / "router.log", "wb")  # noqa: SIM115 - the child owns it
            procs.append(subprocess.Popen([sys.executable, "-m", "heteroserve_engines.router",
                                           "--config", str(config)], stdout=log,
                                          stderr=subprocess.STDOUT))
            router = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if httpx.get(router + "/ready", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.3)
            agree, ttft = 0, {"cpu engine alone": [], "prefill engine alone": [], "split": []}
            for content in prompts(args.prompts):
                seconds, alone = stream_chat(decoder, content, args.tokens)
                ttft["cpu engine alone"].append(seconds)
                if not args.no_prefill_alone:
                    seconds, _ = stream_chat(prefill, content, 1)  # its time to a first token
                    ttft["prefill engine alone"].append(seconds)
                seconds, split = stream_chat(router, content, args.tokens)
                ttft["split"].append(seconds)
                agree += split == alone
            metrics = httpx.get(router + "/metrics").text
            handoffs = [line for line in metrics.splitlines()
                        if line.startswith("heteroserve_router_kv_handoffs_total")]
        finally:
            for proc in reversed(procs):
                stop_process(proc)
    print(f"device {args.device}; decoder on {args.decoder_threads} CPU(s); "
          f"prefill args {args.prefill_args!r}; decoder args {args.decoder_args!r}; "
          f"{args.prompts} chat prompts, greedy, "
          f"{args.tokens} tokens\n")
    print(f"split output equal to the CPU engine alone: {agree} of {args.prompts} "
          f"({100 * agree / args.prompts:.0f} %)")
    print("router hand-offs: " + "; ".join(handoffs))
    print("\n| path | TTFT p50 (ms) |\n|---|---|")
    for path, values in ttft.items():
        if not values:
            continue
        print(f"| {path} | {statistics.median(values) * 1e3:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
