"""`sexpgpu plot RUN... [--sweep NAME] [--metric M] -o FILE.png|.svg` or `--terminal`: the
curves of several runs, or of a sweep's points, overlaid (sexpgpu/results/plots.py; the
`plot` extra)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..outcome import Exit
from ..results import listing, locate, plots
from ..results.curves import Curves
from ..results.readers import RunReaders
from ..results.listing import RunRecord
from ..runtime.store import NotARegularFile, Store, UnexpectedSize, is_store_failure, store_problem
from .common import color_enabled, fail_usage


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("plot")
    p.add_argument("runs", nargs="*", metavar="RUN", help="a run folder: a local path, a URL, or a slug in --store")
    p.add_argument("--sweep", default=None, metavar="NAME", help="every point of the sweep NAME in the store")
    p.add_argument("--store", default=None, metavar="URL", help="where slugs and --sweep are looked up (default $SEXPGPU_STORE or ./runs)")
    p.add_argument("--metric", dest="metrics", action="append", default=[], metavar="M",
                   help="a series: loss (the default), acc, val/loss (EVAL/METRIC), lr:GROUP, grad_norm...; repeatable, one panel each")
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="write FILE.png or FILE.svg")
    p.add_argument("--terminal", action="store_true", help="draw in the terminal instead")
    p.add_argument("--log-y", action="store_true", help="a log scale for the values (where they are all positive)")
    p.add_argument("--title", default=None, help="a title above the figure")
    p.set_defaults(run=run_plot)


def run_plot(args: argparse.Namespace) -> int:
    if not args.runs and args.sweep is None:
        fail_usage("name the runs to plot (RUN...), or --sweep NAME")
    if (args.output is None) == (not args.terminal):
        fail_usage("choose one: -o FILE.png|FILE.svg, or --terminal")
    path = Path(args.output) if args.output else None
    if path is not None:
        if path.suffix.lstrip(".").lower() not in plots.IMAGE_FORMATS:
            fail_usage(f"-o {args.output}: the file name says the format: .png or .svg")
        if not path.parent.is_dir():
            fail_usage(f"-o {args.output}: the folder {path.parent} does not exist")
    metrics = args.metrics or ["loss"]
    try:
        runs = chosen_runs(args)
        curves = read_curves(runs)
    except locate.CannotOpen as exc:
        print(f"sexpgpu: {exc}", file=sys.stderr)
        return Exit.CANNOT_START
    except (NotARegularFile, UnexpectedSize) as exc:  # one file of one run: it names itself
        print(f"sexpgpu: {exc}", file=sys.stderr)
        return Exit.CANNOT_START
    except Exception as exc:
        if not is_store_failure(exc):
            raise
        print(f"sexpgpu: {store_problem(args.store or locate.default_store(), exc)}", file=sys.stderr)
        return Exit.CANNOT_START
    for warning in (w for c in curves for w in c.warnings):
        print(f"sexpgpu: warning: {warning}", file=sys.stderr)
    for _, record in runs:
        if record.problem:
            print(f"sexpgpu: warning: {record.slug}: {record.problem}", file=sys.stderr)
    labels = plots.run_labels([record for _, record in runs])
    panels, notes = plots.panels_for(list(zip(labels, curves)), metrics)
    for panel in panels:
        if not panel.lines:
            have = sorted({name for c in curves for name in c.names()})
            fail_usage(f"--metric {panel.metric}: no run here logs it; the series are: {', '.join(have) or 'none (no step events yet)'}")
    for note in notes:
        print(f"sexpgpu: warning: {note}", file=sys.stderr)
    try:
        if path is not None:
            plots.write_image(panels, path, log_y=args.log_y, title=args.title)
            count = sum(len(p.lines) for p in panels)
            print(f"wrote {path} ({', '.join(p.metric for p in panels)}: {count} series)")
        else:
            size = shutil.get_terminal_size((100, 24))
            print(plots.terminal_text(panels, width=max(40, size.columns), height=max(12, min(24, size.lines - 2)), color=color_enabled(sys.stdout), log_y=args.log_y))
    except plots.MissingExtra as exc:
        print(f"sexpgpu: {exc}", file=sys.stderr)
        return Exit.CANNOT_START
    return Exit.OK


def chosen_runs(args: argparse.Namespace) -> list[tuple[Store, RunRecord]]:
    """Each RUN (a usage error when one is not a run), then the sweep's points by point."""
    stores: dict[str, Store] = {}

    def store_at(url: str) -> Store:
        if url not in stores:
            stores[url] = locate.open_store(url)
        return stores[url]

    runs: list[tuple[Store, RunRecord]] = []
    for target in args.runs:
        try:
            url, slug = locate.split_run(target, args.store)
        except ValueError as exc:
            fail_usage(str(exc))
        store = store_at(url)
        record = listing.read_record(store, slug)
        if record is None:
            fail_usage(f"no run at {store.url_of(slug)} (no run.json, no status.json)")
        runs.append((store, record))
    if args.sweep is not None:
        url = args.store or locate.default_store()
        if "://" not in url and not os.path.isdir(url):
            fail_usage(f"--sweep {args.sweep}: no store at {url} (name it with --store)")
        store = store_at(url)
        points = listing.sort_records(listing.RecordCache(store, remember=False).records(sweep=args.sweep), "point")
        if not points:
            fail_usage(f"--sweep {args.sweep}: no point of it in {store.url}")
        seen = {(s.url, r.slug) for s, r in runs}
        runs.extend((store, r) for r in points if (store.url, r.slug) not in seen)
    return runs


def read_curves(runs: list[tuple[Store, RunRecord]]) -> list[Curves]:
    readers = {store.url: RunReaders(store) for store, _ in runs}
    with ThreadPoolExecutor(max_workers=max(1, min(listing.READERS, len(runs)))) as pool:
        return list(pool.map(lambda pair: readers[pair[0].url].curves(pair[1].slug, plots.BUCKETS), runs))
