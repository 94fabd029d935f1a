"""The learning-rate schedules of sexpgpu/optim against torch.optim.lr_scheduler (LambdaLR with
the documented lambda, StepLR), step by step: the rate the update program records for the
group, and the parameter trajectory it produces (a linear regression, f32)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from sexpgpu.compile.pipeline import compile_file, new_world
from sexpgpu.runtime.trainer import Trainer

torch = pytest.importorskip("torch")

STEPS = 30

RUN_FILE = """
(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)
(defloader train
  :source (synthetic :linear :n 256 :dim 4 :seed 3)
  :fields ((x :f32 (4)) (y :f32 (2)))
  :batch 32)
(defpart net (nn:linear 4 2))
(defobjective (batch) (nn:mse (net (field batch x)) (field batch y)))
(defgroups (all "**" OPTIMIZER))
(defrun :steps STEPS :seed 1)
"""


# -- the reference lambdas (factors of the base rate, of the 0-based step) ---------------------
def warmup_linear(warmup: int, total: int) -> Callable[[int], float]:
    """transformers' get_linear_schedule_with_warmup."""

    def factor(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def warmup_cosine(lr: float, warmup: int, total: int, min_lr: float = 0.0) -> Callable[[int], float]:
    """nanoGPT's get_lr, as a factor of LR."""

    def get_lr(step: int) -> float:
        if step < warmup:
            return lr * step / warmup
        if step > total:
            return min_lr
        ratio = (step - warmup) / (total - warmup)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)

    return lambda step: get_lr(step) / lr


