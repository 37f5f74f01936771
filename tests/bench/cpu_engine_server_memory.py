"""Peak memory of the CPU engine server against its weights + KV cache (a script, not a test).

    .venv/bin/python -m tests.bench.cpu_engine_server_memory [--kv-cache-gib 0.25,1]

Starts `heteroserve-cpu-engine` with the default model as a user would (the e2e tests' launcher),
sends one chat request with the official `openai` client, and prints the process's peak RSS
(VmHWM) beside the weights and KV cache the engine reports at start: what a decode pod's memory
request must cover. The engine-only figures against llama.cpp are in cpu_engine_vs_llamacpp.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

from tests.e2e.conftest import start_engine, stop_engine


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def measure(kv_gib: float, tmp: Path) -> tuple[float, float, float]:
    from openai import OpenAI

    engine = start_engine(tmp, "--kv-cache-gib", str(kv_gib))
    try:
        client = OpenAI(base_url=engine.base_url, api_key="unused", max_retries=0)
        client.chat.completions.create(
            model=client.models.list().data[0].id, max_tokens=32, temperature=0.7, seed=1,
            messages=[{"role": "user", "content": "Describe a lighthouse in two sentences."}])
        rss = peak_rss_mib(engine.proc.pid)
    finally:
        stop_engine(engine)
    log = engine.log.read_text()
    weights = float(re.search(r"([\d.]+) MiB of weights", log).group(1))
    kv = float(re.search(r"KV \d+ blocks = ([\d.]+) MiB", log).group(1))
    return weights, kv, rss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kv-cache-gib", default="0.25,1")
    args = parser.parse_args()
    print("| KV cache GiB | weights MiB | KV MiB | peak RSS MiB | RSS - (weights + KV) MiB | "
          "RSS / (weights + KV) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for kv_gib in (float(x) for x in args.kv_cache_gib.split(",")):
            weights, kv, rss = measure(kv_gib, Path(tmp))
            print(f"| {kv_gib:g} | {weights:.0f} | {kv:.0f} | {rss:.0f} | "
                  f"{rss - weights - kv:.0f} | {rss / (weights + kv):.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
