"""The CPU engine's avx512vnni arithmetic in torch (prefill/exact.py), checked bit for bit against
the CPU engine itself: its building blocks against glibc (fmaf, expf) and the kernels' products,
then whole forward passes - K/V rows and logits of SmolLM2 and of a synthetic Qwen2 (biases,
RoPE on halves), a prompt in one step and continued in a second, past the 64- and 256-position
spans of its attention."""

from __future__ import annotations

import ctypes
import ctypes.util

import heteroserve_cpu as hc
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from heteroserve_engines.cpu_engine.__main__ import default_model
from heteroserve_engines.cpu_engine.gguf_file import F16, F32, Q4_0, Q4_1, Q8_0, TensorInfo
from heteroserve_engines.cpu_engine.gguf_model import load_model, open_gguf, read_config
from heteroserve_engines.prefill import exact
from heteroserve_engines.prefill.model import Chunk, LlamaModel
from tests.unit.test_prefill_model import write_qwen2
from tests.variants import EXACT_HANDOFF_SKIP

pytestmark = pytest.mark.skipif(EXACT_HANDOFF_SKIP,
                                reason="the CPU engine's avx512vnni kernels do not run here")
CPU = torch.device("cpu")
_libm = ctypes.CDLL(ctypes.util.find_library("m"))
_libm.fmaf.restype = ctypes.c_float
_libm.fmaf.argtypes = [ctypes.c_float] * 3


@pytest.fixture(params=["native", "emulated"])
def fma(request, monkeypatch):
    """Both ways to fuse a multiply-add on the CPU: torch.addcmul where it passed exact's check
    on this machine, and the float64 emulation (what a device without either uses)."""
    if request.param == "native":
        if exact._native_fma(CPU) is None:
            pytest.skip("torch.addcmul does not fuse on this machine")
    else:
        monkeypatch.setitem(exact._native_fmas, "cpu", None)
    return request.param


def test_addcmul_is_taken_only_where_it_fuses():
    def unfused(a, b, c):
        return c + a * b
    assert not exact._fuses(unfused)
    assert exact._fuses(lambda a, b, c: exact.add_rounded(a.double() * b.double(),
                                                          c.double()).float())


def floats(*values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_fma_rounds_once_like_fmaf(fma):
    rng = np.random.default_rng(1)
    a = rng.standard_normal(20000).astype(np.float32)
    b = rng.standard_normal(20000).astype(np.float32)
    cancelling = (-(a.astype(np.float64) * b) * (1 + rng.standard_normal(20000) * 1e-7))
    for c in (rng.standard_normal(20000).astype(np.float32), cancelling.astype(np.float32)):
        ours = exact.fma32(torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(c))
        theirs = [_libm.fmaf(float(x), float(y), float(z)) for x, y, z in zip(a, b, c, strict=True)]
        assert np.array_equal(ours.numpy(), np.asarray(theirs, np.float32))
    # a * b + c lands exactly on a float32 midpoint in float64 although the exact sum is
    # below it: rounding the float64 sum again (ties to even) would give 2^22 + 1
    a, b, c = np.float32(1 + 2**-23), np.float32(0.25 * (1 - 2**-23)), np.float32(2**22 + 0.5)
    assert np.float32(np.float64(a) * np.float64(b) + np.float64(c)) == 2**22 + 1
    for sign in (1, -1):
        got = exact.fma32(floats(sign * a), floats(b), floats(sign * c)).item()
        assert got == _libm.fmaf(float(sign * a), float(b), float(sign * c)) == sign * (2**22 + 0.5)


def test_expf_is_glibcs():
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.uniform(-110, 90, 60000), rng.uniform(-20, 0, 60000),
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 88.72, 88.73, -103.9, -104.0,
                         -87.4, 1e-30, -1e-30]]).astype(np.float32)
    ours = exact.expf(torch.from_numpy(x)).numpy()
    theirs = np.asarray([exact.libm("expf", float(v)) for v in x], np.float32)
    assert np.array_equal(ours, theirs, equal_nan=True)


