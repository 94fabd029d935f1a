"""`variants FILE`, `sweep FILE --sweep S` (local, in order) and `new OUT`."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..compile.pipeline import compile_file
from ..compile.selection import Declared, SweepDecl, prescan
from ..ir.experiment import Selection
from ..lisp.conditions import LispError
from ..lisp.program import diagnostic_from, has_errors
from ..outcome import AttemptOutcome, Exit
from ..runtime.runfolder import RunFolder, run_slug
from ..runtime.store import Store
from ..session import Compiled, Session, Settings, Stopped
from .common import Console, existing_file, exit_for, fail_usage, print_diagnostics, print_json
from .flags import (add_data_root_flag, add_knob_flags, add_limit_flags, add_rank_flags, add_threads_flag, data_roots_from, devices_from, knobs_from,
                    limits_from, store_patience, threads_from)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    v = sub.add_parser("variants", help="the declared selection: knobs, variants, sweeps and every point with its slug")
    v.add_argument("file")
    v.add_argument("--json", action="store_true")
    add_limit_flags(v)
    v.set_defaults(run=run_variants)

    s = sub.add_parser("sweep", help="run every point of a sweep: in order on this machine, or over a Ray cluster with --ray")
    s.add_argument("file")
    s.add_argument("--sweep", required=True, metavar="S")
    s.add_argument("--store", default=None)
    s.add_argument("--max-steps", type=int, default=None, metavar="N")
    s.add_argument("--json", action="store_true")
    s.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS", help="fan the points out over a Ray cluster (no ADDRESS: a local Ray started for the sweep)")
    s.add_argument("--max-preemptions", type=int, default=None, metavar="N", help="give up on a point preempted more than N times (default: never)")
    s.add_argument("--retry-failed", action="store_true", help="run again the points that failed before (they are skipped otherwise)")
    add_knob_flags(s)
    add_rank_flags(s)
    add_limit_flags(s)
    add_data_root_flag(s)
    add_threads_flag(s)
    s.set_defaults(run=run_sweep)

    n = sub.add_parser("new", help="start a run file from a template or another file, knob defaults changed")
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
        print_diagnostics([diagnostic_from(exc)], _sources())
        raise SystemExit(Exit.CHECK_FAILED) from None


def run_variants(args: argparse.Namespace) -> int:
    path = existing_file(args.file)
    base = compile_file(path, Selection(), limits_from(args), output=sys.stderr.write)
    if has_errors(base.diagnostics) or base.compiler is None:
        print_diagnostics(base.diagnostics, base.program.sources if base.program else _sources())
        return exit_for(base.diagnostics)
    declared = declared_or_exit(path)
    doc: dict[str, Any] = {
        "knobs": [k.model_dump() for k in base.compiler.knobs.values()],
        "variants": {name: v.settings for name, v in declared.variants.items()},
        "sweeps": {},
    }
    if base.experiment is not None:
        doc["base"] = run_slug(base.experiment)
    for variant in declared.variants:
        result = compile_file(path, Selection(variant=variant), limits_from(args), output=sys.stderr.write)
        if result.experiment is not None:
            doc.setdefault("variant_slugs", {})[variant] = run_slug(result.experiment)
    for name, sweep in declared.sweeps.items():
        points = []
        for i, values in enumerate(sweep.points()):
            result = compile_file(path, Selection(sweep=name, point=i), limits_from(args), output=sys.stderr.write)
            if has_errors(result.diagnostics):
                print_diagnostics(result.diagnostics, result.program.sources if result.program else _sources())
                return exit_for(result.diagnostics)
            points.append({"point": i, "knobs": values, "slug": run_slug(result.experiment) if result.experiment else None})
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


def _sources() -> Any:
    from ..lisp.diagnostics import SourceMap

    return SourceMap()


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
    if not over_ray and args.devices != 1:
        fail_usage(f"--devices {args.devices} needs --ray: data-parallel ranks run as Ray actors (a local Ray when --ray has no address)")
    store_url = args.store or os.environ.get("SEXPGPU_STORE") or "./runs"
    settings = Settings(store=store_url, device=args.device, max_steps=args.max_steps, limits=limits_from(args),
                        world=args.devices if over_ray else 1, store_patience_s=store_patience(), data_roots=data_roots_from(args),
                        threads=threads_from(args))
    session = Session(settings, Console(progress_to_stderr=True))
    with session.listening():
        try:
            points, refusal = session.compile_sweep(path, args.sweep, len(sweep.points()), base)  # a bad point fails before any training
        except Stopped as stop:
            print(f"sexpgpu: {stop.outcome.reason}", file=sys.stderr)
            return int(stop.outcome.exit_code)
        if refusal is not None:
            print(f"sweep {args.sweep}: point {len(points)} does not check; nothing was run", file=sys.stderr)
            return int(refusal.exit_code)
        if not over_ray:
            return local_sweep(args, sweep, session, points)
    return ray_sweep(args, path, sweep, store_url, points)  # Ctrl-C there is the driver's own


def local_sweep(args: argparse.Namespace, sweep: SweepDecl, session: Session, points: list[Compiled]) -> int:
    """The points in order, on this machine, through the one session."""
    rows: list[AttemptOutcome] = []
    for i, point in enumerate(points):
        knobs = " ".join(f"{k}={v}" for k, v in sweep.points()[i].items())
        print(f"point {i} ({i + 1} of {len(points)}): {knobs}", file=sys.stderr)
        failed = session.failed_before(point)
        if failed is not None and not args.retry_failed:
            print(f"point {i} failed before ({failed.reason}); not run again: --retry-failed runs it again", file=sys.stderr)
            rows.append(failed)
            continue
        outcome = session.train(point)
        rows.append(outcome)
        if outcome.exit_code == Exit.STOPPED:
            print(f"sweep {args.sweep}: stopped at point {i}; run the same command again to continue", file=sys.stderr)
            break
        if outcome.exit_code == Exit.CANNOT_START:  # the store or the device: every later point would fail alike
            print(f"sweep {args.sweep}: stopped at point {i}: nothing more can start here", file=sys.stderr)
            break
    if args.json:
        print_json({"sweep": args.sweep, "points": [{"point": i, **r.model_dump(mode="json")} for i, r in enumerate(rows)]})
    else:
        names = sorted({m for r in rows for m in r.metrics if m != "loss"})
        print(f"{'point':>5}  {'knobs':<32} {'loss':>10} " + " ".join(f"{n:>10}" for n in names) + "  state")
        for i, (r, values) in enumerate(zip(rows, sweep.points())):
            knobs = " ".join(f"{k}={v}" for k, v in values.items())
            loss = f"{r.final_loss:.4g}" if r.final_loss is not None else "-"
            metrics = " ".join(f"{r.metrics.get(n, float('nan')):>10.4g}" for n in names)
            state = "finished (skipped)" if r.reason == "already finished" else r.reason
            print(f"{i:>5}  {knobs:<32} {loss:>10} {metrics}  {state}")
    return max((int(r.exit_code) for r in rows), default=0)


class LiveTable:
    """The driver's live table on a terminal: one line per point (state, attempts, step,
    loss), redrawn in place every few seconds; log lines are printed above it."""

    def __init__(self, stream: Any, store: Store, enabled: bool) -> None:
        self.stream, self.store, self.enabled = stream, store, enabled
        self.drawn = 0

    def clear(self) -> None:
        if self.drawn:
            self.stream.write(f"\x1b[{self.drawn}F\x1b[J")
            self.drawn = 0

    def say(self, text: str) -> None:
        self.clear()
        print(text, file=self.stream)

    def __call__(self, ledger: Any, final: bool) -> None:
        if not self.enabled:
            return
        self.clear()
        if final:
            return
        lines = [f"{'point':>5}  {'state':<10} {'attempts':>8}  {'step':>13}  {'loss':>10}  knobs"]
        for p in ledger.points:
            step, loss = "-", p.final_loss
            if p.state in ("running", "leased"):
                status = RunFolder(self.store, p.slug).read_status()
                if status is not None:
                    step, loss = f"{status.step}/{status.steps}", status.metrics.get("loss", loss)
            knobs = " ".join(f"{k}={v}" for k, v in p.knobs.items())
            shown = f"{loss:.4g}" if isinstance(loss, (int, float)) else "-"
            lines.append(f"{p.point:>5}  {p.state:<10} {p.attempts:>8}  {step:>13}  {shown:>10}  {knobs}")
        self.stream.write("\n".join(lines) + "\n")
        self.stream.flush()
        self.drawn = len(lines)


def ray_sweep(args: argparse.Namespace, path: Path, sweep: SweepDecl, store_url: str, compiled: list[Compiled]) -> int:
    """The same sweep, fanned out over Ray by orchestration.driver (the cluster extra)."""
    try:
        from orchestration.driver import Driver, SweepError, sweep_points
    except ImportError as exc:
        print(f"sexpgpu: --ray needs the cluster extra (pip install -e '.[cluster]'): {exc}", file=sys.stderr)
        return Exit.CANNOT_START
    address = args.ray or os.environ.get("SEXPGPU_RAY_ADDRESS") or None
    live = LiveTable(sys.stderr, Store.open(store_url), enabled=sys.stderr.isatty() and not args.json)
    driver = Driver(path, args.sweep, store_url, address, args.max_preemptions, args.max_steps, say=live.say, devices=devices_from(args), table=live,
                    data_roots=data_roots_from(args), retry_failed=args.retry_failed)
    try:
        ledger = driver.run(sweep_points(compiled, sweep.points()))
    except SweepError as exc:
        print(f"sexpgpu: {exc.reason}", file=sys.stderr)
        return int(exc.code)
    if args.json:
        print_json(ledger.model_dump(mode="json"))
    else:
        print(f"{'point':>5}  {'knobs':<32} {'loss':>10}  {'attempts':>8}  state")
        for p in ledger.points:
            knobs = " ".join(f"{k}={v}" for k, v in p.knobs.items())
            loss = f"{p.final_loss:.4g}" if isinstance(p.final_loss, (int, float)) else "-"
            print(f"{p.point:>5}  {knobs:<32} {loss:>10}  {p.attempts:>8}  {p.state}")
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
