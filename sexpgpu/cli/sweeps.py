"""`variants FILE`, `sweep FILE --sweep S` (local, in order) and `new OUT`."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from collections import Counter
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from ..compile.pipeline import compile_file, compile_points, system_image
from ..sweeps.search import halving_problem
from ..compile.selection import Declared, SweepDecl, located, prescan
from ..ir.experiment import Experiment, Selection
from ..sweeps.jobs import PointJob, SideBySide, plan_jobs
from ..lisp.conditions import LispError, lisp_error
from ..lisp.program import diagnostic_from, has_errors
from ..sweeps.ledger import PointRecord, SweepLedger, cell, concurrently, record_attempt, sweep_prefix, take_status
from ..outcome import AttemptOutcome, Exit
from ..records import dump
from ..runtime.data.fingerprint import fingerprinted
from ..sweeps.halving import Contender, Leg, search
from ..sweeps.schedulers import SchedulerJob, SyncHalving, scheduler_for
from ..runtime.runfolder import RunFolder, run_slug
from ..runtime.status import Status
from ..runtime.store import Store, is_store_failure
from ..session import Compiled, Session, Settings, Stopped
from .common import Console, existing_file, exit_for, fail_usage, print_diagnostics, print_json
from .flags import (add_data_root_flag, add_knob_flags, add_limit_flags, add_rank_flags, add_threads_flag, data_roots_from, devices_from, knobs_from,
                    limits_from, positive_int, store_patience, threads_from)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    v = sub.add_parser("variants")
    v.add_argument("file")
    v.add_argument("--json", action="store_true")
    add_limit_flags(v)
    add_data_root_flag(v)
    v.set_defaults(run=run_variants)

    s = sub.add_parser("sweep")
    s.add_argument("file")
    s.add_argument("--sweep", required=True, metavar="S")
    s.add_argument("--store", default=None)
    s.add_argument("--max-steps", type=int, default=None, metavar="N")
    s.add_argument("--json", action="store_true")
    s.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS", help="fan the points out over a Ray cluster (no ADDRESS: a local Ray started for the sweep)")
    s.add_argument("--max-preemptions", type=int, default=None, metavar="N", help="give up on a point preempted more than N times (default: never)")
    s.add_argument("--retry-failed", action="store_true", help="run again the points that failed before (they are skipped otherwise)")
    s.add_argument("--jobs", type=positive_int, default=None, metavar="N",
                   help="points trained at once on this machine, each in a process of its own (default: as many as the free cores and the memory allow)")
    add_knob_flags(s)
    add_rank_flags(s)
    add_limit_flags(s)
    add_data_root_flag(s)
    add_threads_flag(s)
    s.set_defaults(run=run_sweep)

    n = sub.add_parser("new")
    n.add_argument("out")
    source = n.add_mutually_exclusive_group()
    source.add_argument("--from", dest="from_file", metavar="FILE")
    source.add_argument("--example", metavar="NAME", help="an example in examples/ (default quickstart)")
    n.add_argument("--set", dest="set_values", action="append", default=[], metavar="KNOB=VALUE")
    n.add_argument("--force", action="store_true", help="overwrite OUT")
    n.add_argument("--json", action="store_true")
    n.set_defaults(run=run_new)


# -- variants ---------------------------------------------------------------------------------
def declared_or_exit(path: Path) -> Declared:
    try:
        return prescan(path)
    except LispError as exc:
        print_diagnostics([diagnostic_from(exc)], _sources(path))
        raise SystemExit(Exit.CHECK_FAILED) from None


def slug_with_data(experiment: Experiment, args: argparse.Namespace) -> str:
    """The slug `run` gives EXPERIMENT: its loaders' data fingerprinted as the session does."""
    return run_slug(fingerprinted(experiment, data_roots_from(args)))


