"""A disk cache of a run's parsed series, so that a run of a million logged steps opens in a
fraction of a second in any process after the first that read it (`plot`, a fresh `sexpgpu
ui`), instead of parsing every line of its events again.

What is cached is what a `RunReaders` reader holds after reading a run: each series as
arrays of numbers, the step of each step event, the latest step events, the events other
than `step` (their lines) and the warnings, with where the `EventReader` stopped (the byte
offset in events.jsonl, the last segment read). A process that finds the cache loads that
and reads only the bytes the run logged since.

Layout, under `$SEXPGPU_CACHE/series/` (`~/.cache/sexpgpu/series/`), a folder per events file
(named by the SHA-256 of its URL):

| file | what |
| --- | --- |
| `manifest.json` | the reader's position, the chunks and the SHA-256 of every file (written last, by a rename) |
| `CHUNK.i8.npy` | int64: the steps of the chunk's step events, then each series' own steps (a series of every step event has none) |
| `CHUNK.f8.npy` | float64: each series' values (NaN: a gap) |
| `CHUNK.jsonl` | the lines of the events other than `step` |
| `tail.jsonl` | the latest step events, as JSON lines |

The .npy files are written and read here as plain arrays (no pickle). A save after the log
grew writes a new chunk of what was read since; after a resume cut points (or after
MAX_CHUNKS chunks) it writes the whole cache again as one. A cache whose files do not
match their SHA-256, or that does not read, is removed and built again from the events; one
whose events file changed (shorter, another first line, another last line read) is read
from the start by the reader itself. A cache that cannot be written is left out: the run
is read as without one."""

from __future__ import annotations

import hashlib
import io
import json
import secrets
from array import array
from collections import deque
from pathlib import Path
from typing import Any, BinaryIO, Literal, Optional, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import from_json

from ..runtime.diskcache import BadEntry, cache_root, discard, open_entry, publish, read_entry
from ..runtime.events import EventReader, ReaderPosition
from .curves import TAIL, Column, CurveData, Group

VERSION = 1
SAVE_AFTER = 20_000  # events read since the last save that make another worth it (fewer parse in well under a second)
MAX_CHUNKS = 16  # chunks a cache holds before it is written again as one
MANIFEST_LIMIT = 256 << 20  # bytes of manifest.json read (its warnings can be many)
LAST_LINE = 256  # bytes before the offset that must be as they were read
INT64, FLOAT64 = np.dtype(np.int64).str, np.dtype(np.float64).str


class Damaged(Exception):
    """A cache file is missing, does not read, or does not match its SHA-256."""


class ColumnPart(BaseModel):
    """A series' points in one chunk."""

    model_config = ConfigDict(extra="forbid")

    name: str
    group: Group
    count: int = Field(ge=0)
    steps: bool  # its steps are stored; False: they are those of the step events (the series has a value at each)
    ordered: bool  # its steps never go down (so far)


class Chunk(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[0-9]{6}-[0-9a-f]{8}$")
    step_events: int = Field(ge=0)
    columns: list[ColumnPart]
    kept: int = Field(ge=0)  # lines in CHUNK.jsonl
    sha256: dict[str, str]  # file name -> its SHA-256


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1]
    events_url: str  # the events file (or segment folder) the cache is of
    position: ReaderPosition
    last_line: str  # the SHA-256 of the LAST_LINE bytes before position.offset
    events: int = Field(ge=0)  # events the curves were given
    warnings: list[str]
    chunks: list[Chunk]
    tail_sha256: str


class Saved(BaseModel):
    """What the cache on disk holds, for the next save to add only what is new."""

    manifest: Manifest
    counts: dict[str, int]  # points of each series
    step_events: int
    kept: int
    resets: int
    cuts: int


def cache_folder(root: Path, events_url: str) -> Path:
    return root / "series" / hashlib.sha256(events_url.encode("utf-8")).hexdigest()[:32]


