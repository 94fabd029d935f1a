"""`sexpgpu runs [STORE]`: the runs of a store, local or remote, as a table (or `--json`).
It reads only each run's run.json and status.json (sexpgpu/results/listing.py's RecordCache)."""

from __future__ import annotations

import argparse
import math
import sys
from datetime import datetime
from typing import Any, Optional

from ..outcome import Exit
from ..results import listing, locate
from ..results.listing import Filter, RunRecord
from ..runtime.store import is_store_failure, store_problem
from .common import fail_usage, print_json


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("runs")
    p.add_argument("store", nargs="?", default=None, metavar="STORE", help="a folder or URL (default $SEXPGPU_STORE or ./runs)")
    p.add_argument("--sort", default="started", metavar="KEY", help="a column, a metric (loss, val/acc) or a knob (default started)")
    p.add_argument("--reverse", action="store_true", help="sort from the largest")
    p.add_argument("--filter", dest="filters", action="append", default=[], metavar="KEY=VALUE",
                   help="only runs whose KEY is VALUE; also !=, <, <=, >, >= for numbers (repeatable, all must hold)")
    p.add_argument("--sweep", default=None, metavar="NAME", help="only the points of the sweep NAME, by point")
    p.add_argument("--json", action="store_true", help="the records as a JSON list")
    p.set_defaults(run=run_runs)


def run_runs(args: argparse.Namespace) -> int:
    filters = []
    for text in args.filters:
        try:
            filters.append(Filter.parse(text))
        except ValueError as exc:
            fail_usage(str(exc))
    url = args.store or locate.default_store()
    try:
        store = locate.open_store(url, must_exist=True)
        records = listing.RecordCache(store, remember=False).records(sweep=args.sweep)
    except locate.NoStore as exc:
        print(f"sexpgpu: {exc}", file=sys.stderr)
        return Exit.USAGE
    except locate.CannotOpen as exc:
        print(f"sexpgpu: {exc}", file=sys.stderr)
        return Exit.CANNOT_START
    except Exception as exc:  # the store's own failures (no credentials, no access, gone)
        if not is_store_failure(exc):
            raise
        print(f"sexpgpu: {store_problem(url, exc)}", file=sys.stderr)
        return Exit.CANNOT_START
    for key in [f.key for f in filters] + [args.sort]:
        if records and not listing.known(records, key):
            fail_usage(f"no run here has {key!r}; keys: {', '.join(listing.keys_of(records))}")
    chosen = [r for r in records if all(f.matches(r) for f in filters)]
    sort = "point" if args.sweep is not None and args.sort == "started" else args.sort
    chosen = listing.sort_records(chosen, sort, reverse=args.reverse)
    if args.json:
        print_json([r.model_dump(mode="json") for r in chosen])
        return Exit.OK
    if not chosen:
        what = f"of sweep {args.sweep} " if args.sweep else ""
        which = " that match" if filters else ""
        print(f"no runs {what}in {store.url}{which}", file=sys.stderr)
        return Exit.OK
    for line in table(chosen):
        print(line)
    for record in chosen:
        if record.problem:
            print(f"sexpgpu: warning: {record.slug}: {record.problem}", file=sys.stderr)
    return Exit.OK


# -- the table --------------------------------------------------------------------------------


def number(value: Optional[float]) -> str:
    if value is None:
        return "nan"
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def duration(seconds: Optional[float]) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def started(stamp: Optional[str]) -> str:
    """A UTC stamp in this machine's time, to the second."""
    if not stamp:
        return "-"
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return stamp
    return when.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def steps(record: RunRecord) -> str:
    if record.step is None:
        return "-"
    return f"{record.step}/{record.steps}" if record.steps is not None else str(record.step)


def varying_knobs(records: list[RunRecord]) -> list[str]:
    """The knobs whose values differ between RECORDS (a knob a run lacks differs too), in
    the order the runs declare them: what tells the rows apart."""
    names = list(dict.fromkeys(k for r in records for k in r.knobs))
    missing = object()
    return [k for k in names if len({repr(r.knobs.get(k, missing)) for r in records}) > 1]


def knob_value(value: Any) -> str:
    if isinstance(value, float):
        return number(value)
    if isinstance(value, bool) or value is None:
        return "t" if value is True else "nil"
    return str(value)


def table(records: list[RunRecord]) -> list[str]:
    """A column for each field, each knob whose value differs between the runs, each
    training metric and each eval metric any record has; numbers right-aligned."""
    train = list(dict.fromkeys(k for r in records for k in r.metrics))
    evals = list(dict.fromkeys(k for r in records for k in r.eval))
    columns: list[tuple[str, bool]] = [("slug", False), ("file", False), ("selection", False)]
    fixed = {"slug", "file", "selection", "state", "steps", "started", "duration", "device", *train, *evals}
    knobs = {(f"knobs.{k}" if k in fixed else k): k for k in varying_knobs(records)}  # a knob named like a column: knobs.NAME
    columns += [(header, all(isinstance(r.knobs.get(k), (int, float)) for r in records)) for header, k in knobs.items()]
    columns += [("state", False), ("steps", True)]
    columns += [(k, True) for k in train] + [(k, True) for k in evals]
    columns += [("started", False), ("duration", True), ("device", False)]
    rows = [[knob_value(r.knobs[knobs[name]]) if name in knobs and knobs[name] in r.knobs else "-" if name in knobs
             else cell(r, name, name in train, name in evals) for name, _ in columns] for r in records]
    widths = [max(len(name), *(len(row[i]) for row in rows)) for i, (name, _) in enumerate(columns)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if right else c.ljust(w) for c, w, (_, right) in zip(cells, widths, columns)).rstrip()

    return [line([name for name, _ in columns])] + [line(row) for row in rows]


def cell(record: RunRecord, name: str, is_train: bool, is_eval: bool) -> str:
    if is_train or is_eval:
        values: dict[str, Any] = record.metrics if is_train else record.eval
        return number(values[name]) if name in values else "-"
    if name == "selection":
        return record.selection
    if name == "state":
        return record.state or "-"
    if name == "steps":
        return steps(record)
    if name == "started":
        return started(record.started)
    if name == "duration":
        return duration(record.duration_s)
    value = getattr(record, name)
    return "-" if value is None else str(value)
