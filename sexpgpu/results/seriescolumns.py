"""The first read of a run from the series its writer logged in columns (runtime/serieslog.py):
its chunks, in order, put in a reader and its curves what reading the event lines they stand
for would (the same series, events, kept lines, tail and position), block by block of step
events instead of line by line; the reader then reads the lines after the last chunk taken.

A chunk is taken while it follows the previous one in the events (bytes, or segment, and
line) and its payload matches its SHA-256; event lines between two chunks (another writer
appended them, an older version wrote them, or the writer died before their chunk) are
parsed as a reader of the lines parses them. The last chunk taken must match the events
(the SHA-256 of its last line, where it says that line is), or nothing is taken. A run written
before the columns existed has none, and is read from its lines."""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections import deque
from typing import Any, Iterator, Optional

import numpy as np
from pydantic import ValidationError

from ..runtime.events import EventReader, ReaderPosition, decode_line
from ..runtime.serieslog import TIME_BYTES, Layout, SeriesChunk, read_chunk, series_prefix
from .curves import TAIL, CurveData, Group, Steps, Values, resume_step, step_points

READ = 1 << 20  # bytes of series.jsonl asked for at a time (a chunk of 2,000 step events is some 240 kB)
READ_LINES = 8 << 20  # bytes of event lines between chunks read at a time
LONGEST = 1 << 30  # a chunk line longer than this ends what is taken from the columns
HEAD_BYTES = 256  # what EventReader keeps of the first line of events.jsonl


class _Field:
    """A number's place in a layout (what a template event holds instead of the number)."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _event(layout: Layout, step: int, stamp: bytes, numbers: list[Any]) -> dict[str, Any]:
    """The step event a line of LAYOUT with these values is the JSON of."""
    body: dict[str, Any] = {key: {} for key in layout.keys if key in layout.objects}
    for (key, inner), number in zip(layout.fields, numbers):
        if inner is None:
            body[key] = number
        else:
            body[key][inner] = number
    return {"v": layout.v, "t": stamp.decode("ascii"), "kind": "step", "step": step, **{key: body[key] for key in layout.keys}}


def _value(kind: str, number: float) -> Any:
    return number if kind == "f" else int(number) if kind == "i" else None


class _Block:
    """A decoded block of step events: its I-th is the run's step event START + I."""

    def __init__(self, layout: Layout, points: Optional[list[tuple[str, Group, int]]], steps: Steps, numbers: Values,
                 times: memoryview) -> None:
        self.start = 0  # set when it is taken
        self.layout = layout
        self.points = points
        self.steps = steps
        self.numbers = numbers  # a row per field
        self.times = times

    @property
    def end(self) -> int:
        return self.start + len(self.steps)

    def event(self, index: int) -> dict[str, Any]:
        at = index - self.start
        row = [_value(kind, float(self.numbers[f, at])) for f, kind in enumerate(self.layout.types)]
        return _event(self.layout, int(self.steps[at]), bytes(self.times[at * TIME_BYTES:(at + 1) * TIME_BYTES]), row)


