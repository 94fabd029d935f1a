"""A run's series in columns, written as it logs, so that the first reader of a long run reads
numbers rather than parsing a line per step (sexpgpu/results/seriescolumns.py reads them).

Every flush of the event log (`EventLog.flush`) appends, after its lines, one chunk to the
run's series log, through the same store: `RUN/series.jsonl` on a local folder, segments
`RUN/series/NNNNNN.jsonl` on an object store (one more object per flush, never one per
step). A chunk is one JSON line (`SeriesChunk`):

- `events`: the event lines it stands for: bytes START to END of events.jsonl, or the
  events segment SEGMENT; how many lines; the SHA-256 of the last one (a reader checks it
  against the events, so a log rewritten since is never read from its columns);
- `items`, in the order the lines were written: a block of consecutive step events of one
  layout (`[layout, count]`), or the line itself of any other event (and of a step event
  that does not fit a layout);
- `layouts`: the keys of a step event's line in order, and of each number its key, the key
  inside an object (`metrics`, `lr`), and its type (`f` a float, `i` an integer, `z` null);
- `payload`: base64 of, block after block, its steps (int64), its numbers (float64, a
  field after another; NaN for null) and its times (`t`, 24 ASCII bytes each), all
  little-endian; `sha256`: of those bytes.

A chunk holds everything its lines say, so a reader rebuilds each event exactly. A torn
chunk (no newline) is dropped, as a torn line of the events is; a chunk that does not match
its SHA-256, or that does not follow the previous one in the events (a line was appended by
another writer, or a chunk was not written), ends what a reader takes from the columns: it
reads the events' lines from there. Writing the columns never fails a run: a store that
refuses a chunk keeps it for the next flush, and readers read the lines meanwhile."""

from __future__ import annotations

import hashlib
import math
from array import array
from typing import Any, Literal, Optional, Union

import pybase64
from pydantic import BaseModel, ConfigDict, Field

from .store import Appended

SERIES_VERSION = 1
TIME_BYTES = 24  # utc_now's "2026-01-02T03:04:05.678Z"
LARGEST_INT = 1 << 53  # an integer a float64 holds exactly
HEAD = ("v", "t", "kind", "step")  # the first keys of every event line, in order (Event.to_record)


def series_prefix(run_prefix: str) -> str:
    """The store log prefix of a run's series: RUN/series(.jsonl | /NNNNNN.jsonl)."""
    return f"{run_prefix.strip('/')}/series"


class EventsSpan(BaseModel):
    """The event lines a chunk stands for."""

    model_config = ConfigDict(extra="forbid")

    start: int = Field(ge=0)  # bytes of events.jsonl before them (0 on an object store)
    end: int = Field(ge=0)  # and after them
    segment: int = Field(ge=-1)  # the events segment they are (-1: the local events.jsonl)
    lines: int = Field(ge=1)
    last: str = Field(pattern="^[0-9a-f]{64}$")  # SHA-256 of the last line, its newline included
    last_bytes: int = Field(ge=1)


class Layout(BaseModel):
    """What the lines of a block of step events look like, their values aside."""

    model_config = ConfigDict(extra="forbid")

    v: int
    keys: list[str]  # after v, t, kind, step, in order
    objects: list[str]  # the keys whose value is an object of numbers
    fields: list[tuple[str, Optional[str]]]  # each number: its key, and its key inside the object (None: the key's own value)
    types: str = Field(pattern="^[fiz]*$")


Item = Union[tuple[int, int], str]  # (layout, count): a block of step events; a string: one event's line


class SeriesChunk(BaseModel):
    model_config = ConfigDict(extra="forbid")

    v: Literal[1]
    events: EventsSpan
    layouts: list[Layout]
    items: list[Item]
    payload: str
    sha256: str = Field(pattern="^[0-9a-f]{64}$")


LayoutKey = tuple[int, tuple[str, ...], tuple[Optional[tuple[Any, ...]], ...], str]  # v, keys, each one's inner keys (None: a number), types


def step_row(record: dict[str, Any]) -> Optional[tuple[LayoutKey, int, bytes, list[float]]]:
    """A step event's record (what its line is the JSON of) as (layout, step, time, numbers);
    None when its line does not fit a layout (it is kept as a line)."""
    keys = tuple(record)
    if keys[:4] != HEAD or record["kind"] != "step":
        return None
    version, stamp, step = record["v"], record["t"], record["step"]
    if type(version) is not int or type(step) is not int or not -(1 << 63) <= step < (1 << 63):
        return None
    if type(stamp) is not str or len(stamp) != TIME_BYTES or not stamp.isascii():
        return None
    shape: list[Optional[tuple[Any, ...]]] = []
    types: list[str] = []
    numbers: list[float] = []
    for key in keys[4:]:
        value = record[key]
        if type(value) is dict:
            shape.append(tuple(value))
            items: Any = value.values()
        else:
            shape.append(None)
            items = (value,)
        for item in items:  # what dump_json writes of each, and how it reads back
            kind = type(item)
            if kind is float:
                if item - item == 0.0:  # finite
                    types.append("f")
                    numbers.append(item)
                else:  # written as null
                    types.append("z")
                    numbers.append(math.nan)
            elif kind is int and -LARGEST_INT < item < LARGEST_INT:
                types.append("i")
                numbers.append(float(item))
            elif item is None:
                types.append("z")
                numbers.append(math.nan)
            else:
                return None
    return (version, keys[4:], tuple(shape), "".join(types)), step, stamp.encode("ascii"), numbers


