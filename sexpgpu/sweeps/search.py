"""Sweeps that search: sampled points and successive halving, read from a defsweep's
literal forms by the pre-read (selection.py).

    (defsweep s :sample 32 :seed 0
      :lr (log-uniform 1e-4 1e-2) :width (choice 64 128 256) :dropout (uniform 0.0 0.3)
      :halving (:metric val/loss :mode :min :rungs (100 300 900) :keep 1/3))

Point N draws each knob from its own generator, keyed by (seed, N, knob), so point N is the
same point whatever :sample says and whichever other knobs the sweep has. A drawn float is
rounded to 4 significant digits, so that a point reads back as `--set lr=0.0003162`.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Optional, cast

from ..ir.experiment import Experiment, Halving, HalvingMode, Scheduler
from ..lisp.conditions import LispError, lisp_error
from ..lisp.data import as_data
from ..lisp.types import Cons, Symbol
from .philox import PhiloxStream

DISTRIBUTIONS = {
    "UNIFORM": "(uniform LOW HIGH): a float in [LOW, HIGH)",
    "LOG-UNIFORM": "(log-uniform LOW HIGH): a float whose logarithm is uniform, 0 < LOW < HIGH",
    "INT-UNIFORM": "(int-uniform LOW HIGH): an integer from LOW to HIGH, both included (64-bit integers)",
    "CHOICE": "(choice V ...): one of the values, each as likely",
}
SIGNIFICANT = 4


INT64 = 2**63  # an int-uniform's bounds are 64-bit integers, as NumPy's draws were


def problem(text: str) -> LispError:
    return lisp_error("C008", text, "PROGRAM-ERROR")


@dataclass(frozen=True)
class Distribution:
    """Where a sampled sweep draws one knob from."""

    kind: str  # a key of DISTRIBUTIONS
    values: tuple[Any, ...]  # (LOW, HIGH), or the choices

    def draw(self, rng: PhiloxStream) -> Any:
        if self.kind == "CHOICE":
            return self.values[int(rng.integers(len(self.values)))]
        low, high = self.values
        if self.kind == "INT-UNIFORM":
            return int(rng.integers(int(low), int(high) + 1))
        if self.kind == "LOG-UNIFORM":
            return rounded(math.exp(rng.uniform(math.log(low), math.log(high))))
        return rounded(rng.uniform(low, high))

    def show(self) -> str:
        return f"({self.kind.lower()} {' '.join(map(str, self.values))})"


def rounded(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT}g}")


def number(x: Any) -> Optional[float]:
    if type(x) in (int, float, Fraction):
        return float(x)
    return None


def distribution(sweep: str, knob: str, form: Any) -> Distribution:
    """The distribution FORM writes: one of DISTRIBUTIONS, or a literal list of choices."""
    where = f"defsweep {sweep}: :{knob}"
    if type(form) is Cons and type(form.car) is Symbol and form.car.name in DISTRIBUTIONS:
        kind, args = form.car.name, list(form)[1:]
        if kind == "CHOICE":
            if not args:
                raise problem(f"{where} (choice) needs at least one value")
            return Distribution(kind, tuple(as_data(a, form=True) for a in args))
        bounds = [number(a) for a in args]
        if len(bounds) != 2 or bounds[0] is None or bounds[1] is None:
            raise problem(f"{where} {as_data(form, form=True)!r}: expected {DISTRIBUTIONS[kind]}")
        low, high = bounds[0], bounds[1]
        if not low < high or (kind == "LOG-UNIFORM" and low <= 0) or (kind == "INT-UNIFORM" and not (low.is_integer() and high.is_integer() and -INT64 <= low and high < INT64)):
            raise problem(f"{where} {as_data(form, form=True)!r}: expected {DISTRIBUTIONS[kind]}")
        return Distribution(kind, (low, high))
    values = as_data(form, form=True)
    if isinstance(values, list) and values:
        return Distribution("CHOICE", tuple(values))
    known = "; ".join(DISTRIBUTIONS.values())
    raise problem(f"{where} needs a distribution or a list of values to choose from ({known}), got {values!r}")


def point_generator(seed: int, point: int, knob: str) -> PhiloxStream:
    digest = hashlib.sha256(f"sweep-sample:{seed}:{point}:{knob}".encode()).digest()
    return PhiloxStream(int.from_bytes(digest[:16], "little"))


def sampled_points(seed: int, count: int, axes: dict[str, Distribution]) -> list[dict[str, Any]]:
    return [{knob: dist.draw(point_generator(seed, n, knob)) for knob, dist in axes.items()} for n in range(count)]


SCHEDULERS: dict[str, Scheduler] = {"SYNC": "sync", "ASHA": "asha", "MEDIAN": "median"}
HALVING_OPTIONS = ("METRIC", "MODE", "RUNGS", "KEEP", "SCHEDULER")


def halving(sweep: str, form: Any) -> Halving:
    """:halving (:metric EVAL/METRIC :mode :min|:max :rungs (STEP ...) :keep FRACTION
    :scheduler :sync|:asha|:median); the median rule takes no :keep."""
    where = f"defsweep {sweep} :halving"
    items = list(form) if type(form) is Cons else []
    if not items or len(items) % 2 or not all(type(k) is Symbol and k.is_keyword for k in items[::2]):
        raise problem(f"{where} needs (:metric EVAL/METRIC :mode :min :rungs (STEP ...) :keep FRACTION)")
    options = {k.name: v for k, v in zip(items[::2], items[1::2])}
    unknown = sorted(set(options) - set(HALVING_OPTIONS))
    if unknown:
        raise problem(f"{where}: unknown option :{unknown[0].lower()} (options: {' '.join(':' + o.lower() for o in HALVING_OPTIONS)})")
    metric = options.get("METRIC")
    if type(metric) is not Symbol or "/" not in metric.name:
        raise problem(f"{where} :metric needs an eval's metric as EVAL/METRIC, such as val/loss")
    mode = options.get("MODE")
    if type(mode) is not Symbol or not mode.is_keyword or mode.name not in ("MIN", "MAX"):
        raise problem(f"{where} :mode needs :min (lower is better) or :max")
    rungs = as_data(options.get("RUNGS"), form=True)
    if not isinstance(rungs, list) or not rungs or not all(type(r) is int and r > 0 for r in rungs) or rungs != sorted(set(rungs)):
        raise problem(f"{where} :rungs needs increasing positive step counts, such as (100 300 900)")
    scheduler = scheduler_of(where, options.get("SCHEDULER"))
    if scheduler == "median":
        if "KEEP" in options:
            raise problem(f"{where} :keep: the median rule keeps what is at least as good as the median; remove :keep, or use :scheduler :sync or :asha")
        return Halving(metric=metric.name.lower(), mode=cast(HalvingMode, mode.name.lower()), rungs=rungs, keep=0.5, keep_text="1/2", scheduler=scheduler)
    keep = options.get("KEEP")
    fraction = number(keep)
    if fraction is None or not 0 < fraction < 1:
        raise problem(f"{where} :keep needs a fraction between 0 and 1, such as 1/3")
    text = f"{keep.numerator}/{keep.denominator}" if type(keep) is Fraction else f"{fraction:g}"
    return Halving(metric=metric.name.lower(), mode=cast(HalvingMode, mode.name.lower()), rungs=rungs, keep=fraction, keep_text=text, scheduler=scheduler)


def scheduler_of(where: str, form: Any) -> Scheduler:
    """:scheduler's keyword (none: :sync, today's successive halving)."""
    if form is None:
        return "sync"
    if type(form) is not Symbol or not form.is_keyword or form.name not in SCHEDULERS:
        raise problem(f"{where} :scheduler needs :sync (every point to each rung, then the best go on), "
                      ":asha (each point decided as it reaches a rung) or :median (the median stopping rule)")
    return SCHEDULERS[form.name]


def halving_problem(plan: Halving, experiment: Experiment) -> Optional[str]:
    """What makes PLAN impossible for the compiled point EXPERIMENT: an eval or a metric the
    file does not declare, a rung at or past the run's :steps."""
    evals = {e.name: e for e in experiment.evals}
    spec = evals.get(plan.eval)
    if spec is None:
        known = ", ".join(evals) or "none: add (defeval NAME :loader L :every N)"
        return f":halving :metric {plan.metric}: the file has no defeval {plan.eval} (evals: {known})"
    metric = plan.metric.split("/", 1)[1]
    if spec.metrics and metric not in spec.metrics:
        return f":halving :metric {plan.metric}: eval {plan.eval} measures {', '.join(spec.metrics)}, not {metric}"
    late = [r for r in plan.rungs if r >= experiment.run.steps]
    if late:
        return f":halving :rungs: rung {late[0]} is not before the run's last step ({experiment.run.steps}); rungs are where points are compared on the way"
    return None
