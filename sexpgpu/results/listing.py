"""The runs of a store as records: what `sexpgpu runs` prints and the dashboard's runs table
shows.

Listing a store reads only what a table needs: the store's top-level folders once (on S3 one
delimited LIST), then each folder's run.json and status.json, concurrently with a bounded
pool (two small GETs per run on S3). A folder with neither file is not a run (the Ray
driver's `sweeps/`, a run that has not written anything yet) and is left out; a run that
is being written (a run.json and no status yet) or whose files do not read is shown, with
what could not be read in `problem`.

A `RecordCache` (the dashboard's) reads a run's two files again only when they changed: each
listing asks the store when each was last written (a stat locally, a HEAD on S3) and keeps
the record while both answers are the same as last time (and older than `SETTLE_S`: a
store's times may be whole seconds, so a file written within the last seconds is read again).
"""

from __future__ import annotations

import json
import math
import operator
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Optional, TypeVar, Union

from pydantic import BaseModel, Field

from ..runtime.runfolder import RunFolder, RunInfo
from ..runtime.status import Status
from ..runtime.store import NotARegularFile, Store, UnexpectedSize

# concurrent reads of a listing: enough to hide S3's latency, few enough for any endpoint
READERS = 16

Number = Optional[float]


class RunRecord(BaseModel):
    """One run of a store, from its run.json and status.json (`runs --json` prints a list of
    these). The state is an open string: whatever status.json says."""

    slug: str  # the folder's name (what status, logs and plot accept with --store)
    folder: str  # the run folder as a path or URL
    file: Optional[str] = None
    variant: Optional[str] = None  # None: the base selection
    sweep: Optional[str] = None
    point: Optional[int] = None
    knobs: dict[str, Any] = Field(default_factory=dict)
    state: Optional[str] = None  # None: no status.json yet
    step: Optional[int] = None
    steps: Optional[int] = None  # the planned total
    metrics: dict[str, Number] = Field(default_factory=dict)  # the latest logged training step's
    eval: dict[str, Number] = Field(default_factory=dict)  # the latest evaluation, EVAL/METRIC
    eval_step: Optional[int] = None  # the step of that evaluation, when status.json says
    started: Optional[str] = None  # the attempt's start (status.json), else run.json's creation
    heartbeat: Optional[str] = None
    duration_s: Optional[float] = None  # the final wall time, else start to the last heartbeat
    device: Optional[str] = None
    host: Optional[str] = None
    attempt: Optional[int] = None
    ir_hash: Optional[str] = None
    reason: Optional[str] = None  # the summary's reason, once the attempt ended
    exit_code: Optional[int] = None
    problem: Optional[str] = None  # what could not be read, in words

    @property
    def selection(self) -> str:
        """`base`, the variant, and `SWEEP-POINT` for a sweep's point."""
        parts = [self.variant or "base"]
        if self.sweep is not None:
            parts.append(f"{self.sweep}-{self.point}")
        return " ".join(parts)


# ---------------------------------------------------------------------------------------------
# Reading


def _stamp(text: Optional[str]) -> Optional[datetime]:
    if not text:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def seconds_between(start: Optional[str], end: Optional[str]) -> Optional[float]:
    first, last = _stamp(start), _stamp(end)
    if first is None or last is None:
        return None
    return max(0.0, (last - first).total_seconds())


