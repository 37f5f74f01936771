"""The KV hand-off against recomputing the prompt (a script, not a timed test).

    .venv/bin/python -m tests.bench.kv_handoff [--lengths 512,2048,8000] [--rounds 3]
        [--exporter cpu|prefill] [--device cpu]

Engines on loopback: an exporter (a second CPU engine, or with `--exporter prefill` the builtin
PyTorch prefill engine on `--device`) on the first CPU, and two CPU decode engines on the last
`--decoder-threads` CPUs (one busy at a time): one shares the exporter's memory-backed
`--kv-shm-dir` (a folder of /dev/shm, as a pod's `emptyDir: {medium: Memory}`), the other has a
folder of its own and so pulls over TCP. For each prompt length, side by side in one run
(medians of `--rounds`):

- pull: a kept prompt's KV fetched by this script and verified (every CRC), over TCP
  (`GET /v1/kv/{handle}`) and through shared memory (`?transport=shm`, the file mapped);
- hand-off: a decode engine's time to its first token when it pulls the KV, imports it and
  computes the last prompt token (what the router's split costs after the prefill), per
  transport;
- recompute: the time to the first token computing the whole prompt on the decode engine.

Prompts are token ids (a completions request), so their length is exact. At the end the decode
engines' `heteroserve:kv_pulls_total` show which transport each used.
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

from heteroserve_engines.kv_handoff.pull import SHM_FILE
from heteroserve_engines.protocol.kv import KvStreamReader
from tests.processes import free_port, metric_value, stop_process

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


def kept(exporter: str, prompt: list[int]) -> str:
    _, answer = complete(exporter, prompt, kv_transfer_params={"do_remote_decode": True})
    return answer["kv_transfer_params"]["remote_handle"]


def pull_tcp(exporter: str, handle: str, token: str) -> int:
    reader = KvStreamReader()
    size = 0
    with httpx.stream("GET", f"{exporter}/v1/kv/{handle}", timeout=600,
                      headers={"authorization": f"Bearer {token}"}) as response:
        response.raise_for_status()
        for chunk in response.iter_raw():
            size += len(chunk)
            reader.feed(chunk)
    reader.finish()
    return size


def pull_shm(exporter: str, handle: str, token: str, folder: Path) -> int:
    import mmap

    answer = httpx.get(f"{exporter}/v1/kv/{handle}", params={"transport": "shm"}, timeout=600,
                       headers={"authorization": f"Bearer {token}"})
    answer.raise_for_status()
    name = answer.json()["file"]
    assert SHM_FILE.fullmatch(name)
    path = folder / name
    with open(path, "rb") as file:
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
    path.unlink()
    KvStreamReader().read_whole(mapped)
    return len(mapped)


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
    shm_root = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="kv-handoff-") as name, \
            tempfile.TemporaryDirectory(prefix="kv-shared-", dir=shm_root) as shared_name, \
            tempfile.TemporaryDirectory(prefix="kv-own-", dir=shm_root) as own_name:
        folder, shared, own = Path(name), Path(shared_name), Path(own_name)
        token = secrets.token_urlsafe(24)
        (folder / "kv-token").write_text(token)
        common = ["--served-model-name", MODEL, "--max-model-len", str(MAX_MODEL_LEN),
                  "--kv-token-file", str(folder / "kv-token"),
                  *(["--model", args.model] if args.model else [])]
        exporter_argv = (["heteroserve_engines.prefill", "--device", args.device,
                          "--kv-budget-tokens", str(2 * MAX_MODEL_LEN), *common]
                         if args.exporter == "prefill" else
                         ["heteroserve_engines.cpu_engine", "--kv-cache-gib", "0.5", *common])
        exporter_argv += ["--kv-shm-dir", str(shared), *args.exporter_args.split()]
        procs = []
        try:
            proc, exporter = start(folder, "exporter", exporter_argv, [cpus[0]])
            procs.append(proc)
            decoders = {}
            for transport, directory in (("tcp", own), ("shm", shared)):
                proc, decoders[transport] = start(
                    folder, f"decoder-{transport}", ["heteroserve_engines.cpu_engine",
                                                     "--kv-cache-gib", "0.5", "--kv-shm-dir",
                                                     str(directory), *common], decoder_cpus)
                procs.append(proc)
            for length in lengths:
                got: dict[str, list[float]] = {key: [] for key in (
                    "pull tcp", "pull shm", "handoff tcp", "handoff shm", "recompute", "size")}
                for _ in range(args.rounds):
                    prompt = [rng.randrange(1000, 20000) for _ in range(length)]
                    # The transfer alone: this script pulls a kept prompt and verifies it.
                    for transport in ("tcp", "shm"):
                        handle = kept(exporter, prompt)
                        started = time.perf_counter()
                        size = (pull_tcp(exporter, handle, token) if transport == "tcp" else
                                pull_shm(exporter, handle, token, shared))
                        got[f"pull {transport}"].append(time.perf_counter() - started)
                    got["size"].append(size)
                    # A decode engine pulls, imports and computes the last prompt token.
                    for transport, decoder in decoders.items():
                        _, answer = complete(exporter, prompt,
                                             kv_transfer_params={"do_remote_decode": True})
                        params = {**answer["kv_transfer_params"], "remote_host": "127.0.0.1"}
                        elapsed, _ = complete(decoder, prompt, kv_transfer_params=params)
                        got[f"handoff {transport}"].append(elapsed)
                    elapsed, _ = complete(decoders["tcp"], prompt)
                    got["recompute"].append(elapsed)
                rows.append((length, {key: statistics.median(v) for key, v in got.items()}))
                print(f"  {length} tokens: done", file=sys.stderr, flush=True)
            used = {transport: {t: metric_value(httpx.get(url + "/metrics").text,
                                                "heteroserve:kv_pulls_total", transport=t,
                                                outcome="ok") for t in ("tcp", "shm")}
                    for transport, url in decoders.items()}
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
    print("| prompt tokens | KV (MiB) | pull TCP (ms) | pull shm (ms) | TCP GB/s | shm GB/s "
          "| hand-off TTFT TCP (ms) | hand-off TTFT shm (ms) | recompute TTFT (ms) "
          "| recompute / shm hand-off |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for length, m in rows:
        size = m["size"]
        print(f"| {length} | {size / 2**20:.1f} | {m['pull tcp'] * 1e3:.1f} | "
              f"{m['pull shm'] * 1e3:.1f} | {size / m['pull tcp'] / 1e9:.2f} | "
              f"{size / m['pull shm'] / 1e9:.2f} | {m['handoff tcp'] * 1e3:.1f} | "
              f"{m['handoff shm'] * 1e3:.1f} | {m['recompute'] * 1e3:.1f} | "
              f"{m['recompute'] / m['handoff shm']:.1f}x |")
    print(f"\npulls by transport (heteroserve:kv_pulls_total, ok): decoder on its own folder "
          f"{used['tcp']}, decoder on the shared folder {used['shm']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
