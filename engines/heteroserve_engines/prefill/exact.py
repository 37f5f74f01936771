"""The CPU engine's arithmetic bit for bit, in torch, on any device (`--activation-quantization
avx512vnni`).

Why: the CPU engine quantizes every product's input to 8 bits, so a float rounding difference
anywhere (a summation order, an exp) moves a value across an 8-bit boundary now and then, and
that becomes a whole quantization step in the next product. KV computed with any other
arithmetic - float, or 8-bit activations summed in another order - is as far from the decoder's
own as its quantization noise, and greedy continuations of it part from the CPU engine alone's
at the first near-tie (docs/prefill-engine.md). KV computed with the same operations in the
same order is the decoder's own, bit for bit.

This module repeats, operation for operation, what engines/cpu/src/model.c does with the
avx512vnni kernel table (x86_avx512.c, x86_common.h, attend.h) - the variant whose results do
not depend on the batch (the amx variant computes the leading 16-column tiles of a wide step on
the tile unit, which sums a block in one integer, products of 48 rows or more in bf16, and the
attention of a prefill chunk's consecutive tokens together: its results depend on where a token
sits in the step, so no prefill can match them in general):

- integer parts exactly: the products of 8-bit activations and 4- or 8-bit weights are summed
  per block (one SIMD lane each) with a float32 matrix product, exact for integers below 2^24;
- float parts in the kernel's order: per lane (block j of each group of 16)
  `fma(isum * d_act, d_weight, acc)` over the groups, q4_1's `fma(m, d_act * sum, acc)` after
  each, then `_mm512_reduce_add_ps`'s tree (GCC's; the kernels sum eight at once, by the same
  tree); RMSNorm's sum of squares as dot_f32 (8 FMA lanes, then hsum_ps's tree); attention as
  attend_f16 (8-lane FMA dots of each fp16 K row, online softmax per 64 positions, each
  weight times the fp16 V row fused into the accumulator; x86_common.h's rows_span computes
  it many rows at a time, for decode and for a prefill chunk's blocks, at the same bits), spans
  of 256 positions combined as attn_combine does; every other operation as model.c writes it,
  one float32 rounding each (model.c is built without FMA);
- a fused multiply-add rounds once: emulated in float64 (the product is exact there) with the
  sum rounded to odd, which the final rounding to float32 then makes exact (Boldo & Melquiond);
- glibc's expf is repeated in float64 (its own algorithm and table); powf, cosf and sinf (the
  RoPE angles, a table per position) are glibc's own, called on the host.

It is slow next to the float path (hundreds of small operations per layer, float64 where the
kernels fuse) and meant for what needs the decoder's exact KV: a hand-off whose continuation is
the CPU engine alone's. The decode side must run the same variant (`--kernels avx512vnni`;
decode steps of under 16 sequences compute the same on amx), and glibc's expf/cosf/sinf/powf
on both sides must be the same implementation (glibc >= 2.28 on both images).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass
from decimal import Decimal, localcontext

import numpy as np
import torch

from ..cpu_engine.gguf_file import F16, F32, Q4_0, Q4_1, Q8_0, GGUFFile, TensorInfo
from ..cpu_engine.gguf_model import TARGETS, ModelConfig, ModelFileError, _converted

VARIANTS = ("avx512vnni",)
QK = 32
GROUP = 16          # blocks per avx512 group (16 int32 lanes, one per block)
ATTN_SPAN = 256     # model.c: positions per attention item
INNER_SPAN = 64     # kernels.h HS_ATTN_SPAN: positions scored at once in attend_f16
T_CHUNK = 256       # activation rows per product pass here (bounds the lane-sum tensor)

# -- libm -----------------------------------------------------------------------------------

_libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
for _name, _args in (("powf", 2), ("cosf", 1), ("sinf", 1), ("expf", 1), ("fmaf", 3)):
    getattr(_libm, _name).restype = ctypes.c_float
    getattr(_libm, _name).argtypes = [ctypes.c_float] * _args


def libm(name: str, *args: float) -> float:
    """glibc's float function `name` (powf, cosf, sinf, expf, fmaf) on float32 arguments."""
    return float(getattr(_libm, name)(*args))


# -- fused multiply-add, reductions ----------------------------------------------------------

