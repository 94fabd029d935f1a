"""Content fingerprints of loader sources, for the slug (docs/run.md, "The slug").

A local file's fingerprint is its size and the sha256 of its bytes, read in 1 MiB blocks.
It is kept in CACHE/fingerprints/KEY.json, KEY naming the file's absolute path, size and
modification time (in ns), so a large file is hashed once and only read again when it
changes. An object in a store (s3://...) is fingerprinted by its size and ETag, from one
info (HEAD) call. The cache is a speed-up only: an unwritable cache folder, or an entry that
does not parse or names another file, is a miss.

A source that cannot be read (missing, outside the data roots) is fingerprinted with its
problem, not read: the loader reports it when the run loads its data (exit 5).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ValidationError

from .. import diskcache
from ...ir.experiment import Experiment, LoaderRecord, SourceFingerprint
from .cache import default_cache_dir
from .raw import confine, has_protocol, read_bytes, resolve_url, url_errors
from .spec import DataError

BLOCK = 1 << 20
ENTRY_LIMIT = 64 * 1024  # a cache entry is a few hundred bytes


class CachedDigest(BaseModel):
    """CACHE/fingerprints/KEY.json: the sha256 of the file at PATH as it was (SIZE, MTIME_NS)."""

    path: str
    bytes: int
    mtime_ns: int
    sha256: str


def fingerprinted(experiment: Experiment, data_roots: tuple[str, ...] = (), cache_dir: Optional[Path] = None) -> Experiment:
    """EXPERIMENT with the fingerprint of every loader's file or URL (a synthetic loader has
    none: its options are its data). Sources are confined as the loader confines them: to
    the project and DATA_ROOTS. One already fingerprinted is returned as it is."""
    if experiment.data_sources is not None:
        return experiment
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    sources = {name: fingerprint_loader(record, data_roots, cache) for name, record in experiment.loaders.items() if record.source.url}
    return replace(experiment, data_sources=sources)


def fingerprint_loader(record: LoaderRecord, data_roots: tuple[str, ...], cache_dir: Path) -> SourceFingerprint:
    assert record.source.url is not None
    where = resolve_url(record.source.url, record.base_dir)
    try:
        confine(where, (record.root or record.base_dir, *data_roots))
        return fingerprint(where, cache_dir)
    except DataError as exc:
        return SourceFingerprint(source=where, problem=exc.what)


def fingerprint(where: str, cache_dir: Optional[Path] = None) -> SourceFingerprint:
    """The fingerprint of the file or URL WHERE (DataError when it cannot be read)."""
    if has_protocol(where) and not where.startswith("file://"):
        return _object_fingerprint(where)
    return _file_fingerprint(Path(where.removeprefix("file://")), cache_dir if cache_dir is not None else default_cache_dir())


def _file_fingerprint(path: Path, cache_dir: Path) -> SourceFingerprint:
    where = str(path)
    try:
        absolute = path.resolve()
        info = absolute.stat()
    except FileNotFoundError:
        raise DataError("file not found", source=where) from None
    except OSError as exc:
        raise DataError(f"cannot read: {exc.strerror or exc}", source=where) from None
    entry = _entry_path(cache_dir, str(absolute), info.st_size, info.st_mtime_ns)
    cached = _read_entry(entry, str(absolute), info.st_size, info.st_mtime_ns)
    if cached is not None:
        return SourceFingerprint(source=where, bytes=info.st_size, sha256=cached)
    digest, size = _stream_digest(absolute, where)
    if size == info.st_size:  # the file did not change while it was read: worth keeping
        _write_entry(entry, CachedDigest(path=str(absolute), bytes=size, mtime_ns=info.st_mtime_ns, sha256=digest))
    return SourceFingerprint(source=where, bytes=size, sha256=digest)


def _stream_digest(path: Path, where: str) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    try:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(BLOCK), b""):
                digest.update(block)
                size += len(block)
    except IsADirectoryError:
        raise DataError("is a folder, not a file", source=where) from None
    except OSError as exc:
        raise DataError(f"cannot read: {exc.strerror or exc}", source=where) from None
    return digest.hexdigest(), size


def _entry_path(cache_dir: Path, absolute: str, size: int, mtime_ns: int) -> Path:
    key = hashlib.sha256(f"{absolute}\0{size}\0{mtime_ns}".encode("utf-8", "surrogateescape")).hexdigest()
    return cache_dir / "fingerprints" / f"{key}.json"


def _read_entry(entry: Path, absolute: str, size: int, mtime_ns: int) -> Optional[str]:
    try:
        data = diskcache.read_entry(entry, ENTRY_LIMIT)
        cached = CachedDigest.model_validate_json(data) if data is not None else None
    except (diskcache.BadEntry, ValidationError, ValueError):
        return None
    if cached is None or (cached.path, cached.bytes, cached.mtime_ns) != (absolute, size, mtime_ns):
        return None
    return cached.sha256


def _write_entry(entry: Path, record: CachedDigest) -> None:
    """Published whole (diskcache.publish); nothing when the cache is not writable: the
    digest is then only computed again next time."""
    try:
        diskcache.publish(entry, lambda out: out.write(record.model_dump_json().encode("utf-8")))
    except OSError:
        pass


def _object_fingerprint(url: str) -> SourceFingerprint:
    """Size and ETag from one info call; an object store without ETags is read and hashed."""
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise DataError("reading URLs needs fsspec (pip install fsspec)", source=url) from None
    with url_errors(url):
        fs, path = url_to_fs(url)
        fs.invalidate_cache(path)
        info: dict[str, Any] = fs.info(path)
    if info.get("type") not in ("file", None):
        raise DataError("is a folder, not a file", source=url)
    size = int(info["size"]) if info.get("size") is not None else None
    etag = next((str(info[key]).strip('"') for key in ("ETag", "etag", "md5Hash") if info.get(key)), None)
    if etag is not None:
        return SourceFingerprint(source=url, bytes=size, etag=etag)
    data = read_bytes(url)
    return SourceFingerprint(source=url, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
