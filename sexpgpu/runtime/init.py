"""Initial parameter values: deterministic from the run seed and the parameter path, so
adding a parameter never changes the others' initial values."""

from __future__ import annotations

import hashlib
import math

import numpy as np

from ..ir.experiment import InitSpec, ParamSpec
from ..ir.dtypes import numpy_dtype


def param_key(seed: int, path: str) -> int:
    """A 128-bit Philox key from (seed, path)."""
    digest = hashlib.sha256(f"{seed}:{path}".encode()).digest()
    return int.from_bytes(digest[:16], "little")


def fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """(fan-in, fan-out) of a weight as the layers that hold it use it, the numbers PyTorch's
    torch.nn.init computes for the same layer. A matrix is laid out (in, out), since it is
    applied as x @ w; a weight of three or more dimensions is a convolution's,
    (c-out, c-in, k...), as conv2d reads it. PyTorch lays a linear weight out (out, in), so
    its fans of the transposed matrix are these."""
    if len(shape) < 2:
        n = shape[0] if shape else 1
        return n, n
    if len(shape) == 2:
        return shape[0], shape[1]
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def initial_value(spec: ParamSpec, seed: int) -> np.ndarray:
    rng = np.random.Generator(np.random.Philox(key=param_key(seed, spec.path)))
    values = draw(spec.init, spec.shape, rng)
    return values.astype(numpy_dtype(spec.dtype))


def draw(init: InitSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    fan_in, fan_out = fans(shape)
    kind = init.kind
    if kind == "zeros":
        return np.zeros(shape)
    if kind == "ones":
        return np.ones(shape)
    if kind == "constant":
        return np.full(shape, init.value)
    if kind == "normal":
        return rng.normal(init.mean, init.std if init.std is not None else 1.0, size=shape)
    if kind == "uniform":
        return rng.uniform(init.low, init.high, size=shape)
    if kind == "trunc-normal":
        std = init.std if init.std is not None else 1.0
        values = rng.normal(0.0, 1.0, size=shape)
        bad = np.abs(values) > 2.0
        while bad.any():
            values[bad] = rng.normal(0.0, 1.0, size=int(bad.sum()))
            bad = np.abs(values) > 2.0
        return init.mean + std * values
    if kind == "xavier":
        bound = init.gain * math.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-bound, bound, size=shape)
    if kind == "kaiming":
        bound = init.gain * math.sqrt(6.0 / fan_in)
        return rng.uniform(-bound, bound, size=shape)
    raise ValueError(f"unknown initializer {kind}")
