"""Turning source arrays into field arrays: shape, dtype and finiteness checks that name the spot.

Casting rules: integers and booleans fill float fields; floats fill integer fields only when
every value is integral and in range; booleans accept 0/1 or true/false. Float fields must
be finite after the cast (NaN, inf, or overflow of a narrow float are errors).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...ir.dtypes import DType, numpy_dtype
from .raw import Origin
from .spec import DataError, FieldSpec


def coerce_array(array: np.ndarray, spec: FieldSpec, origin: Origin) -> np.ndarray:
    _check_shape(array, spec, origin)
    target = numpy_dtype(spec.dtype)
    if array.dtype != target:
        if array.dtype.kind not in "biuf":
            raise origin.error(f"values of type {array.dtype} cannot fill a {spec.dtype.value} field", field=spec.name)
        if spec.dtype is DType.bool:
            _check_bool(array, spec, origin)
        elif spec.dtype.is_int:
            _check_int(array, target, spec, origin)
        with np.errstate(over="ignore", invalid="ignore"):
            converted = array.astype(target)
    else:
        converted = array
    if spec.dtype.is_float:
        _check_finite(array, converted, spec, origin)
    return np.ascontiguousarray(converted)


def check_counts(columns: dict[str, np.ndarray], origin: Origin) -> int:
    counts = {name: len(array) for name, array in columns.items()}
    if len(set(counts.values())) > 1:
        listing = ", ".join(f"'{name}' {count}" for name, count in counts.items())
        raise origin.error(f"fields have different numbers of examples: {listing}")
    return next(iter(counts.values()), 0)


def _check_shape(array: np.ndarray, spec: FieldSpec, origin: Origin) -> None:
    if array.ndim != len(spec.shape) + 1 or tuple(array.shape[1:]) != spec.shape:
        per_example = tuple(array.shape[1:]) if array.ndim else ()
        raise origin.error(
            f"values have shape {show_shape(per_example)} per example ({show_shape(array.shape)} in all); "
            f"the field declares {show_shape(spec.shape)}",
            field=spec.name,
        )


def _check_int(array: np.ndarray, target: np.dtype, spec: FieldSpec, origin: Origin) -> None:
    if array.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(array) | (array != np.floor(array))
        _raise_first(bad, array, spec, origin, f"is not an integer (the field is {spec.dtype.value})")
    if array.dtype.kind in "iuf":
        info = np.iinfo(target)
        with np.errstate(invalid="ignore"):
            bad = (array < info.min) | (array > info.max)
        _raise_first(bad, array, spec, origin, f"is out of range for {spec.dtype.value}")


def _check_bool(array: np.ndarray, spec: FieldSpec, origin: Origin) -> None:
    if array.dtype.kind != "b":
        _raise_first((array != 0) & (array != 1), array, spec, origin, "is not a boolean (0 or 1)")


def _check_finite(source: np.ndarray, converted: np.ndarray, spec: FieldSpec, origin: Origin) -> None:
    finite = _finite(converted)
    if finite.all():
        return
    _raise_first(~_finite(source), source, spec, origin, "is not finite")
    _raise_first(~finite, source, spec, origin, f"overflows {spec.dtype.value}")


def _finite(array: np.ndarray) -> np.ndarray:
    if array.dtype.kind in "biu":
        return np.ones(array.shape, dtype=bool)
    return np.isfinite(array if array.dtype.kind == "f" else array.astype(np.float32))


def _raise_first(bad: np.ndarray, values: np.ndarray, spec: FieldSpec, origin: Origin, what: str) -> None:
    if not bad.any():
        return
    flat = int(np.argmax(bad.reshape(-1)))
    size = max(spec.size, 1)
    example, offset = divmod(flat, size)
    element = ""
    if spec.shape:
        index = ", ".join(str(int(i)) for i in np.unravel_index(offset, spec.shape))
        element = f" at {spec.name}[{index}]"
    value = _show(values.reshape(-1)[flat])
    raise origin.error(f"value {value}{element} {what}", example=example, field=spec.name)


def _show(value: Any) -> str:
    item = value.item() if hasattr(value, "item") else value
    return repr(item) if not isinstance(item, float) else str(item)


def show_shape(shape: tuple[int, ...]) -> str:
    return "(" + " ".join(str(d) for d in shape) + ")"


def error_from_array_load(exc: Exception, where: str) -> DataError:
    if "allow_pickle" in str(exc):
        return DataError("holds Python objects; save plain numeric arrays", source=where)
    return DataError(f"cannot read the arrays: {exc}", source=where)