def run_variants(args: argparse.Namespace) -> int:
    path = existing_file(args.file)
    base = compile_file(path, Selection(), limits_from(args), output=sys.stderr.write)
    if has_errors(base.diagnostics) or base.compiler is None:
        print_diagnostics(base.diagnostics, base.program.sources if base.program else _sources())
        return exit_for(base.diagnostics)
    declared = declared_or_exit(path)
    image = system_image() if declared.variants or declared.sweeps else None  # read once for the compiles below
    doc: dict[str, Any] = {
        "knobs": [dump(k, mode="python") for k in base.compiler.knobs.values()],
        "variants": {name: v.settings for name, v in declared.variants.items()},
        "sweeps": {},
    }
    if base.experiment is not None:
        doc["base"] = slug_with_data(base.experiment, args)
    for variant in declared.variants:
        result = compile_file(path, Selection(variant=variant), limits_from(args), output=sys.stderr.write, image=image)
        if result.experiment is not None:
            doc.setdefault("variant_slugs", {})[variant] = slug_with_data(result.experiment, args)
    for name, sweep in declared.sweeps.items():
        points = []
        values_of = sweep.points()
        results = compile_points(path, [Selection(sweep=name, point=i) for i in range(len(values_of))], limits_from(args), output=sys.stderr.write,
                                 image=image)
        for i, (values, result) in enumerate(zip(values_of, results)):
            if has_errors(result.diagnostics):
                print_diagnostics(result.diagnostics, result.program.sources if result.program else _sources())
                return exit_for(result.diagnostics)
            points.append({"point": i, "knobs": values, "slug": slug_with_data(result.experiment, args) if result.experiment else None})
        doc["sweeps"][name] = {"zip": sweep.zip, "variant": sweep.variant, "points": points}
    if args.json:
        print_json(doc)
        return Exit.OK
    print("knobs")
    for k in doc["knobs"]:
        note = f"  ; {k['doc']}" if k.get("doc") else ""
        print(f"  {k['name']} = {_show(k['default'])}{note}")
    if doc.get("base"):
        print(f"\nbase: {doc['base']}")
    if doc["variants"]:
        print("\nvariants")
        for name, settings in doc["variants"].items():
            slug = doc.get("variant_slugs", {}).get(name, "")
            print(f"  {name}: {' '.join(f':{k} {_show(v)}' for k, v in settings.items())}  {slug}")
    for name, sweep in doc["sweeps"].items():
        print(f"\nsweep {name}" + (" (zip)" if sweep["zip"] else "") + (f" on variant {sweep['variant']}" if sweep["variant"] else ""))
        for p in sweep["points"]:
            print(f"  {p['point']:>3}  {' '.join(f'{k}={_show(v)}' for k, v in p['knobs'].items()):<40} {p['slug']}")
    return Exit.OK


def _show(value: Any) -> str:
    if isinstance(value, str) and not value.startswith(":"):
        return f'"{value}"'
    if value is True:
        return "t"
    if value is None:
        return "nil"
    return str(value)


def _sources(path: Optional[Path] = None) -> Any:
    """The source lines a diagnostic shows (PATH's, for a problem the pre-read found)."""
    from ..lisp.diagnostics import SourceMap

    sources = SourceMap()
    if path is not None:
        sources.add(str(path), path.read_text(encoding="utf-8", errors="replace"))
    return sources


