"""The C sampler (heteroserve_cpu.sample, used by Model.sample) against numpy definitions of
greedy, temperature, top-k and top-p sampling: the support it draws from must be exactly the
numpy one, and its frequencies over many seeded draws within a chi-square bound of the numpy
probabilities."""

from __future__ import annotations

import heteroserve_cpu as hc
import numpy as np
import pytest

RNG = np.random.default_rng(3)


@pytest.fixture(scope="module")
def pool():
    return hc.Pool([], 2)


def reference_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float
                    ) -> np.ndarray:
    """The distribution the sampler must draw from (ties at the k-th logit kept; top-p keeps
    the most probable tokens whose mass first reaches top_p)."""
    scaled = logits.astype(np.float64) / temperature
    if 0 < top_k < scaled.size:
        cutoff = np.sort(logits)[-top_k]
        scaled[logits < cutoff] = -np.inf
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if top_p < 1.0:
        order = np.lexsort((np.arange(probs.size), -probs))
        cumulative = np.cumsum(probs[order])
        keep = order[: int(np.searchsorted(cumulative, top_p * cumulative[-1])) + 1]
        mask = np.zeros_like(probs)
        mask[keep] = probs[keep]
        probs = mask / mask.sum()
    return probs


def draws(pool, logits: np.ndarray, temperature: float, top_k: int, top_p: float, count: int,
          seed: int = 1) -> np.ndarray:
    """`count` tokens, one per row of a batch of identical rows with distinct seeds."""
    rows = np.ascontiguousarray(np.broadcast_to(logits.astype(np.float32), (count, logits.size)))
    ids, _ = hc.sample(pool, rows, [temperature] * count, [top_k] * count, [top_p] * count,
                       [seed * 1_000_003 + i for i in range(count)])
    return np.asarray(ids)


def test_greedy_is_the_first_largest_logit_and_ignores_nan(pool):
    logits = RNG.standard_normal((6, 1000)).astype(np.float32)
    logits[1, 10] = logits[1, 20] = logits[1].max() + 1  # a tie: the first one wins
    logits[2, :] = np.nan
    logits[2, 7] = -3.0
    ids, states = hc.sample(pool, logits, [0.0] * 6, [0] * 6, [1.0] * 6, [9] * 6)
    expected = [int(np.argmax(np.nan_to_num(row, nan=-np.inf))) for row in logits]
    assert ids == expected and ids[1] == 10 and ids[2] == 7
    assert states == [9] * 6  # greedy rows do not draw


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [
    (1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.6), (0.8, 8, 0.9), (1.0, 3, 0.3)])
def test_frequencies_match_the_numpy_distribution(pool, temperature, top_k, top_p):
    logits = (RNG.standard_normal(24) * 1.5).astype(np.float32)
    probs = reference_probs(logits, temperature, top_k, top_p)
    count = 20000
    seen = np.bincount(draws(pool, logits, temperature, top_k, top_p, count), minlength=24)
    assert set(np.flatnonzero(seen)) <= set(np.flatnonzero(probs)), "drew outside the support"
    support = probs > 0
    expected = probs[support] * count
    chi2 = float(((seen[support] - expected) ** 2 / expected).sum())
    dof = max(int(support.sum()) - 1, 1)
    # A chi-square variable with k degrees of freedom exceeds k + 6 sqrt(2k) + 10 with
    # probability far below 1e-6.
    assert chi2 < dof + 6 * np.sqrt(2 * dof) + 10, (chi2, dof)


def test_top_k_keeps_ties_and_top_p_keeps_at_least_one(pool):
    logits = np.array([0.0, 2.0, 2.0, 1.0, 2.0, -1.0], np.float32)
    ids = set(draws(pool, logits, 1.0, 1, 1.0, 600).tolist())
    assert ids == {1, 2, 4}  # three logits tie for the largest: all are the "top 1"
    assert set(draws(pool, logits, 1.0, 0, 1e-6, 200).tolist()) == {1}  # the first of the tie


def test_large_vocabulary_top_p_support_is_exact(pool):
    """A 49,152-token row (SmolLM2's vocabulary): the sampler sorts only the tokens that can be
    in the nucleus; the tokens it draws must all be in numpy's nucleus."""
    logits = (RNG.standard_normal(49152) * 3).astype(np.float32)
    for top_p in (0.5, 0.9, 0.99):
        probs = reference_probs(logits, 1.0, 0, top_p)
        ids = draws(pool, logits, 1.0, 0, top_p, 400)
        assert probs[ids].min() > 0


def test_seeded_draws_repeat_and_state_advances(pool):
    logits = RNG.standard_normal((4, 300)).astype(np.float32)
    args = ([0.9] * 4, [50] * 4, [0.95] * 4, [11, 12, 13, 14])
    first, states = hc.sample(pool, logits, *args)
    again, states_again = hc.sample(pool, logits, *args)
    assert first == again and states == states_again
    assert states != [11, 12, 13, 14]
    following, _ = hc.sample(pool, logits, *args[:3], states)
    later = [hc.sample(pool, logits, *args[:3], states)[0] for _ in range(3)]
    assert all(run == following for run in later)


def test_bad_arguments_are_rejected(pool):
    logits = np.zeros((2, 10), np.float32)
    with pytest.raises(ValueError, match="one entry per row"):
        hc.sample(pool, logits, [1.0], [0, 0], [1.0, 1.0], [1, 2])
    with pytest.raises(ValueError, match="top_p"):
        hc.sample(pool, logits, [1.0, 1.0], [0, 0], [0.0, 1.0], [1, 2])
    with pytest.raises(RuntimeError, match="no number"):
        hc.sample(pool, np.full((1, 10), np.nan, np.float32), [1.0], [0], [1.0], [1])


