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

`RunReaders` is how every reader of a store gets a run's events and curves (`logs`, `plot`,
the dashboard): TensorBoard's multiplexer in miniature, one `EventReader` per run that reads
only the bytes added since its last read, and the curves rebuilt only when events came.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Optional

from pydantic import BaseModel, Field

from ..runtime.events import EventReader
from ..runtime.store import Store

Group = Literal["train", "eval", "optimizer", "speed", "diagnostic"]
GROUPS: tuple[Group, ...] = ("train", "eval", "optimizer", "speed", "diagnostic")
SPEED_FIELDS = ("step_time", "examples_per_s", "tokens_per_s", "memory")


class Series(BaseModel):
    name: str
    group: Group
    steps: list[int] = Field(default_factory=list)
    values: list[Optional[float]] = Field(default_factory=list)

    @property
    def metric(self) -> str:
        """The metric's own name: `loss` for `loss` and for `val/loss` (one chart shows both)."""
        if self.group == "eval":
            return self.name.split("/", 1)[1]
        return self.name


class Curves(BaseModel):
    """Every series of one run, in the order they first appear, train before eval."""

    series: list[Series] = Field(default_factory=list)
    events: int = 0  # how many events they were read from
    last_step: Optional[int] = None  # of the latest step event
    warnings: list[str] = Field(default_factory=list)  # the lines of the events that were skipped, FILE:LINE: why

    def named(self, name: str) -> Optional[Series]:
        return next((s for s in self.series if s.name == name), None)

    def names(self) -> list[str]:
        return [s.name for s in self.series]


def _value(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


class _Builder:
    def __init__(self) -> None:
        self.series: dict[str, Series] = {}

    def add(self, name: str, group: Group, step: int, value: Any) -> None:
        if not _is_number(value):
            return
        series = self.series.get(name)
        if series is None:
            series = self.series[name] = Series(name=name, group=group)
        series.steps.append(step)
        series.values.append(_value(value))

    def step_event(self, step: int, event: dict[str, Any]) -> None:
        if "loss" in event:
            self.add("loss", "train", step, event["loss"])
        for key, value in _mapping(event.get("metrics")).items():
            self.add(str(key), "train", step, value)
        for group, value in _mapping(event.get("lr")).items():
            self.add(f"lr:{group}", "optimizer", step, value)
        if "grad_norm" in event:
            self.add("grad_norm", "optimizer", step, event["grad_norm"])
        for key in SPEED_FIELDS:
            if key in event:
                self.add(key, "speed", step, event[key])

    def eval_event(self, step: int, event: dict[str, Any]) -> None:
        name = str(event.get("name") or "eval")
        for key, value in _mapping(event.get("metrics")).items():
            self.add(f"{name}/{key}", "eval", step, value)

    def diagnostic_event(self, step: int, event: dict[str, Any]) -> None:
        for key, value in _mapping(event.get("values")).items():
            self.add(f"diag:{key}", "diagnostic", step, value)


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def curves_of(events: Iterable[dict[str, Any]]) -> Curves:
    """The curves of a run's events (as `read_events` returns them: resumes applied)."""
    builder = _Builder()
    count = 0
    last_step: Optional[int] = None
    handlers = {"step": builder.step_event, "eval": builder.eval_event, "diagnostic": builder.diagnostic_event}
    for event in events:
        count += 1
        step = event.get("step")
        handler = handlers.get(str(event.get("kind")))
        if handler is None or not isinstance(step, int) or isinstance(step, bool):
            continue
        handler(step, event)
        if event.get("kind") == "step":
            last_step = step
    ordered = sorted(builder.series.values(), key=lambda s: GROUPS.index(s.group))  # stable: first appearance within a group
    return Curves(series=ordered, events=count, last_step=last_step)


@dataclass
class _Run:
    reader: EventReader
    curves: Optional[Curves] = None
    of: tuple[int, int] = (-1, -1)  # (resets, events) of the reader the curves were built from


class RunReaders:
    """The events and curves of the runs of STORE, each run's read incrementally (one
    `EventReader` per slug, kept); safe to use from several threads."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()

    def _run(self, slug: str) -> _Run:
        with self._lock:
            run = self._runs.get(slug)
            if run is None:
                run = self._runs[slug] = _Run(EventReader(self.store, slug))
            return run

    def events(self, slug: str, superseded: bool = False) -> tuple[list[dict[str, Any]], list[str]]:
        """SLUG's events, read up to now (resumes applied unless SUPERSEDED), and the warnings
        about the lines skipped."""
        run = self._run(slug)
        with run.reader.lock:
            run.reader.update()
            return list(run.reader.events(superseded)), list(run.reader.warnings)

    def curves(self, slug: str) -> Curves:
        """SLUG's curves, read up to now; its `warnings` name the lines skipped."""
        run = self._run(slug)
        with run.reader.lock:
            reader = run.reader
            reader.update()
            now = (reader.resets, len(reader.pairs))
            if run.curves is None or run.of != now:
                run.curves = curves_of(reader.events()).model_copy(update={"warnings": list(reader.warnings)})
                run.of = now
            return run.curves
