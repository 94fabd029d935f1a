"""Schedulers: who decides, at a sweep's rungs, which points train on (after Ray Tune's
TrialScheduler).

A scheduler is told of each point as it starts (`on_start`) and of each result at a rung
step (`on_result(point, step, value) -> continue | stop | pause`).
Three implement it, chosen by the defsweep's `:halving (... :scheduler S)`:

- `:sync` (SyncHalving), successive halving as it always was: a point pauses at each rung
  until every point reached it, then the best fraction goes on (halving.py runs its stages);
- `:asha` (Asha), asynchronous successive halving: a point is decided the moment it reaches
  a rung, ranked among the points decided at that rung before it; it goes on if it is among
  the best fraction of them, with no rung barrier, on the worker it trains on;
- `:median` (MedianStopping), the median stopping rule: a point whose value at a rung is
  worse than the median of the values the other points logged there stops.

Every decision is a Decision record in the store (DecisionBook, under the sweep's folder),
computed from what the store holds when it is made: the values logged at the rung by the
points decided there before. A decision once stored is the decision: a killed sweep, run
again, takes the stored ones and decides the rest as it goes, so it decides alike.
"""

from __future__ import annotations

import math
import statistics
from typing import Literal, Optional

from pydantic import BaseModel

from ..ir.experiment import Halving, Scheduler
from ..runtime.stops import EarlyStop
from ..runtime.store import Store
from .halving import Contender, Leg, RungDecision, decide, is_pruned, mark_pruned, standing, to_train
from .ledger import concurrently

Action = Literal["continue", "stop", "pause"]
MEDIAN_AFTER = 3  # the median rule decides once this many other points logged a value at the rung


class Decision(BaseModel):
    """A scheduler's word on one point at one rung, as the store keeps it."""

    scheduler: Scheduler
    point: int
    slug: str
    rung: int  # 1-based
    step: int
    value: Optional[float]  # the metric at the rung (None: never measured, or not finite)
    action: Literal["continue", "stop"]
    among: list[int]  # the points whose values at the rung it was decided among, itself included
    reason: str  # why it stops; "" when it goes on


class DecisionBook:
    """A sweep's decisions in the store, under PREFIX (STORE/sweeps/STEM.SWEEP):
    `decisions/rung-K/point-NNNNN.json`, one Decision each, written once.

    SEEN, the decisions a process has read before (by URL; a worker that trains one point
    after another keeps it): a decision is written once, so one read is enough, and a point
    deciding at a rung reads only the decisions made there since (listed), not every one
    made there before it; else each decision at a rung read them all, O(N^2) per sweep."""

    def __init__(self, store: Store, prefix: str, seen: Optional[dict[str, Decision]] = None) -> None:
        self.store, self.prefix = store, f"{prefix}/decisions"
        self.seen: dict[str, Decision] = {} if seen is None else seen

    def path(self, point: int, rung: int) -> str:
        return f"{self.prefix}/rung-{rung}/point-{point:05d}.json"

    def get(self, point: int, rung: int) -> Optional[Decision]:
        try:
            return Decision.model_validate_json(self.store.read_bytes(self.path(point, rung)))
        except FileNotFoundError:
            return None

    def at_rung(self, rung: int) -> list[Decision]:
        """The decisions stored at RUNG, by point."""
        return sorted(concurrently(self.read, self.store.list(f"{self.prefix}/rung-{rung}")), key=lambda d: d.point)

    def read(self, path: str) -> Decision:
        url = self.store.url_of(path)
        decision = self.seen.get(url)
        if decision is None:
            decision = self.seen[url] = Decision.model_validate_json(self.store.read_bytes(path))
        return decision

    def every(self, rungs: int) -> list[Decision]:
        return [d for rung in range(1, rungs + 1) for d in self.at_rung(rung)]

    def put(self, decision: Decision) -> Decision:
        """DECISION, unless one is stored for its point and rung already: that one."""
        stored = self.get(decision.point, decision.rung)
        if stored is not None:
            return stored
        self.store.write_bytes(self.path(decision.point, decision.rung), decision.model_dump_json().encode())
        return decision


def finite(value: Optional[float]) -> Optional[float]:
    return value if value is not None and math.isfinite(value) else None


