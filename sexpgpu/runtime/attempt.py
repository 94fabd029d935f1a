"""The attempt lifecycle around the one fixed training loop: resume, the steps, evaluation
passes, checkpoints, the finite guard, SIGINT/SIGTERM, and the summary.

`train` takes a compiled experiment (IR, loader specs, parameter specs, run spec) and writes
the run folder through the store; it knows neither Lisp nor the compiler. Users' paths reach
it through `sexpgpu.session`, which resolves the device, compiles and maps what happens to an
outcome; the step numerics are runtime/trainer.py's.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import numpy as np

from ..ir.experiment import Experiment
from ..outcome import AttemptOutcome, Exit
from .backend import Backend, HostBackend
from .checkpoint import CheckpointState, ResumeError, list_checkpoints, load_checkpoint, resolve, step_name, write_checkpoint
from .checkpoint import prune as prune_checkpoints
from .data.spec import DataError
from .devices import describe
from .evaluation import Evaluations
from .events import EventLog
from .ranks import Collective
from .runfolder import RunFolder, RunInfo, run_slug
from .status import Status, Summary
from .store import Store, StoreError
from .trainer import StepResult, Trainer

Loaded = tuple[str, list[str], dict[str, np.ndarray], dict[str, np.ndarray], CheckpointState]


@dataclass
class RunOptions:
    store: str = "./runs"
    device: str = "cpu"  # what run.json records; the backend below runs it
    backend: Backend = field(default_factory=HostBackend)  # where tensors live and how programs run
    max_steps: Optional[int] = None
    progress: bool = False
    sources: dict[str, bytes] = field(default_factory=dict)
    resume: Optional[str] = None  # "latest", a step, or a checkpoint folder
    signals: bool = True  # handle SIGINT/SIGTERM (only possible on the main thread)
    store_patience_s: float = 600.0  # how long the end of a run waits for an unreachable store
    ranks: Optional[Collective] = None  # data parallel: this process is one of W ranks


def train(experiment: Experiment, options: RunOptions, say: Callable[[str], None] = print) -> AttemptOutcome:
    """Train EXPERIMENT to the end, writing its run folder. DataError and ResumeError
    propagate (sexpgpu.session maps them to exits 5 and 6), as does a store that takes no
    writes."""
    return Attempt(experiment, options, say).execute()


def emit(events: EventLog, kind: str, **fields: Any) -> None:
    events.emit({"kind": kind, **fields})


def peak_memory() -> Optional[int]:
    """The process's peak resident memory in bytes (what a step event reports as `memory`)."""
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB
    except (ImportError, OSError):  # not a POSIX system
        return None


