"""The C that every generated device kernel is made of: the prelude (bf16 conversions, NaN-aware
max and min, Philox), the storage and compute type of each dtype, literals, broadcast
indexing over static shapes, the grid-stride loop over items given to lanes, warps of lanes
or groups of lanes (`assemble`, which names a kernel by the hash of its text), the lanes'
fixed-order tree, and one line over registers per node from the op table's expression
templates (`chain_lines`). The generators in kernels.py and row_kernel.py build kernels from these.

No dialect's syntax is written here: a kernel's head, where a lane is, what its group
shares, its barriers and the few intrinsics are names (`DIALECT_NAMES`) that each dialect
defines before PRELUDE: runtime/cuda/dialect.py as CUDA (threads, blocks, shared memory),
runtime/cpu/hostc.py the functions' part of it for the host (tests/test_architecture.py
checks that no CUDA syntax is in runtime/lower/).

bf16 is carried as its 16 bits (`unsigned short`) and computed in f32, rounded back to bf16
(round to nearest even) after every bf16 node, exactly as the NumPy backend computes bf16
(ml_dtypes rounds each op's result). sx_maxf and sx_minf return b when a and b are equal
(+0 and -0 included), as NumPy's maximum and minimum do. No CUDA header is needed, so the same source compiles
with NVRTC on a GPU, with nvcc, and as C++ on the host (the test harness's emulation).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import numpy as np

from ...ir.dtypes import DType, numpy_dtype
from ...ir.graph import Node, Shape, TensorType, shape_size
from ...ir.ops import ReducerSpec, op_def
from ..backend import DeviceError

PRELUDE = r"""
SX_FN float sx_bf16_to_f32(unsigned short h) { return sx_bits_float(((unsigned int)h) << 16); }
SX_FN unsigned short sx_f32_to_bf16(float f) {
  unsigned int u = sx_float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
SX_FN float sx_bf16_round(float f) { return sx_bf16_to_f32(sx_f32_to_bf16(f)); }
SX_FN float sx_maxf(float a, float b) { return SX_UNORDERED(a, b) ? a + b : (a > b ? a : b); }
SX_FN float sx_minf(float a, float b) { return SX_UNORDERED(a, b) ? a + b : (a < b ? a : b); }
SX_FN double sx_maxd(double a, double b) { return SX_UNORDERED(a, b) ? a + b : (a >= b ? a : b); }
SX_FN double sx_mind(double a, double b) { return SX_UNORDERED(a, b) ? a + b : (a <= b ? a : b); }
SX_FN float sx_inf() { return sx_bits_float(0x7f800000u); }
SX_FN float sx_nan() { return sx_bits_float(0x7fc00000u); }
SX_FN void sx_philox(unsigned int c[4], unsigned int k0, unsigned int k1) {
  for (int r = 0; r < 10; ++r) {
    if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
    const unsigned int hi0 = sx_mulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
    const unsigned int hi1 = sx_mulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
    const unsigned int n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
  }
}
"""

# What a dialect defines before PRELUDE (runtime/cuda/dialect.py for the GPU, runtime/cpu/hostc.py
# for the host): the function qualifier SX_FN and SX_TABLE (a constant's table); the bit casts
# sx_bits_float / sx_float_bits; sx_mulhi (the high word of a 32-bit product) and sx_fadd /
# sx_fmul (one rounding, never fused); and for the kernels' own text the head of a kernel
# (SX_KERNEL for independent items, SX_COOPERATIVE for lanes that meet at barriers), where a
# lane is (SX_LANE: its index in its group of SX_LANES, SX_GROUP: the group's index, of
# SX_GROUPS), memory its group shares (SX_SHARED) and the barriers (SX_SYNC_WARP, SX_SYNC_BLOCK).
DIALECT_NAMES = ("SX_FN", "SX_TABLE", "sx_bits_float", "sx_float_bits", "sx_mulhi", "sx_fadd", "sx_fmul", "SX_UNORDERED",
                 "SX_KERNEL", "SX_COOPERATIVE", "SX_LANE", "SX_LANES", "SX_GROUP", "SX_GROUPS", "SX_SHARED", "SX_SYNC_WARP", "SX_SYNC_BLOCK")

# storage type in memory, type the kernel computes in
C_TYPES: dict[DType, tuple[str, str]] = {
    DType.f32: ("float", "float"),
    DType.bf16: ("unsigned short", "float"),
    DType.i32: ("int", "int"),
    DType.i64: ("long long", "long long"),
    DType.bool: ("unsigned char", "bool"),
    DType.f64: ("double", "double"),  # only a split reduction's partial results
}


PARAM_BYTES = 4096  # the classic limit of a kernel's parameters (more needs CUDA >= 12.1 and a recent driver)
BLOCK = 256  # threads per block on the device: a "block" reduction's lanes (the host emitter reduces in the same order)


class GroupNodes(Protocol):
    """The nodes one generated kernel computes, the values it reads and those it writes."""

    @property
    def nodes(self) -> list[Node]: ...

    @property
    def inputs(self) -> list[int]: ...

    @property
    def outputs(self) -> list[int]: ...


class LoweringError(DeviceError):
    """The CUDA lowering cannot express this program (an unsupported dtype or op): the device
    cannot run it, which a run reports as it reports any device it cannot use (exit 4)."""


@dataclass
class Param:
    role: str  # "in" or "out"
    value: int  # IR value id
    dtype: DType
    shape: Shape


@dataclass
class KernelSource:
    name: str
    source: str  # the kernel alone; compile PRELUDE + source
    params: list[Param]
    size: int  # items of the loop: elements, rows or outputs
    flops: int
    bytes: int
    lanes: str = "thread"  # who computes one item: a "thread", a "warp" (32 lanes) or a "block"
    threads: Optional[int] = None  # the block size the kernel is written for (None: any multiple of 32)
    # the pieces `assemble` put together, which the host emitter (runtime/cpu/hostc.py) puts
    # together again as a plain loop over the items of a thread-lane kernel
    decls: tuple[str, ...] = ()
    loop: str = "i"
    lines: tuple[str, ...] = ()
    before: tuple[str, ...] = ()
    preamble: str = ""  # file-scope C the kernel needs (a constant's table)
    table: bool = False  # its arrays' pointers come in a device array (too many for PARAM_BYTES), then n


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
    # the constant as the NumPy backend holds it: rounded to the dtype (bf16 has 8 bits)
    v = float(np.asarray(value, dtype=np.float32).astype(numpy_dtype(dtype)).astype(np.float32)) if dtype in (DType.f32, DType.bf16) else float(value)
    if math.isnan(v):
        return "sx_nan()"
    if math.isinf(v):
        return "sx_inf()" if v > 0 else "(-sx_inf())"
    text = repr(v)
    return f"{text}f" if ("." in text or "e" in text) else f"{text}.0f"


def broadcast_index(shape: Shape, space: Shape, i: str) -> str:
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


def node_expression(node: Node, args: list[str]) -> str:
    """NODE's value as a C expression over its arguments ARGS (C names or literals), from the
    op table's template."""
    definition = op_def(node.op)
    integer = node.type.dtype in (DType.i32, DType.i64)
    template = definition.c_expr_integer if integer and definition.c_expr_integer is not None else definition.c_expr
    if template is None:
        raise LoweringError(f"op {node.op} has no C expression")
    return template.format(*args, dtype=c_types(node.type.dtype)[1])


def from_storage(memory: str, dtype: DType) -> str:
    """A value read from memory as the kernel computes with it."""
    if dtype == DType.bf16:
        return f"sx_bf16_to_f32({memory})"
    if dtype == DType.bool:
        return f"({memory} != 0)"
    return memory


def to_storage(value: str, dtype: DType) -> str:
    """A computed value as memory holds it."""
    if dtype == DType.bf16:
        return f"sx_f32_to_bf16({value})"
    if dtype == DType.bool:
        return f"(unsigned char)({value})"
    return value


def declare(inputs: list[int], outputs: list[int], types: dict[int, TensorType]) -> tuple[list[str], list[Param]]:
    """The kernel parameters in0.. (read) and out0.. (written), and their Params."""
    decls, params = [], []
    for role, values in (("in", inputs), ("out", outputs)):
        for k, vid in enumerate(values):
            t = types[vid]
            store, _ = c_types(t.dtype)
            decls.append(f"const {store}* __restrict__ in{k}" if role == "in" else f"{store}* __restrict__ out{k}")
            params.append(Param(role, vid, t.dtype, tuple(t.shape)))
    return decls, params


# the grid-stride loop over items, by who computes one item; a warp's or a block's lanes
# cooperate through `part` (shared memory) with `lane` in [0, lanes)
LOOPS = {
    "thread": ((), "(long long)SX_GROUP * SX_LANES + SX_LANE", "(long long)SX_LANES * SX_GROUPS"),
    "warp": (("  SX_SHARED double sx_part[1024];", "  const int lane = SX_LANE & 31, lanes = 32;", "  double* part = sx_part + (SX_LANE & ~31u);"),
             "((long long)SX_GROUP * SX_LANES + SX_LANE) >> 5", "((long long)SX_LANES * SX_GROUPS) >> 5"),
    "block": (("  SX_SHARED double sx_part[1024];", "  const int lane = SX_LANE, lanes = SX_LANES;", "  double* part = sx_part;"),
              "(long long)SX_GROUP", "(long long)SX_GROUPS"),
    # a group per item whose lanes share tiles of their own (`before` declares them): the
    # kernel is written for `threads` lanes
    "tile": (("  const int lane = SX_LANE;",), "(long long)SX_GROUP", "(long long)SX_GROUPS"),
}
SYNC = {"warp": "SX_SYNC_WARP;", "block": "SX_SYNC_BLOCK;"}


def assemble(prefix: str, decls: list[str], loop: str, lines: list[str], params: list[Param], size: int, flops: int,
             before: tuple[str, ...] = (), moved: Optional[int] = None, lanes: str = "thread", threads: Optional[int] = None) -> KernelSource:
    """A kernel: LINES inside a grid-stride loop over `LOOP < n` (items given to threads,
    warps or blocks, as LANES says), named PREFIX_<hash of its text>."""
    setup, first, stride = LOOPS[lanes]
    table = 8 * (len(decls) + 1) > PARAM_BYTES
    if table:  # the pointers through device memory, unpacked as the host's kernels unpack theirs
        signature = "void* const* __restrict__ sx_args, long long n"
        setup = (*unpack(decls), *setup)
    else:
        signature = ", ".join(decls + ["long long n"])
    # a kernel whose lanes cooperate is SX_COOPERATIVE: a CUDA kernel on the device, a
    # coroutine per lane in the host emulation (tests/cuda_host.py)
    head = "SX_KERNEL" if lanes == "thread" else "SX_COOPERATIVE"
    text = (
        f"{head} @NAME@({signature}) {{\n" + "".join(f"{line}\n" for line in (*setup, *before))
        + f"  for (long long {loop} = {first}; {loop} < n; {loop} += {stride}) {{\n"
        + "\n".join(lines) + "\n  }\n}\n"
    )
    name = f"{prefix}_{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    if moved is None:
        moved = sum(shape_size(p.shape) * BYTES[p.dtype] for p in params)
    return KernelSource(name=name, source=text.replace("@NAME@", name), params=params, size=size, flops=flops, bytes=moved, lanes=lanes, threads=threads,
                        decls=tuple(decls), loop=loop, lines=tuple(lines), before=tuple(before), table=table)


def unpack(decls: tuple[str, ...] | list[str]) -> list[str]:
    """The kernel's parameters from the pointer array `sx_args`, in the order of its params."""
    out = []
    for k, decl in enumerate(decls):
        name = decl.split()[-1]
        typ = decl[: -len(name)].strip()
        out.append(f"  {typ} {name} = ({typ.replace('__restrict__', '').strip()})sx_args[{k}];")
    return out


def combine_lanes(acc: str, reducer: ReducerSpec, lanes: str, indent: str = "    ") -> list[str]:
    """Every lane's partial ACC combined by REDUCER's pairwise combine, in a fixed tree order
    (deterministic), into ACC on every lane: a power-of-two tree over `part` in shared memory."""
    if lanes == "thread":
        return []
    sync = SYNC[lanes]
    return [
        f"{indent}part[lane] = {acc};", f"{indent}{sync}",
        f"{indent}for (int s = lanes >> 1; s > 0; s >>= 1) {{ if (lane < s) part[lane] = {reducer.pair('part[lane]', 'part[lane + s]')}; {sync} }}",
        f"{indent}{acc} = part[0];", f"{indent}{sync}",
    ]


def load_expr(k: int, t: TensorType, space: Shape, index: str) -> str:
    return from_storage(f"in{k}[{broadcast_index(tuple(t.shape), space, index)}]", t.dtype)


# the NumPy dtype of each dtype's device storage (bf16 as its 16 bits, booleans as bytes)
STORAGE = {DType.f32: np.float32, DType.bf16: np.uint16, DType.i32: np.int32, DType.i64: np.int64, DType.bool: np.uint8, DType.f64: np.float64}
BYTES = {DType.f32: 4, DType.bf16: 2, DType.f16: 2, DType.f64: 8, DType.i32: 4, DType.i64: 8, DType.bool: 1}


def storage_bytes(t: TensorType) -> int:
    """The bytes of a tensor of type T in device memory."""
    return shape_size(t.shape) * BYTES[t.dtype]


def chain_lines(nodes: list[Node], names: dict[int, str], types: dict[int, TensorType], constants: dict[int, Node], indent: str) -> tuple[list[str], int]:
    """One C line per node over registers (NAMES maps value ids to C names; extended)."""
    lines, flops = [], 0
    for node in nodes:
        args = []
        for a in node.args:
            if a in names:
                args.append(names[a])
            elif a in constants:
                args.append(literal(constants[a].attrs["value"], constants[a].type.dtype))
            else:
                raise LoweringError(f"value %{a} is neither an input nor computed in the kernel")
        expression = node_expression(node, args)
        _, compute = c_types(node.type.dtype)
        if node.type.dtype == DType.bf16:
            expression = f"sx_bf16_round({expression})"
        names[node.id] = f"v{node.id}"
        lines.append(f"{indent}const {compute} v{node.id} = {expression};")
        flops += op_def(node.op).flops(node, [types[a] for a in node.args])
    return lines, flops


def flat_index(coords: list[tuple[int, int, int]], var: str, total: int) -> str:
    """The memory offset of flat index VAR in [0, TOTAL) over COORDS ((size, stride in the
    loop's space, stride in memory), innermost first): coordinates whose memory strides
    continue one another merged into one, and the outermost coordinate's modulo left out
    (fewer divisions: a reduction over trailing axes reads VAR itself)."""
    merged: list[list[int]] = []
    for size, loop_stride, mem_stride in coords:  # innermost first
        if merged and merged[-1][1] * merged[-1][0] == loop_stride and merged[-1][2] * merged[-1][0] == mem_stride:
            merged[-1][0] *= size
        else:
            merged.append([size, loop_stride, mem_stride])
    terms = []
    for n, (size, loop_stride, mem_stride) in enumerate(merged):
        divided = f"({var} / {loop_stride}LL)" if loop_stride > 1 else var
        outermost = n == len(merged) - 1 and loop_stride * size >= total
        coord = divided if outermost else f"({divided} % {size}LL)"
        terms.append(coord if mem_stride == 1 else f"{coord} * {mem_stride}LL")
    return " + ".join(terms) if terms else "0"
