"""A float32 numpy llama forward pass straight from the GGUF tensors (read and dequantized by the
gguf package's own reader, independently of the engine's loader): the float reference the CPU
engine's logits are compared with. Slow and simple."""

from __future__ import annotations

import numpy as np
from gguf import GGUFReader, quants

from heteroserve_engines.cpu_engine.gguf_file import GGUFFile
from heteroserve_engines.cpu_engine.gguf_model import read_config


def _dense(reader: GGUFReader, name: str) -> np.ndarray:
    tensor = next(t for t in reader.tensors if t.name == name)
    data = quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
    shape = [int(s) for s in reversed(tensor.shape)]
    return data.reshape(shape)


def _rope(x: np.ndarray, positions: np.ndarray, base: float, neox: bool) -> np.ndarray:
    _, _, dim = x.shape  # (tokens, heads, head_dim)
    freqs = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = positions[:, None].astype(np.float64) * freqs[None, :]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    if neox:
        a, b = x[..., : dim // 2], x[..., dim // 2:]
    else:
        a, b = x[..., 0::2], x[..., 1::2]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    out = np.empty_like(x)
    if neox:
        out[..., : dim // 2], out[..., dim // 2:] = ra, rb
    else:
        out[..., 0::2], out[..., 1::2] = ra, rb
    return out


def logits(model_file: GGUFFile, tokens: list[int]) -> np.ndarray:
    """Logits for every position of `tokens` (causal), float32 math on dequantized weights."""
    c = read_config(model_file)
    reader = GGUFReader(model_file.path)
    names = {t.name for t in reader.tensors}
    embd = _dense(reader, "token_embd.weight")
    output = _dense(reader, "output.weight") if "output.weight" in names else embd
    x = embd[np.array(tokens)]
    n = len(tokens)
    pos = np.arange(n)
    mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)

    def norm(v, w):
        return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + c.eps) * w

    for layer in range(c.n_layer):
        p = f"blk.{layer}."
        h = norm(x, _dense(reader, p + "attn_norm.weight"))
        q = h @ _dense(reader, p + "attn_q.weight").T
        k = h @ _dense(reader, p + "attn_k.weight").T
        v = h @ _dense(reader, p + "attn_v.weight").T
        if p + "attn_q.bias" in names:
            q += _dense(reader, p + "attn_q.bias")
            k += _dense(reader, p + "attn_k.bias")
            v += _dense(reader, p + "attn_v.bias")
        q = _rope(q.reshape(n, c.n_head, c.head_dim), pos, c.rope_base, bool(c.rope_neox))
        k = _rope(k.reshape(n, c.n_head_kv, c.head_dim), pos, c.rope_base, bool(c.rope_neox))
        v = v.reshape(n, c.n_head_kv, c.head_dim)
        group = c.n_head // c.n_head_kv
        out = np.empty((n, c.n_head, c.head_dim), dtype=np.float32)
        for head in range(c.n_head):
            scores = q[:, head] @ k[:, head // group].T / np.sqrt(c.head_dim) + mask
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            out[:, head] = scores @ v[:, head // group]
        x = x + out.reshape(n, -1) @ _dense(reader, p + "attn_output.weight").T
        h = norm(x, _dense(reader, p + "ffn_norm.weight"))
        gate = h @ _dense(reader, p + "ffn_gate.weight").T
        up = h @ _dense(reader, p + "ffn_up.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ _dense(reader, p + "ffn_down.weight").T
    return norm(x, _dense(reader, "output_norm.weight")) @ output.T