def test_reduction_trees():
    """The lanes' sums in the kernels' orders (hsum_ps, GCC's _mm512_reduce_add_ps): values
    whose sum depends on the order."""
    a = floats(1e8, 1, -1e8, 1, 0.5, 3, 0.25, 7)
    assert exact.hsum8(a).item() == np.float32(
        (np.float32(1e8 + 0.5) + np.float32(-1e8 + 0.25)) + np.float32(np.float32(1 + 3) + 8))
    lanes = floats(*[1e8, 3, -1e8, 5] * 4)[:, None]
    h = [np.float32(lanes[8 + i, 0] + lanes[i, 0]) for i in range(8)]
    q = [np.float32(h[4 + i] + h[i]) for i in range(4)]
    assert exact.reduce16(lanes)[0].item() == np.float32(np.float32(q[0] + q[2])
                                                         + np.float32(q[1] + q[3]))


def raw_tensor(kind: int, rows: int, cols: int, rng) -> tuple[np.ndarray, TensorInfo]:
    dense = (rng.standard_normal((rows, cols)) * 0.3).astype(np.float32)
    if kind == F32:
        raw = dense.view(np.uint8).reshape(-1)
    elif kind == F16:
        raw = dense.astype("<f2").view(np.uint8).reshape(-1)
    else:
        raw = np.ascontiguousarray(quants.quantize(dense, GGMLQuantizationType(kind))).view(
            np.uint8).reshape(-1)
    info = TensorInfo("w", (cols, rows), kind, 0, raw.size)
    return raw, info


def bits(a: np.ndarray) -> np.ndarray:
    """float32 values as their bits: -0.0 and +0.0 differ."""
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("kind", [Q4_0, Q4_1, Q8_0, F16, F32])
# groups of 16 blocks: a partial one alone, a whole one, and a whole one or two before a
# partial one of 2, 12 and 5 blocks (the kernels' three ways of reading a partial group: of
# up to 4 blocks, of up to 8, of more)
@pytest.mark.parametrize("cols", [32 * 3, 32 * 16, 32 * 18, 32 * 28, 32 * 37])
def test_products_equal_the_kernels(kind, cols, fma):
    rng = np.random.default_rng(kind + cols)
    raw, info = raw_tensor(kind, 37, cols, rng)
    w = exact.load_matrix(raw, info, CPU)
    x = (rng.standard_normal((7, cols)) * np.array([[1], [1e-3], [30], [0], [1], [1], [1]])
         ).astype(np.float32)
    x[5, :32] = 0.0  # an all-zero block: scale 0
    x[6, 32:64] = rng.standard_normal(32).astype(np.float32) * 1e-38  # 127 / max overflows
    theirs = hc.matmul(hc.Pool([], 1), kind, 37, cols, raw, x.reshape(-1), kernels="avx512vnni")
    ours = exact.matmul(w, exact.quantize(torch.from_numpy(x)))
    assert np.array_equal(bits(ours.numpy()), bits(theirs))  # row 3: +0, never -0


def test_a_zero_row_against_negative_scales_is_plus_zero(fma):
    """q4_0's scale is max / -8: all negative for weights whose largest entries are positive.
    A zero activation row's products are then -0; the kernels' FMA into +0 makes them +0."""
    rng = np.random.default_rng(12)
    dense = np.abs(rng.standard_normal((8, 256))).astype(np.float32)
    raw = np.ascontiguousarray(quants.quantize(dense, GGMLQuantizationType.Q4_0)).view(
        np.uint8).reshape(-1)
    w = exact.load_matrix(raw, TensorInfo("w", (256, 8), Q4_0, 0, raw.size), CPU)
    assert bool((w.d[:8] < 0).all())
    x = np.zeros((2, 256), np.float32)
    theirs = hc.matmul(hc.Pool([], 1), Q4_0, 8, 256, raw, x.reshape(-1), kernels="avx512vnni")
    ours = exact.matmul(w, exact.quantize(torch.from_numpy(x)))
    assert np.array_equal(bits(ours.numpy()), bits(theirs))
    assert not np.signbit(theirs).any()


@pytest.mark.parametrize("kind", [F16, F32])
def test_float_weights_with_a_remainder_past_the_lanes(kind, fma):
    """dot_f16 / dot_f32 over 8-wide lanes, the last cols % 8 fused one by one."""
    rng = np.random.default_rng(11)
    raw, info = raw_tensor(kind, 9, 45, rng)
    x = rng.standard_normal((3, 45)).astype(np.float32)
    theirs = hc.matmul(hc.Pool([], 1), kind, 9, 45, raw, x.reshape(-1), kernels="avx512vnni")
    ours = exact.matmul(exact.load_matrix(raw, info, CPU), exact.quantize(torch.from_numpy(x)))
    assert np.array_equal(bits(ours.numpy()), bits(theirs))


