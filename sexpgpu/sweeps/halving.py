"""Successive halving over a sweep's runs, decided from what the runs wrote.

A halving sweep trains its points in stages: every point to the first rung, then the best
fraction of them to the next rung, and so on; the points left after the last rung train to
their own :steps. Which points go on is a pure function of the results in the store (each
point's eval value at the rung, read from its events), recomputed whenever the sweep runs,
so a sweep started again continues the search where it stopped and decides alike. A point
that does not go on is marked `pruned` in its status.json; its folder, with the checkpoint
of its rung, stays resumable (`run` resumes it, and a sweep whose halving keeps more points
does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

from ..ir.experiment import Halving
from ..outcome import Exit
from ..runtime.events import read_events, utc_now
from ..runtime.status import StatusWriter, Summary, read_status
from ..runtime.store import Store


@dataclass(frozen=True)
class Contender:
    """A point still in the search: its index, its run's slug and its own :steps."""

    point: int
    slug: str
    steps: int


def stage_steps(halving: Halving, steps: int) -> list[int]:
    """The step counts a point of STEPS trains to, stage after stage."""
    return [r for r in halving.rungs if r < steps] + [steps]


def value_at(store: Store, slug: str, metric: str, rung: int) -> Optional[float]:
    """METRIC (EVAL/METRIC) as the run had measured it by step RUNG: its last eval pass at
    or before the rung (a run stopped at a rung evaluates there). None: never measured."""
    name, _, key = metric.partition("/")
    value: Optional[float] = None
    for event in read_events(store, slug):
        if event.get("kind") == "eval" and event.get("name") == name and int(event.get("step", 0)) <= rung:
            measured = (event.get("metrics") or {}).get(key)
            value = float(measured) if isinstance(measured, (int, float)) else math.nan
    return value


@dataclass(frozen=True)
class RungDecision:
    rung: int  # 1-based
    step: int
    ranked: list[tuple[int, Optional[float]]]  # (point, value), best first
    kept: list[int]

    def cutoff(self) -> Optional[float]:
        return self.ranked[len(self.kept) - 1][1] if self.kept else None

    def reason(self, halving: Halving, point: int) -> str:
        value = dict(self.ranked)[point]
        shown = "never measured" if value is None else f"{value:.4g}"
        cutoff = self.cutoff()
        bound = f", the last kept {cutoff:.4g}" if cutoff is not None and math.isfinite(cutoff) else ""
        return (f"pruned at rung {self.rung} (step {self.step}): {halving.metric} {shown} is not among the best "
                f"{len(self.kept)} of {len(self.ranked)} ({halving.mode}, keep {halving.keep_text}{bound})")


def decide(halving: Halving, rung: int, step: int, values: dict[int, Optional[float]]) -> RungDecision:
    """Rank the points that reached the rung; keep the best `halving.kept(n)`. A value never
    measured or not finite ranks last; ties go to the lower point index."""

    def order(item: tuple[int, Optional[float]]) -> tuple[bool, float, int]:
        point, value = item
        bad = value is None or not math.isfinite(value)
        score = 0.0 if bad or value is None else (value if halving.mode == "min" else -value)
        return (bad, score, point)

    ranked = sorted(values.items(), key=order)
    kept = sorted(p for p, _ in ranked[: halving.kept(len(ranked))])
    return RungDecision(rung=rung, step=step, ranked=ranked, kept=kept)


def mark_pruned(store: Store, slug: str, reason: str) -> None:
    """The run's status says `pruned` with REASON (its checkpoint stays: it resumes)."""
    status = read_status(store, slug)
    if status is None:
        return
    summary = (status.summary or Summary()).model_copy(update={"reason": reason, "exit_code": int(Exit.OK)})
    StatusWriter(store, slug, status).write(status.model_copy(update={"state": "pruned", "summary": summary, "heartbeat": utc_now()}))


def is_pruned(store: Store, slug: str) -> bool:
    status = read_status(store, slug)
    return status is not None and status.state == "pruned"


