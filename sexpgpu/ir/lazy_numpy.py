"""NumPy, imported when something first reads from it.

The op table's kernels are NumPy code, but `check` needs only the table's shape rules and
gradients, and importing NumPy is about a third of the imports of a check (issue 26). So the
op modules take `np` from here. Where NumPy is imported already, `np` is that module; else it
is a stand-in module whose first attribute read runs an ordinary `import numpy` and copies
NumPy's names into itself, so that every later read is a plain dictionary hit.

Not importlib's LazyLoader: on Python 3.11 it turns its module into a plain one before it
runs NumPy's import, so a Ctrl-C (or a failure) in the middle leaves a half-built `numpy` in
sys.modules for the next `import numpy` to find, and two threads can race on it. An ordinary
import is atomic to the import system (a failed one is taken out of sys.modules, under the
import lock), and the stand-in is never in sys.modules.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

__all__ = ["np", "lazy_module"]


class Deferred(ModuleType):
    """A module imported on the first read of one of its names."""

    def __getattr__(self, attr: str) -> Any:  # only for names not copied in yet
        real = importlib.import_module(self.__name__)
        self.__dict__.update(real.__dict__)
        return getattr(real, attr)


def lazy_module(name: str) -> ModuleType:
    """The module NAME: the imported one if there is one, else a Deferred stand-in."""
    found = sys.modules.get(name)
    if found is not None:
        return found
    if importlib.util.find_spec(name) is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    return Deferred(name)


if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_module("numpy")
