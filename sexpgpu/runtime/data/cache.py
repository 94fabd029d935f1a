"""The content-addressed cache of prepared datasets.

A prepared dataset lives at CACHE/data/KEY.npz, KEY being the sha256 of the source's content
hash, the source kind and options, the prepare pipeline, the fields and the part. Files are
written to a temporary name and renamed, so readers never see half a file; one that does not
load or whose arrays no longer match their recorded hash counts as a miss and is rewritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ...ir.dtypes import DType, numpy_dtype
from .spec import Dataset, LoaderSpec, hash_arrays

CACHE_FORMAT = 2  # bump when preparation changes what it produces (2: synthetic examples interleaved)
META_KEY = "__meta__"


def default_cache_dir() -> Path:
    configured = os.environ.get("SEXPGPU_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "sexpgpu"


def cache_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / "data" / f"{key}.npz"


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
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as archive:
            record = json.loads(bytes(archive[META_KEY]).decode())
            fields = {f.name: _from_stored(archive[f"f{i}"], f.dtype) for i, f in enumerate(spec.fields)}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if record.get("fields") != [f.name for f in spec.fields] or hash_arrays(fields) != record.get("content_hash"):
        return None
    return Dataset(fields, int(record["n"]), record["content_hash"], record.get("vocab"), dict(record.get("meta", {})))


def store(path: Path, dataset: Dataset, spec: LoaderSpec) -> bool:
    """Write atomically; False when the cache folder is not writable (the cache is only a speed-up)."""
    record = {
        "fields": list(dataset.fields),
        "n": dataset.n,
        "content_hash": dataset.content_hash,
        "vocab": dataset.vocab,
        "meta": dataset.meta,
    }
    arrays: dict[str, Any] = {f"f{i}": _to_stored(dataset.fields[f.name], f.dtype) for i, f in enumerate(spec.fields)}
    arrays[META_KEY] = np.frombuffer(json.dumps(record).encode(), dtype=np.uint8)
    temporary: Optional[str] = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        with os.fdopen(handle, "wb") as out:
            np.savez(out, **arrays)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
        return True
    except OSError:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
        return False


def _to_stored(array: np.ndarray, dtype: DType) -> np.ndarray:
    # .npy has no bfloat16: keep its bits as uint16 and view them back on load.
    return array.view(np.uint16) if dtype is DType.bf16 else array


def _from_stored(array: np.ndarray, dtype: DType) -> np.ndarray:
    return array.view(numpy_dtype(dtype)) if dtype is DType.bf16 else array
