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
from .data import BatchStream, DataError, FieldSpec, LoaderSpec, PrepareStep, SourceSpec, load_dataset
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
        self.train_program = CompiledProgram(experiment.module.programs["train"])
        self.update_program = CompiledProgram(experiment.module.programs["update"])
        loader = experiment.loaders["train"]
        self.dataset = load_dataset(loader_spec(loader, seed))
        self.stream = BatchStream(self.dataset, loader.batch, loader.shuffle, seed)
        self.field_names = [f.name for f in loader.fields]
        self.step = 0
        self.step_input = np.zeros((), dtype=np.float32)
        self.random_step = np.zeros((), dtype=np.int64)
        self.train_uses_step = "ctx.step" in self.train_program.input_ids

    def train_step(self) -> dict[str, Any]:
        batch = self.stream.next()
        feeds: dict[str, np.ndarray] = dict(self.params)
        for name in self.field_names:
            feeds[f"data.{name}"] = batch[name]
        if self.train_uses_step:
            self.random_step[...] = self.step
            feeds["ctx.step"] = self.random_step
        out = self.train_program.run(feeds)
        self.step_input[...] = self.step
        update_feeds: dict[str, np.ndarray] = {**self.params, **self.states, "ctx.step": self.step_input}
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
    status.update(state="running")
    record: dict[str, Any] = {}
    log_every = max(1, experiment.run.log_every)
    batch = experiment.loaders["train"].batch
    window_start = time.time()
    window_steps = 0
    reason, code = "finished", 0
    for step in range(steps):
        record = trainer.train_step()
        window_steps += 1
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
    if options.progress:
        sys.stderr.write("\n")
    wall = time.time() - started
    final = {"loss": record.get("loss", float("nan")), **record.get("metrics", {})}
    summary = Summary(wall_time_s=wall, examples_seen=trainer.stream.state().examples, tokens_seen=trainer.stream.state().tokens, exit_code=code, reason=reason)
    status.update(state="finished" if code == 0 else "failed", step=trainer.step, summary=summary)
    emit(events, "run.end", step=trainer.step, exit_code=code, reason=reason, wall_time_s=wall, final=final)
    folder.close()
    return RunResult(slug=name, folder=folder.url, steps=trainer.step, final_loss=record.get("loss"), metrics=record.get("metrics", {}), wall_time_s=wall, exit_code=code, reason=reason)


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