def _number(value: Any) -> Union[float, None, bool]:
    """VALUE as a metric (None for a non-finite one, written as null); False when it is not
    a number at all."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return float(value) if math.isfinite(value) else None


def metric_values(values: Optional[dict[str, Any]], prefix: str = "") -> dict[str, Number]:
    """The numbers of a metrics mapping, nested mappings flattened with `/` (an eval's own
    metrics under its name); anything else left out."""
    found: dict[str, Number] = {}
    for key, value in (values or {}).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            found.update(metric_values(value, f"{name}/"))
            continue
        number = _number(value)
        if number is not False:
            found[name] = number
    return found


def _device(info: RunInfo) -> Optional[str]:
    names = []
    for device in info.devices:
        if isinstance(device, dict):
            names.append(str(device.get("name") or device.get("kind") or "gpu"))
        else:
            names.append(str(device))
    if not names:
        return None
    distinct = list(dict.fromkeys(names))
    if len(distinct) == 1:
        return distinct[0] if len(names) == 1 else f"{distinct[0]} x{len(names)}"
    return ",".join(names)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


# what one file of one run can be instead of its record (the listing goes on); the store's
# own failures (no connection, no access to the bucket) end it
UNREADABLE = (ValueError, UnicodeDecodeError, NotARegularFile, UnexpectedSize, IsADirectoryError, NotADirectoryError)


def read_quietly(what: str, action: Callable[[], Any], problems: list[str]) -> Any:
    """ACTION's value; None when the file is not there; None and a note in PROBLEMS when it
    does not read as its model (a store failure is raised: the listing cannot go on)."""
    try:
        return action()
    except FileNotFoundError:
        return None
    except UNREADABLE as error:
        problems.append(f"{what} does not read ({_first_line(error)})")
        return None


Stamp = tuple[Optional[float], Optional[float]]  # when run.json and status.json were written (None: not there)


def read_record(store: Store, slug: str) -> Optional[RunRecord]:
    """The record of the run folder SLUG, or None when it has neither run.json nor status.json."""
    return _record_read(store, slug, stamped=False)[1]


def read_stamped_record(store: Store, slug: str) -> tuple[Stamp, Optional[RunRecord]]:
    """`read_record`, and when the versions of run.json and status.json it read were written
    (None for a file that is not there or does not read: a RecordCache reads it again); on
    an object store a look at each file's time more."""
    return _record_read(store, slug, stamped=True)


def _record_read(store: Store, slug: str, stamped: bool) -> tuple[Stamp, Optional[RunRecord]]:
    folder = RunFolder(store, slug)
    problems: list[str] = []
    if stamped:
        info, info_written = read_quietly("run.json", folder.read_run_info_stamped, problems) or (None, None)
        status, status_written = read_quietly("status.json", folder.read_status_stamped, problems) or (None, None)
    else:
        info, status = read_quietly("run.json", folder.read_run_info, problems), read_quietly("status.json", folder.read_status, problems)
        info_written = status_written = None
    if info is None and status is None and not problems:
        return (None, None), None
    return (info_written, status_written), record_of(folder, info, status, problems)


def record_of(folder: RunFolder, info: Optional[RunInfo], status: Optional[Status], problems: Iterable[str] = ()) -> RunRecord:
    """The record of FOLDER from its run.json and status.json as read (None: not there)."""
    notes = list(problems)
    fields: dict[str, Any] = {"slug": folder.slug, "folder": folder.url}
    if info is not None:
        selection = info.selection
        fields.update({
            "file": info.file, "variant": selection.variant, "sweep": selection.sweep, "point": selection.point,
            "knobs": dict(info.knobs), "started": info.created, "device": _device(info), "host": info.host,
            "ir_hash": info.ir_hash,
        })
    elif not any(p.startswith("run.json") for p in notes):
        notes.append("no run.json")
    if status is not None:
        fields.update(_from_status(status))
    return RunRecord(**fields, problem="; ".join(notes) or None)


def _from_status(status: Status) -> dict[str, Any]:
    summary = status.summary
    evaluation = metric_values(status.last_eval) or (metric_values(summary.last_eval) if summary else {})
    eval_step = status.last_eval_step
    duration = summary.wall_time_s if summary is not None else seconds_between(status.started, status.heartbeat)
    return {
        "state": str(status.state), "step": status.step, "steps": status.steps, "metrics": metric_values(status.metrics),
        "eval": evaluation, "eval_step": eval_step if isinstance(eval_step, int) else None, "started": status.started,
        "heartbeat": status.heartbeat, "duration_s": duration, "host": status.host, "attempt": status.attempt,
        "reason": summary.reason if summary is not None else None, "exit_code": summary.exit_code if summary is not None else None,
    }


