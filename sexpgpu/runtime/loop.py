"""The one fixed training loop: batch, forward + backward, update; log; repeat.

`sexpgpu run`, bundles and workers all train through `train`. It takes a compiled
experiment (IR, loader specs, parameter specs, run spec) and writes the run folder through
the store; it knows neither Lisp nor the compiler.
"""

from __future__ import annotations

import math
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import numpy as np
from pydantic import BaseModel

from ..ir.experiment import Experiment, LoaderRecord
from ..ir.dtypes import DType, numpy_dtype
from ..ir.graph import TensorType
from ..ir.selectors import selects
from .data import BatchStream, DataError, Dataset, FieldSpec, LoaderSpec, PrepareStep, SourceSpec, load_dataset, shared_examples
from .init import initial_value
from .checkpoint import CheckpointState, ResumeError, list_checkpoints, load_checkpoint, resolve, step_name, write_checkpoint
from .checkpoint import prune as prune_checkpoints
from .numpy_backend import CompiledProgram, NonFiniteNode, first_nonfinite
from .backend import Backend, HostBackend, backend_for
from .ranks import Collective, rows_of
from .runfolder import RunFolder, RunInfo, run_slug
from .status import Summary
from .store import Store, StoreError


@dataclass
class RunOptions:
    store: str = "./runs"
    device: str = "cpu"
    max_steps: Optional[int] = None
    progress: bool = False
    sources: dict[str, bytes] = field(default_factory=dict)
    resume: Optional[str] = None  # "latest", a step, or a checkpoint folder
    signals: bool = True  # handle SIGINT/SIGTERM (only possible on the main thread)
    store_patience_s: float = 600.0  # how long the end of a run waits for an unreachable store
    ranks: Optional[Collective] = None  # data parallel: this process is one of W ranks
    # where tensors live and how IR programs run (None: from `device`); the tests pass the
    # CUDA executor over host-compiled kernels here
    backend: Optional[Backend] = None


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
        source=SourceSpec.model_validate(record.source.model_dump()),
        prepare=[PrepareStep.model_validate(p.model_dump()) for p in record.prepare],
        fields=[FieldSpec(name=f.name, dtype=DType(f.dtype), shape=tuple(f.shape)) for f in record.fields],
        batch=record.batch,
        shuffle=record.shuffle,
        seed=seed,
        part=record.part,
        base_dir=record.base_dir,
    )


def initial_state(init: Any, like: np.ndarray) -> np.ndarray:
    """An optimizer state slot as defstate :init says (:zeros, :ones or a number)."""
    value = {"zeros": 0.0, "ones": 1.0}.get(init.kind, init.value if init.kind == "constant" else None)
    if value is None:
        raise ValueError(f"defstate :init {init.kind} is not supported; use :zeros, :ones or a number")
    return np.full_like(like, value)


class Evaluator:
    """One defeval: the whole loader, full batches through its program and the examples of
    the last partial batch one by one, so every example counts once and exactly."""

    def __init__(self, experiment: Experiment, name: str, train_data: Dataset, make: Callable[[Any], Any] = CompiledProgram) -> None:
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
        self.full = make(experiment.module.programs[f"eval:{name}"])
        self.single = make(experiment.module.programs[f"eval:{name}:1"])

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

    def _accumulate(self, program: Any, params: dict[str, Any], rows: slice, count: int, totals: dict[str, float]) -> None:
        feeds = dict(params)
        for name in self.fields:
            feeds[f"data.{name}"] = self.dataset.fields[name][rows]
        out = program.run(feeds)
        for m in self.spec.metrics:
            totals[m] += float(out[f"metric:{m}"]) * count


