"""Training throughput on one GPU: SexpGPU's CUDA device against PyTorch eager and
torch.compile, the same model, the same batches, bf16 compute with f32 master weights.

Two configurations of examples/char-transformer.lisp: the example itself (2 layers of 64,
context 32, batch 16) and a GPT-2-small-sized one (12 layers of 768, 12 heads, context 1024,
batch 8; the vocabulary stays the example's 96 characters). Prints tokens/s, MFU (6 x params
x tokens/s over the GPU's dense bf16 peak, --peak-tflops) and ours / torch for each.

    python bench/gpu_vs_torch.py [--steps 20] [--peak-tflops 989]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

CONFIGS: dict[str, dict[str, int]] = {
    "char-transformer 2x64 ctx32 b16": {"width": 64, "heads": 4, "depth": 2, "context": 32, "batch": 16},
    "gpt2-small-sized 12x768 ctx1024 b8": {"width": 768, "heads": 12, "depth": 12, "context": 1024, "batch": 8},
}


def run_file(tmp: Path, config: dict[str, int]) -> Path:
    text = (REPO / "examples" / "char-transformer.lisp").read_text()
    for knob in ("width", "heads", "depth", "context"):
        text = re.sub(rf"\(defknob {knob} \d+", f"(defknob {knob} {config[knob]}", text)
    text = text.replace(":batch 16", f":batch {config['batch']}")
    text = text.replace("(defrun :steps 300 :seed 0 :log-every 25)", "(defrun :steps 100000 :seed 0 :log-every 1000 :precision :bf16)")
    (tmp / "data").mkdir(exist_ok=True)
    (tmp / "data" / "stdlib-docstrings.txt").write_bytes((REPO / "examples" / "data" / "stdlib-docstrings.txt").read_bytes())
    (tmp / ".git").mkdir(exist_ok=True)
    path = tmp / "bench.lisp"
    path.write_text(text)
    return path


def ours(path: Path, steps: int) -> tuple[float, Any]:
    """Seconds per step of the CUDA device (after 3 warm-up steps) and the experiment."""
    from sexpgpu.compile.pipeline import compile_file
    from sexpgpu.runtime.devices import open_backend
    from sexpgpu.runtime.trainer import Trainer

    experiment = compile_file(path).experiment
    assert experiment is not None
    began = time.perf_counter()
    trainer = Trainer(experiment, None, open_backend("cuda"))
    for _ in range(3):
        trainer.train_step()
    # lowering, NVRTC compiles (one module per program) and the first steps
    print(f"ours: lowering, compiling and 3 warm-up steps took {time.perf_counter() - began:.1f} s", file=sys.stderr)
    start = time.perf_counter()
    for _ in range(steps):
        trainer.train_step()  # returns host values: the step is complete on the device
    return (time.perf_counter() - start) / steps, experiment


def torch_side(path: Path, steps: int, compiled: bool) -> float:
    import torch

    import torch_reference as ref
    from sexpgpu.compile.pipeline import compile_file
    from sexpgpu.runtime.trainer import Trainer

    experiment = compile_file(path).experiment
    assert experiment is not None
    trainer = Trainer(experiment)  # the same initial parameters and batches
    torch.set_default_device("cuda")
    try:
        return timed_torch_steps(torch, ref, trainer, experiment, steps, compiled)
    finally:
        torch.set_default_device("cpu")  # a failed side must not leave the next one on "cuda"


def timed_torch_steps(torch: Any, ref: Any, trainer: Any, experiment: Any, steps: int, compiled: bool) -> float:
    import numpy as np

    P = {k: torch.tensor(v.copy(), requires_grad=True, device="cuda") for k, v in trainer.host_params().items()}
    forward: Callable[..., Any] = ref.char_transformer(P, experiment.knob_values())
    if compiled:
        forward = torch.compile(forward)
    opt = torch.optim.AdamW(list(P.values()), lr=float(experiment.knob_values()["lr"]), weight_decay=0.0, fused=True)
    batches = []
    for _ in range(8):
        b = trainer.stream.next()
        batches.append((torch.tensor(b["tokens"].astype(np.int64), device="cuda"), torch.tensor(b["targets"].astype(np.int64), device="cuda")))

    def step(i: int) -> None:
        x, y = batches[i % len(batches)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = ref.sequence_loss(forward(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()

    for i in range(3):
        step(i)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H100/H200 SXM: 989)")
    parser.add_argument("--only", default=None, help="run only the configurations whose name contains this")
    args = parser.parse_args()
    # each row as soon as its side is measured (flushed): a run cut off by its timeout still
    # shows what it reached
    print(f"{'config':<38} {'side':<14} {'step ms':>9} {'tokens/s':>12} {'MFU':>7} {'ours/side':>10}", flush=True)
    for name, config in CONFIGS.items():
        if args.only and args.only not in name:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            path = run_file(Path(tmp), config)
            tokens = config["batch"] * config["context"]
            params = 0
            mine = float("nan")
            for side in ("ours", "torch eager", "torch.compile"):
                try:
                    if side == "ours":
                        seconds, experiment = ours(path, args.steps)
                        params = sum(int(__import__("numpy").prod(p.shape)) for p in experiment.params)
                        mine = seconds
                    else:
                        seconds = torch_side(path, args.steps, compiled=side == "torch.compile")
                except Exception:  # one side failing must not hide the others
                    print(f"{name} / {side} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
                    continue
                print(row(name, side, seconds, tokens, params, mine, args.peak_tflops), flush=True)


def row(name: str, side: str, seconds: float, tokens: int, params: int, ours_seconds: float, peak_tflops: float) -> str:
    """One side's line: step time, tokens/s, MFU and its time over ours."""
    rate = tokens / seconds
    mfu = 6 * params * rate / (peak_tflops * 1e12) if params else float("nan")
    return f"{name:<38} {side:<14} {seconds * 1000:>9.2f} {rate:>12,.0f} {mfu:>7.2%} {seconds / ours_seconds:>10.2f}"


if __name__ == "__main__":
    main()
