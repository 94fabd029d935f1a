"""Prepare steps (char-vocab, windows, split, normalize) and the final selection of a part."""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import numpy as np

from .check import check_counts, coerce_array, show_shape
from .sources import Work
from .spec import LoaderSpec, PrepareStep

Step = Callable[[Work, dict[str, Any], LoaderSpec, list[PrepareStep]], None]


def run_prepare(spec: LoaderSpec, work: Work) -> Work:
    for i, step in enumerate(spec.prepare):
        STEPS[step.kind](work, step.options, spec, spec.prepare[i + 1:])
    return work


def finish(spec: LoaderSpec, work: Work) -> dict[str, np.ndarray]:
    """The declared fields of the selected part, checked against the field specs."""
    if work.text is not None:
        raise work.origin.error("a text source needs (char-vocab) and then (windows) to become examples")
    if work.stream is not None:
        raise work.origin.error("a token stream needs (windows) to become examples")
    missing = [f.name for f in spec.fields if f.name not in work.columns]
    if missing:
        raise work.origin.error(f"no data for field {', '.join(map(repr, missing))}")
    columns = {f.name: coerce_array(work.columns[f.name], f, work.origin) for f in spec.fields}
    check_counts(columns, work.origin)
    if work.split is None:
        return columns
    part = spec.resolved_part()
    if part not in ("train", "val"):
        raise work.origin.error(f"part {part!r} is not one a split makes (train, val)")
    rows = work.split[0] if part == "train" else work.split[1]
    if len(rows) == 0:
        raise work.origin.error(f"part '{part}' of the split is empty ({work.n} examples, {work.meta['split']['train']} in train)")
    return {name: np.ascontiguousarray(array[rows]) for name, array in columns.items()}


def _char_vocab(work: Work, options: dict[str, Any], spec: LoaderSpec, rest: list[PrepareStep]) -> None:
    if work.text is None:
        raise work.origin.error("(char-vocab) needs a text source")
    if not work.text:
        raise work.origin.error("empty source (no characters)")
    points = np.frombuffer(work.text.encode("utf-32-le"), dtype=np.uint32)
    codes, ids = np.unique(points, return_inverse=True)  # sorted by code point
    work.stream = ids.astype(np.int64).reshape(-1)
    work.vocab, work.text = [chr(int(code)) for code in codes], None
    work.meta["vocab_size"] = len(work.vocab)


def _windows(work: Work, options: dict[str, Any], spec: LoaderSpec, rest: list[PrepareStep]) -> None:
    length = _int_option(options, "length", None, work)
    stride = _int_option(options, "stride", length, work)
    if work.stream is None:
        raise work.origin.error("(windows) needs a token stream: a text source after (char-vocab), or a 1-D npy array")
    tokens = len(work.stream)
    if tokens < length:
        raise work.origin.error(f"{tokens} tokens are fewer than one window of {length}")
    windows = np.lib.stride_tricks.sliding_window_view(work.stream, length)[::stride]
    work.columns = _window_fields(windows, length, spec, work)
    work.stream = None
    work.meta["windows"] = {"length": length, "stride": stride, "count": len(windows), "tokens": tokens}


def _window_fields(windows: np.ndarray, length: int, spec: LoaderSpec, work: Work) -> dict[str, np.ndarray]:
    """One field of length L gets the window; two of length L-1 get window[:-1] and window[1:]."""
    shapes = [f.shape for f in spec.fields]
    if shapes == [(length,)]:
        return {spec.fields[0].name: np.ascontiguousarray(windows)}
    if shapes == [(length - 1,), (length - 1,)]:
        first, second = spec.fields
        return {first.name: np.ascontiguousarray(windows[:, :-1]), second.name: np.ascontiguousarray(windows[:, 1:])}
    declared = ", ".join(f"'{f.name}' {show_shape(f.shape)}" for f in spec.fields)
    raise work.origin.error(
        f"windows of length {length} fill one field of shape ({length}) or two of shape ({length - 1}) "
        f"(inputs and next-token targets); declared: {declared}"
    )


def _split(work: Work, options: dict[str, Any], spec: LoaderSpec, rest: list[PrepareStep]) -> None:
    if work.text is not None or work.stream is not None:
        raise work.origin.error("(split) needs examples; put it after (windows)")
    train, val = split_rows(work.n, options, work)
    work.split = (train, val)
    work.meta["split"] = {"train": len(train), "val": len(val), "part": spec.resolved_part(), "seed": int(options.get("seed", 0))}


def split_rows(n: int, options: dict[str, Any], work: Work) -> tuple[np.ndarray, np.ndarray]:
    """A seeded permutation; "train" is its first floor(n * fraction) rows, "val" the rest."""
    fraction = options.get("train")
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0.0 < fraction < 1.0:
        raise work.origin.error(f"(split) needs :train FRACTION with 0 < FRACTION < 1, got {fraction!r}")
    seed = _int_option(options, "seed", 0, work, minimum=None)
    order = np.random.Generator(np.random.PCG64(seed % 2**64)).permutation(n)
    cut = math.floor(n * fraction + 1e-9)
    return order[:cut], order[cut:]


def _normalize(work: Work, options: dict[str, Any], spec: LoaderSpec, rest: list[PrepareStep]) -> None:
    name = options.get("field")
    if name not in work.columns:
        raise work.origin.error(f"(normalize) names field {name!r}, which has no data here", field=name if isinstance(name, str) else None)
    column = work.columns[name]
    if column.dtype.kind not in "fV":
        raise work.origin.error(f"(normalize) needs a float field; this one is {column.dtype}", field=name)
    values = column.astype(np.float64)
    rows = _train_rows(work, rest)
    if rows is not None and len(rows) == 0:
        raise work.origin.error("(normalize) has no train examples to fit on", field=name)
    fit = values if rows is None else values[rows]
    mean, std = fit.mean(axis=0), fit.std(axis=0)
    std = np.where(std > 0, std, 1.0)  # a constant feature stays constant instead of dividing by zero
    work.columns[name] = ((values - mean) / std).astype(column.dtype)
    work.meta.setdefault("normalize", {})[name] = {"mean": mean.tolist(), "std": std.tolist()}


def _train_rows(work: Work, rest: list[PrepareStep]) -> Optional[np.ndarray]:
    """The train part's rows, also when (split) comes later in the pipeline; None without a split."""
    if work.split is not None:
        return work.split[0]
    for step in rest:
        if step.kind == "split":
            return split_rows(work.n, step.options, work)[0]
    return None


def _int_option(options: dict[str, Any], name: str, default: Optional[int], work: Work, minimum: Optional[int] = 1) -> int:
    value = options.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or (minimum is not None and value < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise work.origin.error(f"option {name} must be an integer{bound}, got {value!r}")
    return value


STEPS: dict[str, Step] = {"char-vocab": _char_vocab, "windows": _windows, "split": _split, "normalize": _normalize}