def assert_forward_equals_the_cpu_engines(path, ids: list[int], split: int,
                                          quantization: str | None = None) -> None:
    """ids[:split] in one step, the rest in a second step over the first's K/V: every K/V row
    and both steps' logits equal the CPU engine's (avx512vnni), through the prefill engine's
    model and pool."""
    cpu, config, _ = load_model(path, hc.Pool([], 2), kernels="avx512vnni",
                                quantization=quantization)
    cpu.alloc_kv(64, 16)
    tables = np.arange(0, 64, dtype=np.int32)[None, :]
    steps = [(0, split), (split, len(ids))]
    theirs = [cpu.forward(np.asarray(ids[a:b], np.int32), np.arange(a, b, dtype=np.int32),
                          np.zeros(b - a, np.int32), tables, np.asarray([b - a - 1], np.int32))[0]
              for a, b in steps]
    model, _ = LlamaModel.from_gguf(path, CPU, torch.float32, "avx512vnni", quantization)
    pool = model.new_pool(1024)
    pool.allocate(3)  # the sequence's blocks do not start at slot 0
    blocks = pool.allocate(pool.blocks_for(len(ids)))
    ours = [model.forward([Chunk(ids[a:b], a, blocks)], pool)[0] for a, b in steps]
    for mine, reference in zip(ours, theirs, strict=True):
        assert np.array_equal(mine.numpy(), reference)
    slots = pool.slots(blocks, 0, len(ids))
    for layer in range(config.n_layer):
        assert pool.read(layer, slots) == cpu.read_kv(layer, np.arange(len(ids), dtype=np.int32))


def test_smollm2_kv_and_logits_equal_the_cpu_engines():
    rng = np.random.default_rng(5)
    ids = [1] + [int(t) for t in rng.integers(100, 40000, 79)]  # two 64-position spans
    assert_forward_equals_the_cpu_engines(default_model(), ids, 50)


@pytest.mark.parametrize("quantization", ["q8_0", "q4_0"])
def test_requantized_decoders(quantization):
    """Decode engines started with --quantization requantize the q4_1 matrices at load; the
    exact model given the same setting computes with the same weights."""
    rng = np.random.default_rng(7)
    ids = [1] + [int(t) for t in rng.integers(100, 40000, 11)]
    assert_forward_equals_the_cpu_engines(default_model(), ids, 8, quantization)


def test_synthetic_qwen2_past_a_256_position_span(tmp_path, fma):
    path = write_qwen2(tmp_path / "qwen2.gguf")
    rng = np.random.default_rng(6)
    ids = [int(t) for t in rng.integers(0, 256, 300)]
    assert_forward_equals_the_cpu_engines(path, ids, 270)


def test_smollm2_embeddings_are_q8_0_and_the_matrices_q4_1():
    """What the SmolLM2 checks above cover (q4_1 minimum terms, a q8_0 tied head)."""
    reader = open_gguf(default_model())
    kinds = {t.name: t.tensor_type for t in reader.tensors}
    assert kinds["token_embd.weight"] == Q8_0 and kinds["blk.0.ffn_down.weight"] == Q4_1
    assert read_config(reader).rope_neox == 0


def test_exact_numerics_keep_float16_kv():
    with pytest.raises(ValueError, match="float32 or float16"):
        LlamaModel.from_gguf(default_model(), CPU, torch.bfloat16, "avx512vnni")
    with pytest.raises(ValueError, match="quantization must be one of"):
        LlamaModel.from_gguf(default_model(), CPU, torch.float32, "avx512vnni", "q5_k")
    with pytest.raises(ValueError, match="run on the cpu and cuda devices"):
        exact.ExactModel(open_gguf(default_model()), read_config(open_gguf(default_model())),
                         torch.device("meta"))
    with pytest.raises(ValueError, match="exact CPU-engine numerics exist"):
        exact.ExactModel(open_gguf(default_model()), read_config(open_gguf(default_model())),
                         CPU, "amx")
