"""`sexpgpu plot`: PNG and SVG files that are real images with a line per run (the SVG
parsed), several runs and a whole sweep overlaid, eval metrics, the terminal through
plotext, the usage errors, and the clear error without the plot extra."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import REPO
from results_store import SWEEP_POINTS, MadeStore, counts, make_store
from sexpgpu.cli.main import main
from sexpgpu.runtime.store import Store

pytest.importorskip("matplotlib")
pytest.importorskip("plotext")

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> MadeStore:
    return make_store(tmp_path_factory.mktemp("plot") / "runs")


def plot(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plot", *args])
    return code, out.getvalue(), err.getvalue()


def svg_lines(path: Path) -> dict[str, list[ET.Element]]:
    """Each drawn line's group by its id (series-PANEL-LINE), from the parsed SVG."""
    tree = ET.parse(path)
    return {g.get("id", ""): g.findall(f".//{SVG}path") for g in tree.iter(f"{SVG}g") if g.get("id", "").startswith("series-")}


def vertices(group: list[ET.Element]) -> int:
    """How many points a line's path has: one M or L command per point."""
    data = group[0].get("d", "")
    return sum(1 for token in data.split() if token in ("M", "L"))


def test_an_svg_of_a_sweep_has_a_line_per_point_with_every_step(made: MadeStore, tmp_path: Path) -> None:
    out = tmp_path / "grid.svg"
    code, text, err = plot("--sweep", "grid", "--store", str(made.root), "-o", str(out))
    assert code == 0, err
    assert text == f"wrote {out} (loss: {SWEEP_POINTS} series)\n"
    lines = svg_lines(out)
    assert sorted(lines) == [f"series-0-{i}" for i in range(SWEEP_POINTS)]
    store = Store.open(str(made.root))
    for i, slug in enumerate(made.points):
        assert vertices(lines[f"series-0-{i}"]) == counts(store, slug)["loss"]
    legend = [t.text for t in ET.parse(out).iter(f"{SVG}text") if t.text]
    assert "grid-0 lr=0.05 width=8" in legend and "grid-3 lr=0.2 width=16" in legend
    assert out.read_text().startswith("<?xml")
    again = tmp_path / "again.svg"
    assert plot("--sweep", "grid", "--store", str(made.root), "-o", str(again))[0] == 0
    assert again.read_bytes() == out.read_bytes()  # no date, fixed ids: the same curves, the same file


def test_a_png_of_several_runs_and_two_metrics(made: MadeStore, tmp_path: Path) -> None:
    from PIL import Image

    out = tmp_path / "two.png"
    runs = [str(made.root / s) for s in made.slugs[:2]]
    code, text, err = plot(*runs, "--metric", "loss", "--metric", "val/acc", "-o", str(out), "--title", "two runs")
    assert code == 0, err
    assert text == f"wrote {out} (loss, val/acc: 4 series)\n"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(out) as image:
        image.verify()
    with Image.open(out) as image:
        width, height = image.size
        assert image.format == "PNG" and (width, height) == (8 * 130, round((3.4 * 2 + 0.4) * 130))  # 8 in wide, two panels, 130 dpi
        colours = image.convert("RGB").getcolors(1 << 20)
        assert colours is not None and len(colours) > 20  # lines, text and a background, not a blank


def test_eval_series_slugs_in_a_store_and_a_log_scale(made: MadeStore, tmp_path: Path) -> None:
    out = tmp_path / "val.svg"
    code, _, err = plot(made.slugs[0], made.points[1], "--store", str(made.root), "--metric", "val/loss", "--log-y", "-o", str(out))
    assert code == 0, err
    lines = svg_lines(out)
    store = Store.open(str(made.root))
    assert [vertices(lines[f"series-0-{i}"]) for i in range(2)] == [counts(store, s)["val/loss"] for s in (made.slugs[0], made.points[1])]
    assert "val/loss" in out.read_text()


def test_the_terminal(made: MadeStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "90")
    monkeypatch.setenv("LINES", "30")
    code, text, err = plot("--sweep", "grid", "--store", str(made.root), "--terminal")
    assert code == 0, err
    lines = text.splitlines()
    assert "\x1b[" not in text  # not a terminal here: no colours
    assert lines[0].strip() == "loss"
    assert max(len(line) for line in lines) <= 90 and len(lines) >= 20
    for label in ("grid-0 lr=0.05 width=8", "grid-1 lr=0.05 width=16", "grid-2 lr=0.2 width=8", "grid-3 lr=0.2 width=16"):
        assert label in text
    assert any(line.strip() == "step" for line in lines)
    for marker in "x+o*":  # no colours: each line has a letter of its own
        assert text.count(marker) > 10, text


@pytest.mark.parametrize("args,message", [
    ((), "name the runs to plot (RUN...), or --sweep NAME"),
    (("RUN",), "choose one: -o FILE.png|FILE.svg, or --terminal"),
    (("RUN", "-o", "x.png", "--terminal"), "choose one: -o FILE.png|FILE.svg, or --terminal"),
    (("RUN", "-o", "x.jpg"), "-o x.jpg: the file name says the format: .png or .svg"),
    (("RUN", "-o", "nope/x.png"), "the folder nope does not exist"),
    (("RUN", "--metric", "val/nope", "--terminal"), "--metric val/nope: no run here logs it; the series are: acc, examples_per_s, grad_norm, loss, lr:all,"),
    (("tiny.base.00000000", "--terminal"), "no run at "),
])
def test_usage_errors(made: MadeStore, args: tuple[str, ...], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = tuple(str(made.root / made.slugs[0]) if a == "RUN" else a for a in args)
    code, _, err = plot(*args, *(("--store", str(made.root)) if args and args[0].startswith("tiny.base.0") else ()))
    assert code == 2 and message in err, err


def test_without_the_extra_the_error_names_it_and_exits_4(made: MadeStore, tmp_path: Path) -> None:
    """matplotlib (or plotext) that does not import, as on a machine without the extra."""
    for module, args in (("matplotlib", ["-o", str(tmp_path / "x.png")]), ("plotext", ["--terminal"])):
        program = (f"import sys; sys.modules[{module!r}] = None\n"
                   "from sexpgpu.cli.main import main\n"
                   f"sys.exit(main(['plot', {str(made.root / made.slugs[0])!r}, *{args!r}]))\n")
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        assert done.returncode == 4, done.stderr
        assert "the plot extra: pip install 'sexpgpu[plot]'" in done.stderr
        assert not (tmp_path / "x.png").exists()
