"""`variants FILE`, `sweep FILE --sweep S` (local, in order) and `new OUT`."""

from __future__ import annotations

import argparse
import os
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from ..compile.pipeline import compile_file
from ..compile.selection import Declared, prescan
from ..ir.experiment import Selection
from ..lisp.conditions import LispError
from ..lisp.program import diagnostic_from, has_errors
from ..runtime.data import DataError
from ..runtime.loop import RunOptions, train
from ..runtime.runfolder import run_slug
from ..runtime.runfolder import RunFolder
from ..runtime.store import Store
from .check import add_limit_flags, limits_from
from .common import Exit, existing_file, exit_for, fail_usage, print_diagnostics, print_json

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    v = sub.add_parser("variants", help="the declared selection: knobs, variants, sweeps and every point with its slug")
    v.add_argument("file")
    v.add_argument("--json", action="store_true")
    add_limit_flags(v)
    v.set_defaults(run=run_variants)

    s = sub.add_parser("sweep", help="run every point of a sweep, in order, locally")
    s.add_argument("file")
    s.add_argument("--sweep", required=True, metavar="S")
    s.add_argument("--store", default=None)
    s.add_argument("--max-steps", type=int, default=None, metavar="N")
    s.add_argument("--json", action="store_true")
    s.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS", help="fan the points out over a Ray cluster (no ADDRESS: a local Ray started for the sweep)")
    s.add_argument("--max-preemptions", type=int, default=None, metavar="N", help="give up on a point preempted more than N times (default: never)")
    add_rank_flags(s)
    add_limit_flags(s)
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
    store_url = args.store or os.environ.get("SEXPGPU_STORE") or "./runs"
    experiments = []
    for i in range(len(sweep.points())):  # compile every point first: a bad point fails before any training
        world = args.devices if args.ray is not None else 1
        result = compile_file(path, Selection(sweep=args.sweep, point=i), limits_from(args), output=sys.stderr.write, world=world)
        if has_errors(result.diagnostics) or result.experiment is None:
            print_diagnostics(result.diagnostics, result.program.sources if result.program else _sources())
            print(f"sweep {args.sweep}: point {i} does not check; nothing was run", file=sys.stderr)
            return exit_for(result.diagnostics) or Exit.CHECK_FAILED
        experiments.append((result.experiment, result.program))
    if args.ray is not None:
        return ray_sweep(args, path, sweep, store_url)
    if args.devices != 1:
        fail_usage(f"--devices {args.devices} needs --ray: data-parallel ranks run as Ray actors (a local Ray when --ray has no address)")
    store = Store.open(store_url)
    rows = []
    worst = Exit.OK
    for i, (experiment, program) in enumerate(experiments):
        slug = run_slug(experiment)
        status = RunFolder(store, slug).read_status()
        if status is not None and status.state == "finished":
            rows.append({"point": i, "slug": slug, "state": "finished (skipped)", "loss": status.metrics.get("loss"), "metrics": status.metrics})
            continue
        sources = {f.name: f.read_bytes() for f in program.files}
        options = RunOptions(store=store_url, max_steps=args.max_steps, progress=False, sources=sources)
        print(f"point {i}/{len(experiments) - 1}: {' '.join(f'{k}={v}' for k, v in sweep.points()[i].items())}", file=sys.stderr)
        try:
            outcome = train(experiment, options, say=lambda text: print(text, file=sys.stderr))
        except DataError as exc:
            print(f"sexpgpu: data error: {exc}", file=sys.stderr)
            return Exit.DATA
        rows.append({"point": i, "slug": outcome.slug, "state": outcome.reason, "loss": outcome.final_loss, "metrics": outcome.metrics})
        worst = max(worst, outcome.exit_code)
        if outcome.exit_code == Exit.STOPPED:
            print(f"sweep {args.sweep}: stopped at point {i}; run the same command again to continue", file=sys.stderr)
            break
    if args.json:
        print_json({"sweep": args.sweep, "points": rows})
    else:
        names = sorted({m for r in rows for m in (r["metrics"] or {}) if m != "loss"})
        print(f"{'point':>5}  {'knobs':<32} {'loss':>10} " + " ".join(f"{n:>10}" for n in names) + "  state")
        for r, values in zip(rows, sweep.points()):
            knobs = " ".join(f"{k}={v}" for k, v in values.items())
            loss = f"{r['loss']:.4g}" if isinstance(r["loss"], (int, float)) else "-"
            metrics = " ".join(f"{(r['metrics'] or {}).get(n, float('nan')):>10.4g}" for n in names)
            print(f"{r['point']:>5}  {knobs:<32} {loss:>10} {metrics}  {r['state']}")
    return worst


