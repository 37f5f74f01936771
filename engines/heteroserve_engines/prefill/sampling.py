"""Next-token sampling, with the CPU engine's definitions (docs/cpu-engine.md#sampling):
`temperature` <= 1e-6 is greedy (the first of the largest logits); otherwise top-k keeps the k
largest logits (ties at the k-th kept), the softmax at the temperature follows, and top-p keeps
the most probable tokens whose mass first reaches `top_p`. Draws come from the sequence's own
seeded generator, so a request's `seed` makes its output repeatable (the streams differ from the
CPU engine's splitmix64: the same seed gives the same tokens within an engine, not across).

Greedy rows are chosen on the device; only the rows that draw move to the host.
"""

from __future__ import annotations

import torch

GREEDY_BELOW = 1e-6


def new_generator(seed: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def probabilities(logits: torch.Tensor, temperature: float, top_k: int, top_p: float
                  ) -> torch.Tensor:
    """The distribution one row draws from (float64, on the host)."""
    logits = logits.double()
    if 0 < top_k < logits.numel():
        cutoff = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < cutoff, float("-inf"))
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True, stable=True)
        cumulative = ordered.cumsum(0)
        keep = int(torch.searchsorted(cumulative, top_p * cumulative[-1])) + 1
        kept = torch.zeros_like(probs)
        kept[order[:keep]] = ordered[:keep]
        probs = kept / kept.sum()
    return probs


def sample(logits: torch.Tensor, temperature: list[float], top_k: list[int], top_p: list[float],
           generators: list[torch.Generator]) -> list[int]:
    """One token per row of `logits` ([rows, n_vocab], any device)."""
    tokens = torch.argmax(logits, dim=-1).tolist()
    drawing = [i for i, t in enumerate(temperature) if t > GREEDY_BELOW]
    if drawing:
        rows = logits[drawing].float().cpu()
        for row, i in zip(rows, drawing, strict=True):
            probs = probabilities(row, temperature[i], top_k[i], top_p[i])
            tokens[i] = int(torch.multinomial(probs, 1, generator=generators[i]))
    return tokens
