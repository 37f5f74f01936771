"""The KV hand-off against recomputing the prompt (a script, not a timed test).

    .venv/bin/python -m tests.bench.kv_handoff [--lengths 512,2048,8000] [--rounds 3]
        [--exporter cpu|prefill] [--device cpu]

Two engines on loopback, each on its own core: an exporter (a second CPU engine, or with
`--exporter prefill` the builtin PyTorch prefill engine on `--device`) and the CPU engine that
decodes. For each prompt length, side by side in one run (medians of `--rounds`):

- pull: `GET /v1/kv/{handle}` of a kept prompt by this script (the wire: bytes and GB/s over
  TCP on loopback);
- hand-off: the decode engine's time to its first token when it pulls the KV, imports it and
  computes the last prompt token (what the router's split costs after the prefill);
- recompute: the same engine's time to its first token computing the whole prompt itself.

Prompts are token ids (a completions request), so their length is exact. The shared-memory
transfer is not built yet: no column for it.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.processes import free_port, stop_process

MODEL = "smollm2"
MAX_MODEL_LEN = 8192


def start(folder: Path, name: str, argv: list[str], cpus: list[int]
          ) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(folder / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen([sys.executable, "-m", *argv, "--port", str(port)],
                            env={**os.environ, "OMP_NUM_THREADS": str(len(cpus)),
                                 "CUSTOM_CPU_AFFINITY": ",".join(map(str, cpus))},
                            stdout=log, stderr=subprocess.STDOUT)
    os.sched_setaffinity(proc.pid, set(cpus))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((folder / f"{name}.log").read_text()[-2000:])
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{name} did not start")


def complete(url: str, prompt: list[int], **extra) -> tuple[float, dict]:
    started = time.perf_counter()
    response = httpx.post(url + "/v1/completions", timeout=600, json={
        "model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0, **extra})
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed, response.json()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="512,2048,8000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--exporter", choices=["cpu", "prefill"], default="cpu")
    parser.add_argument("--device", default="cpu", help="the prefill engine's torch device")
    parser.add_argument("--model", default=None, help="GGUF file (default: the embedded SmolLM2)")
    parser.add_argument("--decoder-threads", type=int, default=1,
                        help="CPUs of the decode engine (the last ones); the exporter gets the "
                        "first")
    parser.add_argument("--exporter-args", default="",
                        help="extra arguments of the exporting engine (space-separated)")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    cpus = sorted(os.sched_getaffinity(0))
    decoder_cpus = cpus[-args.decoder_threads:]
    rng = random.Random(0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kv-handoff-") as name:
        folder = Path(name)
        token = secrets.token_urlsafe(24)
        (folder / "kv-token").write_text(token)
        common = ["--served-model-name", MODEL, "--max-model-len", str(MAX_MODEL_LEN),
                  "--kv-token-file", str(folder / "kv-token"),
                  *(["--model", args.model] if args.model else [])]
        exporter_argv = (["heteroserve_engines.prefill", "--device", args.device,
                          "--kv-budget-tokens", str(2 * MAX_MODEL_LEN), *common]
                         if args.exporter == "prefill" else
                         ["heteroserve_engines.cpu_engine", "--kv-cache-gib", "0.5", *common])
        exporter_argv += args.exporter_args.split()
        procs = []
        try:
            proc, exporter = start(folder, "exporter", exporter_argv, [cpus[0]])
            procs.append(proc)
            proc, decoder = start(folder, "decoder", ["heteroserve_engines.cpu_engine",
                                                      "--kv-cache-gib", "0.5", *common],
                                  decoder_cpus)
            procs.append(proc)
            for length in lengths:
                pulls, handoffs, recomputes, sizes = [], [], [], []
                for _ in range(args.rounds):
                    prompt = [rng.randrange(1000, 20000) for _ in range(length)]
                    # The wire alone: this script pulls a kept prompt.
                    _, answer = complete(exporter, prompt,
                                         kv_transfer_params={"do_remote_decode": True})
                    handle = answer["kv_transfer_params"]["remote_handle"]
                    started = time.perf_counter()
                    body = httpx.get(f"{exporter}/v1/kv/{handle}", timeout=600,
                                     headers={"authorization": f"Bearer {token}"}).content
                    pulls.append(time.perf_counter() - started)
                    sizes.append(len(body))
                    # The decode engine pulls, imports and computes the last prompt token.
                    _, answer = complete(exporter, prompt,
                                         kv_transfer_params={"do_remote_decode": True})
                    params = {**answer["kv_transfer_params"], "remote_host": "127.0.0.1"}
                    elapsed, _ = complete(decoder, prompt, kv_transfer_params=params)
                    handoffs.append(elapsed)
                    elapsed, _ = complete(decoder, prompt)
                    recomputes.append(elapsed)
                rows.append((length, statistics.median(sizes), statistics.median(pulls),
                             statistics.median(handoffs), statistics.median(recomputes)))
                print(f"  {length} tokens: done", file=sys.stderr, flush=True)
        finally:
            for proc in reversed(procs):
                stop_process(proc)
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    cpu = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines()
                if line.startswith("Model name")), "unknown CPU")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    print(f"{cpu}; nproc {len(cpus)}; commit {commit}; exporter {args.exporter}"
          f"{' on ' + args.device if args.exporter == 'prefill' else ''} (process on CPU "
          f"{cpus[0]}), decoder on {len(decoder_cpus)} CPU(s) {decoder_cpus[0]}-"
          f"{decoder_cpus[-1]}; medians of {args.rounds}\n")
    print("| prompt tokens | KV on the wire (MiB) | pull (ms) | pull (GB/s) | hand-off TTFT (ms) "
          "| recompute TTFT (ms) | recompute / hand-off |")
    print("|---|---|---|---|---|---|---|")
    for length, size, pull, handoff, recompute in rows:
        print(f"| {length} | {size / 2**20:.1f} | {pull * 1e3:.1f} | {size / pull / 1e9:.2f} | "
              f"{handoff * 1e3:.1f} | {recompute * 1e3:.1f} | {recompute / handoff:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
