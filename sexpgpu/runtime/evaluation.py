"""Evaluation passes (defeval) and targets (deftarget): exact means over a whole loader, the
best value of each metric so far, and the first target that holds."""

from __future__ import annotations

import time
from typing import Any, Optional

from ..ir.experiment import EvalSpec, Experiment
from ..outcome import EvalSeen, TargetHit
from .backend import Backend, RunnableProgram, Say, made
from .bounds import check_bounds, index_bounds
from .data.load import load_dataset
from .data.spec import DataError, Dataset, loader_spec, shared_examples
from .events import EventLog
from .status import StatusWriter


class EvalPass:
    """One defeval: the whole loader, full batches through its program and the examples of
    the last partial batch one by one, so every example counts once and exactly."""

    def __init__(self, experiment: Experiment, spec: EvalSpec, train_data: Dataset, backend: Backend, data_roots: tuple[str, ...] = (),
                 say: Optional[Say] = None) -> None:
        self.spec = spec
        record = experiment.loaders[spec.loader]
        self.dataset = load_dataset(loader_spec(record, experiment.run.seed, data_roots))
        check_bounds(self.dataset, index_bounds(experiment.module.programs[f"eval:{spec.name}"]), spec.loader)
        if not spec.overlap and spec.loader != "train":
            shared = shared_examples(train_data, self.dataset)
            if shared:
                raise DataError(
                    f"eval {spec.name} shares {len(shared)} example(s) with train (first: example {shared[0]}); "
                    "split the data, or declare the overlap with (defeval ... :overlap t)",
                    loader=spec.loader,
                )
        self.batch = record.batch
        self.fields = [f.name for f in record.fields]
        self.full = made(backend, experiment.module.programs[f"eval:{spec.name}"], say)
        self.single = made(backend, experiment.module.programs[f"eval:{spec.name}:1"], say)

    def run(self, params: dict[str, Any]) -> dict[str, float]:
        totals: dict[str, float] = {m: 0.0 for m in self.spec.metrics}
        n = self.dataset.n
        full_batches = n // self.batch
        for b in range(full_batches):
            rows = slice(b * self.batch, (b + 1) * self.batch)
            self._accumulate(self.full, params, rows, self.batch, totals)
        for i in range(full_batches * self.batch, n):
            self._accumulate(self.single, params, slice(i, i + 1), 1, totals)
        return {m: totals[m] / n for m in self.spec.metrics}

    def _accumulate(self, program: RunnableProgram, params: dict[str, Any], rows: slice, count: int, totals: dict[str, float]) -> None:
        feeds = dict(params)
        for name in self.fields:
            feeds[f"data.{name}"] = self.dataset.fields[name][rows]
        out = program.run(feeds)
        for m in self.spec.metrics:
            totals[m] += float(out[f"metric:{m}"]) * count


class Evaluations:
    """Every evaluation pass of a run: what each measured last, the best value of each metric
    so far (both go into checkpoints), and the targets they are held to."""

    def __init__(self, experiment: Experiment, train_data: Dataset, backend: Backend, data_roots: tuple[str, ...] = (),
                 say: Optional[Say] = None) -> None:
        self.experiment = experiment
        self.passes = {e.name: EvalPass(experiment, e, train_data, backend, data_roots, say) for e in experiment.evals}
        self.done: dict[str, dict[str, float]] = {}
        self.done_at: dict[str, int] = {}  # the step of each pass in `done`
        self.best: dict[str, float] = {}

    def due(self, step: int) -> list[EvalSpec]:
        return [e for e in self.experiment.evals if e.every and step % e.every == 0]

    def at_end(self, step: int) -> list[EvalSpec]:
        """The passes the end of training owes: `:at-end` ones, and those whose cadence did
        not fall on the last step."""
        return [e for e in self.experiment.evals if e.at_end or (e.every and step % e.every != 0)]

    def state(self) -> dict[str, Any]:
        return {"done": self.done, "done_at": self.done_at, "best": self.best}

    def restore(self, state: dict[str, Any]) -> None:
        self.done = dict(state.get("done", {}))
        self.done_at = {k: int(v) for k, v in state.get("done_at", {}).items()}
        self.best = dict(state.get("best", {}))

    def last(self) -> dict[str, float]:
        return {f"{name}/{k}": v for name, metrics in self.done.items() for k, v in metrics.items()}

    def last_step(self) -> Optional[int]:
        return max(self.done_at.values(), default=None)

    def seen(self) -> dict[str, EvalSeen]:
        """The latest pass of each defeval (a checkpoint from before steps were kept: step 0)."""
        return {name: EvalSeen(step=self.done_at.get(name, 0), metrics=dict(metrics)) for name, metrics in self.done.items()}

    def run(self, due: list[EvalSpec], params: dict[str, Any], step: int, events: EventLog, status: StatusWriter) -> Optional[TargetHit]:
        """Run the DUE passes; returns the target that now holds, if any."""
        if not due:
            return None
        status.update(state="evaluating")
        reached: Optional[TargetHit] = None
        for spec in due:
            started = time.time()
            metrics = self.passes[spec.name].run(params)
            self.done[spec.name] = metrics
            self.done_at[spec.name] = step
            for k, v in metrics.items():
                key = f"{spec.name}/{k}"
                if key not in self.best or (v > self.best[key] if higher_is_better(k) else v < self.best[key]):
                    self.best[key] = v
            events.emit({"kind": "eval", "step": step, "name": spec.name, "metrics": metrics, "seconds": time.time() - started})
            for target in self.experiment.targets:
                if target.eval == spec.name and reached is None and target.holds(metrics[target.metric]):
                    reached = TargetHit(metric=f"{target.eval}/{target.metric}", test=target.test, threshold=target.value,
                                        value=metrics[target.metric], step=step)
                    events.emit({"kind": "target", "step": step, "metric": reached.metric, "value": reached.value, "threshold": target.value})
        status.update(state="running", last_eval=self.last(), last_eval_step=step)
        return reached


def higher_is_better(metric: str) -> bool:
    """Best-so-far: accuracy-like metrics are maximized, everything else minimized."""
    return any(word in metric for word in ("acc", "f1", "precision", "recall", "auc"))
