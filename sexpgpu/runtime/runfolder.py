"""The slug that names a run, and the run folder `STORE/SLUG/` it writes:

```
run.json  source/  ir.json  events.jsonl | events/NNNNNN.jsonl  status.json  checkpoints/
```
"""

from __future__ import annotations

import hashlib
import json
import platform
import socket
import threading
import time
import uuid
from importlib import metadata
from typing import Any, Mapping, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from .. import __version__
from ..ir.experiment import Experiment, Selection, SourceFingerprint
from .events import EventLog, read_events, utc_now
from .lease import Leases, Renewal
from .threads import ThreadPlan
from .status import Status, StatusWriter, read_status, read_status_stamped
from .store import Store, check_path, is_store_failure

RUN_INFO_VERSION = 1


# ---------------------------------------------------------------------------------------------
# The slug


def canonical_json(value: Any) -> str:
    """The one JSON text of VALUE: sorted keys, no spaces, no NaN."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def run_hash(ir_hash: str, knob_values: Mapping[str, Any]) -> str:
    """hash8: the first 8 hex digits of sha256(ir_hash + canonical JSON of the knob values)."""
    text = ir_hash + canonical_json(dict(knob_values))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def _check_part(what: str, value: str) -> str:
    unsafe = "/" in value or "\\" in value or value.startswith(".")
    if not value or unsafe or value != value.strip():
        raise ValueError(f"{what} cannot name a run folder: {value!r}")
    return value


def slug(
    file_stem: str,
    variant: Optional[str],
    sweep: Optional[str],
    point: Optional[int],
    ir_hash: str,
    knob_values: Mapping[str, Any],
) -> str:
    """`{file-stem}.{variant|base}[.{sweep}-{point}].{hash8}`."""
    parts = [_check_part("file stem", file_stem), _check_part("variant", variant or "base")]
    if (sweep is None) != (point is None):
        raise ValueError("a sweep and its point go together")
    if sweep is not None and point is not None:
        if point < 0:
            raise ValueError(f"sweep point must be >= 0, got {point}")
        parts.append(f"{_check_part('sweep', sweep)}-{point}")
    parts.append(run_hash(ir_hash, knob_values))
    return ".".join(parts)


def run_slug(experiment: Experiment) -> str:
    """The slug of a compiled experiment: its file, selection, IR, data and knob values. One
    whose loaders read files must be fingerprinted first (runtime/data/fingerprint.py), or
    the slug would not cover the data."""
    unread = [name for name, record in experiment.loaders.items() if record.source.url and experiment.data_sources is None]
    if unread:
        raise ValueError(f"the slug needs the fingerprint of loader {unread[0]}'s data (runtime/data/fingerprint.py: fingerprinted)")
    sel = experiment.selection
    return slug(experiment.file_stem, sel.variant, sel.sweep, sel.point, experiment.identity_hash(), experiment.knob_values())


def changed_data(store: Store, slug: str, experiment: Experiment, resume: str) -> Optional[str]:
    """Why `--resume RESUME` of SLUG would continue a run trained on other data, or None: an
    earlier run folder of the same file, selection, knobs and recipe (or the folder a RESUME
    path names) whose run.json records other content for a loader's file. Looked for only
    when SLUG itself has no checkpoint to resume (changed data gave it a new slug)."""
    named = _folder_named(resume)
    if named == slug or (named is None and store.list(f"{slug}/checkpoints")):
        return None
    stem = slug.rsplit(".", 1)[0] + "."
    siblings = [n for n in store.folders("") if n.startswith(stem) and len(n) == len(stem) + 8 and n != slug]
    recipe = experiment.identity_hash(with_data=False)
    ours = experiment.data_sources or {}
    for folder in ([named] if named is not None else []) + siblings:
        try:
            info = RunFolder(store, folder).read_run_info()
        except (OSError, ValueError):  # no run.json, or not one this sexpgpu wrote: nothing to compare
            continue
        same_run = folder == named or (info.recipe_hash == recipe and info.knobs == experiment.knob_values())
        changed = [(ours[name], was) for name, was in info.data.items() if name in ours and ours[name].identity() != was.identity()]
        if same_run and changed:
            files = "; ".join(f"{now.source} (it was {was.describe()}, it is {now.describe()})" for now, was in changed)
            return (f"the data changed since {store.url_of(folder)} was trained: {files}. Its checkpoints learned other data: "
                    f"run without --resume to train on this data (slug {slug}), or put the old data back to resume")
    return None


def _folder_named(resume: str) -> Optional[str]:
    """The run folder a --resume path names (STORE/SLUG/checkpoints/step-N), if any."""
    parts = [part for part in resume.replace("\\", "/").split("/") if part]
    return next((parts[i - 1] for i in range(1, len(parts)) if parts[i] == "checkpoints"), None)


# ---------------------------------------------------------------------------------------------
# run.json


def _package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


class Versions(BaseModel):
    model_config = ConfigDict(extra="allow")

    python: str
    sexpgpu: str
    numpy: str

    @classmethod
    def current(cls) -> "Versions":
        return cls(
            python=platform.python_version(),
            sexpgpu=__version__,
            numpy=_package_version("numpy"),
        )


class RunInfo(BaseModel):
    """run.json: what the run is, written once when the folder is made."""

    model_config = ConfigDict(extra="allow")

    v: int = RUN_INFO_VERSION
    slug: str
    file: str
    selection: Selection = Field(default_factory=Selection)
    knobs: dict[str, Any] = Field(default_factory=dict)  # every knob's value
    source_hash: str
    ir_hash: str
    # each loader's file or URL as the run read it, and what the run computes with its data
    # aside (Experiment.identity_hash(with_data=False)): a resume across changed data finds
    # the earlier run by it and names the file that changed
    data: dict[str, SourceFingerprint] = Field(default_factory=dict)
    recipe_hash: Optional[str] = None
    versions: Versions = Field(default_factory=Versions.current)
    host: str = Field(default_factory=socket.gethostname)
    devices: list[Union[str, dict[str, Any]]] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)
    max_steps: Optional[int] = None  # set only under --max-steps
    threads: Optional[ThreadPlan] = None  # the CPU's BLAS threads, and why
    created: str = Field(default_factory=utc_now)


# ---------------------------------------------------------------------------------------------
# The folder


INFO_LIMIT = 16 << 20  # a run.json is kilobytes; a larger one is refused, never read whole


class RunFolder:
    """STORE/SLUG/: every file of one run, through the store."""

    def __init__(
        self,
        store: Store,
        slug: str,
        flush_every: int = EventLog.DEFAULT_FLUSH_EVERY,
        flush_seconds: float = EventLog.DEFAULT_FLUSH_SECONDS,
    ) -> None:
        self.store = store
        self.slug = _check_part("slug", slug)
        self.flush_every = flush_every
        self.flush_seconds = flush_seconds
        self._events: Optional[EventLog] = None
        self._status: Optional[StatusWriter] = None
        self._publisher: Optional[Publisher] = None

    def __repr__(self) -> str:
        return f"RunFolder({self.url!r})"

    @property
    def prefix(self) -> str:
        return self.slug

    @property
    def url(self) -> str:
        """The folder as a local path or URL, to print."""
        return self.store.url_of(self.slug)

    def path(self, relative: str) -> str:
        """The store path of RELATIVE inside the folder."""
        return f"{self.slug}/{check_path(relative)}"

    # -- run.json, sources, IR ----------------------------------------------------------------

    def exists(self) -> bool:
        """Whether the folder has a run.json (a run was started here)."""
        return self.store.file_exists(self.path("run.json"))

    def write_run_info(self, info: RunInfo) -> None:
        if info.slug != self.slug:
            raise ValueError(f"run.json names {info.slug!r}, the folder is {self.slug!r}")
        self.store.write_json(self.path("run.json"), info)

    def read_run_info(self) -> RunInfo:
        """run.json; UnexpectedSize, before anything is read, for one larger than INFO_LIMIT."""
        return RunInfo.model_validate_json(self.store.read_bytes(self.path("run.json"), limit=INFO_LIMIT))

    def read_run_info_stamped(self) -> tuple[RunInfo, Optional[float]]:
        """run.json and when the version read was written (Store.read_stamped)."""
        data, when = self.store.read_stamped(self.path("run.json"), limit=INFO_LIMIT)
        return RunInfo.model_validate_json(data), when

    def write_sources(self, files: Mapping[str, Union[bytes, str]]) -> None:
        """FILES (relative name to content) under source/, as compiled."""
        for name, content in sorted(files.items()):
            data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
            self.store.write_bytes(self.path(f"source/{check_path(name)}"), data)

    def list_sources(self) -> list[str]:
        """The names under source/, relative to it."""
        base = self.path("source") + "/"
        return [path[len(base):] for path in self.store.list(self.path("source"))]

    def write_ir(self, json_text: str) -> None:
        self.store.write_text(self.path("ir.json"), json_text)

    def read_ir(self) -> str:
        return self.store.read_text(self.path("ir.json"))

    # -- events and status --------------------------------------------------------------------

    @property
    def events(self) -> EventLog:
        """The run's event log (one per folder object)."""
        if self._events is None:
            self._events = EventLog(
                self.store,
                self.slug,
                flush_every=self.flush_every,
                flush_seconds=self.flush_seconds,
            )
        return self._events

    @property
    def status(self) -> StatusWriter:
        """The run's status writer (one per folder object)."""
        if self._status is None:
            self._status = StatusWriter(self.store, self.slug)
        return self._status

    def read_events(self, superseded: bool = False) -> list[dict[str, Any]]:
        return read_events(self.store, self.slug, superseded=superseded)

    def read_status(self) -> Optional[Status]:
        return read_status(self.store, self.slug)

    def read_status_stamped(self) -> tuple[Status, Optional[float]]:
        """status.json and when the version read was written (Store.read_stamped);
        FileNotFoundError when there is none yet."""
        return read_status_stamped(self.store, self.slug)

    def writer(self) -> Optional[str]:
        """Who writes the folder now, while a live attempt holds its lease (`HOST pid N,
        heartbeat 3 s ago`); None when no one does."""
        lease = Leases(self.store, "a reader").held_elsewhere(self.path("lease.json"))
        return lease.describe(time.time()) if lease is not None else None

    def set_aside(self) -> Optional[str]:
        """Move every file of the folder (its lease aside) to SLUG~N, the first free N, for a
        fresh run in this folder; nothing is deleted. Returns the new folder's name, or None
        when the folder held nothing but its lease (a slug that never ran)."""
        paths = [path for path in self.store.list(self.slug) if path != self.path("lease.json")]
        if not paths:
            return None
        taken = {p.split("/", 1)[0] for p in self.store.list("") if p.startswith(f"{self.slug}~")}
        number = next(n for n in range(1, len(taken) + 2) if f"{self.slug}~{n}" not in taken)
        aside = f"{self.slug}~{number}"
        for path in paths:
            self.store.rename(path, f"{aside}/{path[len(self.slug) + 1:]}")
        return aside

    def publish(self) -> None:
        """Write the pending events, then the status if it changed; raises the first failure
        of the store (what it did not take stays pending)."""
        failure: Optional[BaseException] = None
        for flush in (self.events.flush, self.status.flush):
            try:
                flush()
            except Exception as error:
                if not is_store_failure(error):
                    raise
                failure = failure or error
        if failure is not None:
            raise failure

    def start_publishing(self, every_s: float) -> None:
        """From now on the events and the status are written by one background thread, every
        EVERY_S seconds and when `publish_soon` asks, until `close` or `stop_publishing`."""
        if self._publisher is None:
            self.events.deferred = self.status.deferred = True
            self._publisher = Publisher(self, every_s)

    def publish_soon(self) -> None:
        """Have the background publisher write what is pending now (a checkpoint was
        published); without one, every update was written already."""
        if self._publisher is not None:
            self._publisher.wake()

    def stop_publishing(self) -> None:
        """Stop the background publisher, writing nothing more (what is pending stays)."""
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.stop()
            self.events.deferred = self.status.deferred = False
            publisher.raise_failure()

    def close(self) -> None:
        """Stop the background publisher, then flush pending events and an unpublished
        status; raises if the store still fails (again: nothing is lost)."""
        self.stop_publishing()
        failure: Optional[BaseException] = None
        if self._events is not None:
            try:
                self._events.close()
            except Exception as error:
                if not is_store_failure(error):
                    raise
                failure = error
        if self._status is not None:
            self._status.flush()
        if failure is not None:
            raise failure