Say = Callable[[str], None]


@dataclass(frozen=True)
class Leg:
    """One point's part of a stage: train it to STEPS; BY names the limit when it is not the
    run's own :steps (its reason then says `truncated at step N by BY`)."""

    contender: Contender
    steps: int
    by: Optional[str]

    def limit(self, given: Optional[int]) -> Optional[int]:
        """The max_steps an attempt of this leg runs under (run.json records it): STEPS where
        they stop short of the run's own :steps, else the user's --max-steps GIVEN (or none)."""
        return limit(self.steps, self.contender.steps, given)


def limit(wanted: int, steps: int, given: Optional[int]) -> Optional[int]:
    """The max_steps of an attempt asked for WANTED steps of a run of STEPS: WANTED when it
    is short of them, else GIVEN (the user's --max-steps, or None)."""
    return wanted if wanted < steps else given


def standing(store: Store, slug: str) -> tuple[Optional[str], int, bool]:
    """The run's state, its step, and whether it reached a deftarget."""
    status = read_status(store, slug)
    if status is None:
        return None, 0, False
    reached = status.summary is not None and status.summary.target_reached_at_step is not None
    return status.state, status.step, reached


def to_train(store: Store, legs: list[Leg]) -> list[Leg]:
    """The legs with training left: a run already at its leg's steps (or one that reached
    its target, or failed) is not started again for nothing."""
    left = []
    for leg in legs:
        state, step, reached = standing(store, leg.contender.slug)
        if state in ("finished", "truncated", "pruned") and (step >= leg.steps or reached):
            continue
        left.append(leg)
    return left


Train = Callable[[list["Leg"]], bool]


def search(halving: Halving, contenders: list[Contender], store: Store, train_legs: Train, cap: Optional[int] = None,
           say: Say = print, decided: Optional[Callable[[RungDecision], None]] = None) -> dict[int, str]:
    """Run the halving: TRAIN_LEGS trains each stage's legs (it returns False when the sweep must stop:
    a signal, nothing can start); decide at each rung (DECIDED is told each rung's ranking: the
    scheduler stores it). Returns the points pruned, with why. CAP (--max-steps) ends the
    search at the first stage past it, pruning nothing there."""
    alive = list(contenders)
    pruned: dict[int, str] = {}
    for index, rung in enumerate(halving.rungs, 1):
        reaching = [c for c in alive if rung < c.steps]
        if len(reaching) < 2:  # one point or none left to rank: the rest train to their end
            break
        if cap is not None and cap < rung:
            say(f"halving: rung {index} (step {rung}) is past --max-steps {cap}; nothing is pruned there")
            break
        label = f"halving rung {index} of {len(halving.rungs)}"
        if not train_legs(to_train(store, [Leg(c, rung, label) for c in reaching])):
            return pruned
        at_rung, short = [], []
        for c in reaching:
            state, step, reached = standing(store, c.slug)
            if state == "failed" or reached:  # out of the ranking: failed, or done with success
                alive.remove(c)
            elif step >= rung:
                at_rung.append(c)
            else:
                short.append(c.point)
        if short:  # decided only once every point reached the rung (or is out)
            say(f"halving: rung {index} (step {rung}) waits for point(s) {' '.join(map(str, short))}; run the sweep again to go on")
            return pruned
        if not at_rung:
            continue
        decision = decide(halving, index, rung, {c.point: value_at(store, c.slug, halving.metric, rung) for c in at_rung})
        if decided is not None:
            decided(decision)
        for c in at_rung:
            if c.point not in decision.kept:
                pruned[c.point] = decision.reason(halving, c.point)
                mark_pruned(store, c.slug, pruned[c.point])
                alive.remove(c)
        say(f"halving: rung {index} (step {rung}): {len(decision.kept)} of {len(decision.ranked)} points go on: "
            + " ".join(str(p) for p in decision.kept))
    final = [Leg(c, c.steps if cap is None else min(cap, c.steps), None) for c in alive]
    train_legs(to_train(store, final))
    return pruned
