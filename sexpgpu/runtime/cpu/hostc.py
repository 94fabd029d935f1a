"""The host emitter: the lowering's kernels (runtime/lower/) written as C for the CPU.

The lowering (runtime/lower/: the fusion partition, the reduction strategies, the row groups,
the arena, the order in which steps launch) is one; it has two emitters. The CUDA one writes
each step's kernels for a GPU; this one writes the same kernels as plain C functions
`void NAME(void* const* args, long long begin, long long end)` that compute the items
[begin, end) of the kernel (its threads' work, or its warps', or its blocks'), so that the
CPU device (device.py) can give the items to several threads.

- A kernel whose items are independent, one CUDA thread each (moves, gathers, constants,
  the average pools, Philox), is the CUDA kernel's own body inside a loop over its items:
  the same text, the same bits. The image steps' im2col, col2im and max-pools loop over rows
  instead (images.py).
- A fused elementwise group, a reduction and a row group are rendered here from the kernel
  description the CUDA kernels are rendered from (runtime/lower/kernel_ir.py: the loads,
  the op table's C expressions, the stores, each accumulator with its lanes and the op
  table's reducer spec); what this dialect decides is the schedule (HostKernel.schedule,
  printed by explain --cpu).
- A fused elementwise group is a loop over rows of its element space, each input loaded
  through a base computed once per row, so that the inner loop over a row is contiguous and
  vectorizes (the CUDA kernel divides its flat index by every broadcast stride instead).
- A reduction and a row group add up each output's elements in the order the device adds
  them: with a thread per output, in element order into one double; with a warp (32 lanes)
  or a block (BLOCK lanes) per output, lane l takes elements l, l + lanes, ..., each lane
  into a double of its own, and the lanes' partial results are combined in the device's
  fixed tree. A split reduction's chunks likewise. The results equal the device's bit for
  bit (the host emulation of the CUDA kernels checks it: tests/test_cpu_device.py).
- Attention: each query (or key) is computed by the per-query steps the CUDA kernels are
  rendered from (runtime/lower/attention.py: `softmax_step`, `lse_step`, `dq_step`,
  `dkv_step`, over a query's own rows and scalars: a lane's own names on the device, row t
  of a tile here), tile by tile with the device's tile sizes, so the online softmax
  rescales at the same keys.

Elementwise f32 exp, log, log1p, tanh, sin, cos and pow (the op table's `numpy_f32_loop`)
are NumPy's own loops (the ufuncs' f32 inner loops, called on blocks of SXB elements): NumPy computes these with its own SIMD
code, whose last bit differs from the C library's in up to a third of the elements, and the
CPU device's elementwise results are NumPy's bit for bit. bf16 computes in f32 through the C
library, as ml_dtypes does, rounded after every node. `math="libm"` uses the C library for
f32 too: what the CUDA kernels' host emulation computes, for the tests that compare the two.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from ...ir.dtypes import DType
from ...ir.graph import Node, Program, TensorType, shape_size
from ...ir.ops import ReducerSpec, all_ops, op_def
from ..lower.attention import AttentionGradStep, AttentionStep, Operands, backward_geometry, dkv_step, dq_step, geometry, key_range, lse_step, softmax_step, stats_loads, tile_loads
from ..lower.codegen import BLOCK, PRELUDE, KernelSource, LoweringError, broadcast_index, c_types, chain_lines, from_storage, literal, to_storage, unpack
from ..lower.emitters import emitter_for, register_emitter
from ..lower.kernel_ir import Accumulate, Elementwise, Load, RowReduce, RowScalar, Store, WindowStore
from ..lower.kernels import ReduceKernel, ReduceStrategy, elementwise_description, piecewise, reduce_description, reduce_geometry
from ..lower.lowering import Step
from ..lower.row_kernel import row_description, row_lanes
from ..lower.steps import FusedGroup, ReduceGroup, RowGroup

SXB = 256  # elements per block of a chain with NumPy calls; a multiple of every lane count
RUN_MIN = 16  # the shortest run of a reduction's elements worth a call of its own (an AVX-512 vector of f32)
FLAT_CHUNK = 4096  # elements per item of an elementwise kernel whose inputs need no row bases


def numpy_loop_ops() -> tuple[str, ...]:
    """The ops whose f32 results NumPy's own loops compute (the op table's `numpy_f32_loop`),
    in table order: op k calls loop k of the host module's table (device.py fetches them)."""
    return tuple(name for name, op in all_ops().items() if op.numpy_f32_loop is not None)


def numpy_ufuncs() -> tuple[str, ...]:
    """The NumPy ufunc of each of `numpy_loop_ops`, in the same order."""
    return tuple(str(op_def(name).numpy_f32_loop) for name in numpy_loop_ops())

# the host's side of the dialect's names (lower/codegen.py, DIALECT_NAMES) that the kernels'
# functions use: plain static functions, the high product in 64 bits, and an add and a multiply
# that round once (through a volatile: never contracted into a fused multiply-add); whether
# either of two numbers is NaN as the compiler's builtin (one unordered compare, which GCC
# vectorizes: `a != a || b != b` keeps a max's loop scalar)
HOST_ARITHMETIC = r"""
#define SX_FN static inline
#define SX_UNORDERED(a, b) __builtin_isunordered(a, b)
SX_FN unsigned int sx_mulhi(unsigned int a, unsigned int b) { return (unsigned int)(((unsigned long long)a * b) >> 32); }
SX_FN float sx_fadd(float a, float b) { volatile float r = a + b; return r; }
SX_FN float sx_fmul(float a, float b) { volatile float r = a * b; return r; }
"""

HOST_PRELUDE = r"""
#include <math.h>
#include <string.h>
#include <stdbool.h>
#define SX_TABLE static const
static inline float sx_bits_float(unsigned int b) { float f; memcpy(&f, &b, 4); return f; }
static inline unsigned int sx_float_bits(float f) { unsigned int b; memcpy(&b, &f, 4); return b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
typedef void (*sx_loop)(char**, const long*, const long*, void*);
static sx_loop sx_np[SX_LOOPS];
static void* sx_np_data[SX_LOOPS];
void sx_set_math(int k, void* fn, void* data) { sx_np[k] = (sx_loop)fn; sx_np_data[k] = data; }
static inline void sx_np1(int k, const float* x, float* y, long long n) {
  char* args[2] = {(char*)x, (char*)y}; long dims[1] = {(long)n}; long steps[2] = {4, 4};
  sx_np[k](args, dims, steps, sx_np_data[k]);
}
static inline void sx_np2(int k, const float* a, long sa, const float* b, long sb, float* y, long long n) {
  char* args[3] = {(char*)a, (char*)b, (char*)y}; long dims[1] = {(long)n}; long steps[3] = {sa, sb, 4};
  sx_np[k](args, dims, steps, sx_np_data[k]);
}
#define SXB 256
"""


def host_prelude() -> str:
    return HOST_PRELUDE.replace("SX_LOOPS", str(len(numpy_loop_ops()))) + HOST_ARITHMETIC + PRELUDE