def _layout(key: LayoutKey) -> Optional[Layout]:
    """The layout of KEY; None when an inner key is not a string (JSON would make it one)."""
    version, keys, shape, types = key
    fields: list[tuple[str, Optional[str]]] = []
    for name, inner in zip(keys, shape):
        if inner is None:
            fields.append((name, None))
        elif all(type(k) is str for k in inner):
            fields.extend((name, k) for k in inner)
        else:
            return None
    objects = [name for name, inner in zip(keys, shape) if inner is not None]
    return Layout(v=version, keys=list(keys), objects=objects, fields=fields, types=types)


class _Block:
    def __init__(self, layout: int, width: int) -> None:
        self.layout = layout
        self.width = width
        self.steps = array("q")
        self.rows: list[float] = []  # the numbers, an event after another
        self.times: list[bytes] = []

    def add(self, step: int, stamp: bytes, numbers: list[float]) -> None:
        self.steps.append(step)
        self.rows.extend(numbers)
        self.times.append(stamp)

    def payload(self) -> bytes:
        import numpy as np  # here: a reader of events alone never loads NumPy

        numbers = np.array(self.rows, dtype="<f8").reshape(len(self.steps), self.width).T  # a field after another
        return np.array(self.steps, dtype="<i8").tobytes() + numbers.tobytes() + b"".join(self.times)


def encode_chunk(batch: list[tuple[str, Optional[dict[str, Any]]]], appended: Appended) -> str:
    """The chunk line of BATCH (each event's line and, for a step event, its record), which
    `append_lines` wrote as APPENDED."""
    known: dict[LayoutKey, Optional[int]] = {}  # each layout's index (None: kept as lines)
    layouts: list[Layout] = []
    items: list[Item] = []
    blocks: list[_Block] = []
    current: Optional[_Block] = None
    for line, record in batch:
        row = step_row(record) if record is not None else None
        if row is not None and row[0] not in known:
            layout = _layout(row[0])
            known[row[0]] = None if layout is None else len(layouts)
            layouts.extend([layout] if layout is not None else [])
        index = known[row[0]] if row is not None else None
        if row is None or index is None:
            items.append(line)
            current = None
            continue
        _, step, stamp, numbers = row
        if current is None or current.layout != index:
            current = _Block(index, len(numbers))
            blocks.append(current)
            items.append((index, 0))
        current.add(step, stamp, numbers)
        items[-1] = (index, len(current.steps))
    payload = b"".join(block.payload() for block in blocks)
    last = batch[-1][0].encode("utf-8") + b"\n"
    span = dict(start=appended.start, end=appended.end, segment=appended.segment, lines=len(batch),
                last=hashlib.sha256(last).hexdigest(), last_bytes=len(last))
    chunk = SeriesChunk(
        v=SERIES_VERSION,
        events=EventsSpan.model_validate(span),
        layouts=layouts,
        items=items,
        payload=encode_payload(payload),
        sha256=hashlib.sha256(payload).hexdigest(),
    )
    return chunk.model_dump_json()


def encode_payload(payload: bytes) -> str:
    """A chunk's payload as its line holds it (standard base64). pybase64, not the standard
    library's: its SIMD decoder is some 30 times faster, and decoding was a third of the
    first open of a million-step run (docs/performance.md, "The dashboard at scale")."""
    return pybase64.b64encode_as_string(payload)


def decode_payload(text: "str | bytes | memoryview") -> bytes:
    """TEXT's bytes; binascii.Error for anything but standard base64 (a damaged line)."""
    return pybase64.b64decode(text, validate=True)


PAYLOAD_KEY = b',"payload":"'
DIGEST_KEY = b'","sha256":"'


def read_chunk(line: bytes) -> tuple[SeriesChunk, bytes]:
    """LINE's chunk and its payload, decoded; ValueError (a ValidationError, a binascii.Error)
    for a line that is no chunk. Where LINE ends as `encode_chunk` writes it (the payload, then
    the digest), the chunk is validated without its payload's text, which is decoded from
    the line itself (the chunk's `payload` is then ""): base64 holds no quote and no
    backslash, so the payload is what follows the last `,"payload":"` before the digest.
    Parsing the quarter megabyte of text into a str took a fifth of a long run's first open."""
    tail = len(line) - len(DIGEST_KEY) - 64 - 2
    key = line.rfind(PAYLOAD_KEY, 0, tail) if tail > 0 and line.startswith(DIGEST_KEY, tail) and line.endswith(b'"}') else -1
    if key < 0:
        chunk = SeriesChunk.model_validate_json(line)
        return chunk, decode_payload(chunk.payload)
    start = key + len(PAYLOAD_KEY)
    return SeriesChunk.model_validate_json(line[:start] + line[tail:]), decode_payload(memoryview(line)[start:tail])
