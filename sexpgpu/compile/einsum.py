"""einsum with static subscripts, lowered at staging to sums, transposes, reshapes and one
batched matmul per pair of operands (so the IR and the backends never see einsum)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lisp.conditions import lisp_error

if TYPE_CHECKING:
    from .tensors import Staged, TensorLib


def parse_spec(spec: str, count: int) -> tuple[list[str], str]:
    text = spec.replace(" ", "")
    if "->" in text:
        lhs, out = text.split("->")
    else:
        lhs = text
        letters = lhs.replace(",", "")
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    inputs = lhs.split(",")
    if len(inputs) != count:
        raise lisp_error("T001", f'einsum: "{spec}" names {len(inputs)} operands, got {count}', "TYPE-ERROR")
    if "..." in text:
        raise lisp_error("T001", f'einsum: "{spec}": `...` (broadcast axes) is not supported; name every axis with a letter', "TYPE-ERROR")
    for subs in inputs + [out]:
        repeated = sorted({c for c in subs if subs.count(c) > 1})
        if repeated:
            raise lisp_error("T001", f'einsum: "{spec}": index {repeated[0]} appears twice in "{subs}"; '
                             "a diagonal (an index repeated within one operand or the output) is not supported", "TYPE-ERROR")
    return inputs, out


def stage_einsum(lib: "TensorLib", spec: str, operands: list["Staged"]) -> "Staged":
    inputs, out = parse_spec(spec, len(operands))
    sizes: dict[str, int] = {}
    for subs, x in zip(inputs, operands):
        if len(subs) != x.type.rank:
            raise lisp_error("T001", f'einsum: subscripts "{subs}" do not match {x.type}', "TYPE-ERROR")
        for c, d in zip(subs, x.type.shape):
            if sizes.setdefault(c, d) != d:
                raise lisp_error("T001", f"einsum: index {c} is {sizes[c]} in one operand and {d} in another", "TYPE-ERROR")
    acc, acc_subs = operands[0], inputs[0]
    for i in range(1, len(operands)):
        rest = "".join(inputs[i + 1 :]) + out
        acc, acc_subs = contract_pair(lib, acc, acc_subs, operands[i], inputs[i], rest, sizes)
    return finish(lib, acc, acc_subs, out)


def sum_out(lib: "TensorLib", x: "Staged", subs: str, keep: str) -> tuple["Staged", str]:
    drop = [i for i, c in enumerate(subs) if c not in keep]
    if not drop:
        return x, subs
    return lib.op("einsum", "sum", x, axis=drop, keepdims=False), "".join(c for c in subs if c in keep)


def contract_pair(lib: "TensorLib", a: "Staged", sa: str, b: "Staged", sb: str, later: str, sizes: dict[str, int]) -> tuple["Staged", str]:
    a, sa = sum_out(lib, a, sa, sb + later)
    b, sb = sum_out(lib, b, sb, sa + later)
    batch = [c for c in sa if c in sb and c in later]
    contract = [c for c in sa if c in sb and c not in later]
    left = [c for c in sa if c not in sb]
    right = [c for c in sb if c not in sa]
    at = lib.op("einsum", "transpose", a, perm=[sa.index(c) for c in batch + left + contract])
    bt = lib.op("einsum", "transpose", b, perm=[sb.index(c) for c in batch + contract + right])

    def prod(cs: list[str]) -> int:
        n = 1
        for c in cs:
            n *= sizes[c]
        return n

    a3 = lib.op("einsum", "reshape", at, shape=[prod(batch), prod(left), prod(contract)])
    b3 = lib.op("einsum", "reshape", bt, shape=[prod(batch), prod(contract), prod(right)])
    product = lib.op("einsum", "matmul", a3, b3)
    result_subs = "".join(batch + left + right)
    return lib.op("einsum", "reshape", product, shape=[sizes[c] for c in result_subs]), result_subs


def finish(lib: "TensorLib", x: "Staged", subs: str, out: str) -> "Staged":
    x, subs = sum_out(lib, x, subs, out)
    if subs == out:
        return x
    if sorted(subs) != sorted(out):
        raise lisp_error("T001", f'einsum: output "{out}" uses indices not in the operands', "TYPE-ERROR")
    return lib.op("einsum", "transpose", x, perm=[subs.index(c) for c in out])
