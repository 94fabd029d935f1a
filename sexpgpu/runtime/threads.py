"""How many threads the CPU's BLAS gets for a run, chosen by the runtime so that no user sets
a variable to get the speed we quote.

Measured on a 2-core machine (docs/performance.md): with both cores idle, two threads are
faster on every program but a tiny one where the device splits the products itself, and,
where OpenBLAS's threads compute them, faster on the programs of large products (1.3x on the
wide MLP) and slower on a program of many small ones (the char transformer: 0.74x); with the
other core busy, a second thread waits for it, and the char model trained 9x slower than on
one. So the plan looks at the run's work, at who splits its products, and at the cores free now:

- where the compiled CPU device splits large products into pieces on its own threads (the
  `sx_pieces_exact` probe passes: MKL, and OpenBLAS's SkylakeX kernels), a run whose step has under
  2**22 (about 4.2 million) multiply-adds of products gets one thread: too little work per
  kernel to pay for the hand-offs. Measured on the quiet 2-core machine, two threads' steps/s
  over one's: the quickstart (53 thousand) 0.82, the CNN on 8x8 digits (10.8 million) 1.59, the
  char transformer (160 million) 1.51, nanoGPT-char 1.24, the 28x28 CNN 1.30, the GPT-2-small
  layer 1.40, the wide MLP 1.81. No program between the quickstart and the CNN on digits was
  measured; the bound lies between them.
- where it does not (the Haswell kernels, which OPENBLAS_CORETYPE=Haswell selects; the NumPy
  backend), the products run whole on OpenBLAS's threads, and a run whose largest product is
  under 2**24 (about 16.8 million multiply-adds) gets one thread. Measured on the quiet 2-core
  machine before the pieces, steps/s at 1 / 2 threads: the char transformer (largest product
  8.4 million) 68.9 / 51.3, the CNN on 8x8 digits (9.4 million) 189 / 200, nanoGPT-char (50
  million) 9.3 / 10.1, the wide MLP (268 million) 33.0 / 42.6. The bound lies between the
  loser and the first clear gain; a run under it gives up at most the CNN's 5% against two
  threads, and is never slower than one thread.
- otherwise it gets as many threads as there are cores free for it: the cores of this
  process's affinity, less those other processes keep busy (sampled over 0.1 s from
  /proc/stat, this process idle meanwhile).

`--threads N`, `$SEXPGPU_THREADS`, and a BLAS variable the user set (`OPENBLAS_NUM_THREADS`,
`OMP_NUM_THREADS`, `MKL_NUM_THREADS`) win over the plan, in that order. The plan is
recorded in run.json and `doctor` prints it.

The count can change numbers: OpenBLAS splits a product between its threads, and with some
of its kernels the split changes the last bits of its results (the Haswell ones, which
OPENBLAS_CORETYPE=Haswell selects: every product of the char model, at 1 against 2
threads). So the count is part of what a run computes: an attempt that continues a run
takes the count run.json recorded, whatever the load now, and a resumed run ends with the
bits of one never stopped. The compiled CPU device's own kernels split their items, which
changes no bit; with two threads or more it also splits a large product itself, in pieces
of C that depend on the product's shape alone, each one BLAS call on one thread, where the
BLAS gives a piece the whole product's bits (probed once: OpenBLAS's SkylakeX kernels do,
its Haswell ones do not, and then the products stay whole to OpenBLAS's threads). There the
count changes no bit at all.

Why the pool and not OpenBLAS's threads: OpenBLAS's threads wait for each other by
spinning, so a thread the OS has not scheduled costs the others its whole wait, and their
spinning takes the cores our pool's threads want next. Measured on the 2-core machine at load 8-13 (nanoGPT-char, CPU ms per step, each
thread's from /proc): one thread 50; two threads with OpenBLAS's 726 (the main thread 362,
OpenBLAS's worker 343, the pool's worker 24) and 3.6-4.0 s per step; with the pool's pieces
76-84 (main 48-50, the pool's worker 29-36) and 0.27-0.35 s per step, as fast as one thread
on a machine whose other core is busy.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Mapping, Optional

from pydantic import BaseModel

from ..ir.graph import Program, shape_size

THREADS_VARIABLE = "SEXPGPU_THREADS"
BLAS_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
TINY_PRODUCT = 1_000_000  # multiply-adds: below this, a product gains nothing from threads
SMALL_PRODUCT = 2**24  # multiply-adds: without the pieces, a run whose largest product is below this trains no faster on two threads than on one
STEP_PRODUCTS = 2**22  # multiply-adds of a step's products: with the pieces, a run below this trains no faster on two threads than on one
SAMPLE_S = 0.1
RECORDED_SOURCE = "run.json"  # the source of a continued run's plan: its earlier attempts'

class ThreadPlan(BaseModel):
    """What run.json records of the run's threads."""

    blas: int
    cores: int  # this process's cores (its affinity)
    source: str  # "flag", the variable that set it, or "chosen"
    reason: str
    library: str = ""  # the BLAS the run's products were computed by, where the device names it (the compiled CPU device); "" in older runs


