"""Run events: one JSON object per line, `{"v":1, "t":"...Z", "kind":..., "step":..., ...}`.

Every kind has a pydantic model; all allow extra keys (metadata is open) and readers ignore
what they do not know. `EventLog` buffers events and writes them through the store's
append-only log (`RUN/events.jsonl` locally, `RUN/events/NNNNNN.jsonl` segments on object
stores). `read_events` returns a run's series with `resume` applied: a resume from step S
supersedes the earlier events of steps after S, so a resumed run has no duplicate steps.
`EventReader` is how every reader reads them: incrementally (it remembers where it stopped),
with a warning naming the file and line of each line that is not a valid event.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from typing import Annotated, Any, Callable, ClassVar, Literal, Mapping, Optional, Protocol, Union, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import from_json

from ..outcome import bounded
from .serieslog import encode_chunk, series_prefix
from .store import Appended, Store, dump_json, is_store_failure

EVENT_VERSION = 1

Kind = Literal[
    "run.start",
    "compile",
    "step",
    "eval",
    "diagnostic",
    "stage",
    "checkpoint",
    "nonfinite",
    "warning",
    "signal",
    "preempted",
    "resume",
    "target",
    "annotation",
    "run.end",
]

# Kinds that record an attempt's history rather than a point of a series: a resume keeps
# them even when they carry a later step (the signal that stopped the previous attempt).
ATTEMPT_KINDS = frozenset({"run.start", "signal", "preempted", "resume", "annotation", "run.end"})

# Metric values may be non-finite (written as null).
Number = Optional[float]


def utc_now() -> str:
    """Now as UTC ISO-8601 with a Z, to the millisecond: `2026-01-02T03:04:05.678Z`."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Event(BaseModel):
    """What every event has. Unknown keys are kept."""

    model_config = ConfigDict(extra="allow")

    v: int = EVENT_VERSION
    t: str = Field(default_factory=utc_now)
    kind: str
    step: Optional[int] = None

    def to_record(self) -> dict[str, Any]:
        """What its line is the JSON of: v, t, kind, step always; other fields when set."""
        data = self.model_dump(mode="json")
        head = {key: data.pop(key) for key in ("v", "t", "kind", "step")}
        return {**head, **{key: value for key, value in data.items() if value is not None}}

    def to_line(self) -> str:
        """One JSON line: v, t, kind, step always; other fields when set."""
        return dump_json(self.to_record())


class RunStartEvent(Event):
    kind: Literal["run.start"] = "run.start"
    slug: str
    attempt: int = 1
    host: Optional[str] = None
    worker: Optional[str] = None
    device: Optional[str] = None


class CompileEvent(Event):
    kind: Literal["compile"] = "compile"
    seconds: Optional[float] = None
    ir_hash: Optional[str] = None
    cached: Optional[bool] = None


class StepEvent(Event):
    kind: Literal["step"] = "step"
    step: int
    loss: Number = None
    metrics: dict[str, Number] = Field(default_factory=dict)
    lr: dict[str, Number] = Field(default_factory=dict)  # per optimizer group
    grad_norm: Number = None
    step_time: Optional[float] = None  # seconds
    examples_per_s: Optional[float] = None
    tokens_per_s: Optional[float] = None
    memory: Optional[int] = None  # bytes


class EvalEvent(Event):
    kind: Literal["eval"] = "eval"
    step: int
    name: str = "eval"
    metrics: dict[str, Number] = Field(default_factory=dict)
    seconds: Optional[float] = None


class DiagnosticEvent(Event):
    """Selected diagnostics at a sampled step (defrun :diagnostics): name -> value, e.g.
    "grad-norm/net.layers.0.w" or "act/net/rms"."""

    kind: Literal["diagnostic"] = "diagnostic"
    step: int
    values: dict[str, Optional[float]]


class StageEvent(Event):
    kind: Literal["stage"] = "stage"
    name: str
    index: Optional[int] = None


class CheckpointEvent(Event):
    kind: Literal["checkpoint"] = "checkpoint"
    step: int
    path: str
    seconds: Optional[float] = None
    bytes: Optional[int] = None


class NonFiniteEvent(Event):
    kind: Literal["nonfinite"] = "nonfinite"
    step: int
    node: Optional[str] = None  # the first IR node that produced a non-finite value
    location: Optional[str] = None  # file:line:col: the user's call when the node was staged inside a library
    library_location: Optional[str] = None  # then the library's line that staged it
    param_path: Optional[str] = None
    created: Optional[bool] = None  # created the value, or only passed a non-finite input
    action: Optional[str] = None  # skip, rollback, stop
    message: Optional[str] = None


