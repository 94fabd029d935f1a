"""The draws of a sampled sweep: NumPy's Philox4x64-10 bit generator and the three
`numpy.random.Generator` draws a distribution makes (`random`, `uniform`, `integers`), in
plain Python.

A check of a file with a `defsweep :sample` draws every point, and importing NumPy for that
was an eighth of the check of examples/search.lisp. The sampled values are part of each point's
slug, so they must stay exactly what NumPy gives: `tests/test_search.py` compares these draws
with NumPy's on thousands of keys, ranges and bounds. The algorithms are Salmon et al.'s Philox
(SC'11: ten rounds of two 64-bit multiplies, the key bumped by Weyl constants between rounds),
NumPy's use of its counter (incremented before each block of four words; 32-bit draws take a
word's low half, then its high half), its doubles (the top 53 bits) and Lemire's nearly
divisionless bounded integers, as NumPy's `distributions.c` documents them.
"""

from __future__ import annotations

from typing import Callable

_MASK64 = (1 << 64) - 1
_MASK32 = (1 << 32) - 1
_MULTIPLIERS = (0xD2E7470EE14C6C93, 0xCA5A826395121157)
_WEYL = (0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B)
_ROUNDS = 10
_Draw = Callable[[], int]


def philox_block(counter: int, key: int) -> tuple[int, int, int, int]:
    """The four 64-bit words Philox4x64-10 makes of a 256-bit COUNTER and a 128-bit KEY."""
    c0, c1, c2, c3 = (counter >> (64 * i) & _MASK64 for i in range(4))
    k0, k1 = key & _MASK64, key >> 64 & _MASK64
    for round_ in range(_ROUNDS):
        if round_:
            k0, k1 = (k0 + _WEYL[0]) & _MASK64, (k1 + _WEYL[1]) & _MASK64
        p0, p1 = _MULTIPLIERS[0] * c0, _MULTIPLIERS[1] * c2
        c0, c1, c2, c3 = (p1 >> 64) ^ c1 ^ k0, p1 & _MASK64, (p0 >> 64) ^ c3 ^ k1, p0 & _MASK64
    return c0, c1, c2, c3


class PhiloxStream:
    """What `numpy.random.Generator(numpy.random.Philox(key=KEY))` draws, draw for draw."""

    def __init__(self, key: int) -> None:
        self._key = key
        self._counter = 0
        self._words: list[int] = []  # the block's words not yet drawn, the next one last
        self._high_half: int | None = None  # a 32-bit draw's leftover half

    def next_uint64(self) -> int:
        if not self._words:
            self._counter += 1
            self._words = list(reversed(philox_block(self._counter, self._key)))
        return self._words.pop()

    def next_uint32(self) -> int:
        if self._high_half is not None:
            half, self._high_half = self._high_half, None
            return half
        word = self.next_uint64()
        self._high_half = word >> 32
        return word & _MASK32

    def random(self) -> float:
        return (self.next_uint64() >> 11) * (1.0 / 9007199254740992.0)

    def uniform(self, low: float, high: float) -> float:
        return low + (high - low) * self.random()

    def integers(self, low: int, high: int | None = None) -> int:
        """An integer in [LOW, HIGH), or in [0, LOW) with one argument."""
        if high is None:
            low, high = 0, low
        span = high - 1 - low  # NumPy's closed range
        if span < 0:
            raise ValueError(f"integers({low}, {high}): the range is empty")
        if low < -(1 << 63) or high - 1 >= 1 << 63:
            raise ValueError(f"integers({low}, {high}): the bounds are not 64-bit integers (NumPy's int64)")
        if span == 0:
            return low
        if span <= _MASK32:
            return low + self._bounded(span, self.next_uint32, 32)
        return low + self._bounded(span, self.next_uint64, 64)

    @staticmethod
    def _bounded(span: int, draw: _Draw, bits: int) -> int:
        """Lemire's method on BITS-bit draws: a draw times the range's size, its high word,
        drawing again only where the low word falls under the threshold of a biased result."""
        mask = (1 << bits) - 1
        if span == mask:
            return draw()
        size = span + 1
        product = draw() * size
        if product & mask < size:
            threshold = (mask - span) % size
            while product & mask < threshold:
                product = draw() * size
        return product >> bits

