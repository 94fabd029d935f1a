"""Selectors over dotted paths: optimizer groups pick parameters by them, `:diagnostics
(:select ...)` picks diagnostics by them. The compiler and the runtime both match, so the
rule lives with the IR, which both read."""

from __future__ import annotations

import fnmatch
from typing import Iterable


def glob_match(selector: str, path: str) -> bool:
    """`*` matches one segment (or part of one, as in `w*`), `**` any number of segments,
    including none."""
    return _match(selector.split("."), path.split("."))


def _match(pattern: list[str], segments: list[str]) -> bool:
    if not pattern:
        return not segments
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match(rest, segments[i:]) for i in range(len(segments) + 1))
    return bool(segments) and fnmatch.fnmatchcase(segments[0], head) and _match(rest, segments[1:])


def selects(selectors: Iterable[str], name: str) -> bool:
    """Whether any of SELECTORS picks the diagnostic NAME (`grad-norm/blocks.0.w`): its
    `/` separators count as segment boundaries, like the path's dots."""
    dotted = name.replace("/", ".")
    return any(glob_match(s.replace("/", "."), dotted) for s in selectors)
