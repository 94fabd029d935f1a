"""A run's curves: every series its events log, against step (resumes applied, so a resumed
run's series has each step once).

Series names, what `plot --metric` and the dashboard use:

| name | from | group |
| --- | --- | --- |
| `loss`, `acc`, ... | `step` events: the loss and the objective's metrics | train |
| `EVAL/METRIC` (`val/loss`) | `eval` events, as status.json's `last_eval` names them | eval |
| `lr:GROUP`, `grad_norm` | `step` events | optimizer |
| `step_time`, `examples_per_s`, `tokens_per_s`, `memory` | `step` events | speed |
| `diag:NAME` (`diag:grad-norm/net.layers.0.w`) | `diagnostic` events | diagnostic |

A non-finite value is null in the events and a gap (None) in its series.

`CurveData` is what a reader of a run's events keeps (sexpgpu/results/readers.py's
`RunReaders`, which `logs`, `plot` and the dashboard read through): each series as two arrays
of numbers (16 bytes a point; 8 for a series with a value at every step event, whose steps
are those of the step events), the latest `TAIL` step events whole, and how many events it
was given; sexpgpu/results/seriescache.py keeps it on disk.

A series is shown downsampled (`downsample`): the steps are cut into BUCKETS equal spans (a
pixel each) and each span keeps its first, last, lowest and highest point and its first gap,
so that a spike or a gap is never smoothed away; `buckets=None` asks for every point.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections import deque
from typing import Any, Iterable, Iterator, Literal, Optional, TypeAlias

import numpy as np

from pydantic import BaseModel, Field


Group = Literal["train", "eval", "optimizer", "speed", "diagnostic"]
GROUPS: tuple[Group, ...] = ("train", "eval", "optimizer", "speed", "diagnostic")
SPEED_FIELDS = ("step_time", "examples_per_s", "tokens_per_s", "memory")


class Series(BaseModel):
    name: str
    group: Group
    steps: list[int] = Field(default_factory=list)
    values: list[Optional[float]] = Field(default_factory=list)
    points: Optional[int] = None  # how many points the series has, when fewer are shown (downsampled)

    @property
    def metric(self) -> str:
        """The metric's own name: `loss` for `loss` and for `val/loss` (one chart shows both)."""
        if self.group == "eval":
            return self.name.split("/", 1)[1]
        return self.name


class Curves(BaseModel):
    """Every series of one run, in the order they first appear, train before eval."""

    series: list[Series] = Field(default_factory=list)
    events: int = 0  # how many events were read
    last_step: Optional[int] = None  # of the latest step event
    warnings: list[str] = Field(default_factory=list)  # the lines of the events that were skipped, FILE:LINE: why

    def named(self, name: str) -> Optional[Series]:
        return next((s for s in self.series if s.name == name), None)

    def names(self) -> list[str]:
        return [s.name for s in self.series]


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _step_of(event: dict[str, Any]) -> Optional[int]:
    step = event.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def step_points(event: dict[str, Any]) -> Iterator[tuple[str, "Group", Any]]:
    """The (series, group, value) a step event logs, in the order they are taken."""
    if "loss" in event:
        yield "loss", "train", event["loss"]
    for key, value in _mapping(event.get("metrics")).items():
        yield str(key), "train", value
    for group, value in _mapping(event.get("lr")).items():
        yield f"lr:{group}", "optimizer", value
    if "grad_norm" in event:
        yield "grad_norm", "optimizer", event["grad_norm"]
    for key in SPEED_FIELDS:
        if key in event:
            yield key, "speed", event[key]


def resume_step(event: dict[str, Any]) -> Optional[int]:
    """The step a resume event goes on from (what it supersedes is after it)."""
    from_step = event.get("from_step", event.get("step"))
    return from_step if isinstance(from_step, int) and not isinstance(from_step, bool) else None


