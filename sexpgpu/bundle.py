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
import shutil
import tempfile
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from pydantic import BaseModel, Field

from . import __version__
from .outcome import Exit
from .compile.pipeline import CompileResult, SharedCompile, compile_file, plan_groups, resolve_selection, system_image
from .compile.selection import Declared, prescan
from .compile.sweep_groups import group_key
from .ir.experiment import Experiment, Selection, SourceFingerprint
from .lisp.conditions import LispError
from .lisp.image import SystemImage
from .lisp.modules import find_project_root
from .records import dump_json
from .runtime.data.fingerprint import fingerprint
from .runtime.data.raw import has_protocol
from .runtime.lease import process_alive
from .runtime.runfolder import run_slug
from .runtime.store import NotARegularFile, Store, UnexpectedSize

FORMAT_VERSION = 1
MAX_COPIED_BYTES = 64 * 1024 * 1024  # local data larger than this must be a URL workers can read


class BundleError(Exception):
    """The bundle cannot be made or run; the message says why and what to do. CODE: a
    file that does not check (3), or data a bundle cannot carry (5)."""

    def __init__(self, message: str, code: Exit = Exit.CHECK_FAILED) -> None:
        super().__init__(message)
        self.code = code


class DataEntry(BaseModel):
    """A loader's data as the bundle carries it, fingerprinted as the slug fingerprints it
    (runtime/data/fingerprint.py): a copied file by its sha256, a URL by its ETag where the
    store gives one (else its sha256)."""

    loader: str
    url: str  # a path inside source/ (copied) or a URL the workers read
    copied: bool
    sha256: Optional[str] = None
    bytes: Optional[int] = None
    etag: Optional[str] = None

    def fingerprint(self, source: str) -> SourceFingerprint:
        return SourceFingerprint(source=source, bytes=self.bytes, sha256=self.sha256, etag=self.etag)


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


def write_bundle(path: Path, result: CompileResult, out: "str | Store", devices: Optional[list[str]] = None) -> BundleManifest:
    """Write the bundle of PATH, compiled as RESULT (a sweep's points are compiled once,
    before any is bundled), to OUT (a URL, or the store of the bundle's folder)."""
    if result.experiment is None or result.program is None:
        raise _failed(result)
    experiment, program = result.experiment, result.program
    root = find_project_root(path)
    files: dict[str, bytes] = {}
    for f in program.files:
        files[_relative(f, root)] = f.read_bytes()
    data = []
    sources: dict[str, SourceFingerprint] = {}
    for name, loader in experiment.loaders.items():
        url = loader.source.url
        if not url:
            continue
        entry, payload = data_entry(name, url, loader.base_dir, root)
        data.append(entry)
        sources[name] = entry.fingerprint(url)
        if payload is not None:
            files[entry.url] = payload
    if experiment.data_sources is None:  # the slug covers the data as the workers will read it
        experiment = replace(experiment, data_sources=sources)
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
    store = out if isinstance(out, Store) else Store.open(out)
    for name, payload in files.items():
        store.write_bytes(f"source/{name}", payload)
    store.write_bytes("ir.json", dump_json(experiment.module))
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
            found = fingerprint(url)  # one info call: the object's size and ETag
        except Exception as exc:  # any failure to read is the answer: workers could not either
            raise BundleError(f"loader {loader}: {url} cannot be read from here ({type(exc).__name__}: {exc}); workers need a URL they can read", Exit.DATA) from None
        return DataEntry(loader=loader, url=url, copied=False, sha256=found.sha256, bytes=found.bytes, etag=found.etag), None
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


@dataclass(frozen=True)
class Unpacked:
    """A bundle unpacked into a temporary project: its manifest and the run file there."""

    manifest: BundleManifest
    root: Path
    main: Path


MANIFEST_LIMIT = 16 * 1024 * 1024  # a bundle.json lists files; one this large is not one


@contextmanager
def unpacked(location: str) -> Iterator[Unpacked]:
    """The bundle at LOCATION (a folder or a URL) in a temporary project, removed when the
    block ends. Every path the bundle names stays inside it, or the bundle is refused (exit
    4) before anything is read; copied data must match its sha256 (exit 5)."""
    remove_orphans(Path(tempfile.gettempdir()))
    target = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-"))
    try:
        yield unpack_into(location, target)
    finally:
        shutil.rmtree(target, ignore_errors=True)


