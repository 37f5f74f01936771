"""The prefill engine's sampler against the same numpy definitions the CPU engine's sampler is
held to (tests/unit/test_sampling.py): the distribution of every parameter set, seeded draws'
frequencies, greedy as the first largest logit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from heteroserve_engines.prefill.sampling import new_generator, probabilities, sample
from tests.unit.test_sampling import reference_probs

RNG = np.random.default_rng(7)


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [
    (1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 20, 1.0), (1.0, 0, 0.8), (0.9, 50, 0.6), (1.0, 1, 1.0),
])
def test_distribution_equals_the_reference(temperature, top_k, top_p):
    logits = RNG.standard_normal(500).astype(np.float32) * 3
    logits[[3, 4]] = logits.max() + 0.5  # a tie at the top
    ours = probabilities(torch.from_numpy(logits), temperature, top_k, top_p).numpy()
    expected = reference_probs(logits, temperature, top_k, top_p)
    assert np.array_equal(ours > 0, expected > 0)
    np.testing.assert_allclose(ours, expected, atol=1e-9)


def test_seeded_draws_follow_the_distribution_and_repeat():
    logits = torch.from_numpy(RNG.standard_normal(40).astype(np.float32))
    probs = probabilities(logits, 1.0, 0, 0.9).numpy()
    rows = logits.repeat(4000, 1)
    params = ([1.0] * 4000, [0] * 4000, [0.9] * 4000)
    draws = sample(rows, *params, [new_generator(seed) for seed in range(4000)])
    assert draws == sample(rows, *params, [new_generator(seed) for seed in range(4000)])
    counts = np.bincount(draws, minlength=40)
    assert not counts[probs == 0].any()
    support = probs > 0
    expected = probs[support] * 4000
    chi2 = float((((counts[support] - expected) ** 2) / expected).sum())
    assert chi2 < support.sum() + 6 * np.sqrt(2 * support.sum())  # ~6 sigma


def test_greedy_is_the_first_largest_logit():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [5.0, 1.0, 5.0, 0.0]])
    assert sample(logits, [0.0, 1e-7], [0, 0], [1.0, 1.0],
                  [new_generator(1), new_generator(2)]) == [1, 0]
