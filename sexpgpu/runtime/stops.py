"""Stop requests: SIGINT and SIGTERM, recorded rather than raised.

A handler that raises can have its exception swallowed by whatever code the signal lands
in (an import machinery callback did, and a run that had been asked to stop trained to the
end). So the handler only records the first request; whoever is waiting looks at it: the
session while it compiles (it exits 130/143: nothing was written), the training loop at
every step boundary (it checkpoints and exits 75). A second SIGINT raises
KeyboardInterrupt, to stop at once.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Callable, Iterator, Optional

HANDLED = (signal.SIGINT, signal.SIGTERM)


class StopRequests:
    def __init__(self) -> None:
        self.signal: Optional[int] = None

    @property
    def name(self) -> str:
        return signal.Signals(self.signal).name if self.signal is not None else ""

    def record(self, signum: int, frame: Optional[FrameType]) -> None:
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signal is None:
            self.signal = signum

    @contextmanager
    def listening(self) -> Iterator["StopRequests"]:
        """Record SIGINT/SIGTERM while the block runs (only the main thread can: elsewhere
        this does nothing and the process's own handling stays)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self.record) for s in HANDLED}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


Decide = Callable[[int, Optional[float]], Optional[str]]  # (step, the metric's value there) -> why the run stops, or None


@dataclass(frozen=True)
class EarlyStop:
    """Someone watching a run at some of its steps (a sweep's scheduler; the runtime knows
    no sweep): at each of STEPS the attempt measures EVAL (its pass runs there if its cadence
    does not fall on the step) and asks DECIDE with METRIC's value. A reason back ends the
    attempt at that step: checkpointed, `pruned`, resumable; None: it trains on."""

    steps: frozenset[int]
    eval: str
    metric: str
    decide: Decide