class WarningEvent(Event):
    kind: Literal["warning"] = "warning"
    message: str
    code: Optional[str] = None


class SignalEvent(Event):
    kind: Literal["signal"] = "signal"
    signal: str  # SIGINT, SIGTERM


class PreemptedEvent(Event):
    kind: Literal["preempted"] = "preempted"
    reason: Optional[str] = None


class ResumeEvent(Event):
    kind: Literal["resume"] = "resume"
    from_step: int
    checkpoint: Optional[str]  # None: the attempt started over (no checkpoint had been published)
    attempt: Optional[int] = None


class TargetEvent(Event):
    kind: Literal["target"] = "target"
    step: int
    metric: str
    value: Number = None
    threshold: Optional[float] = None


class AnnotationEvent(Event):
    kind: Literal["annotation"] = "annotation"
    text: str
    author: Optional[str] = None


class RunEndEvent(Event):
    kind: Literal["run.end"] = "run.end"
    exit_code: int
    reason: Annotated[str, AfterValidator(bounded)]
    state: Optional[str] = None


EVENT_CLASSES: tuple[type[Event], ...] = (
    RunStartEvent,
    CompileEvent,
    StepEvent,
    EvalEvent,
    DiagnosticEvent,
    StageEvent,
    CheckpointEvent,
    NonFiniteEvent,
    WarningEvent,
    SignalEvent,
    PreemptedEvent,
    ResumeEvent,
    TargetEvent,
    AnnotationEvent,
    RunEndEvent,
)

EVENT_MODELS: dict[str, type[Event]] = {
    model.model_fields["kind"].default: model for model in EVENT_CLASSES
}


def _nullable(model: type[Event]) -> frozenset[str]:
    return frozenset(name for name, field in model.model_fields.items() if field.is_required() and type(None) in get_args(field.annotation))


# the required fields that may be None: `to_line` leaves a None out, so a line without one says None
NULLABLE: dict[str, frozenset[str]] = {kind: _nullable(model) for kind, model in EVENT_MODELS.items()}


def parse_event(data: Mapping[str, Any]) -> Event:
    """DATA (as `to_line` wrote it: a None left out) as its kind's model; an unknown kind (a
    newer writer) as a plain `Event`."""
    kind = str(data.get("kind"))
    model = EVENT_MODELS.get(kind, Event)
    return model.model_validate({**dict.fromkeys(NULLABLE.get(kind, ())), **data})


def event_from(event: Union[Event, Mapping[str, Any]]) -> Event:
    """A model as is; a mapping validated as its (known) kind."""
    if isinstance(event, Event):
        return event
    kind = event.get("kind")
    if kind not in EVENT_MODELS:
        raise ValueError(f"unknown event kind: {kind!r}")
    return EVENT_MODELS[str(kind)].model_validate(dict(event))


def events_prefix(run_prefix: str) -> str:
    """The store log prefix of a run's events: RUN/events(.jsonl | /NNNNNN.jsonl)."""
    return f"{run_prefix.strip('/')}/events"


# ---------------------------------------------------------------------------------------------
# Writing


