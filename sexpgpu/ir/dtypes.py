"""Element types, promotion, and their NumPy representation (bfloat16 through ml-dtypes)."""

from __future__ import annotations

import builtins
from enum import Enum
from typing import Any

from .lazy_numpy import np


class DType(str, Enum):
    f32 = "f32"
    bf16 = "bf16"
    f16 = "f16"
    f64 = "f64"
    i32 = "i32"
    i64 = "i64"
    bool = "bool"  # from here on, `bool` in this class's annotations is this member: builtins.bool

    @property
    def is_float(self) -> builtins.bool:
        return self in FLOATS

    @property
    def is_int(self) -> builtins.bool:
        return self in (DType.i32, DType.i64)

    @property
    def bits(self) -> int:
        return BITS[self]

    def numpy(self) -> Any:
        return numpy_dtype(self)


FLOATS = frozenset({DType.f32, DType.bf16, DType.f16, DType.f64})
BITS = {DType.f32: 32, DType.bf16: 16, DType.f16: 16, DType.f64: 64, DType.i32: 32, DType.i64: 64, DType.bool: 8}


def numpy_dtype(dtype: DType) -> Any:
    if dtype is DType.bf16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype({"f32": np.float32, "f16": np.float16, "f64": np.float64, "i32": np.int32, "i64": np.int64, "bool": np.bool_}[dtype.value])


def promote_floats(a: DType, b: DType) -> DType:
    """Two float dtypes meet at the wider one; f16 and bf16 meet at f32."""
    if a == b:
        return a
    if a.bits != b.bits:
        return a if a.bits > b.bits else b
    return DType.f32


def parse_dtype(name: str) -> DType:
    return DType(name.lstrip(":").lower())
