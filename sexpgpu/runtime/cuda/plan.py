"""The CUDA device's memory plan and lowering report for one program.

Arena: every buffer a lowered program materializes (the outputs of fused groups, cuBLAS
calls and op kernels; not the values a fused kernel keeps in registers, not inlined
constants, not views) gets an offset in one arena, allocated first-fit over liveness
intervals (a buffer lives from the step that writes it to the last step that reads it, or to
the end when the program returns it) with 256-byte alignment. Program inputs (parameters,
batches, optimizer state) live in their own buffers. The arena's size is what the device
needs for the program beyond its inputs.

Report: each step with its kernel (or cuBLAS call), the IR nodes it computes with their
source lines, elements, bytes moved and FLOPs — the CUDA half of `sexpgpu explain --cuda`.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel

from ...ir.graph import Node, Program, shape_size
from ...ir.ops import op_def
from .codegen import BYTES, LoweringError, elementwise_kernel, planned_strategy, random_kernel, reduce_kernels, scatter_kernel
from .fusion import FusedGroup, GemmCall, Lowering, RandomStep, ReduceGroup, ScatterStep, ViewStep, lower
from .rows import RowGroup, rows_kernel

ALIGN = 256
LANES = {"thread": "a thread", "warp": "a warp", "block": "a block"}


class Buffer(BaseModel):
    value: int  # IR value id (a view's buffer is its source's)
    bytes: int
    first: int  # step that writes it
    last: int  # last step that reads it
    offset: int = 0


class Arena(BaseModel):
    size: int
    peak_live: int
    buffers: list[Buffer]


class KernelLine(BaseModel):
    step: int
    kind: str  # fused | gemm | op | view
    kernel: str
    nodes: list[str]  # "%id op loc path"
    elements: int
    bytes: int
    flops: int
    launches: int = 1  # a split reduction is two kernels
    how: str = ""  # who computes what: "a warp per row", "a thread per output", ...


class ProgramReport(BaseModel):
    program: str
    kernels: list[KernelLine]
    arena: Arena
    launches: int
    total_bytes: int
    total_flops: int


def node_label(node: Node, origins: Optional[dict[int, str]] = None) -> str:
    """"%id op loc path"; a node a decomposition made also names the op it builds, whose id
    is the one `sexpgpu ir` prints: "%48 max (of %11 log_softmax) ..."."""
    origin = (origins or {}).get(node.id)
    return " ".join(x for x in (f"%{node.id}", node.op, f"(of {origin})" if origin else "", node.loc or "", node.path or "") if x)


def nbytes(program_types: dict[int, Any], vid: int) -> int:
    t = program_types[vid]
    return shape_size(t.shape) * BYTES[t.dtype]


def step_values(step: Any) -> tuple[list[int], list[int]]:
    """(values read, values written) of one step."""
    if isinstance(step, (FusedGroup, RowGroup)):
        return step.inputs, step.outputs
    if isinstance(step, (ReduceGroup, GemmCall)):
        return step.inputs, [step.node.id]
    return list(step.node.args), [step.node.id]


def scratch_value(step: int) -> int:
    """The arena's name for step STEP's scratch buffer (IR values are never negative)."""
    return -(step + 1)


def plan_arena(lowering: Lowering) -> Arena:
    program = lowering.program
    types = program.types()
    inputs = {i.id for i in program.inputs}
    alias: dict[int, int] = {}
    for step in lowering.steps:
        if isinstance(step, ViewStep):
            src = step.node.args[0]
            alias[step.node.id] = alias.get(src, src)
    end = len(lowering.steps)
    returned = {alias.get(v, v) for v in program.outputs.values()}
    buffers: dict[int, Buffer] = {}
    for k, step in enumerate(lowering.steps):
        if isinstance(step, ReduceGroup) and (strategy := planned_strategy(step, types)).split > 1:
            # a split reduction's partial results (f64), alive during its step only
            buffers[scratch_value(k)] = Buffer(value=scratch_value(k), bytes=8 * strategy.split * (shape_size(step.node.type.shape) or 1), first=k, last=k)
        reads, writes = step_values(step)
        if not isinstance(step, ViewStep):
            for v in writes:
                buffers[v] = Buffer(value=v, bytes=nbytes(types, v), first=k, last=k)
        for v in reads:
            root = alias.get(v, v)
            if root in buffers:
                buffers[root].last = max(buffers[root].last, k)
    for v in returned:
        if v in buffers and v not in inputs:
            buffers[v].last = end
    ordered = sorted(buffers.values(), key=lambda b: (b.first, -b.bytes))
    placed: list[Buffer] = []
    size = 0
    for buf in ordered:
        live = sorted((p for p in placed if p.last >= buf.first), key=lambda p: p.offset)
        offset = 0
        need = _aligned(buf.bytes)
        for p in live:
            if offset + need <= p.offset:
                break
            offset = max(offset, p.offset + _aligned(p.bytes))
        buf.offset = offset
        placed.append(buf)
        size = max(size, offset + need)
    peak = max((sum(b.bytes for b in placed if b.first <= k <= b.last) for k in range(end + 1)), default=0)
    return Arena(size=size, peak_live=peak, buffers=sorted(placed, key=lambda b: b.first))


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def kernel_line(k: int, step: Any, lowering: Lowering) -> KernelLine:
    program = lowering.program
    types = program.types()

    def label(node: Node) -> str:
        return node_label(node, lowering.origins)

    if isinstance(step, FusedGroup):
        kernel = elementwise_kernel(step, program, lowering.constants)
        return KernelLine(step=k, kind="fused", kernel=kernel.name, nodes=[label(n) for n in step.nodes],
                          elements=kernel.size, bytes=kernel.bytes, flops=kernel.flops)
    if isinstance(step, RowGroup):
        kernel = rows_kernel(step, program, lowering.constants)
        return KernelLine(step=k, kind="rows", kernel=kernel.name, how=f"{LANES[kernel.lanes]} per row", nodes=[label(n) for n in step.nodes],
                          elements=shape_size(step.space), bytes=kernel.bytes, flops=kernel.flops)
    if isinstance(step, ReduceGroup):
        kernels = reduce_kernels(step, program, lowering.constants)
        nodes = (step.prologue.nodes if step.prologue is not None else []) + [step.node]
        outputs = kernels[-1].size
        if len(kernels) == 1:
            how = f"{LANES[kernels[0].lanes]} per output"
        else:
            how = f"{kernels[0].size // outputs} chunks per output, {LANES[kernels[0].lanes]} per chunk; then {LANES[kernels[1].lanes]} per output"
        return KernelLine(step=k, kind="reduce", kernel=" + ".join(x.name for x in kernels), how=how, nodes=[label(n) for n in nodes], elements=outputs,
                          bytes=sum(x.bytes for x in kernels), flops=sum(x.flops for x in kernels), launches=len(kernels))
    if isinstance(step, RandomStep):
        kernel = random_kernel(step.node, program)
        return KernelLine(step=k, kind="random", kernel=kernel.name + " (Philox4x32-10)", nodes=[label(step.node)], elements=shape_size(step.node.type.shape), bytes=kernel.bytes, flops=kernel.flops)
    if isinstance(step, ScatterStep):
        kernel = scatter_kernel(step.node, program)
        return KernelLine(step=k, kind="scatter", kernel=kernel.name + " (sorted by index)", nodes=[label(step.node)], elements=kernel.size, bytes=kernel.bytes, flops=kernel.flops)
    node = step.node
    reads = sum(nbytes(types, a) for a in node.args)
    if isinstance(step, GemmCall):
        a = types[node.args[0]]
        precision = "bf16 in, f32 accumulate" if a.dtype.value == "bf16" else a.dtype.value
        call = "cublasGemmStridedBatchedEx" if step.batch > 1 else "cublasGemmEx"
        shape = f"{step.batch}x" if step.batch > 1 else ""
        flags = "".join(f", {x}^T" for x, t in (("A", step.trans_a), ("B", step.trans_b)) if t)
        return KernelLine(step=k, kind="gemm", kernel=f"{call} {shape}{step.m}x{step.n}x{step.k} ({precision}{flags})", nodes=[label(node)],
                          elements=shape_size(node.type.shape), bytes=reads + nbytes(types, node.id), flops=2 * step.batch * step.m * step.n * step.k)
    if isinstance(step, ViewStep):
        return KernelLine(step=k, kind="view", kernel="(view: no kernel)", nodes=[label(node)], elements=shape_size(node.type.shape), bytes=0, flops=0)
    flops = op_def(node.op).flops(node, [types[a] for a in node.args])
    name = OP_KERNELS.get(node.op, f"sx_{node.op}")
    return KernelLine(step=k, kind="op", kernel=name, nodes=[label(node)], elements=shape_size(node.type.shape), bytes=reads + nbytes(types, node.id), flops=flops)


# what the device runs for the ops that are kernels of their own
OP_KERNELS = {
    "take": "sx_gather_rows",
    "conv2d": "sx_im2col + cublasGemmEx",
    "conv2d_input_grad": "cublasGemmEx + sx_col2im",
    "conv2d_weight_grad": "sx_im2col + cublasGemmEx",
    "random_normal": "random_normal (the CPU's Philox kernel, copied to the device)",
}


def report(program: Program, lowering: Optional[Lowering] = None) -> ProgramReport:
    lowering = lowering or lower(program)
    lines = [kernel_line(k, step, lowering) for k, step in enumerate(lowering.steps)]
    return ProgramReport(
        program=program.name, kernels=lines, arena=plan_arena(lowering), launches=sum(line.launches for line in lines if line.kind != "view"),
        total_bytes=sum(line.bytes for line in lines), total_flops=sum(line.flops for line in lines),
    )


__all__ = ["report", "plan_arena", "ProgramReport", "Arena", "LoweringError"]