def test_vanishing_temperatures_are_greedy(pool):
    logits = RNG.standard_normal((3, 500)).astype(np.float32)
    ids, states = hc.sample(pool, logits, [1e-40, 1e-7, 0.0], [0] * 3, [0.5] * 3, [4] * 3)
    assert ids == logits.argmax(axis=1).tolist() and states == [4] * 3


# -- logit additions (logit_bias, penalties) and log-probabilities --------------------------------


def log_softmax(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    return row - (row.max() + np.log(np.exp(row - row.max()).sum()))


def test_additions_change_the_row_sampled_not_the_callers_logits(pool):
    logits = RNG.standard_normal((3, 400)).astype(np.float32)
    kept = logits.copy()
    top = logits.argmax(axis=1)
    # Row 0: its greedy token banned; row 1: token 7 forced; row 2: none.
    ids, _ = hc.sample(pool, logits, [0.0] * 3, [0] * 3, [1.0] * 3, [1] * 3,
                       add_row=[1, 0], add_id=[7, int(top[0])], add_value=[100.0, -100.0])
    runner_up = int(np.argsort(-logits[0], kind="stable")[1])
    assert ids == [runner_up, 7, int(top[2])]
    assert np.array_equal(logits, kept)


def test_additions_shift_the_drawn_distribution(pool):
    logits = (RNG.standard_normal(24) * 1.5).astype(np.float32)
    add = np.zeros(24, np.float32)
    add[[3, 11, 20]] = [2.0, -1.5, -30.0]
    probs = reference_probs(logits + add, 0.8, 0, 1.0)
    count = 20000
    rows = np.ascontiguousarray(np.broadcast_to(logits, (count, 24)))
    ids, _ = hc.sample(pool, rows, [0.8] * count, [0] * count, [1.0] * count,
                       list(range(count)), add_row=np.repeat(np.arange(count), 3).tolist(),
                       add_id=[3, 11, 20] * count, add_value=[2.0, -1.5, -30.0] * count)
    seen = np.bincount(ids, minlength=24)
    support = probs > 1e-9
    expected = probs[support] * count
    chi2 = float(((seen[support] - expected) ** 2 / expected).sum())
    dof = int(support.sum()) - 1
    assert chi2 < dof + 6 * np.sqrt(2 * dof) + 10, (chi2, dof)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.6])
def test_logprobs_are_the_log_softmax_after_additions_at_temperature_one(pool, temperature):
    logits = (RNG.standard_normal((4, 3000)) * 2).astype(np.float32)
    logits[2, 5] = logits[2, 9] = logits[2].max() + 1  # a tie: the lower id first
    logits[3, 100] = np.nan
    ids, _, entries = hc.sample(pool, logits, [temperature] * 4, [0] * 4, [1.0] * 4,
                                [5, 6, 7, 8], add_row=[1], add_id=[42], add_value=[3.0],
                                logprobs=[5, 20, 2, 0])
    for row, (token, k) in enumerate(zip(ids, [5, 20, 2, 0], strict=True)):
        biased = logits[row].copy()
        if row == 1:
            biased[42] += 3.0
        reference = log_softmax(np.nan_to_num(biased, nan=-np.inf))
        chosen, *top = entries[row]
        assert chosen[0] == token and chosen[1] == pytest.approx(reference[token], abs=1e-4)
        order = np.lexsort((np.arange(reference.size), -reference))[:k]
        assert [t for t, _ in top] == order.tolist()
        assert np.allclose([lp for _, lp in top], reference[order], atol=1e-4)
    assert [t for t, _ in entries[2][1:]] == [5, 9]


def test_logprobs_only_for_the_rows_that_ask(pool):
    logits = RNG.standard_normal((3, 50)).astype(np.float32)
    result = hc.sample(pool, logits, [0.0] * 3, [0] * 3, [1.0] * 3, [1] * 3)
    assert len(result) == 2  # none asked: (ids, states) as before
    ids, _, entries = hc.sample(pool, logits, [0.0] * 3, [0] * 3, [1.0] * 3, [1] * 3,
                                logprobs=[-1, 0, -1])
    assert entries[0] is None and entries[2] is None and [t for t, _ in entries[1]] == [ids[1]]


def test_bad_additions_and_logprob_counts_are_rejected(pool):
    logits = np.zeros((2, 10), np.float32)
    base = ([1.0, 1.0], [0, 0], [1.0, 1.0], [1, 2])
    with pytest.raises(ValueError, match="out of range"):
        hc.sample(pool, logits, *base, add_row=[0], add_id=[10], add_value=[1.0])
    with pytest.raises(ValueError, match="out of range"):
        hc.sample(pool, logits, *base, add_row=[2], add_id=[0], add_value=[1.0])
    with pytest.raises(ValueError, match="one entry per addition"):
        hc.sample(pool, logits, *base, add_row=[0], add_id=[0, 1], add_value=[1.0])
    with pytest.raises(ValueError, match="at most 20"):
        hc.sample(pool, logits, *base, logprobs=[21, 0])
    with pytest.raises(ValueError, match="one entry per row"):
        hc.sample(pool, logits, *base, logprobs=[1])


def test_penalties_and_logit_bias_fold_into_one_addition_per_token():
    from heteroserve_engines.cpu_engine.runner import SamplingParams

    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25,
                            logit_bias={3: 10.0, 8: -100.0})
    # Output so far: token 3 twice, token 5 once; 8 never.
    assert params.additions({3: 2, 5: 1}) == {3: 10.0 - 1.0 - 0.25, 5: -0.5 - 0.25, 8: -100.0}
    assert SamplingParams(logit_bias={1: 2.0}).additions({4: 9}) == {1: 2.0}
    assert SamplingParams().additions({4: 9}) == {}
