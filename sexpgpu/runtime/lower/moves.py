"""Generated kernels that move elements or make constants: transpose, slice, concat along any
axis, unslice, take (a gather with clipped indices), argmax, and the constants (full,
arange, tril_mask and literal data). A thread per output element, over static shapes, so
every index is arithmetic on literals.

Element moves copy the storage bits (bf16 as its 16 bits, booleans as bytes): any dtype, and
exactly the CPU backend's values.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

import numpy as np

from ...ir.dtypes import DType, numpy_dtype
from ...ir.graph import Node, Program, Shape, shape_size
from ...ir.ops_reduce import normalize_axes
from .codegen import KernelSource, Param, assemble, c_types, declare, from_storage, literal, to_storage


def strides(shape: Shape) -> list[int]:
    """Row-major strides, in elements."""
    out = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        out[d] = out[d + 1] * shape[d + 1]
    return out


def coordinate(var: str, shape: Shape, axis: int) -> str:
    """Coordinate AXIS of flat index VAR in SHAPE, as C."""
    stride = strides(shape)[axis]
    divided = f"({var} / {stride}LL)" if stride > 1 else var
    return f"({divided} % {shape[axis]}LL)" if axis > 0 else divided


def flat(terms: list[tuple[str, int]]) -> str:
    """sum of coordinate * stride, as C."""
    parts = [expr if stride == 1 else f"{expr} * {stride}LL" for expr, stride in terms if stride != 0]
    return " + ".join(parts) if parts else "0"


def copy_kernel(prefix: str, node: Node, program: Program, source: str, inputs: list[int]) -> KernelSource:
    """out0[i] = SOURCE (a C expression over in0.. at output index i): one element per thread."""
    decls, params = declare(inputs, [node.id], program.types())
    return assemble(prefix, decls, "i", [f"    out0[i] = {source};"], params, shape_size(node.type.shape), 0)


def transpose_kernel(node: Node, program: Program) -> KernelSource:
    """out[i] = in[the source element of output i under perm]."""
    perm = list(node.attrs["perm"])
    out_shape = tuple(node.type.shape)
    in_strides = strides(tuple(program.types()[node.args[0]].shape))
    terms = [(coordinate("i", out_shape, d), in_strides[perm[d]]) for d in range(len(out_shape))]
    return copy_kernel("sx_transpose", node, program, f"in0[{flat(terms)}]", [node.args[0]])


def slice_kernel(node: Node, program: Program) -> KernelSource:
    """out[i] = in[starts + coordinates of i]."""
    out_shape = tuple(node.type.shape)
    in_strides = strides(tuple(program.types()[node.args[0]].shape))
    starts = list(node.attrs["starts"])
    base = sum(s * st for s, st in zip(starts, in_strides))
    terms = [(coordinate("i", out_shape, d), in_strides[d]) for d in range(len(out_shape))]
    index = flat(terms) if base == 0 else f"{base}LL + {flat(terms)}"
    return copy_kernel("sx_slice", node, program, f"in0[{index}]", [node.args[0]])


def unslice_kernel(node: Node, program: Program) -> KernelSource:
    """Zeros with the argument in the window [starts, stops)."""
    out_shape = tuple(node.type.shape)
    starts, stops = list(node.attrs["starts"]), list(node.attrs["stops"])
    window = tuple(hi - lo for lo, hi in zip(starts, stops))
    in_strides = strides(window)
    inside = " && ".join(f"{coordinate('i', out_shape, d)} >= {lo}LL && {coordinate('i', out_shape, d)} < {hi}LL"
                         for d, (lo, hi) in enumerate(zip(starts, stops)) if (lo, hi) != (0, out_shape[d])) or "true"
    terms = [(f"({coordinate('i', out_shape, d)} - {lo}LL)" if lo else coordinate("i", out_shape, d), in_strides[d]) for d, lo in enumerate(starts)]
    store, _ = c_types(node.type.dtype)
    return copy_kernel("sx_unslice", node, program, f"({inside}) ? in0[{flat(terms)}] : ({store})0", [node.args[0]])


def concat_kernel(node: Node, program: Program) -> KernelSource:
    """Each output element from the part that holds its coordinate along the axis."""
    types = program.types()
    out_shape = tuple(node.type.shape)
    axis = int(node.attrs["axis"]) % len(out_shape)
    along = coordinate("i", out_shape, axis)
    outer = shape_size(out_shape[:axis])
    inner = shape_size(out_shape[axis + 1:])
    body = [f"    const long long a = {along};", f"    const long long o = i / {out_shape[axis] * inner}LL;", f"    const long long r = i % {inner}LL;"]
    offset = 0
    for k, part in enumerate(node.args):
        width = types[part].shape[axis]
        test = "if" if k == 0 else "else if"
        index = f"(o * {width}LL + (a - {offset}LL)) * {inner}LL + r" if outer > 1 else f"(a - {offset}LL) * {inner}LL + r"
        body.append(f"    {test} (a < {offset + width}LL) out0[i] = in{k}[{index}];")
        offset += width
    decls, params = declare(list(node.args), [node.id], types)
    return assemble("sx_concat", decls, "i", body, params, shape_size(out_shape), 0)


def take_kernel(node: Node, program: Program) -> KernelSource:
    """out[outer, p, inner] = x[outer, clip(idx[p]), inner]: indices out of range go to the
    nearest row, as the CPU's take (mode="clip") does."""
    types = program.types()
    x_t, idx_t = types[node.args[0]], types[node.args[1]]
    axis = int(node.attrs.get("axis", 0)) % len(x_t.shape)
    rows = x_t.shape[axis]
    inner = shape_size(x_t.shape[axis + 1:])
    positions = shape_size(idx_t.shape)
    body = [
        f"    const long long r = i % {inner}LL;",
        f"    const long long p = (i / {inner}LL) % {positions}LL;",
        f"    const long long o = i / {inner * positions}LL;",
        "    long long row = (long long)in1[p];",
        f"    row = row < 0 ? 0 : (row > {rows - 1}LL ? {rows - 1}LL : row);",
        f"    out0[i] = in0[(o * {rows}LL + row) * {inner}LL + r];",
    ]
    decls, params = declare(list(node.args), [node.id], types)
    return assemble("sx_take", decls, "i", body, params, shape_size(node.type.shape), 0)


