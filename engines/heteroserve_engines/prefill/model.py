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

Activation quantization (`activation_quantization`, the engine's `--activation-quantization`):

- `none` (the default): float activations, K/V in the model's dtype (the float reference's
  arithmetic, to float rounding).
- `q8`: the CPU engine's own numerics. Every product with a quantized weight (q4_0, q4_1, q8_0;
  other non-native types, which the CPU engine requantizes to q8_0 - the weights here follow
  it) takes its input as the CPU engine quantizes it (engines/cpu/src/ref.c `quantize_act_ref`,
  every SIMD variant alike): per block of 32 values a float32 scale `d = max|x| / 127`, values
  `nearbyint(x * (127 / max|x|))` (round half to even), in float32 here before the cast to the
  model's dtype; the product then sees `q * d`. That is the input of the Q, K, V projections,
  the attention output projection, gate and up, down, and the LM head (when its weight is
  quantized: SmolLM2's tied q8_0 embedding is). K and V are rounded to float16 (the CPU
  engine's cache) before anything attends to them; Q stays in the model's dtype (float32 in the
  CPU engine).

  What still differs is float rounding: summation orders (RMSNorm's sum of squares, the
  products' per-block sums, which also differ between the CPU engine's own kernel variants),
  exp, cos and sin. Where no value crosses an 8-bit rounding boundary the result is the CPU
  engine's to float rounding (a two-layer synthetic Qwen2: logits within 1e-5, float
  activations 0.19 off). On SmolLM2 about half of the tokens already have one of their 576
  RMSNorm outputs on the other side of a boundary in the first layer, and each such step
  spreads into whole 8-bit steps in the next products: past the first layer, the K/V and
  logits are as far from the CPU engine's as float ones are, and as far as its own kernel
  variants are from each other (~0.8 logits at the first decoded token). Greedy continuations
  of imported KV then follow the CPU engine alone's to its first near-tie in either mode
  (tests/e2e/test_split_prefill.py). q8 also costs the engine's own batch invariance: the same
  sequence in another batch shape can cross a boundary and take another greedy path at a
  near-tie, as the CPU engine's matrix-unit kernels can (tests/variants.py).
- `avx512vnni`: the CPU engine's avx512vnni kernels bit for bit (prefill/exact.py): every
  operation of engines/cpu/src/model.c and that kernel table repeated in the same order with
  the same roundings, so K/V rows and logits equal the CPU engine's exactly, on any torch
  device. Slow next to the float path (float64 emulation of fused multiply-adds, sequential
  per-lane sums) and one sequence at a time; what a hand-off needs when its continuation must
  be the CPU engine alone's. The decode engines run `--kernels avx512vnni`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..cpu_engine.gguf_file import GGUFFile
from ..cpu_engine.gguf_model import ModelConfig, open_gguf, read_config
from . import exact as exact_numerics
from .kv_pool import KvPool
from .weights import LayerWeights, Weights, load_weights


@dataclass(frozen=True)
class Chunk:
    """New tokens of one sequence: positions start .. start+len(tokens)-1, the sequence's KV
    slots in `blocks` (enough for every position up to the last new one)."""

    tokens: list[int]
    start: int
    blocks: list[int]


