"""The flags several verbs share, in one place (a verb never imports another verb's module):
the selection (--variant, --set, --sweep/--point), the evaluation limits, and the ranks of
the Ray paths (sweep --ray, submit)."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Optional

from ..ir.experiment import Selection
from ..lisp.evaluator import Limits
from .common import fail_usage

if TYPE_CHECKING:  # the cluster code loads only when a verb asks for it
    from orchestration.gang import Devices


def add_knob_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant", metavar="V", help="a variant declared with defvariant")
    parser.add_argument("--set", dest="set_values", action="append", default=[], metavar="KNOB=VALUE", help="override a knob (repeatable)")


def add_selection_flags(parser: argparse.ArgumentParser) -> None:
    add_knob_flags(parser)
    parser.add_argument("--sweep", metavar="S", help="a sweep declared with defsweep (with --point)")
    parser.add_argument("--point", type=int, metavar="N", help="the point of the sweep, from 0")


def knobs_from(args: argparse.Namespace) -> Selection:
    """--variant and --set, as a selection (a sweep's points add their own knobs to it)."""
    values: dict[str, str] = {}
    for item in args.set_values:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            fail_usage(f"--set {item}: write --set KNOB=VALUE")
        values[name.strip().lower()] = value
    return Selection(variant=args.variant, set=values)


def selection_from(args: argparse.Namespace) -> Selection:
    if (args.sweep is None) != (args.point is None):
        fail_usage("--sweep and --point go together: --sweep S --point N")
    return replace(knobs_from(args), sweep=args.sweep, point=args.point)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be a positive integer")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be a positive number of seconds")
    return value


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    defaults = Limits()
    parser.add_argument("--max-eval-steps", type=positive_int, default=defaults.steps, metavar="N", help=f"evaluation step budget (default {defaults.steps})")
    parser.add_argument("--max-eval-depth", type=positive_int, default=defaults.depth, metavar="N", help=f"nested call limit (default {defaults.depth})")
    parser.add_argument("--max-eval-alloc", type=positive_int, default=defaults.alloc, metavar="N", help=f"allocation limit in cells of 8 bytes (default {defaults.alloc})")
    parser.add_argument("--max-eval-seconds", type=positive_float, default=defaults.seconds, metavar="S", help=f"evaluation time limit in seconds (default {defaults.seconds:g})")


def limits_from(args: argparse.Namespace) -> Limits:
    return Limits(steps=args.max_eval_steps, depth=args.max_eval_depth, alloc=args.max_eval_alloc, seconds=args.max_eval_seconds)


def add_rank_flags(p: argparse.ArgumentParser) -> None:
    """Devices per point (data parallel) for the Ray paths: sweep --ray and submit."""
    p.add_argument("--devices", type=int, default=1, metavar="W", help="data-parallel ranks per point (each takes batch/W; default 1)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="what each rank runs on (cuda: one GPU per rank, NCCL between them)")
    p.add_argument("--allreduce-dtype", choices=["f32", "bf16"], default="f32", help="the wire format of gradient buckets")
    p.add_argument("--allreduce-op", choices=["avg", "sum"], default="avg", help="avg: the gradient of the global batch's mean loss")
    p.add_argument("--bucket-mb", type=float, default=25.0, metavar="MB", help="gradient bucket size")
    p.add_argument("--rendezvous-timeout", type=float, default=120.0, metavar="S", help="how long ranks wait for each other; then the attempt ends as a preemption")


def devices_from(args: argparse.Namespace) -> "Devices":
    from orchestration.gang import Devices
    from workers.collective import AllReduceSpec

    if args.devices < 1:
        fail_usage(f"--devices {args.devices}: a point needs at least one rank")
    return Devices(count=args.devices, kind=args.device, rendezvous_timeout_s=args.rendezvous_timeout,
                   allreduce=AllReduceSpec(dtype=args.allreduce_dtype, op=args.allreduce_op, bucket_mb=args.bucket_mb))


def store_patience() -> float:
    """The run's patience with an unreachable store, from the environment; a malformed
    $SEXPGPU_STORE_PATIENCE or $SEXPGPU_STORE_RETRIES is a usage error here, before any
    store is opened."""
    from ..runtime.store import RetryPolicy, patience_configured

    try:
        RetryPolicy.configured(os.environ)
        return patience_configured(os.environ)
    except ValueError as exc:
        fail_usage(str(exc))


DATA_ROOTS_VARIABLE = "SEXPGPU_DATA_ROOTS"


def add_data_root_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-root", dest="data_roots", action="append", default=[], metavar="DIR|URL",
                        help="a folder or URL prefix loader sources may be read from, besides the project (repeatable; also $SEXPGPU_DATA_ROOTS, comma-separated)")


def data_roots_from(args: argparse.Namespace) -> tuple[str, ...]:
    """--data-root values, then $SEXPGPU_DATA_ROOTS's; folders made absolute."""
    declared = [*args.data_roots, *(part.strip() for part in os.environ.get(DATA_ROOTS_VARIABLE, "").split(",") if part.strip())]
    return tuple(root if "://" in root else os.path.abspath(os.path.expanduser(root)) for root in declared)


def add_threads_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=positive_int, default=None, metavar="N",
                        help="the CPU's BLAS threads (default: a continued run's from run.json, else chosen from the run's work and the free cores; also $SEXPGPU_THREADS)")


def blas_choice_problem_fails() -> None:
    """A malformed $SEXPGPU_BLAS, or one naming a BLAS not installed, is a usage error here, before anything runs."""
    from ..runtime.cpu.device import blas_choice_problem

    problem = blas_choice_problem(os.environ)
    if problem is not None:
        fail_usage(problem)


def threads_from(args: argparse.Namespace) -> Optional[int]:
    """--threads; a malformed thread variable is a usage error here, before anything runs."""
    from ..runtime.threads import BLAS_VARIABLES, THREADS_VARIABLE

    for variable in (THREADS_VARIABLE, *BLAS_VARIABLES):
        text = os.environ.get(variable, "").strip()
        if text and (not text.isdigit() or int(text) < 1):
            fail_usage(f"${variable}={text!r}: use a whole number of threads, 1 or more")
    blas_choice_problem_fails()
    threads: Optional[int] = args.threads
    return threads
