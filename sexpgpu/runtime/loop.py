"""The one fixed training loop: batch, forward + backward, update; log; repeat.

`sexpgpu run`, bundles and workers all train through `train`. It takes a compiled
experiment (IR, loader specs, parameter specs, run spec) and writes the run folder through
the store; it knows neither Lisp nor the compiler.
"""

from __future__ import annotations

import math
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
from pydantic import BaseModel

from ..ir.experiment import Experiment, LoaderRecord
from ..ir.dtypes import DType, numpy_dtype
from .data import BatchStream, DataError, Dataset, FieldSpec, LoaderSpec, PrepareStep, SourceSpec, load_dataset, shared_examples
from .init import initial_value
from .numpy_backend import CompiledProgram
from .runfolder import RunFolder, RunInfo, Selection, slug
from .status import Summary
from .store import Store


@dataclass
class RunOptions:
    store: str = "./runs"
    device: str = "cpu"
    max_steps: Optional[int] = None
    progress: bool = False
    sources: dict[str, bytes] = field(default_factory=dict)


class RunResult(BaseModel):
    slug: str
    folder: str
    steps: int
    final_loss: Optional[float]
    metrics: dict[str, float]
    wall_time_s: float
    exit_code: int
    reason: str


def loader_spec(record: LoaderRecord, seed: int) -> LoaderSpec:
    return LoaderSpec(
        name=record.name,
        source=SourceSpec(kind=record.source["kind"], url=record.source.get("url"), options=record.source.get("options") or {}),
        prepare=[PrepareStep(kind=p["kind"], options=p.get("options") or {}) for p in record.prepare],
        fields=[FieldSpec(name=f.name, dtype=DType(f.dtype), shape=tuple(f.shape)) for f in record.fields],
        batch=record.batch,
        shuffle=record.shuffle,
        seed=seed,
        part=record.part,
        base_dir=record.base_dir,
    )


def run_slug(experiment: Experiment) -> str:
    sel = experiment.selection
    return slug(experiment.file_stem, sel.variant, sel.sweep, sel.point, experiment.ir_hash, experiment.knob_values())


class Evaluator:
    """One defeval: the whole loader, full batches through its program and the examples of
    the last partial batch one by one, so every example counts once and exactly."""

    def __init__(self, experiment: Experiment, name: str, train_data: Dataset) -> None:
        spec = next(e for e in experiment.evals if e.name == name)
        self.spec = spec
        record = experiment.loaders[spec.loader]
        self.dataset = load_dataset(loader_spec(record, experiment.run.seed))
        if not spec.overlap and spec.loader != "train":
            shared = shared_examples(train_data, self.dataset)
            if shared:
                raise DataError(
                    f"eval {name} shares {len(shared)} example(s) with train (first: example {shared[0]}); "
                    "split the data, or declare the overlap with (defeval ... :overlap t)",
                    loader=spec.loader,
                )
        self.batch = record.batch
        self.fields = [f.name for f in record.fields]
        self.full = CompiledProgram(experiment.module.programs[f"eval:{name}"])
        self.single = CompiledProgram(experiment.module.programs[f"eval:{name}:1"])

    def run(self, params: dict[str, np.ndarray]) -> dict[str, float]:
        totals: dict[str, float] = {m: 0.0 for m in self.spec.metrics}
        n = self.dataset.n
        full_batches = n // self.batch
        for b in range(full_batches):
            rows = slice(b * self.batch, (b + 1) * self.batch)
            self._accumulate(self.full, params, rows, self.batch, totals)
        for i in range(full_batches * self.batch, n):
            self._accumulate(self.single, params, slice(i, i + 1), 1, totals)
        return {m: totals[m] / n for m in self.spec.metrics}

    def _accumulate(self, program: CompiledProgram, params: dict[str, np.ndarray], rows: slice, count: int, totals: dict[str, float]) -> None:
        feeds = dict(params)
        for name in self.fields:
            feeds[f"data.{name}"] = self.dataset.fields[name][rows]
        out = program.run(feeds)
        for m in self.spec.metrics:
            totals[m] += float(out[f"metric:{m}"]) * count


