"""`run FILE|BUNDLE`: train. Prints the slug and the run folder first, progress on stderr, and
the final summary last."""

from __future__ import annotations

import argparse
import os
import sys

from ..bundle import is_bundle
from ..outcome import AttemptOutcome, evals_line
from ..session import Session, Settings
from .common import Console, existing_file, fail_usage, print_json
from .flags import add_data_root_flag, add_limit_flags, add_selection_flags, add_threads_flag, data_roots_from, limits_from, selection_from, store_patience, threads_from


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run")
    p.add_argument("file")
    p.add_argument("--store", default=None, help="where run folders go (default $SEXPGPU_STORE or ./runs)")
    p.add_argument("--device", default=None, help="cpu (compiled kernels), numpy (the NumPy reference), cuda, cuda:N or auto (default $SEXPGPU_DEVICE or cpu)")
    p.add_argument("--max-steps", type=int, default=None, metavar="N", help="stop after N steps (smoke tests; recorded in run.json)")
    p.add_argument("--resume", default=None, metavar="latest|STEP|PATH", help="continue from a checkpoint (a stopped run resumes from its latest on its own)")
    p.add_argument("--fresh", action="store_true", help="start from step 0: the slug's earlier folder is kept as SLUG~N, nothing deleted")
    p.add_argument("--quiet", action="store_true", help="no progress")
    p.add_argument("--json", action="store_true", help="print the final summary as JSON")
    add_selection_flags(p)
    add_limit_flags(p)
    add_data_root_flag(p)
    add_threads_flag(p)
    p.set_defaults(run=run_run)


def run_run(args: argparse.Namespace) -> int:
    if args.max_steps is not None and args.max_steps <= 0:
        fail_usage("--max-steps needs a positive integer")
    if args.fresh and args.resume is not None:
        fail_usage("--fresh starts from step 0; --resume continues: give one of them")
    settings = Settings(
        store=args.store or os.environ.get("SEXPGPU_STORE") or "./runs",
        device=args.device or os.environ.get("SEXPGPU_DEVICE") or "cpu",
        max_steps=args.max_steps, resume=args.resume, progress=not args.quiet and not args.json and sys.stderr.isatty(),
        limits=limits_from(args), store_patience_s=store_patience(), data_roots=data_roots_from(args), threads=threads_from(args), fresh=args.fresh,
    )
    session = Session(settings, Console(progress_to_stderr=args.json))
    if is_bundle(args.file):
        if args.set_values or args.variant or args.sweep:
            fail_usage("a bundle carries its selection; --set, --variant and --sweep do not apply")
        outcome = session.run_bundle(args.file)
    else:
        outcome = session.run_file(existing_file(args.file), selection_from(args))
    show_outcome(outcome, args.json)
    return int(outcome.exit_code)


def show_outcome(outcome: AttemptOutcome, as_json: bool) -> None:
    """The last line of a run (a refusal was said already, on stderr)."""
    if as_json:
        print_json(outcome.model_dump(mode="json"))
    elif outcome.folder is not None:
        metrics = "  ".join(f"{k} {v:.4g}" for k, v in outcome.metrics.items())
        loss = f"{outcome.final_loss:.6g}" if outcome.final_loss is not None else "-"
        trained = f" ({outcome.steps - outcome.first_step} in this attempt)" if outcome.first_step else ""
        evals = f"  {evals_line(outcome.evals)}" if outcome.evals else ""
        print(f"{outcome.reason}: {outcome.steps} steps{trained} in {outcome.wall_time_s:.1f}s  loss {loss}  {metrics}".rstrip() + evals)
