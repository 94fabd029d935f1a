"""What the training loop needs to know about data-parallel ranks.

A run with W ranks is W copies of the one loop. Every rank reads the same global batch and
keeps its own rows (batch/W of them), computes its gradients with the rank train program
(traced at batch/W), and the ranks' `Collective` averages gradients, loss and metrics so that
every rank applies the same update. Only rank 0 writes the run folder. The collectives
themselves (Ray's GLOO on the CPU, NCCL through CuPy on GPUs) live in workers/collective.py.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..ir.graph import TensorType
from .backend import Backend


class Collective(Protocol):
    rank: int
    world: int

    def reduce_step(self, out: dict[str, Any]) -> dict[str, Any]:
        """The step's outputs with gradients, loss and metrics reduced over the ranks."""
        ...

    def reduces_resident(self, backend: Backend, grads: dict[str, TensorType]) -> bool:
        """Whether this collective reduces BACKEND's resident gradients (GRADS: their names
        and types) where they live, on the device (NCCL with the CUDA device); otherwise the
        loop gives `reduce_step` host arrays."""
        ...

    def gradient_ready(self, name: str, value: Any) -> None:
        """Resident gradient NAME is complete (the step that makes it has been launched): a
        bucket whose gradients are all complete can start its all-reduce while the backward
        pass goes on."""
        ...

    def agree(self, value: bool) -> bool:
        """Rank 0's VALUE, on every rank (decisions only rank 0 can make, e.g. whether its
        checkpoint was published)."""
        ...

    def broadcast(self, value: float) -> float:
        """Rank 0's VALUE on every rank (values that differ by rank but must not, e.g. the
        elapsed time, which the ctx and the curriculum read)."""
        ...


def rows_of(batch: np.ndarray, rank: int, world: int) -> np.ndarray:
    """This rank's contiguous share of a global batch (its first axis)."""
    share = batch.shape[0] // world
    return batch[rank * share : (rank + 1) * share]