def step_decay(every: int, factor: float = 0.1) -> Callable[[int], float]:
    return lambda step: factor ** (step // every)


def sgd(lr: float) -> Callable[[list], object]:
    return lambda ps: torch.optim.SGD(ps, lr=lr)


def adamw(lr: float, weight_decay: float) -> Callable[[list], object]:
    return lambda ps: torch.optim.AdamW(ps, lr=lr, weight_decay=weight_decay)


# name: (optimizer form, torch optimizer, base lr, lambda)
CASES = {
    "constant": ("(optim:sgd :lr (optim:constant 0.05))", sgd(0.05), lambda s: 1.0),
    "warmup-linear": ("(optim:sgd :lr (optim:warmup-linear 0.1 :warmup 5 :total 25))", sgd(0.1), warmup_linear(5, 25)),
    "warmup-linear-no-warmup": ("(optim:sgd :lr (optim:warmup-linear 0.1 :total 20))", sgd(0.1), warmup_linear(0, 20)),
    "warmup-cosine": ("(optim:sgd :lr (optim:warmup-cosine 0.1 :warmup 5 :total 25 :min-lr 0.01))", sgd(0.1), warmup_cosine(0.1, 5, 25, 0.01)),
    "warmup-cosine-to-zero": ("(optim:sgd :lr (optim:warmup-cosine 0.1 :warmup 3 :total 29))", sgd(0.1), warmup_cosine(0.1, 3, 29)),
    "cosine-no-warmup": ("(optim:sgd :lr (optim:warmup-cosine 0.1 :total 20))", sgd(0.1), warmup_cosine(0.1, 0, 20)),
    "step-decay": ("(optim:sgd :lr (optim:step-decay 0.1 :every 7 :factor 0.5))", sgd(0.1), step_decay(7, 0.5)),
    "step-decay-default": ("(optim:sgd :lr (optim:step-decay 0.1 :every 4))", sgd(0.1), step_decay(4)),
    "adamw-warmup-cosine": ("(optim:adamw :lr (optim:warmup-cosine 0.01 :warmup 4 :total 30) :weight-decay 0.1)", adamw(0.01, 0.1), warmup_cosine(0.01, 4, 30)),
}


def compile_run(tmp_path: Path, name: str, form: str, steps: int = STEPS):
    path = tmp_path / f"{name}.lisp"
    path.write_text(RUN_FILE.replace("OPTIMIZER", form).replace("STEPS", str(steps)))
    return compile_file(path)


def trainer(tmp_path: Path, name: str, form: str) -> tuple[Trainer, Trainer]:
    result = compile_run(tmp_path, name, form)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    return Trainer(result.experiment), Trainer(result.experiment)


def check_against(ours: Trainer, replay: Trainer, opt, scheduler) -> None:
    w = opt.param_groups[0]["params"][0]
    b = opt.param_groups[0]["params"][1]
    for step in range(STEPS):
        expected_lr = scheduler.get_last_lr()[0]
        batch = replay.stream.next()
        loss = ((torch.tensor(batch["x"]) @ w + b - torch.tensor(batch["y"])) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        scheduler.step()
        record = ours.train_step()
        assert record.lr["all"] == pytest.approx(expected_lr, rel=1e-5, abs=1e-9), f"step {step}"
        assert abs(record.loss - loss.item()) <= 1e-5 * max(1.0, abs(loss.item())), f"step {step}"
        np.testing.assert_allclose(ours.params["net.w"], w.detach().numpy(), rtol=2e-5, atol=1e-6, err_msg=f"step {step}")
        np.testing.assert_allclose(ours.params["net.b"], b.detach().numpy(), rtol=2e-5, atol=1e-6, err_msg=f"step {step}")


def torch_params(ours: Trainer) -> list:
    w = torch.tensor(ours.params["net.w"].copy(), requires_grad=True)
    b = torch.tensor(ours.params["net.b"].copy(), requires_grad=True)
    return [w, b]


@pytest.mark.parametrize("name", sorted(CASES))
def test_schedule_matches_lambda_lr(name: str, tmp_path: Path) -> None:
    form, make, factor = CASES[name]
    ours, replay = trainer(tmp_path, name, form)
    opt = make(torch_params(ours))
    check_against(ours, replay, opt, torch.optim.lr_scheduler.LambdaLR(opt, factor))


def test_step_decay_matches_step_lr(tmp_path: Path) -> None:
    ours, replay = trainer(tmp_path, "step-lr", "(optim:momentum :lr (optim:step-decay 0.05 :every 6 :factor 0.3) :beta 0.9)")
    opt = torch.optim.SGD(torch_params(ours), lr=0.05, momentum=0.9)
    check_against(ours, replay, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=6, gamma=0.3))


@pytest.mark.parametrize(
    "form, reference",
    [
        ("(optim:warmup-linear 0.1 :warmup 2000 :total 1000000)", lambda s: 0.1 * warmup_linear(2000, 1_000_000)(s)),
        ("(optim:warmup-cosine 0.1 :warmup 2000 :total 1000000 :min-lr 0.001)", lambda s: 0.1 * warmup_cosine(0.1, 2000, 1_000_000, 0.001)(s)),
        ("(optim:warmup-cosine 0.1 :warmup 2000 :total 1000000)", lambda s: 0.1 * warmup_cosine(0.1, 2000, 1_000_000)(s)),
        ("(optim:step-decay 0.1 :every 100000 :factor 0.5)", lambda s: 0.1 * 0.5 ** (s // 100_000)),
        ("(optim:step-decay 0.1 :every 1000 :factor 0.999)", lambda s: 0.1 * 0.999 ** (s // 1000)),
    ],
)
def test_schedules_at_large_steps(form: str, reference: Callable[[int], float], tmp_path: Path) -> None:
    """Far into a long run (the step is an exact f32 integer up to 2^24), near the ends of
    the warmup and of the decay, and at the step-decay boundaries."""
    result = compile_run(tmp_path, "long", f"(optim:sgd :lr {form})", steps=2_000_000)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    ours = Trainer(result.experiment)
    steps = [0, 1, 1999, 2000, 2001, 99_999, 100_000, 100_001, 299_999, 300_000, 500_000, 998_999, 999_000, 999_990, 999_999, 1_000_000, 1_000_001, 1_999_999, 16_000_999]
    for step in steps:
        ours.step = step
        expected = reference(step)
        got = ours.train_step().lr["all"]
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-12), f"step {step}"


def test_schedules_evaluate_on_numbers() -> None:
    """A schedule is a plain function of the step too, so it can be looked at in the REPL."""
    world = new_world()
    world.eval_text('(require "sexpgpu/optim" :as optim)')
    steps = [0, 1, 3, 5, 10, 12]
    cases = {
        "(optim:warmup-linear 1.0 :warmup 3 :total 10)": warmup_linear(3, 10),
        "(optim:warmup-cosine 1.0 :warmup 3 :total 10 :min-lr 0.1)": warmup_cosine(1.0, 3, 10, 0.1),
        "(optim:step-decay 1.0 :every 3 :factor 0.5)": step_decay(3, 0.5),
        "(optim:constant 1.0)": lambda s: 1.0,
    }
    for form, reference in cases.items():
        (result,) = world.eval_text(f"(mapcar {form} '{tuple(steps)})".replace(",", ""))
        assert result.error is None, result.error
        values = [float(v) for v in result.value.strip("()").split()]
        assert values == pytest.approx([reference(s) for s in steps], rel=1e-12), form


@pytest.mark.parametrize(
    "form, message",
    [
        ("(optim:warmup-linear 0.1 :warmup 10 :total 10)", "needs 0 <= :warmup < :total"),
        ("(optim:step-decay 0.1 :every 0)", "step-decay: :every needs a positive number"),
        ("(optim:step-decay 0.1)", "step-decay: :every is required"),
    ],
)
def test_schedule_arguments_are_checked(form: str, message: str, tmp_path: Path) -> None:
    result = compile_run(tmp_path, "bad", f"(optim:sgd :lr {form})")
    assert result.experiment is None
    assert any(message in d.headline() for d in result.diagnostics), [d.headline() for d in result.diagnostics]
