"""bf16 emulation: f32 master weights, gradients and optimizer state; matmuls and
elementwise work rounded to bfloat16 at the cast points; losses within 1e-2 of f32."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from conftest import REPO
from sexpgpu.compile.pipeline import compile_file
from sexpgpu.runtime.trainer import Trainer


def compiled(path: Path):  # type: ignore[no-untyped-def]
    result = compile_file(path)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    return result.experiment


def bf16_copy(tmp_path: Path, example: str) -> Path:
    text = (REPO / "examples" / example).read_text()
    path = tmp_path / example
    path.write_text(text.replace("(defrun ", "(defrun :precision :bf16 ").replace('"data/', f'"{REPO / "examples" / "data"}/'))
    return path


def test_bf16_char_transformer_tracks_f32(tmp_path: Path) -> None:
    f32 = Trainer(compiled(REPO / "examples" / "char-transformer.lisp"))
    experiment = compiled(bf16_copy(tmp_path, "char-transformer.lisp"))
    bf16 = Trainer(experiment, data_roots=(str(REPO / "examples" / "data"),))  # the copy reads the examples' data
    train = experiment.module.programs["train"]
    dtypes = {n.type.dtype.value for n in train.nodes if n.op == "matmul"}
    assert dtypes == {"bf16"}, dtypes
    assert {i.type.dtype.value for i in train.inputs if i.kind == "param"} == {"f32"}
    assert all(experiment.module.programs["update"].types()[i.id].dtype.value == "f32" for i in experiment.module.programs["update"].inputs)
    for step in range(50):
        a, b = f32.train_step().loss, bf16.train_step().loss
        assert abs(a - b) <= 1e-2 * abs(a), f"step {step}: f32 {a}, bf16 {b}"
    for path, value in bf16.params.items():
        assert value.dtype == np.float32, path


def test_bf16_casts_are_where_the_gpu_rounds(tmp_path: Path) -> None:
    experiment = compiled(bf16_copy(tmp_path, "quickstart.lisp"))
    train = experiment.module.programs["train"]
    casts = [(n.args, n.attrs["dtype"]) for n in train.nodes if n.op == "cast"]
    assert any(d == "bf16" for _, d in casts) and any(d == "f32" for _, d in casts)
    loss = train.types()[train.outputs["loss"]]
    assert loss.dtype.value == "f32" and all(train.types()[v].dtype.value == "f32" for k, v in train.outputs.items() if k.startswith("grad:"))