# -- sweep ---------------------------------------------------------------------------------------------
def run_sweep(args: argparse.Namespace) -> int:
    path = existing_file(args.file)
    declared = declared_or_exit(path)
    sweep = declared.sweeps.get(args.sweep)
    if sweep is None:
        fail_usage(f"--sweep {args.sweep}: the file declares no such sweep (sweeps: {', '.join(declared.sweeps) or 'none'})")
    base = knobs_from(args)
    swept = sorted(set(base.set) & {k for point in sweep.points() for k in point})
    if swept:
        fail_usage(f"--set {swept[0]}: the sweep {args.sweep} sets {swept[0]} at each of its points; --set another knob, or run one point with run --sweep --point")
    over_ray = args.ray is not None
    if over_ray and args.jobs is not None:
        fail_usage("--jobs runs points side by side on this machine; over Ray every point has a worker of its own: drop --jobs or --ray")
    if not over_ray and args.devices != 1:
        fail_usage(f"--devices {args.devices} needs --ray: data-parallel ranks run as Ray actors (a local Ray when --ray has no address)")
    store_url = args.store or os.environ.get("SEXPGPU_STORE") or "./runs"
    settings = Settings(store=store_url, device=args.device, max_steps=args.max_steps, limits=limits_from(args),
                        world=args.devices if over_ray else 1, store_patience_s=store_patience(), data_roots=data_roots_from(args),
                        threads=threads_from(args))
    session = Session(settings, Console(progress_to_stderr=True))
    if over_ray and sweep.halving is None:  # each point starts as soon as it is compiled
        return ray_sweep(args, path, sweep, store_url, None, session, base)
    with session.listening():
        try:
            points, refusal = session.compile_sweep(path, args.sweep, len(sweep.points()), base)  # a bad point fails before any training
        except Stopped as stop:
            print(f"sexpgpu: {stop.outcome.reason}", file=sys.stderr)
            return int(stop.outcome.exit_code)
        if refusal is not None:
            print(f"sweep {args.sweep}: point {len(points)} does not check; nothing was run", file=sys.stderr)
            return int(refusal.exit_code)
        wrong = next((p for p in (halving_problem(sweep.halving, c.experiment) for c in points) if p), None) if sweep.halving else None
        if wrong is not None:
            print_diagnostics([diagnostic_from(located(lisp_error("C008", f"defsweep {sweep.name} {wrong}", "PROGRAM-ERROR"), sweep.loc))], _sources(path))
            return Exit.CHECK_FAILED
        if not over_ray:
            return local_sweep(args, sweep, session, points)
    return ray_sweep(args, path, sweep, store_url, points, session, base)  # Ctrl-C there is the driver's own


