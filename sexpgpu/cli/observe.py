"""`status RUN`, `logs RUN`, `checkpoint RUN ...` and `annotate RUN TEXT`: read (and annotate)
a run folder, local or remote, through the store. None of them writes to a run folder except
`annotate`, which appends one event through the store's append-only log.

RUN is a run folder: a local path (`runs/quickstart.base.98663fcb`), or a URL whose last path
segment is the slug (`s3://bucket/prefix/SLUG`, `memory://SLUG`). A bare slug that is not a
folder here is looked up in `--store`, else `$SEXPGPU_STORE`, else `./runs`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from ..results import locate
from ..runtime.events import AnnotationEvent, EventReader, apply_resumes, events_prefix
from ..runtime.status import STATUS_LIMIT, Status, status_path
from ..runtime.store import NotARegularFile, Store, UnexpectedSize, is_store_failure, store_problem
from ..outcome import Exit
from .common import fail_usage, print_json


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    s = sub.add_parser("status")
    _run_arguments(s)
    s.set_defaults(run=run_status)

    lg = sub.add_parser("logs")
    _run_arguments(lg)
    lg.add_argument("--kind", dest="kinds", action="append", default=[], metavar="K", help="only events of kind K (repeatable)")
    lg.add_argument("--all", action="store_true", help="keep the events a resume superseded")
    lg.add_argument("-n", "--tail", type=int, default=None, metavar="N", help="only the last N events (after --kind)")
    lg.add_argument("-f", "--follow", action="store_true", help="keep reading new events until run.end or Ctrl-C")
    lg.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="how often --follow polls (default 1)")
    lg.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="stop following after SECONDS (exit 0)")
    lg.set_defaults(run=run_logs)

    c = sub.add_parser("checkpoint")
    _run_arguments(c)
    c.add_argument("action", nargs="?", default="list", choices=["list", "show", "verify", "export"], help="default: list")
    c.add_argument("step", nargs="?", default=None, metavar="STEP", help="500, step-000500 or latest (show, export)")
    c.add_argument("--format", choices=["safetensors", "npz"], default=None, help="export format (default: from -o, else safetensors)")
    c.add_argument("-o", "--output", default=None, metavar="FILE", help="export to FILE (default SLUG.step-NNNNNN.FORMAT here)")
    c.set_defaults(run=run_checkpoint)

    a = sub.add_parser("annotate")
    _run_arguments(a)
    a.add_argument("text")
    a.add_argument("--author", default=None, help="default $USER")
    a.set_defaults(run=run_annotate)


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="RUN", help="a run folder: a local path or a URL (s3://bucket/prefix/SLUG)")
    parser.add_argument("--store", default=None, metavar="URL", help="read RUN as a slug in this store")
    parser.add_argument("--json", action="store_true")


# -- RUN -> store + slug ----------------------------------------------------------------------


@dataclass
class RunRef:
    store: Store
    slug: str

    @property
    def url(self) -> str:
        return self.store.url_of(self.slug)

    def url_of(self, relative: str) -> str:
        return self.store.url_of(f"{self.slug}/{relative}")


def split_run(target: str, store: Optional[str] = None) -> tuple[str, str]:
    """(store URL, slug) for RUN: the last path segment is the slug, the rest the store."""
    try:
        return locate.split_run(target, store)
    except ValueError as exc:
        fail_usage(str(exc))


def open_run(args: argparse.Namespace) -> RunRef:
    store_url, slug = split_run(args.target, args.store)
    if not slug or slug.startswith("."):
        fail_usage(f"{args.target}: not a run folder name")
    try:
        store = Store.open(store_url)
    except ImportError as exc:
        raise CannotReach(f"cannot open the store {store_url}: {exc} (for s3:// install the cluster extra: pip install 'sexpgpu[cluster]')") from exc
    except (ValueError, OSError) as exc:
        raise CannotReach(f"cannot open the store {store_url}: {exc}") from exc
    return RunRef(store, slug)


class CannotReach(Exception):
    """The store cannot be opened or read: exit 4."""


def _guarded(verb: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return verb(args)
        except (CannotReach, NotARegularFile, UnexpectedSize) as exc:  # the last two name their file
            print(f"sexpgpu: {exc}", file=sys.stderr)
            return Exit.CANNOT_START
        except Exception as exc:  # the store's own failures (no credentials, no access, gone)
            if not is_store_failure(exc):
                raise
            print(f"sexpgpu: {store_problem(split_run(args.target, args.store)[0], exc)}", file=sys.stderr)
            return Exit.CANNOT_START

    wrapper.__name__ = verb.__name__
    wrapper.__doc__ = verb.__doc__
    return wrapper


def _is_run(ref: RunRef) -> bool:
    return ref.store.exists(f"{ref.slug}/run.json") or ref.store.exists(status_path(ref.slug))


def _has_run(ref: RunRef) -> bool:
    single, _ = ref.store.log_paths(events_prefix(ref.slug))
    return _is_run(ref) or ref.store.exists(single) or bool(ref.store.log_segments(events_prefix(ref.slug)))


def _wait_for_run(ref: RunRef, interval: float, deadline: Optional[float]) -> bool:
    """`logs --follow` of a run that has not started yet (submitted, or about to be): wait
    for it, saying what for, until it appears (True) or DEADLINE passes (False)."""
    submitted = ref.store.exists(f"{ref.slug}/submit.json")
    what = "its submitted job has not started it yet" if submitted else "nothing is there yet"
    print(f"sexpgpu: waiting for the run at {ref.url} to start ({what}; Ctrl-C or --timeout to stop)", file=sys.stderr)
    try:
        while not _has_run(ref):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic())))
    except KeyboardInterrupt:
        return False
    return True


def _no_run(ref: RunRef) -> int:
    print(f"sexpgpu: no run at {ref.url} (looked for {ref.url_of('run.json')} and {ref.url_of('status.json')})", file=sys.stderr)
    return Exit.USAGE


# -- formatting helpers -----------------------------------------------------------------------


def _num(value: Any) -> str:
    if value is None:
        return "nan"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def _metrics(values: Optional[dict[str, Any]]) -> str:
    if not values:
        return "-"
    return "  ".join(f"{k} {_num(v)}" for k, v in values.items())


def _duration(seconds: Optional[float]) -> str:
    if seconds is None or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return "-"
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def _age(stamp: Optional[str]) -> Optional[float]:
    if not stamp:
        return None
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return (datetime.now(timezone.utc) - when).total_seconds()


def _bytes(n: Optional[int]) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"


# -- status -----------------------------------------------------------------------------------


@_guarded
def run_status(args: argparse.Namespace) -> int:
    """The status file, as it is (--json) or for people."""
    ref = open_run(args)
    path = status_path(ref.slug)
    if not ref.store.exists(path):
        where = ref.url_of("status.json")
        hint = "" if _is_run(ref) else " (and no run.json: is RUN a run folder?)"
        print(f"sexpgpu: no status file at {where}{hint}", file=sys.stderr)
        return Exit.USAGE
    try:
        raw = json.loads(ref.store.read_bytes(path, limit=STATUS_LIMIT))
        status = Status.model_validate(raw)
    except UnexpectedSize as exc:  # it names the file and its size
        print(f"sexpgpu: {exc}", file=sys.stderr)
        return Exit.RUN_FAILED
    except ValueError as exc:
        print(f"sexpgpu: {ref.url_of('status.json')} is not a valid status file: {exc}", file=sys.stderr)
        return Exit.RUN_FAILED
    if args.json:
        print_json(raw)
        return Exit.OK
    for line in status_lines(ref, status):
        print(line)
    return Exit.OK


def status_lines(ref: RunRef, s: Status) -> list[str]:
    lines = [f"{ref.slug}  {ref.url}"]
    rows: list[tuple[str, str]] = [("state", s.state)]
    rows.append(("step", f"{s.step}/{s.steps}" if s.steps is not None else str(s.step)))
    rows.append(("metrics", _metrics(s.metrics)))
    rows.append(("last eval", _metrics(s.last_eval) + (f" (step {s.last_eval_step})" if s.last_eval and s.last_eval_step is not None else "")))
    if s.summary is None:
        rows.append(("eta", _duration(s.eta_s)))
    age = _age(s.heartbeat)
    beat = s.heartbeat + (f" ({_duration(age)} ago)" if age is not None else "")
    rows.append(("heartbeat", beat))
    where = s.host + (f", worker {s.worker}" if s.worker else "")
    rows.append(("attempt", f"{s.attempt} on {where}"))
    rows.append(("checkpoint", s.last_checkpoint or "-"))
    rows.append(("started", s.started))
    for name, value in rows:
        lines.append(f"{name:<11}{value}")
    if s.summary is not None:
        m = s.summary
        lines.append(f"{'summary':<11}{m.reason or '-'} (exit {m.exit_code})")
        lines.append(f"{'':<11}wall time {_duration(m.wall_time_s)}, examples seen {m.examples_seen}"
                     + (f", tokens seen {m.tokens_seen}" if m.tokens_seen is not None else ""))
        if m.target_reached_at_step is not None:
            lines.append(f"{'':<11}target reached at step {m.target_reached_at_step}")
        if m.last_eval:
            lines.append(f"{'':<11}last eval  {_metrics(m.last_eval)}")
        if m.best_eval:
            lines.append(f"{'':<11}best eval  {_metrics(m.best_eval)}")
    return lines


# -- logs -------------------------------------------------------------------------------------

# The fields each kind shows first, in this order; the rest follow as key=value.
MAIN_FIELDS: dict[str, tuple[str, ...]] = {
    "run.start": ("slug", "attempt", "steps", "host", "worker", "device"),
    "compile": ("ir_hash", "params", "seconds", "cached"),
    "step": ("loss", "metrics", "lr", "grad_norm", "step_time", "examples_per_s", "tokens_per_s", "memory"),
    "eval": ("name", "metrics", "seconds"),
    "diagnostic": ("values",),
    "stage": ("name", "loader", "index"),
    "checkpoint": ("path", "bytes", "seconds"),
    "nonfinite": ("loss", "node", "location", "param_path", "created", "action", "message"),
    "warning": ("code", "message"),
    "signal": ("signal",),
    "preempted": ("reason",),
    "resume": ("from_step", "checkpoint", "attempt"),
    "target": ("metric", "value", "threshold"),
    "annotation": ("text", "author"),
    "run.end": ("exit_code", "reason", "state", "wall_time_s", "final"),
}
HEAD = ("v", "t", "kind", "step")


def _field(key: str, value: Any) -> str:
    if key == "ir_hash" and isinstance(value, str):
        return f"ir_hash={value[:12]}"
    if key in ("text", "reason", "message") and isinstance(value, str):
        return json.dumps(value, ensure_ascii=False) if key == "text" else value
    if key == "author":
        return f"({value})"
    if key in ("step_time", "seconds", "wall_time_s") and isinstance(value, (int, float)):
        return f"{key}={_duration(value) if value >= 1 else f'{value * 1000:.3g}ms'}"
    if key == "bytes" and isinstance(value, int):
        return _bytes(value)
    if key == "memory" and isinstance(value, int):  # a step's peak resident memory
        return f"memory={value / (1 << 20):.1f}MiB"
    if key in ("metrics", "values") and isinstance(value, dict):
        return _metrics(value) if value else ""
    if key == "final" and isinstance(value, dict):
        return f"final {_metrics(value)}" if value else ""
    if key == "lr" and isinstance(value, dict):
        return "lr " + " ".join(f"{k}={_num(v)}" for k, v in value.items()) if value else ""
    if key in ("loss", "grad_norm", "value", "threshold"):
        return f"{key} {_num(value)}"
    if key == "name":
        return str(value)
    if isinstance(value, (dict, list)):
        return f"{key}={json.dumps(value, ensure_ascii=False, separators=(',', ':'))}"
    return f"{key}={_num(value)}"


def event_line(event: dict[str, Any]) -> str:
    """One event for people: time, step, kind, then its main fields."""
    stamp = str(event.get("t", ""))
    clock = stamp[11:19] if len(stamp) >= 19 else stamp
    step = event.get("step")
    kind = str(event.get("kind", "?"))
    order = MAIN_FIELDS.get(kind, ())
    keys = [k for k in order if k in event] + [k for k in event if k not in order and k not in HEAD]
    parts = [p for p in (_field(k, event[k]) for k in keys if event[k] is not None) if p]
    step_text = "-" if step is None else str(step)
    return f"{clock:<8}  {step_text:>7}  {kind:<11} {'  '.join(parts)}".rstrip()


def supersede(pairs: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    kept = {id(event) for event in apply_resumes([event for _, event in pairs])}
    return [pair for pair in pairs if id(pair[1]) in kept]


def _ended(events: Iterable[dict[str, Any]]) -> bool:
    """Whether the latest attempt has ended: a run.end after the last run.start/resume."""
    state = False
    for event in events:
        kind = event.get("kind")
        if kind == "run.end":
            state = True
        elif kind in ("run.start", "resume"):
            state = False
    return state


@_guarded
def run_logs(args: argparse.Namespace) -> int:
    """Events one per line; --json prints the stored JSON lines as they are."""
    if args.tail is not None and args.tail < 0:
        fail_usage("--tail needs a number >= 0")
    if args.interval <= 0:
        fail_usage("--interval needs a positive number of seconds")
    ref = open_run(args)
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    if not _has_run(ref):
        if not args.follow or not _wait_for_run(ref, args.interval, deadline):
            return _no_run(ref)
    kinds = set(args.kinds)

    def show(pairs: list[tuple[str, dict[str, Any]]]) -> None:
        for line, event in pairs:
            print(line if args.json else event_line(event))
        sys.stdout.flush()

    def wanted(pairs: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
        return [p for p in pairs if not kinds or p[1].get("kind") in kinds]

    reader = EventReader(ref.store, ref.slug)
    warned: set[str] = set()

    def warn() -> None:
        for warning in reader.warnings:
            if warning not in warned:
                warned.add(warning)
                print(f"sexpgpu: warning: {warning}", file=sys.stderr)

    reader.update()
    warn()
    pairs = list(reader.pairs)
    first = wanted(pairs if args.all else supersede(pairs))
    if args.tail is not None:
        first = first[len(first) - args.tail:] if args.tail else []
    show(first)
    if not args.follow:
        return Exit.OK
    history = [event for _, event in pairs]
    try:
        while not _ended(history):
            if deadline is not None and time.monotonic() >= deadline:
                break
            pause = args.interval if deadline is None else max(0.0, min(args.interval, deadline - time.monotonic()))
            time.sleep(pause)
            resets = reader.resets
            fresh = reader.update()
            warn()
            if reader.resets != resets:  # the log was rewritten (a torn tail dropped): start over
                history = []
            history.extend(event for _, event in fresh)
            show(wanted(fresh))
    except KeyboardInterrupt:
        pass
    return Exit.OK


# -- checkpoint -------------------------------------------------------------------------------


def _ckpt() -> Any:
    from ..runtime import checkpoint

    return checkpoint


def _checkpoint_name(ref: RunRef, which: str) -> str:
    ck = _ckpt()
    if which == "latest":
        named, warnings = ck.latest_named(ref.store, ref.slug)
        if not named:
            raise Missing("; ".join(warnings) or f"no LATEST at {ref.url_of('checkpoints/LATEST')}")
        return str(named)
    if which.isdigit():
        return str(ck.step_name(int(which)))
    name = which.rstrip("/").split("/")[-1]
    if not ck.STEP_DIR.match(name):
        fail_usage(f"STEP {which}: write a step number (500), a folder name (step-000500) or latest")
    return name


class Missing(Exception):
    """What RUN or STEP names does not exist: exit 2."""


def read_safetensors_header(data: bytes) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """(tensor name -> {dtype, shape, bytes}, metadata) from a safetensors file's header."""
    if len(data) < 8:
        raise ValueError("shorter than a safetensors header")
    (size,) = struct.unpack("<Q", data[:8])
    if size > len(data) - 8:
        raise ValueError(f"header of {size} bytes does not fit in a file of {len(data)} bytes")
    header = json.loads(data[8 : 8 + size].decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    tensors = {}
    for name, info in sorted(header.items()):
        begin, end = info.get("data_offsets", [0, 0])
        tensors[name] = {"dtype": info.get("dtype"), "shape": list(info.get("shape", [])), "bytes": int(end) - int(begin)}
    return tensors, meta


def _expected(ref: RunRef) -> Any:
    """What the run's checkpoints must hold, from its ir.json (None when it has none)."""
    ck = _ckpt()
    from ..ir.graph import Module
    from ..records import load_json

    try:
        module = load_json(Module, ref.store.read_bytes(f"{ref.slug}/ir.json", limit=IR_LIMIT))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        print(f"sexpgpu: warning: {ref.url_of('ir.json')} unreadable ({type(exc).__name__}); checkpoints are checked without it", file=sys.stderr)
        return None
    return ck.Expected.of_module(module)


IR_LIMIT = 1 << 30  # an ir.json larger than this is not one


def _list_doc(ref: RunRef, deep: bool) -> dict[str, Any]:
    ck = _ckpt()
    infos = ck.list_checkpoints(ref.store, ref.slug, verify=deep, expected=_expected(ref) if deep else None)
    latest_name, latest_warnings = ck.latest_named(ref.store, ref.slug)
    latest = latest_name or None
    rows = []
    for info in infos:
        published = ref.store.exists(f"{ref.slug}/checkpoints/{info.name}/MANIFEST.json")
        size = None
        if published:
            try:
                size = sum(entry.bytes for entry in ck.read_manifest(ref.store, f"{ref.slug}/checkpoints/{info.name}").files.values())
            except ck.CheckpointProblem:
                pass
        rows.append({"name": info.name, "step": info.step, "valid": info.valid, "published": published,
                     "reason": info.reason, "bytes": size, "latest": info.name == latest})
    return {"run": ref.url, "latest": latest, "latest_warnings": latest_warnings, "checkpoints": rows}


@_guarded
def run_checkpoint(args: argparse.Namespace) -> int:
    action = args.action
    if action in ("show", "export") and args.step is None:
        fail_usage(f"checkpoint {action} needs STEP (500, step-000500 or latest)")
    if action in ("list", "verify") and args.step is not None:
        fail_usage(f"checkpoint {action} takes no STEP")
    if action != "export" and (args.format is not None or args.output is not None):
        fail_usage("--format and -o go with export")
    ref = open_run(args)
    if not _is_run(ref) and not ref.store.list(f"{ref.slug}/checkpoints"):
        return _no_run(ref)
    try:
        if action == "list":
            return _ck_list(ref, args)
        if action == "verify":
            return _ck_verify(ref, args)
        name = _checkpoint_name(ref, args.step)
        if not ref.store.list(f"{ref.slug}/checkpoints/{name}"):
            raise Missing(f"no checkpoint {name} at {ref.url_of('checkpoints')}")
        if action == "show":
            return _ck_show(ref, name, args)
        return _ck_export(ref, name, args)
    except Missing as exc:
        print(f"sexpgpu: {exc}", file=sys.stderr)
        return Exit.USAGE


def _ck_list(ref: RunRef, args: argparse.Namespace) -> int:
    doc = _list_doc(ref, deep=False)
    if args.json:
        print_json(doc)
        return Exit.OK
    rows = doc["checkpoints"]
    if not rows:
        print(f"no checkpoints in {ref.url_of('checkpoints')}", file=sys.stderr)
        return Exit.OK
    print(f"{'name':<14} {'step':>8}  {'valid':<5}  {'size':>9}  reason")
    for row in rows:
        mark = " *" if row["latest"] else ""
        print(f"{row['name']:<14} {row['step']:>8}  {'yes' if row['valid'] else 'no':<5}  {_bytes(row['bytes']):>9}  {row['reason'] or '-'}{mark}")
    if doc["latest"]:
        print(f"LATEST: {doc['latest']}")
    return Exit.OK


def _ck_verify(ref: RunRef, args: argparse.Namespace) -> int:
    doc = _list_doc(ref, deep=True)
    rows = doc["checkpoints"]
    problems = []
    for row in rows:
        # An unpublished folder is a write that did not finish: never loaded, so not corrupt.
        row["corrupt"] = row["published"] and not row["valid"]
        if row["corrupt"]:
            problems.append(f"{row['name']}: {row['reason']}")
    latest = doc["latest"]
    doc["latest_problem"] = "; ".join(doc["latest_warnings"]) or None
    if latest is not None:
        target = next((r for r in rows if r["name"] == latest), None)
        if target is None:
            doc["latest_problem"] = f"LATEST names {latest}, which does not exist"
        elif not target["valid"]:
            doc["latest_problem"] = f"LATEST names {latest}, which cannot be loaded"
    if doc["latest_problem"]:
        problems.append(doc["latest_problem"])
    doc["ok"] = not problems
    if args.json:
        print_json(doc)
    else:
        if not rows:
            print(f"no checkpoints in {ref.url_of('checkpoints')}")
        for row in rows:
            verdict = "ok" if row["valid"] else ("CORRUPT" if row["corrupt"] else "unpublished")
            print(f"{row['name']}  {verdict}  {row['reason']}".rstrip())
        if doc["latest_problem"]:
            print(doc["latest_problem"])
        if problems:
            print(f"{len(problems)} problem(s): a corrupt checkpoint is never loaded (resume from it exits 6)", file=sys.stderr)
    return Exit.OK if not problems else Exit.RESUME_REFUSED


def _ck_show(ref: RunRef, name: str, args: argparse.Namespace) -> int:
    ck = _ckpt()
    folder = f"{ref.slug}/checkpoints/{name}"
    problem = ck.check(ref.store, ref.slug, name, deep=True, expected=_expected(ref))
    doc: dict[str, Any] = {"name": name, "folder": ref.url_of(f"checkpoints/{name}"), "valid": problem is None, "reason": problem or ""}
    try:
        manifest = ck.read_manifest(ref.store, folder)
    except ck.CheckpointProblem:
        manifest = None
    doc["manifest"] = manifest.model_dump() if manifest is not None else None
    # each file is read only as the manifest records it: a regular file of its size
    contents: dict[str, bytes] = {}
    errors: dict[str, str] = {}
    for file in ck.CHECKPOINT_FILES:
        entry = manifest.files.get(file) if manifest is not None else None
        if entry is None:
            errors[file] = "not in MANIFEST.json"
            continue
        try:
            contents[file] = ref.store.read_bytes(f"{folder}/{file}", exactly=entry.bytes)
        except OSError as exc:
            errors[file] = f"{type(exc).__name__}: {exc}"
    try:
        doc["state"] = json.loads(contents["state.json"]) if "state.json" in contents else None
    except ValueError as exc:
        doc["state"] = None
        errors["state.json"] = f"{type(exc).__name__}: {exc}"
    if doc["state"] is None:
        doc["state_error"] = errors.get("state.json")
    for part in ("params", "optim"):
        try:
            if f"{part}.safetensors" not in contents:
                raise ValueError(errors[f"{part}.safetensors"])
            tensors, meta = read_safetensors_header(contents[f"{part}.safetensors"])
            doc[part] = {"tensors": tensors, "metadata": meta, "count": len(tensors),
                         "values": sum(math.prod(t["shape"]) for t in tensors.values())}
        except (ValueError, UnicodeDecodeError, AttributeError, TypeError) as exc:
            doc[part] = {"error": f"{type(exc).__name__}: {exc}"}
    code = Exit.OK if problem is None else Exit.RESUME_REFUSED
    if args.json:
        print_json(doc)
        return code
    print(f"{name}  {doc['folder']}")
    print(f"valid      {'yes' if problem is None else 'no: ' + problem}")
    state = doc["state"]
    if state is not None:
        print("state.json")
        for key, value in state.items():
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            if len(text) > 100:
                text = text[:97] + "..."
            print(f"  {key:<15}{text}")
    else:
        print(f"state.json unreadable: {doc.get('state_error')}")
    for part in ("params", "optim"):
        info = doc[part]
        if "error" in info:
            print(f"{part}.safetensors unreadable: {info['error']}")
            continue
        print(f"{part}.safetensors: {info['count']} tensors, {info['values']} values")
        for tname, t in info["tensors"].items():
            shape = "(" + " ".join(str(d) for d in t["shape"]) + ")"
            print(f"  {tname:<40} {str(t['dtype']):<5} {shape}")
    if problem is not None:
        print(f"checkpoint {name} cannot be loaded: {problem}", file=sys.stderr)
    return code


def _ck_export(ref: RunRef, name: str, args: argparse.Namespace) -> int:
    ck = _ckpt()
    fmt = args.format
    if fmt is None:
        fmt = "npz" if args.output and args.output.endswith(".npz") else "safetensors"
    output = Path(args.output) if args.output else Path(f"{ref.slug}.{name}.{fmt}")
    folder = f"{ref.slug}/checkpoints/{name}"
    try:  # what is exported is what was checked: the files are read once, against the manifest
        files = ck.read_files(ref.store, folder, ck.read_manifest(ref.store, folder))
        ck.decode(files, _expected(ref))
    except ck.CheckpointProblem as problem:
        print(f"sexpgpu: checkpoint {name} cannot be exported: {problem}", file=sys.stderr)
        return Exit.RESUME_REFUSED
    data = files["params.safetensors"]
    tensors, _ = read_safetensors_header(data)
    if output.parent and not output.parent.exists():
        fail_usage(f"-o {output}: the folder {output.parent} does not exist")
    if fmt == "safetensors":
        payload = data  # already one safetensors file of every parameter
    else:
        import io

        import numpy as np
        from safetensors.numpy import load as load_tensors

        arrays = dict(sorted(load_tensors(data).items()))  # by path: safetensors' own order is not stable
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]
        payload = buffer.getvalue()
    temp = output.with_name(f".{output.name}.tmp")
    temp.write_bytes(payload)
    os.replace(temp, output)
    doc = {"checkpoint": name, "format": fmt, "file": str(output), "bytes": len(payload), "tensors": len(tensors)}
    if args.json:
        print_json(doc)
    else:
        print(f"{output}  ({len(tensors)} tensors, {_bytes(len(payload))}, from {name})")
    return Exit.OK


# -- annotate ---------------------------------------------------------------------------------


@_guarded
def run_annotate(args: argparse.Namespace) -> int:
    """Append one `annotation` event to the run's log, at the status's current step."""
    text = args.text
    if not text.strip():
        fail_usage("the annotation TEXT is empty")
    if "\n" in text or "\r" in text:
        text = " ".join(text.splitlines())
    ref = open_run(args)
    if not _is_run(ref):
        return _no_run(ref)
    step = None
    path = status_path(ref.slug)
    if ref.store.exists(path):
        try:
            step = Status.model_validate_json(ref.store.read_bytes(path, limit=STATUS_LIMIT)).step
        except (ValueError, UnexpectedSize):
            step = None
    author = args.author if args.author is not None else (os.environ.get("USER") or None)
    event = AnnotationEvent(text=text, author=author, step=step)
    line = event.to_line()
    ref.store.append_lines(events_prefix(ref.slug), [line])
    if args.json:
        print_json(json.loads(line))
    else:
        print(f"annotated {ref.slug} at step {step if step is not None else '-'}")
    return Exit.OK
