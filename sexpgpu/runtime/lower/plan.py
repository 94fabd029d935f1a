"""The CUDA device's memory plan and lowering report for one program.

Arena: every buffer a lowered program materializes (what each step writes, and a step's
scratch (a split reduction's partial results, a convolution's im2col matrix) while it runs;
not the values a fused kernel keeps in registers, not inlined constants, not views) gets an
offset in one arena, allocated first-fit over liveness intervals (a buffer lives from the
step that writes it to the last step that reads it, or to the end when the program returns
it; a constant made once lives for the whole program) with 256-byte alignment. Program inputs (parameters,
batches, optimizer state) live in their own buffers. The arena's size is what the device
needs for the program beyond its inputs.

Report: each step's line (its `describe`): its kernel (or cuBLAS call), the IR nodes it
computes with their source lines, elements, bytes moved and FLOPs — the CUDA half of
`sexpgpu explain --cuda`.
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel

from ...ir.graph import Program
from .codegen import storage_bytes
from .fusion import Lowering, lower
from .lowering import KernelLine

ALIGN = 256


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


class ProgramReport(BaseModel):
    program: str
    kernels: list[KernelLine]
    arena: Arena
    launches: int
    total_bytes: int
    total_flops: int


def scratch_value(step: int) -> int:
    """The arena's name for step STEP's scratch buffer (IR values are never negative)."""
    return -(step + 1)


def plan_arena(lowering: Lowering) -> Arena:
    program = lowering.program
    types = program.types()
    inputs = {i.id for i in program.inputs}
    alias: dict[int, int] = {}
    for step in lowering.steps:
        for value, source in step.aliases.items():
            alias[value] = alias.get(source, source)
    end = len(lowering.steps)
    returned = {alias.get(v, v) for v in program.outputs.values()}
    buffers: dict[int, Buffer] = {}
    for k, step in enumerate(lowering.steps):
        scratch = step.scratch_bytes(types)
        if scratch:  # alive during its step only
            buffers[scratch_value(k)] = Buffer(value=scratch_value(k), bytes=scratch, first=k, last=k)
        for v in step.writes:
            if v not in alias:
                buffers[v] = Buffer(value=v, bytes=storage_bytes(types[v]), first=k, last=k)
        for v in step.reads:
            root = alias.get(v, v)
            if root in buffers:
                buffers[root].last = max(buffers[root].last, k)
    for v in returned:
        if v in buffers and v not in inputs:
            buffers[v].last = end
    for step in lowering.steps:
        if step.once:  # a constant made when the program first runs keeps its buffer
            for v in step.writes:
                buffers[v].first, buffers[v].last = 0, end
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


def report(program: Program, lowering: Optional[Lowering] = None) -> ProgramReport:
    lowering = lowering or lower(program)
    lines = [step.describe(k, lowering) for k, step in enumerate(lowering.steps)]
    return ProgramReport(
        program=program.name, kernels=lines, arena=plan_arena(lowering), launches=sum(line.launches for line in lines),
        total_bytes=sum(line.bytes for line in lines), total_flops=sum(line.flops for line in lines),
    )