class SeriesCache:
    """The disk cache of READER's log, as DATA (the reader's sink) holds it."""

    def __init__(self, reader: EventReader, data: CurveData, root: Optional[Path] = None, save_after: int = SAVE_AFTER) -> None:
        self.reader = reader
        self.data = data
        self.url = reader.store.url_of(reader.single)
        self.folder = cache_folder(cache_root() if root is None else root, self.url)
        self.save_after = save_after
        self.saved: Optional[Saved] = None
        self.columns: Optional[tuple[int, int]] = None  # (events, resets) when the reader was put there from the run's columns
        self.rebuilt = 0  # damaged caches removed (for a test to see)

    # -- loading ------------------------------------------------------------------------------

    def load(self) -> bool:
        """Put the cached state in the reader and its curves; False (and both left empty)
        when there is none or it is damaged (removed then, to be built again)."""
        try:
            text = read_entry(self.folder / "manifest.json", MANIFEST_LIMIT)
        except (BadEntry, OSError):
            text = None
            self._remove()
        if text is None:
            return False
        try:
            manifest = Manifest.model_validate_json(text)
            if manifest.events_url != self.url or not self._same_last_line(manifest):
                return False  # another log under the name: the reader reads it from the start
            self._restore(manifest)
        except (Damaged, ValidationError, ValueError, OSError, BadEntry):
            self.data.clear()
            self.reader.restore(ReaderPosition(offset=0, lines=0, head="", segments=-1, count=0), [], [])
            self.saved = None
            self.rebuilt += 1
            self._remove()
            return False
        return True

    def _same_last_line(self, manifest: Manifest) -> bool:
        offset = manifest.position.offset
        if offset == 0:
            return True
        start = max(0, offset - LAST_LINE)
        try:
            _, data = self.reader.store.read_from(self.reader.single, start, offset - start)
        except FileNotFoundError:
            return False
        return hashlib.sha256(data).hexdigest() == manifest.last_line

    def _restore(self, manifest: Manifest) -> None:
        parts: dict[str, list[ColumnPart]] = {}
        for chunk in manifest.chunks:
            for part in chunk.columns:
                parts.setdefault(part.name, []).append(part)
        steps = _zeros("q", sum(c.step_events for c in manifest.chunks))
        values = {name: _zeros("d", sum(p.count for p in found)) for name, found in parts.items()}
        own = {name: _zeros("q", sum(p.count for p in found)) for name, found in parts.items() if any(p.steps for p in found)}
        pairs: list[tuple[str, dict[str, Any]]] = []
        filled = {name: 0 for name in parts}
        shared_prefix = {name: 0 for name in parts}
        at = 0
        for chunk in manifest.chunks:
            ints: list[tuple[array[Any], int, int]] = [(steps, at, chunk.step_events)]
            floats: list[tuple[array[Any], int, int]] = []
            for part in chunk.columns:
                if part.steps:
                    ints.append((own[part.name], filled[part.name], part.count))
                elif part.name in own:
                    if shared_prefix[part.name] != filled[part.name]:
                        raise Damaged(f"{part.name}: steps of its own before steps of the step events")
                    shared_prefix[part.name] += part.count
                floats.append((values[part.name], filled[part.name], part.count))
                filled[part.name] += part.count
            at += chunk.step_events
            _read_array(self.folder / f"{chunk.name}.i8.npy", INT64, ints, chunk.sha256.get(f"{chunk.name}.i8.npy"))
            _read_array(self.folder / f"{chunk.name}.f8.npy", FLOAT64, floats, chunk.sha256.get(f"{chunk.name}.f8.npy"))
            pairs.extend(_read_lines(self.folder / f"{chunk.name}.jsonl", chunk.kept, chunk.sha256.get(f"{chunk.name}.jsonl")))
        tail = [event for _, event in _read_lines(self.folder / "tail.jsonl", None, manifest.tail_sha256)]
        data = self.data
        data.clear()
        data.step_steps = steps
        for name, found in parts.items():
            last = found[-1]
            if name in own:
                prefix = shared_prefix[name]
                if prefix > len(steps):
                    raise Damaged(f"{name}: more points than step events")
                own[name][:prefix] = steps[:prefix]
                column = Column(name, last.group)
                column.own = own[name]
            else:
                if len(values[name]) > len(steps):
                    raise Damaged(f"{name}: more points than step events")
                column = Column(name, last.group, shared=steps)
            column.values = values[name]
            column.ordered = last.ordered
            data.columns[name] = column
        data.tail = deque(tail, maxlen=TAIL)
        data.events = manifest.events
        self.reader.restore(manifest.position, pairs, list(manifest.warnings))
        self.saved = Saved(manifest=manifest, counts={n: len(v) for n, v in values.items()}, step_events=len(steps), kept=len(pairs),
                           resets=self.reader.resets, cuts=data.cuts)

    # -- saving -------------------------------------------------------------------------------

    def save(self) -> None:
        """Write what was read since the last save, when that is SAVE_AFTER events or more: a
        new chunk, or the whole cache again after a resume or a reset (or at MAX_CHUNKS). What
        came from the run's columns counts as saved (reading them again is about as cheap)."""
        saved, reader = self.saved, self.reader
        if saved is not None and saved.resets == reader.resets:
            read = reader.count - saved.manifest.position.count
        elif saved is None and self.columns is not None and self.columns[1] == reader.resets:
            read = reader.count - self.columns[0]
        else:
            read = reader.count
        if read < self.save_after:
            return
        whole = saved is None or saved.resets != self.reader.resets or saved.cuts != self.data.cuts or len(saved.manifest.chunks) >= MAX_CHUNKS
        try:
            self._save(None if whole else saved)
        except OSError:
            self.saved = None  # a cache that cannot be written: read as without one

    def _save(self, saved: Optional[Saved]) -> None:
        data, reader = self.data, self.reader
        self.folder.mkdir(parents=True, exist_ok=True)
        chunks = list(saved.manifest.chunks) if saved is not None else []
        counts = saved.counts if saved is not None else {}
        first_step = saved.step_events if saved is not None else 0
        first_kept = saved.kept if saved is not None else 0
        name = f"{len(chunks):06d}-{secrets.token_hex(4)}"
        parts: list[ColumnPart] = []
        ints: list[memoryview] = [memoryview(data.step_steps)[first_step:]]
        floats: list[memoryview] = []
        for column in data.columns.values():
            start = counts.get(column.name, 0)
            if len(column) <= start:
                continue
            if column.own is not None:
                ints.append(memoryview(column.own)[start:])
            floats.append(memoryview(column.values)[start:])
            parts.append(ColumnPart(name=column.name, group=column.group, count=len(column) - start, steps=column.own is not None,
                                    ordered=column.ordered))
        kept = [line for line, _ in reader.pairs[first_kept:]]
        sha = {f"{name}.i8.npy": _write_array(self.folder / f"{name}.i8.npy", INT64, ints),
               f"{name}.f8.npy": _write_array(self.folder / f"{name}.f8.npy", FLOAT64, floats),
               f"{name}.jsonl": _write_lines(self.folder / f"{name}.jsonl", kept)}
        chunks.append(Chunk(name=name, step_events=len(data.step_steps) - first_step, columns=parts, kept=len(kept), sha256=sha))
        tail = _write_lines(self.folder / "tail.jsonl", [json.dumps(e, separators=(",", ":")) for e in data.tail])
        position = reader.position()
        manifest = Manifest(version=VERSION, events_url=self.url, position=position, last_line=self._last_line(position.offset),
                            events=data.events, warnings=list(reader.warnings), chunks=chunks, tail_sha256=tail)
        publish(self.folder / "manifest.json", lambda out: out.write(manifest.model_dump_json().encode("utf-8")))  # last: what it lists is there
        if saved is None:
            self._remove_unlisted(manifest)
        self.saved = Saved(manifest=manifest, counts={c.name: len(c) for c in data.columns.values()}, step_events=len(data.step_steps),
                           kept=len(reader.pairs), resets=reader.resets, cuts=data.cuts)

    def _last_line(self, offset: int) -> str:
        start = max(0, offset - LAST_LINE)
        if offset == 0:
            return hashlib.sha256(b"").hexdigest()
        _, data = self.reader.store.read_from(self.reader.single, start, offset - start)
        return hashlib.sha256(data).hexdigest()

    def _remove_unlisted(self, manifest: Manifest) -> None:
        listed = {"manifest.json", "tail.jsonl", *(f for c in manifest.chunks for f in c.sha256)}
        for entry in self.folder.iterdir():
            if entry.name not in listed and not entry.name.startswith("."):  # publish's temporary files start with a dot
                discard(entry)

    def _remove(self) -> None:
        discard(self.folder)


