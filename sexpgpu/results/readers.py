"""How every reader of a store gets a run's events and curves (`logs`, `plot`, the
dashboard): TensorBoard's multiplexer in miniature, one `EventReader` per run that reads only
the bytes added since its last read, its curves kept as arrays (sexpgpu/results/curves.py),
at most `RunReaders.capacity` runs kept (the least recently read go first, and are read
again when asked for), and each run's parsed series kept on disk too
(sexpgpu/results/seriescache.py), so that another process opens a long run without parsing
its events again. A run that no process read before is read from the series its writer
logged in columns (sexpgpu/results/seriescolumns.py) where it has them, and from its lines
where it has not (a run written before them)."""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Optional

from ..runtime.events import EventReader
from ..runtime.store import Store
from .curves import Column, CurveData, Curves
from .seriescache import SAVE_AFTER, SeriesCache
from .seriescolumns import load_columns

def _not_step(event: dict[str, Any]) -> bool:
    return event.get("kind") != "step"


class _Run:
    """One run's reader, its curves, and their disk cache (None: none kept)."""

    def __init__(self, store: Store, slug: str, cache: Optional[Path], save_after: int, use_cache: bool, use_columns: bool) -> None:
        self.data = CurveData()
        self.reader = EventReader(store, slug, sink=self.data, keep=_not_step)
        self.cache = SeriesCache(self.reader, self.data, cache, save_after) if use_cache else None
        loaded = self.cache is not None and self.cache.load()
        if not loaded and use_columns and load_columns(self.reader, self.data) and self.cache is not None:
            self.cache.columns = (self.reader.count, self.reader.resets)

    def update(self) -> None:
        """Read what the run logged since (the caller holds `reader.lock`), and save it to
        the disk cache when that is worth it."""
        self.reader.update()
        if self.cache is not None:
            self.cache.save()


class RunReaders:
    """The events and curves of the runs of STORE, each run's read incrementally (one
    `EventReader` per slug, kept for the CAPACITY runs read most recently); safe to use from
    several threads. Each run's parsed series are cached on disk under CACHE (default
    `$SEXPGPU_CACHE`) once SAVE_AFTER events were read; `use_cache=False` keeps none. A run
    without a cache is read from its series in columns; `use_columns=False` reads its lines."""

    DEFAULT_CAPACITY = 64

    def __init__(self, store: Store, capacity: int = DEFAULT_CAPACITY, cache: Optional[Path] = None, save_after: int = SAVE_AFTER,
                 use_cache: bool = True, use_columns: bool = True) -> None:
        self.store = store
        self.capacity = max(1, capacity)
        self.cache = cache
        self.save_after = save_after
        self.use_cache = use_cache
        self.use_columns = use_columns
        self._runs: OrderedDict[str, _Run] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._runs)

    def _run(self, slug: str) -> _Run:
        with self._lock:
            run = self._runs.get(slug)
            if run is None:
                run = self._runs[slug] = _Run(self.store, slug, self.cache, self.save_after, self.use_cache, self.use_columns)
                while len(self._runs) > self.capacity:
                    self._runs.popitem(last=False)
            else:
                self._runs.move_to_end(slug)
            return run

    def events(self, slug: str, superseded: bool = False) -> tuple[list[dict[str, Any]], list[str]]:
        """SLUG's events, read up to now (resumes applied unless SUPERSEDED), and the warnings
        about the lines skipped. Of its step events, only the latest `TAIL` (resumes applied)."""
        events, warnings, _ = self.events_and_count(slug, superseded)
        return events, warnings

    def events_and_count(self, slug: str, superseded: bool = False) -> tuple[list[dict[str, Any]], list[str], int]:
        """`events`, and how many step events there are in all."""
        run = self._run(slug)
        with run.reader.lock:
            run.update()
            others = run.reader.events(superseded)
            steps = list(run.data.tail)
            merged = sorted([*others, *steps], key=lambda e: str(e.get("t", "")))  # ISO times: in the order written
            return merged, list(run.reader.warnings), len(run.data.step_steps)

    def curves(self, slug: str, buckets: Optional[int] = None, only: Optional[str] = None) -> Curves:
        """SLUG's curves, read up to now, each series downsampled to BUCKETS (None: every
        point; ONLY: that series alone); its `warnings` name the lines skipped."""
        run = self._run(slug)
        with run.reader.lock:
            run.update()
            curves = run.data.curves(buckets, only)
            return curves.model_copy(update={"warnings": list(run.reader.warnings)})

    def since(self, slug: str, sent: dict[str, tuple[int, int, Optional[float]]], buckets: Optional[int]) -> tuple[Curves, bool]:
        """What a live page that was SENT (per series: points, last step, last value) does
        not have: a series' new points, or every series again (downsampled to BUCKETS) and
        True when a resume replaced points it had; SENT is updated to what it has then."""
        run = self._run(slug)
        with run.reader.lock:
            run.update()
            data = run.data
            columns = data.ordered()
            reset = len({c.name for c in columns} & set(sent)) < len(sent) or any(_replaced(c, sent) for c in columns)
            if reset:
                sent.clear()
            fresh = []
            for column in columns:
                count = sent.get(column.name, (0, 0, None))[0]
                if len(column) > count:
                    fresh.append(column.series(buckets if count == 0 else None, start=count))
                if len(column):
                    value = column.values[-1]
                    sent[column.name] = (len(column), column.step_at(len(column) - 1), None if math.isnan(value) else value)
            curves = Curves(series=fresh, events=data.events, last_step=data.last_step, warnings=list(run.reader.warnings))
            return curves, reset


def _replaced(column: Column, sent: dict[str, tuple[int, int, Optional[float]]]) -> bool:
    if column.name not in sent:
        return False
    count, step, value = sent[column.name]
    if len(column) < count:
        return True
    had = column.values[count - 1]
    return column.step_at(count - 1) != step or (None if math.isnan(had) else had) != value