def argmax_kernel(node: Node, program: Program) -> KernelSource:
    """The index of the first maximum along the axis (a NaN is the maximum: the first NaN),
    as np.argmax: a thread per output."""
    types = program.types()
    x_t = types[node.args[0]]
    (axis,) = normalize_axes("argmax", node.attrs["axis"], len(x_t.shape))
    extent = x_t.shape[axis]
    inner = shape_size(x_t.shape[axis + 1:])
    _, compute = c_types(x_t.dtype)
    value = from_storage(f"in0[base + j * {inner}LL]", x_t.dtype)
    nan = x_t.dtype in (DType.f32, DType.bf16)
    body = [
        f"    const long long base = (o / {inner}LL) * {extent * inner}LL + o % {inner}LL;",
        f"    {compute} best = {from_storage('in0[base]', x_t.dtype)};",
        "    int at = 0;",
        f"    for (long long j = 1; j < {extent}LL{' && best == best' if nan else ''}; ++j) {{",
        f"      const {compute} v = {value};",
        f"      if (v > best{' || v != v' if nan else ''}) {{ best = v; at = (int)j; }}",
        "    }",
        "    out0[o] = at;",
    ]
    decls, params = declare([node.args[0]], [node.id], types)
    return assemble("sx_argmax", decls, "o", body, params, shape_size(node.type.shape), shape_size(x_t.shape))


# -- constants -------------------------------------------------------------------------------------
def full_kernel(node: Node, program: Program) -> KernelSource:
    value = to_storage(literal(node.attrs["value"], node.type.dtype), node.type.dtype)
    return copy_kernel("sx_full", node, program, value, [])


def arange_kernel(node: Node, program: Program) -> KernelSource:
    """start + step * i, in 64-bit integers when both are integers (else in double), then
    converted to the dtype as NumPy's astype does."""
    start, step = node.attrs.get("start", 0), node.attrs.get("step", 1)
    exact = all(isinstance(v, int) and not isinstance(v, bool) for v in (start, step))
    value = f"({start}LL + {step}LL * i)" if exact else f"({float(start)!r} + {float(step)!r} * (double)i)"
    dtype = node.type.dtype
    converted = to_storage(f"(float){value}", dtype) if dtype == DType.bf16 else f"({c_types(dtype)[0]}){value}"
    return copy_kernel("sx_arange", node, program, converted, [])


def tril_kernel(node: Node, program: Program) -> KernelSource:
    """1 where column - row <= k, else 0 (np.tril of ones)."""
    rows, cols = node.type.shape
    dtype = node.type.dtype
    one, zero = to_storage(literal(1, dtype), dtype), to_storage(literal(0, dtype), dtype)
    store, _ = c_types(dtype)
    return copy_kernel("sx_tril_mask", node, program, f"(i % {cols}LL) - (i / {cols}LL) <= {int(node.attrs.get('k', 0))}LL ? ({store}){one} : ({store}){zero}", [])


def table(values: Any, dtype: DType) -> list[str]:
    """Literal data as the storage's C initializers (bf16: its bits)."""
    array = np.asarray(values, dtype=numpy_dtype(dtype)).reshape(-1)
    if dtype == DType.bf16:
        return [str(int(b)) for b in array.view(np.uint16)]
    if dtype == DType.bool:
        return ["1" if b else "0" for b in array]
    return [literal(v.item(), dtype) for v in array]


def constant_kernel(node: Node, program: Program) -> KernelSource:
    """Literal data: a table in device memory (SX_TABLE), copied out. The table is named by
    the hash of its data, so the kernel's name (the hash of its text) tells constants apart."""
    dtype = node.type.dtype
    store, _ = c_types(dtype)
    values = ", ".join(table(node.attrs["data"], dtype)) or "0"
    size = shape_size(node.type.shape)
    data = f"sx_data_{hashlib.sha256((store + values).encode()).hexdigest()[:12]}"
    kernel = assemble("sx_constant", [f"{store}* __restrict__ out0"], "i", [f"    out0[i] = {data}[i];"],
                      [Param("out", node.id, dtype, tuple(node.type.shape))], size, 0)
    preamble = f"SX_TABLE {store} {data}[{max(size, 1)}] = {{{values}}};\n"
    return replace(kernel, source=preamble + kernel.source, preamble=preamble)
