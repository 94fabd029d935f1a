"""NumPy, imported when something first reads from it.

The op table's kernels are NumPy code, but `check` needs only the table's shape rules and
gradients, and importing NumPy is about a third of the imports of a check (issue 26). So the
op modules take `np` from here: importlib's LazyLoader puts a module object for numpy in
sys.modules whose first attribute read runs NumPy's real import; after that it is the plain
module, and an attribute read costs what it always does. Where NumPy is imported already,
`np` is that module. An ordinary `import numpy` anywhere later also finishes the import
(the import system reads the module's `__spec__`), so the runtime, which imports NumPy at the
top of its modules, always has it whole before any kernel runs on a thread of its own.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import TYPE_CHECKING

__all__ = ["np", "lazy_module"]


def lazy_module(name: str) -> ModuleType:
    """The module NAME: the imported one if there is one, else one that imports itself on first
    use (the recipe of importlib's documentation, "Implementing lazy imports")."""
    found = sys.modules.get(name)
    if found is not None:
        return found
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_module("numpy")
