"""Source bytes: URL resolution against the run file's folder, reading through fsspec, decoding."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from .spec import DataError, LoaderSpec

SYNTHETIC_VERSION = 1  # bump when a generator's output changes, so cached datasets are remade


@dataclass(frozen=True)
class Raw:
    """A source's bytes (empty for synthetic) and the hash of its content."""

    where: str
    data: bytes
    content_hash: str


@dataclass(frozen=True)
class Origin:
    """Where examples came from, for error messages; `lines` maps example index to source line."""

    source: str
    lines: Optional[np.ndarray] = None

    def error(self, what: str, *, example: Optional[int] = None, field: Optional[str] = None, line: Optional[int] = None) -> DataError:
        if line is None and example is not None and self.lines is not None:
            line = int(self.lines[example])
        return DataError(what, source=self.source, line=line, example=None if line is not None else example, field=field)


def has_protocol(url: str) -> bool:
    head, sep, _ = url.partition("://")
    return bool(sep) and head.replace("+", "").replace("-", "").isalnum()


def resolve_url(url: str, base_dir: str) -> str:
    if has_protocol(url):
        return url
    path = Path(os.path.expanduser(url))
    return str(path if path.is_absolute() else Path(base_dir) / path)


def read_raw(spec: LoaderSpec) -> Raw:
    source = spec.source
    if source.kind == "synthetic":
        name = source.options.get("name", "?")
        canonical = json.dumps({"synthetic": source.options, "version": SYNTHETIC_VERSION}, sort_keys=True, default=str)
        return Raw(f"synthetic:{name}", b"", hashlib.sha256(canonical.encode()).hexdigest())
    if not source.url:
        raise DataError(f"the {source.kind} source needs a file or URL")
    where = resolve_url(source.url, spec.base_dir)
    if spec.roots:
        confine(where, spec.roots)
    data = read_bytes(where)
    if not data:
        raise DataError("empty source (the file has 0 bytes)", source=where)
    return Raw(where, data, hashlib.sha256(data).hexdigest())


DATA_ROOT_HELP = "declare its folder (or URL prefix) with --data-root, or in $SEXPGPU_DATA_ROOTS"
SYSTEM_FOLDERS = ("/proc", "/sys", "/dev")


def confine(where: str, roots: tuple[str, ...]) -> None:
    """A source is read only inside ROOTS (the project root first, then the data roots the
    user declared; URL roots are prefixes): a run file cannot make a run read ~/.bashrc,
    /etc/passwd or /proc/self/environ into its cache. Special files are refused too."""
    if has_protocol(where) and not where.startswith("file://"):
        if not any(has_protocol(root) and where.startswith(root.rstrip("/") + "/") for root in roots):
            raise DataError(f"the URL is outside the store and the declared data roots; {DATA_ROOT_HELP}", source=where)
        return
    real = os.path.realpath(where.removeprefix("file://"))  # links resolved: a link inside may point out
    inside = [root for root in roots if not has_protocol(root) and _within(real, os.path.realpath(root))]
    if not inside or any(_within(real, folder) for folder in SYSTEM_FOLDERS):
        named = ", ".join(root for root in roots[:3])
        raise DataError(f"outside the project and the declared data roots ({named}); {DATA_ROOT_HELP}", source=where)
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        raise DataError("file not found", source=where) from None
    except OSError as exc:
        raise DataError(f"cannot read: {exc.strerror or exc}", source=where) from None
    if stat.S_ISDIR(mode):
        raise DataError("is a folder, not a file", source=where)
    if not stat.S_ISREG(mode):
        raise DataError("is not a regular file (a device, a FIFO or a socket): refused", source=where)


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def read_bytes(url: str) -> bytes:
    try:
        import fsspec
    except ImportError:  # fsspec is an optional dependency; plain paths work without it
        return _read_local(url)
    with url_errors(url):
        with fsspec.open(url, "rb") as handle:
            return bytes(handle.read())


@contextmanager
def url_errors(url: str) -> Iterator[None]:
    """What reading URL through fsspec raises, as the DataError that names it."""
    try:
        yield
    except FileNotFoundError:
        raise DataError("file not found", source=url) from None
    except IsADirectoryError:
        raise DataError("is a folder, not a file", source=url) from None
    except ImportError as exc:
        raise DataError(f"cannot read this URL here: {exc}", source=url) from None
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read: {exc}", source=url) from None


def _read_local(url: str) -> bytes:
    if has_protocol(url) and not url.startswith("file://"):
        raise DataError("reading URLs needs fsspec (pip install fsspec)", source=url)
    path = Path(url.removeprefix("file://"))
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise DataError("file not found", source=url) from None
    except IsADirectoryError:
        raise DataError("is a folder, not a file", source=url) from None
    except OSError as exc:
        raise DataError(f"cannot read: {exc.strerror or exc}", source=url) from None


def decode_utf8(raw: Raw) -> str:
    try:
        return raw.data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.data.count(b"\n", 0, exc.start) + 1
        raise DataError(f"not UTF-8 text (byte {exc.start}: {raw.data[exc.start:exc.start + 1]!r})", source=raw.where, line=line) from None
