"""The CPU benchmarks' workloads and our side of them (bench/cpu_vs_torch.py, bench/cpu_vs_jax.py).

Each workload is a run file; our side is its Trainer on the compiled CPU device (`cpu`) or the
NumPy backend (`numpy`), fed 16 batches taken from its loader before the timing starts (the
peers get the same 16 arrays), so no side's timing includes data loading. Every side starts
from the same initial parameters and takes the same batches in the same order, so their
first losses agree (each bench prints by how much).

Timed as `sexpgpu run` trains: the Trainer is built first (lowering, and the kernels compiled or
taken from the disk cache: `build_s`), then the first steps (a program first run then compiles
too), then the timed steps with every kernel loaded; `compile_s` is the C compiler's own time
in the build and the first steps, 0 when the kernel cache was warm. Each
timing records the wall time and the process's CPU time: on a machine other jobs share, steps
per CPU-second is the speed of the cores while they ran this side. A workload's GFLOP/s is its
training step's FLOPs (the op table's count of the train and update programs, the same maths on
every side) times its steps/s.

The four workloads of issue 25 (`issue=True`, `--issue` in the benches): the 28x28 CNN at batch
64, nanoGPT-char 4x128 with block 64 at batch 12, the wide MLP at batch 256 and one
GPT-2-small-shaped layer (768 wide, context 256).
"""

from __future__ import annotations

import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

BATCHES = 16
WARMUP = 3
CHECKED_STEPS = 3  # the first steps, whose losses every side reports

WIDE = """
(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)

(defloader train
  :source (synthetic :blobs :n 4096 :classes 10 :dim 784 :seed 0)
  :fields ((x :f32 (784)) (y :i32 ()))
  :batch 256
  :shuffle t)

(defpart net (nn:mlp 784 1024 10 :depth 2))

(defobjective (batch)
  (nn:cross-entropy (net (field batch x)) (field batch y)))

(defgroups (all "**" (optim:sgd :lr 0.01)))

(defrun :steps 100000 :seed 0)
"""

NANOGPT = {"width": 128, "heads": 4, "depth": 4, "context": 64, "batch": 12}
# one GPT-2-small transformer block (768 wide, 12 heads of 64) at context 256; batch 2 (23 GFLOP a
# training step) keeps a step under about a second on one core
GPT2_LAYER = {"width": 768, "heads": 12, "depth": 1, "context": 256, "batch": 2}

# the issue's CNN: 28x28 images, a VGG block (3x3 convs 1->32->64 with 'same' padding and
# ReLUs, then a 2x2 max-pool) and a linear head, batch 64: about 5.7 GFLOP per training step
VGG = """
(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)

(defknob lr 0.01)

(defmodel conv-layer (c-in c-out)
  (defparam w (c-out c-in 3 3) :init (kaiming))
  (defparam b (c-out) :init :zeros)
  (forward (x)
    (relu (+ (conv2d x w :padding 1) (reshape b (list 1 c-out 1 1))))))

(defmodel vgg-block ()
  (defpart conv1 (conv-layer 1 32))
  (defpart conv2 (conv-layer 32 64))
  (defpart head (nn:linear (* 64 14 14) 10))
  (forward (images)
    (let ((h (max-pool2d (conv2 (conv1 images)) 2)))
      (head (reshape h (list (first (shape h)) -1))))))

(defloader train
  :source (npz "images.npz")
  :fields ((image :f32 (1 28 28)) (label :i32 ()))
  :batch 64
  :shuffle t)

(defpart net (vgg-block))

(defobjective (batch)
  (nn:cross-entropy (net (field batch image)) (field batch label)))

(defgroups (all "**" (optim:momentum :lr lr :beta 0.9)))

(defrun :steps 100000 :seed 0)
"""


@dataclass(frozen=True)
class Workload:
    name: str
    path: Path
    model: str  # mlp | char_transformer | cnn | vgg (tests/torch_reference.py's models)
    steps: int  # timed steps per sample
    issue: bool = False  # one of issue 25's realistic shapes