class Trainer:
    """One run in progress: parameters, optimizer state, compiled programs, data stream."""

    def __init__(self, experiment: Experiment) -> None:
        self.experiment = experiment
        seed = experiment.run.seed
        self.params = {p.path: initial_value(p, seed) for p in experiment.params}
        self.states: dict[str, np.ndarray] = {}
        for group in experiment.groups:
            for path in group.params:
                for state in group.states:
                    self.states[f"state:{path}:{state.name}"] = np.zeros_like(self.params[path])
        self.update_program = CompiledProgram(experiment.module.programs["update"])
        loader = experiment.loaders["train"]
        self.dataset = load_dataset(loader_spec(loader, seed))
        self.field_names = [f.name for f in loader.fields]
        # one compiled program and one data stream per loader stage (None: no stage)
        self.programs: dict[Optional[str], CompiledProgram] = {None: CompiledProgram(experiment.module.programs["train"])}
        self.streams: dict[Optional[str], BatchStream] = {None: BatchStream(self.dataset, loader.batch, loader.shuffle, seed)}
        for stage in loader.stages:
            staged = loader.staged(stage.name)
            data = self.dataset if staged.prepare == loader.prepare else load_dataset(loader_spec(staged, seed))
            self.programs[stage.name] = CompiledProgram(experiment.module.programs[f"train@{stage.name}"])
            self.streams[stage.name] = BatchStream(data, staged.batch, staged.shuffle, seed)
        self.stage_names: list[Optional[str]] = [None] + [s.name for s in loader.stages]
        programs = experiment.module.programs
        self.diagnostic_program = CompiledProgram(programs["train:diagnostics"]) if "train:diagnostics" in programs else None
        self.curriculum = experiment.curriculum
        self.curriculum_program = CompiledProgram(experiment.module.programs["curriculum"]) if self.curriculum else None
        self.stage: Optional[str] = self.curriculum.start.get("train") if self.curriculum else None
        self.train_program = self.programs[self.stage]
        self.stream = self.streams[self.stage]
        self.step = 0
        self.step_input = np.zeros((), dtype=np.float32)
        self.random_step = np.zeros((), dtype=np.int64)
        self.train_uses_step = "rng.step" in self.train_program.input_ids
        self.ctx_names = [name for name in self.update_program.input_ids if name.startswith("ctx.")]
        self.ctx_arrays = {name: np.zeros((), dtype=np.float32) for name in self.ctx_names}
        self.started = time.time()
        self.last_loss = float("nan")
        self.stage_index = self.stage_names.index(self.stage)
        self.microbatches = experiment.run.microbatches

    def ctx_values(self) -> dict[str, float]:
        """Every ctx key at this step boundary (runfile.md's list)."""
        examples, tokens = self.seen()
        return {
            "step": float(self.step), "epoch": float(self.stream.state().epoch), "examples": float(examples),
            "tokens": float(tokens), "stage": float(self.stage_index), "elapsed": time.time() - self.started,
            "loss": self.last_loss, "seed": float(self.experiment.run.seed), "rank": 0.0, "world-size": 1.0,
            "microbatch": float(self.microbatches),
        }

    def seen(self) -> tuple[int, int]:
        """Examples and tokens seen so far, over every stage's stream."""
        states = [stream.state() for stream in self.streams.values()]
        return sum(s.examples for s in states), sum(s.tokens for s in states)

    def ctx_feeds(self) -> dict[str, np.ndarray]:
        if not self.ctx_names:
            return {}
        values = self.ctx_values()
        for name in self.ctx_names:
            self.ctx_arrays[name][...] = values[name[4:]]
        return self.ctx_arrays

    def diagnose(self, out: dict[str, np.ndarray], before: dict[str, np.ndarray]) -> dict[str, float]:
        """The selected diagnostics at a sampled step: the IR ones from the train program's
        extra outputs, the others from the gradients, parameters and optimizer state."""
        spec = self.experiment.run.diagnostics
        assert spec is not None
        from ..compile.compiler import glob_match

        def wanted(name: str) -> bool:
            return any(glob_match(g.replace("/", "."), name.replace("/", ".")) for g in spec.select)

        values = {k[5:]: float(v) for k, v in out.items() if k.startswith("diag:")}
        for path, param in self.params.items():
            grad = out.get(f"grad:{path}")
            candidates = {
                f"grad-norm/{path}": (lambda g=grad: float(np.linalg.norm(g))) if grad is not None else None,
                f"param-norm/{path}": lambda p=param: float(np.linalg.norm(p)),
                f"update-ratio/{path}": lambda p=param, b=before[path]: float(np.linalg.norm(p - b) / max(np.linalg.norm(b), 1e-12)),
            }
            for name, compute in candidates.items():
                if compute is not None and wanted(name):
                    values[name] = compute()
        for key, state in self.states.items():
            _, path, slot = key.split(":")
            name = f"optim/{slot}/{path}"
            if wanted(name):
                values[name] = float(np.linalg.norm(state))
        return values

    def forward_backward(self, microbatch: int) -> dict[str, np.ndarray]:
        batch = self.stream.next()
        feeds: dict[str, np.ndarray] = dict(self.params)
        for name in self.field_names:
            feeds[f"data.{name}"] = batch[name]
        if self.train_uses_step:
            # random ops are keyed by (step, microbatch) so microbatches draw different bits
            self.random_step[...] = self.step * self.microbatches + microbatch
            feeds["rng.step"] = self.random_step
        return self.train_program.run(feeds)

    def accumulated(self) -> dict[str, Any]:
        """One optimizer step's gradients: the mean over the microbatches (equal to the
        gradient of the whole batch up to reduction order), and the mean loss and metrics."""
        out = self.forward_backward(0)
        if self.microbatches == 1:
            return out
        sums = {k: np.array(v, dtype=np.float64 if k == "loss" or k.startswith("metric:") else v.dtype, copy=True) for k, v in out.items()}
        for m in range(1, self.microbatches):
            for k, v in self.forward_backward(m).items():
                sums[k] += v
        scale = 1.0 / self.microbatches
        return {k: (v * scale).astype(out[k].dtype) for k, v in sums.items()}

    def choose_stage(self) -> Optional[str]:
        """Run the curriculum at this step boundary; returns the new stage when it changes."""
        if self.curriculum_program is None or self.curriculum is None:
            return None
        values = self.ctx_values()
        feeds = {name: np.float32(values[name[4:]]) for name in self.curriculum_program.input_ids}
        held = self.curriculum_program.run(feeds)
        stage = self.curriculum.start.get("train")
        for i, rule in enumerate(self.curriculum.rules):
            if bool(held[f"rule:{i}"]) and "train" in rule:
                stage = rule["train"]
        if stage == self.stage:
            return None
        self.stage = stage
        self.stage_index = self.stage_names.index(stage)
        self.train_program = self.programs[stage]
        self.stream = self.streams[stage]
        return stage

    def train_step(self) -> dict[str, Any]:
        changed = self.choose_stage()
        spec = self.experiment.run.diagnostics
        sampled = spec is not None and (self.step + 1) % spec.every == 0
        if sampled and self.diagnostic_program is not None and self.stage is None:
            self.train_program = self.diagnostic_program
        try:
            out = self.accumulated()
        finally:
            self.train_program = self.programs[self.stage]
        before = {p: v.copy() for p, v in self.params.items()} if sampled else {}
        self.last_loss = float(out["loss"])
        update_feeds: dict[str, np.ndarray] = {**self.params, **self.states, **self.ctx_feeds()}
        for key, value in out.items():
            if key.startswith("grad:"):
                update_feeds[key] = value
        new = self.update_program.run(update_feeds)
        for key, value in new.items():
            if key.startswith("param:"):
                self.params[key[6:]][...] = value
            elif key.startswith("state:"):
                self.states[key][...] = value
        self.step += 1
        record = {"loss": float(out["loss"]), "grad_norm": float(new["grad-norm"])}
        record["metrics"] = {k[7:]: float(v) for k, v in out.items() if k.startswith("metric:")}
        record["lr"] = {k[3:]: float(v) for k, v in new.items() if k.startswith("lr:")}
        record["stage"] = changed
        record["diagnostics"] = self.diagnose(out, before) if sampled else None
        return record