def local_sweep(args: argparse.Namespace, sweep: SweepDecl, session: Session, points: list[Compiled]) -> int:
    """The points on this machine, through the one session: one at a time in this process, or
    --jobs of them side by side, each in a child process (sexpgpu/sweeps/jobs.py); a halving sweep
    stage by stage. Each point's lines are printed in point order, the whole table at the end."""
    store = Store.open(session.settings.store)
    records = [PointRecord(point=i, slug=run_slug(c.experiment), knobs=values, planned=planned(c, args.max_steps))
               for i, (c, values) in enumerate(zip(points, sweep.points(), strict=True))]
    table = SweepTable(records)
    plan = plan_jobs([c.experiment for c in points], session.settings.device, args.jobs)
    stopped = False
    prefix = sweep_prefix(points[0].path if points else Path(args.file), args.sweep)
    scheduler = scheduler_for(sweep.halving, store, prefix, {r.point: r.slug for r in records}) if sweep.halving is not None else None
    asking = None if isinstance(scheduler, SyncHalving) else scheduler  # an asynchronous one is asked at each rung as a point trains

    def header(record: PointRecord) -> str:
        knobs = " ".join(f"{k}={_show(v)}" for k, v in record.knobs.items())
        return f"point {record.point} ({record.point + 1} of {len(points)}): {knobs}"

    def skipped(record: PointRecord) -> Optional[list[str]]:
        """The lines of a point that failed before and is not run again (None: it runs)."""
        failed = session.failed_before(points[record.point])
        if failed is None or args.retry_failed:
            return None
        record.state = record_attempt(record, failed, None)
        return [f"point {record.point} failed before ({failed.reason}); not run again: --retry-failed runs it again", record.line()]

    def settle(record: PointRecord, outcome: AttemptOutcome) -> str:
        """Count OUTCOME into RECORD: "" (go on), "stopped" or "cannot start"."""
        if outcome.exit_code == Exit.CANNOT_START and running_elsewhere(store, record):
            return ""
        record.attempts += 1
        after = record_attempt(record, outcome, None)
        record.state = "stopped" if outcome.exit_code == Exit.STOPPED else after
        if after == "finished" and asking is not None and asking.stopped(record.point) is not None:  # its scheduler stopped it at a rung
            record.state, record.planned = "pruned", record.steps
        if outcome.exit_code == Exit.STOPPED:
            return "stopped"
        return "cannot start" if outcome.exit_code == Exit.CANNOT_START else ""  # the store or the device: every later point would fail alike

    def train_legs(legs: list[Leg]) -> bool:
        nonlocal stopped
        for leg in legs:
            record = records[leg.contender.point]
            record.planned = leg.steps
            print(header(record), file=sys.stderr)
            lines = skipped(record)
            if lines is not None:
                print("\n".join(lines), file=sys.stderr)
                continue
            early = asking.early_stop(record.point) if asking is not None else None
            ended = settle(record, session.train(points[record.point], max_steps=leg.limit(args.max_steps), max_steps_by=leg.by, early_stop=early))
            print(record.line(), file=sys.stderr)
            if ended == "stopped":
                print(f"sweep {args.sweep}: stopped at point {record.point}; run the same command again to continue", file=sys.stderr)
            elif ended:
                print(f"sweep {args.sweep}: stopped at point {record.point}: nothing more can start here", file=sys.stderr)
            if ended:
                stopped = True
                return False
        return True

    def train_side_by_side(legs: list[Leg]) -> bool:
        nonlocal stopped
        by_point = {leg.contender.point: leg for leg in legs}
        cannot: list[int] = []
        selection = knobs_from(args)

        def begin(i: int) -> tuple[list[str], Optional[PointJob]]:
            record, leg = records[i], by_point[i]
            record.planned = leg.steps
            lines = skipped(record)
            if lines is not None:
                return [header(record), *lines], None
            given = session.settings
            job = PointJob(file=str(points[i].path), selection=replace(selection, sweep=args.sweep, point=i), store=given.store,
                           device=given.device, max_steps=leg.limit(args.max_steps), max_steps_by=leg.by or given.max_steps_by, limits=given.limits,
                           data_roots=list(given.data_roots), threads=given.threads, thread_share=plan.share,
                           store_patience_s=given.store_patience_s, outcome="",
                           scheduler=SchedulerJob(halving=asking.halving, prefix=prefix, point=i, slug=record.slug) if asking is not None else None)
            return [header(record)], job

        def end(i: int, outcome: AttemptOutcome) -> tuple[list[str], bool]:
            record = records[i]
            if outcome.slug is not None and outcome.slug != record.slug:  # the child compiled another run than the sweep did
                raise RuntimeError(f"point {i}: the child process ran {outcome.slug}, the sweep compiled {record.slug}")
            ended = settle(record, outcome)
            if ended == "cannot start":
                cannot.append(i)
            return [record.line()], ended != "cannot start"

        pool = SideBySide(plan.jobs, session.stops, sys.stderr)
        pool.run(sorted(by_point), begin, end)
        halted = [r.point for r in records if r.point in by_point and r.state == "stopped"]
        if halted:
            print(f"sweep {args.sweep}: stopped at point {' '.join(map(str, halted))}; run the same command again to continue", file=sys.stderr)
        if cannot:
            print(f"sweep {args.sweep}: stopped at point {cannot[0]}: nothing more can start here", file=sys.stderr)
        if halted or cannot or pool.stopped:
            stopped = True
            return False
        return True

    run_legs = train_side_by_side if plan.jobs > 1 else train_legs
    contenders = [Contender(point=r.point, slug=r.slug, steps=c.experiment.run.steps) for r, c in zip(records, points, strict=True)]
    if sweep.halving is None or scheduler is None:
        run_legs([Leg(c, planned(points[c.point], args.max_steps), None) for c in contenders])
        pruned: dict[int, str] = {}
    elif isinstance(scheduler, SyncHalving):
        pruned = search(sweep.halving, contenders, store, run_legs, cap=args.max_steps, say=lambda text: print(text, file=sys.stderr), decided=scheduler.record)
    else:
        run_legs(scheduler.legs(contenders, store, args.max_steps))
        pruned = scheduler.pruned()
    for record in records:
        if record.attempts == 0 and record.state == "pending" and not stopped:
            take_status_of(store, record)  # nothing left to train: what the run folder says
        if record.point in pruned:
            record.state, record.reason, record.planned = "pruned", pruned[record.point], record.steps
    ledger = SweepLedger(file=points[0].path.name if points else "", sweep=args.sweep, points=records)
    if args.json:
        print_json(ledger.model_dump(mode="json"))
    else:
        table.print_final(sys.stdout)
    code = max((int(r.exit_code or 0) for r in records if r.state in ("failed", "stopped")), default=0)
    if any(r.elsewhere is not None for r in records):  # not done yet: the same command again takes it up
        print(f"sweep {args.sweep}: point {', '.join(str(r.point) for r in records if r.elsewhere is not None)} "
              "is running elsewhere; run the same command again once it ends", file=sys.stderr)
        code = max(code, int(Exit.STOPPED))
    return code