def transformer_file(tmp: Path, name: str, shape: dict[str, int]) -> Path:
    """examples/char-transformer.lisp with SHAPE's width, heads, depth, context and batch."""
    text = (REPO / "examples" / "char-transformer.lisp").read_text()
    for knob in ("width", "heads", "depth", "context"):
        text = re.sub(rf"\(defknob {knob} \d+", f"(defknob {knob} {shape[knob]}", text)
    text = text.replace(":batch 16", f":batch {shape['batch']}")
    (tmp / "data").mkdir(exist_ok=True)
    (tmp / "data" / "stdlib-docstrings.txt").write_bytes((REPO / "examples" / "data" / "stdlib-docstrings.txt").read_bytes())
    path = tmp / f"{name}.lisp"
    path.write_text(text)
    return path


def vgg_file(tmp: Path) -> Path:
    """The VGG-block CNN on 1024 random 28x28 images with 10 labels (seeded)."""
    rng = np.random.default_rng(0)
    np.savez(tmp / "images.npz", image=rng.random((1024, 1, 28, 28), dtype=np.float32), label=rng.integers(0, 10, 1024).astype(np.int32))
    path = tmp / "cnn28.lisp"
    path.write_text(VGG)
    return path


def nanogpt_file(tmp: Path) -> Path:
    """nanoGPT's shakespeare-char "CPU config" (4 layers, 4 heads, 128 wide, block 64, batch 12)."""
    return transformer_file(tmp, "nanogpt_char", NANOGPT)


def chosen(workload: Workload, only: str, issue: bool) -> bool:
    """Whether a bench's --only (a part of the name) and --issue (issue 25's four) keep WORKLOAD."""
    return (not only or only in workload.name) and (not issue or workload.issue)


def step_flops(experiment: Any) -> int:
    """The FLOPs of one training step (the train and the update program), by the op table."""
    from sexpgpu.ir.ops import program_flops

    return sum(program_flops(p) for name, p in experiment.module.programs.items() if name in ("train", "update"))


