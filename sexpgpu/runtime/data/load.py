"""load_dataset: a loader spec in, its prepared (and cached) dataset out."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ...ir.data_options import source_problem, step_problem
from .cache import cache_key, data_cache, default_cache_dir, entry_name, load_cached, store
from .raw import Raw, read_raw, resolve_url
from .prepare import finish, run_prepare
from .sources import parse_source
from .spec import DataError, Dataset, LoaderSpec, hash_arrays


def load_dataset(spec: LoaderSpec, cache_dir: Optional[Path] = None, *, use_cache: bool = True) -> Dataset:
    try:
        check_declared_options(spec)
        dataset, raw = _load(spec, Path(cache_dir) if cache_dir is not None else default_cache_dir(), use_cache)
        if dataset.n < spec.batch:
            raise DataError(f"{dataset.n} examples{_part_note(dataset)} are fewer than one batch of {spec.batch}", source=raw.where)
        return dataset
    except DataError as error:
        if error.loader is None:
            error.loader = spec.name
        raise


def check_declared_options(spec: LoaderSpec) -> None:
    """The source's and the prepare steps' options against the table `check` uses
    (ir/data_options.py), before anything is read: the same messages as `check` gives."""
    fields = [f.name for f in spec.fields]
    problem = source_problem(spec.source.kind, spec.source.options, fields)
    where = resolve_url(spec.source.url, spec.base_dir) if spec.source.url else f"synthetic:{spec.source.options.get('name')}"
    if problem is not None:
        raise DataError(problem.message, source=where)
    for step in spec.prepare:
        problem = step_problem(step.kind, step.options, fields)
        if problem is not None:
            raise DataError(problem.message, source=where)


def _load(spec: LoaderSpec, cache_dir: Path, use_cache: bool) -> tuple[Dataset, Raw]:
    raw = read_raw(spec)
    key = cache_key(spec, raw.content_hash)
    cache = data_cache(cache_dir)
    found = (load_cached(path, spec) for path in cache.paths(entry_name(key))) if use_cache else iter(())
    cached = next((dataset for dataset in found if dataset is not None), None)
    if cached is not None:
        cached.meta.update(source=raw.where, cache="hit")
        return cached, raw
    dataset = _prepare(spec, raw, key)
    written = use_cache and store(cache, key, dataset, spec)
    dataset.meta["cache"] = "miss" if written else "off"
    return dataset, raw


def _prepare(spec: LoaderSpec, raw: Raw, key: str) -> Dataset:
    work = run_prepare(spec, parse_source(spec, raw))
    fields = finish(spec, work)
    n = len(next(iter(fields.values())))
    meta = {"source": raw.where, "source_hash": raw.content_hash, "cache_key": key, "n": n, **work.meta}
    return Dataset(fields, n, hash_arrays(fields), work.vocab, meta)


def _part_note(dataset: Dataset) -> str:
    split = dataset.meta.get("split")
    return f" in part '{split['part']}'" if isinstance(split, dict) else ""