class RungScheduler:
    """The scheduler interface, and what every scheduler shares: `on_start(point)` (a point
    stopped before stays stopped), `on_result(point, step, value)` (continue, stop, or pause
    at a barrier) and the rule each implements; the rungs; the book of decisions."""

    name: Scheduler = "sync"

    def __init__(self, halving: Halving, book: DecisionBook, slugs: dict[int, str]) -> None:
        self.halving, self.book, self.slugs = halving, book, slugs

    def rung_of(self, step: int) -> Optional[int]:
        return self.halving.rungs.index(step) + 1 if step in self.halving.rungs else None

    def on_start(self, point: int) -> Action:
        """"stop" for a point stopped at a rung before (a sweep run again), else "continue"."""
        return "stop" if self.stopped(point) is not None else "continue"

    def stopped(self, point: int) -> Optional[Decision]:
        return next((d for d in (self.book.get(point, r) for r in range(1, len(self.halving.rungs) + 1)) if d is not None and d.action == "stop"), None)

    def on_result(self, point: int, step: int, value: Optional[float]) -> Action:
        decision = self.decision(point, step, value)
        return "continue" if decision is None else decision.action

    def decision(self, point: int, step: int, value: Optional[float]) -> Optional[Decision]:
        """The decision on POINT at STEP (None: not a rung): the stored one, or one made now
        from the values stored at the rung, then stored."""
        rung = self.rung_of(step)
        if rung is None:
            return None
        stored = self.book.get(point, rung)
        if stored is not None:
            return stored
        earlier = {d.point: d.value for d in self.book.at_rung(rung) if d.point != point}
        action, reason = self.rule(point, rung, step, finite(value), earlier)
        return self.book.put(Decision(scheduler=self.name, point=point, slug=self.slugs.get(point, ""), rung=rung, step=step,
                                      value=finite(value), action=action, among=sorted([*earlier, point]), reason=reason))

    def rule(self, point: int, rung: int, step: int, value: Optional[float], earlier: dict[int, Optional[float]]) -> tuple[Literal["continue", "stop"], str]:
        raise NotImplementedError

    def early_stop(self, point: int) -> EarlyStop:
        """The attempt's hook: asked at each rung step, the reason it stops (None: it goes on)."""

        def ask(step: int, value: Optional[float]) -> Optional[str]:
            decision = self.decision(point, step, value)
            return decision.reason if decision is not None and decision.action == "stop" else None

        name, _, metric = self.halving.metric.partition("/")
        return EarlyStop(steps=frozenset(self.halving.rungs), eval=name, metric=metric, decide=ask)

    def legs(self, contenders: list[Contender], store: Store, cap: Optional[int]) -> list[Leg]:
        """An asynchronous sweep's legs: every point to its end (CAP: --max-steps), on one
        worker, asked at each rung as it gets there. A point stopped at a rung before (a
        sweep run again) is not started once it stands at that rung (its status made
        `pruned` if the stop came before the run said so); short of it, it trains there
        again and the stored decision stops it. Points with nothing left are left out."""
        legs = []
        for c in contenders:
            stop = self.stopped(c.point) if self.on_start(c.point) == "stop" else None
            if stop is not None and standing(store, c.slug)[1] >= stop.step:
                if not is_pruned(store, c.slug):
                    mark_pruned(store, c.slug, stop.reason)
                continue
            legs.append(Leg(c, c.steps if cap is None else min(cap, c.steps), None))
        return to_train(store, legs)

    def pruned(self) -> dict[int, str]:
        """The points stopped at a rung, with why."""
        return {d.point: d.reason for d in self.book.every(len(self.halving.rungs)) if d.action == "stop"}


class SyncHalving(RungScheduler):
    """Successive halving with a barrier: a point pauses at each rung; once every point
    reached it (or is out), halving.search ranks them all (halving.decide) and stores each
    point's decision (`record`)."""

    name: Scheduler = "sync"

    def on_result(self, point: int, step: int, value: Optional[float]) -> Action:
        rung = self.rung_of(step)
        if rung is None:
            return "continue"
        stored = self.book.get(point, rung)
        return "pause" if stored is None else stored.action

    def record(self, ranking: RungDecision) -> None:
        """The rung's ranking, one Decision per point ranked."""
        among = sorted(p for p, _ in ranking.ranked)
        for point, value in ranking.ranked:
            kept = point in ranking.kept
            self.book.put(Decision(scheduler="sync", point=point, slug=self.slugs.get(point, ""), rung=ranking.rung, step=ranking.step,
                                   value=finite(value), action="continue" if kept else "stop", among=among,
                                   reason="" if kept else ranking.reason(self.halving, point)))


class Asha(RungScheduler):
    """Asynchronous successive halving: a point goes on from a rung if it is among the best
    `keep` fraction (at least one) of the points decided there so far, itself included."""

    name: Scheduler = "asha"

    def rule(self, point: int, rung: int, step: int, value: Optional[float], earlier: dict[int, Optional[float]]) -> tuple[Literal["continue", "stop"], str]:
        ranking = decide(self.halving, rung, step, {**earlier, point: value})
        if point in ranking.kept:
            return "continue", ""
        return "stop", f"{ranking.reason(self.halving, point)}; asha: among the points decided at the rung so far"


class MedianStopping(RungScheduler):
    """The median stopping rule: once MEDIAN_AFTER other points logged a value at the rung,
    a point worse than their median stops there (one never measured, too)."""

    name: Scheduler = "median"

    def rule(self, point: int, rung: int, step: int, value: Optional[float], earlier: dict[int, Optional[float]]) -> tuple[Literal["continue", "stop"], str]:
        others = [v for v in earlier.values() if v is not None]
        if len(others) < MEDIAN_AFTER:
            return "continue", ""
        median = statistics.median(others)
        if value is not None and (value <= median if self.halving.mode == "min" else value >= median):
            return "continue", ""
        shown = "never measured" if value is None else f"{value:.4g}"
        return "stop", (f"pruned at rung {rung} (step {step}): {self.halving.metric} {shown} is worse than the median {median:.4g} "
                        f"of the {len(others)} points measured at the rung before it ({self.halving.mode}, median rule)")


SCHEDULERS: dict[Scheduler, type[RungScheduler]] = {"sync": SyncHalving, "asha": Asha, "median": MedianStopping}


def scheduler_for(halving: Halving, store: Store, prefix: str, slugs: dict[int, str], seen: Optional[dict[str, Decision]] = None) -> RungScheduler:
    """The scheduler the defsweep's :halving names, its decisions in STORE under PREFIX
    (SEEN: those read before, DecisionBook)."""
    return SCHEDULERS[halving.scheduler](halving, DecisionBook(store, prefix, seen), slugs)


class SchedulerJob(BaseModel):
    """What a worker process needs to ask the sweep's scheduler about its point: the plan,
    the sweep's folder in the store, the point and its slug."""

    halving: Halving
    prefix: str
    point: int
    slug: str

    def early_stop(self, store: Store, seen: Optional[dict[str, Decision]] = None) -> EarlyStop:
        """The attempt's hook; SEEN: the decisions this process read for earlier points."""
        return scheduler_for(self.halving, store, self.prefix, {self.point: self.slug}, seen).early_stop(self.point)
