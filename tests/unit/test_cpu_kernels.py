"""CPU kernels: every ISA variant against the reference, the block formats against the `gguf`
package's numpy (de)quantization, and the threaded product against numpy.

Tolerances: variants vs reference agree to 1e-4 relative (activations are quantized with the
same arithmetic everywhere; the only difference is float summation order), except amx's
products of 48 or more activation rows (bf16 on the tile unit: held to the float product, closer
to it than the reference); quantized products vs
the float product within 2 % of the output's norm (activations are quantized to 8 bits per
32-block)."""

from __future__ import annotations

import heteroserve_cpu as hc
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from tests.variants import AVAILABLE

TYPES = {"q4_0": (2, Q.Q4_0), "q4_1": (3, Q.Q4_1), "q8_0": (8, Q.Q8_0)}
VARIANTS = list(AVAILABLE)  # (HETEROSERVE_KERNELS=V: up to V, tests/variants.py)
MATRIX_UNIT = {"amx"}  # products of WIDE_MIN or more activation rows on the tile unit, in bf16
WIDE_MIN = 48
RNG = np.random.default_rng(7)


def quantized(kind: str, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    weights = RNG.standard_normal((rows, cols)).astype(np.float32)
    blob = quants.quantize(weights, TYPES[kind][1])
    return np.ascontiguousarray(blob).reshape(-1).view(np.uint8), weights


def test_reference_is_always_available_and_best_is_selected():
    assert VARIANTS[0] == "reference"
    assert hc.selected_variant() == VARIANTS[-1]


@pytest.mark.parametrize("kind", sorted(TYPES))
def test_dequantize_matches_gguf(kind):
    blob, _ = quantized(kind, 4, 256)
    expected = quants.dequantize(blob.reshape(4, -1), TYPES[kind][1])
    row_bytes = blob.size // 4
    for r in range(4):
        ours = hc.dequantize(TYPES[kind][0], blob[r * row_bytes:(r + 1) * row_bytes], 256)
        np.testing.assert_array_equal(ours, expected[r])


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_quantize_matches_gguf(kind):
    x = RNG.standard_normal(1024).astype(np.float32)
    ours = np.frombuffer(hc.quantize(TYPES[kind][0], x), dtype=np.uint8)
    theirs = np.ascontiguousarray(quants.quantize(x, TYPES[kind][1])).view(np.uint8).reshape(-1)
    a = hc.dequantize(TYPES[kind][0], ours, 1024)
    b = quants.dequantize(theirs, TYPES[kind][1]).reshape(-1)
    # Identical up to rounding of exact ties in the last code.
    step = np.abs(x).max() / (127 if kind == "q8_0" else 7)
    assert np.max(np.abs(a - b)) <= step * 1.01
    assert np.mean(ours == theirs) > 0.99


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kind", sorted(TYPES))
@pytest.mark.parametrize("batch", [1, 3, 19, 40, 50])
@pytest.mark.parametrize("cols", [512, 576, 608])
def test_variant_matches_reference(variant, kind, batch, cols):
    # 576 and 608 columns leave a partial last group of blocks (2 and 3 of 4) for packed layouts;
    # 19 and 40 activation rows cross the batched kernels' tile and chunk widths (8 and 32); 50
    # take amx's bf16 path (two activation pairs, the second partial).
    rows = 72
    blob, _ = quantized(kind, rows, cols)
    x = RNG.standard_normal((batch, cols)).astype(np.float32)
    pool = hc.Pool([], 1)
    ref = hc.matmul(pool, TYPES[kind][0], rows, cols, blob, x, "reference", 1)
    if variant in MATRIX_UNIT and batch >= WIDE_MIN:
        # bf16 weights and activations with float sums: closer to the float product than the
        # reference's 8-bit activations (about half its error), not equal to it
        dense = quants.dequantize(blob.reshape(rows, -1), TYPES[kind][1])
        exact = x.astype(np.float64) @ dense.T.astype(np.float64)
        ours = hc.matmul(pool, TYPES[kind][0], rows, cols, blob, x, variant)
        assert np.sqrt(np.mean((ours - exact) ** 2)) < np.sqrt(np.mean((ref - exact) ** 2))
        assert np.max(np.abs(ours - exact)) < np.max(np.abs(ref - exact))
        return
    for nrc in (1, 2, 4):
        ours = hc.matmul(pool, TYPES[kind][0], rows, cols, blob, x, variant, nrc)
        np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("kind", sorted(TYPES))
def test_threaded_product_matches_numpy(kind):
    rows, cols = 257, 1024
    blob, _ = quantized(kind, rows, cols)
    dense = quants.dequantize(blob.reshape(rows, -1), TYPES[kind][1])
    x = RNG.standard_normal((4, cols)).astype(np.float32)
    expected = x @ dense.T
    for threads in (1, 2, 3):
        ours = hc.matmul(hc.Pool([], threads), TYPES[kind][0], rows, cols, blob, x)
        error = np.linalg.norm(ours - expected) / np.linalg.norm(expected)
        assert error < 0.02, (threads, error)


@pytest.mark.parametrize("kind", sorted(TYPES))
def test_one_token_product_is_the_same_on_any_number_of_threads(kind):
    # Every row computed once, with the single thread's arithmetic, whatever the split; 2055 rows
    # are not a multiple of any tile, and 2048 and 576 columns take one and two rows per tile
    # when NRC is unset (0).
    for cols in (2048, 576):
        rows = 2055
        blob, _ = quantized(kind, rows, cols)
        x = RNG.standard_normal((1, cols)).astype(np.float32)
        for nrc in (0, 1, 2, 4):
            alone = hc.matmul(hc.Pool([], 1), TYPES[kind][0], rows, cols, blob, x, "", nrc)
            for threads in (2, 3, 8):
                ours = hc.matmul(hc.Pool([], threads), TYPES[kind][0], rows, cols, blob, x, "",
                                 nrc)
                np.testing.assert_array_equal(ours, alone, err_msg=f"{threads} threads, {nrc}")


def test_pool_rejects_thread_and_cpu_mismatch():
    with pytest.raises(ValueError, match="thread count must equal the number of bound CPUs"):
        hc.Pool([0, 1], 3)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        hc.Pool([], 0)


def test_bad_nrc_is_a_clear_error():
    with pytest.raises(ValueError, match="nrc must be 0 \\(by row width\\), 1, 2 or 4, got 3"):
        hc.matmul(hc.Pool([], 1), 8, 1, 32, np.zeros(34, np.uint8), np.zeros(32, np.float32),
                  "", 3)


def test_unknown_variant_is_a_clear_error():
    with pytest.raises(ValueError, match="kernel variant 'sve2' is not available"):
        hc.matmul(hc.Pool([], 1), 8, 1, 32, np.zeros(34, np.uint8), np.zeros(32, np.float32),
                  "sve2")
