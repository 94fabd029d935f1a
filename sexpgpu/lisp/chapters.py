"""The Lisp's builtins, one module per CLHS chapter (as SBCL's src/code/), installed into a
world in the order their constants and set-up need: numbers first (the constants the others
read), strings after streams (a string stream is a stream), calling and definitions last."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import (
    builtins_arrays,
    builtins_calling,
    builtins_conditions,
    builtins_conses,
    builtins_hashtables,
    builtins_iteration,
    builtins_numbers,
    builtins_sequences,
    builtins_streams,
    builtins_strings,
    builtins_structures,
    builtins_symbols,
)
from .registry import install_modules

if TYPE_CHECKING:
    from .evaluator import Interpreter


def install_builtins(interp: "Interpreter") -> None:
    builtins_numbers.define_constants(interp)
    install_modules(interp, (builtins_numbers, builtins_conses, builtins_sequences, builtins_arrays))
    builtins_arrays.define_constants(interp)
    install_modules(interp, (builtins_streams,))
    builtins_streams.define_variables(interp)
    install_modules(interp, (builtins_strings,))
    builtins_strings.set_up(interp)
    install_modules(interp, (builtins_calling, builtins_conditions, builtins_hashtables, builtins_symbols, builtins_structures, builtins_iteration))
    builtins_symbols.define_variables(interp)
    builtins_calling.set_up(interp)
