"""Where a store and a run are: the store a verb reads by default, RUN as a store and a slug,
and opening a store with an error that says what to do."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional

from ..runtime.store import Store

STORE_VARIABLE = "SEXPGPU_STORE"
DEFAULT_STORE = "./runs"


def default_store(environ: Mapping[str, str] = os.environ) -> str:
    """`$SEXPGPU_STORE`, else `./runs`."""
    return environ.get(STORE_VARIABLE) or DEFAULT_STORE


class CannotOpen(Exception):
    """The store cannot be opened here (a missing client library, a malformed URL): exit 4."""


class NoStore(Exception):
    """A local store folder that does not exist: exit 2."""


def open_store(url: str, must_exist: bool = False) -> Store:
    """The store at URL; CannotOpen says why not (the s3 client not installed, say), and with
    MUST_EXIST, NoStore when URL is a local folder that is not there."""
    try:
        store = Store.open(url)
    except ImportError as exc:
        raise CannotOpen(f"cannot open the store {url}: {exc} (for s3:// install the cluster extra: pip install 'sexpgpu[cluster]')") from exc
    except (ValueError, OSError) as exc:
        raise CannotOpen(f"cannot open the store {url}: {exc}") from exc
    if must_exist and store.is_local and not os.path.isdir(store.root):
        raise NoStore(f"no store at {store.root}: the folder does not exist (name one: STORE, or $SEXPGPU_STORE)")
    return store


def split_run(target: str, store: Optional[str] = None, environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """(store URL, slug) for RUN: the last path segment is the slug, the rest the store. With
    STORE, RUN is a slug in it; a bare slug that is no folder here is looked up in
    `$SEXPGPU_STORE`, else `./runs`. ValueError when RUN names no run folder."""
    if store is not None:
        slug = target.strip("/")
        if not slug or "/" in slug:
            raise ValueError(f"with --store, RUN is a slug (no '/'): {target}")
        return store, slug
    if "://" in target:
        protocol, rest = target.split("://", 1)
        rest = rest.rstrip("/")
        if not rest:
            raise ValueError(f"{target}: the URL names no run folder (its last segment is the slug)")
        if "/" in rest:
            root, slug = rest.rsplit("/", 1)
            return f"{protocol}://{root}", slug
        return f"{protocol}://", rest
    path = Path(target).expanduser()
    if "/" not in target.rstrip("/") and not path.exists():
        return default_store(environ), target.rstrip("/")
    path = path.resolve()
    if path.parent == path:
        raise ValueError(f"{target} is not a run folder")
    return str(path.parent), path.name
