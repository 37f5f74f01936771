"""GGUF tensors -> dense torch tensors on the device, dequantized on load.

Blocks are dequantized with the `gguf` package's numpy reference (the same definition the CPU
engine's kernels are tested bit-exact against), one tensor at a time, so the host holds at most
one tensor in float32. Q and K keep GGUF's row order: llama.cpp's converter permutes them for
RoPE on adjacent pairs, the convention the CPU engine's cache (and so the hand-off) uses;
transformers' GGUF loader would undo that permutation (HF's halves layout), so it is not used.

With `cpu_engine_weights` the matrices are those the CPU engine computes with: it loads q4_0,
q4_1, q8_0, f16 and f32 tensors as they are and requantizes any other type to q8_0 (the gguf
package's quantizer, `gguf_model._converted`), so such a tensor is requantized here too before
it is dequantized. Each matrix also records whether the CPU engine quantizes its products'
activations (it does for every quantized weight type, not for f16/f32 weights).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from ..cpu_engine.gguf_file import BLOCKS, F16, F32, GGUFFile, TensorInfo
from ..cpu_engine.gguf_model import ModelConfig, ModelFileError

MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
NORMS = ("attn_norm", "ffn_norm")
BIASES = ("attn_q", "attn_k", "attn_v")  # Qwen2


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor
    ffn_norm: torch.Tensor
    attn_q: torch.Tensor       # [n_head * head_dim, n_embd]: torch's Linear layout (out, in)
    attn_k: torch.Tensor
    attn_v: torch.Tensor
    attn_output: torch.Tensor
    ffn_gate: torch.Tensor
    ffn_up: torch.Tensor
    ffn_down: torch.Tensor
    bias_q: torch.Tensor | None = None
    bias_k: torch.Tensor | None = None
    bias_v: torch.Tensor | None = None
    # The matrices (MATRICES names) whose products the CPU engine computes from 8-bit
    # activations: those of a quantized type in the file.
    quantized: frozenset[str] = frozenset()


@dataclass
class Weights:
    token_embd: torch.Tensor   # [n_vocab, n_embd]
    output: torch.Tensor       # the LM head; the embedding table itself when tied
    output_norm: torch.Tensor
    layers: list[LayerWeights]
    output_quantized: bool = False  # the LM head's product takes 8-bit activations

    @property
    def bytes(self) -> int:
        tensors = [self.token_embd, self.output_norm]
        if self.output.data_ptr() != self.token_embd.data_ptr():
            tensors.append(self.output)
        for layer in self.layers:
            tensors += [t for t in vars(layer).values() if isinstance(t, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in tensors)


def quantized_type(tensor: TensorInfo) -> bool:
    """Whether the CPU engine multiplies this weight with 8-bit activations (any type but
    f16/f32: the other non-native types become q8_0 at its load)."""
    return tensor.tensor_type not in (F32, F16)


def dequantize(mapped: np.ndarray, tensor: TensorInfo, cpu_engine_weights: bool = False
               ) -> np.ndarray:
    """One tensor as float32 in torch's order (rows first: GGUF lists the row length first);
    with `cpu_engine_weights` a 2-D tensor of a type the CPU engine does not load as it is goes
    through q8_0 first, as it does there."""
    raw = mapped[tensor.data_offset:tensor.data_offset + tensor.n_bytes]
    rows = 1
    for dim in tensor.shape[1:]:
        rows *= int(dim)
    dense = quants.dequantize(raw.reshape(rows, -1), GGMLQuantizationType(tensor.tensor_type))
    dense = np.asarray(dense, dtype=np.float32)
    if cpu_engine_weights and len(tensor.shape) == 2 and tensor.tensor_type not in BLOCKS:
        q8 = GGMLQuantizationType.Q8_0
        dense = np.asarray(quants.dequantize(quants.quantize(dense.reshape(rows, -1), q8), q8),
                           dtype=np.float32)
    if not dense.flags.writeable:  # an f32 tensor comes back as a view of the read-only map
        dense = dense.copy()
    return dense.reshape([int(d) for d in reversed(tensor.shape)])


def load_weights(reader: GGUFFile, config: ModelConfig, device: torch.device,
                 dtype: torch.dtype, cpu_engine_weights: bool = False) -> Weights:
    mapped = np.memmap(reader.path, dtype=np.uint8, mode="r")
    by_name = {t.name: t for t in reader.tensors}

    def get(name: str, required: bool = True) -> torch.Tensor | None:
        tensor = by_name.get(name)
        if tensor is None:
            if required:
                raise ModelFileError(f"{reader.path}: tensor {name} is missing")
            return None
        try:
            dense = dequantize(mapped, tensor, cpu_engine_weights)
        except (ValueError, NotImplementedError) as error:
            raise ModelFileError(f"{reader.path}: tensor {name}: {error}") from error
        return torch.from_numpy(dense).to(device=device, dtype=dtype)

    layers = []
    for index in range(config.n_layer):
        p = f"blk.{index}."
        found = {name: get(p + name + ".weight") for name in MATRICES + NORMS}
        biases = {"bias_" + name[-1]: get(p + name + ".bias", required=False)
                  for name in BIASES}
        quantized = frozenset(name for name in MATRICES
                              if quantized_type(by_name[p + name + ".weight"]))
        layers.append(LayerWeights(**found, **biases, quantized=quantized))
    embd = get("token_embd.weight")
    output = get("output.weight", required=False)
    head = by_name["output.weight" if output is not None else "token_embd.weight"]
    return Weights(token_embd=embd, output=embd if output is None else output,
                   output_norm=get("output_norm.weight"), layers=layers,
                   output_quantized=quantized_type(head))
