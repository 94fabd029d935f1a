"""CUDA C for a fused elementwise group, generated from the op table's expression templates.

One kernel per group: a grid-stride loop over the group's element space; each input is loaded
once per element through its broadcast index (shapes are static, so the index arithmetic is
constants), every node is one line over registers, and the group's outputs are stored.

bf16 is carried as its 16 bits (`unsigned short`) and computed in f32, rounded back to bf16
(round to nearest even) after every bf16 node, exactly as the NumPy backend computes bf16
(ml_dtypes rounds each op's result). No CUDA header is needed, so the same source compiles
with NVRTC on a GPU, with nvcc, and as C++ on the host (the test harness's emulation).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Optional

from ...ir.dtypes import DType, parse_dtype
from ...ir.graph import Node, Program, TensorType, shape_size
from ...ir.ops import op_def
from .fusion import FusedGroup

PRELUDE = r"""
#ifdef __CUDACC__
#define SX_FN __device__ __forceinline__
SX_FN float sx_bits_float(unsigned int b) { return __uint_as_float(b); }
SX_FN unsigned int sx_float_bits(float f) { return __float_as_uint(f); }
#else
#define SX_FN static inline
#endif
SX_FN float sx_bf16_to_f32(unsigned short h) { return sx_bits_float(((unsigned int)h) << 16); }
SX_FN unsigned short sx_f32_to_bf16(float f) {
  unsigned int u = sx_float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
SX_FN float sx_bf16_round(float f) { return sx_bf16_to_f32(sx_f32_to_bf16(f)); }
SX_FN float sx_maxf(float a, float b) { return (a != a || b != b) ? a + b : (a >= b ? a : b); }
SX_FN float sx_minf(float a, float b) { return (a != a || b != b) ? a + b : (a <= b ? a : b); }
SX_FN float sx_inf() { return sx_bits_float(0x7f800000u); }
SX_FN float sx_nan() { return sx_bits_float(0x7fc00000u); }
"""

# storage type in memory, type the kernel computes in
C_TYPES: dict[DType, tuple[str, str]] = {
    DType.f32: ("float", "float"),
    DType.bf16: ("unsigned short", "float"),
    DType.i32: ("int", "int"),
    DType.i64: ("long long", "long long"),
    DType.bool: ("unsigned char", "bool"),
}


class LoweringError(Exception):
    """The CUDA lowering cannot express this program (an unsupported dtype or op)."""


@dataclass
class Param:
    role: str  # "in" or "out"
    value: int  # IR value id
    dtype: DType
    shape: tuple[int, ...]


@dataclass
class KernelSource:
    name: str
    source: str  # the kernel alone; compile PRELUDE + source
    params: list[Param]
    size: int  # elements of the loop
    flops: int
    bytes: int

    def full_source(self) -> str:
        return PRELUDE + self.source


def c_types(dtype: DType) -> tuple[str, str]:
    try:
        return C_TYPES[dtype]
    except KeyError:
        raise LoweringError(f"the CUDA device does not compute {dtype.value} elementwise (f32, bf16, i32, i64, bool)") from None


def literal(value: Any, dtype: DType) -> str:
    if dtype == DType.bool:
        return "true" if value else "false"
    if dtype in (DType.i32, DType.i64):
        return f"{int(value)}" + ("LL" if dtype == DType.i64 else "")
    v = float(value)
    if math.isnan(v):
        return "sx_nan()"
    if math.isinf(v):
        return "sx_inf()" if v > 0 else "(-sx_inf())"
    text = repr(v)
    return f"{text}f" if ("." in text or "e" in text) else f"{text}.0f"


def broadcast_index(shape: tuple[int, ...], space: tuple[int, ...], i: str) -> str:
    """The C expression of the flat index into a tensor of SHAPE, broadcast (right-aligned,
    as NumPy does) over the loop's element space SPACE at flat index I."""
    if tuple(shape) == tuple(space):
        return i
    if shape_size(shape) == 1:
        return "0"
    lead = len(space) - len(shape)
    terms = []
    space_stride = 1
    strides = []
    for d in range(len(space) - 1, -1, -1):
        strides.append((d, space_stride))
        space_stride *= space[d]
    own_stride = 1
    own: dict[int, int] = {}
    for d in range(len(shape) - 1, -1, -1):
        own[d + lead] = own_stride
        own_stride *= shape[d]
    for d, stride in sorted(strides):
        if d < lead or shape[d - lead] == 1:
            continue
        coord = f"(({i} / {stride}LL) % {space[d]}LL)" if stride > 1 else f"({i} % {space[d]}LL)"
        terms.append(coord if own[d] == 1 else f"{coord} * {own[d]}LL")
    return " + ".join(terms) if terms else "0"


def node_expression(node: Node, args: list[str], types: dict[int, TensorType]) -> str:
    if node.op == "broadcast_to":
        return args[0]
    template = op_def(node.op).cuda
    if template is None:
        raise LoweringError(f"op {node.op} has no CUDA template")
    if node.op == "cast":
        return f"(({c_types(parse_dtype(node.attrs['dtype']))[1]}){args[0]})"
    return template.format(*args)


def elementwise_kernel(group: FusedGroup, program: Program, constants: Optional[dict[int, Node]] = None) -> KernelSource:
    """The kernel computing GROUP (its inputs are read, its outputs written)."""
    types = program.types()
    constants = constants or {}
    space = group.shape
    params: list[Param] = []
    names: dict[int, str] = {}
    lines: list[str] = []
    arg_decls: list[str] = []
    for k, vid in enumerate(group.inputs):
        t = types[vid]
        store, compute = c_types(t.dtype)
        arg_decls.append(f"const {store}* __restrict__ in{k}")
        params.append(Param("in", vid, t.dtype, tuple(t.shape)))
        index = broadcast_index(tuple(t.shape), space, "i")
        load = f"in{k}[{index}]"
        if t.dtype == DType.bf16:
            load = f"sx_bf16_to_f32({load})"
        elif t.dtype == DType.bool:
            load = f"({load} != 0)"
        names[vid] = f"a{k}"
        lines.append(f"    const {compute} a{k} = {load};")
    flops = 0
    for node in group.nodes:
        args = []
        for a in node.args:
            if a in names:
                args.append(names[a])
            elif a in constants:
                c = constants[a]
                args.append(literal(c.attrs["value"], c.type.dtype))
            else:
                raise LoweringError(f"value %{a} is neither an input nor computed in the group")
        expression = node_expression(node, args, types)
        _, compute = c_types(node.type.dtype)
        if node.type.dtype == DType.bf16:
            expression = f"sx_bf16_round({expression})"
        names[node.id] = f"v{node.id}"
        lines.append(f"    const {compute} v{node.id} = {expression};")
        if node.op != "broadcast_to":
            flops += op_def(node.op).flops(node, [types[a] for a in node.args])
    for k, vid in enumerate(group.outputs):
        t = types[vid]
        store, _ = c_types(t.dtype)
        arg_decls.append(f"{store}* __restrict__ out{k}")
        params.append(Param("out", vid, t.dtype, tuple(t.shape)))
        value = names[vid]
        if t.dtype == DType.bf16:
            value = f"sx_f32_to_bf16({value})"
        elif t.dtype == DType.bool:
            value = f"(unsigned char)({value})"
        lines.append(f"    out{k}[i] = {value};")
    body = "\n".join(lines)
    signature = ", ".join(arg_decls + ["long long n"])
    template = (
        'extern "C" __global__ void {name}(' + signature + ") {{\n"
        "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x) {{\n"
        + body.replace("{", "{{").replace("}", "}}") + "\n  }}\n}}\n"
    )
    digest = hashlib.sha256(template.encode()).hexdigest()[:12]
    name = f"sx_fused_{digest}"
    size = shape_size(space)
    moved = sum(shape_size(p.shape) * max(1, BYTES[p.dtype]) for p in params)
    return KernelSource(name=name, source=template.format(name=name), params=params, size=size, flops=flops, bytes=moved)


BYTES = {DType.f32: 4, DType.bf16: 2, DType.f16: 2, DType.f64: 8, DType.i32: 4, DType.i64: 8, DType.bool: 1}
