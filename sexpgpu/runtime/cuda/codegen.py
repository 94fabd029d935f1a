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
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from ...ir.dtypes import DType, numpy_dtype, parse_dtype
from ...ir.graph import Node, Program, TensorType, shape_size
from ...ir.ops import op_def
from .fusion import FusedGroup

if TYPE_CHECKING:
    from .fusion import ReduceGroup

PRELUDE = r"""
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define SX_COOPERATIVE extern "C" __global__ void
#define SX_SHARED __shared__
#define SX_SYNC_WARP __syncwarp()
#define SX_SYNC_BLOCK __syncthreads()
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
SX_FN double sx_maxd(double a, double b) { return (a != a || b != b) ? a + b : (a >= b ? a : b); }
SX_FN double sx_mind(double a, double b) { return (a != a || b != b) ? a + b : (a <= b ? a : b); }
SX_FN float sx_inf() { return sx_bits_float(0x7f800000u); }
SX_FN float sx_nan() { return sx_bits_float(0x7fc00000u); }
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
SX_FN unsigned int sx_mulhi(unsigned int a, unsigned int b) { return __umulhi(a, b); }
SX_FN float sx_fadd(float a, float b) { return __fadd_rn(a, b); }
SX_FN float sx_fmul(float a, float b) { return __fmul_rn(a, b); }
#else
SX_FN unsigned int sx_mulhi(unsigned int a, unsigned int b) { return (unsigned int)(((unsigned long long)a * b) >> 32); }
SX_FN float sx_fadd(float a, float b) { volatile float r = a + b; return r; }
SX_FN float sx_fmul(float a, float b) { volatile float r = a * b; return r; }
#endif
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

# storage type in memory, type the kernel computes in
C_TYPES: dict[DType, tuple[str, str]] = {
    DType.f32: ("float", "float"),
    DType.bf16: ("unsigned short", "float"),
    DType.i32: ("int", "int"),
    DType.i64: ("long long", "long long"),
    DType.bool: ("unsigned char", "bool"),
    DType.f64: ("double", "double"),  # only a split reduction's partial results
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
    size: int  # items of the loop: elements, rows or outputs
    flops: int
    bytes: int
    lanes: str = "thread"  # who computes one item: a "thread", a "warp" (32 lanes) or a "block"

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
    # the constant as the NumPy backend holds it: rounded to the dtype (bf16 has 8 bits)
    v = float(np.asarray(value, dtype=np.float32).astype(numpy_dtype(dtype)).astype(np.float32)) if dtype in (DType.f32, DType.bf16) else float(value)
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


INTEGER_FORMS = {
    "maximum": "(({0}) > ({1}) ? ({0}) : ({1}))",
    "minimum": "(({0}) < ({1}) ? ({0}) : ({1}))",
    "relu": "(({0}) > 0 ? ({0}) : 0)",
    "abs": "(({0}) < 0 ? -({0}) : ({0}))",
}


def node_expression(node: Node, args: list[str], types: dict[int, TensorType]) -> str:
    if node.op == "broadcast_to":
        return args[0]
    if node.type.dtype in (DType.i32, DType.i64) and node.op in INTEGER_FORMS:  # the float helpers would round past 2^24
        return INTEGER_FORMS[node.op].format(*args)
    template = op_def(node.op).cuda
    if template is None:
        raise LoweringError(f"op {node.op} has no CUDA template")
    if node.op == "cast":
        return f"(({c_types(parse_dtype(node.attrs['dtype']))[1]}){args[0]})"
    return template.format(*args)


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
    "thread": ((), "(long long)blockIdx.x * blockDim.x + threadIdx.x", "(long long)blockDim.x * gridDim.x"),
    "warp": (("  SX_SHARED double sx_part[1024];", "  const int lane = threadIdx.x & 31, lanes = 32;", "  double* part = sx_part + (threadIdx.x & ~31u);"),
             "((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5", "((long long)blockDim.x * gridDim.x) >> 5"),
    "block": (("  SX_SHARED double sx_part[1024];", "  const int lane = threadIdx.x, lanes = blockDim.x;", "  double* part = sx_part;"),
              "(long long)blockIdx.x", "(long long)gridDim.x"),
}
SYNC = {"warp": "SX_SYNC_WARP;", "block": "SX_SYNC_BLOCK;"}


def assemble(prefix: str, decls: list[str], loop: str, lines: list[str], params: list[Param], size: int, flops: int,
             before: tuple[str, ...] = (), moved: Optional[int] = None, lanes: str = "thread") -> KernelSource:
    """A kernel: LINES inside a grid-stride loop over `LOOP < n` (items given to threads,
    warps or blocks, as LANES says), named PREFIX_<hash of its text>."""
    signature = ", ".join(decls + ["long long n"])
    setup, first, stride = LOOPS[lanes]
    # a kernel whose lanes cooperate is SX_COOPERATIVE: a CUDA kernel on the device, a
    # coroutine per lane in the host emulation (tests/cuda_host.py)
    head = 'extern "C" __global__ void' if lanes == "thread" else "SX_COOPERATIVE"
    text = (
        f"{head} @NAME@({signature}) {{\n" + "".join(f"{line}\n" for line in (*setup, *before))
        + f"  for (long long {loop} = {first}; {loop} < n; {loop} += {stride}) {{\n"
        + "\n".join(lines) + "\n  }\n}\n"
    )
    name = f"{prefix}_{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    if moved is None:
        moved = sum(shape_size(p.shape) * BYTES[p.dtype] for p in params)
    return KernelSource(name=name, source=text.replace("@NAME@", name), params=params, size=size, flops=flops, bytes=moved, lanes=lanes)


def combine_lanes(acc: str, op: str, lanes: str, indent: str = "    ") -> list[str]:
    """Every lane's partial ACC combined, in a fixed tree order (deterministic), into ACC on
    every lane: a power-of-two tree over `part` in shared memory."""
    if lanes == "thread":
        return []
    pair = {"sum": "part[lane] + part[lane + s]", "mean": "part[lane] + part[lane + s]",
            "max": "sx_maxd(part[lane], part[lane + s])", "min": "sx_mind(part[lane], part[lane + s])"}[op]
    sync = SYNC[lanes]
    return [
        f"{indent}part[lane] = {acc};", f"{indent}{sync}",
        f"{indent}for (int s = lanes >> 1; s > 0; s >>= 1) {{ if (lane < s) part[lane] = {pair}; {sync} }}",
        f"{indent}{acc} = part[0];", f"{indent}{sync}",
    ]


def load_expr(k: int, t: TensorType, space: tuple[int, ...], index: str) -> str:
    return from_storage(f"in{k}[{broadcast_index(tuple(t.shape), space, index)}]", t.dtype)


def elementwise_kernel(group: FusedGroup, program: Program, constants: Optional[dict[int, Node]] = None) -> KernelSource:
    """The kernel computing GROUP (its inputs are read, its outputs written)."""
    types = program.types()
    constants = constants or {}
    space = group.shape
    decls, params = declare(group.inputs, group.outputs, types)
    names: dict[int, str] = {}
    lines: list[str] = []
    # values read only by a concat are loaded inside its piecewise expression, in range only
    read_elsewhere = {a for n in group.nodes if n.op != "concat" for a in n.args}
    piece = {vid: k for k, vid in enumerate(group.inputs)}
    for k, vid in enumerate(group.inputs):
        if vid in read_elsewhere:
            names[vid] = f"a{k}"
            lines.append(f"    const {c_types(types[vid].dtype)[1]} a{k} = {load_expr(k, types[vid], space, 'i')};")
    flops = 0
    windows: dict[int, tuple[int, int]] = {}  # slice node -> [start, stop) of the loop index
    for node in group.nodes:
        if node.op == "concat":
            names[node.id] = f"v{node.id}"
            lines.append(f"    const {c_types(node.type.dtype)[1]} v{node.id} = {piecewise(node, piece, types, constants)};")
        elif node.op == "slice":
            windows[node.id] = (int(node.attrs["starts"][0]), int(node.attrs["stops"][0]))
            names[node.id] = names[node.args[0]]
        else:
            more, cost = chain_lines([node], names, types, constants, "    ")
            lines += more
            flops += cost
    for k, vid in enumerate(group.outputs):
        value = to_storage(names[vid], types[vid].dtype)
        if vid in windows:  # a window of the loop: its own buffer, from its start
            start, stop = windows[vid]
            lines.append(f"    if (i >= {start}LL && i < {stop}LL) out{k}[i - {start}LL] = {value};")
        else:
            lines.append(f"    out{k}[i] = {value};")
    return assemble("sx_fused", decls, "i", lines, params, shape_size(space), flops)


BYTES = {DType.f32: 4, DType.bf16: 2, DType.f16: 2, DType.f64: 8, DType.i32: 4, DType.i64: 8, DType.bool: 1}


def piecewise(node: Node, piece: dict[int, int], types: dict[int, TensorType], constants: dict[int, Node]) -> str:
    """A 1-D concat at loop index i: each part read only inside its own range."""
    parts: list[tuple[int, str]] = []
    offset = 0
    for a in node.args:
        if a in constants:
            value = literal(constants[a].attrs["value"], constants[a].type.dtype)
        elif a in piece:
            value = from_storage(f"in{piece[a]}[i - {offset}LL]", types[a].dtype)
        else:
            raise LoweringError(f"concat %{node.id}: part %{a} is neither an input of the kernel nor a constant")
        offset += shape_size(types[a].shape)
        parts.append((offset, value))
    expression = parts[-1][1]
    for end, value in reversed(parts[:-1]):
        expression = f"(i < {end}LL ? {value} : {expression})"
    return expression


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
        expression = node_expression(node, args, types)
        _, compute = c_types(node.type.dtype)
        if node.type.dtype == DType.bf16:
            expression = f"sx_bf16_round({expression})"
        names[node.id] = f"v{node.id}"
        lines.append(f"{indent}const {compute} v{node.id} = {expression};")
        if node.op != "broadcast_to":
            flops += op_def(node.op).flops(node, [types[a] for a in node.args])
    return lines, flops


def flat_index(coords: list[tuple[int, int, int]], var: str) -> str:
    """sum over (size, stride in the loop's space, stride in memory) of coordinate * memory stride."""
    terms = []
    for size, loop_stride, mem_stride in coords:
        coord = f"(({var} / {loop_stride}LL) % {size}LL)" if loop_stride > 1 else f"({var} % {size}LL)"
        terms.append(coord if mem_stride == 1 else f"{coord} * {mem_stride}LL")
    return " + ".join(terms) if terms else "0"


@dataclass(frozen=True)
class ReduceStrategy:
    lanes: str  # who reduces one output (or one chunk of it): "thread", "warp" or "block"
    split: int = 1  # chunks per output: > 1 is a partial-results kernel, then a finishing one


def reduce_strategy(outputs: int, extent: int, innermost: bool, integer: bool) -> ReduceStrategy:
    """How a reduction of EXTENT elements into each of OUTPUTS spreads over the GPU.
    INNERMOST: the reduced axes include the last one (lanes stride along memory: a warp or a
    block per output coalesces); otherwise neighbouring outputs are neighbours in memory and a
    thread per output coalesces. Few outputs of many elements are split into chunks, so that
    enough threads work; the chunks' partial results are combined by a second kernel."""
    if integer or extent < 32:
        return ReduceStrategy("thread")
    if not innermost:
        if outputs >= 16384 or outputs * extent < 1 << 16:
            return ReduceStrategy("thread")
        split = min(1024, extent // 16, -(-65536 // outputs))
        return ReduceStrategy("thread", split) if split >= 2 else ReduceStrategy("thread")
    if outputs * extent >= 1 << 20 and outputs < 2048:
        split = min(1024, -(-extent // 8192))
        if split >= 2:
            return ReduceStrategy("block", split)
    return ReduceStrategy("warp")


def reduce_geometry(group: "ReduceGroup", types: dict[int, TensorType]) -> tuple[list[int], int, int, bool]:
    """A reduction's reduced axes, elements per output, outputs, and whether its input is integer."""
    from ...ir.ops_reduce import normalize_axes

    node = group.node
    in_t = types[node.args[0]]
    axes = normalize_axes(node.op, node.attrs.get("axis"), len(in_t.shape))
    reduced = 1
    for d in axes:
        reduced *= in_t.shape[d]
    return axes, reduced, shape_size(node.type.shape) or 1, in_t.dtype in (DType.i32, DType.i64)


def planned_strategy(group: "ReduceGroup", types: dict[int, TensorType]) -> ReduceStrategy:
    axes, reduced, outputs, integer = reduce_geometry(group, types)
    return reduce_strategy(outputs, reduced, bool(axes) and axes[-1] == len(types[group.node.args[0]].shape) - 1, integer)


def reduce_kernels(group: "ReduceGroup", program: Program, constants: Optional[dict[int, Node]] = None,
                   strategy: Optional[ReduceStrategy] = None) -> list[KernelSource]:
    """A reduction as one kernel, or two when it is split (partial results per chunk, then
    their combination): each output (or chunk) by a thread, a warp or a block (the
    strategy, chosen from the shapes unless given), looping over its elements in a fixed
    order and combining the lanes in a fixed tree (deterministic), accumulating in double
    (ints in 64 bits); the prologue (the fused group that makes the reduction's input) is
    computed per element inside the loop."""
    types = program.types()
    constants = constants or {}
    node = group.node
    source = node.args[0]
    in_t = types[source]
    space = tuple(in_t.shape)
    axes, reduced_size, outputs, integer = reduce_geometry(group, types)
    strategy = strategy or planned_strategy(group, types)
    kept = [d for d in range(len(space)) if d not in axes]
    mem = [1] * len(space)
    for d in range(len(space) - 2, -1, -1):
        mem[d] = mem[d + 1] * space[d + 1]

    def coords(dims: list[int]) -> list[tuple[int, int, int]]:
        out, stride = [], 1
        for d in reversed(dims):
            out.append((space[d], stride, mem[d]))
            stride *= space[d]
        return out

    # integers stay exact only in a thread's 64-bit accumulator (the lanes' tree and the chunks' partials are f64)
    if integer and (strategy.lanes != "thread" or strategy.split > 1) or strategy.split > reduced_size:
        raise LoweringError(f"reduction %{node.id}: strategy {strategy} does not fit {in_t}")
    names: dict[int, str] = {}
    inner: list[str] = []
    for k, vid in enumerate(group.inputs):
        names[vid] = f"a{k}"
        inner.append(f"      const {c_types(types[vid].dtype)[1]} a{k} = {load_expr(k, types[vid], space, 'idx')};")
    flops = 0
    if group.prologue is not None:
        lines, flops = chain_lines(group.prologue.nodes, names, types, constants, "      ")
        inner += lines
    x = names[source]
    acc_type = "long long" if integer else "double"
    init = {"sum": "0", "mean": "0", "max": "-sx_inf()" if not integer else "(-9223372036854775807LL - 1)", "min": "sx_inf()" if not integer else "9223372036854775807LL"}[node.op]
    if node.op in ("sum", "mean"):
        step = f"acc += ({acc_type}){x};"
    else:  # NaN wins, as in NumPy; ties keep the first
        better = ">" if node.op == "max" else "<"
        step = f"if (({acc_type}){x} {better} acc || {x} != {x}) acc = ({acc_type}){x};" if not integer else f"if (({acc_type}){x} {better} acc) acc = ({acc_type}){x};"
        if not integer:
            step = f"if (acc == acc) {{ {step} }}"
    flops += reduced_size * outputs
    out_t = node.type
    result = "acc" if node.op != "mean" else f"(acc / {reduced_size}.0)"
    result = to_storage(f"(float){result}", out_t.dtype) if out_t.dtype == DType.bf16 else f"({c_types(out_t.dtype)[0]}){result}"
    lanes, split = strategy.lanes, strategy.split
    chunk = -(-reduced_size // split)
    first = "0" if split == 1 else f"c * {chunk}LL"
    end = f"{reduced_size}LL" if split == 1 else f"(c * {chunk}LL + {chunk}LL < {reduced_size}LL ? c * {chunk}LL + {chunk}LL : {reduced_size}LL)"
    loop = f"for (long long j = {first}; j < {end}; ++j) {{" if lanes == "thread" else f"for (long long j = {first} + lane; j < {end}; j += lanes) {{"
    only_lane0 = "" if lanes == "thread" else "if (lane == 0) "
    body = [
        *([f"    const long long o = item % {outputs}LL, c = item / {outputs}LL;"] if split > 1 else []),
        f"    const long long base = {flat_index(coords(kept), 'o')};",
        f"    {acc_type} acc = {init};",
        f"    {loop}",
        f"      const long long idx = base + {flat_index(coords(axes), 'j')};",
        *inner,
        f"      {step}",
        "    }",
        *combine_lanes("acc", node.op, lanes),
    ]
    if split == 1:
        decls, params = declare(group.inputs, [node.id], types)
        body.append(f"    {only_lane0}out0[o] = {result};")
        return [assemble(f"sx_reduce_{node.op}", decls, "o", body, params, outputs, flops, lanes=lanes)]
    decls, params = declare(group.inputs, [], types)
    decls.append("double* __restrict__ out0")
    params.append(Param("out", -1, DType.f64, (split * outputs,)))
    body.append(f"    {only_lane0}out0[item] = acc;")
    partials = assemble(f"sx_reduce_{node.op}_chunks", decls, "item", body, params, split * outputs, flops, lanes=lanes)
    # the chunks' partial results, combined per output in chunk order
    finish_lanes = "thread" if lanes == "thread" else "warp"
    pair = {"sum": "acc + p", "mean": "acc + p", "max": "sx_maxd(acc, p)", "min": "sx_mind(acc, p)"}[node.op]
    loop = f"for (long long c = 0; c < {split}LL; ++c) {{" if finish_lanes == "thread" else f"for (long long c = lane; c < {split}LL; c += lanes) {{"
    store, _ = c_types(out_t.dtype)
    finish = [
        f"    double acc = {init};", f"    {loop}", f"      const double p = in0[c * {outputs}LL + o];", f"      acc = {pair};", "    }",
        *combine_lanes("acc", node.op, finish_lanes), f"    {'' if finish_lanes == 'thread' else 'if (lane == 0) '}out0[o] = {result};",
    ]
    finish_params = [Param("in", -1, DType.f64, (split * outputs,)), Param("out", node.id, out_t.dtype, tuple(out_t.shape))]
    done = assemble(f"sx_reduce_{node.op}_finish", ["const double* __restrict__ in0", f"{store}* __restrict__ out0"], "o", finish, finish_params,
                    outputs, split * outputs, lanes=finish_lanes)
    return [partials, done]


def scatter_kernel(node: Node, program: Program) -> KernelSource:
    """scatter_add along axis 0 over positions sorted by index (`order`) and each output
    row's range in them (`starts`, rows + 1 entries): one thread per output element adds its
    rows in index order, in f32, and rounds once for bf16."""
    types = program.types()
    values_t = types[node.args[0]]
    rows = node.type.shape[0]
    width = shape_size(node.type.shape[1:]) or 1
    store, _ = c_types(node.type.dtype)
    decls = [f"const {store}* __restrict__ g", "const long long* __restrict__ order", "const long long* __restrict__ starts", f"{store}* __restrict__ out"]
    body = [
        f"    const long long r = o / {width}LL;",
        f"    const long long c = o % {width}LL;",
        "    float acc = 0.0f;",
        f"    for (long long p = starts[r]; p < starts[r + 1]; ++p) acc += {from_storage(f'g[order[p] * {width}LL + c]', node.type.dtype)};",
        f"    out[o] = {to_storage('acc', node.type.dtype)};",
    ]
    count = shape_size(types[node.args[1]].shape)
    params = [
        Param("in", node.args[0], values_t.dtype, tuple(values_t.shape)),
        Param("in", -1, DType.i64, (count,)),
        Param("in", -2, DType.i64, (rows + 1,)),
        Param("out", node.id, node.type.dtype, tuple(node.type.shape)),
    ]
    return assemble("sx_scatter_sorted", decls, "o", body, params, shape_size(node.type.shape), shape_size(values_t.shape))


def kernels_for(step: Any, program: Program, constants: Optional[dict[int, Node]] = None) -> list[KernelSource]:
    """The generated kernels of a fused group, a row group, a reduction (two when it is
    split), a sorted scatter-add or a random op, in launch order."""
    from .fusion import RandomStep, ReduceGroup, ScatterStep

    if isinstance(step, ScatterStep):
        return [scatter_kernel(step.node, program)]
    if isinstance(step, RandomStep):
        return [random_kernel(step.node, program)]
    from .rows import RowGroup, rows_kernel

    if isinstance(step, RowGroup):
        return [rows_kernel(step, program, constants or {})]
    return reduce_kernels(step, program, constants) if isinstance(step, ReduceGroup) else [elementwise_kernel(step, program, constants)]



def random_kernel(node: Node, program: Program) -> KernelSource:
    """dropout_mask and random_uniform (f32, bf16) as a device kernel: one thread per Philox
    block of four elements, the derivation of ir/ops_random.py word for word (no fused
    multiply-add in the uniform), so the bits equal the CPU backend's."""
    from ...ir.ops_random import dropout_threshold

    types = program.types()
    step_t = types[node.args[0]]
    step_store, _ = c_types(step_t.dtype)
    size = shape_size(node.type.shape)
    out_store, _ = c_types(node.type.dtype)
    seed, key = int(node.attrs["seed"]) & 0xFFFFFFFF, int(node.attrs["key"]) & 0xFFFFFFFF
    if node.op == "dropout_mask":
        value = to_storage(f"(w[l] >> 8) >= {dropout_threshold(node.attrs['rate'])}u", DType.bool)
    else:
        low32 = float(np.float32(node.attrs.get("low", 0.0)))
        width32 = float(np.float32(np.float32(node.attrs.get("high", 1.0)) - np.float32(low32)))
        u = "((float)(w[l] >> 8) * 5.9604644775390625e-08f)"
        value = to_storage(f"sx_fadd({literal(low32, DType.f32)}, sx_fmul({literal(width32, DType.f32)}, {u}))", node.type.dtype)
    body = [
        "    unsigned int w[4] = {(unsigned int)((unsigned long long)b & 0xffffffffu), (unsigned int)((unsigned long long)b >> 32), "
        "(unsigned int)(s & 0xffffffffu), (unsigned int)(s >> 32)};",
        f"    sx_philox(w, {seed}u, {key}u);",
        "    for (int l = 0; l < 4; ++l) {",
        "      const long long i = 4 * b + l;",
        f"      if (i < {size}LL) out[i] = {value};",
        "    }",
    ]
    decls = [f"const {step_store}* __restrict__ step", f"{out_store}* __restrict__ out"]
    params = [Param("in", node.args[0], step_t.dtype, ()), Param("out", node.id, node.type.dtype, tuple(node.type.shape))]
    return assemble(f"sx_{node.op}", decls, "b", body, params, (size + 3) // 4, size * 20,
                    before=("  const unsigned long long s = (unsigned long long)(long long)step[0];",), moved=size * BYTES[node.type.dtype])
