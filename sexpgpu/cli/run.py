"""`run FILE`: train. Prints the slug and the run folder first, progress on stderr, and the
final summary last."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ..bundle import BundleError, compile_bundle, is_bundle
from ..compile.pipeline import CompileResult, compile_file
from ..lisp.program import has_errors
from ..runtime.data import DataError
from ..runtime.checkpoint import ResumeError
from ..runtime.loop import RunOptions, train
from .check import add_limit_flags, limits_from
from .common import Exit, existing_file, exit_for, fail_usage, print_diagnostics, print_json
from .selection import add_selection_flags, selection_from

if TYPE_CHECKING:
    from ..ir.experiment import Experiment


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="train a run file")
    p.add_argument("file")
    p.add_argument("--store", default=None, help="where run folders go (default $SEXPGPU_STORE or ./runs)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N or auto (default $SEXPGPU_DEVICE or cpu)")
    p.add_argument("--max-steps", type=int, default=None, metavar="N", help="stop after N steps (smoke tests; recorded in run.json)")
    p.add_argument("--resume", default=None, metavar="latest|STEP|PATH", help="continue from a checkpoint (a stopped run resumes from its latest on its own)")
    p.add_argument("--quiet", action="store_true", help="no progress")
    p.add_argument("--json", action="store_true", help="print the final summary as JSON")
    add_selection_flags(p)
    add_limit_flags(p)
    p.set_defaults(run=run_run)


def stop_before_training(signum: int, frame: object) -> None:
    """SIGTERM/SIGINT while compiling: nothing to checkpoint yet; stop as resumable."""
    raise SystemExit(Exit.STOPPED)


def run_run(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, stop_before_training)
    device = args.device or os.environ.get("SEXPGPU_DEVICE") or "cpu"
    if device != "cpu" and device != "auto" and device != "cuda" and not device.startswith("cuda:"):
        fail_usage(f"--device {device}: use cpu, cuda, cuda:N or auto")
    from ..runtime.cuda.device import DeviceError, cuda_device, resolve

    device = resolve(device)
    if device != "cpu":
        try:
            cuda_device(device)
        except DeviceError as exc:
            print(f"sexpgpu: cannot start here: {exc}", file=sys.stderr)
            return Exit.CANNOT_START
    args.device = device
    if args.max_steps is not None and args.max_steps <= 0:
        fail_usage("--max-steps needs a positive integer")
    if is_bundle(args.file):
        return run_from_bundle(args)
    path = existing_file(args.file)
    result = compile_file(path, selection_from(args), limits_from(args), output=sys.stderr.write)
    return train_compiled(args, path, result)


def run_from_bundle(args: argparse.Namespace) -> int:
    """`run BUNDLE`: recompile the bundled source with the bundled selection, refuse another
    IR, then train like any run file."""
    if args.set_values or args.variant or args.sweep:
        fail_usage("a bundle carries its selection; --set, --variant and --sweep do not apply")
    try:
        manifest, result = compile_bundle(args.file)
    except BundleError as exc:
        print(f"sexpgpu: bundle refused: {exc}", file=sys.stderr)
        return Exit.CHECK_FAILED
    return train_compiled(args, Path(result.program.path) if result.program and result.program.path else Path(manifest.main), result)


def train_compiled(args: argparse.Namespace, path: Path, result: "CompileResult") -> int:
    store = args.store or os.environ.get("SEXPGPU_STORE") or "./runs"
    if has_errors(result.diagnostics):
        print_diagnostics(result.diagnostics, result.program.sources if result.program else _empty())
        return exit_for(result.diagnostics)
    print_diagnostics(result.diagnostics, result.program.sources if result.program else _empty())
    if result.experiment is None:
        print(f"{args.file} is not a run file: it has no defrun (see `sexpgpu docs the-run-file`)", file=sys.stderr)
        return Exit.CHECK_FAILED
    assert result.program is not None
    sources = {f.name if i == 0 else os.path.relpath(f, path.resolve().parent): f.read_bytes() for i, f in enumerate(result.program.files)}
    if args.device != "cpu":
        problem = device_memory_problem(result.experiment)
        if problem is not None:
            print(f"sexpgpu: cannot start here: {problem}", file=sys.stderr)
            return Exit.CANNOT_START
    options = RunOptions(store=store, device=args.device, max_steps=args.max_steps, progress=not args.quiet and not args.json and sys.stderr.isatty(), sources=sources, resume=args.resume)
    say = (lambda text: print(text, file=sys.stderr)) if args.json else print
    try:
        outcome = train(result.experiment, options, say=say)
    except DataError as exc:
        print(f"sexpgpu: data error: {exc}", file=sys.stderr)
        return Exit.DATA
    except ResumeError as exc:
        print(f"sexpgpu: resume refused: {exc}", file=sys.stderr)
        return Exit.RESUME_REFUSED
    except OSError as exc:  # StoreError included: the store cannot be written here
        print(f"sexpgpu: cannot start here: the store {store} is not writable ({exc}); see `sexpgpu doctor`", file=sys.stderr)
        return Exit.CANNOT_START
    if args.json:
        print_json(outcome.model_dump())
    else:
        metrics = "  ".join(f"{k} {v:.4g}" for k, v in outcome.metrics.items())
        loss = f"{outcome.final_loss:.6g}" if outcome.final_loss is not None else "-"
        print(f"{outcome.reason}: {outcome.steps} steps in {outcome.wall_time_s:.1f}s  loss {loss}  {metrics}".rstrip())
    return outcome.exit_code


def _empty():  # type: ignore[no-untyped-def]
    from ..lisp.diagnostics import SourceMap

    return SourceMap()


def device_memory_problem(experiment: "Experiment") -> Optional[str]:
    """The CUDA memory plan (explain --cuda) against the device's free memory."""
    from ..runtime.cuda.device import free_device_memory
    from .inspect import cuda_document

    need = cuda_document(experiment, ["train", "update"])["memory"]["total"]
    free = free_device_memory()
    if need > free:
        return f"the run needs {need:,} bytes of device memory (sexpgpu explain --cuda), the device has {free:,} free; lower the batch or use :microbatches"
    return None