class StepFeatures(BaseModel):
    """What the plan looks at in a run's programs: the multiply-adds of their matrix products
    and convolutions (those of the program that has most: a training step's) and the largest
    product."""

    product_macs: int
    largest_product: int


def product_sizes(program: Program) -> list[int]:
    """The multiply-adds of each matrix product and convolution of PROGRAM."""
    types = program.types()
    sizes = []
    for node in program.nodes:
        if node.op == "matmul":
            sizes.append(shape_size(node.type.shape) * types[node.args[0]].shape[-1])
        elif node.op.startswith("conv2d"):
            weight = types[node.args[1]].shape
            sizes.append(shape_size(node.type.shape) * shape_size(weight[1:]))
    return sizes


def step_features(programs: Iterable[Program]) -> StepFeatures:
    per_program = [product_sizes(program) for program in programs]
    busiest = max(per_program, key=sum, default=[])
    return StepFeatures(product_macs=sum(busiest), largest_product=max((max(s, default=0) for s in per_program), default=0))


def largest_product(programs: Iterable[Program]) -> int:
    """The multiply-adds of the largest matrix product (or convolution) of PROGRAMS."""
    return step_features(programs).largest_product


def process_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def busy_cores(sample_s: float = SAMPLE_S) -> Optional[float]:
    """How many cores other processes keep busy now, from two reads of /proc/stat SAMPLE_S
    apart (None where there is no /proc/stat)."""

    def totals() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle

    try:
        total0, idle0 = totals()
        time.sleep(sample_s)
        total1, idle1 = totals()
    except (OSError, ValueError, IndexError):
        return None
    elapsed = total1 - total0
    if elapsed <= 0:
        return None
    return (os.cpu_count() or 1) * (1.0 - (idle1 - idle0) / elapsed)


def free_cores(cores: int) -> tuple[int, Optional[float]]:
    """Of CORES, how many other processes leave free now (at least one), and how many they
    keep busy (None: not known here; then every core counts as free)."""
    busy = busy_cores()
    if busy is None:
        return cores, None
    return max(1, min(cores, int(cores - busy + 0.25))), busy


def plan_threads(programs: Iterable[Program], requested: Optional[int] = None, environ: Optional[Mapping[str, str]] = None,
                 assume_large: bool = False, share: Optional[int] = None, recorded: Optional[ThreadPlan] = None,
                 pieces: bool = False) -> ThreadPlan:
    """The BLAS threads for a run of PROGRAMS (REQUESTED: --threads; ASSUME_LARGE: as for a
    run whose products are large, when there is no run to look at; SHARE: the most cores the
    run may take, its part of a sweep that runs points side by side; RECORDED: the plan of
    the run's earlier attempts, which an attempt continuing it keeps)."""
    environ = os.environ if environ is None else environ
    cores = process_cores() if share is None else max(1, min(share, process_cores()))
    explicit = user_threads(requested, environ, cores)
    if explicit is not None:
        return explicit
    if recorded is not None:
        return ThreadPlan(blas=recorded.blas, cores=cores, source=RECORDED_SOURCE,
                          reason=f"the run's earlier attempts had {recorded.blas}: a product's last bits depend on the count")
    one = "one core" if share is None else "one core: this point's share of the sweep's cores"
    why = one if cores == 1 else (None if assume_large else one_thread_reason(step_features(programs), pieces))
    if why is not None:
        return ThreadPlan(blas=1, cores=cores, source="chosen", reason=why)
    if share is not None:  # the sweep counted the free cores once for all its points: the others' load is not "other work"
        return ThreadPlan(blas=cores, cores=cores, source="chosen", reason=f"this point's share of the sweep's free cores: {cores}")
    free, busy = free_cores(cores)
    if busy is None:
        return ThreadPlan(blas=cores, cores=cores, source="chosen", reason="every core (how busy they are is not known here)")
    return ThreadPlan(blas=free, cores=cores, source="chosen", reason=f"{busy:.1f} of {cores} cores busy with other work")