ACTIVATION_QUANTIZATIONS = ("q8", "none", *exact_numerics.VARIANTS)
QK = 32  # values per activation block (engines/cpu/src/blocks.h HS_QK)


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: Weights | None, device: torch.device,
                 dtype: torch.dtype, activation_quantization: str = "none",
                 exact: exact_numerics.ExactModel | None = None):
        if activation_quantization not in ACTIVATION_QUANTIZATIONS:
            raise ValueError(f"activation_quantization must be one of "
                             f"{ACTIVATION_QUANTIZATIONS}, not {activation_quantization!r}")
        self.config, self.weights, self.device, self.dtype = config, weights, device, dtype
        self.activation_quantization = activation_quantization
        self.exact = exact
        self.q8 = activation_quantization == "q8"
        half = config.head_dim // 2
        exponents = -2.0 * torch.arange(half, dtype=torch.float32) / config.head_dim
        self.inv_freq = torch.pow(torch.tensor(config.rope_base, dtype=torch.float32),
                                  exponents).to(device)

    @classmethod
    def from_gguf(cls, path: str | Path, device: torch.device, dtype: torch.dtype,
                  activation_quantization: str = "none", decode_quantization: str | None = None
                  ) -> tuple[LlamaModel, GGUFFile]:
        if activation_quantization not in ACTIVATION_QUANTIZATIONS:
            raise ValueError(f"activation_quantization must be one of "
                             f"{ACTIVATION_QUANTIZATIONS}, not {activation_quantization!r}")
        reader = open_gguf(path)
        config = read_config(reader)
        if activation_quantization in exact_numerics.VARIANTS:
            if dtype not in (torch.float32, torch.float16):
                raise ValueError(f"--activation-quantization {activation_quantization} keeps "
                                 f"the CPU engine's float16 K/V: the dtype must be float32 or "
                                 f"float16, not {str(dtype).removeprefix('torch.')}")
            exact = exact_numerics.ExactModel(reader, config, device, activation_quantization,
                                              decode_quantization)
            return cls(config, None, device, dtype, activation_quantization, exact), reader
        weights = load_weights(reader, config, device, dtype,
                               cpu_engine_weights=activation_quantization == "q8")
        return cls(config, weights, device, dtype, activation_quantization), reader

    @property
    def weight_bytes(self) -> int:
        return self.exact.bytes if self.exact is not None else self.weights.bytes

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
        if self.exact is not None:
            return self._forward_exact(chunks, pool)
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
            hq = self._input(h, "attn_q", layer)
            q = _linear(hq, layer.attn_q, layer.bias_q).view(n, c.n_head, c.head_dim)
            k = _linear(self._input(h, "attn_k", layer, hq), layer.attn_k, layer.bias_k)
            v = _linear(self._input(h, "attn_v", layer, hq), layer.attn_v, layer.bias_v)
            k, v = k.view(n, c.n_head_kv, c.head_dim), v.view(n, c.n_head_kv, c.head_dim)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            k, v = self._cached(k), self._cached(v)
            pool.data[index, 0].index_copy_(0, slots, k.reshape(n, -1))
            pool.data[index, 1].index_copy_(0, slots, v.reshape(n, -1))
            if paged is None:
                out = self._attend_prompts(q, k, v, lengths)
            else:
                out = paged.attend(q, pool.data[index], c)
            x = x + (self._input(out, "attn_output", layer) @ layer.attn_output.T).float()
            h = self._norm(x, layer.ffn_norm)
            hq = self._input(h, "ffn_gate", layer)
            act = F.silu(hq @ layer.ffn_gate.T) * (self._input(h, "ffn_up", layer, hq)
                                                   @ layer.ffn_up.T)
            x = x + (self._input(act, "ffn_down", layer) @ layer.ffn_down.T).float()
        last = torch.tensor(lengths, device=dev).cumsum(0) - 1
        head = self._norm(x[last], w.output_norm)
        if self.q8 and w.output_quantized:
            head = quantize_q8(head).to(self.dtype)
        return (head @ w.output.T).float()

    def _forward_exact(self, chunks: list[Chunk], pool: KvPool) -> torch.Tensor:
        """The CPU engine's own arithmetic (exact.py), one chunk after another: each reads its
        earlier positions' K/V from the pool and writes its new ones."""
        logits = []
        for ch in chunks:
            earlier = torch.tensor(pool.slots(ch.blocks, 0, ch.start), dtype=torch.long,
                                   device=self.device)
            keys = [pool.data[layer, 0].index_select(0, earlier)
                    for layer in range(self.config.n_layer)]
            values = [pool.data[layer, 1].index_select(0, earlier)
                      for layer in range(self.config.n_layer)]
            last, new_k, new_v = self.exact.forward(ch.tokens, ch.start, keys, values)
            slots = torch.tensor(pool.slots(ch.blocks, ch.start, ch.start + len(ch.tokens)),
                                 dtype=torch.long, device=self.device)
            for layer in range(self.config.n_layer):
                pool.data[layer, 0].index_copy_(0, slots, new_k[layer].to(pool.data.dtype))
                pool.data[layer, 1].index_copy_(0, slots, new_v[layer].to(pool.data.dtype))
            logits.append(last)
        return torch.stack(logits)

    def _input(self, x: torch.Tensor, matrix: str, layer: LayerWeights,
               shared: torch.Tensor | None = None) -> torch.Tensor:
        """A product's input as the CPU engine feeds it to `matrix`: 8-bit blocks (q8) for a
        quantized weight, else as it is. `shared`: the same input already quantized for a
        sibling product (Q/K/V, gate/up share theirs in the CPU engine too)."""
        if not (self.q8 and matrix in layer.quantized):
            return x
        return shared if shared is not None and shared is not x else quantize_q8(x).to(self.dtype)

    def _cached(self, x: torch.Tensor) -> torch.Tensor:
        """K or V as the CPU engine's float16 cache holds them (q8), in the model's dtype."""
        if not self.q8 or self.dtype == torch.float16:
            return x
        return x.to(torch.float16).to(self.dtype)

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


def quantize_q8(x: torch.Tensor) -> torch.Tensor:
    """x (rows of a multiple of 32 values) as the CPU engine's 8-bit activation blocks see it,
    dequantized, in float32: per block d = max|x| / 127, q = round-half-even(x * (127 / max|x|))
    (0 for an all-zero block), q * d. The same float32 operations as quantize_act_ref, so the
    same q for the same x."""
    shape = x.shape
    q, d, _ = exact_numerics.q8_blocks(x.float().reshape(*shape[:-1], shape[-1] // QK, QK))
    return (q * d[..., None]).reshape(shape)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = x @ weight.T
    return out if bias is None else out + bias
