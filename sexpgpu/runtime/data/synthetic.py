"""Deterministic synthetic datasets: spirals, moons, blobs, linear regression.

Every generator draws from numpy Generator(PCG64(seed)) only, so the same options give the
same bytes everywhere. The first declared field gets the inputs, the second (if any) the
labels or targets. Examples come in a seeded random order, not class by class.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from .check import show_shape
from .spec import DataError, FieldSpec

Arrays = tuple[np.ndarray, np.ndarray, dict[str, Any]]

DEFAULT_NOISE = {"spirals": 0.2, "moons": 0.1, "blobs": 1.0, "linear": 0.1}
DEFAULT_CLASSES = {"spirals": 3, "moons": 2, "blobs": 3}


def generate(options: dict[str, Any], fields: list[FieldSpec], where: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    name = options.get("name")
    if name not in GENERATORS:
        raise DataError(f"unknown synthetic data set {name!r} (known: {', '.join(GENERATORS)})", source=where)
    if len(fields) > 2:
        raise DataError(f"synthetic data fills two fields (inputs, labels); {len(fields)} are declared", source=where)
    n = _positive(options.get("n"), "n", where)
    rng = np.random.Generator(np.random.PCG64(int(options.get("seed", 0)) % 2**64))
    noise = float(options.get("noise", DEFAULT_NOISE[name]))
    x, y, meta = GENERATORS[name](n, rng, noise, options, fields, where)
    # generators build class by class; interleave the examples (seeded) so that a loader
    # without :shuffle still sees every class in every batch
    order = rng.permutation(n)
    x, y = x[order], y[order]
    arrays = {fields[0].name: x}
    if len(fields) == 2:
        arrays[fields[1].name] = y.reshape((n, *fields[1].shape)) if y.size == n * fields[1].size else y
    return arrays, {"name": name, "n": n, "noise": noise, **meta}


def _positive(value: Any, name: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise DataError(f"option {name} must be a positive integer, got {value!r}", source=where)
    return value


def _dim(options: dict[str, Any], fields: list[FieldSpec], where: str, fixed: Optional[int] = None) -> int:
    inputs = fields[0]
    if fixed is not None and options.get("dim", fixed) != fixed:
        raise DataError(f"these points are {fixed}-dimensional; option dim is {options['dim']!r}", source=where)
    declared = inputs.shape[0] if len(inputs.shape) == 1 else None
    dim = fixed if fixed is not None else options.get("dim", declared)
    if not isinstance(dim, int) or inputs.shape != (dim,):
        wanted = f"({dim})" if isinstance(dim, int) else "(dim)"
        raise DataError(f"the inputs field must have shape {wanted}, not {show_shape(inputs.shape)}", source=where, field=inputs.name)
    return dim


def _classes(options: dict[str, Any], name: str, where: str) -> int:
    return _positive(options.get("classes", DEFAULT_CLASSES[name]), "classes", where)


def _spirals(n: int, rng: np.random.Generator, noise: float, options: dict[str, Any], fields: list[FieldSpec], where: str) -> Arrays:
    """The cs231n spirals: arm j has radius 0..1 and angle 4j..4(j+1) plus gaussian angle noise."""
    _dim(options, fields, where, fixed=2)
    classes = _classes(options, "spirals", where)
    xs, ys = [], []
    for arm in range(classes):
        count = n // classes + (1 if arm < n % classes else 0)
        radius = np.linspace(0.0, 1.0, count)
        theta = np.linspace(arm * 4.0, (arm + 1) * 4.0, count) + rng.standard_normal(count) * noise
        xs.append(np.stack([radius * np.sin(theta), radius * np.cos(theta)], axis=1))
        ys.append(np.full(count, arm, dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys), {"classes": classes}


def _moons(n: int, rng: np.random.Generator, noise: float, options: dict[str, Any], fields: list[FieldSpec], where: str) -> Arrays:
    _dim(options, fields, where, fixed=2)
    if _classes(options, "moons", where) != 2:
        raise DataError("moons has exactly 2 classes", source=where)
    outer, inner = n // 2, n - n // 2
    t_out, t_in = np.linspace(0.0, np.pi, outer), np.linspace(0.0, np.pi, inner)
    x = np.concatenate([
        np.stack([np.cos(t_out), np.sin(t_out)], axis=1),
        np.stack([1.0 - np.cos(t_in), 0.5 - np.sin(t_in)], axis=1),
    ])
    x = x + rng.standard_normal(x.shape) * noise
    y = np.concatenate([np.zeros(outer, np.int64), np.ones(inner, np.int64)])
    return x, y, {"classes": 2}


def _blobs(n: int, rng: np.random.Generator, noise: float, options: dict[str, Any], fields: list[FieldSpec], where: str) -> Arrays:
    dim = _dim(options, fields, where)
    classes = _classes(options, "blobs", where)
    centers = rng.uniform(-10.0, 10.0, size=(classes, dim))
    y = np.arange(n, dtype=np.int64) % classes
    x = centers[y] + rng.standard_normal((n, dim)) * noise
    return x, y, {"classes": classes, "centers": centers.tolist()}


def _linear(n: int, rng: np.random.Generator, noise: float, options: dict[str, Any], fields: list[FieldSpec], where: str) -> Arrays:
    """y = x @ w + noise, with w drawn first from the seed (so it is fixed for a seed)."""
    dim = _dim(options, fields, where)
    outputs = fields[1].size if len(fields) == 2 else 1
    w = rng.standard_normal((dim, outputs))
    x = rng.standard_normal((n, dim))
    y = x @ w + rng.standard_normal((n, outputs)) * noise
    return x, y, {"w": w.tolist()}


GENERATORS: dict[str, Callable[..., Arrays]] = {"spirals": _spirals, "moons": _moons, "blobs": _blobs, "linear": _linear}
