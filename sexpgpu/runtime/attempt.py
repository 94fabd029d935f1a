"""The attempt lifecycle around the one fixed training loop: resume, the steps, evaluation
passes, checkpoints, the finite guard, SIGINT/SIGTERM, and the summary.

`train` takes a compiled experiment (IR, loader specs, parameter specs, run spec) and writes
the run folder through the store; it knows neither Lisp nor the compiler. Users' paths reach
it through `sexpgpu.session`, which resolves the device, compiles and maps what happens to an
outcome; the step numerics are runtime/trainer.py's.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import numpy as np

from ..ir.experiment import Experiment
from ..outcome import AttemptOutcome, EvalSeen, Exit, TargetHit, evals_line
from ..records import dump_json
from .backend import Backend, HostBackend
from .checkpoint import CheckpointState, Expected, ResumeError, Written, list_checkpoints, load_checkpoint, resolve, step_name, write_checkpoint
from .checkpoint import prune as prune_checkpoints
from .data.fingerprint import fingerprinted
from .data.spec import DataError
from .devices import describe
from .evaluation import Evaluations
from .events import EventLog
from .ranks import Collective
from .runfolder import FolderTaken, RunFolder, RunInfo, WriterLease, changed_data, run_slug
from .status import Status, Summary
from .stops import EarlyStop, StopRequests
from .threads import ThreadPlan
from .store import DEFAULT_PATIENCE_S, Store, StoreError, is_store_failure
from .trainer import StepResult, Trainer

Loaded = tuple[str, list[str], dict[str, np.ndarray], dict[str, np.ndarray], CheckpointState]

# how often an attempt's background publisher writes its events and status.json (besides at
# every checkpoint, stop and end): what a step logs in between is coalesced
PUBLISH_EVERY_S = 2.0


class AttemptEnds(Exception):
    """The attempt cannot go on; CODE and REASON are its end."""

    def __init__(self, code: Exit, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


class RecordsLost(Exception):
    """The store no longer holds records this attempt wrote (WHAT)."""

    def __init__(self, what: list[str]) -> None:
        super().__init__(", ".join(what))
        self.what = what


@dataclass
class RunOptions:
    store: str = "./runs"
    # what run.json records, the name of the backend below (the session sets both: `--device`)
    device: str = "numpy"
    backend: Backend = field(default_factory=HostBackend)  # where tensors live and how programs run
    max_steps: Optional[int] = None
    max_steps_by: str = "--max-steps"  # what set max_steps, for the reason of a truncated run
    progress: bool = False
    sources: dict[str, bytes] = field(default_factory=dict)
    resume: Optional[str] = None  # "latest", a step, or a checkpoint folder
    signals: bool = True  # handle SIGINT/SIGTERM (only possible on the main thread)
    store_patience_s: float = DEFAULT_PATIENCE_S  # how long a run waits for an unreachable store at its start and end
    ranks: Optional[Collective] = None  # data parallel: this process is one of W ranks
    threads: Optional[ThreadPlan] = None  # the BLAS threads the run was given (recorded in run.json)
    # where loader sources may be read besides the project: folders or URL prefixes
    data_roots: tuple[str, ...] = ()
    # who records SIGINT/SIGTERM: a session's, listening since before it compiled; None: the
    # attempt listens itself while it trains (when `signals`)
    stops: Optional[StopRequests] = None
    fresh: bool = False  # start from step 0; an earlier folder of the slug is kept as SLUG~N
    worker: Optional[str] = None  # who trains it, for status.json (a Ray actor's id; None: this process)
    # where the device's notices go (how each program runs there, what compiling its kernels
    # cost): the CLI's stderr; None: through `say`, with the attempt's other lines
    notice: Optional[Callable[[str], None]] = None
    # the run folder's last writer is known to be gone (a preempted worker the driver stopped):
    # its lease is taken over at once, not after its heartbeat expires
    take_over: bool = False
    publish_every_s: float = PUBLISH_EVERY_S  # the status and events are written this often, from a thread
    early_stop: Optional[EarlyStop] = None  # a sweep's scheduler, asked at its rungs whether the run goes on
    stores: Optional[Callable[[str], Store]] = None  # opens `store` (a worker's KeptStores: its clients kept); None: Store.open


def train(experiment: Experiment, options: RunOptions, say: Callable[[str], None] = print) -> AttemptOutcome:
    """Train EXPERIMENT to the end, writing its run folder. DataError and ResumeError
    propagate (sexpgpu.session maps them to exits 5 and 6), as does a store that takes no
    writes."""
    return Attempt(fingerprinted(experiment, options.data_roots), options, say).execute()


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


class WallClockRate:
    """Steps per second of wall time since the attempt's first step: evaluation passes,
    checkpoints and the writing of events and status included, as a user waits for them
    (the steps' own time, step_time, leaves them out and promised 8-10x too much)."""

    def __init__(self) -> None:
        self.since: Optional[tuple[float, int]] = None  # (time, step) when the first step began

    def start(self, step: int) -> None:
        if self.since is None:
            self.since = (time.time(), step)

    def per_s(self, step: int) -> float:
        if self.since is None:
            return 0.0
        began, first = self.since
        elapsed = time.time() - began
        return max(step - first, 0) / elapsed if elapsed > 0 else 0.0

    def eta_s(self, step: int, steps: int) -> Optional[float]:
        rate = self.per_s(step)
        return (steps - step) / rate if rate > 0 else None


class Attempt:
    """One attempt of a run: resume if asked (or if the folder has a checkpoint), train,
    evaluate, checkpoint, stop cleanly on SIGINT/SIGTERM, guard against non-finite steps."""

    def __init__(self, experiment: Experiment, options: RunOptions, say: Callable[[str], None]) -> None:
        self.experiment = experiment
        self.options = options
        self.say = say
        self.store = (options.stores or Store.open)(options.store)
        self.slug = run_slug(experiment)
        self.ranks = options.ranks
        self.writer = self.ranks is None or self.ranks.rank == 0
        # only rank 0 writes the run folder; the other ranks run the same loop and read the
        # shared store (resume), their own events and status go to a private in-memory store
        self.shared = RunFolder(self.store, self.slug)
        self.folder = self.shared if self.ranks is None or self.writer else RunFolder(Store.open(f"memory://sexpgpu-rank-{self.ranks.rank}-{id(self)}"), self.slug)
        spec = experiment.run
        self.steps = spec.steps if options.max_steps is None else min(options.max_steps, spec.steps)
        self.target: Optional[TargetHit] = None  # the deftarget that ended the run
        self.pruned = False  # the sweep's scheduler ended the run at a rung (RunOptions.early_stop)
        self.stops = options.stops or StopRequests()
        self.skipped_in_a_row = 0
        self.rolled_back = False
        self.last_checkpoint: Optional[str] = None
        self.last: Optional[StepResult] = None
        self.attempt = 1
        self.expected = Expected.of_module(experiment.module)  # what a checkpoint of this run holds
        self.first_step = 0  # the step this attempt started from (a resume's)
        self.resumed_metrics: dict[str, float] = {}  # the run's last metrics before this attempt
        self.earlier_evals: dict[str, EvalSeen] = {}  # what an attempt that trains nothing reports
        self.rate = WallClockRate()  # the progress line's steps/s and ETA, status.json's eta_s

    @property
    def events(self) -> EventLog:
        return self.folder.events

    # -- the attempt ----------------------------------------------------------------------------
    def execute(self) -> AttemptOutcome:
        """The attempt, holding the run folder's writer lease throughout (only rank 0 writes)."""
        if self.options.resume is not None and not self.store.list(self.slug):  # refused before a lease makes the folder
            # a slug that never ran may be this run's after its data changed: say that first
            changed = changed_data(self.store, self.slug, self.experiment, self.options.resume)
            raise ResumeError(changed or f"{self.slug} has not run yet in {self.store.url}: there is nothing to resume; run it without --resume")
        lease = WriterLease(self.shared, self.options.take_over) if self.writer else None
        if lease is not None:  # another writer: FolderHeld, before anything is read or written
            self.when_the_store_answers(lease.take)
        self.lease = lease
        try:
            return self.attempt_holding_the_folder()
        finally:
            self.folder.stop_publishing()  # an attempt that ended without its close writes nothing more
            if lease is not None:
                lease.release()

    def attempt_holding_the_folder(self) -> AttemptOutcome:
        started = time.time()
        aside = self.shared.set_aside() if self.options.fresh and self.writer else None
        if aside is not None:
            self.say(f"fresh run: the earlier attempts' folder is kept as {self.store.url_of(aside)}")
        previous = self.shared.read_status() if self.shared.exists() else None
        if previous is not None and self.options.resume is None and previous.has_ended(self.steps):
            self.say(f"{self.slug}  {self.folder.url}")
            if previous.state == "truncated":
                self.say(f"already at step {previous.step} ({self.options.max_steps_by} {self.steps}): nothing to do (a larger --max-steps, or none, continues it)")
            else:
                self.say("already finished: nothing to do (pass --resume to continue from a checkpoint)")
            metrics = {k: v for k, v in previous.metrics.items() if k != "loss" and v is not None}
            self.earlier_evals = previous.evals()
            self.target = self.target_reached(previous)
            ended = previous.summary.reason if previous.summary is not None else ""
            reason = "already finished" + (f": {ended}" if ended and ended != "finished" else "")
            return self.outcome(previous.step, previous.metrics.get("loss"), metrics, 0.0, Exit.OK, reason)
        resume = self.options.resume
        if resume is None and previous is not None and any(c.valid for c in list_checkpoints(self.store, self.slug)):
            resume = "latest"  # the same run again continues where it stopped
        self.attempt = (previous.attempt + 1) if previous is not None else 1
        self.say(f"{self.slug}  {self.folder.url}")
        loaded = self.load_resume(resume) if resume is not None else None  # refused: nothing written
        self.when_the_store_answers(lambda: write_header(self.folder, self.experiment, self.slug, self.options))
        status = self.folder.status
        status.update(state="compiling", step=0, steps=self.steps, attempt=self.attempt, host=socket.gethostname(),
                      worker=self.options.worker or f"pid {os.getpid()}", summary=None)
        emit(self.events, "run.start", step=0, slug=self.slug, steps=self.steps, attempt=self.attempt, host=socket.gethostname(),
             worker=self.options.worker or f"pid {os.getpid()}", device=self.options.device)
        emit(self.events, "compile", step=0, ir_hash=self.experiment.ir_hash, params=sum(int(np.prod(p.shape)) for p in self.experiment.params))
        self.folder.start_publishing(self.options.publish_every_s)  # from here on no step waits on the store
        try:
            notice = self.options.notice or self.say
            self.trainer = Trainer(self.experiment, self.ranks, self.options.backend, self.options.data_roots, say=notice)
            self.evaluations = Evaluations(self.experiment, self.trainer.dataset, self.options.backend, self.options.data_roots, say=notice)
        except DataError as exc:
            status.update(state="failed", summary=Summary(exit_code=int(Exit.DATA), reason=f"data error: {exc}"))
            emit(self.events, "run.end", step=0, exit_code=int(Exit.DATA), reason=f"data error: {exc}")
            self.close_when_the_store_answers()
            raise
        self.begin(loaded, previous)
        with self.listening_for_stops():
            try:
                reason, code = self.loop()
            except KeyboardInterrupt:
                reason, code = "interrupted twice: stopped at once (resume from the last checkpoint)", Exit.STOPPED
                emit(self.events, "signal", step=self.trainer.step, signal="SIGINT", action="stopped at once")
            except RecordsLost as lost:
                reason, code = self.after_records_lost(lost)
            except AttemptEnds as end:
                reason, code = end.reason, end.code
            except FolderTaken as taken:  # presumed dead and replaced: write nothing more
                return self.outcome(self.trainer.step, None, {}, time.time() - started, Exit.STOPPED,
                                    f"stopped at step {self.trainer.step}: {taken}; this attempt wrote nothing more")
        return self.finish(started, reason, code)

    def target_reached(self, status: Status) -> Optional[TargetHit]:
        """The deftarget an earlier attempt ended the run at, as its STATUS tells it (the
        pass that met it was the run's last: its value is the summary's last eval)."""
        summary = status.summary
        if summary is None or summary.target_reached_at_step is None:
            return None
        for target in self.experiment.targets:
            value = summary.last_eval.get(f"{target.eval}/{target.metric}")
            if value is not None and target.holds(value):
                return TargetHit(metric=f"{target.eval}/{target.metric}", test=target.test, threshold=target.value, value=value,
                                 step=summary.target_reached_at_step)
        return None

    def begin(self, loaded: Optional[Loaded], previous: Optional[Status]) -> None:
        if previous is not None:
            self.resumed_metrics = {k: v for k, v in previous.metrics.items() if v is not None}
        if loaded is not None:
            self.apply_resume(*loaded)
            self.first_step = self.trainer.step
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
        if self.first_step > 0:  # resumed at a rung: the checkpoint there may have been published after the scheduler's word
            ended = self.at_rung(trainer.step)
            if ended is not None:
                return ended
        while trainer.step < self.steps:
            if self.lease is not None and self.lease.taken():
                self.records_still_there()  # a store that lost the folder's files lost the lease too: not another attempt
                raise FolderTaken(f"another attempt took the run folder {self.folder.url} over")
            if self.stops.signal is not None:
                return self.stop_for_signal()
            self.rate.start(trainer.step)
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
            if reached is not None:
                self.target = reached
                return f"target reached: {reached.describe()}", Exit.OK
            ended = self.at_rung(step)
            if ended is not None:
                return ended
            if policy.every and step % policy.every == 0 and step < self.steps:
                self.checkpoint()
        step = trainer.step
        reached = self.evaluations.run(self.evaluations.at_end(step), trainer.params, step, self.events, self.folder.status)
        if reached is not None:
            self.target = reached
            return f"target reached: {reached.describe()}", Exit.OK
        if self.steps < experiment.run.steps:  # --max-steps: what the run asks is not done
            return f"truncated at step {self.steps} by {self.options.max_steps_by} (the run asks for {experiment.run.steps})", Exit.OK
        return "finished", Exit.OK

    def at_rung(self, step: int) -> Optional[tuple[str, Exit]]:
        """At a step the sweep's scheduler watches (before the attempt's last): its metric,
        measured now, and its word; the end of the attempt when it says stop."""
        early = self.options.early_stop
        if early is None or step not in early.steps or step >= self.steps:
            return None
        if self.evaluations.done_at.get(early.eval) != step:
            due = [e for e in self.experiment.evals if e.name == early.eval]
            reached = self.evaluations.run(due, self.trainer.params, step, self.events, self.folder.status)
            if reached is not None:
                self.target = reached
                return f"target reached: {reached.describe()}", Exit.OK
        value = self.evaluations.done.get(early.eval, {}).get(early.metric)
        reason = early.decide(step, value)
        if reason is None:
            return None
        self.pruned = True
        return reason, Exit.OK

    def stop_for_signal(self) -> tuple[str, Exit]:
        """SIGINT/SIGTERM arrived: checkpoint this step (unless it just was) and stop."""
        step, name = self.trainer.step, self.stops.name
        emit(self.events, "signal", step=step, signal=name, action="checkpoint and stop")
        if step > 0 and self.last_checkpoint != step_name(step):
            self.checkpoint()
        return f"stopped by {name} after step {step}: resumable", Exit.STOPPED

    def log_step(self, result: StepResult, window: ThroughputWindow) -> None:
        step = self.trainer.step
        throughput = window.fields()
        emit(self.events, "step", step=step, loss=result.loss, metrics=result.metrics, lr=result.lr, grad_norm=result.grad_norm,
             **throughput, memory=peak_memory())
        eta = self.rate.eta_s(step, self.steps)
        self.folder.status.update(step=step, metrics={"loss": result.loss, **result.metrics}, eta_s=eta)
        if self.options.progress:
            train = "".join(f"  {k} {v:.4g}" for k, v in result.metrics.items())
            evals = f"  {evals_line(self.evaluations.seen())}" if self.evaluations.done else ""
            sys.stderr.write(f"\rstep {step}/{self.steps}  loss {result.loss:.4f}{train}{evals}  {self.rate.per_s(step):.0f} steps/s  ETA {eta or 0:.0f}s   ")
            sys.stderr.flush()

    # -- checkpoints and resume --------------------------------------------------------------------
    def guard_state(self) -> dict[str, Any]:
        return {"skipped_in_a_row": self.skipped_in_a_row, "rolled_back": self.rolled_back, "lr_scale": self.trainer.lr_scale}

    def checkpoint(self) -> Optional[str]:
        """A periodic checkpoint. With the store unreachable (after its retries) the run goes
        on: this checkpoint is not published (its MANIFEST was never written) and the next one
        will be. A store that refuses for good (full, a quota, no access) ends the attempt:
        the steps since the last published checkpoint exist nowhere else."""
        try:
            return self.publish_checkpoint()
        except StoreError as exc:
            emit(self.events, "warning", step=self.trainer.step, message=f"checkpoint at step {self.trainer.step} not written, the store is unreachable: {exc}")
            return None
        except Exception as exc:
            if not is_store_failure(exc):
                raise
            raise AttemptEnds(Exit.CANNOT_START, self.unsafe(f"the store refused the checkpoint at step {self.trainer.step}", exc)) from exc

    def publish_checkpoint(self) -> Optional[str]:
        """Write and publish a checkpoint of this step (every event before it first), or
        raise the store's failure. Ranks agree on whether it was published."""
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
            self.records_still_there()  # first: a store that lost them lost the lease too
            if self.lease is not None:
                self.lease.check()
            # every event up to the checkpoint, its own event too, is durable before the
            # checkpoint is published, so a resume from it never lacks the history it
            # continues, and a worker lost right after it still left its checkpoint event
            def with_its_event(written: Written) -> None:
                self.events.flush({"kind": "checkpoint", "step": trainer.step, "path": f"checkpoints/{written.name}", "bytes": written.bytes,
                                   "seconds": time.time() - started})

            name, _ = write_checkpoint(self.store, self.slug, trainer.step, trainer.host_params(), trainer.host_states(), state, before_publish=with_its_event)
            prune_checkpoints(self.store, self.slug, self.experiment.run.checkpoint.keep, protect=name)
        except BaseException:
            status.update(state="running")
            if self.ranks is not None:
                self.ranks.agree(False)
            raise
        if self.ranks is not None:
            self.ranks.agree(True)
        self.last_checkpoint = name
        status.update(state="running", last_checkpoint=name)
        self.folder.publish_soon()
        return name

    def records_still_there(self) -> None:
        """The run's earlier records are where this attempt left them: a store that lost them
        (an S3 server restarted empty) ends the attempt, with this step checkpointed anew."""
        lost = [what for what, path in self.records() if not self.store.exists(path)]
        if lost:
            raise RecordsLost(lost)

    def records(self) -> list[tuple[str, str]]:
        records = [("run.json", f"{self.slug}/run.json")]
        if self.last_checkpoint is not None:
            records.append((f"checkpoint {self.last_checkpoint}", f"{self.slug}/checkpoints/{self.last_checkpoint}/MANIFEST.json"))
        return records

    def after_records_lost(self, lost: RecordsLost) -> tuple[str, Exit]:
        """Write what this attempt still holds (run.json and a checkpoint of this step) so a
        rerun continues from here; the history before it is gone, and the attempt stops."""
        step = self.trainer.step
        self.when_the_store_answers(lambda: write_header(self.folder, self.experiment, self.slug, self.options))
        if self.lease is not None:
            self.when_the_store_answers(self.lease.retake)
        self.last_checkpoint = None
        emit(self.events, "warning", step=step, message=f"the store lost this run's {', '.join(lost.what)}; its history before step {step} is gone")
        try:
            self.when_the_store_answers(self.publish_checkpoint)
        except Exception as exc:
            if not is_store_failure(exc):
                raise
            return self.unsafe(f"the store lost this run's {', '.join(lost.what)} and refused a new checkpoint at step {step}", exc), Exit.CANNOT_START
        return (f"stopped at step {step}: the store lost this run's {', '.join(lost.what)}; the state at step {step} is checkpointed "
                f"again, the history before it is gone; run the same command to continue"), Exit.STOPPED

    def unsafe(self, what: str, exc: BaseException) -> str:
        """Why the attempt ends, and the last step that is safe in the store."""
        safe = (f"the last safe step is {self.step_of(self.last_checkpoint)} (checkpoints/{self.last_checkpoint})" if self.last_checkpoint
                else "no checkpoint was published: a rerun starts from step 0")
        return f"{what} ({type(exc).__name__}: {exc}); {safe}; make room or fix the store, then run the same command to resume"

    @staticmethod
    def step_of(name: Optional[str]) -> int:
        return int(name.rsplit("-", 1)[1]) if name else 0

    def load_resume(self, which: str) -> Loaded:
        """Find, verify and read the checkpoint to resume; refuse one of another run, or of
        this run before its data changed (the file named)."""
        changed = changed_data(self.store, self.slug, self.experiment, which)
        if changed is not None:
            raise ResumeError(changed)
        name, warnings = resolve(self.store, self.slug, which, self.expected)
        for warning in warnings:
            self.say(f"warning: {warning}")
        params, states, state = load_checkpoint(self.store, self.slug, name, self.expected)
        if state.identity_hash is not None:
            if state.identity_hash != self.experiment.identity_hash():
                raise ResumeError(f"checkpoint {name} belongs to another run: what it computes differs from this file and selection; start a fresh run with `run --fresh` (the old folder is kept)")
        elif state.source_hash != self.experiment.source_hash or state.ir_hash != self.experiment.ir_hash:
            what = "source" if state.source_hash != self.experiment.source_hash else "IR (selection)"
            raise ResumeError(f"checkpoint {name} belongs to another {what}: it was written by a run of a different file or selection; start a fresh run with `run --fresh` (the old folder is kept)")
        return name, warnings, params, states, state

    def apply_resume(self, name: str, warnings: list[str], params: dict[str, np.ndarray], states: dict[str, np.ndarray], state: CheckpointState) -> None:
        for warning in warnings:
            emit(self.events, "warning", step=None, message=warning)
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
             node=f"%{culprit.node}" if culprit else None, op=culprit.op if culprit else None, location=culprit.where if culprit else None,
             library_location=culprit.library_loc if culprit else None,
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
        params, states, state = load_checkpoint(self.store, self.slug, self.last_checkpoint, self.expected)
        trainer.restore(params, states, state)
        self.rolled_back = True
        self.skipped_in_a_row = 0
        trainer.lr_scale *= lr_scale if lr_scale is not None else 1.0
        emit(self.events, "resume", step=state.step, from_step=state.step, checkpoint=f"checkpoints/{self.last_checkpoint}",
             reason="finite-guard rollback", lr_scale=trainer.lr_scale)

    # -- the end ------------------------------------------------------------------------------------------
    def finish(self, started: float, reason: str, code: Exit) -> AttemptOutcome:
        """The end: a run is `finished` only once its final checkpoint is published; then the
        status and run.end. A store that will not take them makes the end resumable."""
        trainer, status = self.trainer, self.folder.status
        last = self.last
        if code == Exit.OK and trainer.step > 0:
            try:
                reason, code = self.final_checkpoint(reason)
            except FolderTaken as taken:  # presumed dead and replaced: write nothing more
                return self.outcome(trainer.step, None, {}, time.time() - started, Exit.STOPPED,
                                    f"stopped at step {trainer.step}: {taken}; this attempt wrote nothing more")
        wall = time.time() - started
        # an attempt that trained no step (resumed at its end) ends with what the run had
        loss = last.loss if last is not None else self.resumed_metrics.get("loss")
        metrics = last.metrics if last is not None else {k: v for k, v in self.resumed_metrics.items() if k != "loss"}
        examples, tokens = trainer.seen()
        summary = Summary(last_eval=self.evaluations.last(), best_eval=self.evaluations.best, target_reached_at_step=self.target.step if self.target is not None else None,
                          wall_time_s=wall, examples_seen=examples, tokens_seen=tokens, exit_code=int(code), reason=reason)
        state = self.end_state(reason, code)
        final = {"loss": loss, **metrics} if loss is not None else status.current.metrics  # the last step, logged or not
        status.update(state=state, step=trainer.step, metrics=final, summary=summary, last_checkpoint=self.last_checkpoint)
        emit(self.events, "run.end", step=trainer.step, exit_code=int(code), reason=reason, wall_time_s=wall,
             final={"loss": loss if loss is not None else float("nan"), **metrics})
        if self.options.progress:
            sys.stderr.write("\n")
        try:
            self.close_when_the_store_answers()
        except Exception as exc:
            if not is_store_failure(exc):
                raise
            code = Exit.STOPPED if isinstance(exc, StoreError) else Exit.CANNOT_START
            reason = self.unsafe(f"the store did not take the end of the run at step {trainer.step}", exc)
        return self.outcome(trainer.step, loss, metrics, wall, code, reason)

    def end_state(self, reason: str, code: Exit) -> str:
        if code == Exit.OK:
            return "pruned" if self.pruned else "truncated" if reason.startswith("truncated") else "finished"
        return "stopped" if code == Exit.STOPPED else "failed"

    def final_checkpoint(self, reason: str) -> tuple[str, Exit]:
        """The last checkpoint, waited for while the store is unreachable (up to the
        patience); the run's end as it then stands."""
        try:
            if self.ranks is None:
                self.when_the_store_answers(self.publish_checkpoint)
            else:  # the ranks agree once per checkpoint: no second try
                self.publish_checkpoint()
        except RecordsLost as lost:
            return self.after_records_lost(lost)
        except Exception as exc:
            if not is_store_failure(exc):
                raise
            code = Exit.STOPPED if isinstance(exc, StoreError) else Exit.CANNOT_START
            return self.unsafe(f"the final checkpoint at step {self.trainer.step} was not published", exc), code
        return reason, Exit.OK

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
        evals = self.evaluations.seen() if hasattr(self, "evaluations") else self.earlier_evals
        return AttemptOutcome(slug=self.slug, folder=self.folder.url, steps=steps, first_step=self.first_step, final_loss=loss, metrics=metrics,
                              evals=evals, target=self.target, wall_time_s=wall, exit_code=code, reason=reason,
                              rank=self.ranks.rank if self.ranks is not None else 0)

    @contextmanager
    def listening_for_stops(self) -> Iterator[None]:
        """SIGINT/SIGTERM: finish the step, checkpoint, stop (exit 75). A second SIGINT stops
        at once; only published checkpoints (MANIFEST written last) are ever resumed. A
        session that listens already hands its StopRequests over."""
        if self.options.stops is not None or not self.options.signals:
            yield
            return
        with self.stops.listening():
            yield


def write_header(folder: RunFolder, experiment: Experiment, name: str, options: RunOptions) -> None:
    info = RunInfo(
        slug=name,
        file=experiment.file,
        selection=experiment.selection,
        knobs=experiment.knob_values(),
        source_hash=experiment.source_hash,
        ir_hash=experiment.ir_hash,
        data=experiment.data_sources or {},
        recipe_hash=experiment.identity_hash(with_data=False),
        devices=[describe(options.device)] * (options.ranks.world if options.ranks is not None else 1),
        meta=experiment.run.meta,
        max_steps=options.max_steps,
        threads=options.threads,
    )
    folder.write_run_info(info)
    folder.write_sources(options.sources)
    folder.write_ir(dump_json(experiment.module).decode())