def running_elsewhere(store: Store, record: PointRecord) -> bool:
    """Whether another attempt (another sweep, a `run` of the same slug) writes the point's
    run folder now; if so RECORD says so, where the run stands, and who writes it."""
    try:
        writer = RunFolder(store, record.slug).writer()
        status = RunFolder(store, record.slug).read_status() if writer is not None else None
    except Exception as exc:  # a store that cannot be read: the attempt's own refusal says so
        if not is_store_failure(exc):
            raise
        return False
    if writer is None:
        return False
    if status is not None:
        take_status(record, status)
    record.state, record.elsewhere = "running", writer
    return True


def planned(compiled: Compiled, max_steps: Optional[int]) -> int:
    steps = compiled.experiment.run.steps
    return steps if max_steps is None else min(steps, max_steps)


def take_status_of(store: Store, record: PointRecord) -> None:
    status = RunFolder(store, record.slug).read_status()
    if status is None:
        return
    take_status(record, status)
    if status.state in ("finished", "truncated", "pruned", "failed"):
        record.state = status.state


class SweepTable:
    """One table for every sweep, on this machine or over Ray, live and final: each point's
    knobs, the steps it stands at, the last training batch's loss and metrics, its latest
    eval metrics (EVAL/METRIC), its state, and what ended it."""

    def __init__(self, points: list[PointRecord]) -> None:
        self.points = points
        self.train = sorted({m for p in points for m in p.metrics})
        self.evals = sorted({f"{e}/{m}" for p in points for e, seen in p.evals.items() for m in seen.metrics})
        self.knob_width = max([len(self.knobs(p)) for p in points] + [5])

    @staticmethod
    def knobs(p: PointRecord) -> str:
        return " ".join(f"{k}={_show(v)}" for k, v in p.knobs.items())

    def widen(self, points: list[PointRecord]) -> None:
        """Columns for metrics that appeared since (a point that ended, a live status)."""
        self.train = sorted(set(self.train) | {m for p in points for m in p.metrics})
        self.evals = sorted(set(self.evals) | {f"{e}/{m}" for p in points for e, seen in p.evals.items() for m in seen.metrics})

    def header(self) -> str:
        metrics = "".join(f" {n:>10}" for n in [*self.train, *self.evals])
        return f"{'point':>5}  {'knobs':<{self.knob_width}}  {'steps':>11} {'loss':>10}{metrics}  {'state':<10} ended by"

    def row(self, p: PointRecord) -> str:
        steps = p.progress()
        value = p.final_loss
        values = [p.metrics.get(n) for n in self.train]
        values += [p.evals[e].metrics.get(m) if e in p.evals else None for e, _, m in (n.partition("/") for n in self.evals)]
        metrics = "".join(f" {cell(v):>10}" for v in values)
        return f"{p.point:>5}  {self.knobs(p):<{self.knob_width}}  {steps:>11} {cell(value):>10}{metrics}  {p.state:<10} {p.ended_by()}".rstrip()

    def lines(self, points: list[PointRecord]) -> list[str]:
        self.widen(points)
        return [self.header(), *(self.row(p) for p in points)]

    def print_final(self, stream: Any, points: Optional[list[PointRecord]] = None) -> None:
        for line in self.lines(points if points is not None else self.points):
            print(line, file=stream)