class Trainer:
    """One run in progress: parameters, optimizer state, compiled programs, data stream."""

    def __init__(self, experiment: Experiment, ranks: Optional[Collective] = None, backend: Optional[Backend] = None) -> None:
        self.experiment = experiment
        self.backend: Backend = backend or HostBackend()
        make = self.backend.program
        self.ranks = ranks
        self.rank, self.world = (ranks.rank, ranks.world) if ranks is not None else (0, 1)
        if self.world > 1 and experiment.world != self.world:
            raise ValueError(f"the experiment was compiled for {experiment.world} rank(s), not {self.world}: compile it with world={self.world}")
        # each rank traces its train programs at batch/world; evaluation and the update are shared
        train_programs = experiment.rank_programs if self.world > 1 else experiment.module.programs
        seed = experiment.run.seed
        update = experiment.module.programs["update"]
        # parameters (frozen ones too: the update does not read them), optimizer state and
        # gradients: their types, and the backend's resident arrays
        self.types = {p.path: TensorType(dtype=p.dtype, shape=tuple(p.shape)) for p in experiment.params}
        self.types.update({i.name: i.type for i in update.inputs})
        host_params = {p.path: initial_value(p, seed) for p in experiment.params}
        self.params = {path: self.backend.put(value, self.types[path]) for path, value in host_params.items()}
        self.states: dict[str, Any] = {}
        for group in experiment.groups:
            for path in group.params:
                for state in group.states:
                    key = f"state:{path}:{state.name}"
                    self.states[key] = self.backend.put(initial_state(state.init, host_params[path]), self.types[key])
        self.update_program = make(update)
        self.kept_updates = frozenset(k for k in update.outputs if k.startswith(("param:", "state:")))
        loader = experiment.loaders["train"]
        self.dataset = load_dataset(loader_spec(loader, seed))
        self.field_names = [f.name for f in loader.fields]
        # one compiled program and one data stream per loader stage (None: no stage)
        self.programs: dict[Optional[str], Any] = {None: make(train_programs["train"])}
        self.streams: dict[Optional[str], BatchStream] = {None: BatchStream(self.dataset, loader.batch, loader.shuffle, seed)}
        for stage in loader.stages:
            staged = loader.staged(stage.name)
            data = self.dataset if staged.prepare == loader.prepare else load_dataset(loader_spec(staged, seed))
            self.programs[stage.name] = make(train_programs[f"train@{stage.name}"])
            self.streams[stage.name] = BatchStream(data, staged.batch, staged.shuffle, seed)
        self.stage_names: list[Optional[str]] = [None] + [s.name for s in loader.stages]
        programs = experiment.module.programs
        # each stage's train program with the selected IR diagnostics, for sampled steps; made
        # the first time its stage is sampled (on a device each holds a train-sized arena)
        self.make = make
        self.diagnostic_sources = {
            stage: train_programs[name] for stage in self.stage_names
            if (name := "train:diagnostics" if stage is None else f"train:diagnostics@{stage}") in train_programs
        }
        self.diagnostic_programs: dict[Optional[str], Any] = {}
        self.curriculum = experiment.curriculum
        self.curriculum_program = make(experiment.module.programs["curriculum"]) if self.curriculum else None
        self.stage: Optional[str] = self.curriculum.start.get("train") if self.curriculum else None
        self.train_program = self.programs[self.stage]
        self.stream = self.streams[self.stage]
        self.step = 0
        self.step_input = np.zeros((), dtype=np.float32)
        self.random_step = np.zeros((), dtype=np.int64)
        self.train_uses_step = "rng.step" in self.train_program.input_ids
        # gradients stay resident for the update, unless a collective reduces them on the host
        self.kept_grads = frozenset(k for k in self.types if k.startswith("grad:")) if self.world == 1 else frozenset()
        self.ctx_names = [name for name in self.update_program.input_ids if name.startswith("ctx.")]
        self.ctx_arrays = {name: np.zeros((), dtype=np.float32) for name in self.ctx_names}
        self.started = time.time()
        self.last_loss = float("nan")
        self.lr_scale = 1.0
        self.last_feeds: Optional[dict[str, np.ndarray]] = None
        self.stage_index = self.stage_names.index(self.stage)
        self.microbatches = experiment.run.microbatches

    def ctx_values(self) -> dict[str, float]:
        """Every ctx key at this step boundary (runfile.md's list)."""
        examples, tokens = self.seen()
        elapsed = time.time() - self.started
        if self.ranks is not None:  # every rank must see rank 0's clock, or stages could diverge
            elapsed = self.ranks.broadcast(elapsed)
        return {
            "step": float(self.step), "epoch": float(self.stream.state().epoch), "examples": float(examples),
            "tokens": float(tokens), "stage": float(self.stage_index), "elapsed": elapsed,
            "loss": self.last_loss, "seed": float(self.experiment.run.seed), "rank": float(self.rank), "world-size": float(self.world),
            "microbatch": float(self.microbatches), "lr-scale": self.lr_scale,
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

    def host_params(self) -> dict[str, np.ndarray]:
        return {path: self.backend.get(value, self.types[path]) for path, value in self.params.items()}

    def host_states(self) -> dict[str, np.ndarray]:
        return {key: self.backend.get(value, self.types[key]) for key, value in self.states.items()}

    def diagnose(self, out: dict[str, Any], before: dict[str, np.ndarray]) -> dict[str, float]:
        """The selected diagnostics at a sampled step: the IR ones from the train program's
        extra outputs, the others from the gradients, parameters and optimizer state."""
        spec = self.experiment.run.diagnostics
        assert spec is not None

        def wanted(name: str) -> bool:
            return selects(spec.select, name)

        values = {k[5:]: float(v) for k, v in out.items() if k.startswith("diag:")}
        for path, param in self.host_params().items():
            grad = out.get(f"grad:{path}")
            if grad is not None and f"grad:{path}" in self.kept_grads:
                grad = self.backend.get(grad, self.types[f"grad:{path}"])
            candidates = {
                f"grad-norm/{path}": (lambda g=grad: float(np.linalg.norm(g))) if grad is not None else None,
                f"param-norm/{path}": lambda p=param: float(np.linalg.norm(p)),
                f"update-ratio/{path}": lambda p=param, b=before[path]: float(np.linalg.norm(p - b) / max(np.linalg.norm(b), 1e-12)),
            }
            for name, compute in candidates.items():
                if compute is not None and wanted(name):
                    values[name] = compute()
        for key, state in self.host_states().items():
            _, path, slot = key.split(":")
            name = f"optim/{slot}/{path}"
            if wanted(name):
                values[name] = float(np.linalg.norm(state))
        return values

    def snapshot(self, slug: str, guard: dict[str, Any], evals: dict[str, Any]) -> CheckpointState:
        return CheckpointState(
            step=self.step,
            slug=slug,
            source_hash=self.experiment.source_hash,
            ir_hash=self.experiment.ir_hash,
            knobs=self.experiment.knob_values(),
            loaders={(name or ""): stream.state() for name, stream in self.streams.items()},
            stage=self.stage,
            ctx={k: v for k, v in self.ctx_values().items() if k != "elapsed"},
            rng_step=self.step,
            guard=guard,
            eval=evals,
        )

    def restore(self, params: dict[str, np.ndarray], states: dict[str, np.ndarray], state: CheckpointState) -> None:
        """Continue exactly where the checkpoint left off: parameters, optimizer state, every
        data stream's position and counters, the stage and the step (random bits are keyed
        by the step, so they continue too)."""
        for path, value in self.params.items():
            value[...] = self.backend.put(params[path], self.types[path])
        for key, value in self.states.items():
            value[...] = self.backend.put(states[key], self.types[key])
        for name, loader_state in state.loaders.items():
            self.streams[name or None].restore(loader_state)
        self.stage = state.stage
        self.stage_index = self.stage_names.index(self.stage)
        self.train_program = self.programs[self.stage]
        self.stream = self.streams[self.stage]
        self.step = state.step
        self.last_loss = state.ctx.get("loss", float("nan"))
        self.lr_scale = float(state.guard.get("lr_scale", 1.0))

    def replay_nonfinite(self) -> Optional[NonFiniteNode]:
        """Name the IR node that first produced a non-finite value in the last step."""
        if self.last_feeds is None:
            return None
        feeds = {k: self.backend.get(v, self.types[k]) if k in self.params else v for k, v in self.last_feeds.items()}
        return first_nonfinite(self.train_program.program, feeds)

    def forward_backward(self, microbatch: int) -> dict[str, Any]:
        batch = self.stream.next()
        feeds: dict[str, Any] = dict(self.params)
        for name in self.field_names:
            feeds[f"data.{name}"] = batch[name] if self.world == 1 else rows_of(batch[name], self.rank, self.world)
        if self.train_uses_step:
            # random ops are keyed by (step, microbatch, rank) so microbatches and ranks draw
            # different bits (one rank: the key is step * microbatches + microbatch)
            self.random_step[...] = (self.step * self.microbatches + microbatch) * self.world + self.rank
            feeds["rng.step"] = self.random_step
        out = self.train_program.run(feeds, keep=self.kept_grads)
        if microbatch == 0:
            # a non-finite step leaves the parameters untouched and every batch is a fresh
            # array, so a replay needs copies only of the step counter reused across steps
            self.last_feeds = dict(feeds)
            if "rng.step" in feeds:
                self.last_feeds["rng.step"] = self.random_step.copy()
        return out

    def accumulated(self) -> dict[str, Any]:
        """One optimizer step's gradients: the mean over the microbatches (equal to the
        gradient of the whole batch up to reduction order), and the mean loss and metrics."""
        out = self.forward_backward(0)
        if self.microbatches == 1:
            return out
        backend, kept = self.backend, self.kept_grads
        sums = {k: backend.add(None, v, self.types[k]) if k in kept else np.array(v, dtype=np.float64 if k == "loss" or k.startswith("metric:") else v.dtype, copy=True)
                for k, v in out.items()}
        for m in range(1, self.microbatches):
            for k, v in self.forward_backward(m).items():
                if k in kept:
                    sums[k] = backend.add(sums[k], v, self.types[k])
                else:
                    sums[k] += v
        scale = 1.0 / self.microbatches
        return {k: backend.scaled(v, scale, self.types[k]) if k in kept else (v * scale).astype(out[k].dtype) for k, v in sums.items()}

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
        if sampled and self.stage in self.diagnostic_sources:
            if self.stage not in self.diagnostic_programs:
                self.diagnostic_programs[self.stage] = self.make(self.diagnostic_sources[self.stage])
            self.train_program = self.diagnostic_programs[self.stage]
        try:
            out = self.accumulated()
        finally:
            self.train_program = self.programs[self.stage]
        if self.ranks is not None:
            out = self.ranks.reduce_step(out)
        before = self.host_params() if sampled else {}
        self.last_loss = float(out["loss"])
        update_feeds: dict[str, Any] = {**self.params, **self.states, **self.ctx_feeds()}
        for key, value in out.items():
            if key.startswith("grad:"):
                update_feeds[key] = value
        new = self.update_program.run(update_feeds, keep=self.kept_updates)
        finite = math.isfinite(float(out["loss"])) and math.isfinite(float(new["grad-norm"]))
        if finite:
            for key, value in new.items():
                if key.startswith("param:"):
                    self.params[key[6:]][...] = value
                elif key.startswith("state:"):
                    self.states[key][...] = value
        self.step += 1
        record = {"loss": float(out["loss"]), "grad_norm": float(new["grad-norm"]), "finite": finite}
        record["metrics"] = {k[7:]: float(v) for k, v in out.items() if k.startswith("metric:")}
        record["lr"] = {k[3:]: float(v) for k, v in new.items() if k.startswith("lr:")}
        record["stage"] = changed
        record["diagnostics"] = self.diagnose(out, before) if sampled else None
        return record


def peak_memory() -> Optional[int]:
    """The process's peak resident memory in bytes (what a step event reports as `memory`)."""
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB
    except (ImportError, OSError):  # not a POSIX system
        return None


def emit(events: Any, kind: str, **fields: Any) -> None:
    events.emit({"kind": kind, **fields})


def train(experiment: Experiment, options: RunOptions, say: Callable[[str], None] = print) -> RunResult:
    """Train EXPERIMENT to the end, writing its run folder. DataError propagates (exit 5),
    ResumeError too (exit 6)."""
    return Run(experiment, options, say).execute()


EXIT_STOPPED = 75


class Run:
    """One attempt of a run: resume if asked (or if the folder has a checkpoint), train,
    evaluate, checkpoint, stop cleanly on SIGINT/SIGTERM, guard against non-finite steps."""

    def __init__(self, experiment: Experiment, options: RunOptions, say: Callable[[str], None]) -> None:
        self.experiment = experiment
        self.options = options
        self.say = say
        self.store = Store.open(options.store)
        self.slug = run_slug(experiment)
        self.ranks = options.ranks
        self.writer = self.ranks is None or self.ranks.rank == 0
        # only rank 0 writes the run folder; the other ranks run the same loop and read the
        # shared store (resume), their own events and status go to a private in-memory store
        self.shared = RunFolder(self.store, self.slug)
        self.folder = self.shared if self.writer else RunFolder(Store.open(f"memory://sexpgpu-rank-{self.ranks.rank}-{id(self)}"), self.slug)
        spec = experiment.run
        self.steps = spec.steps if options.max_steps is None else min(options.max_steps, spec.steps)
        self.evals_done: dict[str, dict[str, float]] = {}
        self.best: dict[str, float] = {}
        self.target_step: Optional[int] = None
        self.signal: Optional[int] = None
        self.skipped_in_a_row = 0
        self.rolled_back = False
        self.last_checkpoint: Optional[str] = None
        self.attempt = 1

    # -- the attempt ----------------------------------------------------------------------------
    def execute(self) -> RunResult:
        started = time.time()
        previous = self.shared.read_status() if self.shared.exists() else None
        if previous is not None and previous.state == "finished" and self.options.resume is None and previous.step >= self.steps:
            self.say(f"{self.slug}  {self.folder.url}")
            self.say("already finished: nothing to do (pass --resume to continue from a checkpoint)")
            return self.result(previous.step, previous.metrics.get("loss"), {}, 0.0, 0, "already finished")
        resume = self.options.resume
        if resume is None and previous is not None and any(c.valid for c in list_checkpoints(self.store, self.slug)):
            resume = "latest"  # the same run again continues where it stopped
        self.attempt = (previous.attempt + 1) if previous is not None else 1
        self.say(f"{self.slug}  {self.folder.url}")
        loaded = self.load_resume(resume) if resume is not None else None  # refused: nothing written
        self.when_the_store_answers(lambda: write_header(self.folder, self.experiment, self.slug, self.options))
        events, status = self.folder.events, self.folder.status
        status.update(state="compiling", step=0, steps=self.steps, attempt=self.attempt, host=socket.gethostname(), summary=None)
        emit(events, "run.start", step=0, slug=self.slug, steps=self.steps, attempt=self.attempt)
        emit(events, "compile", step=0, ir_hash=self.experiment.ir_hash, params=sum(int(np.prod(p.shape)) for p in self.experiment.params))
        try:
            backend = self.options.backend or backend_for(self.options.device)
            trainer = Trainer(self.experiment, self.ranks, backend)
            self.trainer = trainer
            self.evaluators = {e.name: Evaluator(self.experiment, e.name, trainer.dataset, backend.program) for e in self.experiment.evals}
        except DataError as exc:
            status.update(state="failed", summary=Summary(exit_code=5, reason=f"data error: {exc}"))
            emit(events, "run.end", step=0, exit_code=5, reason=f"data error: {exc}")
            self.close_when_the_store_answers()
            raise
        if loaded is not None:
            self.apply_resume(*loaded)
        elif previous is not None:
            # an earlier attempt stopped before publishing any checkpoint: this one starts over,
            # and its events supersede that attempt's (readers keep one series)
            emit(events, "resume", step=0, from_step=0, checkpoint=None, attempt=self.attempt, reason="started over: no checkpoint had been published")
        status.update(state="running", step=trainer.step)
        with self.signal_handlers():
            try:
                reason, code = self.loop()
            except KeyboardInterrupt:
                reason, code = "interrupted twice: stopped at once (resume from the last checkpoint)", EXIT_STOPPED
                emit(events, "signal", step=trainer.step, signal="SIGINT", action="stopped at once")
        return self.finish(started, reason, code)

    def loop(self) -> tuple[str, int]:
        trainer, events, status, experiment = self.trainer, self.folder.events, self.folder.status, self.experiment
        log_every = max(1, experiment.run.log_every)
        # throughput counts training time only (not evals or checkpoints), and the examples
        # and tokens the streams really served (stages may change the batch)
        window_time, window_steps, window_seen = 0.0, 0, trainer.seen()
        self.record: dict[str, Any] = {}
        policy = experiment.run.checkpoint
        while trainer.step < self.steps:
            started = time.time()
            record = trainer.train_step()
            window_time += time.time() - started
            self.record = record
            step = trainer.step
            window_steps += 1
            if record.get("diagnostics") is not None:
                emit(events, "diagnostic", step=step, values=record["diagnostics"])
            if record.get("stage"):
                emit(events, "stage", step=step - 1, name=record["stage"], loader="train", index=trainer.stage_index)
            if not record["finite"]:
                outcome = self.guard(record)
                if outcome is not None:
                    return outcome
                continue
            self.skipped_in_a_row = 0
            if step % log_every == 0 or step == self.steps:
                step_time = window_time / max(window_steps, 1)
                seen = trainer.seen()
                examples, tokens = seen[0] - window_seen[0], seen[1] - window_seen[1]
                emit(events, "step", step=step, loss=record["loss"], metrics=record["metrics"], lr=record["lr"], grad_norm=record["grad_norm"],
                     step_time=step_time, examples_per_s=examples / window_time if window_time > 0 else None,
                     tokens_per_s=tokens / window_time if window_time > 0 and tokens else None, memory=peak_memory())
                eta = step_time * (self.steps - step)
                status.update(step=step, metrics={"loss": record["loss"], **record["metrics"]}, eta_s=eta)
                if self.options.progress:
                    sys.stderr.write(f"\rstep {step}/{self.steps}  loss {record['loss']:.4f}  {1 / step_time if step_time else 0:.0f} steps/s  ETA {eta:.0f}s   ")
                    sys.stderr.flush()
                window_time, window_steps, window_seen = 0.0, 0, trainer.seen()
            due = [e for e in experiment.evals if e.every and step % e.every == 0]
            reached = run_evals(due, self.evaluators, trainer, step, events, status, self.evals_done, self.best, experiment)
            if reached:
                self.target_step = step
                return f"target reached: {reached}", 0
            if policy.every and step % policy.every == 0 and step < self.steps:
                self.checkpoint()
            if self.signal is not None:
                name = signal.Signals(self.signal).name
                emit(events, "signal", step=step, signal=name, action="checkpoint and stop")
                self.checkpoint()
                return f"stopped by {name} after step {step}: resumable", EXIT_STOPPED
        at_end = [e for e in experiment.evals if e.at_end or (e.every and trainer.step % e.every != 0)]
        reached = run_evals(at_end, self.evaluators, trainer, trainer.step, events, status, self.evals_done, self.best, experiment)
        if reached:
            self.target_step = trainer.step
            return f"target reached: {reached}", 0
        return "finished", 0

    # -- checkpoints and resume --------------------------------------------------------------------
    def guard_state(self) -> dict[str, Any]:
        return {"skipped_in_a_row": self.skipped_in_a_row, "rolled_back": self.rolled_back, "lr_scale": self.trainer.lr_scale}

    def checkpoint(self) -> Optional[str]:
        """Write and publish a checkpoint. With the store unreachable (after its retries) the
        run goes on: this checkpoint is not published (its MANIFEST was never written) and
        the next one will be."""
        status = self.folder.status
        status.update(state="checkpointing")
        trainer = self.trainer
        started = time.time()
        state = trainer.snapshot(self.slug, self.guard_state(), {"done": self.evals_done, "best": self.best})
        if not self.writer:
            assert self.ranks is not None
            if self.ranks.agree(False):  # rank 0 published it
                self.last_checkpoint = step_name(trainer.step)
            status.update(state="running")
            return self.last_checkpoint
        try:
            # every event up to the checkpoint is durable before the checkpoint exists, so a
            # resume from it never lacks the history it continues
            self.folder.events.flush()
            name = write_checkpoint(self.store, self.slug, trainer.step, trainer.host_params(), trainer.host_states(), state)
            prune_checkpoints(self.store, self.slug, self.experiment.run.checkpoint.keep, protect=name)
        except StoreError as exc:
            emit(self.folder.events, "warning", step=trainer.step, message=f"checkpoint at step {trainer.step} not written, the store is unreachable: {exc}")
            status.update(state="running")
            if self.ranks is not None:
                self.ranks.agree(False)
            return None
        if self.ranks is not None:
            self.ranks.agree(True)
        self.last_checkpoint = name
        emit(self.folder.events, "checkpoint", step=trainer.step, path=f"checkpoints/{name}", seconds=time.time() - started)
        status.update(state="running", last_checkpoint=name)
        return name

    def load_resume(self, which: str) -> tuple[str, list[str], dict[str, np.ndarray], dict[str, np.ndarray], CheckpointState]:
        """Find, verify and read the checkpoint to resume; refuse one of another run."""
        name, warnings = resolve(self.store, self.slug, which)
        for warning in warnings:
            self.say(f"warning: {warning}")
        params, states, state = load_checkpoint(self.store, self.slug, name)
        if state.source_hash != self.experiment.source_hash or state.ir_hash != self.experiment.ir_hash:
            what = "source" if state.source_hash != self.experiment.source_hash else "IR (selection)"
            raise ResumeError(f"checkpoint {name} belongs to another {what}: it was written by a run of a different file or selection; start a fresh run instead")
        expected = [p.path for p in self.experiment.params]
        missing = [p for p in expected if p not in params]
        if missing:
            raise ResumeError(f"checkpoint {name} lacks {missing[0]}; it belongs to another model")
        return name, warnings, params, states, state

    def apply_resume(self, name: str, warnings: list[str], params: dict[str, np.ndarray], states: dict[str, np.ndarray], state: CheckpointState) -> None:
        for warning in warnings:
            emit(self.folder.events, "warning", step=None, message=warning)
        missing = [k for k in self.trainer.states if k not in states]
        if missing:
            raise ResumeError(f"checkpoint {name} lacks optimizer state {missing[0]}; it belongs to another optimizer")
        self.trainer.restore(params, states, state)
        self.evals_done = dict(state.eval.get("done", {}))
        self.best = dict(state.eval.get("best", {}))
        self.skipped_in_a_row = int(state.guard.get("skipped_in_a_row", 0))
        self.rolled_back = bool(state.guard.get("rolled_back", False))
        self.last_checkpoint = name
        emit(self.folder.events, "resume", step=state.step, from_step=state.step, checkpoint=f"checkpoints/{name}", attempt=self.attempt)
        self.say(f"resumed from {name} (step {state.step})")

    # -- the finite guard -----------------------------------------------------------------------------
    def guard(self, record: dict[str, Any]) -> Optional[tuple[str, int]]:
        """A non-finite loss or gradient: the update was skipped; name the node that made it;
        then skip, roll back, or stop, as :finite-guard says."""
        trainer, events = self.trainer, self.folder.events
        policy = self.experiment.run.finite_guard
        culprit = trainer.replay_nonfinite()
        self.skipped_in_a_row += 1
        action = "skipped"
        if self.skipped_in_a_row > policy.skip:
            action = "rolled back" if policy.rollback and not self.rolled_back and self.last_checkpoint else "stopped"
        emit(events, "nonfinite", step=trainer.step, loss=record["loss"], grad_norm=record["grad_norm"], action=action,
             node=f"%{culprit.node}" if culprit else None, op=culprit.op if culprit else None, location=culprit.loc if culprit else None,
             param_path=culprit.path if culprit else None, created=culprit.created if culprit else None,
             message=culprit.describe() if culprit else "no node of the step's replay produced a non-finite value")
        if culprit is not None:
            self.say(f"non-finite at step {trainer.step}: {culprit.describe()}")
        if action == "skipped":
            return None
        if action == "rolled back":
            assert self.last_checkpoint is not None
            params, states, state = load_checkpoint(self.store, self.slug, self.last_checkpoint)
            trainer.restore(params, states, state)
            self.rolled_back = True
            self.skipped_in_a_row = 0
            trainer.lr_scale *= policy.lr_scale if policy.lr_scale is not None else 1.0
            emit(events, "resume", step=state.step, from_step=state.step, checkpoint=f"checkpoints/{self.last_checkpoint}", reason="finite-guard rollback", lr_scale=trainer.lr_scale)
            return None
        where = f": {culprit.describe()}" if culprit else ""
        return f"non-finite loss or gradient at step {trainer.step}{where}", 1

    # -- the end ------------------------------------------------------------------------------------------
    def finish(self, started: float, reason: str, code: int) -> RunResult:
        trainer, events, status = self.trainer, self.folder.events, self.folder.status
        record = getattr(self, "record", {}) or {}
        if code in (0,) and trainer.step > 0:
            self.checkpoint()  # the final checkpoint
        wall = time.time() - started
        final = {"loss": record.get("loss", float("nan")), **record.get("metrics", {})}
        last_eval = {f"{name}/{k}": v for name, metrics in self.evals_done.items() for k, v in metrics.items()}
        examples, tokens = trainer.seen()
        summary = Summary(last_eval=last_eval, best_eval=self.best, target_reached_at_step=self.target_step, wall_time_s=wall,
                          examples_seen=examples, tokens_seen=tokens, exit_code=code, reason=reason)
        state = "finished" if code == 0 else ("stopped" if code == EXIT_STOPPED else "failed")
        status.update(state=state, step=trainer.step, summary=summary, last_checkpoint=self.last_checkpoint)
        emit(events, "run.end", step=trainer.step, exit_code=code, reason=reason, wall_time_s=wall, final=final)
        if self.options.progress:
            sys.stderr.write("\n")
        self.close_when_the_store_answers()
        return self.result(trainer.step, record.get("loss"), record.get("metrics", {}), wall, code, reason)

    def close_when_the_store_answers(self) -> None:
        """Flush the buffered events and the status; if the store is down, wait for it (up to
        RunOptions.store_patience_s): nothing the run wrote may be lost."""
        self.when_the_store_answers(self.folder.close)

    def when_the_store_answers(self, action: Callable[[], Any]) -> None:
        """ACTION, again and again while the store is unreachable (after its own retries), up
        to RunOptions.store_patience_s; a permanent error (no permission) raises at once."""
        deadline = time.time() + self.options.store_patience_s
        while True:
            try:
                action()
                return
            except StoreError:
                if time.time() > deadline:
                    raise
                time.sleep(1.0)

    def result(self, steps: int, loss: Optional[float], metrics: dict[str, float], wall: float, code: int, reason: str) -> RunResult:
        return RunResult(slug=self.slug, folder=self.folder.url, steps=steps, final_loss=loss, metrics=metrics, wall_time_s=wall, exit_code=code, reason=reason)

    @contextmanager
    def signal_handlers(self) -> Iterator[None]:
        """SIGINT/SIGTERM: finish the step, checkpoint, stop (exit 75). A second SIGINT stops
        at once; only published checkpoints (MANIFEST written last) are ever resumed."""
        if not self.options.signals or threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, frame: Any) -> None:
            if self.signal is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self.signal = signum

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


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
    from .cuda.device import describe as describe_device  # here: a CPU run does not load the CUDA lowering

    info = RunInfo(
        slug=name,
        file=experiment.file,
        selection=experiment.selection,
        knobs=experiment.knob_values(),
        source_hash=experiment.source_hash,
        ir_hash=experiment.ir_hash,
        devices=[describe_device(options.device)] * (options.ranks.world if options.ranks is not None else 1),
        meta=experiment.run.meta,
        max_steps=options.max_steps,
    )
    folder.write_run_info(info)
    folder.write_sources(options.sources)
    folder.write_ir(experiment.module.model_dump_json())


__all__ = ["train", "Trainer", "RunOptions", "RunResult", "DataError", "numpy_dtype"]
