"""The content-addressed cache of prepared datasets.

A prepared dataset lives at CACHE/data/KEY.npz, KEY being the sha256 of the source's content
hash, the source kind and options, the prepare pipeline, the fields and the part. Files are
written to a temporary name, flushed and renamed (diskcache.py), so readers never see half a
file; one that is not a regular file, does not load, or whose arrays no longer match their
recorded hash counts as a miss and is rewritten. When the folder cannot be written, the
dataset goes to the process's private cache (diskcache.py says so once).
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ...ir.dtypes import DType, numpy_dtype
from ..diskcache import BadEntry, Cache, cache_root, open_entry
from .spec import Dataset, LoaderSpec, hash_arrays

CACHE_FORMAT = 2  # bump when preparation changes what it produces (2: synthetic examples interleaved)
META_KEY = "__meta__"


def default_cache_dir() -> Path:
    return cache_root()


def data_cache(cache_dir: Path) -> Cache:
    return Cache(cache_dir, "data")


def entry_name(key: str) -> str:
    return f"{key}.npz"


def cache_key(spec: LoaderSpec, source_hash: str) -> str:
    recipe = {
        "format": CACHE_FORMAT,
        "source": {"kind": spec.source.kind, "hash": source_hash, "options": spec.source.options},
        "prepare": [step.model_dump(mode="json") for step in spec.prepare],
        "fields": [f.model_dump(mode="json") for f in spec.fields],
        "part": spec.resolved_part() if any(step.kind == "split" for step in spec.prepare) else None,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True, default=str).encode()).hexdigest()


def load_cached(path: Path, spec: LoaderSpec) -> Optional[Dataset]:
    try:
        handle = open_entry(path)
        if handle is None:
            return None
        with handle, np.load(handle, allow_pickle=False) as archive:
            record = json.loads(bytes(archive[META_KEY]).decode())
            fields = {f.name: _from_stored(archive[f"f{i}"], f.dtype) for i, f in enumerate(spec.fields)}
    except (BadEntry, OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if record.get("fields") != [f.name for f in spec.fields] or hash_arrays(fields) != record.get("content_hash"):
        return None
    return Dataset(fields, int(record["n"]), record["content_hash"], record.get("vocab"), dict(record.get("meta", {})))


def entry_problem(path: Path) -> Optional[str]:
    """None when PATH is a readable prepared dataset (its archive and record; doctor's check,
    which does not read the arrays), else what is wrong with it."""
    try:
        handle = open_entry(path)
        if handle is None:
            return "gone"
        with handle, np.load(handle, allow_pickle=False) as archive:
            json.loads(bytes(archive[META_KEY]).decode())["content_hash"]
    except BadEntry as exc:
        return str(exc)
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile, json.JSONDecodeError, UnicodeDecodeError):
        return "not a prepared dataset (truncated or overwritten)"
    return None


def store(cache: Cache, key: str, dataset: Dataset, spec: LoaderSpec) -> bool:
    """Write atomically (in the private cache when the folder cannot be written); False when
    not even that can be written (the cache is only a speed-up)."""
    record = {
        "fields": list(dataset.fields),
        "n": dataset.n,
        "content_hash": dataset.content_hash,
        "vocab": dataset.vocab,
        "meta": dataset.meta,
    }
    arrays: dict[str, Any] = {f"f{i}": _to_stored(dataset.fields[f.name], f.dtype) for i, f in enumerate(spec.fields)}
    arrays[META_KEY] = np.frombuffer(json.dumps(record).encode(), dtype=np.uint8)
    try:
        cache.write(entry_name(key), lambda out: np.savez(out, **arrays))
    except OSError:
        return False
    return True


def _to_stored(array: np.ndarray, dtype: DType) -> np.ndarray:
    # .npy has no bfloat16: keep its bits as uint16 and view them back on load.
    return array.view(np.uint16) if dtype is DType.bf16 else array


def _from_stored(array: np.ndarray, dtype: DType) -> np.ndarray:
    return array.view(numpy_dtype(dtype)) if dtype is DType.bf16 else array
