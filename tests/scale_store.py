"""Stores at scale, written directly in the formats real runs write (docs/jsonl-events.md,
docs/the-status-file.md): a run of a million logged steps, and a sweep of thousands of
points, each made from a real run's run.json and status.json with its slug, point, knobs and
numbers varied. Training a million steps or five thousand runs would take hours; writing
their files takes seconds. Used by tests/test_dashboard_scale.py and bench/dashboard_scale.py."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional, TextIO

from sexpgpu.runtime.serieslog import encode_chunk
from sexpgpu.runtime.store import Appended

SPIKE_EVERY = 99_991  # a prime: a spike's step is no bucket's edge
EVAL_EVERY = 10_000


def loss_at(step: int) -> float:
    """The logged loss of STEP: a decaying curve with a spike up every SPIKE_EVERY steps and a
    dip down at the step after it (what a downsampled chart must not smooth away)."""
    base = 2.0 * math.exp(-step / 300_000) + 0.01 * math.sin(step / 50.0)
    if step % SPIKE_EVERY == 0:
        return base + 50.0
    if step % SPIKE_EVERY == 1:
        return base - 40.0
    return base


def _stamp(step: int) -> str:
    seconds = step // 1000
    return f"2026-12-01T{10 + seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{step % 1000:03d}Z"


CHUNK_EVENTS = 2000  # the events of a flush of a run's log: 2 s of its background writer, at 1,000 steps a second


def _event_records(slug: str, steps: int) -> Iterator[dict[str, Any]]:
    """STEPS step events (every field a real step event has), an eval every EVAL_EVERY steps,
    a checkpoint at each eval, and a run.start, a compile and a run.end around them."""
    yield {"v": 1, "t": _stamp(0), "kind": "run.start", "step": 0, "slug": slug, "attempt": 1, "host": "vm", "worker": "pid 1",
           "device": "cpu", "steps": steps}
    yield {"v": 1, "t": _stamp(0), "kind": "compile", "step": 0, "ir_hash": "0" * 64, "params": 99}
    for step in range(1, steps + 1):
        yield {"v": 1, "t": _stamp(step), "kind": "step", "step": step, "loss": loss_at(step), "metrics": {"acc": (step % 97) / 97},
               "lr": {"all": 0.05}, "grad_norm": 1.0 / (1 + step % 13), "step_time": 0.0002, "examples_per_s": 160000.0, "memory": 117899264}
        if step % EVAL_EVERY == 0:
            yield {"v": 1, "t": _stamp(step), "kind": "eval", "step": step, "name": "val", "metrics": {"loss": loss_at(step) + 0.1, "acc": 0.5},
                   "seconds": 0.01}
            yield {"v": 1, "t": _stamp(step), "kind": "checkpoint", "step": step, "path": f"checkpoints/step-{step:06d}", "seconds": 0.01,
                   "bytes": 4096}
    yield {"v": 1, "t": _stamp(steps), "kind": "run.end", "step": steps, "exit_code": 0, "reason": "finished", "state": "finished"}


def write_events(folder: Path, slug: str, steps: int, columns: bool = True, chunk: int = CHUNK_EVENTS) -> None:
    """FOLDER/events.jsonl of `_event_records`, and, with COLUMNS, FOLDER/series.jsonl: a chunk
    of the step events' series every CHUNK events, as a run's event log writes them
    (runtime/serieslog.py's encode_chunk, after each flush of CHUNK lines)."""
    offset = 0
    with open(folder / "events.jsonl", "wb") as events, open(folder / "series.jsonl", "w", encoding="utf-8") as series:
        batch: list[tuple[str, Optional[dict[str, Any]]]] = []
        for record in _event_records(slug, steps):
            batch.append((json.dumps(record, separators=(",", ":")), record if record["kind"] == "step" else None))
            if len(batch) == chunk:
                offset = _flush(events, series if columns else None, batch, offset)
                batch = []
        if batch:
            _flush(events, series if columns else None, batch, offset)
    if not columns:
        (folder / "series.jsonl").unlink()


def _flush(events: BinaryIO, series: Optional[TextIO], batch: list[tuple[str, Optional[dict[str, Any]]]], offset: int) -> int:
    data = "".join(f"{line}\n" for line, _ in batch).encode("utf-8")
    events.write(data)
    if series is not None:
        series.write(encode_chunk(batch, Appended(start=offset, end=offset + len(data), segment=-1, data=data)) + "\n")
    return offset + len(data)


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def write_run(root: Path, template: Path, slug: str, sweep: str | None, point: int | None, knobs: dict[str, Any], steps: int, loss: float) -> Path:
    """A run folder SLUG under ROOT: TEMPLATE's run.json and status.json (a real run's) with
    the slug, the sweep and its point, the knobs, the steps and the final loss changed."""
    folder = root / slug
    folder.mkdir(parents=True)
    info = _json(template / "run.json")
    info["slug"] = slug
    info["selection"]["sweep"] = sweep
    info["selection"]["point"] = point
    info["knobs"] = {**info["knobs"], **knobs}
    status = _json(template / "status.json")
    status["step"] = status["steps"] = steps
    status["metrics"] = {**status["metrics"], "loss": loss}
    (folder / "run.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    (folder / "status.json").write_text(json.dumps(status, indent=2) + "\n", encoding="utf-8")
    return folder


def write_long_run(root: Path, template: Path, steps: int, columns: bool = True, chunk: int = CHUNK_EVENTS) -> str:
    """A finished run of STEPS logged steps under ROOT (made from the real run TEMPLATE), its
    series in columns too unless not COLUMNS (what an older version wrote); its slug."""
    slug = "long.base.0000beef"
    folder = write_run(root, template, slug, None, None, {"steps": steps}, steps, loss_at(steps))
    write_events(folder, slug, steps, columns, chunk)
    return slug


SETTLED = 1_700_000_000.0  # the files' time in a store written long ago


def write_sweep(root: Path, template: Path, points: int, sweep: str = "grid") -> list[str]:
    """POINTS points of the sweep SWEEP under ROOT (made from the real point TEMPLATE), each
    with a short events.jsonl, their run.json and status.json dated SETTLED (a store written
    long ago); their slugs in point order."""
    slugs = []
    for point in range(points):
        slug = f"wide.base.{sweep}-{point}.{point:08x}"
        folder = write_run(root, template, slug, sweep, point, {"lr": 0.001 * (1 + point % 100), "width": 8 * (1 + point % 7)}, 40, 1.0 / (1 + point))
        shutil.copyfile(template / "events.jsonl", folder / "events.jsonl")
        for name in ("run.json", "status.json"):
            os.utime(folder / name, (SETTLED, SETTLED))
        slugs.append(slug)
    return slugs