def one_thread_reason(features: StepFeatures, pieces: bool) -> Optional[str]:
    """Why a run of FEATURES trains fastest on one thread even with a second core idle, or
    None (then it gets the free cores). PIECES: the device splits large products into pieces
    on its pool's threads (with OpenBLAS's threads doing the products, a second thread loses
    on programs of small products; with the pieces it gains on every program but the tiny
    ones)."""
    if pieces:
        if features.product_macs < STEP_PRODUCTS:
            return (f"the step's products are {features.product_macs:,} multiply-adds, under {STEP_PRODUCTS:,}: "
                    "too little work to share between threads")
        return None
    largest = features.largest_product
    if largest < TINY_PRODUCT:
        return f"the largest product is {largest:,} multiply-adds: threads cannot help it"
    if largest < SMALL_PRODUCT:
        return (f"the largest product is {largest:,} multiply-adds, under {SMALL_PRODUCT:,}: "
                "a program of products this size trains faster on one thread when the BLAS's threads compute them")
    return None


def pieces_in_use(backend: Any) -> bool:
    """Whether BACKEND, given two threads or more, splits large products into pieces on its
    own threads (the compiled CPU device, where the BLAS gives a piece the whole product's bits)."""
    probe = getattr(backend, "pieces_available", None)
    return bool(probe()) if probe is not None else False


def user_threads(requested: Optional[int], environ: Mapping[str, str], cores: int) -> Optional[ThreadPlan]:
    """The plan the user asked for (--threads, then the variables), or None."""
    if requested is not None:
        return ThreadPlan(blas=requested, cores=cores, source="flag", reason=f"--threads {requested}")
    for variable in (THREADS_VARIABLE, *BLAS_VARIABLES):
        text = environ.get(variable, "").strip()
        if text:
            if not text.isdigit() or int(text) < 1:
                raise ValueError(f"${variable}={text!r}: use a whole number of threads, 1 or more")
            return ThreadPlan(blas=int(text), cores=cores, source=variable, reason=f"${variable}={text}")
    return None


def products_library(backend: Any) -> str:
    """The BLAS BACKEND computes products with, where it names one (the compiled CPU device), or ""."""
    name = getattr(backend, "blas_name", None)
    return str(name()) if name is not None else ""


def departs_from(plan: ThreadPlan, recorded: Optional[ThreadPlan]) -> Optional[str]:
    """What to tell the user when PLAN gives a continued run another BLAS than its earlier
    attempts had (RECORDED), or (theirs) another count, or None."""
    if recorded is None:
        return None
    if plan.library and recorded.library and plan.library != recorded.library:
        return (f"this run's earlier attempts computed their products with {recorded.library}, this one with {plan.library}: "
                f"its numbers will differ in the last bits from a run never stopped ($SEXPGPU_BLAS chooses the BLAS: see docs/devices.md)")
    if plan.blas == recorded.blas:
        return None
    return (f"{plan.reason} gives this run {plan.blas} BLAS thread(s) where its earlier attempts had {recorded.blas}: "
            f"its numbers will differ in the last bits from a run never stopped (leave the threads unset to keep {recorded.blas})")


@contextmanager
def blas_threads(plan: ThreadPlan, backend: Any = None) -> Iterator[None]:
    """The BLAS limited to PLAN's threads while the block runs (threadpoolctl), and the
    compiled CPU device's kernels given the same number (BACKEND's `set_threads`): the
    kernels and the BLAS take turns, never running at once, so the cores are not
    oversubscribed (where the device splits its products itself, the BLAS runs on one
    thread during its tapes)."""
    from threadpoolctl import threadpool_limits

    set_threads = getattr(backend, "set_threads", None)
    if set_threads is not None:
        set_threads(plan.blas)
    with threadpool_limits(limits=plan.blas, user_api="blas"):
        yield


def blas_library() -> str:
    """The BLAS NumPy calls, as threadpoolctl finds it (`doctor` prints it)."""
    from threadpoolctl import threadpool_info

    found = [f"{i.get('internal_api')} {i.get('version') or ''}".strip() for i in threadpool_info() if i.get("user_api") == "blas"]
    return ", ".join(found) or "none found"