class Publisher:
    """A run folder's one writer of events and status while an attempt trains: a thread that
    publishes what arrived since its last round (the events in order, the latest status)
    every EVERY_S seconds, or at once when woken, so the training thread never waits on the
    store. A round the store fails (down past its retries) keeps everything for the next;
    the folder's `close` publishes the rest. Any other error ends the thread, and `stop`'s
    caller raises it."""

    def __init__(self, folder: RunFolder, every_s: float) -> None:
        self.folder = folder
        self.every_s = every_s
        self.failure: Optional[BaseException] = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"sexpgpu-publish {folder.slug}", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()

    def raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.folder.publish()
            except Exception as error:
                if not is_store_failure(error):  # a bug: the attempt raises it at its end
                    self.failure = error
                    return
            self._wake.wait(self.every_s)
            self._wake.clear()


# ---------------------------------------------------------------------------------------------
# One writer per folder


class FolderHeld(Exception):
    """Another writer holds the run folder (exit 4: it says who, and when it is free)."""


class FolderTaken(Exception):
    """This writer's lease on the folder was taken over (it was presumed dead): it must stop
    writing."""


class WriterLease:
    """An attempt's lease on its run folder, SLUG/lease.json: two `run`s of one slug at once
    never interleave their events; a writer that is gone (no heartbeat for a minute, or a
    process of this host that no longer runs) is taken over."""

    def __init__(self, folder: RunFolder, take_over: bool = False) -> None:
        self.folder = folder
        self.path = folder.path("lease.json")
        self.leases = Leases(folder.store, f"attempt-{uuid.uuid4().hex[:12]}")
        self.take_over = take_over
        self.renewal: Optional[Renewal] = None

    def take(self) -> None:
        if self.leases.claim([self.path], take_over=self.take_over):
            self.renewal = self.leases.keep_renewed(lambda: [self.path])
            return
        holder = self.leases.held_elsewhere(self.path)
        who = holder.describe(time.time()) if holder is not None else "another writer that took it just now"
        raise FolderHeld(f"the run folder {self.folder.url} is being written by another attempt ({who}); it is free "
                         f"when that one ends, or {self.leases.ttl_s:.0f} s after its last heartbeat")

    def taken(self) -> bool:
        """Whether a renewal found the lease taken over (checked at every step)."""
        return self.renewal is not None and bool(self.renewal.take_lost())

    def check(self) -> None:
        """Before a publish: still ours, or FolderTaken."""
        if not self.leases.still_mine(self.path):
            raise FolderTaken(f"another attempt took the run folder {self.folder.url} over")

    def retake(self) -> None:
        """The lease written anew after the store lost the folder's files (the lease with
        them), unless someone else holds it now."""
        if self.leases.holder_of(self.path) is None:
            self.leases.write(self.path)

    def release(self) -> None:
        if self.renewal is not None:
            self.renewal.stop()
            self.leases.release(self.path)