def add_rank_flags(p: argparse.ArgumentParser) -> None:
    """Devices per point (data parallel) for the Ray paths: sweep --ray and submit."""
    p.add_argument("--devices", type=int, default=1, metavar="W", help="data-parallel ranks per point (each takes batch/W; default 1)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="what each rank runs on (cuda: one GPU per rank, NCCL between them)")
    p.add_argument("--allreduce-dtype", choices=["f32", "bf16"], default="f32", help="the wire format of gradient buckets")
    p.add_argument("--allreduce-op", choices=["avg", "sum"], default="avg", help="avg: the gradient of the global batch's mean loss")
    p.add_argument("--bucket-mb", type=float, default=25.0, metavar="MB", help="gradient bucket size")
    p.add_argument("--rendezvous-timeout", type=float, default=120.0, metavar="S", help="how long ranks wait for each other; then the attempt ends as a preemption")


def devices_from(args: argparse.Namespace) -> Any:
    from orchestration.gang import Devices
    from workers.collective import AllReduceSpec

    if args.devices < 1:
        fail_usage(f"--devices {args.devices}: a point needs at least one rank")
    return Devices(count=args.devices, kind=args.device, rendezvous_timeout_s=args.rendezvous_timeout,
                   allreduce=AllReduceSpec(dtype=args.allreduce_dtype, op=args.allreduce_op, bucket_mb=args.bucket_mb))


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


def ray_sweep(args: argparse.Namespace, path: Path, sweep: Any, store_url: str) -> int:
    """The same sweep, fanned out over Ray by orchestration.driver (the cluster extra)."""
    try:
        from orchestration.driver import Driver, SweepError
    except ImportError as exc:
        print(f"sexpgpu: --ray needs the cluster extra (pip install -e '.[cluster]'): {exc}", file=sys.stderr)
        return Exit.CANNOT_START
    address = args.ray or os.environ.get("SEXPGPU_RAY_ADDRESS") or None
    live = LiveTable(sys.stderr, Store.open(store_url), enabled=sys.stderr.isatty() and not args.json)
    driver = Driver(path, args.sweep, store_url, address, args.max_preemptions, args.max_steps, say=live.say, devices=devices_from(args), table=live)
    try:
        ledger = driver.run([(i, values, None) for i, values in enumerate(sweep.points())])
    except SweepError as exc:
        print(f"sexpgpu: cannot start the sweep: {exc}", file=sys.stderr)
        return Exit.CANNOT_START
    if args.json:
        print_json(ledger.model_dump(mode="json"))
    else:
        print(f"{'point':>5}  {'knobs':<32} {'loss':>10}  {'attempts':>8}  state")
        for p in ledger.points:
            knobs = " ".join(f"{k}={v}" for k, v in p.knobs.items())
            loss = f"{p.final_loss:.4g}" if isinstance(p.final_loss, (int, float)) else "-"
            print(f"{p.point:>5}  {knobs:<32} {loss:>10}  {p.attempts:>8}  {p.state}")
    return max((p.exit_code or 0) for p in ledger.points if p.state == "failed") if any(p.state == "failed" for p in ledger.points) else Exit.OK


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
    result = compile_file(out, Selection())
    print_diagnostics(result.diagnostics, result.program.sources if result.program else _sources())
    if args.json:
        print_json({"file": str(out), "from": str(source), "knobs": changes, "ok": not has_errors(result.diagnostics)})
    else:
        print(f"wrote {out} from {source.name}" + (f" with {sets}" if sets else ""))
    return exit_for(result.diagnostics)


__all__ = ["register", "Optional"]