ACTIVE = ("running", "leased", "preempted")  # the live table's rows: points that run, are about to, or run again
STATUS_EVERY_S = 5.0  # how often the live table reads its rows' status.json
DRAW_EVERY_S = 1.0  # the longest the live table goes between redraws while nothing changed it


class LiveTable:
    """The driver's live table on a terminal, redrawn in place (log lines, such as each
    point's line as it ends, are printed above it).

    A sweep whose every point fits on the terminal shows SweepTable's rows, a running point
    as its status says it stands. A larger one shows a summary (how many points are in each
    state, the best loss of those that ended) and the rows of the points that run now, as
    many as fit: what a user watching 10,000 points wants is the count and the points moving,
    not 10,000 rows scrolled by at every round. A redraw costs what changed (the driver
    passes the points that changed and those active) and the rows on screen, not the sweep's
    size; their status is read at most every STATUS_EVERY_S, concurrently."""

    def __init__(self, stream: Any, store: Store, enabled: bool, height: Optional[int] = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream, self.store, self.enabled = stream, store, enabled
        self.height, self.clock = height, clock
        self.drawn = 0
        self.state_of: dict[int, str] = {}  # point -> its state as last counted
        self.counts: Counter[str] = Counter()
        self.loss_of: dict[int, float] = {}  # ended points -> their final loss
        self.best: Optional[tuple[float, int]] = None  # (loss, point): None when it must be found again
        self.statuses: dict[str, Status] = {}  # slug -> the latest status read for a row
        self.read_at = -STATUS_EVERY_S
        self.drawn_at = -DRAW_EVERY_S

    def clear(self) -> None:
        if self.drawn:
            self.stream.write(f"\x1b[{self.drawn}F\x1b[J")
            self.drawn = 0

    def say(self, text: str) -> None:
        self.clear()
        print(text, file=self.stream)
        self.drawn_at = -DRAW_EVERY_S  # redrawn at the next round

    def rows(self) -> int:
        """The lines the table may take: the terminal's, less a few for the lines above it."""
        if self.height is not None:
            return self.height
        try:
            lines = os.get_terminal_size(self.stream.fileno()).lines
        except (AttributeError, OSError, ValueError):  # not a real terminal's stream
            lines = 24
        return max(lines - 4, 6)

    def count(self, records: Iterable[PointRecord]) -> None:
        """The states and losses of RECORDS (points that changed) into the summary's counts."""
        for p in records:
            before = self.state_of.get(p.point)
            if before is not None:
                self.counts[before] -= 1
            self.state_of[p.point] = p.state
            self.counts[p.state] += 1
            loss = p.final_loss if p.state in ("finished", "truncated") and isinstance(p.final_loss, (int, float)) else None
            if loss is None:
                if self.loss_of.pop(p.point, None) is not None and self.best is not None and self.best[1] == p.point:
                    self.best = None
            else:
                self.loss_of[p.point] = loss
                if self.best is not None and (self.best[1] == p.point and loss > self.best[0]):
                    self.best = None
                elif self.best is not None and (loss, p.point) < self.best:
                    self.best = (loss, p.point)
        if self.best is None and self.loss_of:
            self.best = min((loss, point) for point, loss in self.loss_of.items())

    def __call__(self, ledger: Any, final: bool, changed: Optional[Iterable[PointRecord]] = None,
                 active: Optional[Iterable[PointRecord]] = None) -> None:
        """Draw LEDGER: CHANGED, the points whose record changed since the last call, and
        ACTIVE, those running or leased now (None: every point of the ledger, looked at)."""
        if not self.enabled:
            return
        points: list[PointRecord] = ledger.points
        moved = None if changed is None else list(changed)
        self.count(points if moved is None else moved)
        if final:
            self.clear()
            return
        shown = [p for p in points if p.state in ACTIVE] if active is None else sorted(active, key=lambda p: p.point)
        room = self.rows()
        whole = len(points) <= room - 1  # a header and every point
        if not whole:
            shown = shown[:room - 3]  # the summary, the header, the line of those left out
        dirty = moved is None or bool(moved)
        now = self.clock()
        reading = now - self.read_at >= STATUS_EVERY_S
        if not (dirty or reading or now - self.drawn_at >= DRAW_EVERY_S) and self.drawn:
            return
        if reading:
            self.read_statuses([p for p in (points if whole else shown) if p.state in ACTIVE])
            self.read_at = now
        rows = [self.standing(p) for p in (points if whole else shown)]
        lines = SweepTable(rows).lines(rows)
        if not whole:
            left = sum(self.counts[s] for s in ACTIVE) - len(shown)
            lines = [self.summary(len(points)), *lines, *([f"  ... and {left} more running or about to"] if left > 0 else [])]
        self.clear()
        self.stream.write("\n".join(lines) + "\n")
        self.stream.flush()
        self.drawn, self.drawn_at = len(lines), now

    def read_statuses(self, records: list[PointRecord]) -> None:
        """The status of RECORDS (the rows drawn), concurrently; the rows no longer drawn forgotten."""
        read = concurrently(lambda p: RunFolder(self.store, p.slug).read_status(), records)
        self.statuses = {p.slug: status for p, status in zip(records, read, strict=True) if status is not None}

    def standing(self, p: PointRecord) -> PointRecord:
        """P as a row: a running point where its status says it stands."""
        status = self.statuses.get(p.slug) if p.state in ACTIVE else None
        if status is None:
            return p
        shown = p.model_copy(deep=True)
        take_status(shown, status)
        return shown

    def summary(self, total: int) -> str:
        """`10000 points: 3412 finished, 100 running, 6488 pending  best loss 0.4123 (point 812)`."""
        order = ("finished", "truncated", "pruned", "failed", "running", "leased", "preempted", "stopped", "pending")
        counted = ", ".join(f"{self.counts[s]} {s}" for s in order if self.counts[s] > 0)
        best = f"  best loss {cell(self.best[0])} (point {self.best[1]})" if self.best is not None else ""
        return f"{total} points: {counted}{best}"


def ray_sweep(args: argparse.Namespace, path: Path, sweep: SweepDecl, store_url: str, compiled: Optional[list[Compiled]], session: Session,
              base: Selection) -> int:
    """The same sweep, fanned out over Ray by orchestration.driver (the cluster extra): the
    COMPILED points, or (None) each point as soon as SESSION has compiled it; the first that
    does not check ends them (its diagnostics are printed; the driver starts no later point)."""
    try:
        from orchestration.driver import Driver, SweepError, streamed_points, sweep_points
    except ImportError as exc:
        print(f"sexpgpu: --ray needs the cluster extra (pip install -e '.[cluster]'): {exc}", file=sys.stderr)
        return Exit.CANNOT_START

    points = streamed_points(session, path, sweep.name, sweep.points(), base) if compiled is None else sweep_points(compiled, sweep.points())
    address = args.ray or os.environ.get("SEXPGPU_RAY_ADDRESS") or None
    live = LiveTable(sys.stderr, Store.open(store_url), enabled=sys.stderr.isatty() and not args.json)
    driver = Driver(path, args.sweep, store_url, address, args.max_preemptions, args.max_steps, say=live.say, devices=devices_from(args), table=live,
                    data_roots=data_roots_from(args), retry_failed=args.retry_failed)
    try:
        ledger = driver.run(points, sweep.halving)
    except SweepError as exc:
        print(f"sexpgpu: {exc.reason}", file=sys.stderr)
        return int(exc.code)
    if args.json:
        print_json(ledger.model_dump(mode="json"))
    else:
        SweepTable(ledger.points).print_final(sys.stdout)
    return max((p.exit_code or 0 for p in ledger.points if p.state == "failed"), default=0)


# -- new ---------------------------------------------------------------------------------------------------
KNOB_LINE = re.compile(r"^(\s*\(defknob\s+)(\S+)(\s+)(\"(?:[^\"\\]|\\.)*\"|[^\s()]+)", re.M)


def run_new(args: argparse.Namespace) -> int:
    if args.from_file:
        source = existing_file(args.from_file)
        origin = f"--from {args.from_file}"
    else:
        name = args.example or "quickstart"
        source = EXAMPLES / f"{name}.lisp"
        if not source.is_file():
            known = ", ".join(sorted(p.stem for p in EXAMPLES.glob("*.lisp")))
            fail_usage(f"--example {name}: no such example (examples: {known})")
        origin = f"--example {name}"
    out = Path(args.out)
    if out.exists() and not args.force:
        fail_usage(f"{args.out} exists; pass --force to overwrite it")
    text = source.read_text(encoding="utf-8")
    changes = {}
    for item in args.set_values:
        knob, sep, value = item.partition("=")
        if not sep:
            fail_usage(f"--set {item}: write --set KNOB=VALUE")
        changes[knob.strip().lower()] = value.strip()
    found: set[str] = set()

    def replace(match: "re.Match[str]") -> str:
        knob = match.group(2).lower()
        if knob in changes:
            found.add(knob)
            return f"{match.group(1)}{match.group(2)}{match.group(3)}{changes[knob]}"
        return match.group(0)

    text = KNOB_LINE.sub(replace, text)
    missing = sorted(set(changes) - found)
    if missing:
        fail_usage(f"--set {missing[0]}: {source.name} declares no knob {missing[0]}")
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    sets = " ".join(f"--set {k}={v}" for k, v in changes.items())
    header = f";;;; {out.name}: made by `sexpgpu new {origin}{(' ' + sets) if sets else ''}` on {stamp}\n;;;; lineage: {source.name}\n"
    out.write_text(header + text, encoding="utf-8")
    copied = copy_local_data(source, out)
    result = compile_file(out, Selection())
    print_diagnostics(result.diagnostics, result.program.sources if result.program else _sources())
    if args.json:
        print_json({"file": str(out), "from": str(source), "knobs": changes, "data": copied, "ok": not has_errors(result.diagnostics)})
    else:
        print(f"wrote {out} from {source.name}" + (f" with {sets}" if sets else ""))
        for name in copied:
            print(f"copied {name} beside it (its loader reads it from there)")
    return exit_for(result.diagnostics)


def copy_local_data(source: Path, out: Path) -> list[str]:
    """The local files SOURCE's loaders read by relative path, copied to the same place
    beside OUT (which must find them there, inside its own project); returns their names.
    A file already there is kept."""
    experiment = compile_file(source, Selection()).experiment
    if experiment is None:
        return []
    copied = []
    for loader in experiment.loaders.values():
        url = loader.source.url
        if not url or "://" in url or Path(url).is_absolute() or url.startswith("~"):
            continue
        origin, target = Path(loader.base_dir) / url, out.resolve().parent / url
        if origin.is_file() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(origin, target)
            copied.append(url)
    return copied