class _Replay:
    """The state of a reader of the lines, rebuilt chunk by chunk."""

    def __init__(self, reader: EventReader, data: CurveData) -> None:
        self.reader = reader
        self.data = data
        self.url = reader.store.url_of(reader.single)
        self.pairs: list[tuple[str, dict[str, Any]]] = []
        self.warnings: list[str] = []
        self.count = 0
        self.lines = 0  # lines of events.jsonl taken
        self.offset = 0
        self.segment = -1
        self.last: Optional[SeriesChunk] = None
        self.tail: deque[int] = deque(maxlen=TAIL)  # the latest step events, as their global index
        self.loose: dict[int, dict[str, Any]] = {}  # step events taken from their lines, by global index
        self.blocks: list[_Block] = []  # those the tail may still show
        self.total = 0  # step events taken

    def follows(self, chunk: SeriesChunk) -> bool:
        span = chunk.events
        if span.segment >= 0:
            return span.segment == self.segment + 1 and self.offset == 0
        return self.segment < 0 and span.start == self.offset and span.end > span.start

    def bridge(self, chunk: SeriesChunk) -> bool:
        """The event lines between the last chunk taken and CHUNK (another writer's, an
        older version's, or a flush whose chunk was never written) taken as a reader of the
        lines takes them; False when CHUNK is not after them."""
        span, store = chunk.events, self.reader.store
        if span.segment >= 0:
            if self.offset or span.segment <= self.segment:
                return False
            for number in (n for n in store.log_segments(self.reader.folder) if self.segment < n < span.segment):
                path = f"{self.reader.folder}/{number:06d}.jsonl"
                self._raw_lines(store.read_bytes(path), store.url_of(path), 0)
            self.segment = span.segment - 1
            return True
        if self.segment >= 0 or span.start <= self.offset:
            return False
        while self.offset < span.start:
            _, data = store.read_from(self.reader.single, self.offset, min(READ_LINES, span.start - self.offset))
            end = data.rfind(b"\n") + 1
            if end == 0:
                return False  # a line longer than READ_LINES: the reader of the lines says what it is
            self._raw_lines(data[:end], self.url, self.lines)
            self.lines += data.count(b"\n", 0, end)
            self.offset += end
        return self.offset == span.start

    def _raw_lines(self, data: bytes, url: str, first: int) -> None:
        for number, raw in enumerate(data.split(b"\n")[:-1], start=first + 1):
            if raw.strip():
                self._line(raw, url, number)

    def take(self, chunk: SeriesChunk, payload: bytes) -> bool:
        """CHUNK, with its PAYLOAD decoded, taken; False (nothing of it taken) when the
        payload does not match."""
        if hashlib.sha256(payload).hexdigest() != chunk.sha256:
            return False
        blocks = self._blocks(chunk, payload)
        if blocks is None or sum(1 for item in chunk.items if isinstance(item, str)) + sum(len(b.steps) for b in blocks) != chunk.events.lines:
            return False
        span = chunk.events
        url = self.url if span.segment < 0 else self.reader.store.url_of(f"{self.reader.folder}/{span.segment:06d}.jsonl")
        number = self.lines if span.segment < 0 else 0
        found = iter(blocks)
        for item in chunk.items:
            if isinstance(item, str):
                number += 1
                if item.strip():  # a blank line is no event, and no warning either
                    self._line(item.encode("utf-8"), url, number)
            else:
                block = next(found)
                number += len(block.steps)
                self._block(block)
        self.lines = number if span.segment < 0 else 0
        self.offset, self.segment = (span.end, -1) if span.segment < 0 else (0, span.segment)
        self.last = chunk
        return True

    def _blocks(self, chunk: SeriesChunk, payload: bytes) -> Optional[list[_Block]]:
        blocks, at = [], 0
        points = [_points(layout) for layout in chunk.layouts]
        for item in chunk.items:
            if isinstance(item, str):
                continue
            index, count = item
            if not 0 <= index < len(chunk.layouts) or count < 1:
                return None
            layout = chunk.layouts[index]
            width = len(layout.fields)
            size = count * (8 + 8 * width + TIME_BYTES)
            if width != len(layout.types) or at + size > len(payload):
                return None
            steps = np.frombuffer(payload, dtype="<i8", count=count, offset=at)
            numbers = np.frombuffer(payload, dtype="<f8", count=count * width, offset=at + 8 * count).reshape(width, count)
            times = memoryview(payload)[at + 8 * count * (1 + width):at + size]
            blocks.append(_Block(layout, points[index], steps, numbers, times))
            at += size
        return blocks if at == len(payload) else None

    def _line(self, raw: bytes, url: str, number: int) -> None:
        found = decode_line(raw)
        if isinstance(found, str):
            self.warnings.append(f"{url}:{number}: {found}; the line is skipped")
            return
        event = found[1]
        self.count += 1
        self._cut(event)
        self.data.add([event])
        if event.get("kind") == "step" and self.data.tail:
            self.data.tail.pop()  # the tail is kept here, as indices
            self.loose[self.total] = event
            self._push(self.total)
            self.total += 1
        keep = self.reader.keep
        if keep is None or keep(event):
            self.pairs.append(found)

    def _block(self, block: _Block) -> None:
        block.start = self.total
        points = block.points
        self.count += len(block.steps)
        if points is None:  # two numbers of one series in an event: taken as the lines would be, one by one
            for index in range(block.start, block.end):
                self.data.add([block.event(index)])
                self.data.tail.pop()
        else:
            self.data.add_steps(block.steps, [(name, group, block.numbers[field]) for name, group, field in points])
        self.blocks.append(block)
        self.tail.extend(range(block.start, block.end))
        self.total = block.end
        self._prune()

    def _push(self, index: int) -> None:
        self.tail.append(index)
        self._prune()

    def _prune(self) -> None:
        first = self.tail[0] if self.tail else self.total
        while self.blocks and self.blocks[0].end <= first:
            self.blocks.pop(0)
        for index in [i for i in self.loose if i < first]:
            del self.loose[index]

    def _step_of(self, index: int, starts: list[int]) -> int:
        event = self.loose.get(index)
        if event is not None:
            step = event.get("step")
            return step if isinstance(step, int) and not isinstance(step, bool) else 0
        block = self.blocks[bisect_right(starts, index) - 1]
        return int(block.steps[index - block.start])

    def _cut(self, event: dict[str, Any]) -> None:
        if event.get("kind") != "resume":
            return
        from_step = resume_step(event)
        if from_step is not None:
            starts = [b.start for b in self.blocks]
            self.tail = deque((i for i in self.tail if self._step_of(i, starts) <= from_step), maxlen=TAIL)
            self._prune()

    def _tail_event(self, index: int, starts: list[int]) -> dict[str, Any]:
        event = self.loose.get(index)
        return event if event is not None else self.blocks[bisect_right(starts, index) - 1].event(index)

    def finish(self) -> None:
        """The tail as events, and the reader put where the chunks end."""
        starts = [b.start for b in self.blocks]
        self.data.tail = deque((self._tail_event(i, starts) for i in self.tail), maxlen=TAIL)
        head = b""
        if self.segment < 0:
            _, data = self.reader.store.read_from(self.reader.single, 0, HEAD_BYTES)
            newline = data.find(b"\n")
            head = data[: newline + 1] if 0 <= newline < HEAD_BYTES else data[:HEAD_BYTES]
        position = ReaderPosition(offset=self.offset, lines=self.lines, head=head.hex(), segments=self.segment, count=self.count)
        self.reader.restore(position, self.pairs, self.warnings)


