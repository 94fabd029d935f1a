"""Fused attention on the device, in the flash-attention manner (the schedule of sequences
whose scores do not fit attention_gemm.py's scratch, and of bf16; the others are batched
gemms and a softmax row kernel, attention_gemm.py): softmax(q k^T * scale + mask) v
without the S x S scores in memory, forward and backward, over q, k, v [..., S, H, D] (a
head's rows H * D elements apart).

Forward (`attention`): a block per (batch x head, tile of TILE queries), a thread per query.
The block walks the key tiles its queries can see (causal: up to its last query), each
loaded once into shared memory (K and V, in f32); every thread computes its query's scores
against the tile in registers, updates its running maximum and sum (the online softmax: the
accumulated output and sum are rescaled by exp(old max - new max)), and accumulates P v.
The output is divided by the sum once, at the end, and rounded once (bf16).

Backward (`attention_grad`, the stacked gradients of q, k and v), two kernels that recompute
the scores tile by tile instead of reading them, deterministic (no atomics: each gradient
element has one writer, which adds in a fixed order):
- per query tile, a thread per query: its log-sum-exp (one pass over the key tiles), then
  dq = sum_j dS_ij k_j * scale with P_ij = exp(s_ij - lse_i) and dS_ij = P_ij (g_i . v_j - D_i),
  D_i = g_i . o_i; the log-sum-exps and D go to the step's scratch;
- per key tile, a thread per key: dv = sum_i P_ij g_i and dk = sum_i dS_ij q_i * scale over the
  query tiles that see it (causal: from its own tile on), Q, g, lse and D tiles in shared
  memory. Heads wider than SPLIT_WIDTH give each key tile two blocks, one accumulating dv and
  one dk (each recomputing P), so that a thread holds one row of accumulators, not two: two
  rows of 64 do not fit sm_90's 255 registers without spilling. The sums are the same, in the
  same order, either way.

Sequence lengths need not be multiples of the tile: threads past the end load zeros, keep
their hands off the results, and meet every barrier as the others do.

The per-query work of each pass (`softmax_step`, `lse_step`, `dq_step`, `dkv_step`) is
written once, over a query's own rows and scalars by name (`Own`): the CUDA kernels here
render it with a lane's own names, the host dialect (runtime/cpu/hostc.py) for row t of a
tile of queries per item, so the two compute the same operations in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional

import numpy as np

from ...ir.dtypes import DType
from ...ir.graph import Node, Program, TensorType, shape_size
from .codegen import BYTES, KernelSource, LoweringError, Param, assemble, c_types, chain_lines, from_storage, literal, load_expr, to_storage
from .lowering import KernelLine, Lowered, LoweringContext, Placement, Prologue, StepRun, register_lowering
from .attention_gemm import AttentionGemms, AttentionGradGemms, heads_of, uses_gemms
from .steps import NodeStep

TILE = 64  # queries (keys in the dK/dV pass) per block: its threads
SHARED_FLOATS = 8192  # f32 elements of the forward pass's K and V tiles together: 32 KiB
BACKWARD_FLOATS = 12288  # the backward kernels' shared memory, in f32 elements: 48 KiB, the static limit
SPLIT_WIDTH = 32  # wider heads: dk and dv accumulated by separate blocks of the key pass


@dataclass(frozen=True)
class Geometry:
    heads: int  # batch x heads: the independent attentions
    length: int  # S
    per_position: int  # H: the heads of one position, next to each other in memory
    width: int  # D
    dtype: DType
    causal: bool
    scale: float
    tile: int  # threads per block
    keys: int  # rows of the tiles a block loads at a time

    @property
    def tiles(self) -> int:
        return -(-self.length // self.tile)

    @property
    def elements(self) -> int:
        return self.heads * self.length * self.width

    @property
    def stride(self) -> int:
        """Elements from one position's row of a head to the next position's: H * D."""
        return self.per_position * self.width

    def base(self, head: str) -> str:
        """The first element of head HEAD (a C expression, in [0, heads)) in [..., S, H, D]."""
        return f"({head} / {self.per_position}LL) * {self.length * self.stride}LL + ({head} % {self.per_position}LL) * {self.width}LL"


def geometry(node: Node, types: dict[int, TensorType], tile: int) -> Geometry:
    """The forward kernel's: K and V tiles of `keys` rows in SHARED_FLOATS."""
    t = types[node.args[0]]
    width = t.shape[-1]
    return Geometry(shape_size(t.shape[:-3]) * t.shape[-2], t.shape[-3], t.shape[-2], width, t.dtype, bool(node.attrs["causal"]), float(node.attrs["scale"]),
                    tile, max(1, min(tile, SHARED_FLOATS // (2 * width))))


def own_rows(tile: int, width: int) -> int:
    """f32 elements of two rows per thread (its q and g, or its k and v) in shared memory, a
    row's stride one more than its width so that the lanes' rows fall in different banks."""
    return 2 * tile * (width + 1)


def backward_geometry(node: Node, types: dict[int, TensorType], tile: int) -> Geometry:
    """The backward kernels': each thread's two rows in shared memory (not registers, which
    they would overflow), and tiles of `keys` rows (with their log-sum-exps and D) in the rest
    of BACKWARD_FLOATS; fewer threads per block for wide heads."""
    g = geometry(node, types, tile)
    threads = tile
    while threads > 1 and own_rows(threads, g.width) + 2 * g.width + 2 > BACKWARD_FLOATS:
        threads //= 2
    if own_rows(threads, g.width) + 2 * g.width + 2 > BACKWARD_FLOATS:
        raise LoweringError(f"{node.op} %{node.id}: heads of width {g.width} do not fit the attention kernels' shared memory")
    keys = min(threads, (BACKWARD_FLOATS - own_rows(threads, g.width)) // (2 * g.width + 2))
    return Geometry(g.heads, g.length, g.per_position, g.width, g.dtype, g.causal, g.scale, threads, keys)


def dot(row: str, tile: str, at: str, width: int) -> str:
    """row . tile[at ..], as one C statement computing `dot`."""
    return f"float dot = 0.0f; for (int d = 0; d < {width}; ++d) dot += {row}[d] * {tile}[{at} + d];"


def key_range(g: Geometry) -> tuple[str, str]:
    """The keys item `item`'s tile of queries sees, [0, seen) (causal: up to its last query),
    and the end of key tile k0's keys that query `query` sees."""
    seen = f"({g.length}LL < (item % {g.tiles}LL + 1) * {g.tile}LL ? {g.length}LL : (item % {g.tiles}LL + 1) * {g.tile}LL)" if g.causal else f"{g.length}LL"
    end = f"(k0 + {g.keys}LL < query + 1 ? k0 + {g.keys}LL : query + 1)" if g.causal else f"(k0 + {g.keys}LL < {g.length}LL ? k0 + {g.keys}LL : {g.length}LL)"
    return seen, end


Load = Callable[[str, str], str]  # (role, element index) -> the element as a float: a lambda's call on the device, a function's on the host


def tile_loads(g: Geometry, load: Load, arrays: list[tuple[str, str]], at: str) -> str:
    """Element AT of a tile of `keys` rows from row `row` on, for each of ARRAYS ([(tile name,
    role)]): the role's element, zero past the sequence's end."""
    return " ".join(f"{name}[{at}] = row < {g.length}LL ? {load(role, f'base + row * {g.stride}LL + {at} % {g.width}')} : 0.0f;" for name, role in arrays)


def stats_loads(g: Geometry, at: str) -> str:
    """Element AT of the key pass's tiles of the queries' log-sum-exps (ls) and D (ds_) from row `row` on."""
    rows = g.heads * g.length
    return f"ls[{at}] = row < {g.length}LL ? stats[head * {g.length}LL + row] : 0.0f; ds_[{at}] = row < {g.length}LL ? stats[{rows}LL + head * {g.length}LL + row] : 0.0f;"


Own = Callable[[str], str]  # a query's (or key's) own row or scalar by name: `acc` for a lane's, `acc[t]` for a host tile's t-th


def lane_own(name: str) -> str:
    """The device's: a lane computes one query (or key), its rows and scalars its own names."""
    return name


def softmax_step(g: Geometry, own: Own, scale: str, indent: str) -> list[str]:
    """The forward pass's online softmax over one key tile [k0, end) for one query: its scores
    into s, its maximum, the running sum and output rescaled, then P v added. The
    description both dialects render (the device's lane, the host's query of a tile)."""
    acc, m, total = own("acc"), own("m"), own("l")
    return [
        f"{indent}float top = {m};",
        f"{indent}for (long long j = k0; j < end; ++j) {{ {dot(own('qr'), 'ks', f'(j - k0) * {g.width}', g.width)} s[j - k0] = dot * {scale}; top = sx_maxf(top, s[j - k0]); }}",
        f"{indent}const float alpha = expf({m} - top);",
        f"{indent}{total} *= alpha; for (int d = 0; d < {g.width}; ++d) {acc}[d] *= alpha;",
        f"{indent}for (long long j = k0; j < end; ++j) {{",
        f"{indent}  const float p = expf(s[j - k0] - top); {total} += p;",
        f"{indent}  for (int d = 0; d < {g.width}; ++d) {acc}[d] += p * vs[(j - k0) * {g.width} + d];",
        f"{indent}}}",
        f"{indent}{m} = top;",
    ]


def lse_step(g: Geometry, own: Own, scale: str) -> str:
    """The dq pass's first walk, one key tile [k0, end): the query's running maximum and sum."""
    m, total = own("m"), own("l")
    return (f"for (long long j = k0; j < end; ++j) {{ {dot(own('qr'), 'ks', f'(j - k0) * {g.width}', g.width)} const float s = dot * {scale};"
            f" if (s > {m}) {{ {total} = {total} * expf({m} - s) + 1.0f; {m} = s; }} else {total} += expf(s - {m}); }}")


def dq_step(g: Geometry, own: Own, scale: str, indent: str) -> list[str]:
    """The dq pass's second walk, the body for key j: P from the log-sum-exp, dS, dq += dS k."""
    return [
        f"{indent}{dot(own('qr'), 'ks', f'(j - k0) * {g.width}', g.width)}",
        f"{indent}const float p = expf(dot * {scale} - {own('lse')});",
        f"{indent}float dp = 0.0f; for (int d = 0; d < {g.width}; ++d) dp += {own('gr')}[d] * vs[(j - k0) * {g.width} + d];",
        f"{indent}const float ds = p * (dp - {own('dsum')});",
        f"{indent}for (int d = 0; d < {g.width}; ++d) {own('dq')}[d] += ds * ks[(j - k0) * {g.width} + d];",
    ]


def key_scores(g: Geometry, own: Own, scale: str, indent: str) -> list[str]:
    """The key pass's start for query i of the tile at q0 (r its row in the tiles): P from the stats."""
    return [
        f"{indent}const long long r = (i - q0) * {g.width};",
        f"{indent}{dot(own('kr'), 'qs', 'r', g.width)}",
        f"{indent}const float p = expf(dot * {scale} - ls[i - q0]);",
    ]


def dkv_step(g: Geometry, own: Own, scale: str, indent: str) -> list[str]:
    """The key pass's body for query i, dk and dv together: P, dv += P g, dS, dk += dS q."""
    dk, dv = own("dk"), own("dv")
    return [
        *key_scores(g, own, scale, indent),
        f"{indent}float dp = 0.0f; for (int d = 0; d < {g.width}; ++d) {{ {dv}[d] += p * gs[r + d]; dp += gs[r + d] * {own('vr')}[d]; }}",
        f"{indent}const float ds = p * (dp - ds_[i - q0]);",
        f"{indent}for (int d = 0; d < {g.width}; ++d) {dk}[d] += ds * qs[r + d];",
    ]


def tile_loop(g: Geometry, operands: "Operands", first: str, last: str, arrays: list[tuple[str, str]], rows: str) -> list[str]:
    """Open the loop over tiles of `keys` rows from FIRST to LAST (exclusive; uniform across the
    block), each tile's ARRAYS ([(shared name, role)]) loaded by all lanes, zeros past the end,
    between two barriers; ROWS names the tile's first row."""
    loads = tile_loads(g, operands.load, arrays, "t")
    return [
        f"    for (long long {rows} = {first}; {rows} < {last}; {rows} += {g.keys}LL) {{",
        "      SX_SYNC_BLOCK;",
        f"      for (long long t = lane; t < {g.keys * g.width}LL; t += {g.tile}) {{ const long long row = {rows} + t / {g.width}; {loads} }}",
        "      SX_SYNC_BLOCK;",
    ]


def shared(names: list[str], g: Geometry, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    return tuple(f"  SX_SHARED float {name}[{g.keys * g.width}];" for name in names) + extra


ROLES = {"attention": ("q", "k", "v"), "attention_grad": ("q", "k", "v", "o", "g")}


class Operands:
    """What an attention kernel reads, by role (q, k, v, o, g): an argument from memory, or
    one with a prologue computed as it is loaded (a function of the element's index over the
    chain's inputs, in0..: `bodies`, a lambda in the CUDA kernel, a static function on the
    host), so the value (a projection plus its bias) is never written."""

    def __init__(self, node: Node, program: Program, constants: dict[int, Node], prologues: dict[int, Prologue], roles: tuple[str, ...]) -> None:
        types = program.types()
        self.dtype = types[node.args[0]].dtype
        self.computed: set[str] = set()
        self.decls: list[str] = []
        self.params: list[Param] = []
        self.bodies: dict[str, list[str]] = {}  # per computed role, in role order: its value at index i, ending in a return
        store, _ = c_types(self.dtype)
        inputs: list[int] = []  # the prologues' inputs, numbered in0.. in the order first met
        for role, arg in zip(ROLES[node.op], node.args):
            if role not in roles:
                continue
            prologue = prologues.get(arg)
            if prologue is None:
                self.decls.append(f"const {store}* __restrict__ {role}")
                self.params.append(Param("in", arg, self.dtype, tuple(types[arg].shape)))
                continue
            self.computed.add(role)
            space = tuple(types[prologue.value].shape)
            names: dict[int, str] = {}
            lines = []
            for vid in prologue.inputs:
                if vid not in inputs:
                    inputs.append(vid)
                j = inputs.index(vid)
                names[vid] = f"x{j}"
                lines.append(f"    const {c_types(types[vid].dtype)[1]} x{j} = {load_expr(j, types[vid], space, 'i')};")
            chain, _ = chain_lines(prologue.nodes, names, types, constants, "    ")
            self.bodies[role] = [*lines, *chain, f"    return (float){names[prologue.value]};"]
        for j, vid in enumerate(inputs):
            self.decls.append(f"const {c_types(types[vid].dtype)[0]}* __restrict__ in{j}")
            self.params.append(Param("in", vid, types[vid].dtype, tuple(types[vid].shape)))

    @property
    def lambdas(self) -> list[str]:
        """The computed roles' bodies as the CUDA kernel's lambdas `sx_ROLE(i)`."""
        return [line for role, body in self.bodies.items() for line in (f"  auto sx_{role} = [&](long long i) -> float {{", *body, "  };")]

    def load(self, role: str, index: str) -> str:
        """The element INDEX of ROLE's argument as a float."""
        return f"sx_{role}({index})" if role in self.computed else from_storage(f"{role}[{index}]", self.dtype)

    @property
    def bytes(self) -> int:
        return sum(shape_size(p.shape) * BYTES[p.dtype] for p in self.params)


def forward_kernel(node: Node, program: Program, tile: int = TILE, constants: Optional[dict[int, Node]] = None,
                   prologues: Optional[dict[int, Prologue]] = None) -> KernelSource:
    g = geometry(node, program.types(), tile)
    operands = Operands(node, program, constants or {}, prologues or {}, ("q", "k", "v"))
    store, _ = c_types(g.dtype)
    scale = literal(g.scale, DType.f32)
    seen, end = key_range(g)
    body = [
        f"    const long long head = item / {g.tiles}LL, base = {g.base('head')}, query = (item % {g.tiles}LL) * {g.tile}LL + lane;",
        f"    const bool live = query < {g.length}LL;",
        f"    float qr[{g.width}], acc[{g.width}];",
        f"    for (int d = 0; d < {g.width}; ++d) {{ qr[d] = live ? {operands.load('q', f'base + query * {g.stride}LL + d')} : 0.0f; acc[d] = 0.0f; }}",
        "    float m = -sx_inf(), l = 0.0f;",
        *tile_loop(g, operands, "0", seen, [("ks", "k"), ("vs", "v")], "k0"),
        f"      const long long end = {end};",
        "      if (live && end > k0) {",
        f"        float s[{g.keys}];",
        *softmax_step(g, lane_own, scale, "        "),
        "      }",
        "    }",
        f"    if (live) for (int d = 0; d < {g.width}; ++d) o[base + query * {g.stride}LL + d] = {to_storage('acc[d] / l', g.dtype)};",
    ]
    decls = operands.decls + [f"{store}* __restrict__ o"]
    params = operands.params + [Param("out", node.id, g.dtype, tuple(node.type.shape))]
    return assemble("sx_attention", decls, "item", body, params, g.heads * g.tiles, 4 * pairs(g) * g.width, before=shared(["ks", "vs"], g, tuple(operands.lambdas)),
                    moved=operands.bytes + g.elements * BYTES[g.dtype], lanes="tile", threads=g.tile)


def pairs(g: Geometry) -> int:
    per_head = g.length * (g.length + 1) // 2 if g.causal else g.length * g.length
    return g.heads * per_head


def query_grad_kernel(node: Node, program: Program, tile: int = TILE, constants: Optional[dict[int, Node]] = None,
                      prologues: Optional[dict[int, Prologue]] = None) -> KernelSource:
    """dq (the first third of the stacked result), and each query's log-sum-exp and D into
    `stats` ([2, heads, S] f32)."""
    g = backward_geometry(node, program.types(), tile)
    operands = Operands(node, program, constants or {}, prologues or {}, ("q", "k", "v", "o", "g"))
    store, _ = c_types(g.dtype)
    scale = literal(g.scale, DType.f32)
    rows = g.heads * g.length
    seen, end = key_range(g)
    at = f"base + query * {g.stride}LL + d"
    body = [
        f"    const long long head = item / {g.tiles}LL, base = {g.base('head')}, query = (item % {g.tiles}LL) * {g.tile}LL + lane;",
        f"    const bool live = query < {g.length}LL;",
        f"    volatile float* const qr = sx_own + lane * {g.width + 1};",
        f"    volatile float* const gr = sx_own + {g.tile * (g.width + 1)} + lane * {g.width + 1};",
        f"    float dq[{g.width}];",
        "    float dsum = 0.0f;",
        f"    for (int d = 0; d < {g.width}; ++d) {{ qr[d] = live ? {operands.load('q', at)} : 0.0f; gr[d] = live ? {operands.load('g', at)} : 0.0f; dq[d] = 0.0f;"
        f" dsum += live ? gr[d] * {operands.load('o', at)} : 0.0f; }}",
        "    float m = -sx_inf(), l = 0.0f;",
        *tile_loop(g, operands, "0", seen, [("ks", "k")], "k0"),
        f"      const long long end = {end};",
        f"      if (live) {lse_step(g, lane_own, scale)}",
        "    }",
        "    const float lse = m + logf(l);",
        *tile_loop(g, operands, "0", seen, [("ks", "k"), ("vs", "v")], "k0"),
        f"      const long long end = {end};",
        "      if (live) for (long long j = k0; j < end; ++j) {",
        *dq_step(g, lane_own, scale, "        "),
        "      }",
        "    }",
        "    if (live) {",
        f"      for (int d = 0; d < {g.width}; ++d) out[{at}] = {to_storage(f'dq[d] * {scale}', g.dtype)};",
        f"      stats[head * {g.length}LL + query] = lse; stats[{rows}LL + head * {g.length}LL + query] = dsum;",
        "    }",
    ]
    decls = operands.decls + [f"{store}* __restrict__ out", "float* __restrict__ stats"]
    params = operands.params + [Param("out", node.id, g.dtype, tuple(node.type.shape)), Param("out", -1, DType.f32, (2 * rows,))]
    return assemble("sx_attention_dq", decls, "item", body, params, g.heads * g.tiles, 8 * pairs(g) * g.width,
                    before=shared(["ks", "vs"], g, (f"  SX_SHARED float sx_own[{own_rows(g.tile, g.width)}];", *operands.lambdas)),
                    moved=operands.bytes + g.elements * BYTES[g.dtype] + 2 * rows * 4, lanes="tile", threads=g.tile)


def splits(g: Geometry) -> bool:
    """Whether the key pass gives dk and dv blocks of their own (heads wider than SPLIT_WIDTH)."""
    return g.width > SPLIT_WIDTH


def key_grad_kernel(node: Node, program: Program, tile: int = TILE, constants: Optional[dict[int, Node]] = None,
                    prologues: Optional[dict[int, Prologue]] = None) -> KernelSource:
    """dk and dv (the second and third thirds of the stacked result), from the stats: both
    by each block, or (heads wider than SPLIT_WIDTH) dv by the blocks of the first half of
    the items and dk by those of the second."""
    g = backward_geometry(node, program.types(), tile)
    operands = Operands(node, program, constants or {}, prologues or {}, ("q", "k", "v", "g"))
    store, _ = c_types(g.dtype)
    scale = literal(g.scale, DType.f32)
    rows = g.heads * g.length
    blocks = g.heads * g.tiles
    split = splits(g)
    first = f"(tile_item % {g.tiles}LL) * {g.tile}LL" if g.causal else "0"
    stats_tiles = (f"  SX_SHARED float ls[{g.keys}];", f"  SX_SHARED float ds_[{g.keys}];", f"  SX_SHARED float sx_own[{own_rows(g.tile, g.width)}];")
    at = f"base + key * {g.stride}LL + d"
    if split:  # a block-uniform choice: every lane of a block takes the same branch, barriers included
        accumulate = [*key_scores(g, lane_own, scale, "        "),
            "        if (dv_part) { for (int d = 0; d < " + str(g.width) + "; ++d) acc[d] += p * gs[r + d]; }",
            "        else {",
            f"          float dp = 0.0f; for (int d = 0; d < {g.width}; ++d) dp += gs[r + d] * vr[d];",
            "          const float ds = p * (dp - ds_[i - q0]);",
            f"          for (int d = 0; d < {g.width}; ++d) acc[d] += ds * qs[r + d];",
            "        }",
        ]
        accumulators = [f"    const bool dv_part = item < {blocks}LL;", f"    const long long tile_item = dv_part ? item : item - {blocks}LL;",
                        f"    float acc[{g.width}];"]
        zero = "acc[d] = 0.0f;"
        store_lines = [f"    if (live) for (int d = 0; d < {g.width}; ++d) {{ if (dv_part) out[{2 * g.elements}LL + {at}] = {to_storage('acc[d]', g.dtype)};"
                       f" else out[{g.elements}LL + {at}] = {to_storage(f'acc[d] * {scale}', g.dtype)}; }}"]
    else:
        accumulate = dkv_step(g, lane_own, scale, "        ")
        accumulators = ["    const long long tile_item = item;", f"    float dk[{g.width}], dv[{g.width}];"]
        zero = "dk[d] = 0.0f; dv[d] = 0.0f;"
        store_lines = [f"    if (live) for (int d = 0; d < {g.width}; ++d) {{ out[{g.elements}LL + {at}] = {to_storage(f'dk[d] * {scale}', g.dtype)};"
                       f" out[{2 * g.elements}LL + {at}] = {to_storage('dv[d]', g.dtype)}; }}"]
    body = [
        *accumulators,
        f"    const long long head = tile_item / {g.tiles}LL, base = {g.base('head')}, key = (tile_item % {g.tiles}LL) * {g.tile}LL + lane;",
        f"    const bool live = key < {g.length}LL;",
        f"    volatile float* const kr = sx_own + lane * {g.width + 1};",
        f"    volatile float* const vr = sx_own + {g.tile * (g.width + 1)} + lane * {g.width + 1};",
        f"    for (int d = 0; d < {g.width}; ++d) {{ kr[d] = live ? {operands.load('k', at)} : 0.0f; vr[d] = live ? {operands.load('v', at)} : 0.0f; {zero} }}",
        *tile_loop(g, operands, first, f"{g.length}LL", [("qs", "q"), ("gs", "g")], "q0"),
        f"      for (long long t = lane; t < {g.keys}LL; t += {g.tile}) {{ const long long row = q0 + t;"
        f" {stats_loads(g, 't')} }}",
        "      SX_SYNC_BLOCK;",
        f"      const long long start = {'(q0 > key ? q0 : key)' if g.causal else 'q0'}, stop = q0 + {g.keys}LL < {g.length}LL ? q0 + {g.keys}LL : {g.length}LL;",
        "      if (live) for (long long i = start; i < stop; ++i) {",
        *accumulate,
        "      }",
        "    }",
        *store_lines,
    ]
    decls = operands.decls + ["const float* __restrict__ stats", f"{store}* __restrict__ out"]
    params = operands.params + [Param("in", -1, DType.f32, (2 * rows,)), Param("out", node.id, g.dtype, tuple(node.type.shape))]
    return assemble("sx_attention_dkv", decls, "item", body, params, blocks * (2 if split else 1), (12 if split else 8) * pairs(g) * g.width,
                    before=shared(["qs", "gs"], g, stats_tiles + tuple(operands.lambdas)),
                    moved=operands.bytes + 2 * g.elements * BYTES[g.dtype] + 2 * rows * 4, lanes="tile", threads=g.tile)


def arrays(run: StepRun, kernel: KernelSource, buffers: dict[int, Any]) -> list[Any]:
    """KERNEL's arrays in the order of its params: the values it reads, then BUFFERS (by
    value id: the result, -1 the step's scratch)."""
    return [buffers[p.value] if p.value in buffers else run.contiguous(p.value) for p in kernel.params]


@dataclass
class AttentionStep(NodeStep):
    """attention: one fused kernel (its arguments read, or computed from their prologues)."""

    tile: int = TILE
    prologues: dict[int, Prologue] = field(default_factory=dict)
    kind: ClassVar[str] = "attention"

    @property
    def reads(self) -> list[int]:
        return list(dict.fromkeys(v for a in self.node.args for v in (self.prologues[a].inputs if a in self.prologues else [a])))

    def computes(self, vid: int) -> bool:
        return vid in self.node.args[:3]

    def compute_input(self, vid: int, prologue: Prologue) -> None:
        self.prologues[vid] = prologue

    def kernels(self, program: Program, constants: dict[int, Node]) -> list[KernelSource]:
        return [forward_kernel(self.node, program, self.tile, constants, self.prologues)]

    def launch(self, run: StepRun, kernels: list[KernelSource]) -> None:
        out = run.buffer(self.node.id)
        run.launch(kernels[0], arrays(run, kernels[0], {self.node.id: out}))
        run.set(self.node.id, out)

    def describe(self, index: int, lowered: Lowered) -> KernelLine:
        kernel = self.kernels(lowered.program, lowered.constants)[0]
        computed = "; q, k and v computed as they are loaded" if self.prologues else ""
        return KernelLine(step=index, kind=self.kind, kernel=kernel.name, nodes=[lowered.label(n) for n in self.nodes], elements=shape_size(self.node.type.shape),
                          bytes=kernel.bytes, flops=kernel.flops, how=f"a block per {self.tile} queries, a thread per query; K and V tiles in shared memory, "
                          f"online softmax: no scores in memory{computed}")

    @property
    def nodes(self) -> list[Node]:
        return [n for p in self.prologues.values() for n in p.nodes] + [self.node]


@dataclass
class AttentionGradStep(AttentionStep):
    """attention_grad: the query pass (dq, log-sum-exps and D into scratch), then the key
    pass (dk, dv)."""

    def kernels(self, program: Program, constants: dict[int, Node]) -> list[KernelSource]:
        return [query_grad_kernel(self.node, program, self.tile, constants, self.prologues),
                key_grad_kernel(self.node, program, self.tile, constants, self.prologues)]

    def scratch_bytes(self, types: dict[int, TensorType]) -> int:
        return 2 * 4 * shape_size(self.node.type.shape[1:-1])  # a log-sum-exp and a D per (position, head)

    def launch(self, run: StepRun, kernels: list[KernelSource]) -> None:
        node = self.node
        out = run.buffer(node.id)
        stats = run.scratch(np.float32, 2 * shape_size(node.type.shape[1:-1]))
        for kernel in kernels:
            run.launch(kernel, arrays(run, kernel, {node.id: out, -1: stats}))
        run.set(node.id, out)

    def describe(self, index: int, lowered: Lowered) -> KernelLine:
        kernels = self.kernels(lowered.program, lowered.constants)
        threads = kernels[0].threads
        per_keys = "two (dv, dk) per" if splits(backward_geometry(self.node, lowered.program.types(), self.tile)) else "per"
        computed = "; q, k and v computed as they are loaded" if self.prologues else ""
        return KernelLine(step=index, kind=self.kind, kernel=" + ".join(k.name for k in kernels), nodes=[lowered.label(n) for n in self.nodes],
                          elements=shape_size(self.node.type.shape), bytes=sum(k.bytes for k in kernels), flops=sum(k.flops for k in kernels), launches=2,
                          how=f"a block per {threads} queries, then {per_keys} {threads} keys; the scores recomputed tile by tile{computed}")


def computed(node: Node, context: LoweringContext) -> None:
    dtype = context.types[node.args[0]].dtype
    if dtype not in (DType.f32, DType.bf16):
        raise LoweringError(f"{node.op} %{node.id}: the attention kernels compute f32 and bf16, not {dtype.value}")


@register_lowering("attention")
def _attention(node: Node, context: LoweringContext) -> Placement:
    computed(node, context)
    if uses_gemms(node, context.types):
        return AttentionGemms(node, heads_of(node, context.types))
    return AttentionStep(node, TILE)


@register_lowering("attention_grad")
def _attention_grad(node: Node, context: LoweringContext) -> Placement:
    computed(node, context)
    if uses_gemms(node, context.types):
        return AttentionGradGemms(node, heads_of(node, context.types))
    return AttentionGradStep(node, TILE)