def _zeros(code: str, count: int) -> "array[Any]":
    return array(code, [0]) * count if code == "q" else array(code, [0.0]) * count


def _write_array(path: Path, descr: str, pieces: list[memoryview]) -> str:
    """PIECES (of one type) published as one 1-D .npy file at PATH; its SHA-256."""
    digest = hashlib.sha256()
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False, "shape": (sum(len(p) for p in pieces),)})
    digest.update(header.getvalue())

    def write(out: BinaryIO) -> None:
        out.write(header.getvalue())
        for piece in pieces:
            raw = piece.cast("B")
            digest.update(raw)
            out.write(raw)

    publish(path, write)
    return digest.hexdigest()


def _read_array(path: Path, descr: str, targets: list[tuple["array[Any]", int, int]], sha256: Optional[str]) -> None:
    """The 1-D .npy file at PATH read in order into TARGETS (array, from index, count), its
    bytes checked against SHA256 as they arrive; Damaged when they do not match."""
    handle = _open(path)
    with handle:
        version = np.lib.format.read_magic(handle)
        if version != (1, 0):
            raise Damaged(f"{path.name}: .npy version {version}")
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle, max_header_size=1024)
        if dtype.str != descr or fortran or shape != (sum(count for _, _, count in targets),):
            raise Damaged(f"{path.name}: {dtype.str} {shape}, not what the manifest says")
        header = handle.tell()
        handle.seek(0)
        digest = hashlib.sha256(handle.read(header))
        for target, start, count in targets:
            view = memoryview(target).cast("B")[start * target.itemsize:(start + count) * target.itemsize]
            if cast(io.BufferedReader, handle).readinto(view) != len(view):  # open_entry's file is a BufferedReader
                raise Damaged(f"{path.name}: shorter than its header says")
            digest.update(view)
        if handle.read(1) or digest.hexdigest() != sha256:
            raise Damaged(f"{path.name} does not match its SHA-256")


def _write_lines(path: Path, lines: list[str]) -> str:
    data = "".join(f"{line}\n" for line in lines).encode("utf-8", errors="surrogatepass")
    publish(path, lambda out: out.write(data))
    return hashlib.sha256(data).hexdigest()


def _read_lines(path: Path, count: Optional[int], sha256: Optional[str]) -> list[tuple[str, dict[str, Any]]]:
    handle = _open(path)
    with handle:
        data = handle.read()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise Damaged(f"{path.name} does not match its SHA-256")
    pairs = []
    for raw in data.split(b"\n")[:-1]:
        line = raw.decode("utf-8", errors="surrogatepass")
        try:
            value = from_json(raw)
        except ValueError:
            value = json.loads(line)  # what json.loads makes of it (lone surrogates), as the reader did
        if not isinstance(value, dict):
            raise Damaged(f"{path.name}: a line that is not an event")
        pairs.append((line, value))
    if count is not None and len(pairs) != count:
        raise Damaged(f"{path.name}: {len(pairs)} lines, not {count}")
    return pairs


def _open(path: Path) -> BinaryIO:
    handle = open_entry(path)
    if handle is None:
        raise Damaged(f"{path.name} is missing")
    return handle

