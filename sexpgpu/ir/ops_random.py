"""Counter-based random ops: `random_uniform`, `random_normal`, `dropout_mask`.

Every random number comes from Philox4x32-10 (Salmon et al., "Parallel random numbers: as
easy as 1, 2, 3", SC'11; the Random123 reference `philox4x32_R(10, ctr, key)`), so an
element's value depends only on (seed, node key, step, element index): the same on CPU and
GPU, in any order of evaluation, with no generator state to carry between steps.

The exact derivation (a CUDA kernel must reproduce it bit for bit)
------------------------------------------------------------------
All arithmetic is on uint32 words, wrapping mod 2^32.

Philox4x32-10.  Counter (c0, c1, c2, c3), key (k0, k1).  One round:

    p0 = 0xD2511F53 * c0   (full 64-bit product; hi0 = p0 >> 32, lo0 = p0 mod 2^32)
    p1 = 0xCD9E8D57 * c2   (hi1, lo1 likewise)
    (c0, c1, c2, c3) <- (hi1 ^ c1 ^ k0,  lo1,  hi0 ^ c3 ^ k1,  lo0)

Ten rounds; between consecutive rounds (nine times) the key is bumped by the Weyl
constants: k0 += 0x9E3779B9, k1 += 0xBB67AE85.  The four words after round ten are the
output block (w0, w1, w2, w3).

Key.  k0 = seed, k1 = the node key (attrs `seed` and `key`, each an integer in
[0, 2^32); staging derives `key` from the node's identity, so two random nodes of one
program draw independent streams).

Counter.  Element i of the output, in row-major (C) order of `shape`, lives in block
b = i // 4, lane l = i % 4.  Block b is Philox applied to

    c0 = b mod 2^32,  c1 = b >> 32,  c2 = step mod 2^32,  c3 = (step >> 32) mod 2^32

where `step` is the op's one argument (an i64 or i32 scalar, read as its two's-complement
uint64).  A kernel thread computes one block and writes up to four elements; the last
block of a tensor whose size is not a multiple of 4 drops its unused lanes.

Uniform bits to a float.  u24(w) = w >> 8 (the top 24 bits); U(w) = u24(w) * 2^-24, an
exact f32 in [0, 1).

- `random_uniform` (attrs shape, dtype, seed, key, low, high): element i is
  low + (high - low) * U(w_l).  For f32, bf16 and f16 this is evaluated in f32 with one
  rounding per operation (d = high - low rounded to f32, then t = d * U rounded, then
  low + t rounded: no fused multiply-add; in CUDA `__fadd_rn(low, __fmul_rn(d, u))`),
  and bf16/f16 then round to nearest even from that f32 (a value may round up to `high`).
  For f64 the same three operations are evaluated in f64 (the 24-bit U is exact in both).
- `random_normal` (attrs shape, dtype, seed, key, mean, std): Box-Muller on the pairs
  (w0, w1) and (w2, w3) of a block.  For the pair (wa, wb):
      u1 = (u24(wa) + 1) * 2^-24   (in (0, 1], so the log is finite)
      u2 = u24(wb) * 2^-24
      r = sqrt(-2 ln u1),  z_a = r cos(2 pi u2),  z_b = r sin(2 pi u2)
  Lane 0 takes z_a of (w0, w1), lane 1 z_b of (w0, w1), lane 2 z_a of (w2, w3), lane 3 z_b
  of (w2, w3).  The value is mean + std * z, all in f64, then rounded once to the output
  dtype.  The bits feeding it are exact; the transcendental functions of another device
  may differ from NumPy's in the last f64 place, which after rounding to f32 almost never
  shows.
- `dropout_mask` (attrs shape, rate, seed, key): a boolean tensor, true = keep.  With the
  threshold T = min(2^24, ceil(rate * 2^24)) (an integer computed once, in f64, from the
  attribute), element i is kept iff u24(w_l) >= T, i.e. iff U(w_l) >= rate.  The keep
  probability is 1 - T / 2^24.

None of these ops has a gradient: the step is an integer and nothing else flows in.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from .lazy_numpy import np

from .dtypes import DType, numpy_dtype, parse_dtype
from .graph import TensorType
from .ops import OpDef, OpError, OpKind, register

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10
MASK32 = 0xFFFFFFFF


def philox4x32(counter: np.ndarray, key: tuple[int, int], rounds: int = PHILOX_ROUNDS) -> np.ndarray:
    """Philox4x32-ROUNDS of COUNTER (uint32 array of shape (..., 4)) under KEY (two uint32
    words). Returns a uint32 array of the same shape."""
    ctr = np.asarray(counter, dtype=np.uint32)
    if ctr.shape[-1:] != (4,):
        raise ValueError(f"philox4x32: counters need a last axis of 4 words, got shape {ctr.shape}")
    c0, c1, c2, c3 = (ctr[..., i].astype(np.uint64) for i in range(4))
    k0, k1 = int(key[0]) & 0xFFFFFFFF, int(key[1]) & 0xFFFFFFFF
    m0, m1 = np.uint64(PHILOX_M0), np.uint64(PHILOX_M1)
    mask, shift = np.uint64(MASK32), np.uint64(32)
    for r in range(rounds):
        if r:
            k0 = (k0 + PHILOX_W0) & 0xFFFFFFFF
            k1 = (k1 + PHILOX_W1) & 0xFFFFFFFF
        p0 = m0 * c0  # both factors < 2^32: the product is exact in uint64
        p1 = m1 * c2
        c0, c1, c2, c3 = (p1 >> shift) ^ c1 ^ np.uint64(k0), p1 & mask, (p0 >> shift) ^ c3 ^ np.uint64(k1), p0 & mask
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def random_words(shape: tuple[int, ...], seed: int, key: int, step: int) -> np.ndarray:
    """The uint32 word of every element of SHAPE (row-major), as derived in the module
    docstring."""
    size = math.prod(shape)
    blocks = (size + 3) // 4
    b = np.arange(blocks, dtype=np.uint64)
    step64 = int(step) & 0xFFFFFFFFFFFFFFFF
    counter = np.empty((blocks, 4), dtype=np.uint32)
    counter[:, 0] = (b & np.uint64(MASK32)).astype(np.uint32)
    counter[:, 1] = (b >> np.uint64(32)).astype(np.uint32)
    counter[:, 2] = step64 & 0xFFFFFFFF
    counter[:, 3] = step64 >> 32
    words = philox4x32(counter, (seed, key))
    return words.reshape(-1)[:size].reshape(shape)


def _u24(words: np.ndarray) -> np.ndarray:
    return words >> np.uint32(8)


def uniform01(words: np.ndarray) -> np.ndarray:
    """U(w) = (w >> 8) * 2^-24: exact f32 values in [0, 1)."""
    return _u24(words).astype(np.float32) * np.float32(2.0**-24)


def _step_of(x: np.ndarray) -> int:
    return int(np.asarray(x).reshape(()))


def _write(result: np.ndarray, out: Optional[np.ndarray]) -> np.ndarray:
    if out is not None:
        out[...] = result
        return out
    return result


# -- shape and dtype rules ------------------------------------------------------------------------
def _check_common(name: str, types: list[TensorType], attrs: dict[str, Any]) -> tuple[int, ...]:
    (step,) = types
    if step.dtype not in (DType.i64, DType.i32) or step.shape != ():
        raise OpError(f"{name}: the step must be an integer scalar, got {step}")
    for word in ("seed", "key"):
        value = attrs.get(word)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**32:
            raise OpError(f"{name}: :{word} must be an integer in [0, 2^32), got {value!r}")
    shape = tuple(attrs["shape"])
    if any(not isinstance(d, int) or d < 0 for d in shape):
        raise OpError(f"{name}: shape {list(shape)} needs non-negative integer dimensions")
    return shape


def _float_type(name: str) -> Any:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        shape = _check_common(name, types, attrs)
        dtype = parse_dtype(attrs.get("dtype", "f32"))
        if not dtype.is_float:
            raise OpError(f"{name}: :dtype must be a float type, got :{dtype.value}")
        return TensorType(dtype=dtype, shape=shape)

    return infer


def _dropout_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    shape = _check_common("dropout-mask", types, attrs)
    rate = attrs.get("rate")
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0.0 <= float(rate) <= 1.0:
        raise OpError(f"dropout-mask: :rate must be a number in [0, 1], got {rate!r}")
    return TensorType(dtype=DType.bool, shape=shape)


# -- kernels ------------------------------------------------------------------------------------------
def _uniform_kernel(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    shape = tuple(attrs["shape"])
    dtype = parse_dtype(attrs.get("dtype", "f32"))
    u = uniform01(random_words(shape, attrs["seed"], attrs["key"], _step_of(xs[0])))
    low, high = attrs.get("low", 0.0), attrs.get("high", 1.0)
    if dtype is DType.f64:
        result = np.float64(low) + (np.float64(high) - np.float64(low)) * u.astype(np.float64)
    else:
        lo32 = np.float32(low)
        width = np.float32(np.float32(high) - lo32)
        result = (lo32 + width * u).astype(numpy_dtype(dtype))
    return _write(result, out)


def _normal_kernel(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    shape = tuple(attrs["shape"])
    size = math.prod(shape)
    dtype = parse_dtype(attrs.get("dtype", "f32"))
    # all four words of every block (the last block's unused lanes still pair up)
    blocks = (size + 3) // 4
    words = random_words((blocks * 4,), attrs["seed"], attrs["key"], _step_of(xs[0])).reshape(blocks, 2, 2)
    scale = 2.0**-24
    u1 = (_u24(words[:, :, 0]).astype(np.float64) + 1.0) * scale
    u2 = _u24(words[:, :, 1]).astype(np.float64) * scale
    r = np.sqrt(-2.0 * np.log(u1))
    angle = 2.0 * np.pi * u2
    z = np.stack([r * np.cos(angle), r * np.sin(angle)], axis=-1).reshape(-1)[:size].reshape(shape)
    result = (float(attrs.get("mean", 0.0)) + float(attrs.get("std", 1.0)) * z).astype(numpy_dtype(dtype))
    return _write(result, out)


def dropout_threshold(rate: float) -> int:
    """T = min(2^24, ceil(rate * 2^24)): keep iff the top 24 bits are >= T."""
    return min(2**24, math.ceil(float(rate) * 2**24))


def _dropout_kernel(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    shape = tuple(attrs["shape"])
    words = random_words(shape, attrs["seed"], attrs["key"], _step_of(xs[0]))
    result = _u24(words).astype(np.int64) >= dropout_threshold(attrs["rate"])
    return _write(result, out)


register(
    OpDef(
        "random_uniform",
        _float_type("random-uniform"),
        _uniform_kernel,
        grad=None,
        kind=OpKind.RANDOM,
        arity=1,
        doc="uniform in [low, high) from Philox4x32-10 keyed by (seed, key), counter (element block, step)",
        attrs=("shape", "dtype", "seed", "key", "low", "high"),
    )
)
register(
    OpDef(
        "random_normal",
        _float_type("random-normal"),
        _normal_kernel,
        grad=None,
        kind=OpKind.RANDOM,
        arity=1,
        doc="normal(mean, std) by Box-Muller on Philox4x32-10 words",
        attrs=("shape", "dtype", "seed", "key", "mean", "std"),
        # its f64 log, sqrt, cos and sin would differ from NumPy's in the last place on a
        # device; on the host its bits are the CPU's
        on_host=True,
    )
)
register(
    OpDef(
        "dropout_mask",
        _dropout_type,
        _dropout_kernel,
        grad=None,
        kind=OpKind.RANDOM,
        arity=1,
        doc="boolean keep mask (true = keep) with P(keep) = 1 - rate, from Philox4x32-10 words",
        attrs=("shape", "rate", "seed", "key"),
    )
)
