"""Points of a local sweep run side by side (`sweep --jobs N`), each in a child process.

A worker is `python -m sexpgpu.sweeps.jobs`, one per job slot: it reads PointJobs on stdin, one a
line, runs each through `Session.run_file` (the path `sexpgpu run FILE --sweep S --point I`
takes: compile, the slug, the attempt; one session, so the device opens once, as it does
for one at a time), writes its AttemptOutcome to the file the job names and says DONE. Only
JSON records cross between the processes.

The sweep waits on its children from the main thread: it starts the next point as one
ends, and on SIGINT/SIGTERM sends each child SIGTERM (the child checkpoints and ends 75)
and starts no more. Each point's lines (its header, what its child printed, its last line)
are printed in point order, the point at the head streaming live and the later ones held
until it ends, so the output reads as the one-at-a-time sweep's does.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence, TextIO

from pydantic import BaseModel

from ..ir.experiment import Experiment, Selection
from ..ir.ops import program_flops
from ..lisp.diagnostics import Diagnostic, SourceMap
from ..lisp.evaluator import Limits
from ..outcome import AttemptOutcome, Exit, lost, refused
from ..runtime.devices import is_host
from ..runtime.memory import available_memory, host_memory_plan
from ..runtime.stops import StopRequests
from ..runtime.threads import free_cores, process_cores
from ..runtime.store import DEFAULT_PATIENCE_S, Store
from ..session import Session, Settings
from .schedulers import Decision, SchedulerJob

POLL_S = 0.02  # how often the sweep looks at its children's pipes and exits


class PointJob(BaseModel):
    """One point's attempt, as the sweep hands it to a child process."""

    file: str
    selection: Selection
    store: str
    device: str = "cpu"
    max_steps: Optional[int] = None
    max_steps_by: str = "--max-steps"
    limits: Optional[Limits] = None
    data_roots: list[str] = []
    threads: Optional[int] = None
    thread_share: Optional[int] = None
    store_patience_s: float = DEFAULT_PATIENCE_S
    outcome: str  # where the child writes its AttemptOutcome
    scheduler: Optional[SchedulerJob] = None  # an asynchronous scheduler's, asked at each rung as the point trains

    def settings(self) -> Settings:
        """The session's settings (the same for every point of the sweep; the steps, each
        point's own, are given to each attempt)."""
        return Settings(store=self.store, device=self.device, limits=self.limits,
                        data_roots=tuple(self.data_roots), threads=self.threads, thread_share=self.thread_share,
                        store_patience_s=self.store_patience_s)


@dataclass(frozen=True)
class JobPlan:
    """How many points run at once, and the most threads each may take."""

    jobs: int
    share: Optional[int]  # None: one at a time, the point's own plan (runtime/threads.py)


# A worker process costs about 2-3 s of CPU before its first step (imports, its own compile
# and kernel build); at the CPU device's ~10 GFLOP/s that is ~25 GFLOP. Points that train less
# than ten times that each run faster one after another in this process, which the default
# must then choose.
WORTH_A_PROCESS_FLOPS = 250e9


def training_flops(experiment: Experiment) -> float:
    """The FLOPs a point's training does: its steps times one train and one update step."""
    programs = experiment.module.programs
    per_step = sum(program_flops(programs[name]) for name in ("train", "update") if name in programs)
    return float(per_step) * experiment.run.steps