T = TypeVar("T")
SETTLE_S = 2.0


def _written(store: Store, path: str) -> Optional[float]:
    try:
        return store.modified(path)
    except FileNotFoundError:
        return None


class RecordCache:
    """The records of STORE's runs (what `runs`, `plot --sweep` and the dashboard list),
    each read again only when its run.json or status.json changed, with each record's JSON
    text (`dump_json`'s, made once); safe to use from several threads. A cache that will
    not be asked again (REMEMBER False: a command that lists once) looks at no file's time,
    which on an object store is a request a file."""

    def __init__(self, store: Store, readers: int = READERS, clock: Callable[[], float] = time.time, remember: bool = True) -> None:
        self.store = store
        self.readers = readers
        self.clock = clock
        self.remember = remember
        self.reads = 0  # records read (not taken from the cache), for a test to count
        self._kept: dict[str, tuple[Stamp, Optional[RunRecord], str]] = {}
        self._lock = threading.Lock()

    def _record(self, slug: str) -> tuple[Optional[RunRecord], str]:
        if not self.remember:
            record = self._read_record(slug)
            return record, record.model_dump_json() if record is not None else "null"
        with self._lock:
            kept = self._kept.get(slug)
        looked: Optional[Stamp] = None
        if kept is not None:  # a look at each file's time first: read again only what changed
            folder = RunFolder(self.store, slug)
            looked = (_written(self.store, folder.path("run.json")), _written(self.store, folder.path("status.json")))
            settled = all(when is None or self.clock() - when >= SETTLE_S for when in looked)
            if kept[0] == looked and settled and None not in looked:
                return kept[1], kept[2]
        stamp, record = self._read(slug, looked)
        text = record.model_dump_json() if record is not None else "null"  # strict JSON too: a non-finite float is null
        with self._lock:
            self._kept[slug] = (stamp, record, text)
        return record, text

    def _read(self, slug: str, looked: Optional[Stamp] = None) -> tuple[Stamp, Optional[RunRecord]]:
        """The record of SLUG and its stamp: LOOKED, the times looked at just before, or else
        the times of the versions read (so a run's first read looks at no time apart)."""
        if looked is not None:
            return looked, self._read_record(slug)
        found = read_stamped_record(self.store, slug)
        with self._lock:
            self.reads += 1
        return found

    def _read_record(self, slug: str) -> Optional[RunRecord]:
        record = read_record(self.store, slug)
        with self._lock:
            self.reads += 1
        return record

    def _each(self, read: Callable[[str], T]) -> list[T]:
        """READ of each run folder of the store, in folder order."""
        slugs = self.store.folders()
        if not slugs:
            return []
        with self._lock:
            for gone in set(self._kept) - set(slugs):
                del self._kept[gone]
        if self.store.is_local:  # a stat each: a pool of threads would cost more than it saves
            return [read(slug) for slug in slugs]
        with ThreadPoolExecutor(max_workers=max(1, min(self.readers, len(slugs))), thread_name_prefix="sexpgpu-runs") as pool:
            return list(pool.map(read, slugs))

    def records_and_json(self, sweep: Optional[str] = None) -> list[tuple[RunRecord, str]]:
        """Every run of the store (of the sweep SWEEP only, when given), in folder order,
        each with its record's JSON text."""
        return [(r, text) for r, text in self._each(self._record) if r is not None and (sweep is None or r.sweep == sweep)]

    def records(self, sweep: Optional[str] = None) -> list[RunRecord]:
        """Every run of the store (of the sweep SWEEP only, when given), in folder order."""
        if self.remember:
            return [r for r, _ in self.records_and_json(sweep)]
        found = self._each(self._read_record)
        return [r for r in found if r is not None and (sweep is None or r.sweep == sweep)]


# ---------------------------------------------------------------------------------------------
# Keys: what --sort and --filter name