def _points(layout: Layout) -> Optional[list[tuple[str, Group, int]]]:
    """The series a step event of LAYOUT logs, with the field of each; None when two are one series."""
    template = _event(layout, 0, b"0" * TIME_BYTES, [_Field(i) for i in range(len(layout.fields))])
    points = [(name, group, value.index) for name, group, value in step_points(template) if isinstance(value, _Field)]
    return points if len({name for name, _, _ in points}) == len(points) else None


def _lines(reader: EventReader) -> Iterator[bytes]:
    """The complete lines of the run's series log, in order (a torn last one left out)."""
    store = reader.store
    single, folder = store.log_paths(series_prefix(reader.folder.rsplit("/", 1)[0]))
    offset, size = 0, READ
    while True:
        try:
            total, data = store.read_from(single, offset, size)
        except FileNotFoundError:
            break
        end = data.rfind(b"\n") + 1
        if end == 0:
            if len(data) < size or size >= LONGEST:
                break
            size *= 2  # a chunk longer than a read
            continue
        yield from _complete_lines(data)  # what follows the last newline: a chunk the next read has whole
        offset += end
        size = READ
        if offset >= total:
            break
    for number in store.log_segments(folder):
        yield from _complete_lines(store.read_bytes(f"{folder}/{number:06d}.jsonl"))


def _complete_lines(data: bytes) -> Iterator[bytes]:
    """DATA's lines that end in a newline. (bytes.split scans a byte at a time; find is
    memchr, ten times faster over chunk lines of a quarter megabyte.)"""
    start = 0
    while (end := data.find(b"\n", start)) >= 0:
        yield data[start:end]
        start = end + 1


def _matches(reader: EventReader, chunk: SeriesChunk) -> bool:
    """Whether the events still end CHUNK's lines with its last line."""
    span = chunk.events
    try:
        if span.segment < 0:
            start = span.end - span.last_bytes
            _, data = reader.store.read_from(reader.single, start, span.last_bytes)
        else:
            data = reader.store.read_bytes(f"{reader.folder}/{span.segment:06d}.jsonl")[-span.last_bytes:]
    except (FileNotFoundError, ValueError):
        return False
    return hashlib.sha256(data).hexdigest() == span.last


def load_columns(reader: EventReader, data: CurveData) -> bool:
    """READER (fresh, with DATA its sink) and DATA put where reading the run's event lines that
    its series log stands for would put them; False, both left as they were, when it has
    none that match the events."""
    replay = _Replay(reader, data)
    for raw in _lines(reader):
        try:
            chunk, payload = read_chunk(raw)
        except (ValidationError, ValueError):
            break
        if not (replay.follows(chunk) or replay.bridge(chunk)) or not replay.take(chunk, payload):
            break
    if replay.last is None or not _matches(reader, replay.last):
        data.clear()
        return False
    replay.finish()
    return True
