"""GGUF llama-family models (Llama, Qwen2, SmolLM2) loaded into the compiled runner.

Weights in q4_0, q4_1, q8_0, f16 or f32 load as they are, each tensor mapped from the file and
copied (or repacked) by the pool threads that will compute with it; `quantization` requantizes
every 2-D weight to q8_0 or q4_0 (the seeds' SYSHAX_QUANTIZE) through the gguf package's
reference quantizers. Other GGUF types are dequantized first (gguf and numpy are imported only
then: serving a q4_0/q4_1/q8_0 file needs neither).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import heteroserve_cpu

from .gguf_file import BLOCKS, F32, Q4_0, Q8_0, GGUFFile, GGUFFormatError

ARCHITECTURES = {"llama": 0, "qwen2": 1}  # value: RoPE NeoX layout
NATIVE = set(BLOCKS)  # loaded as they are
TARGETS = {"q8_0": Q8_0, "q4_0": Q4_0}
LAYER_TENSORS = {"attn_q": 10, "attn_k": 11, "attn_v": 12, "attn_output": 13, "ffn_gate": 14,
                 "ffn_up": 15, "ffn_down": 16, "attn_norm": 17, "ffn_norm": 18}
LAYER_BIASES = {"attn_q": 19, "attn_k": 20, "attn_v": 21}


class ModelFileError(ValueError):
    """The model file is missing, unreadable or not a supported GGUF model."""


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    context_length: int
    eps: float
    rope_base: float
    name: str

    @property
    def rope_neox(self) -> int:
        return ARCHITECTURES[self.architecture]


def _field(reader: GGUFFile, key: str, default=None):
    value = reader.get(key)
    if value is None:
        if default is None:
            raise ModelFileError(f"GGUF metadata {key!r} is missing")
        return default
    return value


def open_gguf(path: str | Path) -> GGUFFile:
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"model file {path} does not exist")
    try:
        return GGUFFile.open(path)
    except (GGUFFormatError, OSError, UnicodeDecodeError) as error:
        raise ModelFileError(f"{path} is not a readable GGUF file: {error}") from error


def read_config(reader: GGUFFile) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelFileError(f"architecture {arch!r} is not supported (llama, qwen2)")
    n_embd = int(_field(reader, f"{arch}.embedding_length"))
    n_head = int(_field(reader, f"{arch}.attention.head_count"))
    vocab = reader.get(f"{arch}.vocab_size")
    n_vocab = int(vocab) if vocab is not None else reader.length("tokenizer.ggml.tokens") or 0
    return ModelConfig(
        architecture=arch,
        n_layer=int(_field(reader, f"{arch}.block_count")),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=int(_field(reader, f"{arch}.attention.head_count_kv", n_head)),
        head_dim=int(_field(reader, f"{arch}.rope.dimension_count", n_embd // n_head)),
        n_ff=int(_field(reader, f"{arch}.feed_forward_length")),
        n_vocab=n_vocab,
        context_length=int(_field(reader, f"{arch}.context_length", 2048)),
        eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_base=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        name=str(_field(reader, "general.name", "model")),
    )


def _set_tensor(model, which: int, layer: int, tensor, quantization: str | None,
                fd: int) -> None:
    """Hands one tensor to the model, requantized when asked.

    Native tensors are mapped read-only and unmapped once the model has its copy: a mapping
    keeps no memory after it, whereas bytes read into the Python heap would leave the heap as
    large as the largest tensor."""
    kind = tensor.tensor_type
    cols = int(tensor.shape[0])
    rows = int(tensor.shape[1]) if len(tensor.shape) == 2 else 1
    target = TARGETS.get(quantization or "")
    start = tensor.data_offset - tensor.data_offset % mmap.ALLOCATIONGRANULARITY
    with mmap.mmap(fd, tensor.data_offset + tensor.n_bytes - start, access=mmap.ACCESS_READ,
                   offset=start) as mapped, memoryview(mapped) as view, \
            view[tensor.data_offset - start:] as data:
        if kind in NATIVE and (len(tensor.shape) != 2 or target is None or kind == target):
            model.set(which, layer, kind, rows, cols, data)
            return
        kind, blob = _converted(data, kind, rows, cols, target, len(tensor.shape) == 2)
    model.set(which, layer, kind, rows, cols, blob)


def _converted(data: memoryview, kind: int, rows: int, cols: int, target: int | None,
               two_d: bool):
    """(type, bytes) of a tensor in a type the engine computes with: dequantized through the
    gguf package, then quantized to `target` (q8_0 when no target was asked)."""
    import numpy as np
    from gguf import GGMLQuantizationType, quants

    raw = np.frombuffer(data, dtype=np.uint8).reshape(rows, -1)
    dense = quants.dequantize(raw, GGMLQuantizationType(kind)).astype(np.float32)
    if not two_d:
        return F32, dense.reshape(-1).view(np.uint8)
    target = target or Q8_0
    blob = quants.quantize(dense.reshape(rows, cols), GGMLQuantizationType(target))
    return target, np.ascontiguousarray(blob).view(np.uint8).reshape(-1)


def load_model(path: str | Path, pool: heteroserve_cpu.Pool, *, quantization: str | None = None,
               kernels: str = "", nrc: int = 0) -> tuple[heteroserve_cpu.Model, ModelConfig,
                                                        GGUFFile]:
    if quantization not in (None, "q8_0", "q4_0"):
        raise ValueError(f"quantization must be q8_0 or q4_0, not {quantization!r}")
    reader = open_gguf(path)
    config = read_config(reader)
    model = heteroserve_cpu.Model(
        pool, config.n_layer, config.n_embd, config.n_head, config.n_head_kv, config.head_dim,
        config.n_ff, config.n_vocab, config.rope_neox, config.eps, config.rope_base, kernels, nrc)
    seen = set()
    fd = os.open(path, os.O_RDONLY)
    try:
        _load_tensors(model, reader, quantization, fd, seen, path)
    finally:
        os.close(fd)
    missing = [n for n in ("token_embd.weight", "output_norm.weight") if n not in seen]
    if missing:
        raise ModelFileError(f"{path}: tensors missing: {missing}")
    return model, config, reader


def _load_tensors(model, reader: GGUFFile, quantization: str | None, fd: int, seen: set,
                  path) -> None:
    for tensor in reader.tensors:
        name = tensor.name
        parts = name.split(".")
        if name == "token_embd.weight":
            which, layer = 0, -1
        elif name == "output.weight":
            which, layer = 1, -1
        elif name == "output_norm.weight":
            which, layer = 2, -1
        elif parts[0] == "blk" and parts[-1] == "weight" and parts[2] in LAYER_TENSORS:
            which, layer = LAYER_TENSORS[parts[2]], int(parts[1])
        elif parts[0] == "blk" and parts[-1] == "bias" and parts[2] in LAYER_BIASES:
            which, layer = LAYER_BIASES[parts[2]], int(parts[1])
        else:
            continue  # e.g. rope_freqs: not used by these architectures' defaults
        try:
            _set_tensor(model, which, layer, tensor,
                        quantization if which not in (0, 2) and which < 17 else None, fd)
        except ValueError as error:
            raise ModelFileError(f"{path}: tensor {name}: {error}") from error
        seen.add(name)
