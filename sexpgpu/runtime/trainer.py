"""The step numerics: parameters, optimizer state, compiled programs and data streams, and
one optimizer step (microbatches, the collective, the update, sampled diagnostics). What an
attempt does around the steps (resume, checkpoints, the finite guard, signals, the summary)
is runtime/attempt.py's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ..ir.experiment import Experiment, InitSpec
from ..ir.graph import Program, TensorType
from ..ir.selectors import selects
from .backend import Backend, HostBackend, RunnableProgram, Say, made
from .bounds import check_bounds, index_bounds
from .checkpoint import CheckpointState
from .data.load import load_dataset
from .data.spec import loader_spec
from .data.stream import BatchStream
from .init import initial_value
from .numpy_backend import NonFiniteNode, first_nonfinite
from .ranks import Collective, rows_of

STREAM_KEYS = frozenset({"epoch", "examples", "tokens"})  # the ctx keys read from the loader streams' states


@dataclass(frozen=True)
class StepResult:
    """One optimizer step, as the host sees it."""

    loss: float
    grad_norm: float
    finite: bool  # the update was applied (a non-finite loss or gradient leaves the parameters as they were)
    metrics: dict[str, float]
    lr: dict[str, float]  # each group's learning rate at this step
    stage: Optional[str]  # the loader stage this step entered, when the curriculum changed it
    diagnostics: Optional[dict[str, float]]  # at a sampled step: the selected diagnostics


def initial_state(init: InitSpec, like: np.ndarray) -> np.ndarray:
    """An optimizer state slot as defstate :init says (:zeros, :ones or a number)."""
    value = {"zeros": 0.0, "ones": 1.0}.get(init.kind, init.value if init.kind == "constant" else None)
    if value is None:
        raise ValueError(f"defstate :init {init.kind} is not supported; use :zeros, :ones or a number")
    return np.full_like(like, value)


class Trainer:
    """One run in progress: parameters, optimizer state, compiled programs, data stream."""

    def __init__(self, experiment: Experiment, ranks: Optional[Collective] = None, backend: Optional[Backend] = None,
                 data_roots: tuple[str, ...] = (), say: Optional[Say] = None) -> None:
        """SAY, if given, hears each program's notice as the backend makes it (on a device,
        the ops that run on the host)."""
        self.experiment = experiment
        self.backend: Backend = backend or HostBackend()

        def make(program: Program) -> RunnableProgram:
            return made(self.backend, program, say)

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
        self.dataset = load_dataset(loader_spec(loader, seed, data_roots))
        check_bounds(self.dataset, index_bounds(train_programs["train"]), "train")  # ids past the model's sizes: a data error
        self.field_names = [f.name for f in loader.fields]
        # one compiled program and one data stream per loader stage (None: no stage)
        self.programs: dict[Optional[str], RunnableProgram] = {None: make(train_programs["train"])}
        self.streams: dict[Optional[str], BatchStream] = {None: BatchStream(self.dataset, loader.batch, loader.shuffle, seed)}
        for stage in loader.stages:
            staged = loader.staged(stage.name)
            data = self.dataset if staged.prepare == loader.prepare else load_dataset(loader_spec(staged, seed, data_roots))
            check_bounds(data, index_bounds(train_programs[f"train@{stage.name}"]), "train")
            self.programs[stage.name] = make(train_programs[f"train@{stage.name}"])
            self.streams[stage.name] = BatchStream(data, staged.batch, staged.shuffle, seed)
        self.stage_names: list[Optional[str]] = [None] + [s.name for s in loader.stages]
        # each stage's train program with the selected IR diagnostics, for sampled steps; made
        # the first time its stage is sampled (on a device each holds a train-sized arena)
        self.make = make
        self.diagnostic_sources = {
            stage: train_programs[name] for stage in self.stage_names
            if (name := "train:diagnostics" if stage is None else f"train:diagnostics@{stage}") in train_programs
        }
        self.diagnostic_programs: dict[Optional[str], RunnableProgram] = {}
        self.curriculum = experiment.curriculum
        self.curriculum_program = make(experiment.module.programs["curriculum"]) if self.curriculum else None
        # "" in the curriculum is the loader as declared (`(stage train :declared)`), stage None here
        self.stage: Optional[str] = (self.curriculum.start.get("train") or None) if self.curriculum else None
        self.train_program = self.programs[self.stage]
        self.stream = self.streams[self.stage]
        self.step = 0
        self.step_input = np.zeros((), dtype=np.float32)
        self.random_step = np.zeros((), dtype=np.int64)
        self.train_uses_step = "rng.step" in self.train_program.input_ids
        # gradients stay resident for the update, unless a collective reduces them on the host
        grads = {k: t for k, t in self.types.items() if k.startswith("grad:")}
        self.resident_reduce = ranks is not None and ranks.reduces_resident(self.backend, grads)
        self.kept_grads = frozenset(grads) if self.world == 1 or self.resident_reduce else frozenset()
        self.ctx_names = [name for name in self.update_program.input_ids if name.startswith("ctx.")]
        self.ctx_arrays = {name: np.zeros((), dtype=np.float32) for name in self.ctx_names}
        self.ctx_keys = frozenset(name[4:] for name in self.ctx_names)
        self.started = time.time()
        self.last_loss = float("nan")
        self.lr_scale = 1.0
        self.last_feeds: Optional[dict[str, np.ndarray]] = None
        self.stage_index = self.stage_names.index(self.stage)
        self.microbatches = experiment.run.microbatches

    def ctx_values(self, keys: Optional[frozenset[str]] = None) -> dict[str, float]:
        """Every ctx key at this step boundary (runfile.md's list); with KEYS, at least those
        (the streams' counts and the clock only when KEYS asks for them: the per-step feeds)."""
        values = {"step": float(self.step)}
        if keys is None or not keys.isdisjoint(STREAM_KEYS):
            examples, tokens = self.seen()
            values.update({"epoch": float(self.stream.state().epoch), "examples": float(examples), "tokens": float(tokens)})
        values["stage"] = float(self.stage_index)
        if keys is None or "elapsed" in keys:
            elapsed = time.time() - self.started
            if self.ranks is not None:  # every rank must see rank 0's clock, or stages could diverge
                elapsed = self.ranks.broadcast(elapsed)
            values["elapsed"] = elapsed
        values.update({"loss": self.last_loss, "seed": float(self.experiment.run.seed), "rank": float(self.rank), "world-size": float(self.world),
                       "microbatch": float(self.microbatches), "lr-scale": self.lr_scale})
        return values

    def seen(self) -> tuple[int, int]:
        """Examples and tokens seen so far, over every stage's stream."""
        states = [stream.state() for stream in self.streams.values()]
        return sum(s.examples for s in states), sum(s.tokens for s in states)

    def ctx_feeds(self) -> dict[str, np.ndarray]:
        if not self.ctx_names:
            return {}
        values = self.ctx_values(self.ctx_keys)
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
            if grad is not None and wanted(f"grad-norm/{path}"):
                host = self.backend.get(grad, self.types[f"grad:{path}"]) if f"grad:{path}" in self.kept_grads else grad
                values[f"grad-norm/{path}"] = float(np.linalg.norm(host))
            if wanted(f"param-norm/{path}"):
                values[f"param-norm/{path}"] = float(np.linalg.norm(param))
            if wanted(f"update-ratio/{path}"):
                values[f"update-ratio/{path}"] = float(np.linalg.norm(param - before[path]) / max(float(np.linalg.norm(before[path])), 1e-12))
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
            identity_hash=self.experiment.identity_hash(),
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
        # one microbatch: each gradient's bucket all-reduces as soon as it is complete
        ready = self.ranks.gradient_ready if self.ranks is not None and self.resident_reduce and self.microbatches == 1 else None
        out = self.train_program.run(feeds, keep=self.kept_grads, ready=ready)
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
        """Run the curriculum at this step boundary; returns the new stage when it changes
        (`:declared` for the loader as declared)."""
        if self.curriculum_program is None or self.curriculum is None:
            return None
        values = self.ctx_values()
        feeds = {name: np.float32(values[name[4:]]) for name in self.curriculum_program.input_ids}
        held = self.curriculum_program.run(feeds)
        stage = self.curriculum.start.get("train") or None
        for i, rule in enumerate(self.curriculum.rules):
            if bool(held[f"rule:{i}"]) and "train" in rule:
                stage = rule["train"] or None
        if stage == self.stage:
            return None
        self.stage = stage
        self.stage_index = self.stage_names.index(stage)
        self.train_program = self.programs[stage]
        self.stream = self.streams[stage]
        return stage if stage is not None else ":declared"

    def train_step(self) -> StepResult:
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
        return StepResult(
            loss=float(out["loss"]), grad_norm=float(new["grad-norm"]), finite=finite,
            metrics={k[7:]: float(v) for k, v in out.items() if k.startswith("metric:")},
            lr={k[3:]: float(v) for k, v in new.items() if k.startswith("lr:")},
            stage=changed, diagnostics=self.diagnose(out, before) if sampled else None,
        )