@dataclass(frozen=True)
class HostKernel:
    """One C function of the host module: it computes items [begin, end) of `size`."""

    name: str  # the CUDA kernel's name (the step launches it by that name)
    source: str
    size: int  # items
    work: int  # bytes moved + flops, for the choice of threads
    preamble: str = ""
    launched_items: bool = False  # its items are the CUDA kernel's, counted at each launch (n is no literal of the text)
    schedule: str = "each item as the CUDA kernel's threads compute it"  # how the host loops over the work (explain --cpu)

    @property
    def symbol(self) -> str:
        """The function's name in the library: the CUDA name and the hash of the host text
        (two kernels of one CUDA text may differ on the host, say in their math)."""
        return f"{self.name}_h{hashlib.sha256((self.preamble + self.source).encode()).hexdigest()[:10]}"

    @property
    def text(self) -> str:
        return self.source.replace(self.name, self.symbol)


def is_call(node: Node, math: str) -> bool:
    return math == "numpy" and op_def(node.op).numpy_f32_loop is not None and node.type.dtype == DType.f32


def function(name: str, decls: tuple[str, ...] | list[str], body: list[str]) -> str:
    return "void " + name + "(void* const* sx_args, long long sx_begin, long long sx_end) {\n" + "\n".join(unpack(decls) + body) + "\n}\n"


def thread_kernel(kernel: KernelSource) -> HostKernel:
    """A kernel whose items are one CUDA thread each: its own lines, in a loop over the items."""
    if kernel.lanes != "thread":
        raise LoweringError(f"{kernel.name}: a kernel whose {kernel.lanes} lanes cooperate has no host form of its own here")
    body = ["  const long long n = sx_end; (void)n;", *kernel.before,
            f"  for (long long {kernel.loop} = sx_begin; {kernel.loop} < sx_end; ++{kernel.loop}) {{", *kernel.lines, "  }"]
    return HostKernel(kernel.name, function(kernel.name, kernel.decls, body), kernel.size, kernel.bytes + kernel.flops, kernel.preamble, launched_items=True,
                      schedule="a loop over the CUDA threads' items, each its thread's lines")


# -- chains of elementwise nodes over blocks of elements -------------------------------------------
Loader = Callable[[int], str]  # a value's element as C, from its id
Special = Callable[[Node, dict[int, str]], Optional[list[str]]]


class Chain:
    """Elementwise NODES over a block of elements (positions j < COUNT; SETUP defines the
    element's index variables from j): one loop per phase, a phase ending at each node that is
    a NumPy call, which runs over the whole block between two loops. Values crossing phases
    live in arrays bv<tag>_<id>[SXB]; the rest in registers."""

    def __init__(self, tag: str, types: dict[int, TensorType], constants: dict[int, Node], math: str, load: Loader,
                 preset: Optional[dict[int, str]] = None, special: Optional[Special] = None, opaque: frozenset[int] = frozenset()) -> None:
        self.tag, self.types, self.constants, self.math, self.load = tag, types, constants, math, load
        self.preset = dict(preset or {})
        self.special = special
        self.opaque = opaque  # nodes whose arguments are not loaded through `load` (a piecewise concat's parts)

    def array(self, vid: int) -> str:
        return f"bv{self.tag}_{vid}"

    def lines(self, nodes: list[Node], targets: list[int], setup: list[str], stores: Mapping[int, Callable[[str], str]], count: str,
              indent: str = "    ") -> tuple[list[str], dict[int, str]]:
        """The C lines, and for each target the C expression of its value at position j (an
        array element), valid after the lines."""
        ids = {n.id for n in nodes}
        calls = [n for n in nodes if is_call(n, self.math)]
        phase: dict[int, int] = {}
        p = 0
        for n in nodes:
            if is_call(n, self.math):
                phase[n.id] = p  # the call after phase p
                p += 1
            else:
                phase[n.id] = p
        phases = p + 1
        call_ids = {n.id for n in calls}
        arrays: set[int] = set(targets)
        for n in nodes:
            for a in n.args:
                if a in ids and a not in call_ids and (is_call(n, self.math) or phase[a] < phase[n.id]):
                    arrays.add(a)
                if is_call(n, self.math) and a not in ids and a not in self.constants:
                    arrays.add(a)  # an input (or a known scalar) a call reads: put in an array first
        arrays |= call_ids
        call_args = {a for n in calls for a in n.args}
        out = [f"{indent}{c_types(self.types[v].dtype)[1]} {self.array(v)}[SXB];" for v in sorted(arrays) if v not in self.preset or v in call_args]
        done_stores: set[int] = set()
        for q in range(phases):
            members = [n for n in nodes if phase[n.id] == q and n.id not in call_ids]
            call = next((n for n in calls if phase[n.id] == q), None)
            names = dict(self.preset)
            for v in arrays:
                if v in ids and (v in call_ids and phase[v] < q or v not in call_ids and phase[v] < q):
                    names[v] = f"{self.array(v)}[j]"
            body: list[str] = []
            wanted: list[int] = []  # inputs this phase loads
            for n in members:
                if n.id in self.opaque:
                    continue
                wanted += [a for a in n.args if a not in ids and a not in names and a not in self.constants]
            fills = [a for a in (call.args if call is not None else []) if a not in ids and a not in self.constants]
            fills += [v for v in targets if v not in ids and v not in self.preset and q == 0]
            wanted += fills
            for a in dict.fromkeys(wanted):
                if a in self.preset:
                    continue
                names[a] = f"x{self.tag}_{a}"
                body.append(f"{indent}  const {c_types(self.types[a].dtype)[1]} {names[a]} = {self.load(a)};")
            for n in members:
                more = self.special(n, names) if self.special is not None else None
                if more is None:
                    more, _ = chain_lines([n], names, self.types, self.constants, indent + "  ")
                body += more
            for n in members:
                if n.id in arrays:
                    body.append(f"{indent}  {self.array(n.id)}[j] = {names[n.id]};")
            for a in dict.fromkeys(fills):
                body.append(f"{indent}  {self.array(a)}[j] = {names[a]};")
            for v, store in stores.items():
                if v not in done_stores and v in names and (v not in ids or phase[v] <= q):
                    body.append(f"{indent}  {store(names[v])}")
                    done_stores.add(v)
            if body:
                out += [f"{indent}for (long long j = 0; j < {count}; ++j) {{", *[f"{indent}  {s}" for s in setup], *body, f"{indent}}}"]
            if call is not None:
                out += self.call_lines(call, count, indent)
        missing = set(stores) - done_stores
        if missing:
            raise LoweringError(f"host chain: values {sorted(missing)} are never stored")
        return out, {v: f"{self.array(v)}[j]" if v not in self.preset else self.preset[v] for v in targets}

    def call_lines(self, node: Node, count: str, indent: str) -> list[str]:
        k = numpy_loop_ops().index(node.op)
        out = self.array(node.id)
        if len(node.args) == 1:
            return [f"{indent}sx_np1({k}, {self.array(node.args[0])}, {out}, {count});"]
        operands = []
        lines = []
        for m, a in enumerate(node.args):
            if a in self.constants:
                lines.append(f"{indent}const float sx_c{self.tag}_{node.id}_{m} = {literal(self.constants[a].attrs['value'], DType.f32)};")
                operands.append(f"&sx_c{self.tag}_{node.id}_{m}, 0")
            elif a in self.preset:
                lines.append(f"{indent}const float sx_c{self.tag}_{node.id}_{m} = {self.preset[a]};")
                operands.append(f"&sx_c{self.tag}_{node.id}_{m}, 0")
            else:
                operands.append(f"{self.array(a)}, 4")
        return lines + [f"{indent}sx_np2({k}, {operands[0]}, {operands[1]}, {out}, {count});"]