class ThroughputWindow:
    """Training time and the examples and tokens the streams served since the last step
    event (not evaluations or checkpoints; stages may change the batch)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.reset()

    def reset(self) -> None:
        self.seconds, self.steps, self.seen = 0.0, 0, self.trainer.seen()

    def add(self, seconds: float) -> None:
        self.seconds += seconds
        self.steps += 1

    def fields(self) -> dict[str, Optional[float]]:
        examples, tokens = (now - then for now, then in zip(self.trainer.seen(), self.seen))
        timed = self.seconds > 0
        return {"step_time": self.seconds / max(self.steps, 1), "examples_per_s": examples / self.seconds if timed else None,
                "tokens_per_s": tokens / self.seconds if timed and tokens else None}


class Attempt:
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
        self.folder = self.shared if self.ranks is None or self.writer else RunFolder(Store.open(f"memory://sexpgpu-rank-{self.ranks.rank}-{id(self)}"), self.slug)
        spec = experiment.run
        self.steps = spec.steps if options.max_steps is None else min(options.max_steps, spec.steps)
        self.target_step: Optional[int] = None
        self.signal: Optional[int] = None
        self.skipped_in_a_row = 0
        self.rolled_back = False
        self.last_checkpoint: Optional[str] = None
        self.last: Optional[StepResult] = None
        self.attempt = 1

    @property
    def events(self) -> EventLog:
        return self.folder.events

    # -- the attempt ----------------------------------------------------------------------------
    def execute(self) -> AttemptOutcome:
        started = time.time()
        previous = self.shared.read_status() if self.shared.exists() else None
        if previous is not None and previous.state == "finished" and self.options.resume is None and previous.step >= self.steps:
            self.say(f"{self.slug}  {self.folder.url}")
            self.say("already finished: nothing to do (pass --resume to continue from a checkpoint)")
            metrics = {k: v for k, v in previous.metrics.items() if k != "loss" and v is not None}
            return self.outcome(previous.step, previous.metrics.get("loss"), metrics, 0.0, Exit.OK, "already finished")
        resume = self.options.resume
        if resume is None and previous is not None and any(c.valid for c in list_checkpoints(self.store, self.slug)):
            resume = "latest"  # the same run again continues where it stopped
        self.attempt = (previous.attempt + 1) if previous is not None else 1
        self.say(f"{self.slug}  {self.folder.url}")
        loaded = self.load_resume(resume) if resume is not None else None  # refused: nothing written
        self.when_the_store_answers(lambda: write_header(self.folder, self.experiment, self.slug, self.options))
        status = self.folder.status
        status.update(state="compiling", step=0, steps=self.steps, attempt=self.attempt, host=socket.gethostname(), summary=None)
        emit(self.events, "run.start", step=0, slug=self.slug, steps=self.steps, attempt=self.attempt)
        emit(self.events, "compile", step=0, ir_hash=self.experiment.ir_hash, params=sum(int(np.prod(p.shape)) for p in self.experiment.params))
        try:
            self.trainer = Trainer(self.experiment, self.ranks, self.options.backend, say=self.say)
            self.evaluations = Evaluations(self.experiment, self.trainer.dataset, self.options.backend, say=self.say)
        except DataError as exc:
            status.update(state="failed", summary=Summary(exit_code=int(Exit.DATA), reason=f"data error: {exc}"))
            emit(self.events, "run.end", step=0, exit_code=int(Exit.DATA), reason=f"data error: {exc}")
            self.close_when_the_store_answers()
            raise
        self.begin(loaded, previous)
        with self.signal_handlers():
            try:
                reason, code = self.loop()
            except KeyboardInterrupt:
                reason, code = "interrupted twice: stopped at once (resume from the last checkpoint)", Exit.STOPPED
                emit(self.events, "signal", step=self.trainer.step, signal="SIGINT", action="stopped at once")
        return self.finish(started, reason, code)

    def begin(self, loaded: Optional[Loaded], previous: Optional[Status]) -> None:
        if loaded is not None:
            self.apply_resume(*loaded)
        elif previous is not None:
            # an earlier attempt stopped before publishing any checkpoint: this one starts over,
            # and its events supersede that attempt's (readers keep one series)
            emit(self.events, "resume", step=0, from_step=0, checkpoint=None, attempt=self.attempt, reason="started over: no checkpoint had been published")
        self.folder.status.update(state="running", step=self.trainer.step)

    def loop(self) -> tuple[str, Exit]:
        trainer, experiment = self.trainer, self.experiment
        log_every = max(1, experiment.run.log_every)
        window = ThroughputWindow(trainer)
        policy = experiment.run.checkpoint
        while trainer.step < self.steps:
            started = time.time()
            result = trainer.train_step()
            window.add(time.time() - started)
            self.last = result
            step = trainer.step
            if result.diagnostics is not None:
                emit(self.events, "diagnostic", step=step, values=result.diagnostics)
            if result.stage:
                emit(self.events, "stage", step=step - 1, name=result.stage, loader="train", index=trainer.stage_index)
            if not result.finite:
                stop = self.guard(result)
                if stop is not None:
                    return stop
                continue
            self.skipped_in_a_row = 0
            if step % log_every == 0 or step == self.steps:
                self.log_step(result, window)
                window.reset()
            reached = self.evaluations.run(self.evaluations.due(step), trainer.params, step, self.events, self.folder.status)
            if reached:
                self.target_step = step
                return f"target reached: {reached}", Exit.OK
            if policy.every and step % policy.every == 0 and step < self.steps:
                self.checkpoint()
            if self.signal is not None:
                name = signal.Signals(self.signal).name
                emit(self.events, "signal", step=step, signal=name, action="checkpoint and stop")
                self.checkpoint()
                return f"stopped by {name} after step {step}: resumable", Exit.STOPPED
        step = trainer.step
        reached = self.evaluations.run(self.evaluations.at_end(step), trainer.params, step, self.events, self.folder.status)
        if reached:
            self.target_step = step
            return f"target reached: {reached}", Exit.OK
        return "finished", Exit.OK

    def log_step(self, result: StepResult, window: ThroughputWindow) -> None:
        step = self.trainer.step
        throughput = window.fields()
        emit(self.events, "step", step=step, loss=result.loss, metrics=result.metrics, lr=result.lr, grad_norm=result.grad_norm,
             **throughput, memory=peak_memory())
        step_time = throughput["step_time"] or 0.0
        eta = step_time * (self.steps - step)
        self.folder.status.update(step=step, metrics={"loss": result.loss, **result.metrics}, eta_s=eta)
        if self.options.progress:
            sys.stderr.write(f"\rstep {step}/{self.steps}  loss {result.loss:.4f}  {1 / step_time if step_time else 0:.0f} steps/s  ETA {eta:.0f}s   ")
            sys.stderr.flush()

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
        state = trainer.snapshot(self.slug, self.guard_state(), self.evaluations.state())
        if not self.writer:
            assert self.ranks is not None
            if self.ranks.agree(False):  # rank 0 published it
                self.last_checkpoint = step_name(trainer.step)
            status.update(state="running")
            return self.last_checkpoint
        try:
            # every event up to the checkpoint is durable before the checkpoint exists, so a
            # resume from it never lacks the history it continues
            self.events.flush()
            name = write_checkpoint(self.store, self.slug, trainer.step, trainer.host_params(), trainer.host_states(), state)
            prune_checkpoints(self.store, self.slug, self.experiment.run.checkpoint.keep, protect=name)
        except StoreError as exc:
            emit(self.events, "warning", step=trainer.step, message=f"checkpoint at step {trainer.step} not written, the store is unreachable: {exc}")
            status.update(state="running")
            if self.ranks is not None:
                self.ranks.agree(False)
            return None
        if self.ranks is not None:
            self.ranks.agree(True)
        self.last_checkpoint = name
        emit(self.events, "checkpoint", step=trainer.step, path=f"checkpoints/{name}", seconds=time.time() - started)
        status.update(state="running", last_checkpoint=name)
        return name

    def load_resume(self, which: str) -> Loaded:
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
            emit(self.events, "warning", step=None, message=warning)
        missing = [k for k in self.trainer.states if k not in states]
        if missing:
            raise ResumeError(f"checkpoint {name} lacks optimizer state {missing[0]}; it belongs to another optimizer")
        self.trainer.restore(params, states, state)
        self.evaluations.restore(state.eval)
        self.skipped_in_a_row = int(state.guard.get("skipped_in_a_row", 0))
        self.rolled_back = bool(state.guard.get("rolled_back", False))
        self.last_checkpoint = name
        emit(self.events, "resume", step=state.step, from_step=state.step, checkpoint=f"checkpoints/{name}", attempt=self.attempt)
        self.say(f"resumed from {name} (step {state.step})")

    # -- the finite guard -----------------------------------------------------------------------------
    def guard(self, result: StepResult) -> Optional[tuple[str, Exit]]:
        """A non-finite loss or gradient: the update was skipped; name the node that made it;
        then skip, roll back, or stop, as :finite-guard says."""
        trainer = self.trainer
        policy = self.experiment.run.finite_guard
        culprit = trainer.replay_nonfinite()
        self.skipped_in_a_row += 1
        action = "skipped"
        if self.skipped_in_a_row > policy.skip:
            action = "rolled back" if policy.rollback and not self.rolled_back and self.last_checkpoint else "stopped"
        emit(self.events, "nonfinite", step=trainer.step, loss=result.loss, grad_norm=result.grad_norm, action=action,
             node=f"%{culprit.node}" if culprit else None, op=culprit.op if culprit else None, location=culprit.loc if culprit else None,
             param_path=culprit.path if culprit else None, created=culprit.created if culprit else None,
             message=culprit.describe() if culprit else "no node of the step's replay produced a non-finite value")
        if culprit is not None:
            self.say(f"non-finite at step {trainer.step}: {culprit.describe()}")
        if action == "skipped":
            return None
        if action == "rolled back":
            self.roll_back(policy.lr_scale)
            return None
        where = f": {culprit.describe()}" if culprit else ""
        return f"non-finite loss or gradient at step {trainer.step}{where}", Exit.RUN_FAILED

    def roll_back(self, lr_scale: Optional[float]) -> None:
        assert self.last_checkpoint is not None
        trainer = self.trainer
        params, states, state = load_checkpoint(self.store, self.slug, self.last_checkpoint)
        trainer.restore(params, states, state)
        self.rolled_back = True
        self.skipped_in_a_row = 0
        trainer.lr_scale *= lr_scale if lr_scale is not None else 1.0
        emit(self.events, "resume", step=state.step, from_step=state.step, checkpoint=f"checkpoints/{self.last_checkpoint}",
             reason="finite-guard rollback", lr_scale=trainer.lr_scale)

    # -- the end ------------------------------------------------------------------------------------------
    def finish(self, started: float, reason: str, code: Exit) -> AttemptOutcome:
        trainer, status = self.trainer, self.folder.status
        last = self.last
        if code == Exit.OK and trainer.step > 0:
            self.checkpoint()  # the final checkpoint
        wall = time.time() - started
        loss = last.loss if last is not None else None
        metrics = last.metrics if last is not None else {}
        examples, tokens = trainer.seen()
        summary = Summary(last_eval=self.evaluations.last(), best_eval=self.evaluations.best, target_reached_at_step=self.target_step,
                          wall_time_s=wall, examples_seen=examples, tokens_seen=tokens, exit_code=int(code), reason=reason)
        state = "finished" if code == Exit.OK else ("stopped" if code == Exit.STOPPED else "failed")
        status.update(state=state, step=trainer.step, summary=summary, last_checkpoint=self.last_checkpoint)
        emit(self.events, "run.end", step=trainer.step, exit_code=int(code), reason=reason, wall_time_s=wall,
             final={"loss": loss if loss is not None else float("nan"), **metrics})
        if self.options.progress:
            sys.stderr.write("\n")
        self.close_when_the_store_answers()
        return self.outcome(trainer.step, loss, metrics, wall, code, reason)

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

    def outcome(self, steps: int, loss: Optional[float], metrics: dict[str, float], wall: float, code: Exit, reason: str) -> AttemptOutcome:
        return AttemptOutcome(slug=self.slug, folder=self.folder.url, steps=steps, final_loss=loss, metrics=metrics, wall_time_s=wall,
                              exit_code=code, reason=reason, rank=self.ranks.rank if self.ranks is not None else 0)

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


def write_header(folder: RunFolder, experiment: Experiment, name: str, options: RunOptions) -> None:
    info = RunInfo(
        slug=name,
        file=experiment.file,
        selection=experiment.selection,
        knobs=experiment.knob_values(),
        source_hash=experiment.source_hash,
        ir_hash=experiment.ir_hash,
        devices=[describe(options.device)] * (options.ranks.world if options.ranks is not None else 1),
        meta=experiment.run.meta,
        max_steps=options.max_steps,
    )
    folder.write_run_info(info)
    folder.write_sources(options.sources)
    folder.write_ir(experiment.module.model_dump_json())