def emit(events: Any, kind: str, **fields: Any) -> None:
    events.emit({"kind": kind, **fields})


def train(experiment: Experiment, options: RunOptions, say: Callable[[str], None] = print) -> RunResult:
    """Train EXPERIMENT to the end, writing its run folder. DataError propagates (exit 5)."""
    started = time.time()
    store = Store.open(options.store)
    name = run_slug(experiment)
    folder = RunFolder(store, name)
    steps = experiment.run.steps if options.max_steps is None else min(options.max_steps, experiment.run.steps)
    say(f"{name}  {folder.url}")
    write_header(folder, experiment, name, options)
    events, status = folder.events, folder.status
    status.update(state="compiling", step=0, steps=steps, attempt=1, host=socket.gethostname())
    emit(events, "run.start", step=0, slug=name, steps=steps)
    emit(events, "compile", step=0, ir_hash=experiment.ir_hash, params=sum(int(np.prod(p.shape)) for p in experiment.params))
    trainer = Trainer(experiment)
    evaluators = {e.name: Evaluator(experiment, e.name, trainer.dataset) for e in experiment.evals}
    evals_done: dict[str, dict[str, float]] = {}
    best: dict[str, float] = {}
    target_step: Optional[int] = None
    status.update(state="running")
    record: dict[str, Any] = {}
    log_every = max(1, experiment.run.log_every)
    batch = experiment.loaders["train"].batch * experiment.run.microbatches
    window_start = time.time()
    window_steps = 0
    reason, code = "finished", 0
    for step in range(steps):
        record = trainer.train_step()
        window_steps += 1
        if record.get("diagnostics") is not None:
            emit(events, "diagnostic", step=step + 1, values=record["diagnostics"])
        if record.get("stage"):
            emit(events, "stage", step=step, name=record["stage"], loader="train", index=trainer.stage_index)
        if not math.isfinite(record["loss"]):
            reason, code = f"non-finite loss {record['loss']} at step {step + 1}", 1
            emit(events, "nonfinite", step=step + 1, loss=record["loss"])
            break
        if (step + 1) % log_every == 0 or step + 1 == steps:
            elapsed = time.time() - window_start
            step_time = elapsed / max(window_steps, 1)
            emit(events, "step",
                step=step + 1,
                loss=record["loss"],
                metrics=record["metrics"],
                lr=record["lr"],
                grad_norm=record["grad_norm"],
                step_time=step_time,
                examples_per_s=batch / step_time if step_time > 0 else None,
            )
            eta = step_time * (steps - step - 1)
            status.update(step=step + 1, metrics={"loss": record["loss"], **record["metrics"]}, eta_s=eta)
            if options.progress:
                sys.stderr.write(f"\rstep {step + 1}/{steps}  loss {record['loss']:.4f}  {1 / step_time if step_time else 0:.0f} steps/s  ETA {eta:.0f}s   ")
                sys.stderr.flush()
            window_start, window_steps = time.time(), 0
        due = [e for e in experiment.evals if e.every and (step + 1) % e.every == 0]
        reached = run_evals(due, evaluators, trainer, step + 1, events, status, evals_done, best, experiment)
        if reached:
            target_step, reason = step + 1, f"target reached: {reached}"
            break
    at_end = [e for e in experiment.evals if e.at_end or (e.every and trainer.step % e.every != 0)]
    if code == 0 and target_step is None and at_end:
        reached = run_evals(at_end, evaluators, trainer, trainer.step, events, status, evals_done, best, experiment)
        if reached:
            target_step, reason = trainer.step, f"target reached: {reached}"
    if options.progress:
        sys.stderr.write("\n")
    wall = time.time() - started
    final = {"loss": record.get("loss", float("nan")), **record.get("metrics", {})}
    last_eval = {f"{name}/{k}": v for name, metrics in evals_done.items() for k, v in metrics.items()}
    summary = Summary(last_eval=last_eval, best_eval=best, target_reached_at_step=target_step, wall_time_s=wall, examples_seen=trainer.seen()[0], tokens_seen=trainer.seen()[1], exit_code=code, reason=reason)
    status.update(state="finished" if code == 0 else "failed", step=trainer.step, summary=summary)
    emit(events, "run.end", step=trainer.step, exit_code=code, reason=reason, wall_time_s=wall, final=final)
    folder.close()
    return RunResult(slug=name, folder=folder.url, steps=trainer.step, final_loss=record.get("loss"), metrics=record.get("metrics", {}), wall_time_s=wall, exit_code=code, reason=reason)