def workloads(tmp: Path, steps: int) -> list[Workload]:
    wide = tmp / "wide_mlp.lisp"
    wide.write_text(WIDE)
    examples = REPO / "examples"
    few = max(10, steps // 10)
    return [
        Workload("quickstart MLP (2-64-3, b64)", examples / "quickstart.lisp", "mlp", steps),
        Workload("wide MLP (784-1024-1024-10, b256)", wide, "mlp", few, issue=True),
        Workload("char transformer (2x64, ctx32, b16)", examples / "char-transformer.lisp", "char_transformer", few),
        Workload("CNN on digits (16/32 ch, 8x8, b64)", examples / "cnn.lisp", "cnn", few),
        Workload("nanoGPT-char CPU (4x128, 4 heads, ctx64, b12)", nanogpt_file(tmp), "char_transformer", few, issue=True),
        Workload("CNN 28x28 (32/64 ch, b64)", vgg_file(tmp), "vgg", max(3, steps // 40), issue=True),
        Workload("GPT-2-small layer (768, ctx256)", transformer_file(tmp, "gpt2_layer", GPT2_LAYER), "char_transformer", max(3, steps // 40), issue=True),
    ]


class Replay:
    """A loader stream that hands out the same BATCHES arrays in turn (taken once, up front)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.batches = [stream.next() for _ in range(BATCHES)]
        self.turn = 0

    def next(self) -> dict[str, np.ndarray]:
        batch = self.batches[self.turn % BATCHES]
        self.turn += 1
        return batch

    def state(self) -> Any:
        return self.stream.state()


def experiment_of(path: Path) -> Any:
    from sexpgpu.compile.pipeline import compile_file

    result = compile_file(path)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    return result.experiment


def backend_for(device: str, cache: Optional[Path] = None) -> Any:
    """DEVICE's backend; the compiled CPU device with its kernel cache under CACHE when given
    (as if $SEXPGPU_CACHE were CACHE)."""
    from sexpgpu.runtime.devices import open_backend

    if cache is None or device != "cpu":
        return open_backend(device)
    import os

    from sexpgpu.runtime.cpu.device import CpuBackend, CpuRuntime
    from sexpgpu.runtime.cpu.toolchain import open_toolchain

    return CpuBackend(CpuRuntime(open_toolchain(dict(os.environ, SEXPGPU_CACHE=str(cache)))))


class OurSide:
    """One of our devices on one workload: a Trainer on replayed batches."""

    def __init__(self, workload: Workload, device: str, cache: Optional[Path] = None) -> None:
        from sexpgpu.runtime.trainer import Trainer

        self.device = device
        self.experiment = experiment_of(workload.path)
        self.flops = step_flops(self.experiment)
        self.backend = backend_for(device, cache)
        began = time.perf_counter()
        self.trainer = Trainer(self.experiment, None, self.backend)
        self.build_s = time.perf_counter() - began  # lowering, and the kernels compiled or loaded from the disk cache
        replay = Replay(self.trainer.stream)
        self.trainer.stream = replay
        self.trainer.streams[None] = replay
        self.batches = replay.batches
        self.first_losses = [self.trainer.train_step().loss for _ in range(CHECKED_STEPS)]
        self.setup_s = time.perf_counter() - began  # the build and the first steps
        runtime = getattr(self.backend, "runtime", None)
        compiled = runtime.toolchain.compiled if runtime is not None else []
        self.compile_s = sum(c.seconds for c in compiled)  # the C compiler's time, build and first steps (0: every kernel from the cache)
        self.cache_warm = all(c.cached for c in compiled)

    def step(self) -> None:
        self.trainer.train_step()

    def threads(self, count: int) -> None:
        set_threads = getattr(self.backend, "set_threads", None)
        if set_threads is not None:
            set_threads(count)

    def initial(self) -> dict[str, np.ndarray]:
        """The initial parameters (the Trainer's, before any step: a fresh one from the same seed)."""
        from sexpgpu.runtime.trainer import Trainer

        return {k: np.asarray(v, dtype=np.float32) for k, v in Trainer(self.experiment).host_params().items()}


@dataclass(frozen=True)
class Rate:
    """Steps per second of wall time, and per second of the process's CPU time (every thread's)."""

    wall: float
    cpu: float


def cold_compile_s(workload: Workload) -> float:
    """The C compiler's time for WORKLOAD's kernels from an empty kernel cache (a scratch one,
    removed after): what the first run of a model on a machine pays before its first step."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="sexpgpu-cold-") as scratch:
        return OurSide(workload, "cpu", Path(scratch)).compile_s


def timed(step: Callable[[], object], steps: int) -> Rate:
    """STEP's rate over STEPS steps (after WARMUP more)."""
    for _ in range(WARMUP):
        step()
    start, used = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    return Rate(steps / (time.perf_counter() - start), steps / max(time.process_time() - used, 1e-9))


def alternate(sides: dict[str, Callable[[int], Rate]], threads: list[int], repeats: int) -> dict[tuple[str, int], Rate]:
    """Each side's median rates at each thread count: REPEATS rounds, each timing every side
    at every thread count in turn (the side order rotating), so the machine's load falls on
    all sides alike."""
    samples: dict[tuple[str, int], list[Rate]] = {}
    names = list(sides)
    for r in range(repeats):
        for count in threads:
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                samples.setdefault((name, count), []).append(sides[name](count))
    return {k: Rate(statistics.median(x.wall for x in v), statistics.median(x.cpu for x in v)) for k, v in samples.items()}


def gflops(flops: int, rate: float) -> float:
    return flops * rate / 1e9


def blas_warning() -> str:
    """A line when this process's environment pins OpenBLAS's kernels (else empty)."""
    import os

    pinned = [v for v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if v in os.environ]
    if not pinned:
        return ""
    return (f"note: {' and '.join(pinned)} set here: OpenBLAS runs the kernels they pin; to benchmark the ones it picks itself run "
            f"`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/{Path(sys.argv[0]).name} ...`")


def limited(count: int) -> Any:
    """The BLAS NumPy links against limited to COUNT threads while the block runs."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=count, user_api="blas")


def peak_rss_mib(module: str, function: str, workload: Workload, *args: str, python: str = sys.executable) -> float:
    """VmHWM of a child process that builds only FUNCTION's side of WORKLOAD and trains it."""
    import os
    import subprocess

    code = (
        f"import sys; sys.path.insert(0, {str(REPO / 'bench')!r}); import {module} as m; from cpu_workloads import Workload; from pathlib import Path;"
        f"m.{function}(Workload({workload.name!r}, Path({str(workload.path)!r}), {workload.model!r}, {workload.steps}), *{args!r});"
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=REPO, env=os.environ.copy())
    if out.returncode != 0:
        print(out.stderr[-2000:], file=sys.stderr)
        return float("nan")
    return int(out.stdout.strip().splitlines()[-1]) / 1024


def train_ours(workload: Workload, device: str) -> None:
    """Our side alone (for its peak memory): set up, then the timed steps."""
    side = OurSide(workload, device)
    timed(side.step, workload.steps)


def loss_gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b))