FIELD_KEYS = ("slug", "file", "variant", "sweep", "point", "state", "step", "steps", "started",
              "heartbeat", "duration", "device", "host", "attempt", "ir_hash", "reason", "exit_code")


def value_of(record: RunRecord, key: str) -> Any:
    """The value KEY names in RECORD: a field, else a training metric, an eval metric
    (EVAL/METRIC) or a knob (`knobs.NAME` when a knob shares a field's name); None when the
    record has none."""
    if key == "duration":
        return record.duration_s
    if key == "variant":
        return record.variant or "base"
    if key in FIELD_KEYS:
        return getattr(record, key)
    if key.startswith("knobs."):
        return record.knobs.get(key[len("knobs."):])
    for source in (record.metrics, record.eval, record.knobs):
        if key in source:
            return source[key]
    return None


def known(records: Iterable[RunRecord], key: str) -> bool:
    """Whether KEY names a field, or something at least one of RECORDS has."""
    if key in FIELD_KEYS or key.startswith("knobs."):
        return True
    return any(key in r.metrics or key in r.eval or key in r.knobs for r in records)


def keys_of(records: Iterable[RunRecord]) -> list[str]:
    """The keys RECORDS have, for a message: the fields, then metrics, evals and knobs."""
    rows = list(records)
    return list(dict.fromkeys([*FIELD_KEYS, *(k for r in rows for source in (r.metrics, r.eval, r.knobs) for k in source)]))


def _order(value: Any) -> tuple[int, Any]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return (1, text_of(value))
    return (0, float(value))


def sort_records(records: list[RunRecord], key: str, reverse: bool = False) -> list[RunRecord]:
    """RECORDS by KEY (numbers before words); records without a value for it always last."""
    present = [r for r in records if value_of(r, key) is not None]
    missing = [r for r in records if value_of(r, key) is None]
    return sorted(present, key=lambda r: _order(value_of(r, key)), reverse=reverse) + missing


def text_of(value: Any) -> str:
    """A value as --filter compares it and the table prints it: strings as they are,
    everything else as JSON (true, null, [1,2])."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------
# Filters: KEY=VALUE, KEY!=VALUE, KEY<VALUE, KEY<=VALUE, KEY>VALUE, KEY>=VALUE

OPERATORS: tuple[tuple[str, Callable[[Any, Any], bool]], ...] = (
    ("!=", operator.ne), ("<=", operator.le), (">=", operator.ge), ("=", operator.eq), ("<", operator.lt), (">", operator.gt),
)


class Filter(BaseModel):
    key: str
    op: str
    value: str

    @classmethod
    def parse(cls, text: str) -> "Filter":
        """`state=finished`, `val/acc>=0.9`, `lr!=0.1`; ValueError says how to write one."""
        positions = [(text.find(symbol), -len(symbol), symbol) for symbol, _ in OPERATORS if symbol in text]
        if not positions:
            raise ValueError(f"--filter {text}: write KEY=VALUE (or KEY!=VALUE, KEY<VALUE, KEY<=VALUE, KEY>VALUE, KEY>=VALUE)")
        _, _, symbol = min(positions)
        key, _, value = text.partition(symbol)
        if not key.strip():
            raise ValueError(f"--filter {text}: the KEY before {symbol} is empty")
        if symbol in ("<", "<=", ">", ">=") and _as_number(value.strip()) is None:
            raise ValueError(f"--filter {text}: {symbol} compares numbers; {value.strip()!r} is not one")
        return cls(key=key.strip(), op=symbol, value=value.strip())

    def matches(self, record: RunRecord) -> bool:
        compare = dict(OPERATORS)[self.op]
        actual = value_of(record, self.key)
        wanted = _as_number(self.value)
        if isinstance(actual, (int, float)) and not isinstance(actual, bool) and wanted is not None:
            return bool(compare(float(actual), wanted))
        if self.op not in ("=", "!="):
            return False  # an order between a number and a word, or a missing value
        if actual is None:
            return self.op == "!="
        return bool(compare(text_of(actual), self.value))


def _as_number(text: str) -> Optional[float]:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
