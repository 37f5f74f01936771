"""The prefill engine's torch model (on the CPU device): logits against the float32 numpy
reference on synthetic Llama and Qwen2 files (both RoPE conventions), whole-prompt batches and
decode steps over the KV pool alike; its K/V rows against the CPU engine's for the same prompt;
the CPU engine continuing from KV the torch model computed; greedy agreement on SmolLM2."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import heteroserve_cpu as hc
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter, quants

from heteroserve_engines.cpu_engine.__main__ import default_model
from heteroserve_engines.cpu_engine.gguf_file import GGUFFile
from heteroserve_engines.cpu_engine.gguf_model import load_model
from heteroserve_engines.cpu_engine.tokenizer import GGUFTokenizer
from heteroserve_engines.prefill.model import Chunk, LlamaModel
from tests.reference.llama_numpy import logits as reference_logits
from tests.reference.synthetic import write_llama
from tests.variants import BATCH_INVARIANT

CPU = torch.device("cpu")
PROMPT = [1, 5, 9, 33, 200, 17, 4, 100, 3, 7, 7, 8, 9, 10, 11, 12, 13, 14, 15, 99]


def write_qwen2(path: Path, *, n_layer=2, n_embd=128, n_head=4, n_kv=2, n_ff=256, vocab=256,
                std=0.2) -> Path:
    """A Qwen2-shaped file: RoPE on halves (NeoX) and Q/K/V biases, random q8_0 weights."""
    writer = GGUFWriter(str(path), "qwen2")
    writer.add_name("synthetic qwen2")
    writer.add_block_count(n_layer)
    writer.add_context_length(4096)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(vocab)
    rng = np.random.default_rng(1)
    qtype = GGMLQuantizationType.Q8_0

    def add(name: str, rows: int, cols: int) -> None:
        weights = rng.standard_normal((rows, cols), dtype=np.float32) * std
        writer.add_tensor(name, quants.quantize(weights, qtype), raw_dtype=qtype)

    add("token_embd.weight", vocab, n_embd)
    add("output.weight", vocab, n_embd)
    writer.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    kv = n_kv * n_embd // n_head
    for layer in range(n_layer):
        p = f"blk.{layer}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(n_embd, np.float32))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, np.float32))
        for name, rows in (("attn_q", n_embd), ("attn_k", kv), ("attn_v", kv)):
            writer.add_tensor(p + name + ".bias",
                              rng.standard_normal(rows, dtype=np.float32) * 0.5)
        for name, rows, cols in (("attn_q", n_embd, n_embd), ("attn_k", kv, n_embd),
                                 ("attn_v", kv, n_embd), ("attn_output", n_embd, n_embd),
                                 ("ffn_gate", n_ff, n_embd), ("ffn_up", n_ff, n_embd),
                                 ("ffn_down", n_embd, n_ff)):
            add(p + name + ".weight", rows, cols)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def synthetic(request, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("models") / f"{request.param}.gguf"
    if request.param == "qwen2":
        return write_qwen2(path)
    return write_llama(path, n_layer=2, n_embd=128, n_head=4, n_kv=2, n_ff=256, vocab=256,
                       qtype=GGMLQuantizationType.Q8_0, std=0.2)


@pytest.fixture(scope="module")
def smollm2():
    model, reader = LlamaModel.from_gguf(default_model(), CPU, torch.float32)
    return model, GGUFTokenizer.from_gguf(reader)


@pytest.fixture(scope="module")
def cpu_pool():
    return hc.Pool([], 2)


def cpu_forward(model, ids: list[int], start: int = 0, first_block: int = 0) -> np.ndarray:
    """The CPU engine's logits of the last token, positions start.. of one sequence whose
    blocks are first_block, first_block + 1, ..."""
    n = len(ids)
    tables = np.arange(first_block, first_block + 16, dtype=np.int32)[None, :]
    return model.forward(np.asarray(ids[start:], np.int32), np.arange(start, n, dtype=np.int32),
                         np.zeros(n - start, np.int32), tables,
                         np.asarray([n - start - 1], np.int32))[0]


def close(ours: torch.Tensor, reference: np.ndarray) -> None:
    scale = max(1.0, float(np.abs(reference).max()))
    assert np.abs(ours.numpy() - reference).max() <= 1e-4 * scale


def test_prompt_batches_and_decode_steps_match_the_float_reference(synthetic):
    model, _ = LlamaModel.from_gguf(synthetic, CPU, torch.float32)
    expected = reference_logits(GGUFFile.open(synthetic), PROMPT)
    pool = model.new_pool(256)
    short, long = pool.allocate(1), pool.allocate(2)
    # Two prompts of different lengths in one step: each one's last-token logits.
    first = model.forward([Chunk(PROMPT[:4], 0, short), Chunk(PROMPT[:9], 0, long)], pool)
    close(first[0], expected[3])
    close(first[1], expected[8])
    # Then decode steps of both together (unequal lengths: the padded, masked path), and one
    # step of several new tokens after cached ones.
    for offset in range(3):
        step = model.forward([Chunk([PROMPT[4 + offset]], 4 + offset, short),
                              Chunk([PROMPT[9 + offset]], 9 + offset, long)], pool)
        close(step[0], expected[4 + offset])
        close(step[1], expected[9 + offset])
    tail = model.forward([Chunk(PROMPT[12:], 12, long)], pool)
    close(tail[0], expected[-1])


def kv_rows(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<f2").astype(np.float32)


def assert_kv_rows_equal_the_cpu_engines(path, cpu_pool, text: str | None = None) -> None:
    cpu, config, reader = load_model(path, cpu_pool, kernels=BATCH_INVARIANT)
    cpu.alloc_kv(8, 16)
    ids = PROMPT if text is None else GGUFTokenizer.from_gguf(reader).encode(text)
    cpu_forward(cpu, ids)
    model, _ = LlamaModel.from_gguf(path, CPU, torch.float32)
    pool = model.new_pool(64)
    pool.allocate(1)  # the prompt's blocks are not slot 0 onwards: slots are mapped
    blocks = pool.allocate(pool.blocks_for(len(ids)))
    model.forward([Chunk(ids, 0, blocks)], pool)
    # The CPU engine quantizes every product's activations to 8 bits: its first layer's rows
    # differ from float ones by under 1 % of their range, the error growing through the layers
    # (measured: 0.3 % at layer 0, up to 5 % at SmolLM2's last). A RoPE pairing or position
    # mistake differs by the rows' own size.
    for layer in range(config.n_layer):
        theirs = cpu.read_kv(layer, np.arange(len(ids), dtype=np.int32))
        ours = pool.read(layer, pool.slots(blocks, 0, len(ids)))
        for their_rows, our_rows in zip(theirs, ours, strict=True):
            a, b = kv_rows(their_rows), kv_rows(our_rows)
            assert a.shape == b.shape == (len(ids) * config.n_head_kv * config.head_dim,)
            error = np.abs(a - b).max() / np.abs(a).max()
            assert error < (0.01 if layer == 0 else 0.1), (layer, error)


def test_kv_rows_equal_the_cpu_engines(synthetic, cpu_pool):
    assert_kv_rows_equal_the_cpu_engines(synthetic, cpu_pool)


def test_kv_rows_equal_the_cpu_engines_on_smollm2(cpu_pool):
    assert_kv_rows_equal_the_cpu_engines(default_model(), cpu_pool,
                                         "The history of the Roman empire is long and")


def test_the_cpu_engine_continues_from_the_torch_models_kv(smollm2, cpu_pool):
    """The hand-off's use: the CPU engine imports the prompt's KV (all but the last token, which
    it computes for its logits) and its next-token logits equal those of its own prefill within
    its own quantization error. KV with the other RoPE convention is far off (the check has
    teeth)."""
    model, tok = smollm2
    cpu, config, _ = load_model(default_model(), cpu_pool, kernels=BATCH_INVARIANT)
    cpu.alloc_kv(32, 16)
    neox = LlamaModel(dataclasses.replace(model.config, architecture="qwen2"), model.weights,
                      model.device, model.dtype)
    for text in ["The history of the Roman empire is long and full of wars, emperors and",
                 "def fibonacci(n):\n    if n"]:
        ids = tok.encode(text)
        n = len(ids)
        own = cpu_forward(cpu, ids)
        errors = []
        for torch_model in (model, neox):
            pool = torch_model.new_pool(64)
            blocks = pool.allocate(pool.blocks_for(n))
            torch_model.forward([Chunk(ids, 0, blocks)], pool)
            for layer in range(config.n_layer):
                k, v = pool.read(layer, pool.slots(blocks, 0, n - 1))
                cpu.write_kv(layer, np.arange(16 * 16, 16 * 16 + n - 1, dtype=np.int32), k, v)
            imported = cpu_forward(cpu, ids, start=n - 1, first_block=16)
            errors.append(float(np.abs(imported - own).max()))
            if torch_model is model:
                assert imported.argmax() == own.argmax()
        assert errors[0] < 2.0 and errors[1] > 5.0, errors


GREEDY_PROMPTS = [
    "The capital of France is", "def fibonacci(n):", "Once upon a time, there was a",
    "1, 2, 3, 4,", "The largest planet in the solar system is",
    "Water boils at a temperature of", "import numpy as np\nx =", "My favourite food is",
    "In 1492, Columbus", "To make a cup of tea, first boil the water, then",
]


def test_greedy_next_token_agrees_with_the_cpu_engine(smollm2, cpu_pool):
    """Measured: all ten agree (the chat prompt of the e2e tests is a near-tie the two break
    differently: 0.005 logits apart in the CPU engine, whose 8-bit activations put it within
    0.7 of the float reference, which the torch model matches to 1e-4)."""
    model, tok = smollm2
    cpu, _, _ = load_model(default_model(), cpu_pool, kernels=BATCH_INVARIANT)
    cpu.alloc_kv(16, 16)
    pool = model.new_pool(1024)
    prompts = [tok.encode(text) for text in GREEDY_PROMPTS]
    chunks = [Chunk(ids, 0, pool.allocate(pool.blocks_for(len(ids)))) for ids in prompts]
    ours = model.forward(chunks, pool).argmax(-1).tolist()  # one batch of all ten prompts
    agree = 0
    for ids, token in zip(prompts, ours, strict=True):
        theirs = cpu_forward(cpu, ids)
        if theirs.argmax() == token:
            agree += 1
        else:  # only a near-tie in the CPU engine's own logits may differ
            assert theirs.max() - theirs[token] < 0.25, tok.decode(ids)
    assert agree >= 9, agree