def run_evals(
    due: list[Any], evaluators: dict[str, Evaluator], trainer: Trainer, step: int, events: Any, status: Any,
    done: dict[str, dict[str, float]], best: dict[str, float], experiment: Experiment,
) -> Optional[str]:
    """Run the due evaluation passes; returns the target that now holds, if any."""
    if not due:
        return None
    status.update(state="evaluating")
    reached = None
    for spec in due:
        started = time.time()
        metrics = evaluators[spec.name].run(trainer.params)
        done[spec.name] = metrics
        for k, v in metrics.items():
            key = f"{spec.name}/{k}"
            if key not in best or (v > best[key] if _higher_is_better(k) else v < best[key]):
                best[key] = v
        emit(events, "eval", step=step, name=spec.name, metrics=metrics, seconds=time.time() - started)
        for target in experiment.targets:
            if target.eval == spec.name and reached is None and target.holds(metrics[target.metric]):
                reached = f"{target.eval} {target.metric} {target.test} {target.value:g}"
                emit(events, "target", step=step, metric=f"{target.eval}/{target.metric}", value=metrics[target.metric], threshold=target.value)
    status.update(state="running", last_eval={f"{n}/{k}": v for n, m in done.items() for k, v in m.items()})
    return reached


def _higher_is_better(metric: str) -> bool:
    """Best-so-far: accuracy-like metrics are maximized, everything else minimized."""
    return any(word in metric for word in ("acc", "f1", "precision", "recall", "auc"))


def write_header(folder: RunFolder, experiment: Experiment, name: str, options: RunOptions) -> None:
    sel = experiment.selection
    info = RunInfo(
        slug=name,
        file=experiment.file,
        selection=Selection(variant=sel.variant, set=sel.set, sweep=sel.sweep, point=sel.point),
        knobs=experiment.knob_values(),
        source_hash=experiment.source_hash,
        ir_hash=experiment.ir_hash,
        devices=[options.device],
        meta=experiment.run.meta,
        max_steps=options.max_steps,
    )
    folder.write_run_info(info)
    folder.write_sources(options.sources)
    folder.write_ir(experiment.module.model_dump_json())


__all__ = ["train", "Trainer", "RunOptions", "RunResult", "DataError", "numpy_dtype"]