TAIL = 1000  # the latest step events a reader keeps whole (the dashboard's events table shows as many)
DEFAULT_BUCKETS = 1000  # the points a chart is drawn from, about one per pixel of its width


class Column:
    """One series as numbers: its steps (int64) and values (float64, NaN for a gap: a
    non-finite value is logged as null, so a NaN is never a value). A series of the step
    events that has a value at every step event so far keeps no steps of its own: they are
    the first of SHARED (the steps of the step events), 8 bytes a point saved."""

    __slots__ = ("name", "group", "own", "shared", "values", "ordered")

    def __init__(self, name: str, group: Group, shared: Optional["array[int]"] = None) -> None:
        self.name = name
        self.group = group
        self.shared = shared
        self.own: Optional["array[int]"] = None if shared is not None else array("q")
        self.values = array("d")
        self.ordered = True  # steps never go down (what `resume` can rely on)

    def __len__(self) -> int:
        return len(self.values)

    @property
    def steps(self) -> "array[int]":
        """Its steps (a copy, when shared)."""
        if self.own is not None:
            return self.own
        assert self.shared is not None
        return self.shared[: len(self.values)]

    def step_at(self, index: int) -> int:
        return (self.own if self.own is not None else self.shared)[index]  # type: ignore[index]

    def append(self, step: int, value: float) -> None:
        """A point (VALUE NaN: a gap)."""
        if self.own is None:
            assert self.shared is not None
            if len(self.values) == len(self.shared) - 1:  # the step event being read is SHARED's last
                self.values.append(value)
                return
            self.own = self.shared[: len(self.values)]  # it missed a step event: its steps are its own from now on
        if self.ordered and self.own and step < self.own[-1]:
            self.ordered = False
        self.own.append(step)
        self.values.append(value)

    def extend(self, before: int, steps: Steps, values: Values) -> None:
        """`append` of each of STEPS with its value, in order, at once; BEFORE: how many step
        events there were before these (whose steps SHARED ends with)."""
        if self.own is None:
            assert self.shared is not None
            if len(self.values) == before:  # a value at every step event so far: still shared
                self.values.frombytes(_raw(values, "=f8"))
                return
            self.own = self.shared[: len(self.values)]
        if self.ordered and len(steps) and ((self.own and steps[0] < self.own[-1]) or bool(np.any(steps[1:] < steps[:-1]))):
            self.ordered = False
        self.own.frombytes(_raw(steps, "=i8"))
        self.values.frombytes(_raw(values, "=f8"))

    def drop_after(self, step: int) -> None:
        """Leave out the points of steps after STEP (what a resume from STEP supersedes)."""
        if self.own is None:
            del self.values[bisect_right(self.steps, step):]
            return
        if self.ordered:
            keep = bisect_right(self.own, step)
            del self.own[keep:]
            del self.values[keep:]
            return
        pairs = [(s, v) for s, v in zip(self.own, self.values) if s <= step]
        self.own = array("q", (s for s, _ in pairs))
        self.values = array("d", (v for _, v in pairs))
        self.ordered = all(a <= b for a, b in zip(self.own, self.own[1:]))

    def _steps_view(self) -> Steps:
        steps = self.own if self.own is not None else self.shared
        if not steps:
            return np.zeros(0, dtype=np.int64)
        return np.frombuffer(steps, dtype=np.int64)[: len(self.values)]

    def series(self, buckets: Optional[int] = None, start: int = 0) -> Series:
        """The points from index START on, downsampled to BUCKETS spans when there are more
        than four a span (None: every point)."""
        steps = self._steps_view()[start:]
        values = np.frombuffer(self.values, dtype=np.float64)[start:] if self.values else np.zeros(0, dtype=np.float64)
        total = len(steps)
        if buckets is not None and total > 4 * buckets:
            steps, values = downsample(steps, values, buckets)
        shown = [None if math.isnan(v) else v for v in values.tolist()]
        return Series(name=self.name, group=self.group, steps=steps.tolist(), values=shown,
                      points=total if len(steps) < total else None)


