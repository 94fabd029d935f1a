"""The "did you mean" hint every name lookup that fails gives."""

from __future__ import annotations

from typing import Iterable


def did_you_mean(name: str, names: Iterable[str], cutoff: float) -> str:
    """`; did you mean `x`?` for the name of NAMES closest to NAME (in lower case, as the
    printer writes symbols), or "" when none is at least CUTOFF alike (difflib's ratio)."""
    import difflib  # only a failed lookup pays for it, not every check

    close = difflib.get_close_matches(name, sorted(set(names) - {name}), n=1, cutoff=cutoff)
    return f"; did you mean `{close[0].lower()}`?" if close else ""
