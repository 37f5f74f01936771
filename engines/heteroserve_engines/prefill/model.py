"""The llama-family forward pass (Llama, Qwen2, SmolLM2) in PyTorch, over a batch of sequences.

A step computes `Chunk`s: some new tokens of a sequence from position `start` on, whose earlier
positions are already in the KV pool. The projections and the MLP run on all tokens of the step
at once; K (after RoPE) and V of every new token are written into the sequence's slots of the
pool before attention. Attention is `scaled_dot_product_attention`:

- a step of whole prompts (every `start` is 0) attends within each prompt, causally, from the
  fresh K/V (one call per prompt: no padding, so the device's flash kernel applies);
- any other step (decode: one token per sequence) gathers each sequence's K/V from the pool into
  a padded batch with a mask of its length and causality; the query heads sharing a KV head are
  folded into the query length, so K/V are never repeated per query head.

The arithmetic follows the CPU engine's (engines/cpu/src/model.c) so that K/V rows and logits
agree with it: RMSNorm and RoPE in float32, RoPE angles `position * rope_base^(-2i/head_dim)` in
float32, pairs (x[2i], x[2i+1]) for llama (GGUF's Q/K row order) or halves (x[i],
x[i + head_dim/2]) for Qwen2, the residual stream in float32, products in the model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..cpu_engine.gguf_file import GGUFFile
from ..cpu_engine.gguf_model import ModelConfig, open_gguf, read_config
from .kv_pool import KvPool
from .weights import Weights, load_weights


@dataclass(frozen=True)
class Chunk:
    """New tokens of one sequence: positions start .. start+len(tokens)-1, the sequence's KV
    slots in `blocks` (enough for every position up to the last new one)."""

    tokens: list[int]
    start: int
    blocks: list[int]


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: Weights, device: torch.device,
                 dtype: torch.dtype):
        self.config, self.weights, self.device, self.dtype = config, weights, device, dtype
        half = config.head_dim // 2
        exponents = -2.0 * torch.arange(half, dtype=torch.float32) / config.head_dim
        self.inv_freq = torch.pow(torch.tensor(config.rope_base, dtype=torch.float32),
                                  exponents).to(device)

    @classmethod
    def from_gguf(cls, path: str | Path, device: torch.device, dtype: torch.dtype
                  ) -> tuple[LlamaModel, GGUFFile]:
        reader = open_gguf(path)
        config = read_config(reader)
        return cls(config, load_weights(reader, config, device, dtype), device, dtype), reader

    @property
    def kv_dim(self) -> int:
        return self.config.n_head_kv * self.config.head_dim

    def kv_bytes_per_token(self) -> int:
        return 2 * self.config.n_layer * self.kv_dim * self.dtype.itemsize

    def new_pool(self, budget_tokens: int) -> KvPool:
        return KvPool(self.config.n_layer, self.kv_dim, budget_tokens, self.device, self.dtype)

    @torch.inference_mode()
    def forward(self, chunks: list[Chunk], pool: KvPool) -> torch.Tensor:
        """Logits (float32, [len(chunks), n_vocab]) of each chunk's last token; K/V of every
        new token land in the pool."""
        c, w, dev = self.config, self.weights, self.device
        lengths = [len(ch.tokens) for ch in chunks]
        tokens = torch.tensor([t for ch in chunks for t in ch.tokens], device=dev)
        positions = torch.tensor([p for ch in chunks
                                  for p in range(ch.start, ch.start + len(ch.tokens))],
                                 dtype=torch.float32, device=dev)
        slots = torch.tensor([s for ch in chunks
                              for s in pool.slots(ch.blocks, ch.start, ch.start + len(ch.tokens))],
                             dtype=torch.long, device=dev)
        angles = positions[:, None] * self.inv_freq[None, :]
        cos, sin = torch.cos(angles)[:, None, :], torch.sin(angles)[:, None, :]
        prompts_only = all(ch.start == 0 for ch in chunks)
        paged = None if prompts_only else _PagedBatch(chunks, pool, dev)
        n = tokens.numel()
        x = w.token_embd[tokens].float()
        for index, layer in enumerate(w.layers):
            h = self._norm(x, layer.attn_norm)
            q = _linear(h, layer.attn_q, layer.bias_q).view(n, c.n_head, c.head_dim)
            k = _linear(h, layer.attn_k, layer.bias_k).view(n, c.n_head_kv, c.head_dim)
            v = _linear(h, layer.attn_v, layer.bias_v).view(n, c.n_head_kv, c.head_dim)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            pool.data[index, 0].index_copy_(0, slots, k.reshape(n, -1))
            pool.data[index, 1].index_copy_(0, slots, v.reshape(n, -1))
            if paged is None:
                out = self._attend_prompts(q, k, v, lengths)
            else:
                out = paged.attend(q, pool.data[index], c)
            x = x + (out @ layer.attn_output.T).float()
            h = self._norm(x, layer.ffn_norm)
            x = x + ((F.silu(h @ layer.ffn_gate.T) * (h @ layer.ffn_up.T)) @ layer.ffn_down.T
                     ).float()
        last = torch.tensor(lengths, device=dev).cumsum(0) - 1
        return (self._norm(x[last], w.output_norm) @ w.output.T).float()

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.config.eps)
        return (x * scale * weight.float()).to(self.dtype)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x.float()
        half = self.config.head_dim // 2
        if self.config.rope_neox:
            a, b = x[..., :half], x[..., half:]
            return torch.cat((a * cos - b * sin, a * sin + b * cos), -1).to(self.dtype)
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2).to(self.dtype)

    def _attend_prompts(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        lengths: list[int]) -> torch.Tensor:
        group = self.config.n_head // self.config.n_head_kv
        outs = []
        for qi, ki, vi in zip(q.split(lengths), k.split(lengths), v.split(lengths), strict=True):
            keys, values = (t.repeat_interleave(group, dim=1).transpose(0, 1) for t in (ki, vi))
            out = F.scaled_dot_product_attention(qi.transpose(0, 1), keys, values,
                                                 is_causal=True)
            outs.append(out.transpose(0, 1).reshape(qi.shape[0], -1))
        return torch.cat(outs)


class _PagedBatch:
    """A step's sequences as a padded batch over the pool: per sequence its new tokens (queries,
    padded to the longest) and every position up to its last (keys, padded to the longest),
    with the mask that hides padding and the future. Built once per step, used by each layer."""

    def __init__(self, chunks: list[Chunk], pool: KvPool, device: torch.device):
        size = pool.block_size
        starts = torch.tensor([ch.start for ch in chunks])
        lengths = torch.tensor([len(ch.tokens) for ch in chunks])
        totals = starts + lengths
        self.batch, self.n_queries = len(chunks), int(lengths.max())
        n_keys = int(totals.max())
        width = -(-n_keys // size)
        # Block tables padded with each sequence's own first block: padded keys read its slots
        # (finite values, masked out), never another sequence's or an unwritten pool's.
        tables = torch.tensor([ch.blocks[:width] + [ch.blocks[0]] * (width - len(ch.blocks[:width]))
                               for ch in chunks])
        positions = torch.arange(n_keys)
        self.gather = (tables[:, positions // size] * size + positions % size).to(device)
        # Query i of a sequence sees positions up to start + i; padded queries see the whole
        # sequence (a row of nothing would be NaN).
        seen = torch.minimum(starts[:, None] + torch.arange(self.n_queries)[None, :],
                             totals[:, None] - 1)
        self.mask = (positions[None, None, :] <= seen[:, :, None]).to(device)
        self.rows = torch.repeat_interleave(torch.arange(self.batch), lengths).to(device)
        self.cols = torch.cat([torch.arange(int(n)) for n in lengths]).to(device)

    def attend(self, q: torch.Tensor, layer_kv: torch.Tensor, c: ModelConfig) -> torch.Tensor:
        group, n_q, b = c.n_head // c.n_head_kv, self.n_queries, self.batch
        padded = q.new_zeros(b, n_q, c.n_head, c.head_dim)
        padded[self.rows, self.cols] = q
        # [b, n_q, kv heads, group, d] -> [b, kv heads, group * n_q, d]
        queries = padded.view(b, n_q, c.n_head_kv, group, c.head_dim).permute(0, 2, 3, 1, 4)
        queries = queries.reshape(b, c.n_head_kv, group * n_q, c.head_dim)
        keys, values = (layer_kv[i][self.gather].view(b, -1, c.n_head_kv, c.head_dim)
                        .transpose(1, 2) for i in (0, 1))
        mask = self.mask[:, None, None].expand(b, 1, group, n_q, self.mask.shape[-1])
        out = F.scaled_dot_product_attention(queries, keys, values,
                                             attn_mask=mask.reshape(b, 1, group * n_q, -1))
        out = out.view(b, c.n_head_kv, group, n_q, c.head_dim).permute(0, 3, 1, 2, 4)
        return out.reshape(b, n_q, -1)[self.rows, self.cols]


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = x @ weight.T
    return out if bias is None else out + bias