Steps: TypeAlias = "np.ndarray[Any, np.dtype[np.int64]]"
Values: TypeAlias = "np.ndarray[Any, np.dtype[np.float64]]"
SLICE = 1 << 16  # points downsampled at a time: the temporaries stay small for a series of millions


def _raw(numbers: "np.ndarray[Any, Any]", dtype: str) -> memoryview:
    """NUMBERS' bytes as DTYPE, for an array's frombytes: no copy where they are that already."""
    return np.ascontiguousarray(numbers, dtype=dtype).data.cast("B")


def downsample(steps: Steps, values: Values, buckets: int) -> tuple[Steps, Values]:
    """STEPS and VALUES (NaN: a gap) cut into BUCKETS equal spans of steps; each span keeps
    its first and last point, its lowest and highest value and its first gap, in step order
    (at most 5 points a span: a chart of BUCKETS pixels looks the same as one of every point)."""
    count = len(steps)
    if count == 0 or buckets < 1:
        return steps, values
    if np.any(steps[1:] < steps[:-1]):
        order = np.argsort(steps, kind="stable")
        steps, values = steps[order], values[order]
    first, width = int(steps[0]), int(steps[-1]) - int(steps[0]) + 1
    edges = first + (np.arange(buckets, dtype=np.int64) * width + buckets - 1) // buckets  # the first step of each span
    starts = np.unique(np.searchsorted(steps, edges, side="left"))
    starts = starts[starts < count]
    group = max(1, len(starts) * SLICE // count)
    kept = []
    for i in range(0, len(starts), group):
        begin = int(starts[i])
        end = int(starts[i + group]) if i + group < len(starts) else count
        kept.append(begin + _kept(values[begin:end], starts[i:i + group] - begin))
    index = np.concatenate(kept)
    return steps[index], values[index]


def _kept(values: Values, starts: Steps) -> Steps:
    """The indices of VALUES that its spans (from each of STARTS to the next) keep, in order."""
    count = len(values)
    ends = np.r_[starts[1:], count] - 1
    sizes = ends - starts + 1
    gaps = np.isnan(values)
    low, high = (np.where(gaps, np.inf, values), np.where(gaps, -np.inf, values)) if gaps.any() else (values, values)
    at_low = _first(low == np.repeat(np.minimum.reduceat(low, starts), sizes), starts, ends)
    at_high = _first(high == np.repeat(np.maximum.reduceat(high, starts), sizes), starts, ends)
    kept = np.unique(np.concatenate([starts, ends, at_low, at_high, _first(gaps, starts, ends)]))
    return kept[kept < count]


def _first(holds: "np.ndarray[Any, np.dtype[np.bool_]]", starts: Steps, ends: Steps) -> Steps:
    """Each span's (STARTS to ENDS, inclusive) first index where HOLDS is true; len(HOLDS)
    where it is true nowhere in the span. (One scan for the true places, then a search per
    span: a where over every index and a reduceat of it took twice as long.)"""
    hits = np.flatnonzero(holds)
    if not len(hits):
        return np.full(len(starts), len(holds), dtype=np.int64)
    found = hits[np.minimum(np.searchsorted(hits, starts), len(hits) - 1)]
    return np.where((found >= starts) & (found <= ends), found, len(holds))


class CurveData:
    """The curves of one run as they are read (an `EventSink`): a `Column` per series, in the
    order they first appear, resumes applied as they come (a resume from step S drops the
    points after S); and the latest `TAIL` step events."""

    def __init__(self) -> None:
        self.cuts = 0  # how many times points were dropped (a resume, or a clear): a cache of it is then saved whole
        self.clear()

    def clear(self) -> None:
        self.columns: dict[str, Column] = {}
        self.step_steps = array("q")  # the step of each step event (resumes applied)
        self.tail: deque[dict[str, Any]] = deque(maxlen=TAIL)
        self.events = 0
        self.cuts += 1

    @property
    def last_step(self) -> Optional[int]:
        return self.step_steps[-1] if self.step_steps else None

    def add(self, events: list[dict[str, Any]]) -> None:
        self.events += len(events)
        for event in events:
            kind = event.get("kind")
            if kind == "resume":
                self._resume(event)
                continue
            step = _step_of(event)
            if step is None:
                continue
            if kind == "step":
                self._step(step, event)
            elif kind == "eval":
                self._eval(step, event)
            elif kind == "diagnostic":
                self._diagnostic(step, event)

    def _put(self, name: str, group: Group, step: int, value: Any) -> None:
        # type(), not isinstance: a bool is not a number here; NaN marks a gap (a null)
        kind = type(value)
        if kind is float:
            number = value if math.isfinite(value) else math.nan
        elif kind is int:
            number = float(value)
        elif value is None:
            number = math.nan
        else:
            return
        column = self.columns.get(name)
        if column is None:
            shared = self.step_steps if group != "eval" and group != "diagnostic" and len(self.step_steps) == 1 else None
            column = self.columns[name] = Column(name, group, shared)
        column.append(step, number)

    def _step(self, step: int, event: dict[str, Any]) -> None:
        self.step_steps.append(step)
        self.tail.append(event)
        for name, group, value in step_points(event):
            self._put(name, group, step, value)

    def add_steps(self, steps: Steps, points: list[tuple[str, Group, Values]]) -> None:
        """Step events of STEPS, each logging its value of every one of POINTS (series,
        group, a value a step; NaN: null, and no two of one name), taken at once as `add`
        takes them one by one, the tail aside (the caller keeps it)."""
        before = len(self.step_steps)
        self.step_steps.frombytes(_raw(steps, "=i8"))
        self.events += len(steps)
        for name, group, values in points:
            column = self.columns.get(name)
            if column is None:
                shared = self.step_steps if group != "eval" and group != "diagnostic" and before == 0 else None
                column = self.columns[name] = Column(name, group, shared)
            column.extend(before, steps, values)

    def _eval(self, step: int, event: dict[str, Any]) -> None:
        name = str(event.get("name") or "eval")
        for key, value in _mapping(event.get("metrics")).items():
            self._put(f"{name}/{key}", "eval", step, value)

    def _diagnostic(self, step: int, event: dict[str, Any]) -> None:
        for key, value in _mapping(event.get("values")).items():
            self._put(f"diag:{key}", "diagnostic", step, value)

    def _resume(self, event: dict[str, Any]) -> None:
        from_step = resume_step(event)
        if from_step is None:
            return
        self.cuts += 1
        for name, column in list(self.columns.items()):
            column.drop_after(from_step)
            if not column:
                del self.columns[name]  # it comes back in the order it appears again
        keep = bisect_right(self.step_steps, from_step)
        del self.step_steps[keep:]  # after the columns that share it: each cut its own values first
        kept = [e for e in self.tail if (_step_of(e) or 0) <= from_step]
        self.tail = deque(kept, maxlen=TAIL)

    def ordered(self) -> list[Column]:
        """The columns, train before eval, each group in the order its series first appeared."""
        return sorted(self.columns.values(), key=lambda c: GROUPS.index(c.group))

    def curves(self, buckets: Optional[int] = None, only: Optional[str] = None) -> Curves:
        """The curves, each series downsampled to BUCKETS (None: every point); only the
        series ONLY when given."""
        columns = [c for c in self.ordered() if only is None or c.name == only]
        return Curves(series=[c.series(buckets) for c in columns], events=self.events, last_step=self.last_step)


def curves_of(events: Iterable[dict[str, Any]]) -> Curves:
    """The curves of a run's events (resumes are applied as they come), every point."""
    data = CurveData()
    data.add(list(events))
    return data.curves()