# -- fused elementwise groups ----------------------------------------------------------------------
def elementwise_host(group: FusedGroup, program: Program, constants: dict[int, Node], math: str, kernel: KernelSource) -> HostKernel:
    """GROUP rendered from its description (kernels.elementwise_description, the CUDA
    kernel's) for the host: its elements in rows of the space (or flat chunks, or chunks of
    each segment of a joined group), each row one contiguous inner loop."""
    types = program.types()
    desc = elementwise_description(group, types)
    space = desc.space
    total = shape_size(space)
    width = space[-1] if space else 1
    loads = {load.value: load for load in desc.loads}
    flat = len(space) <= 1 or all(tuple(load.type.shape) == space or shape_size(load.type.shape) == 1 for load in loads.values())
    length = max(1, min(total, FLAT_CHUNK)) if flat else max(1, width)
    rows = -(-total // length) if total else 0
    bases: list[str] = []
    segments = piece_segments(desc, total, constants) if flat and (desc.concats or desc.windows) else None
    concats = {c.node.id: c for c in desc.concats}
    windows = {w.node.id: w for w in desc.windows}

    def load(vid: int) -> str:
        t, k = loads[vid].type, loads[vid].param
        if tuple(t.shape) == space:
            return from_storage(f"in{k}[i]", t.dtype)
        if shape_size(t.shape) == 1:
            return from_storage(f"in{k}[0]", t.dtype)
        if flat:
            raise LoweringError(f"host kernel {kernel.name}: input %{vid} needs a row base")
        bases.append(f"    const long long rb{k} = {broadcast_index(tuple(t.shape), space, 'i0')};")
        column = len(t.shape) >= 1 and t.shape[-1] == width
        return from_storage(f"in{k}[rb{k}{' + c' if column else ''}]", t.dtype)

    def special(node: Node, names: dict[int, str]) -> Optional[list[str]]:
        if node.id in concats:
            names[node.id] = f"v{node.id}"
            value = from_storage(f"pp{node.id}[i - po{node.id}]", node.type.dtype) if segments is not None else piecewise(concats[node.id], constants)
            return [f"      const {c_types(node.type.dtype)[1]} v{node.id} = {value};"]
        if node.id in windows:
            names[node.id] = names[node.args[0]]
            return []
        return None

    stores: dict[int, Callable[[str], str]] = {}
    families = window_families(desc)  # a value -> the windows of it the group stores
    covered = {source: segments is not None and all(any(w.start <= segments[s] < w.stop for w in members) for s in range(len(segments) - 1))
               for source, members in families.items()}
    for store in desc.stores:
        if isinstance(store, WindowStore):
            source = windows[store.value].node.args[0]
            if segments is not None and families[source][0] != store:
                continue  # one store per windowed value: the window of each segment

            def windowed(name: str, store: WindowStore = store, source: int = source) -> str:
                value = to_storage(name, store.dtype)
                if segments is not None:
                    return f"{'' if covered[source] else f'if (wf{source}) '}wf{source}[i - wo{source}] = {value};"
                return f"if (i >= {store.start}LL && i < {store.stop}LL) out{store.param}[i - {store.start}LL] = {value};"
            stores[store.value] = windowed
        else:
            def plain(name: str, store: Store = store) -> str:
                return f"out{store.param}[i] = {to_storage(name, store.dtype)};"
            stores[store.value] = plain
    chain = Chain("", types, constants, math, load, special=special, opaque=frozenset(concats))
    nodes = desc.nodes
    blocked = any(is_call(n, math) for n in nodes)
    if blocked:
        lines, _ = chain.lines(nodes, [], ["const long long c = c0 + j;", "const long long i = i0 + c;"], stores, "len", "      ")
        inner = ["    for (long long c0 = 0; c0 < cols; c0 += SXB) {", "      const long long len = cols - c0 < SXB ? cols - c0 : SXB;", *lines, "    }"]
    else:
        lines, _ = chain.lines(nodes, [], ["const long long c = j;", "const long long i = i0 + c;"], stores, "cols", "    ")
        inner = lines
    if segments is None:
        head = [f"    const long long i0 = r * {length}LL;", f"    const long long cols = i0 + {length}LL <= {total}LL ? {length}LL : {total}LL - i0;"]
        tables: list[str] = []
    else:
        tables, head, rows = segment_tables(desc, segments)
    pointers = {d.split()[-1]: d[: -len(d.split()[-1])].replace("__restrict__", "").strip() for d in kernel.decls}
    for concat in desc.concats:
        pointers[f"pp{concat.node.id}"] = f"const {c_types(concat.node.type.dtype)[0]}*"
    for source, members in families.items():
        pointers[f"wf{source}"] = f"{c_types(members[0].dtype)[0]}*"
    helper, call = outline(f"{kernel.name}_row", inner, pointers)
    body = [*tables, "  for (long long r = sx_begin; r < sx_end; ++r) {", *head, *dict.fromkeys(bases), call, "  }"]
    if segments is not None:
        schedule = f"chunks of {FLAT_CHUNK} elements within each of {len(segments) - 1} segments (concat parts, windows), each its own loop"
    else:
        schedule = f"{'chunks' if flat else 'rows'} of {length} element{'s' if length > 1 else ''}{'' if flat else ', broadcast inputs through a base per row'}, each a contiguous loop"
    if blocked:
        schedule += f" in blocks of {SXB}, NumPy's own loops between"
    return HostKernel(kernel.name, helper + function(kernel.name, kernel.decls, body), rows, kernel.bytes + kernel.flops, schedule=schedule)


def window_families(desc: Elementwise) -> dict[int, list[WindowStore]]:
    """Each value the group stores windows of -> those windows' stores, in output order."""
    windows = {w.node.id: w for w in desc.windows}
    families: dict[int, list[WindowStore]] = {}
    for store in desc.stores:
        if isinstance(store, WindowStore):
            families.setdefault(windows[store.value].node.args[0], []).append(store)
    return families


SCALARS = re.compile(r"\b(i0|cols|r|rb\d+|po\d+|wo\d+)\b")
POINTERS = re.compile(r"\b(in\d+|out\d+|pp\d+|wf\d+|bv_\d+)\b")


def outline(name: str, lines: list[str], pointers: dict[str, str], arguments: Optional[Mapping[str, str]] = None, indent: str = "    ") -> tuple[str, str]:
    """LINES as a static function of the pointers and index variables they use, each pointer
    `restrict`, and the call (a pointer passed as ARGUMENTS says, else by its name): GCC
    vectorizes such a loop, where inside the kernel (next to tables of pointers) it keeps it
    scalar."""
    text = "\n".join(lines)
    used = [p for p in dict.fromkeys(POINTERS.findall(text)) if p in pointers]
    scalars = list(dict.fromkeys(SCALARS.findall(text)))
    params = [f"{pointers[p]} __restrict__ {p}" for p in used] + [f"const long long {v}" for v in scalars]
    helper = f"static inline void {name}({', '.join(params) or 'void'}) {{\n" + text + "\n}\n"
    given = arguments or {}
    return helper, f"{indent}{name}({', '.join([given.get(p, p) for p in used] + scalars)});"


def piece_segments(desc: Elementwise, total: int, constants: dict[int, Node]) -> Optional[list[int]]:
    """The boundaries of a joined group's segments (every part of every concat and every
    window is whole in each), or None when a concat has a literal part (then each element
    picks its part)."""
    cuts = {0, total}
    for concat in desc.concats:
        for part in concat.parts:
            if part.value in constants:
                return None
            cuts |= {part.start, part.stop}
    for window in desc.windows:
        cuts |= {window.start, window.stop}
    return sorted(cuts)


def segment_tables(desc: Elementwise, cuts: list[int]) -> tuple[list[str], list[str], int]:
    """An item is a chunk of one segment: the tables that say where each segment starts and
    which part each concat reads there (and which windows it stores), and the item's head."""
    segments = len(cuts) - 1
    firsts = [0]
    for k in range(segments):
        firsts.append(firsts[-1] + -(-(cuts[k + 1] - cuts[k]) // FLAT_CHUNK))
    tables = [f"  static const long long sx_cut[{len(cuts)}] = {{{', '.join(f'{c}LL' for c in cuts)}}};",
              f"  static const long long sx_first[{len(firsts)}] = {{{', '.join(f'{f}LL' for f in firsts)}}};"]
    head = ["    long long lo = 0, hi = " + str(segments) + ";",
            "    while (hi - lo > 1) { const long long mid = (lo + hi) / 2; if (sx_first[mid] <= r) lo = mid; else hi = mid; }",
            "    const long long seg = lo;",
            f"    const long long i0 = sx_cut[seg] + (r - sx_first[seg]) * {FLAT_CHUNK}LL;",
            f"    const long long cols = i0 + {FLAT_CHUNK}LL <= sx_cut[seg + 1] ? {FLAT_CHUNK}LL : sx_cut[seg + 1] - i0;"]
    for concat in desc.concats:
        node = concat.node
        parts, offsets = [], []
        for k in range(segments):
            part = next((p for p in concat.parts if p.start <= cuts[k] < p.stop), None)
            parts.append(f"in{part.param if part is not None else concat.parts[0].param}")
            offsets.append(f"{part.start if part is not None else 0}LL")
        store = c_types(node.type.dtype)[0]
        tables.append(f"  const {store}* const sx_parts{node.id}[{segments}] = {{{', '.join(parts)}}};")
        tables.append(f"  static const long long sx_offs{node.id}[{segments}] = {{{', '.join(offsets)}}};")
        head.append(f"    const {store}* const pp{node.id} = sx_parts{node.id}[seg]; const long long po{node.id} = sx_offs{node.id}[seg];")
    for source, members in window_families(desc).items():
        store = c_types(members[0].dtype)[0]
        pointers, starts = [], []
        for s in range(segments):
            found = next((w for w in members if w.start <= cuts[s] < w.stop), None)
            pointers.append(f"out{found.param}" if found else "0")
            starts.append(f"{found.start if found else 0}LL")
        tables.append(f"  {store}* const sx_wf{source}[{segments}] = {{{', '.join(pointers)}}};")
        tables.append(f"  static const long long sx_wo{source}[{segments}] = {{{', '.join(starts)}}};")
        head.append(f"    {store}* const wf{source} = sx_wf{source}[seg]; const long long wo{source} = sx_wo{source}[seg];")
    return tables, head, firsts[-1]


# -- the lanes of a reduction ------------------------------------------------------------------------
def lanes_of(lanes: str) -> int:
    return {"thread": 1, "warp": 32, "block": BLOCK}[lanes]


def lane_words(lanes: int, what: str) -> str:
    """How LANES partial results take WHAT, in words (explain --cpu)."""
    if lanes == 1:
        return f"one accumulator over {what}"
    return f"{lanes} lane partials over {what}, then the lanes' tree"


def lane_loop(desc: Accumulate, lanes: int, acc: str, values: str, count: str, indent: str) -> list[str]:
    """Block positions [0, COUNT) into the lanes' accumulators ACC[lanes] (position q to lane
    q % lanes: a block starts at a multiple of the lanes)."""
    if lanes == 1:
        return [f"{indent}for (long long j = 0; j < {count}; ++j) {desc.reducer.update(f'{acc}[0]', f'{values}[j]', desc.integer)}"]
    return [f"{indent}for (long long g = 0; g < {count}; g += {lanes}) {{",
            f"{indent}  const long long m = {count} - g < {lanes} ? {count} - g : {lanes};",
            f"{indent}  for (long long l = 0; l < m; ++l) {desc.reducer.update(f'{acc}[l]', f'{values}[g + l]', desc.integer)}", f"{indent}}}"]


def tree(reducer: ReducerSpec, lanes: int, acc: str, indent: str) -> list[str]:
    """The lanes' partial results combined in the device's fixed tree, into ACC[0]."""
    if lanes == 1:
        return []
    return [f"{indent}for (int s = {lanes // 2}; s > 0; s >>= 1) for (int l = 0; l < s; ++l) {acc}[l] = {reducer.pair(f'{acc}[l]', f'{acc}[l + s]')};"]


def host_accumulate(desc: Accumulate, chain: Chain, indent: str = "    ", prologue: Optional[list[str]] = None) -> list[str]:
    """DESC on the host: the lanes' partials in a stack array ACC[lanes], the elements in blocks
    of SXB (lane l takes the block positions l, l + lanes, ..., as the device's lane takes its
    elements), each block computed by CHAIN (NumPy's loops over the whole block between its
    phases) or by PROLOGUE's lines (run_prologue's) when given, then the lanes' tree: ACC[0]
    holds the result."""
    lanes = lanes_of(desc.lanes)
    var, acc = desc.var, desc.acc
    stores = {s.value: (lambda name, s=s: f"out{s.param}[idx] = {to_storage(name, s.dtype)};") for s in desc.stores}
    lines, values = chain.lines(desc.nodes, [desc.value], [f"const long long {var} = {var}0 + j;", f"const long long idx = {desc.index};"], stores, "len", indent + "  ")
    if prologue is not None:
        lines = [f"{indent}  {c_types(chain.types[desc.value].dtype)[1]} {chain.array(desc.value)}[SXB];", *prologue]
    return [f"{indent}{'long long' if desc.integer else 'double'} {acc}[{lanes}];",
            f"{indent}for (int l = 0; l < {lanes}; ++l) {acc}[l] = {desc.reducer.start(desc.integer)};",
            f"{indent}for (long long {var}0 = {desc.first}; {var}0 < {desc.end}; {var}0 += SXB) {{",
            f"{indent}  const long long len = {desc.end} - {var}0 < SXB ? {desc.end} - {var}0 : SXB;",
            *lines, *lane_loop(desc, lanes, acc, values[desc.value][: -len("[j]")], "len", indent + "  "), f"{indent}}}",
            *tree(desc.reducer, lanes, acc, indent)]


# a boolean register as an int of 0 or 1 (what C's conversion to bool gives): GCC 12 vectorizes no
# loop with a bool in it ("no vectype" for its loads)
BOOLEAN = re.compile(r"^(\s*)const bool (\w+) = (.*);$")


def run_width(space: tuple[int, ...], axes: list[int], inputs: list[TensorType], reduced: bool = True) -> int:
    """Elements of SPACE's trailing axes that are all reduced (REDUCED; else all kept: the
    outputs') and lie side by side in memory in every input too (an input's trailing
    dimensions those of SPACE, or all 1: one value): a run of them is one contiguous loop. 1
    when the last axis is not of that kind."""
    width = 1
    for d in range(len(space) - 1, -1, -1):
        if (d in axes) != reduced:
            break
        for t in inputs:
            lead = len(space) - len(t.shape)
            own = [t.shape[e - lead] if e >= lead else 1 for e in range(d, len(space))]
            if own != list(space[d:]) and any(n != 1 for n in own):
                return width
        width *= space[d]
    return width


def runs_along(shape: tuple[int, ...], space: tuple[int, ...], width: int) -> bool:
    """Whether an input of SHAPE runs along the last WIDTH elements of SPACE (whole trailing
    axes; run_width's), rather than holding one value there."""
    axes, size = 0, 1
    while size < width:
        axes += 1
        size *= space[-axes]
    lead = len(space) - len(shape)
    return [shape[e - lead] if e >= lead else 1 for e in range(len(space) - axes, len(space))] == list(space[len(space) - axes:])


def run_function(desc: Accumulate, name: str, decls: tuple[str, ...], types: dict[int, TensorType], params: dict[int, int],
                 space: tuple[int, ...], width: int, block: Chain) -> tuple[str, str, list[str]]:
    """DESC's elements i0 + j, j < cols, as a static function whose loop reads its inputs at
    idx = i0 + j (or one value per run: a base per run, as an elementwise row's) and writes
    the value into the kernel's block array from position j0 on: GCC vectorizes it, where the
    per-element index arithmetic (divisions by the axes' extents) kept the block's loop
    scalar. The run lies within WIDTH neighbours (run_width's), where every input runs along
    with it or holds one value. The same operations in the same order (BLOCK: the kernel's
    chain, whose tag, constants and math the run's chain keeps; a NumPy call runs over the
    run's elements). Returns the function, its call and the lines of the run's bases."""
    bases: dict[int, str] = {}

    def load(vid: int) -> str:
        t, k = types[vid], params[vid]
        if tuple(t.shape) == space:
            return from_storage(f"in{k}[idx]", t.dtype)
        if shape_size(t.shape) == 1:
            return from_storage(f"in{k}[0]", t.dtype)
        bases[k] = f"        const long long rb{k} = {broadcast_index(tuple(t.shape), space, 'i0')};"
        return from_storage(f"in{k}[rb{k}{' + j' if runs_along(tuple(t.shape), space, width) else ''}]", t.dtype)

    chain = Chain(block.tag, types, block.constants, block.math, load)
    stores = {s.value: (lambda text, s=s: f"out{s.param}[idx] = {to_storage(text, s.dtype)};") for s in desc.stores}
    lines, _ = chain.lines(desc.nodes, [desc.value], ["const long long idx = i0 + j;"], stores, "cols", "  ")
    array = chain.array(desc.value)
    own = f"{c_types(types[desc.value].dtype)[1]} {array}[SXB];"  # the block's array is the kernel's
    loop = [BOOLEAN.sub(r"\1const int \2 = ((\3) != 0);", line) for line in lines if line.strip() != own]
    pointers = {d.split()[-1]: d[: -len(d.split()[-1])].replace("__restrict__", "").strip() for d in decls}
    pointers[array] = f"{c_types(types[desc.value].dtype)[1]}*"
    helper, call = outline(name, loop, pointers, {array: f"{array} + j0"}, "        ")
    return helper, call, list(bases.values())


def run_prologue(desc: Accumulate, name: str, decls: tuple[str, ...], types: dict[int, TensorType], params: dict[int, int],
                 space: tuple[int, ...], width: int, block: Chain) -> tuple[str, list[str]]:
    """A block of DESC's elements (positions j < len, element jj0 + j) computed in runs of
    neighbours in memory (at most WIDTH, run_width's), each run one call of run_function's.
    Returns the function and the block's lines."""
    helper, call, bases = run_function(desc, name, decls, types, params, space, width, block)
    var = desc.var
    lines = ["      for (long long j0 = 0; j0 < len;) {",
             f"        const long long {var} = {var}0 + j0;",
             f"        const long long i0 = {desc.index};",
             f"        const long long cols = len - j0 < {width}LL - i0 % {width}LL ? len - j0 : {width}LL - i0 % {width}LL;",
             *bases, call, "        j0 += cols;", "      }"]
    return helper, lines


def reduce_host(group: ReduceGroup, program: Program, constants: dict[int, Node], math: str, kernels: list[KernelSource],
                strategy: Optional[ReduceStrategy] = None) -> list[HostKernel]:
    """The reduction's kernels (one, or the chunks' and their combination's), rendered from the
    description the CUDA kernels are (kernels.reduce_description): see the module's docstring."""
    types = program.types()
    desc = reduce_description(group, types, strategy)
    space = tuple(types[group.node.args[0]].shape)
    index = {vid: k for k, vid in enumerate(group.inputs)}

    def load(vid: int) -> str:
        t = types[vid]
        return from_storage(f"in{index[vid]}[{broadcast_index(tuple(t.shape), space, 'idx')}]", t.dtype)

    acc = desc.accumulate
    split, outputs = desc.split, desc.outputs
    chain = Chain("", types, constants, math, load)
    main = kernels[0]
    helpers = ""
    innermost = desc.innermost
    per = "per chunk" if split > 1 else "per output"
    axes = reduce_geometry(group, types)[0]
    inputs = [types[vid] for vid in group.inputs]
    if acc.lanes == "thread" and not innermost:
        schedule = f"outputs side by side in blocks of {SXB}, each adding its elements in order"
        width = run_width(space, axes, inputs, reduced=False)
        runs: Optional[tuple[str, list[str], int]] = None
        if width >= RUN_MIN:
            helpers, call, bases = run_function(acc, f"{main.name}_run", main.decls, types, index, space, width, chain)
            runs = (call, bases, width)
            schedule += f", the block's elements of each step in runs of at most {width} neighbours in memory"
        body = across_outputs(desc, chain, runs)
    else:
        schedule = f"{per}: {lane_words(lanes_of(acc.lanes), f'blocks of {SXB} elements')}"
        width = run_width(space, axes, inputs)
        prologue: Optional[list[str]] = None
        if innermost and width >= RUN_MIN and not any(is_call(n, math) for n in acc.nodes):
            helpers, prologue = run_prologue(acc, f"{main.name}_run", main.decls, types, index, space, width, chain)
            schedule += f", each block's elements in runs of at most {width} neighbours in memory"
        body = [
            "  for (long long item = sx_begin; item < sx_end; ++item) {",
            *([f"    const long long o = item % {outputs}LL, c = item / {outputs}LL;"] if split > 1 else ["    const long long o = item;"]),
            f"    const long long base = {desc.base};",
            *host_accumulate(acc, chain, prologue=prologue),
            f"    out0[o] = {desc.result(f'{acc.acc}[0]')};" if split == 1 else f"    out0[item] = {acc.acc}[0];",
            "  }",
        ]
    host = [HostKernel(main.name, helpers + function(main.name, main.decls, body), main.size, main.bytes + main.flops, schedule=schedule)]
    if split > 1:
        finish = kernels[1]
        finish_lanes = lanes_of(desc.finish_lanes)
        reducer = acc.reducer
        fbody = [
            "  for (long long o = sx_begin; o < sx_end; ++o) {",
            f"    double acc[{finish_lanes}];",
            f"    for (int l = 0; l < {finish_lanes}; ++l) acc[l] = {reducer.start(False)};",
            f"    for (long long c = 0; c < {split}LL; ++c) {{ const double p = in0[c * {outputs}LL + o]; acc[c % {finish_lanes}] = {reducer.pair(f'acc[c % {finish_lanes}]', 'p')}; }}",
            *tree(reducer, finish_lanes, "acc", "    "),
            f"    out0[o] = {desc.result('acc[0]')};",
            "  }",
        ]
        host.append(HostKernel(finish.name, function(finish.name, finish.decls, fbody), finish.size, finish.bytes + finish.flops,
                               schedule=f"per output: {lane_words(finish_lanes, f'its {split} chunks')}"))
    return host


def across_outputs(desc: ReduceKernel, chain: Chain, runs: Optional[tuple[str, list[str], int]] = None) -> list[str]:
    """The host's schedule for a thread per output whose elements lie apart in memory: outputs
    side by side in a block (SIMD across outputs, as a GPU's threads), each still taking its
    elements in order. With RUNS (run_function's call and bases, and its width): each step's
    block of elements in runs of neighbours in memory, each run one call of the function."""
    acc = desc.accumulate
    if runs is None:
        stores = {s.value: (lambda name, s=s: f"out{s.param}[idx] = {to_storage(name, s.dtype)};") for s in acc.stores}
        lines, values = chain.lines(acc.nodes, [acc.value], ["const long long o = o0 + j;", f"const long long idx = {desc.base} + within;"], stores, "count", "      ")
        array = values[acc.value][: -len("[j]")]
    else:
        call, bases, width = runs
        array = chain.array(acc.value)
        lines = [f"      {c_types(chain.types[acc.value].dtype)[1]} {array}[SXB];",
                 "      for (long long j0 = 0; j0 < count;) {",
                 "        const long long o = o0 + j0;",
                 f"        const long long base = {desc.base};",
                 f"        const long long i0 = {acc.index};",
                 f"        const long long cols = count - j0 < {width}LL - o % {width}LL ? count - j0 : {width}LL - o % {width}LL;",
                 *bases, call, "        j0 += cols;", "      }"]
    outputs = desc.outputs
    return [
        "  for (long long item0 = sx_begin; item0 < sx_end;) {",
        f"    const long long c = item0 / {outputs}LL, o0 = item0 % {outputs}LL;",
        f"    long long count = {outputs}LL - o0 < SXB ? {outputs}LL - o0 : SXB;",
        "    if (count > sx_end - item0) count = sx_end - item0;",
        "    (void)c;",
        f"    {'long long' if acc.integer else 'double'} acc[SXB];",
        f"    for (long long q = 0; q < count; ++q) acc[q] = {acc.reducer.start(acc.integer)};",
        f"    for (long long {acc.var} = {acc.first}; {acc.var} < {acc.end}; ++{acc.var}) {{",
        f"      const long long within = {desc.within};",
        *lines,
        f"      for (long long j = 0; j < count; ++j) {acc.reducer.update('acc[j]', f'{array}[j]', acc.integer)}",
        "    }",
        f"    for (long long q = 0; q < count; ++q) {'out0[o0 + q] = ' + desc.result('acc[q]') if desc.split == 1 else 'out0[item0 + q] = acc[q]'};",
        "    item0 += count;",
        "  }",
    ]


# -- row groups ----------------------------------------------------------------------------------------
def rows_host(group: RowGroup, program: Program, constants: dict[int, Node], math: str, kernel: KernelSource, lanes_name: Optional[str] = None) -> HostKernel:
    """One row per item, rendered from the row group's description (the CUDA kernel's): its
    reductions in the device's lane order (a thread, a warp or a block per row), each loop
    over the row in blocks of SXB columns, broadcast inputs through a base per row."""
    types = program.types()
    desc = row_description(group, types, constants, lanes_name or row_lanes(group.space[-1]))
    space, width = desc.space, desc.width
    params = {vid: k for k, vid in enumerate(group.inputs)}
    scalars: dict[int, str] = {}
    bases: list[str] = []
    lines: list[str] = []
    counter = [0]

    def row_load(vid: int) -> str:
        t = types[vid]
        k = params[vid]
        if tuple(t.shape) == space:
            return from_storage(f"in{k}[idx]", t.dtype)
        if shape_size(t.shape) == 1:
            return from_storage(f"in{k}[0]", t.dtype)
        base = f"    const long long rb{k} = {broadcast_index(tuple(t.shape), space, f'(r * {width}LL)')};"
        if base not in bases:
            bases.append(base)
        column = len(t.shape) >= 1 and t.shape[-1] == width
        return from_storage(f"in{k}[rb{k}{' + c' if column else ''}]", t.dtype)

    def chain(load: Callable[[int], str]) -> Chain:
        counter[0] += 1
        return Chain(str(counter[0]), types, constants, math, load, preset=scalars)

    for phase in desc.phases:
        if isinstance(phase, RowScalar):
            loads = {load.value: load for load in phase.loads}

            def scalar_load(vid: int, loads: dict[int, Load] = loads) -> str:
                return from_storage(f"in{loads[vid].param}[{broadcast_index(tuple(loads[vid].type.shape), loads[vid].space, 'r')}]", loads[vid].type.dtype)

            more, values = chain(scalar_load).lines([phase.node], [phase.node.id], [], {}, "1", "    ")
            lines += more
            scalars[phase.node.id] = values[phase.node.id].replace("[j]", "[0]")
        elif isinstance(phase, RowReduce):
            lines += host_accumulate(phase.accumulate, chain(row_load))
            lines.append(f"    const float s{phase.node.id} = {desc.result(phase, f'{phase.accumulate.acc}[0]')};")
            scalars[phase.node.id] = f"s{phase.node.id}"
        else:
            stores = {op.value: (lambda name, op=op: f"out{op.param}[idx] = {to_storage(name, op.dtype)};") for op in phase.stores}
            more, _ = chain(row_load).lines(phase.nodes, list(stores), ["const long long c = c0 + j;", f"const long long idx = r * {width}LL + c;"], stores, "len", "      ")
            lines += [f"    for (long long c0 = 0; c0 < {width}LL; c0 += SXB) {{", f"      const long long len = {width}LL - c0 < SXB ? {width}LL - c0 : SXB;",
                      *more, "    }"]
        if isinstance(phase, (RowScalar, RowReduce)) and phase.store is not None:
            lines.append(f"    out{phase.store}[r] = {to_storage(scalars[phase.node.id], phase.node.type.dtype)};")
    body = ["  for (long long r = sx_begin; r < sx_end; ++r) {", *bases, *lines, "  }"]
    schedule = f"a row per item: each reduction {lane_words(lanes_of(desc.lanes), f'blocks of {SXB} columns')}"
    return HostKernel(kernel.name, function(kernel.name, kernel.decls, body), kernel.size, kernel.bytes + kernel.flops, schedule=schedule)


# -- attention: the device's per-query steps (a query's, or in the dk/dv pass a key's) for each query t of
# an item's tile, over the same key tiles, read straight from memory as f32 (what the device's shared
# memory holds): the same operations in the same order ---------------------------------------------------
def prologue_functions(kernel: KernelSource, operands: Operands) -> tuple[str, dict[str, str]]:
    """The operands' prologues (the CUDA kernel's lambdas) as static C functions over the
    kernel's inputs in0..; and, per role, a C call taking index i."""
    text = []
    calls = {}
    decls = [d for d in kernel.decls if d.split()[-1].startswith("in")]
    for role in sorted(operands.computed):
        params = ", ".join(decls)
        text.append(f"static inline float sx_{role}_of_{kernel.name}({params}{', ' if params else ''}long long i) {{\n" + "\n".join(operands.bodies[role]) + "\n}\n")
        names = ", ".join(d.split()[-1] for d in decls)
        calls[role] = f"sx_{role}_of_{kernel.name}({names}{', ' if names else ''}"
    return "".join(text), calls


def tile_own(name: str) -> str:
    """The host's: an item computes a tile of queries (or keys), query t's rows and scalars at [t]."""
    return f"{name}[t]"


class AttentionText:
    """What the three attention kernels share on the host: the operands' loads, as f32."""

    def __init__(self, step: AttentionStep, program: Program, constants: dict[int, Node], kernel: KernelSource, roles: tuple[str, ...]) -> None:
        self.operands = Operands(step.node, program, constants, step.prologues, roles)
        self.helpers, self.calls = prologue_functions(kernel, self.operands)

    def load(self, role: str, index: str) -> str:
        if role in self.operands.computed:
            return f"{self.calls[role]}{index})"
        return from_storage(f"{role}[{index}]", self.operands.dtype)


def attention_forward_host(step: AttentionStep, program: Program, constants: dict[int, Node], kernel: KernelSource) -> HostKernel:
    g = geometry(step.node, program.types(), step.tile)
    text = AttentionText(step, program, constants, kernel, ("q", "k", "v"))
    scale = literal(g.scale, DType.f32)
    seen, end = key_range(g)
    T, D, K = g.tile, g.width, g.keys
    body = [
        f"  float ks[{K * D}], vs[{K * D}], qr[{T}][{D}], acc[{T}][{D}], m[{T}], l[{T}], s[{K}];",
        "  for (long long item = sx_begin; item < sx_end; ++item) {",
        f"    const long long head = item / {g.tiles}LL, base = {g.base('head')}, q0 = (item % {g.tiles}LL) * {T}LL;",
        f"    const int live = (int)({g.length}LL - q0 < {T}LL ? {g.length}LL - q0 : {T}LL);",
        f"    for (int t = 0; t < live; ++t) {{ const long long query = q0 + t; for (int d = 0; d < {D}; ++d) {{ qr[t][d] = {text.load('q', f'base + query * {g.stride}LL + d')}; acc[t][d] = 0.0f; }} m[t] = -sx_inf(); l[t] = 0.0f; }}",
        f"    for (long long k0 = 0; k0 < {seen}; k0 += {K}LL) {{",
        f"      for (long long e = 0; e < {K * D}LL; ++e) {{ const long long row = k0 + e / {D}; {tile_loads(g, text.load, [('ks', 'k'), ('vs', 'v')], 'e')} }}",
        "      for (int t = 0; t < live; ++t) {",
        "        const long long query = q0 + t;",
        f"        const long long end = {end};",
        "        if (end <= k0) continue;",
        *softmax_step(g, tile_own, scale, "        "),
        "      }",
        "    }",
        f"    for (int t = 0; t < live; ++t) for (int d = 0; d < {D}; ++d) o[base + (q0 + t) * {g.stride}LL + d] = {to_storage('acc[t][d] / l[t]', g.dtype)};",
        "  }",
    ]
    return HostKernel(kernel.name, text.helpers + function(kernel.name, kernel.decls, body), kernel.size, kernel.bytes + kernel.flops,
                      schedule=f"a tile of {T} queries per item, K and V tiles of {K} keys on the stack, each query's online softmax as its CUDA thread's")


def attention_dq_host(step: AttentionGradStep, program: Program, constants: dict[int, Node], kernel: KernelSource) -> HostKernel:
    g = backward_geometry(step.node, program.types(), step.tile)
    text = AttentionText(step, program, constants, kernel, ("q", "k", "v", "o", "g"))
    scale = literal(g.scale, DType.f32)
    rows = g.heads * g.length
    T, D, K = g.tile, g.width, g.keys
    seen, end = key_range(g)
    at = f"base + query * {g.stride}LL + d"
    load_tile = f"      for (long long e = 0; e < {K * D}LL; ++e) {{ const long long row = k0 + e / {D}; {tile_loads(g, text.load, [('ks', 'k'), ('vs', 'v')], 'e')} }}"
    body = [
        f"  float ks[{K * D}], vs[{K * D}], qr[{T}][{D}], gr[{T}][{D}], dq[{T}][{D}], dsum[{T}], m[{T}], l[{T}], lse[{T}];",
        "  for (long long item = sx_begin; item < sx_end; ++item) {",
        f"    const long long head = item / {g.tiles}LL, base = {g.base('head')}, q0 = (item % {g.tiles}LL) * {T}LL;",
        f"    const int live = (int)({g.length}LL - q0 < {T}LL ? {g.length}LL - q0 : {T}LL);",
        "    for (int t = 0; t < live; ++t) {",
        "      const long long query = q0 + t; dsum[t] = 0.0f;",
        f"      for (int d = 0; d < {D}; ++d) {{ qr[t][d] = {text.load('q', at)}; gr[t][d] = {text.load('g', at)}; dq[t][d] = 0.0f; dsum[t] += gr[t][d] * {text.load('o', at)}; }}",
        "      m[t] = -sx_inf(); l[t] = 0.0f;",
        "    }",
        f"    for (long long k0 = 0; k0 < {seen}; k0 += {K}LL) {{",
        load_tile,
        "      for (int t = 0; t < live; ++t) {",
        f"        const long long query = q0 + t; const long long end = {end};",
        f"        {lse_step(g, tile_own, scale)}",
        "      }",
        "    }",
        "    for (int t = 0; t < live; ++t) lse[t] = m[t] + logf(l[t]);",
        f"    for (long long k0 = 0; k0 < {seen}; k0 += {K}LL) {{",
        load_tile,
        "      for (int t = 0; t < live; ++t) {",
        f"        const long long query = q0 + t; const long long end = {end};",
        "        for (long long j = k0; j < end; ++j) {",
        *dq_step(g, tile_own, scale, "          "),
        "        }",
        "      }",
        "    }",
        "    for (int t = 0; t < live; ++t) {",
        "      const long long query = q0 + t;",
        f"      for (int d = 0; d < {D}; ++d) out[{at}] = {to_storage(f'dq[t][d] * {scale}', g.dtype)};",
        f"      stats[head * {g.length}LL + query] = lse[t]; stats[{rows}LL + head * {g.length}LL + query] = dsum[t];",
        "    }",
        "  }",
    ]
    return HostKernel(kernel.name, text.helpers + function(kernel.name, kernel.decls, body), kernel.size, kernel.bytes + kernel.flops,
                      schedule=f"a tile of {T} queries per item, K and V tiles of {K} keys on the stack: each query's log-sum-exp, then its dq, "
                      "as its CUDA thread's")


def attention_dkv_host(step: AttentionGradStep, program: Program, constants: dict[int, Node], kernel: KernelSource) -> HostKernel:
    g = backward_geometry(step.node, program.types(), step.tile)
    text = AttentionText(step, program, constants, kernel, ("q", "k", "v", "g"))
    scale = literal(g.scale, DType.f32)
    T, D, K = g.tile, g.width, g.keys
    first = f"(item % {g.tiles}LL) * {T}LL" if g.causal else "0"
    at = f"base + key * {g.stride}LL + d"
    body = [
        f"  float qs[{K * D}], gs[{K * D}], ls[{K}], ds_[{K}], kr[{T}][{D}], vr[{T}][{D}], dk[{T}][{D}], dv[{T}][{D}];",
        "  for (long long item = sx_begin; item < sx_end; ++item) {",
        f"    const long long head = item / {g.tiles}LL, base = {g.base('head')}, key0 = (item % {g.tiles}LL) * {T}LL;",
        f"    const int live = (int)({g.length}LL - key0 < {T}LL ? {g.length}LL - key0 : {T}LL);",
        "    for (int t = 0; t < live; ++t) {",
        "      const long long key = key0 + t;",
        f"      for (int d = 0; d < {D}; ++d) {{ kr[t][d] = {text.load('k', at)}; vr[t][d] = {text.load('v', at)}; dk[t][d] = 0.0f; dv[t][d] = 0.0f; }}",
        "    }",
        f"    for (long long q0 = {first}; q0 < {g.length}LL; q0 += {K}LL) {{",
        f"      for (long long e = 0; e < {K * D}LL; ++e) {{ const long long row = q0 + e / {D}; {tile_loads(g, text.load, [('qs', 'q'), ('gs', 'g')], 'e')} }}",
        f"      for (long long e = 0; e < {K}LL; ++e) {{ const long long row = q0 + e; {stats_loads(g, 'e')} }}",
        "      for (int t = 0; t < live; ++t) {",
        "        const long long key = key0 + t;",
        f"        const long long start = {'(q0 > key ? q0 : key)' if g.causal else 'q0'}, stop = q0 + {K}LL < {g.length}LL ? q0 + {K}LL : {g.length}LL;",
        "        for (long long i = start; i < stop; ++i) {",
        *dkv_step(g, tile_own, scale, "          "),
        "        }",
        "      }",
        "    }",
        "    for (int t = 0; t < live; ++t) {",
        "      const long long key = key0 + t;",
        f"      for (int d = 0; d < {D}; ++d) {{ out[{g.elements}LL + {at}] = {to_storage(f'dk[t][d] * {scale}', g.dtype)}; out[{2 * g.elements}LL + {at}] = {to_storage('dv[t][d]', g.dtype)}; }}",
        "    }",
        "  }",
    ]
    # its tiles' items (the device's kernel may give each tile two blocks, one for dk, one for dv)
    return HostKernel(kernel.name, text.helpers + function(kernel.name, kernel.decls, body), g.heads * g.tiles, kernel.bytes + kernel.flops,
                      schedule=f"a tile of {T} keys per item, Q and g tiles of {K} queries on the stack, each key's dk and dv as its CUDA thread's")


# -- every kernel of a step -------------------------------------------------------------------------------
PLATFORM = "cpu"  # the emitters' key in the lowering's table (runtime/lower/emitters.py)

# (step, program, constants, the CUDA emitter's kernels in launch order, math) -> the host functions
HostEmitter = Callable[[Any, Program, dict[int, Node], list[KernelSource], str], list[HostKernel]]


@register_emitter(FusedGroup, platform=PLATFORM)
def fused_group_host(group: FusedGroup, program: Program, constants: dict[int, Node], kernels: list[KernelSource], math: str) -> list[HostKernel]:
    return [elementwise_host(group, program, constants, math, kernels[0])]


@register_emitter(ReduceGroup, platform=PLATFORM)
def reduce_group_host(group: ReduceGroup, program: Program, constants: dict[int, Node], kernels: list[KernelSource], math: str) -> list[HostKernel]:
    return reduce_host(group, program, constants, math, kernels)


@register_emitter(RowGroup, platform=PLATFORM)
def row_group_host(group: RowGroup, program: Program, constants: dict[int, Node], kernels: list[KernelSource], math: str) -> list[HostKernel]:
    return [rows_host(group, program, constants, math, kernels[0])]


@register_emitter(AttentionStep, platform=PLATFORM)
def attention_host(step: AttentionStep, program: Program, constants: dict[int, Node], kernels: list[KernelSource], math: str) -> list[HostKernel]:
    return [attention_forward_host(step, program, constants, kernels[0])]


@register_emitter(AttentionGradStep, platform=PLATFORM)
def attention_grad_host(step: AttentionGradStep, program: Program, constants: dict[int, Node], kernels: list[KernelSource], math: str) -> list[HostKernel]:
    return [attention_dq_host(step, program, constants, kernels[0]), attention_dkv_host(step, program, constants, kernels[1])]


def thread_kernels(step: Step, program: Program, constants: dict[int, Node], kernels: list[KernelSource], math: str) -> list[HostKernel]:
    """Any other step's kernels (moves, gathers, constants, images, Philox): one CUDA thread per
    item, each its own loop (`thread_kernel`)."""
    return [thread_kernel(k) for k in kernels]


def host_kernels(step: Step, program: Program, constants: dict[int, Node], kernels: list[KernelSource], math: str) -> list[HostKernel]:
    """STEP's kernels (KERNELS, the CUDA emitter's, in launch order) as host functions of the
    same names and parameters, by the emitter registered for its type."""
    emitter: HostEmitter = emitter_for(step, PLATFORM, thread_kernels)
    return emitter(step, program, constants, kernels, math)