def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 fma(a, b, c) = round(a * b + c), one rounding (a, b, c float32): the device's own
    fused multiply-add where torch can reach it (CUDA's __fmaf_rn through a jiterator kernel),
    else emulated in float64."""
    native = _native_fma(a.device)
    if native is not None:
        try:
            return native(a, b, c)
        except RuntimeError:  # NVRTC compiles at the first call: without it, emulate
            _native_fmas[a.device.type] = None
    return add_rounded(a.double() * b.double(), c.double()).float()


_native_fmas: dict[str, object] = {}


def _native_fma(device: torch.device):
    """An elementwise float32 fma on `device` that rounds once, or None where there is none to
    call. CUDA: __fmaf_rn in a jiterator kernel (never split or merged by the compiler). CPU:
    torch.addcmul, which torch's vectorized CPU kernels compute with an FMA where the build
    fuses `self + t1 * t2` - used only if it passes _fuses's check on this machine."""
    kind = device.type
    if kind not in _native_fmas:
        _native_fmas[kind] = None
        if kind == "cuda":
            try:
                from torch.cuda import jiterator
                _native_fmas[kind] = jiterator._create_jit_fn(
                    "template <typename T> T exact_fma(T a, T b, T c) "
                    "{ return __fmaf_rn(a, b, c); }")
            except (ImportError, AttributeError, RuntimeError):
                pass
        elif kind == "cpu":
            def addcmul(a, b, c):
                return torch.addcmul(c, a, b)
            if _fuses(addcmul):
                _native_fmas[kind] = addcmul
    return _native_fmas[kind]


def _fuses(candidate) -> bool:
    """Whether `candidate(a, b, c)` gives glibc's fmaf on cases that tell a fused multiply-add
    from a rounded product added: sums that cancel the product, and products that make the
    float64 sum land exactly on a float32 midpoint; contiguous, broadcast, strided and
    single-element operands (torch's vectorized and scalar loops)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal(256).astype(np.float32)
    b = rng.standard_normal(256).astype(np.float32)
    c = (-(a.astype(np.float64) * b) * (1 + rng.standard_normal(256) * 1e-7)).astype(np.float32)
    mid = np.float32(1 + 2**-23), np.float32(0.25 * (1 - 2**-23)), np.float32(2**22 + 0.5)
    a = np.concatenate([a, [mid[0], -mid[0]]]).astype(np.float32)
    b = np.concatenate([b, [mid[1], mid[1]]]).astype(np.float32)
    c = np.concatenate([c, [mid[2], -mid[2]]]).astype(np.float32)
    want = np.asarray([_libm.fmaf(float(x), float(y), float(z))
                       for x, y, z in zip(a, b, c, strict=True)], np.float32)
    ta, tb, tc = (torch.from_numpy(v) for v in (a, b, c))
    try:
        checks = [
            candidate(ta, tb, tc).numpy(),
            np.concatenate([candidate(ta[i:i + 1], tb[i:i + 1], tc[i:i + 1]).numpy()
                            for i in range(len(a))]),
            candidate(ta[:, None].expand(-1, 3), tb[:, None].expand(-1, 3),
                      tc[:, None].expand(-1, 3))[:, 2].numpy(),
            candidate(ta[None, :].repeat(2, 1).T, tb[None, :].repeat(2, 1).T,
                      tc[None, :].repeat(2, 1).T)[:, 1].numpy(),
        ]
    except RuntimeError:
        return False
    return all(np.array_equal(got.view(np.uint32), want.view(np.uint32)) for got in checks)


_MIDPOINT_MASK, _MIDPOINT = (1 << 29) - 1, 1 << 28  # the 29 bits float64 has beyond float32
_TINY = 2.0 ** -125  # below, float32 drops more bits (subnormals): always the exact path


def add_rounded(p: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """p + c (float64 tensors; p exact, c a float32 value) rounded once to float32's precision,
    returned in float64. Rounding the float64 sum again to float32 is already right except
    where that sum landed exactly on a float32 midpoint; those elements (rare) are redone with
    the sum's exact error (TwoSum) folded in as round-to-odd (Boldo & Melquiond). On the CPU
    only the suspects are redone; on an accelerator every element is (no host round trip)."""
    s = p + c
    suspect = ((s.view(torch.int64) & _MIDPOINT_MASK) == _MIDPOINT) | (s.abs() < _TINY)
    if s.device.type == "cpu":
        out = s.float()
        if bool(suspect.any()):
            index = suspect.nonzero(as_tuple=True)
            out[index] = _round_to_odd(p[index], c[index], s[index]).float()
        return out.double()
    return torch.where(suspect, _round_to_odd(p, c, s), s).float().double()


def _round_to_odd(p: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """s = p + c rounded to nearest, moved one float64 ulp toward the exact sum where it is
    inexact and even."""
    v = s - c
    err = (p - v) + (c - (s - v))  # s + err == p + c exactly
    nudge = (err != 0) & ((s.view(torch.int64) & 1) == 0)
    toward = torch.where(err > 0, torch.full_like(s, float("inf")),
                         torch.full_like(s, float("-inf")))
    return torch.where(nudge, torch.nextafter(s, toward), s)


def hsum8(a: torch.Tensor) -> torch.Tensor:
    """x86_common.h hsum_ps over the last dimension (8 lanes): ((a0+a4) + (a2+a6)) +
    ((a1+a5) + (a3+a7))."""
    s = a[..., 0:4] + a[..., 4:8]
    t = s[..., 0:2] + s[..., 2:4]
    return t[..., 0] + t[..., 1]


def reduce16(a: torch.Tensor) -> torch.Tensor:
    """GCC's _mm512_reduce_add_ps over the first dimension (16 lanes): halves, quarters, then
    (q0 + q2) + (q1 + q3)."""
    h = a[8:16] + a[0:8]
    q = h[4:8] + h[0:4]
    return (q[0] + q[2]) + (q[1] + q[3])


def dot_f32(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x86_common.h dot_f32 (and dots_f16, the same arithmetic) of the last dimension: 8 FMA
    lanes over 8-element steps from +0, hsum_ps, then the remainder fused in order."""
    n = x.shape[-1]
    full = n // 8 * 8
    if full and _native_fma(x.device) is not None:
        acc = torch.zeros((*torch.broadcast_shapes(w.shape[:-1], x.shape[:-1]), 8),
                          device=x.device)
        for j in range(0, full, 8):
            acc = fma32(w[..., j:j + 8], x[..., j:j + 8], acc)
        total = hsum8(acc)
    elif full:
        products = w[..., :full].double() * x[..., :full].double()
        acc = (products[..., 0:8] + 0.0).float().double()  # fma(a, b, +0): -0 becomes +0
        for j in range(8, full, 8):
            acc = add_rounded(products[..., j:j + 8], acc)
        total = hsum8(acc.float())
    else:
        total = torch.zeros(torch.broadcast_shapes(w.shape[:-1], x.shape[:-1]),
                            device=x.device)
    for j in range(full, n):  # `sum += w[j] * x[j]`, contracted to an FMA by GCC (gnu11)
        total = fma32(w[..., j].expand_as(total), x[..., j].expand_as(total), total)
    return total


# -- glibc's expf ----------------------------------------------------------------------------

_EXP2F_N = 32
_INVLN2N = float.fromhex("0x1.71547652b82fep+0") * _EXP2F_N
_C0 = float.fromhex("0x1.c6af84b912394p-5") / _EXP2F_N / _EXP2F_N / _EXP2F_N
_C1 = float.fromhex("0x1.ebfce50fac4f3p-3") / _EXP2F_N / _EXP2F_N
_C2 = float.fromhex("0x1.62e42ff0c52d6p-1") / _EXP2F_N
_SHIFT = float.fromhex("0x1.8p+52")
_OVERFLOW = float.fromhex("0x1.62e42ep6")    # float32: above, expf is +inf
_UNDERFLOW = -float.fromhex("0x1.9fe368p6")  # float32: below, expf is 0


def _exp2_table() -> list[float]:
    """2^(i/32), correctly rounded to float64 (glibc's __exp2f_data.tab holds these, with the
    exponent bits of i/32 taken out)."""
    with localcontext() as ctx:
        ctx.prec = 60
        return [float(Decimal(2) ** (Decimal(i) / Decimal(_EXP2F_N))) for i in range(_EXP2F_N)]


_EXP2_TABLE = _exp2_table()
_tables: dict[torch.device, torch.Tensor] = {}


def _two_product(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, e): p = a * b rounded, p + e == a * b exactly (float64; Veltkamp's split)."""
    p = a * b
    ca, cb = 134217729.0 * a, 134217729.0 * b  # 2^27 + 1
    ah, bh = ca - (ca - a), cb - (cb - b)
    al, bl = a - ah, b - bh
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _fma64(a, b, c: torch.Tensor) -> torch.Tensor:
    """float64 fma(a, b, c), the exact product's pieces summed: correctly rounded except in
    double-rounding cases some 2^-50 rare, far below what moves a float32 result."""
    if not isinstance(a, torch.Tensor):
        a = torch.full_like(b, a)
    p, e = _two_product(a, b)
    s = p + c
    v = s - c
    t = (p - v) + (c - (s - v))  # s + t == p + c exactly
    return s + (t + e)


def expf(x: torch.Tensor) -> torch.Tensor:
    """glibc's expf (sysdeps/ieee754/flt-32/e_expf.c) on a float32 tensor, in float64, as its
    FMA build (the ifunc every AVX2 host takes) computes it: kd = fma(32/ln2, x, SHIFT) - SHIFT
    (the nearest integer to the exact product), r = fma(32/ln2, x, -kd), 2^(kd/32) from the
    table, a cubic in r with three fused steps."""
    table = _tables.get(x.device)
    if table is None:
        table = _tables[x.device] = torch.tensor(_EXP2_TABLE, dtype=torch.float64,
                                                 device=x.device)
    xd = x.double()
    p, e = _two_product(torch.full_like(xd, _INVLN2N), xd)
    kd = torch.round(p)  # ties to even; p + e is a tie only where p is one and e is 0
    tie = (p - torch.floor(p)) == 0.5
    kd = torch.where(tie & (e > 0), torch.floor(p) + 1.0, kd)
    kd = torch.where(tie & (e < 0), torch.floor(p), kd)
    kd = torch.where(torch.isfinite(kd), kd, torch.zeros_like(kd))
    r = (p - kd) + e  # p - kd is exact: one rounding, as fmsub's
    k = kd.long()
    # 2^(k >> 5) built from its bits (exact; k >> 5 lies in [-150, 128] here)
    s = table[k & (_EXP2F_N - 1)] * (((k >> 5) + 1023) << 52).view(torch.float64)
    zz = _fma64(_C0, r, torch.full_like(r, _C1))
    r2 = r * r
    y = _fma64(_C2, r, torch.ones_like(r))
    y = _fma64(zz, r2, y)
    out = (y * s).float()
    out = torch.where(x > _OVERFLOW, torch.full_like(out, float("inf")), out)
    out = torch.where(x < _UNDERFLOW, torch.zeros_like(out), out)
    return torch.where(torch.isnan(x), x, out)


# -- weights ---------------------------------------------------------------------------------

@dataclass
class QMatrix:
    """A weight matrix as the avx512vnni kernels read it: `lanes` [blocks, 32, rows] float32
    holding each block's (SIMD lane's) 32 integer weights (q4_0 and q8_0 signed, q4_1's nibbles
    unsigned; the block count padded to whole groups of 16 with zero blocks, as the kernels'
    masked loads read a partial group), `d` [blocks, rows] the block scales, `m` q4_1's
    minimums; or
    `dense` [rows, cols] for f16/f32 weights (dot_f16 / dot_f32)."""

    kind: int
    rows: int
    cols: int
    lanes: torch.Tensor | None = None
    d: torch.Tensor | None = None
    m: torch.Tensor | None = None
    dense: torch.Tensor | None = None
    ints: np.ndarray | None = None  # [rows, cols] the integer weights (embedding lookups)
    scales: np.ndarray | None = None  # [rows, blocks] float32
    mins: np.ndarray | None = None


def _blocks(raw: np.ndarray, kind: int, rows: int, cols: int):
    """(integer weights [rows, cols], scales [rows, blocks], minimums or None) of q4_0, q4_1,
    q8_0 rows, GGUF's element order (a q4 byte j holds element j low, j + 16 high)."""
    nb = cols // QK
    if kind == Q8_0:
        b = raw.reshape(rows, nb, 34)
        d = b[..., 0:2].copy().view("<f2")[..., 0].astype(np.float32)
        q = b[..., 2:].copy().view(np.int8).astype(np.int32)
        return q.reshape(rows, cols), d, None
    size = 18 if kind == Q4_0 else 20
    b = raw.reshape(rows, nb, size)
    d = b[..., 0:2].copy().view("<f2")[..., 0].astype(np.float32)
    m = b[..., 2:4].copy().view("<f2")[..., 0].astype(np.float32) if kind == Q4_1 else None
    qs = b[..., size - 16:].astype(np.int32)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    if kind == Q4_0:
        q = q - 8
    return q.reshape(rows, cols), d, m


def load_matrix(mapped: np.ndarray, tensor: TensorInfo, device: torch.device,
                rows_kept: bool = False, target: int | None = None) -> QMatrix:
    """One weight matrix as the CPU engine computes with it: q4_0, q4_1, q8_0, f16 and f32 as
    they are, any other type requantized to q8_0 through the same function its loader uses;
    with `target` (its `--quantization`) every matrix of another type requantized to it."""
    cols, rows = int(tensor.shape[0]), int(tensor.shape[1]) if len(tensor.shape) == 2 else 1
    raw = mapped[tensor.data_offset:tensor.data_offset + tensor.n_bytes]
    kind = tensor.tensor_type
    if kind not in (F32, F16, Q4_0, Q4_1, Q8_0) or (target is not None and kind != target):
        kind, blob = _converted(memoryview(np.ascontiguousarray(raw)), kind, rows, cols, target,
                                True)
        raw = np.asarray(blob, dtype=np.uint8)
    if kind in (F32, F16):
        dense = np.frombuffer(raw.tobytes(), "<f4" if kind == F32 else "<f2")
        return QMatrix(kind, rows, cols,
                       dense=torch.from_numpy(dense.astype(np.float32).reshape(rows, cols))
                       .to(device))
    if cols % QK:
        raise ModelFileError(f"{tensor.name}: {cols} columns are not whole blocks of {QK}")
    ints, d, m = _blocks(np.asarray(raw), kind, rows, cols)
    nb = cols // QK
    pad = -nb % GROUP
    lanes = ints.reshape(rows, nb, QK)
    lanes = np.concatenate([lanes, np.zeros((rows, pad, QK), np.int32)], axis=1)
    to = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    pad_blocks = lambda a: np.concatenate([a, np.zeros((rows, pad), np.float32)], 1).T  # noqa: E731
    # float32 products of these integers are exact; cuBLAS may compute float32 products in
    # reduced precision (TF32 and the like), so on CUDA they are float64
    lane_type = np.float64 if device.type == "cuda" else np.float32
    return QMatrix(kind, rows, cols,
                   lanes=to(lanes.transpose(1, 2, 0).astype(lane_type)),
                   d=to(pad_blocks(d)), m=None if m is None else to(pad_blocks(m)),
                   ints=ints if rows_kept else None, scales=d if rows_kept else None,
                   mins=m if rows_kept else None)


def embed_rows(w: QMatrix, tokens: list[int], device: torch.device) -> torch.Tensor:
    """hs_dequantize_row of each token's row: q * d (q4_1: q * d + m), float32."""
    if w.dense is not None:
        return w.dense[torch.tensor(tokens, device=w.dense.device)].to(device)
    ints = torch.from_numpy(w.ints[tokens].astype(np.float32)).reshape(len(tokens), -1, QK)
    d = torch.from_numpy(w.scales[tokens])[..., None]
    rows = ints * d
    if w.mins is not None:
        rows = rows + torch.from_numpy(w.mins[tokens])[..., None]
    return rows.reshape(len(tokens), w.cols).to(device)


# -- activations and products ----------------------------------------------------------------

@dataclass
class Activations:
    """Rows quantized as quantize_block does: `lanes` [rows, blocks, 32] the int8 values
    (float32), `d` [rows, blocks] the scales max/127, `s` [rows, blocks] d * sum; blocks padded
    to whole groups of 16 with zeros; `x` the float rows (f16/f32 weights)."""

    lanes: torch.Tensor
    d: torch.Tensor
    s: torch.Tensor
    x: torch.Tensor


def q8_blocks(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """quantize_block's arithmetic over the last dimension (32 values): (q, d = max|x| / 127,
    127 / max|x|), q = round-half-even(x * (127 / max|x|)), all float32; 0 for a zero block."""
    amax = blocks.abs().amax(-1)
    # torch's `scalar / tensor` (and on CUDA `tensor / scalar`) multiplies by a rounded
    # reciprocal: two roundings where the kernels divide once; divide tensors
    inverse = torch.where(amax != 0, torch.full_like(amax, 127.0).div(amax), torch.zeros_like(amax))
    q = torch.round(blocks * inverse[..., None])  # round half to even, as _mm256_round_ps
    return q, amax.div(torch.full_like(amax, 127.0)), inverse


def quantize(x: torch.Tensor) -> Activations:
    """Rows quantized as quantize_act does: whole blocks of 32 (a row of another width feeds
    only f16/f32 weights, which read `x`)."""
    n, cols = x.shape
    nb = cols // QK
    q, d, inverse = q8_blocks(x[:, :nb * QK].reshape(n, nb, QK))
    qsum = q.sum(-1)  # an exact integer
    # max below 127 / FLT_MAX: 127/max is +inf, cvtps_epi32 makes every element INT_MIN, the
    # packs saturate them to -128 and their int32 sum wraps to 0
    overflow = torch.isinf(inverse)
    if bool(overflow.any()):
        q = torch.where(overflow[..., None], torch.full_like(q, -128.0), q)
        qsum = torch.where(overflow, torch.zeros_like(qsum), qsum)
    s = d * qsum
    pad = -nb % GROUP
    lanes = q
    if pad:
        lanes = torch.cat([lanes, lanes.new_zeros(n, pad, QK)], 1)
        d = torch.cat([d, d.new_zeros(n, pad)], 1)
        s = torch.cat([s, s.new_zeros(n, pad)], 1)
    return Activations(lanes, d, s, x)


def matmul(w: QMatrix, a: Activations) -> torch.Tensor:
    """out[t][r] = the avx512vnni tile's result for activation row t and weight row r."""
    if w.dense is not None:  # f16/f32 weights: dot_f16 / dot_f32 of float activations
        rows = []  # in pieces: dot_f32 holds [tokens, rows, cols] float64 products
        for t0 in range(0, a.x.shape[0], 16):
            x = a.x[t0:t0 + 16, None, :]
            rows.append(torch.cat([dot_f32(w.dense[None, r0:r0 + 2048, :], x)
                                   for r0 in range(0, w.rows, 2048)], 1))
        return torch.cat(rows)
    outs = []
    for t0 in range(0, a.lanes.shape[0], T_CHUNK):
        outs.append(_matmul_rows(w, a.lanes[t0:t0 + T_CHUNK], a.d[t0:t0 + T_CHUNK],
                                 a.s[t0:t0 + T_CHUNK]))
    return torch.cat(outs)


def _matmul_rows(w: QMatrix, lanes: torch.Tensor, d: torch.Tensor, s: torch.Tensor
                 ) -> torch.Tensor:
    n_blocks = w.lanes.shape[0]
    # [blocks, t, rows]: each block's integer sum, exact in float32
    isum = torch.bmm(lanes.transpose(0, 1).to(w.lanes.dtype), w.lanes).float()
    scaled = isum * d.T[:, :, None]  # cvt(s) * yd, float32
    if _native_fma(lanes.device) is not None:
        return _accumulate_native(w, scaled, s)
    # per lane over the groups fma(scaled, dw, acc) (and q4_1's fma(m, d * sum, acc)): the
    # products exact in float64, the accumulator a float32 value carried in float64, from +0
    products = scaled.double() * w.d.double()[:, None, :]
    mins = None if w.m is None else w.m.double()[:, None, :] * s.T.double()[:, :, None]
    acc = torch.zeros_like(products[0:GROUP])
    for g in range(0, n_blocks, GROUP):
        acc = add_rounded(products[g:g + GROUP], acc)
        if mins is not None:
            acc = add_rounded(mins[g:g + GROUP], acc)
    return reduce16(acc.float())


def _accumulate_native(w: QMatrix, scaled: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """_matmul_rows's float part with the device's own fused multiply-add."""
    dw = w.d[:, None, :]
    sums = s.T[:, :, None]
    acc = torch.zeros(GROUP, scaled.shape[1], w.rows, device=scaled.device)
    for g in range(0, scaled.shape[0], GROUP):
        acc = fma32(scaled[g:g + GROUP], dw[g:g + GROUP], acc)
        if w.m is not None:
            acc = fma32(w.m[g:g + GROUP, None, :], sums[g:g + GROUP], acc)
    return reduce16(acc)


# -- the layer's other operations --------------------------------------------------------------

def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    d = x.shape[-1]
    ss = dot_f32(x, x)
    # torch.sqrt of float32 is not always correctly rounded on the CPU (sqrtss is); float64's
    # square root rounded to float32 is (53 >= 2 * 24 + 2 bits)
    mean = ss.div(torch.full_like(ss, float(d)))  # tensor / scalar multiplies on CUDA
    root = torch.sqrt((mean + np.float32(eps)).double()).float()
    scale = torch.ones_like(ss).div(root)
    return (x * scale[:, None]) * weight


class RopeTables:
    """cos/sin of position * inv_freq[j] as model.c computes them (glibc's powf, cosf, sinf on
    float32), grown per position as needed and kept."""

    def __init__(self, config: ModelConfig, device: torch.device):
        self.half, self.device = config.head_dim // 2, device
        base = np.float32(config.rope_base)
        self.inv_freq = [np.float32(libm("powf", base, np.float32(-2.0) * np.float32(i)
                                         / np.float32(config.head_dim)))
                         for i in range(self.half)]
        self.cos = torch.zeros(0, self.half, device=device)
        self.sin = torch.zeros(0, self.half, device=device)

    def upto(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        have = self.cos.shape[0]
        if n > have:
            new_cos = np.empty((n - have, self.half), np.float32)
            new_sin = np.empty_like(new_cos)
            for p in range(have, n):
                for j, f in enumerate(self.inv_freq):
                    theta = np.float32(p) * f
                    new_cos[p - have, j] = libm("cosf", theta)
                    new_sin[p - have, j] = libm("sinf", theta)
            self.cos = torch.cat([self.cos, torch.from_numpy(new_cos).to(self.device)])
            self.sin = torch.cat([self.sin, torch.from_numpy(new_sin).to(self.device)])
        return self.cos, self.sin


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """x [n, heads, head_dim]; cos/sin [n, head_dim / 2]: x0*c - x1*s, x0*s + x1*c."""
    half = x.shape[-1] // 2
    c, s = cos[:, None, :], sin[:, None, :]
    if neox:
        a, b = x[..., :half], x[..., half:]
        return torch.cat((a * c - b * s, a * s + b * c), -1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: list[int],
              group: int) -> torch.Tensor:
    """attn_task + attend_f16 (+ attn_combine) for the queries q [n, heads, head_dim] at
    `positions` over the sequence's cached rows keys/values [positions, kv heads, head_dim]
    (fp16 values in float32). Returns [n, heads * head_dim]."""
    n, heads, hd = q.shape
    dev = q.device
    scale = np.float32(1.0) / np.float32(np.sqrt(np.float32(hd)))
    k_heads = keys.repeat_interleave(group, 1)    # [P, heads, hd]: query head h's KV head
    v_heads = values.repeat_interleave(group, 1)
    pos = torch.tensor(positions, device=dev)
    parts = []  # per outer span: (acc, m, l, active)
    for o0 in range(0, max(positions) + 1, ATTN_SPAN):
        count = torch.clamp(pos + 1 - o0, 0, ATTN_SPAN)  # positions of this span per query
        m = torch.full((n, heads), float("-inf"), device=dev)
        l_sum = torch.zeros(n, heads, device=dev)
        acc = torch.zeros(n, heads, hd, device=dev)
        longest = min(ATTN_SPAN, max(positions) + 1 - o0)  # of this span, over the queries
        for p0 in range(0, longest, INNER_SPAN):
            width = min(INNER_SPAN, longest - p0)
            span = slice(o0 + p0, o0 + p0 + width)
            valid = torch.arange(width, device=dev)[None, :] < (count - p0)[:, None]  # [n, w]
            active = valid[:, 0]
            kk = k_heads[span]  # [w, heads, hd]
            dots = torch.zeros(n, heads, width, 8, device=dev)
            for j in range(0, hd, 8):  # dots_f16: fma(k, q, a) per 8-lane step
                dots = fma32(kk[None, :, :, j:j + 8].transpose(1, 2),
                             q[:, :, None, j:j + 8], dots)
            s = hsum8(dots) * scale  # [n, heads, w]
            vmask = valid[:, None, :]
            mx = torch.maximum(m, torch.where(vmask, s, float("-inf")).amax(-1))
            rescale = expf(m - torch.where(active[:, None], mx, m.new_zeros(())))
            rescale = torch.where(active[:, None], rescale, torch.ones_like(rescale))
            l_new = l_sum * rescale
            acc_new = acc * rescale[..., None]
            # A position past a query's count weighs +0 for it: adding +0 to the sum, or
            # fma(+0, v, acc) to the accumulator, leaves them as they are (neither is ever -0:
            # both start at +0), as the kernel's loop that never reaches the position does.
            e = torch.where(vmask, expf(s - mx[..., None]), torch.zeros_like(s))
            total = torch.zeros_like(l_sum)
            for p in range(width):
                total = total + e[:, :, p]
            l_new = l_new + total
            vv = v_heads[span]  # [w, heads, hd]
            finite = bool(torch.isfinite(vv).all())  # else 0 * inf: mask those steps instead
            for p in range(width):  # axpys_f16: acc = fma(w, v, acc)
                upd = fma32(e[:, :, p, None], vv[None, p], acc_new)
                acc_new = upd if finite else torch.where(vmask[:, :, p, None], upd, acc_new)
            keep = active[:, None]
            m = torch.where(keep, mx, m)
            l_sum = torch.where(keep, l_new, l_sum)
            acc = torch.where(keep[..., None], acc_new, acc)
        parts.append((acc, m, l_sum, count > 0))
    if len(parts) == 1:
        return (parts[0][0] / parts[0][2][..., None]).reshape(n, heads * hd)
    spans = torch.tensor([(p // ATTN_SPAN) + 1 for p in positions], device=dev)
    single = (parts[0][0] / parts[0][2][..., None])
    mx = torch.stack([torch.where(a[:, None], m, float("-inf")) for _, m, _, a in parts]).amax(0)
    out = torch.zeros_like(parts[0][0])
    total = torch.zeros_like(parts[0][2])
    for acc, m, l_sum, active in parts:  # attn_combine, in span order
        weight = expf(m - mx)
        keep = active[:, None]
        total = torch.where(keep, total + l_sum * weight, total)
        out = torch.where(keep[..., None], out + weight[..., None] * acc, out)
    combined = out / total[..., None]
    return torch.where((spans > 1)[:, None, None], combined, single).reshape(n, heads * hd)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return gate / (1.0 + expf(-gate)) * up


# -- the model -------------------------------------------------------------------------------

@dataclass
class ExactLayer:
    attn_norm: torch.Tensor
    ffn_norm: torch.Tensor
    wq: QMatrix
    wk: QMatrix
    wv: QMatrix
    wo: QMatrix
    w_gate: QMatrix
    w_up: QMatrix
    w_down: QMatrix
    bq: torch.Tensor | None
    bk: torch.Tensor | None
    bv: torch.Tensor | None


class ExactModel:
    """The CPU engine's forward pass (avx512vnni), one sequence at a time."""

    def __init__(self, reader: GGUFFile, config: ModelConfig, device: torch.device,
                 variant: str = "avx512vnni", quantization: str | None = None):
        """`quantization`: the decode engines' `--quantization` (q8_0, q4_0), which requantizes
        every matrix but the embedding table at their load: the same here."""
        if variant not in VARIANTS:
            raise ValueError(f"exact CPU-engine numerics exist for {VARIANTS}, not {variant!r}")
        if quantization is not None and quantization not in TARGETS:
            raise ValueError(f"quantization must be one of {sorted(TARGETS)}, not "
                             f"{quantization!r}")
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"exact CPU-engine numerics run on the cpu and cuda devices (they "
                             f"need float64 tensors and, for speed, CUDA's fused multiply-add), "
                             f"not {device.type}")
        if config.head_dim % 8:
            raise ValueError(f"exact CPU-engine numerics need a head_dim that is a multiple of "
                             f"8 (attend_f16's lanes), not {config.head_dim}")
        target = TARGETS.get(quantization or "")
        if device.type == "cuda":  # float32 products of integers must stay float32 (no TF32)
            torch.backends.cuda.matmul.allow_tf32 = False
        self.config, self.device, self.variant = config, device, variant
        mapped = np.memmap(reader.path, dtype=np.uint8, mode="r")
        by_name = {t.name: t for t in reader.tensors}

        def tensor(name: str, required: bool = True) -> TensorInfo | None:
            if name not in by_name and required:
                raise ModelFileError(f"{reader.path}: tensor {name} is missing")
            return by_name.get(name)

        def vector(name: str, required: bool = True) -> torch.Tensor | None:
            info = tensor(name, required)
            if info is None:
                return None
            if info.tensor_type != F32:
                raise ModelFileError(f"{name}: the CPU engine takes float32 norms and biases")
            raw = mapped[info.data_offset:info.data_offset + info.n_bytes]
            return torch.from_numpy(np.frombuffer(raw.tobytes(), "<f4").copy()).to(device)

        def matrix(name: str, rows_kept: bool = False) -> QMatrix:
            return load_matrix(mapped, tensor(name), device, rows_kept,
                               None if name == "token_embd.weight" else target)

        self.layers = []
        for i in range(config.n_layer):
            p = f"blk.{i}."
            self.layers.append(ExactLayer(
                vector(p + "attn_norm.weight"), vector(p + "ffn_norm.weight"),
                matrix(p + "attn_q.weight"), matrix(p + "attn_k.weight"),
                matrix(p + "attn_v.weight"), matrix(p + "attn_output.weight"),
                matrix(p + "ffn_gate.weight"), matrix(p + "ffn_up.weight"),
                matrix(p + "ffn_down.weight"),
                vector(p + "attn_q.bias", False), vector(p + "attn_k.bias", False),
                vector(p + "attn_v.bias", False)))
        self.embedding = matrix("token_embd.weight", rows_kept=True)
        self.output = (matrix("output.weight") if "output.weight" in by_name
                       else self.embedding)
        self.output_norm = vector("output_norm.weight")
        self.rope = RopeTables(config, device)

    @property
    def bytes(self) -> int:
        """Device memory of the weights as held here (integer lanes in float32)."""
        total = 0
        mats = [self.embedding] + ([self.output] if self.output is not self.embedding else [])
        for layer in self.layers:
            mats += [layer.wq, layer.wk, layer.wv, layer.wo, layer.w_gate, layer.w_up,
                     layer.w_down]
        for w in mats:
            for t in (w.lanes, w.d, w.m, w.dense):
                if t is not None:
                    total += t.numel() * t.element_size()
        return total

    @torch.inference_mode()
    def forward(self, tokens: list[int], start: int, keys: list[torch.Tensor],
                values: list[torch.Tensor]) -> tuple[torch.Tensor, list, list]:
        """Positions start .. start+len(tokens)-1 of one sequence whose earlier K/V rows are
        keys[layer] / values[layer] ([start, kv_dim], fp16 values). Returns the last token's
        logits (float32) and each layer's new K and V rows (float16, [len(tokens), kv_dim])."""
        c, dev = self.config, self.device
        n = len(tokens)
        positions = list(range(start, start + n))
        cos, sin = self.rope.upto(start + n)
        cos, sin = cos[start:start + n], sin[start:start + n]
        hd, group = c.head_dim, c.n_head // c.n_head_kv
        x = embed_rows(self.embedding, tokens, dev)
        xb = None
        new_k, new_v = [], []
        for index, layer in enumerate(self.layers):
            if index > 0:
                x = x + xb
            h = quantize(rmsnorm(x, layer.attn_norm, c.eps))
            q, k, v = matmul(layer.wq, h), matmul(layer.wk, h), matmul(layer.wv, h)
            if layer.bq is not None:
                q = q + layer.bq
            if layer.bk is not None:
                k = k + layer.bk
            if layer.bv is not None:
                v = v + layer.bv
            q = rope(q.view(n, c.n_head, hd), cos, sin, c.rope_neox)
            k = rope(k.view(n, c.n_head_kv, hd), cos, sin, c.rope_neox).reshape(n, -1)
            k16, v16 = k.half(), v.half()
            new_k.append(k16)
            new_v.append(v16)
            all_k = torch.cat([keys[index].to(dev, torch.float16), k16]).float()
            all_v = torch.cat([values[index].to(dev, torch.float16), v16]).float()
            att = attention(q, all_k.view(-1, c.n_head_kv, hd), all_v.view(-1, c.n_head_kv, hd),
                            positions, group)
            xb = matmul(layer.wo, quantize(att))
            x = x + xb
            h = quantize(rmsnorm(x, layer.ffn_norm, c.eps))
            act = swiglu(matmul(layer.w_gate, h), matmul(layer.w_up, h))
            xb = matmul(layer.w_down, quantize(act))
        x = x + xb
        head = rmsnorm(x[n - 1:n], self.output_norm, c.eps)
        logits = matmul(self.output, quantize(head))
        return logits[0], new_k, new_v