def plan_jobs(experiments: Sequence[Experiment], device: str, asked: Optional[int]) -> JobPlan:
    """ASKED (--jobs) points at a time, or as many as the free cores and the memory allow:
    one per free core, no more than the available memory holds at the largest point's plan
    (runtime/memory.py), and one at a time on an accelerator. Each gets an equal share of
    the free cores, so jobs x threads never exceeds them."""
    if not experiments:
        return JobPlan(1, None)
    free, _ = free_cores(process_cores())
    if asked is None:
        if not is_host(device):
            return JobPlan(1, None)
        if sum(training_flops(e) for e in experiments) < len(experiments) * WORTH_A_PROCESS_FLOPS:
            return JobPlan(1, None)  # a worker's start (imports, its compile) would cost more than it saves
        need = max(host_memory_plan(e).total for e in experiments)
        available = available_memory()
        by_memory = available // need if available is not None and need > 0 else len(experiments)
        asked = max(1, min(len(experiments), free, by_memory))
    if asked == 1:
        return JobPlan(1, None)
    return JobPlan(asked, max(1, free // asked))


@dataclass
class Stream:
    """One point's lines, printed once every earlier point's are."""

    lines: list[str] = field(default_factory=list)
    begun: bool = False
    closed: bool = False


DONE = "\x00sexpgpu-jobs: done"  # a worker's line after each point's outcome is written


class Worker:
    """A child process that trains the points it is given, one after another, with one
    session (the device opened once, as one at a time opens it); its merged stdout and
    stderr are read line by line."""

    def __init__(self, name: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "sexpgpu.sweeps.jobs"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.lock = threading.Lock()
        self.received: list[str] = []
        self.done = False
        self.job: Optional[PointJob] = None
        self.reader = threading.Thread(target=self.read, name=f"sexpgpu-{name}", daemon=True)
        self.reader.start()

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self.lock:
                if line.rstrip("\n") == DONE:
                    self.done = True
                else:
                    self.received.append(line)

    def give(self, job: PointJob) -> None:
        assert self.process.stdin is not None
        with self.lock:
            self.job, self.done = job, False
        try:
            self.process.stdin.write(job.model_dump_json() + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:  # it died idle: ended() says so, and the point is a lost attempt
            pass

    def take(self) -> list[str]:
        with self.lock:
            taken, self.received = self.received, []
        return taken

    def ended(self) -> bool:
        """Whether the point given last has ended (or the process has)."""
        with self.lock:
            if self.done:
                return True
        return self.process.poll() is not None and not self.reader.is_alive()

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def close(self) -> None:
        """No more points: the worker ends once it has read that."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except BrokenPipeError:  # it ended already
                pass
        self.process.wait()

    def outcome(self, stopping: bool) -> AttemptOutcome:
        """What the attempt said it ended with; a worker that ended without saying (killed,
        or stopped before it could start) lost its attempt: the sweep run again resumes it."""
        assert self.job is not None
        path = Path(self.job.outcome)
        if path.is_file():
            outcome = AttemptOutcome.model_validate_json(path.read_text(encoding="utf-8"))
            if outcome.exit_code in (Exit.INTERRUPTED, Exit.TERMINATED):  # stopped while it compiled: nothing written
                return refused(Exit.STOPPED, outcome.reason, outcome.slug)
            return outcome
        code = self.process.returncode
        how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        if stopping:
            return refused(Exit.STOPPED, f"stopped before it started training ({how}): nothing was written")
        return lost(f"the point's process ended with {how} before its attempt did; the sweep run again continues it")


Begin = Callable[[int], tuple[list[str], Optional[PointJob]]]
End = Callable[[int, AttemptOutcome], tuple[list[str], bool]]


class SideBySide:
    """Points run JOBS at a time; BEGIN(i) gives point i's first lines and its job (None:
    nothing to run, its lines are all), END(i, outcome) its last lines and whether later
    points may still start (False: nothing more can start here)."""

    def __init__(self, jobs: int, stops: Optional[StopRequests], out: TextIO) -> None:
        self.jobs, self.stops, self.out = jobs, stops, out
        self.stopped = False  # a stop request was passed on to the children

    def run(self, points: list[int], begin: Begin, end: End) -> None:
        streams = {i: Stream() for i in points}
        waiting = list(points)
        running: dict[int, Worker] = {}
        idle: list[Worker] = []
        can_start = True
        with tempfile.TemporaryDirectory(prefix="sexpgpu-jobs-") as folder:
            try:
                while waiting or running:
                    if self.stops is not None and self.stops.signal is not None and not self.stopped:
                        self.stopped, can_start = True, False
                        for worker in running.values():
                            worker.stop()
                    while can_start and waiting and len(running) < self.jobs:
                        i = waiting.pop(0)
                        lines, job = begin(i)
                        streams[i].lines += lines
                        streams[i].begun = True
                        if job is None:
                            streams[i].closed = True
                            continue
                        worker = idle.pop() if idle else Worker(f"worker-{i}")
                        worker.give(job.model_copy(update={"outcome": str(Path(folder) / f"outcome-{i}.json")}))
                        running[i] = worker
                    for i, worker in list(running.items()):
                        streams[i].lines += worker.take()
                        if worker.ended():
                            del running[i]
                            streams[i].lines += worker.take()
                            lines, go_on = end(i, worker.outcome(self.stopped))
                            streams[i].lines += lines
                            streams[i].closed = True
                            can_start = can_start and go_on
                            if worker.alive():
                                idle.append(worker)
                    self.flush(points, streams)
                    if not can_start and not running:
                        break
                    if running:
                        time.sleep(POLL_S)
            finally:
                for worker in running.values():  # only on an exception here (a second Ctrl-C)
                    worker.stop()
                for worker in [*idle, *running.values()]:
                    worker.close()
                self.flush(points, streams, every=True)

    def flush(self, points: list[int], streams: dict[int, Stream], every: bool = False) -> None:
        for i in points:
            stream = streams[i]
            if not stream.begun:
                if every:
                    continue
                break
            for line in stream.lines:
                self.out.write(line if line.endswith("\n") else line + "\n")
            stream.lines = []
            if not stream.closed and not every:
                break
        self.out.flush()


class Quiet:
    """A child's reporter: the sweep printed the point's diagnostics when it compiled it."""

    def __init__(self) -> None:
        from ..cli.common import Console

        self.console = Console(progress_to_stderr=True)

    def say(self, text: str) -> None:
        self.console.say(text)

    def notice(self, text: str) -> None:
        self.console.notice(text)

    def output(self, text: str) -> None:
        self.console.output(text)

    def diagnostics(self, diagnostics: list[Diagnostic], sources: SourceMap) -> None:
        pass

    def refusal(self, reason: str) -> None:
        self.console.refusal(reason)


def serve(jobs: TextIO, out: TextIO) -> int:
    """A worker: train each point of JOBS (one PointJob a line) through one session, write its
    outcome, then say DONE on OUT; end when JOBS does."""
    session: Optional[Session] = None
    seen: dict[str, Decision] = {}  # the scheduler's decisions read for earlier points (each is written once)
    try:
        for line in jobs:
            job = PointJob.model_validate_json(line)
            session = session or Session(job.settings(), Quiet())
            early = job.scheduler.early_stop(Store.open(job.store), seen) if job.scheduler is not None else None
            outcome = session.run_file(Path(job.file), job.selection, max_steps=job.max_steps, max_steps_by=job.max_steps_by, early_stop=early)
            written = Path(job.outcome + ".partial")
            written.write_text(outcome.model_dump_json(), encoding="utf-8")
            os.replace(written, job.outcome)  # the sweep reads a whole outcome or none
            out.flush()
            print(DONE, file=out, flush=True)
    except KeyboardInterrupt:  # Ctrl-C on the terminal while the worker waited for a point
        return int(Exit.INTERRUPTED)
    return int(Exit.OK)


if __name__ == "__main__":
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    sys.stderr = sys.stdout  # one stream, in order, a line at a time: the sweep reads it so
    raise SystemExit(serve(sys.stdin, sys.stdout))
