"""Llama-shaped GGUF files with random weights, written with the `gguf` package: the benchmark's
synthetic models and the small ones of the tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, quants

FILE_TYPES = {GGMLQuantizationType.Q4_0: 2, GGMLQuantizationType.Q8_0: 7}


def write_llama(path: Path, *, n_layer: int, n_embd: int, n_head: int, n_kv: int, n_ff: int,
                vocab: int, qtype: GGMLQuantizationType, std: float = 0.02, untied: bool = False,
                tokenizer: dict | None = None, name: str = "synthetic llama") -> Path:
    """Every matrix random (normal, `std`, numpy seed 0) in `qtype`; norms of ones. `untied`: an
    `output.weight` head of its own (as Llama and TinyLlama have) instead of the embedding table.
    `tokenizer`: GGUF tokenizer fields (pre, tokens, token_type, merges) so that llama.cpp loads
    the file; without them only token ids can be given."""
    writer = GGUFWriter(str(path), "llama")
    writer.add_name(name)
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
    if tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(tokenizer["tokenizer.ggml.pre"])
        writer.add_token_list(tokenizer["tokenizer.ggml.tokens"])
        writer.add_token_types(tokenizer["tokenizer.ggml.token_type"])
        writer.add_token_merges(tokenizer["tokenizer.ggml.merges"])
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
    rng = np.random.default_rng(0)

    def add(name: str, rows: int, cols: int) -> None:
        weights = rng.standard_normal((rows, cols), dtype=np.float32) * std
        writer.add_tensor(name, quants.quantize(weights, qtype), raw_dtype=qtype)

    add("token_embd.weight", vocab, n_embd)
    if untied:
        add("output.weight", vocab, n_embd)
    writer.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    head = n_embd // n_head
    for layer in range(n_layer):
        p = f"blk.{layer}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(n_embd, np.float32))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, np.float32))
        for tensor, rows, cols in (("attn_q", n_embd, n_embd), ("attn_k", n_kv * head, n_embd),
                                   ("attn_v", n_kv * head, n_embd),
                                   ("attn_output", n_embd, n_embd), ("ffn_gate", n_ff, n_embd),
                                   ("ffn_up", n_ff, n_embd), ("ffn_down", n_embd, n_ff)):
            add(p + tensor + ".weight", rows, cols)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
