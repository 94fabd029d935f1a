"""Batches for training (shuffled, resumable) and for evaluation (every example once, masked).

Training order: epoch e visits the examples in the order
`Generator(PCG64(SeedSequence([seed, e]))).permutation(n)` when shuffling, else 0..n-1.
Seeding by (seed, epoch) rather than seed + epoch keeps runs with neighbouring seeds from
sharing epochs. The state (epoch, position in that order, counters) is all that is needed to
continue the exact same sequence of batches.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
from pydantic import BaseModel, Field

from .spec import MASK_FIELD, DataError, Dataset


class LoaderState(BaseModel):
    epoch: int = Field(default=0, ge=0)  # epochs completed; the current epoch's index
    position: int = Field(default=0, ge=0)  # index of the next example in this epoch's order
    examples: int = Field(default=0, ge=0)
    tokens: int = Field(default=0, ge=0)
    batches: int = Field(default=0, ge=0)


def epoch_order(n: int, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    if not shuffle:
        return np.arange(n)
    sequence = np.random.SeedSequence([seed % 2**64, epoch])
    return np.random.Generator(np.random.PCG64(sequence)).permutation(n)


def tokens_per_example(dataset: Dataset) -> int:
    """Elements per example of the first integer field of rank >= 1 (the token inputs), else 0.

    Only the first such field counts, so a (tokens, targets) pair counts each position once.
    """
    for array in dataset.fields.values():
        if array.dtype.kind in "iu" and array.ndim >= 2:
            return int(np.prod(array.shape[1:]))
    return 0


class BatchStream:
    """Endless training batches of a static size; drop_last=False returns a short last batch."""

    def __init__(self, dataset: Dataset, batch: int, shuffle: bool = False, seed: int = 0, drop_last: bool = True) -> None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if drop_last and dataset.n < batch:
            raise DataError(f"{dataset.n} examples are fewer than one batch of {batch}")
        self.dataset = dataset
        self.batch = batch
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.tokens_per_example = tokens_per_example(dataset)
        self._state = LoaderState()
        self._order_epoch = -1
        self._order = np.arange(0)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        return self.next()

    def next(self) -> dict[str, np.ndarray]:
        state = self._state
        if not self._fits(state.position):  # only after restoring a state saved with another batch size
            state.epoch, state.position = state.epoch + 1, 0
        rows = self._epoch_order(state.epoch)[state.position:state.position + self.batch]
        out = {name: array[rows] for name, array in self.dataset.fields.items()}
        state.position += len(rows)
        state.examples += len(rows)
        state.tokens += len(rows) * self.tokens_per_example
        state.batches += 1
        if not self._fits(state.position):
            state.epoch, state.position = state.epoch + 1, 0
        return out

    def state(self) -> LoaderState:
        return self._state.model_copy()

    def restore(self, state: LoaderState) -> None:
        if state.position >= self.dataset.n:
            raise ValueError(f"loader state position {state.position} is past the {self.dataset.n} examples")
        self._state = state.model_copy()

    def counters(self) -> dict[str, int]:
        """What ctx shows: examples and tokens seen, epochs completed, batches, position."""
        state = self._state
        return {"examples": state.examples, "tokens": state.tokens, "epochs": state.epoch, "batches": state.batches, "position": state.position}

    @property
    def batches_per_epoch(self) -> int:
        n = self.dataset.n
        return n // self.batch if self.drop_last else -(-n // self.batch)

    def _fits(self, position: int) -> bool:
        remaining = self.dataset.n - position
        return remaining >= self.batch if self.drop_last else remaining > 0

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if epoch != self._order_epoch:
            self._order = epoch_order(self.dataset.n, self.shuffle, self.seed, epoch)
            self._order_epoch = epoch
        return self._order


class EvalBatches:
    """Every example exactly once, in order, in batches of the static size.

    The last batch is filled up by repeating its final real example rather than zeros, so
    padding rows stay valid inputs (no log(0) or division by zero turning a masked sum into
    NaN); MASK_FIELD is 1.0 for real rows and 0.0 for padding.
    """

    def __init__(self, dataset: Dataset, batch: int) -> None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if dataset.n == 0:
            raise DataError("no examples to evaluate")
        self.dataset = dataset
        self.batch = batch

    def __len__(self) -> int:
        return -(-self.dataset.n // self.batch)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        n = self.dataset.n
        for start in range(0, n, self.batch):
            real = min(self.batch, n - start)
            rows = np.arange(start, start + self.batch).clip(max=n - 1)
            out = {name: array[rows] for name, array in self.dataset.fields.items()}
            mask = np.zeros(self.batch, dtype=np.float32)
            mask[:real] = 1.0
            out[MASK_FIELD] = mask
            yield out