class EventLog:
    """Buffers events and appends them to the run's log through the store.

    On its own, a flush happens when FLUSH_EVERY events are pending, when FLUSH_SECONDS have
    passed since the last flush (checked at each emit), and on `flush()`/`close()`. A log that
    is `deferred` (a run folder's background publisher flushes it: runfolder.Publisher) only
    queues on emit, so the emitting thread never waits on the store. A flush that fails (the
    store is down past its retries) keeps the events pending for the next one and records the
    error in `last_error`; `flush()` and `close()` raise. Flushes are serialised, and the
    buffer is never locked while the store is written, so `emit` never waits for a flush.

    With SERIES (the default), every flush also appends the flushed step events' series in
    columns to the run's series log (runtime/serieslog.py), after the lines: a chunk the
    store refuses waits for the next flush, and never fails the log.
    """

    DEFAULT_FLUSH_EVERY: ClassVar[int] = 50
    DEFAULT_FLUSH_SECONDS: ClassVar[float] = 5.0

    def __init__(
        self,
        store: Store,
        run_prefix: str,
        flush_every: int = DEFAULT_FLUSH_EVERY,
        flush_seconds: float = DEFAULT_FLUSH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        series: bool = True,
    ) -> None:
        self.store = store
        self.prefix = events_prefix(run_prefix)
        self.series_prefix = series_prefix(run_prefix) if series else None
        self.flush_every = max(1, flush_every)
        self.flush_seconds = flush_seconds
        self.clock = clock
        self.deferred = False  # set by the publisher that flushes this log from its own thread
        self.last_error: Optional[BaseException] = None
        self._pending: list[tuple[str, Optional[dict[str, Any]]]] = []  # each line, and a step event's record
        self._chunks: list[str] = []  # series chunks the store has not taken yet
        self._last_flush = clock()
        self._lock = threading.Lock()  # the buffer
        self._writing = threading.Lock()  # one flush at a time, so lines land in order
        self._closed = False

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def emit(self, event: Union[Event, Mapping[str, Any]]) -> Event:
        """Queue EVENT (a model, or a mapping of a known kind); returns the model."""
        model = event_from(event)
        record = model.to_record()
        line = dump_json(record)
        with self._lock:
            if self._closed:
                raise ValueError("event log is closed")
            self._pending.append((line, record if self.series_prefix is not None and model.kind == "step" else None))
            due = not self.deferred and self._due()
        if due:
            self._flush_quietly()
        return model

    def _due(self) -> bool:
        if len(self._pending) >= self.flush_every:
            return True
        return self.clock() - self._last_flush >= self.flush_seconds

    def _flush_quietly(self) -> None:
        try:
            self.flush()
        except Exception as error:  # the store's failures wait for the next flush; others are bugs
            if not is_store_failure(error):
                raise
            self.last_error = error

    def flush(self, *last: Union[Event, Mapping[str, Any]]) -> None:
        """Write every pending event now, and LAST after them in the same write: events that
        exist only if that write lands (a store that fails it keeps the pending events, not
        LAST; a checkpoint's event is flushed so before the checkpoint is published)."""
        extra: list[tuple[str, Optional[dict[str, Any]]]] = [(event_from(event).to_line(), None) for event in last]
        with self._writing:
            with self._lock:
                pending, self._pending = self._pending, []
            batch = pending + extra
            if batch:
                try:
                    appended = self.store.append_lines(self.prefix, [line for line, _ in batch])
                except BaseException:
                    with self._lock:
                        self._pending = pending + self._pending
                    raise
                if appended is not None:
                    self._write_series(batch, appended)
            with self._lock:
                self.last_error = None
                self._last_flush = self.clock()

    def _write_series(self, batch: list[tuple[str, Optional[dict[str, Any]]]], appended: Appended) -> None:
        """BATCH's chunk (and any the store refused before) appended to the series log."""
        if self.series_prefix is None:
            return
        self._chunks.append(encode_chunk(batch, appended))
        try:
            self.store.append_lines(self.series_prefix, self._chunks)
        except Exception as error:  # the store's failures: the chunks wait for the next flush (readers read the lines)
            if not is_store_failure(error):
                raise
            return
        self._chunks = []

    def close(self) -> None:
        """Flush and refuse further events; a flush the store fails leaves the log open."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.flush()
        except BaseException:
            with self._lock:
                self._closed = False
            raise

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# Reading


def _resume_step(event: Mapping[str, Any]) -> Optional[int]:
    value = event.get("from_step", event.get("step"))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _superseded(event: Mapping[str, Any], from_step: int) -> bool:
    step = event.get("step")
    if event.get("kind") in ATTEMPT_KINDS or not isinstance(step, int):
        return False
    return step > from_step


def apply_resumes(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """EVENTS with every `resume` applied: earlier events past its step are dropped."""
    kept: list[dict[str, Any]] = []
    for event in events:
        if event.get("kind") == "resume":
            from_step = _resume_step(event)
            if from_step is not None:
                kept = [old for old in kept if not _superseded(old, from_step)]
        kept.append(event)
    return kept


def read_events(
    store: Store, run_prefix: str, superseded: bool = False
) -> list[dict[str, Any]]:
    """A run's events as dicts, in order, with resumes applied (all of them if SUPERSEDED).

    Lines that are not valid event records are skipped (an `EventReader` says which)."""
    reader = EventReader(store, run_prefix)
    reader.update()
    return reader.events(superseded)


def read_event_lines(store: Store, run_prefix: str) -> list[tuple[str, dict[str, Any]]]:
    """Every event line of a run with its decoded object, in order (`logs --raw` prints the
    lines as they are); lines that are not valid event records are skipped."""
    reader = EventReader(store, run_prefix)
    reader.update()
    return list(reader.pairs)


CHUNK = 8 << 20  # bytes one read of an events file asks for
PIECE = 1 << 20  # bytes of lines parsed at a time (a chunk's events are never all held as dicts at once)


def decode_line(raw: bytes) -> Union[str, tuple[str, dict[str, Any]]]:
    """(the line, its event) of a line of an events file, or what is wrong with it, in words."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return f"not UTF-8 (byte 0x{raw[error.start]:02x} at column {error.start + 1})"
    try:
        value = from_json(raw)  # pydantic's parser: a few times faster than json.loads
    except ValueError:
        try:  # what json.loads makes of it (lone surrogates), or the words of its error
            value = json.loads(line)
        except ValueError as error:
            return f"not JSON ({error})"
    if not isinstance(value, dict):
        return f"not a JSON object (a JSON {type(value).__name__})"
    try:
        parse_event(value)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the line"
        return f"not a valid {str(value.get('kind'))!r} event ({where}: {first['msg']})"
    return line, value


