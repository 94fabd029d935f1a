"""How one attempt of a run ended, and the exit codes every path reports it with.

`sexpgpu run`, a local sweep, a Ray worker and a submitted job all start runs through
`sexpgpu.session`, which turns whatever happened (a finished run, a data error, a store that
takes no writes, a rank that never came) into one `AttemptOutcome`. The record crosses Ray
and is what the sweep ledger and `submit.json` keep, so the same failure reads the same
everywhere (docs/command-line.md lists the codes).
"""

from __future__ import annotations

from typing import Annotated, Optional

from pydantic import AfterValidator, BaseModel, Field

from .exits import Exit as Exit  # the codes live in a leaf module; every user of an outcome reads them here too


REASON_LIMIT = 2000  # characters: a reason is echoed into the store (sweep.json, submit.json, status.json)


def bounded(text: str, limit: int = REASON_LIMIT) -> str:
    """TEXT, cut to LIMIT characters with a note of how much was left out: a message that
    quotes a file (a diagnostic, a data error) must not carry the file into the store."""
    if len(text) <= limit:
        return text
    note = f" ... ({len(text) - limit:,} more characters)"
    return text[: limit - len(note)] + note


class EvalSeen(BaseModel):
    """The latest pass of one defeval: at which step, and what it measured."""

    step: int
    metrics: dict[str, float]


def evals_line(evals: dict[str, EvalSeen]) -> str:
    """The latest eval values, marked as eval and with their step:
    `eval val: acc 0.8125 loss 0.51 (step 200)`."""
    return "  ".join(f"eval {name}: " + " ".join(f"{k} {v:.4g}" for k, v in seen.metrics.items()) + f" (step {seen.step})"
                     for name, seen in evals.items())


class TargetHit(BaseModel):
    """The deftarget that ended a run: the value that met it, at which step."""

    metric: str  # EVAL/METRIC
    test: str  # <= >= < >
    threshold: float
    value: float
    step: int

    def describe(self) -> str:
        return f"{self.metric} {self.value:.4g} {self.test} {self.threshold:g} at step {self.step}"


class AttemptOutcome(BaseModel):
    """One attempt of one run, as it ended."""

    exit_code: Exit
    reason: Annotated[str, AfterValidator(bounded)]  # one line: "finished", "data error: ...", "cannot start here: ..."
    slug: Optional[str] = None
    folder: Optional[str] = None  # the run folder's URL, once the run had one
    steps: int = 0  # the step the run stands at
    first_step: int = 0  # the step this attempt began at (a resumed attempt's checkpoint)
    final_loss: Optional[float] = None
    metrics: dict[str, float] = Field(default_factory=dict)  # the last logged training batch's
    evals: dict[str, EvalSeen] = Field(default_factory=dict)  # the latest pass of each defeval
    target: Optional[TargetHit] = None
    wall_time_s: float = 0.0
    # lost rather than stopped: a killed rank, a lost node, ranks that never met. Retried by
    # the sweep driver and by submit, like any exit 75, and counted against --max-preemptions
    preempted: bool = False
    rank: int = 0  # which data-parallel rank reported it (rank 0's outcome is the run's)

    @property
    def resumable(self) -> bool:
        return self.exit_code == Exit.STOPPED

    def with_rank_note(self, rank: int, world: int) -> "AttemptOutcome":
        """This outcome as the gang's, when rank RANK of WORLD ended it."""
        return self.model_copy(update={"reason": f"rank {rank} of {world}: {self.reason}"})


def refused(code: Exit, reason: str, slug: Optional[str] = None) -> AttemptOutcome:
    """An attempt that ended before training: nothing ran, nothing was written."""
    return AttemptOutcome(exit_code=code, reason=reason, slug=slug)


def lost(reason: str, slug: Optional[str] = None) -> AttemptOutcome:
    """An attempt lost from outside (a death, a rendezvous that failed): run it again."""
    return AttemptOutcome(exit_code=Exit.STOPPED, reason=reason, slug=slug, preempted=True)