TEMP_PREFIX = "sexpgpu-bundle-"


def remove_orphans(folder: Path) -> None:
    """Remove the temporary projects of processes that are gone (a worker killed outright
    cannot remove its own)."""
    for path in folder.glob(f"{TEMP_PREFIX}*-*"):
        pid = path.name[len(TEMP_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def unpack_into(location: str, target: Path, store: Optional[Store] = None) -> Unpacked:
    """The bundle at LOCATION (read through STORE, its store, when the caller has it open)
    unpacked into TARGET."""
    store = store or Store.open(location)
    manifest = read_manifest(store)
    main = inside(target, manifest.main, "main")
    copied = {entry.url: inside(target, entry.url, f"data of loader {entry.loader}") for entry in manifest.data if entry.copied}
    names = store.list("source")
    files = [(name, inside(target, name[len("source/"):], "a file")) for name in names]
    (target / "sexpgpu.toml").write_text("# the project root of an unpacked bundle\n")
    for name, local in files:
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            store.copy_to_local(name, local)  # streamed: a bundle's data may be large
        except NotARegularFile:  # a link or a FIFO: never followed, never waited on
            raise BundleError(f"{store.url_of(name)} is not a regular file (a link, a FIFO or a device): a bundle holds only files", Exit.CANNOT_START) from None
    for entry in manifest.data:
        if entry.copied:
            if file_digest(copied[entry.url]) != entry.sha256:
                raise BundleError(f"bundle data {entry.url} does not match its sha256 in bundle.json", Exit.DATA)
    if not main.is_file():
        raise BundleError(f"bundle.json names main {manifest.main!r}, which the bundle does not hold", Exit.CANNOT_START)
    return Unpacked(manifest, target, main)


def read_manifest(store: Store) -> BundleManifest:
    try:
        manifest = BundleManifest.model_validate_json(store.read_bytes("bundle.json", limit=MANIFEST_LIMIT))
    except ValueError as exc:
        raise BundleError(f"bundle.json is malformed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})", Exit.CANNOT_START) from None
    except (NotARegularFile, UnexpectedSize) as exc:
        raise BundleError(f"bundle.json refused: {exc}", Exit.CANNOT_START) from None
    if manifest.format_version != FORMAT_VERSION:
        raise BundleError(f"bundle format {manifest.format_version}; this sexpgpu reads {FORMAT_VERSION}", Exit.CANNOT_START)
    return manifest


def inside(root: Path, relative: str, what: str) -> Path:
    """ROOT/RELATIVE, for a path that is relative, normalised (no `.`, `..` or empty parts,
    no `\\`) and stays inside ROOT; else the bundle is refused."""
    parts = relative.split("/")
    if (not relative or relative.startswith("/") or "\\" in relative or "\x00" in relative
            or any(part in ("", ".", "..") for part in parts) or len(relative) > 4096):
        raise BundleError(f"bundle.json or the bundle's files name {what} at {relative[:200]!r}: a bundle's paths must be "
                          "relative, normalised and inside it", Exit.CANNOT_START)
    local = root.joinpath(*parts)
    if not local.resolve().is_relative_to(root.resolve()):
        raise BundleError(f"{what} {relative[:200]!r} leads outside the bundle", Exit.CANNOT_START)
    return local


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def data_changed(manifest: BundleManifest, experiment: Experiment) -> Optional[str]:
    """What differs between the URL data the bundle was made with and what the workers
    find there now (copied data is checked against its sha256 when unpacked)."""
    found = experiment.data_sources or {}
    for entry in manifest.data:
        now = found.get(entry.loader)
        if entry.copied or now is None:
            continue
        if now.identity() != entry.fingerprint(entry.url).identity():
            return (f"loader {entry.loader}: {entry.url} changed since the bundle was made (it was {entry.fingerprint(entry.url).describe()}, "
                    f"it is {now.describe()}); make the bundle again")
    return None


def compile_unpacked(bundle: Unpacked, world: int = 1, image: Optional[SystemImage] = None) -> CompileResult:
    """Recompile an unpacked bundle's source with its selection (and WORLD data-parallel
    ranks' programs; IMAGE: the system texts, read before by a caller that compiles many
    times); refuse another IR."""
    manifest = bundle.manifest
    result = compile_file(bundle.main, manifest.selection, world=world, image=image)
    experiment: Optional[Experiment] = result.experiment
    if experiment is not None and experiment.ir_hash != manifest.ir_hash:
        raise BundleError(f"the bundle's source compiles to IR {experiment.ir_hash[:12]}, but bundle.json records {manifest.ir_hash[:12]}: refusing to run something else than what was bundled")
    return result


class CompileCounts(BaseModel):
    """What a BundleCompiles did: the compiles it ran (a point's own, a shape group's probe)
    and the points it bound from a shape group compiled before, without compiling."""

    own: int = 0
    probes: int = 0
    bound: int = 0
    projects_kept: int = 0  # bundles unpacked whose source a kept project already held


GroupKey = tuple[str, int, int]  # the selection but its point, the world, the group's first point


@dataclass
class KeptProject:
    """An unpacked bundle kept for the next points of its sweep: its project (the compiled
    results name its files), the sweep's pre-read, its last shape groups compiled and the
    last points compiled on their own (a group's first point: its probe is compiled when a
    second point of the group comes)."""

    bundle: Unpacked
    declared: Optional[Declared] = None
    groups: OrderedDict[GroupKey, tuple[frozenset[int], SharedCompile]] = field(default_factory=OrderedDict)
    firsts: OrderedDict[tuple[str, int, int], CompileResult] = field(default_factory=OrderedDict)
    alone: set[tuple[str, int, int]] = field(default_factory=set)  # points whose group is compiled point by point

    def group_of(self, base: str, world: int, point: int) -> Optional[SharedCompile]:
        for key, (members, shared) in self.groups.items():
            if key[:2] == (base, world) and point in members:
                self.groups.move_to_end(key)
                return shared
        return None


MOST_KEPT = 4  # shape groups, and points compiled on their own, per kept project


def bounded(kept: OrderedDict[Any, Any], key: Any, value: Any, most: int = MOST_KEPT) -> None:
    kept[key] = value
    kept.move_to_end(key)
    while len(kept) > most:
        kept.popitem(last=False)


class BundleCompiles:
    """A worker's compiles of the bundles it ran, for the next points of the same sweep: the
    last ENTRIES unpacked projects by the digest of their bytes, each with its sweep's last
    shape groups (pipeline.plan_groups: the path the driver's compile takes, the probe
    checked against the group's first point), so that a point of a group compiled before is
    bound from it without compiling. Every result still has the IR hash its bundle records,
    or the point is compiled on its own and refused as compile_unpacked refuses. A worker
    owns one; nothing is shared between instances."""

    def __init__(self, entries: int = 2, stores: Optional[Callable[[str], Store]] = None) -> None:
        """STORES: how a bundle's store is opened (the worker's KeptStores); else Store.open."""
        self.entries = entries
        self.stores: Callable[[str], Store] = stores or Store.open
        self.kept: OrderedDict[str, KeptProject] = OrderedDict()
        self.counts = CompileCounts()
        self.image: Optional[SystemImage] = None  # the system texts, read once for every compile here

    def warm(self) -> SystemImage:
        """The system texts every compile here reads, read now (once)."""
        if self.image is None:
            self.image = system_image()
        return self.image

    @contextmanager
    def unpacked(self, location: str) -> Iterator[Unpacked]:
        """The bundle at LOCATION unpacked: in a kept project when one holds the same bytes
        (the new copy is removed), else in its own, kept for the next points (the oldest kept
        one is removed past ENTRIES)."""
        remove_orphans(Path(tempfile.gettempdir()))
        target = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-"))
        try:
            fresh = unpack_into(location, target, self.stores(location))
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        digest = project_digest(fresh.root)
        kept = self.kept.get(digest)
        if kept is not None and kept.bundle.main == kept.bundle.root / fresh.main.relative_to(fresh.root):
            shutil.rmtree(target, ignore_errors=True)
            self.kept.move_to_end(digest)
            self.counts.projects_kept += 1
            yield replace(kept.bundle, manifest=fresh.manifest)
            return
        self.kept[digest] = KeptProject(fresh)
        while len(self.kept) > self.entries:
            _, old = self.kept.popitem(last=False)
            shutil.rmtree(old.bundle.root, ignore_errors=True)
        yield fresh

    def close(self) -> None:
        """Remove every kept project."""
        while self.kept:
            shutil.rmtree(self.kept.popitem()[1].bundle.root, ignore_errors=True)

    def compile(self, bundle: Unpacked, world: int = 1) -> CompileResult:
        """compile_unpacked's result for BUNDLE (given by `unpacked`), bound from its shape
        group when that group was compiled before."""
        manifest = bundle.manifest
        kept = next((k for k in self.kept.values() if k.bundle.root == bundle.root), None)
        selection = manifest.selection
        if kept is None or selection.sweep is None or selection.point is None:
            return self.own(bundle, world)
        result = self.from_group(kept, selection, world)
        if result is None or result.experiment is None or result.experiment.ir_hash != manifest.ir_hash:
            return self.own(bundle, world)  # the point's own compile decides, and refuses another IR
        return result

    def own(self, bundle: Unpacked, world: int) -> CompileResult:
        self.counts.own += 1
        return compile_unpacked(bundle, world, self.warm())

    def from_group(self, kept: KeptProject, selection: Selection, world: int) -> Optional[CompileResult]:
        """SELECTION's result from its shape group; None where the point needs its own compile
        (the sweep cannot be pre-read, its group is compiled point by point, the binding
        refuses it). The first point of a group is compiled on its own, and its group's probe
        when a second point comes."""
        assert selection.sweep is not None and selection.point is not None
        point = selection.point
        base = dump_json(replace(selection, point=None)).decode()
        shared = kept.group_of(base, world, point) or self.probe(kept, selection, base, world)
        if shared is None:
            return kept.firsts.get((base, world, point))
        bound = shared.result(point)
        if bound is not None and shared.indices[0] != point:
            self.counts.bound += 1
        return bound

    def probe(self, kept: KeptProject, selection: Selection, base: str, world: int) -> Optional[SharedCompile]:
        """SELECTION's shape group compiled as the driver compiles it (plan_groups for this
        point alone), and kept; None for a group compiled point by point, or the first point
        of a group that no point of it came before (compiled on its own, kept for the group)."""
        assert selection.sweep is not None and selection.point is not None
        point = selection.point
        if (base, world, point) in kept.alone:
            return None
        path = kept.bundle.main
        try:
            declared = kept.declared = kept.declared or prescan(path)
            count = len(declared.sweeps[selection.sweep].points())
            selections = [replace(selection, point=i) for i in range(count)]
            resolved = [resolve_selection(path, s, declared) for s in selections]
        except (LispError, KeyError):
            return None
        if point >= len(selections):
            return None

        def own(i: int) -> CompileResult:
            key = (base, world, i)
            if key not in kept.firsts:
                self.counts.own += 1
                bounded(kept.firsts, key, compile_file(path, selections[i], world=world, declared=declared, image=self.warm()))
            return kept.firsts[key]

        def probed() -> None:
            self.counts.probes += 1

        key = group_key(*resolved[point][:2])
        if next(i for i, r in enumerate(resolved) if group_key(*r[:2]) == key) == point:
            own(point)  # a group's first point: its own compile is its result; the probe waits for a second point
            return None
        for indices, found in plan_groups(path, selections, resolved, declared, None, world, own, probed, only=point, image=self.warm()):
            if found is None:
                kept.alone.update((base, world, i) for i in indices)
                return None
            bounded(kept.groups, (base, world, indices[0]), (frozenset(indices), found))
            return found
        return None


def project_digest(root: Path) -> str:
    """The identity of an unpacked project's bytes: every file's path and content."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(root).as_posix()}\0{file_digest(path)}\0".encode())
    return digest.hexdigest()
