"""Lambda lists: parsed once per lambda or macro, bound on every call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from .conditions import lisp_error
from .printer import prin1_to_string
from .types import NIL, Cons, Symbol

Pattern = Union[Symbol, "LambdaList"]

LAMBDA_KEYWORDS = {"&OPTIONAL", "&REST", "&BODY", "&KEY", "&ALLOW-OTHER-KEYS", "&AUX", "&WHOLE", "&ENVIRONMENT"}


@dataclass
class OptionalParam:
    pattern: Pattern
    default: Any
    supplied: Optional[Symbol]


@dataclass
class KeyParam:
    keyword: Symbol
    pattern: Pattern
    default: Any
    supplied: Optional[Symbol]


@dataclass
class LambdaList:
    required: list[Pattern] = field(default_factory=list)
    optional: list[OptionalParam] = field(default_factory=list)
    rest: Optional[Pattern] = None
    has_key: bool = False
    keys: list[KeyParam] = field(default_factory=list)
    allow_other_keys: bool = False
    aux: list[tuple[Symbol, Any]] = field(default_factory=list)
    whole: Optional[Pattern] = None
    environment: Optional[Symbol] = None

    @property
    def min_args(self) -> int:
        return len(self.required)

    @property
    def max_args(self) -> Optional[int]:
        if self.rest is not None or self.has_key:
            return None
        return len(self.required) + len(self.optional)

    def variables(self) -> list[Symbol]:
        out: list[Symbol] = [self.environment] if self.environment is not None else []
        if self.whole is not None:
            out += _pattern_vars(self.whole)
        for p in self.required:
            out += _pattern_vars(p)
        for o in self.optional:
            out += _pattern_vars(o.pattern) + ([o.supplied] if o.supplied else [])
        if self.rest is not None:
            out += _pattern_vars(self.rest)
        for k in self.keys:
            out += _pattern_vars(k.pattern) + ([k.supplied] if k.supplied else [])
        out += [a for a, _ in self.aux]
        return out


def _pattern_vars(p: Pattern) -> list[Symbol]:
    return [p] if isinstance(p, Symbol) else p.variables()


def _bad(message: str) -> Exception:
    return lisp_error("E110", message, "PROGRAM-ERROR")


def parse_lambda_list(spec: Any, keyword: Any, macro: bool = False) -> LambdaList:
    """Parse an ordinary (macro=False) or macro/destructuring lambda list.
    `keyword(name)` interns a keyword symbol for &key parameters."""
    ll = LambdaList()
    state = "required"
    cell = spec
    if spec is not NIL and type(spec) is not Cons:
        if macro and isinstance(spec, Symbol):
            ll.rest = spec
            return ll
        raise _bad(f"a lambda list must be a list, got {prin1_to_string(spec)}")
    while type(cell) is Cons:
        item = cell.car
        cell = cell.cdr
        if isinstance(item, Symbol) and item.name in LAMBDA_KEYWORDS:
            previous = state
            state = _next_state(item.name, state, ll, macro)
            if state in ("whole", "environment"):
                if type(cell) is not Cons:
                    raise _bad(f"{item.name.lower()} needs a variable after it")
                target = cell.car
                cell = cell.cdr
                if state == "whole":
                    ll.whole = _pattern(target, keyword, macro)
                else:
                    ll.environment = _variable(target)
                state = "required" if state == "whole" else previous
            continue
        _add_param(ll, state, item, keyword, macro)
        if state == "rest":
            state = "after-rest"
    if cell is not NIL:
        if not macro:
            raise _bad(f"a dotted lambda list is only allowed in macros: {prin1_to_string(spec)}")
        ll.rest = _variable(cell)
    return ll


def _next_state(name: str, state: str, ll: LambdaList, macro: bool) -> str:
    if name == "&ALLOW-OTHER-KEYS":
        if state != "key":
            raise _bad("&allow-other-keys must follow &key parameters")
        ll.allow_other_keys = True
        return "after-allow"
    if name in ("&WHOLE", "&ENVIRONMENT", "&BODY") and not macro:
        raise _bad(f"{name.lower()} is only allowed in macro lambda lists")
    order = ["required", "whole", "optional", "rest", "after-rest", "key", "after-allow", "aux"]
    target = {"&OPTIONAL": "optional", "&REST": "rest", "&BODY": "rest", "&KEY": "key", "&AUX": "aux", "&WHOLE": "whole", "&ENVIRONMENT": "environment"}[name]
    if target == "environment":
        return "environment"
    if target == "whole" and (state != "required" or ll.required):
        raise _bad("&whole must come first in a lambda list")
    if state in order and order.index(target) <= order.index(state):
        raise _bad(f"{name.lower()} is out of order in the lambda list")
    if target == "key":
        ll.has_key = True
    return target


def _variable(x: Any) -> Symbol:
    if not isinstance(x, Symbol) or x is NIL or x.is_keyword or x.name in ("T",):
        raise _bad(f"{prin1_to_string(x)} cannot be used as a variable in a lambda list")
    return x


def _pattern(x: Any, keyword: Any, macro: bool) -> Pattern:
    if macro and (type(x) is Cons or x is NIL):
        # in a destructuring lambda list, () is the pattern that matches only an empty list
        return parse_lambda_list(x, keyword, macro=True)
    return _variable(x)


def _add_param(ll: LambdaList, state: str, item: Any, keyword: Any, macro: bool) -> None:
    if state == "required":
        ll.required.append(_pattern(item, keyword, macro))
    elif state == "optional":
        pattern, default, supplied = _param_with_default(item, keyword, macro)
        ll.optional.append(OptionalParam(pattern, default, supplied))
    elif state == "rest":
        ll.rest = _pattern(item, keyword, macro)
    elif state == "key":
        ll.keys.append(_key_param(item, keyword, macro))
    elif state == "aux":
        if type(item) is Cons:
            ll.aux.append((_variable(item.car), item.cdr.car if type(item.cdr) is Cons else NIL))
        else:
            ll.aux.append((_variable(item), NIL))
    else:
        raise _bad(f"unexpected {prin1_to_string(item)} in lambda list after {state.replace('after-', '&')}")


def _param_with_default(item: Any, keyword: Any, macro: bool) -> tuple[Pattern, Any, Optional[Symbol]]:
    if type(item) is not Cons:
        return _variable(item), NIL, None
    parts = list(item)
    pattern = _pattern(parts[0], keyword, macro)
    default = parts[1] if len(parts) > 1 else NIL
    supplied = _variable(parts[2]) if len(parts) > 2 else None
    return pattern, default, supplied


def _key_param(item: Any, keyword: Any, macro: bool) -> KeyParam:
    if type(item) is Cons and type(item.car) is Cons:
        spec = list(item.car)
        if len(spec) != 2 or not isinstance(spec[0], Symbol):
            raise _bad(f"bad &key parameter {prin1_to_string(item)}")
        default, supplied = _rest_default(item)
        return KeyParam(spec[0], _pattern(spec[1], keyword, macro), default, supplied)
    pattern, default, supplied = _param_with_default(item, keyword, macro)
    var = pattern if isinstance(pattern, Symbol) else None
    if var is None:
        raise _bad(f"bad &key parameter {prin1_to_string(item)}")
    return KeyParam(keyword(var.name), var, default, supplied)


def _rest_default(item: Cons) -> tuple[Any, Optional[Symbol]]:
    parts = list(item)
    default = parts[1] if len(parts) > 1 else NIL
    supplied = _variable(parts[2]) if len(parts) > 2 else None
    return default, supplied
