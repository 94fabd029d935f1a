"""Bundles: one self-contained directory that runs anywhere (cluster.md).

    BUNDLE/bundle.json     the manifest (format, slug, selection, knobs, hashes, data, devices)
    BUNDLE/source/...      the run file and every module it required, at their paths relative
                           to the project root, plus small local data files at theirs
    BUNDLE/ir.json         the compiled IR

`sexpgpu run BUNDLE` recompiles from source/ with the recorded selection and refuses when the
IR hash differs, so a bundle can never run something other than what was bundled.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, Field

from . import __version__
from .outcome import Exit
from .compile.pipeline import CompileResult, compile_file
from .ir.experiment import Experiment, Selection
from .lisp.modules import find_project_root
from .runtime.data.raw import has_protocol
from .runtime.runfolder import run_slug
from .runtime.store import Store

FORMAT_VERSION = 1
MAX_COPIED_BYTES = 64 * 1024 * 1024  # local data larger than this must be a URL workers can read


class BundleError(Exception):
    """The bundle cannot be made or run; the message says why and what to do. CODE: a
    file that does not check (3), or data a bundle cannot carry (5)."""

    def __init__(self, message: str, code: Exit = Exit.CHECK_FAILED) -> None:
        super().__init__(message)
        self.code = code


class DataEntry(BaseModel):
    loader: str
    url: str  # a path inside source/ (copied) or a URL the workers read
    copied: bool
    sha256: str
    bytes: int


class BundleManifest(BaseModel):
    format_version: int = FORMAT_VERSION
    slug: str
    main: str  # the run file's path inside source/
    selection: Selection
    knobs: dict[str, Any]
    source_hash: str
    ir_hash: str
    sexpgpu_version: str = __version__
    data: list[DataEntry] = Field(default_factory=list)
    devices: list[str] = Field(default_factory=lambda: ["cpu"])


def make_bundle(path: Path, selection: Selection, out: str, devices: Optional[list[str]] = None) -> tuple[BundleManifest, CompileResult]:
    """Compile PATH and write its bundle to OUT (a folder or an fsspec URL)."""
    result = compile_file(path, selection)
    return write_bundle(path, result, out, devices), result


def write_bundle(path: Path, result: CompileResult, out: str, devices: Optional[list[str]] = None) -> BundleManifest:
    """Write the bundle of PATH, compiled as RESULT (a sweep's points are compiled once,
    before any is bundled), to OUT."""
    if result.experiment is None or result.program is None:
        raise _failed(result)
    experiment, program = result.experiment, result.program
    root = find_project_root(path)
    files: dict[str, bytes] = {}
    for f in program.files:
        files[_relative(f, root)] = f.read_bytes()
    data = []
    for name, loader in experiment.loaders.items():
        url = loader.source.url
        if not url:
            continue
        entry, payload = data_entry(name, url, loader.base_dir, root)
        data.append(entry)
        if payload is not None:
            files[entry.url] = payload
    manifest = BundleManifest(
        slug=run_slug(experiment),
        main=_relative(path.resolve(), root),
        selection=experiment.selection,
        knobs=experiment.knob_values(),
        source_hash=experiment.source_hash,
        ir_hash=experiment.ir_hash,
        data=data,
        devices=devices or ["cpu"],
    )
    store = Store.open(out)
    for name, payload in files.items():
        store.write_bytes(f"source/{name}", payload)
    store.write_text("ir.json", experiment.module.model_dump_json())
    store.write_text("bundle.json", manifest.model_dump_json(indent=2))  # last: the bundle exists once this does
    return manifest


def _failed(result: CompileResult) -> BundleError:
    errors = [d.headline() for d in result.diagnostics if d.severity == "error"]
    return BundleError("the file does not check: " + "; ".join(errors)) if errors else BundleError("not a run file (no defrun)")


def _relative(path: Path, root: Path) -> str:
    rel = os.path.relpath(path.resolve(), root)
    if rel.startswith(".."):
        raise BundleError(f"{path} is outside the project root {root}")
    return rel.replace(os.sep, "/")


def data_entry(loader: str, url: str, base_dir: str, root: Path) -> tuple[DataEntry, Optional[bytes]]:
    """A data source as the bundle carries it: local files are copied (when small enough)
    at their place relative to the project root; URLs must be readable now, from here."""
    if has_protocol(url) and not url.startswith("file://"):
        try:
            import fsspec

            with fsspec.open(url, "rb") as f:
                payload = f.read()
        except Exception as exc:  # any failure to read is the answer: workers could not either
            raise BundleError(f"loader {loader}: {url} cannot be read from here ({type(exc).__name__}: {exc}); workers need a URL they can read", Exit.DATA) from None
        return DataEntry(loader=loader, url=url, copied=False, sha256=hashlib.sha256(payload).hexdigest(), bytes=len(payload)), None
    local = Path(url[len("file://") :] if url.startswith("file://") else url)
    if not local.is_absolute():
        local = Path(base_dir) / local
    if not local.is_file():
        raise BundleError(f"loader {loader}: no file {local}", Exit.DATA)
    size = local.stat().st_size
    if size > MAX_COPIED_BYTES:
        raise BundleError(f"loader {loader}: {local} is {size:,} bytes, more than a bundle copies ({MAX_COPIED_BYTES:,}); put it at a URL the workers can read (s3://...) and name that URL in the run file", Exit.DATA)
    try:
        rel = _relative(local, root)
    except BundleError:
        raise BundleError(f"loader {loader}: {local} is outside the project root {root}; copy it inside, or use a URL", Exit.DATA) from None
    payload = local.read_bytes()
    return DataEntry(loader=loader, url=rel, copied=True, sha256=hashlib.sha256(payload).hexdigest(), bytes=len(payload)), payload


def is_bundle(location: str) -> bool:
    try:
        return Store.open(location).exists("bundle.json")
    except Exception:  # not a store we can open: not a bundle
        return False


def unpack(location: str, into: Optional[Path] = None) -> tuple[BundleManifest, Path]:
    """Read a bundle (folder or URL) into a local folder; returns its manifest and the run
    file's local path. Data files are checked against their hashes."""
    store = Store.open(location)
    manifest = BundleManifest.model_validate_json(store.read_bytes("bundle.json"))
    if manifest.format_version != FORMAT_VERSION:
        raise BundleError(f"bundle format {manifest.format_version}; this sexpgpu reads {FORMAT_VERSION}")
    target = into or Path(tempfile.mkdtemp(prefix="sexpgpu-bundle-"))
    (target / "sexpgpu.toml").write_text("# the project root of an unpacked bundle\n")
    for name in store.list("source"):
        local = target / name[len("source/") :]
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(store.read_bytes(name))
    for entry in manifest.data:
        if entry.copied:
            digest = hashlib.sha256((target / entry.url).read_bytes()).hexdigest()
            if digest != entry.sha256:
                raise BundleError(f"bundle data {entry.url} does not match its sha256 in bundle.json", Exit.DATA)
    return manifest, target / manifest.main


def compile_bundle(location: str, world: int = 1) -> tuple[BundleManifest, CompileResult]:
    """Recompile a bundle from its source with its selection (and WORLD data-parallel ranks'
    programs); refuse another IR."""
    manifest, main = unpack(location)
    result = compile_file(main, manifest.selection, world=world)
    experiment: Optional[Experiment] = result.experiment
    if experiment is not None and experiment.ir_hash != manifest.ir_hash:
        raise BundleError(f"the bundle's source compiles to IR {experiment.ir_hash[:12]}, but bundle.json records {manifest.ir_hash[:12]}: refusing to run something else than what was bundled")
    return manifest, result