class ReaderPosition(BaseModel):
    """Where an `EventReader` stopped: the bytes and lines of events.jsonl read (up to the
    last complete line), its first line (hex), the last segment read, and the events read."""

    model_config = ConfigDict(extra="forbid")

    offset: int = Field(ge=0)
    lines: int = Field(ge=0)
    head: str = Field(pattern="^([0-9a-f]{2})*$", max_length=512)
    segments: int = Field(ge=-1)
    count: int = Field(ge=0)


class EventSink(Protocol):
    """What an `EventReader` hands every event it reads to, in order, a chunk at a time (the
    curves keep their numbers in arrays rather than the events as dicts)."""

    def add(self, events: list[dict[str, Any]]) -> None: ...

    def clear(self) -> None: ...


class EventReader:
    """One run's events, read incrementally: it remembers how far it read (a byte offset in
    the local `events.jsonl`, the segments read on an object store), reads only what was
    added since on each `update`, keeps a torn last line for the next one, and collects a
    warning (file and line number) for every line that is not a valid event record, which it
    skips. A log that got shorter (rewritten, or a fresh run in the folder) is read again from
    its start. Not shared between threads without a lock (`lock` is there for that).

    With a SINK, every event read goes to it as well, and only those KEEP accepts stay in
    `pairs` (a reader of a long run keeps its step events as numbers in the sink, not as
    dicts); `count` is every event read, kept or not."""

    def __init__(
        self,
        store: Store,
        run_prefix: str,
        sink: Optional[EventSink] = None,
        keep: Optional[Callable[[dict[str, Any]], bool]] = None,
    ) -> None:
        self.store = store
        self.single, self.folder = store.log_paths(events_prefix(run_prefix))
        self.lock = threading.Lock()
        self.sink = sink
        self.keep = keep
        self.count = 0  # events read (since the last reset), kept or not
        self.pairs: list[tuple[str, dict[str, Any]]] = []  # (the line, its event), in order
        self.warnings: list[str] = []  # every bad line read, as `FILE:LINE: what` (a reset clears them)
        self.resets = 0  # how many times the log was found shorter and read again
        self._offset = 0  # bytes of events.jsonl read, up to the last complete line
        self._lines = 0  # lines of events.jsonl read
        self._head = b""  # its first line: a different file under the name is read from its start
        self._segments = -1  # the last segment read
        self._resolved: Optional[list[dict[str, Any]]] = None

    def update(self) -> list[tuple[str, dict[str, Any]]]:
        """Read what was added since the last update; the new (line, event) pairs kept (after
        a reset, every pair kept)."""
        before, count, resets = len(self.pairs), self.count, self.resets
        self._read_single()
        self._read_segments()
        if self.resets != resets:
            before = 0
            self._resolved = None
        if self.count != count or self.resets != resets:
            self._resolved = None
        return self.pairs[before:]

    def events(self, superseded: bool = False) -> list[dict[str, Any]]:
        """The events read so far, resumes applied (all of them with SUPERSEDED)."""
        if superseded:
            return [event for _, event in self.pairs]
        if self._resolved is None:
            self._resolved = apply_resumes([event for _, event in self.pairs])
        return self._resolved

    def position(self) -> ReaderPosition:
        """How far it read, for a reader in another process to go on from (`restore`)."""
        return ReaderPosition(offset=self._offset, lines=self._lines, head=self._head.hex(), segments=self._segments, count=self.count)

    def restore(self, position: ReaderPosition, pairs: list[tuple[str, dict[str, Any]]], warnings: list[str]) -> None:
        """Go on from POSITION, with the PAIRS kept and the WARNINGS collected up to it (what
        a cache of this log saved); the next `update` reads from there, and from the start
        when the log is no longer the one read (shorter, or another first line)."""
        self.pairs, self.warnings, self._resolved = pairs, warnings, None
        self.count = position.count
        self._offset, self._lines, self._segments = position.offset, position.lines, position.segments
        self._head = bytes.fromhex(position.head)

    def _start_over(self) -> None:
        self.pairs, self.warnings, self._resolved = [], [], None
        self.count = 0
        if self.sink is not None:
            self.sink.clear()
        self._offset = self._lines = 0
        self._head = b""
        self._segments = -1
        self.resets += 1

    def _read_single(self) -> None:
        while True:
            try:
                size, data = self.store.read_from(self.single, self._offset, CHUNK)
            except FileNotFoundError:
                if self._offset:
                    self._start_over()
                return
            if size < self._offset or (self._head and not self._same_head()):
                self._start_over()
                continue
            end = data.rfind(b"\n") + 1  # a torn last line waits for its newline
            if end == 0:
                if len(data) >= CHUNK and self._skip_long_line(size):  # one line longer than a chunk: not an event
                    continue
                return
            if self._offset == 0:  # its first line (at most 256 bytes of it) tells this file from a new one
                self._head = data[: min(data.find(b"\n") + 1, 256)]
            self._take_lines(data[:end], self.store.url_of(self.single), self._lines)
            self._lines += data.count(b"\n", 0, end)
            self._offset += end
            if self._offset >= size:
                return

    def _same_head(self) -> bool:
        _, data = self.store.read_from(self.single, 0, len(self._head))
        return data == self._head

    def _skip_long_line(self, size: int) -> bool:
        """Step over a line longer than CHUNK, warned about, never held whole; False when it
        has no newline yet (a line being written: read again next time)."""
        position = self._offset
        while position < size:
            _, data = self.store.read_from(self.single, position, CHUNK)
            if not data:
                break
            newline = data.find(b"\n")
            if newline >= 0:
                self._offset = position + newline + 1
                self._lines += 1
                self.warnings.append(f"{self.store.url_of(self.single)}:{self._lines}: longer than {CHUNK:,} bytes: not an event; the line is skipped")
                return True
            position += len(data)
        return False

    def _read_segments(self) -> None:
        numbers = self.store.log_segments(self.folder)
        if numbers and numbers[-1] < self._segments or not numbers and self._segments >= 0:
            self._start_over()
            self._read_single()
        for number in (n for n in numbers if n > self._segments):
            path = f"{self.folder}/{number:06d}.jsonl"
            self._take_lines(self.store.read_bytes(path), self.store.url_of(path), 0)
            self._segments = number

    def _take_lines(self, data: bytes, url: str, first: int) -> None:
        """The complete lines DATA (line FIRST + 1 on) parsed and taken, PIECE bytes at a time."""
        start = 0
        while start < len(data):
            end = data.find(b"\n", min(start + PIECE, len(data) - 1)) + 1 or len(data)
            self._take(self._parse(data[start:end], url, first))
            first += data.count(b"\n", start, end)
            start = end

    def _take(self, pairs: list[tuple[str, dict[str, Any]]]) -> None:
        self.count += len(pairs)
        if self.sink is not None:
            self.sink.add([event for _, event in pairs])
        keep = self.keep
        self.pairs.extend(pairs if keep is None else (pair for pair in pairs if keep(pair[1])))

    def _parse(self, data: bytes, url: str, first: int) -> list[tuple[str, dict[str, Any]]]:
        pairs: list[tuple[str, dict[str, Any]]] = []
        for number, raw in enumerate(data.split(b"\n"), start=first + 1):
            if not raw.strip():
                continue
            found = decode_line(raw)
            if isinstance(found, str):
                self.warnings.append(f"{url}:{number}: {found}; the line is skipped")
                continue
            pairs.append(found)
        return pairs
