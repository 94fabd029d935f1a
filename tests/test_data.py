"""The data layer: sources, prepare steps, the cache, data errors, training and eval batches."""

from __future__ import annotations

import json
import pickle
import uuid
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest

from sexpgpu.runtime.data.cache import default_cache_dir
from sexpgpu.runtime.data.load import load_dataset
from sexpgpu.runtime.data.spec import MASK_FIELD, DataError, Dataset, FieldSpec, LoaderSpec, PrepareStep, SourceSpec, shared_examples
from sexpgpu.runtime.data.stream import BatchStream, EvalBatches, LoaderState

XY = [("x", "f32", (2,)), ("y", "i32", ())]
LM = [("tokens", "i32", (4,)), ("targets", "i32", (4,))]


def make_spec(
    kind: str,
    url: Optional[str],
    fields: list[tuple[str, str, tuple[int, ...]]],
    *,
    base: Path | str = ".",
    prepare: Optional[list[tuple[str, dict[str, Any]]]] = None,
    options: Optional[dict[str, Any]] = None,
    batch: int = 2,
    name: str = "train",
    part: Optional[str] = None,
) -> LoaderSpec:
    return LoaderSpec(
        name=name,
        source=SourceSpec(kind=kind, url=url, options=options or {}),
        prepare=[PrepareStep(kind=k, options=o) for k, o in (prepare or [])],
        fields=[FieldSpec(name=n, dtype=d, shape=s) for n, d, s in fields],
        batch=batch,
        part=part,
        base_dir=str(base),
    )


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def load(spec: LoaderSpec, cache: Path) -> Dataset:
    return load_dataset(spec, cache)


def data_error(spec: LoaderSpec, cache: Path) -> str:
    with pytest.raises(DataError) as info:
        load_dataset(spec, cache)
    return str(info.value)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def xy_arrays(n: int = 6) -> tuple[np.ndarray, np.ndarray]:
    x = np.arange(2 * n, dtype=np.float64).reshape(n, 2) / 10
    return x, np.arange(n) % 3


def memory_url(name: str) -> str:
    pytest.importorskip("fsspec")
    return f"memory://sexpgpu-test-{uuid.uuid4().hex}/{name}"


def put_memory(url: str, data: bytes) -> None:
    import fsspec

    with fsspec.open(url, "wb") as handle:
        handle.write(data)


# ---------------------------------------------------------------- sources


def test_npz_fields_by_name(tmp_path: Path, cache: Path) -> None:
    x, y = xy_arrays()
    np.savez(tmp_path / "d.npz", x=x, y=y, extra=np.zeros(3))
    ds = load(make_spec("npz", "d.npz", XY, base=tmp_path), cache)
    assert ds.n == 6
    assert ds.fields["x"].dtype == np.float32 and ds.fields["x"].shape == (6, 2)
    assert ds.fields["y"].dtype == np.int32 and ds.fields["y"].shape == (6,)
    np.testing.assert_allclose(ds.fields["x"], x.astype(np.float32))
    np.testing.assert_array_equal(ds.fields["y"], y)
    assert len(ds.content_hash) == 64 and ds.vocab is None


def test_npz_map_and_memory_url(cache: Path) -> None:
    import io

    x, y = xy_arrays()
    buffer = io.BytesIO()
    np.savez(buffer, inputs=x, labels=y)
    url = memory_url("d.npz")
    put_memory(url, buffer.getvalue())
    ds = load(make_spec("npz", url, XY, options={"map": {"x": "inputs", "y": "labels"}}), cache)
    np.testing.assert_array_equal(ds.fields["y"], y)
    assert ds.meta["source"] == url


def test_npy_one_field(tmp_path: Path, cache: Path) -> None:
    np.save(tmp_path / "x.npy", np.ones((5, 3), dtype=np.float64))
    ds = load(make_spec("npy", "x.npy", [("x", "f16", (3,))], base=tmp_path), cache)
    assert ds.fields["x"].dtype == np.float16 and ds.n == 5


def test_npy_field_option_and_errors(tmp_path: Path, cache: Path) -> None:
    np.save(tmp_path / "y.npy", np.arange(4))
    assert load(make_spec("npy", "y.npy", [("y", "i32", ())], base=tmp_path, options={"field": "y"}), cache).n == 4
    assert data_error(make_spec("npy", "y.npy", XY, base=tmp_path, options={"field": "y"}), cache).endswith(
        "y.npy: an npy source fills one field ('y'); no data for 'x'"
    )
    np.save(tmp_path / "f.npy", np.zeros(8))
    spec = make_spec("npy", "f.npy", [("w", "i32", (4,))], base=tmp_path, prepare=[("windows", {"length": 4})])
    assert data_error(spec, cache).endswith("f.npy: a token stream must be a 1-D integer array; this one is float64 of shape (8)")


def test_npy_token_stream_with_windows(tmp_path: Path, cache: Path) -> None:
    np.save(tmp_path / "ids.npy", np.arange(20, dtype=np.int64))
    spec = make_spec("npy", "ids.npy", LM, base=tmp_path, prepare=[("windows", {"length": 5})])
    ds = load(spec, cache)
    assert ds.n == 4
    np.testing.assert_array_equal(ds.fields["tokens"][1], [5, 6, 7, 8])
    np.testing.assert_array_equal(ds.fields["targets"][1], [6, 7, 8, 9])


def test_csv_scalar_and_vector_columns(tmp_path: Path, cache: Path) -> None:
    write(tmp_path / "d.csv", "y,x_0,x_1,flag\n1,0.5,1.5,true\n\n2,2.5,3.5,0\n0, 4 ,5,1\n")
    fields = [("x", "f32", (2,)), ("y", "i64", ()), ("flag", "bool", ())]
    ds = load(make_spec("csv", "d.csv", fields, base=tmp_path), cache)
    np.testing.assert_array_equal(ds.fields["x"], [[0.5, 1.5], [2.5, 3.5], [4, 5]])
    np.testing.assert_array_equal(ds.fields["y"], [1, 2, 0])
    np.testing.assert_array_equal(ds.fields["flag"], [True, False, True])
    assert ds.fields["y"].dtype == np.int64


def test_csv_columns_option_and_matrix_field(tmp_path: Path, cache: Path) -> None:
    write(tmp_path / "d.csv", "a;b;c;d;label\n1;2;3;4;1\n5;6;7;8;0\n")
    options = {"columns": {"m": ["a", "b", "c", "d"], "y": "label"}, "delimiter": ";"}
    spec = make_spec("csv", "d.csv", [("m", "f32", (2, 2)), ("y", "i32", ())], base=tmp_path, options=options)
    ds = load(spec, cache)
    np.testing.assert_array_equal(ds.fields["m"][1], [[5, 6], [7, 8]])
    np.testing.assert_array_equal(ds.fields["y"], [1, 0])


def test_csv_float_field_accepts_integers_and_int_field_integral_floats(tmp_path: Path, cache: Path) -> None:
    write(tmp_path / "d.csv", "x_0,x_1,y\n1,2,1.0\n3,4,2\n")
    ds = load(make_spec("csv", "d.csv", XY, base=tmp_path), cache)
    np.testing.assert_array_equal(ds.fields["y"], [1, 2])


def test_jsonl_nested_lists(tmp_path: Path, cache: Path) -> None:
    lines = [{"x": [[1, 2], [3, 4]], "y": 1}, {"x": [[5.5, 6], [7, 8]], "y": 0, "note": "ignored"}]
    write(tmp_path / "d.jsonl", "\n".join(json.dumps(line) for line in lines) + "\n\n")
    ds = load(make_spec("jsonl", "d.jsonl", [("x", "f64", (2, 2)), ("y", "i32", ())], base=tmp_path), cache)
    np.testing.assert_array_equal(ds.fields["x"][1], [[5.5, 6], [7, 8]])
    np.testing.assert_array_equal(ds.fields["y"], [1, 0])


def test_jsonl_from_memory(cache: Path) -> None:
    url = memory_url("d.jsonl")
    put_memory(url, b'{"x": [1, 2], "y": 3}\n{"x": [4, 5], "y": 6}\n')
    ds = load(make_spec("jsonl", url, XY), cache)
    np.testing.assert_array_equal(ds.fields["y"], [3, 6])


def test_text_char_vocab_windows_language_model(tmp_path: Path, cache: Path) -> None:
    text = "abcabcabcab"  # 11 characters: two windows of 5
    write(tmp_path / "c.txt", text)
    spec = make_spec("text", "c.txt", LM, base=tmp_path, prepare=[("char-vocab", {}), ("windows", {"length": 5})])
    ds = load(spec, cache)
    assert ds.vocab == ["a", "b", "c"]
    assert ds.n == 2
    decode = lambda ids: "".join(ds.vocab[i] for i in ids)  # noqa: E731
    assert decode(ds.fields["tokens"][0]) == "abca" and decode(ds.fields["targets"][0]) == "bcab"
    assert decode(ds.fields["tokens"][1]) == "cabc" and decode(ds.fields["targets"][1]) == "abca"
    assert ds.meta["windows"] == {"length": 5, "stride": 5, "count": 2, "tokens": 11}


def test_text_single_field_windows_with_stride_and_unicode(tmp_path: Path, cache: Path) -> None:
    write(tmp_path / "c.txt", "zéa€zéa€")
    spec = make_spec("text", "c.txt", [("w", "i64", (3,))], base=tmp_path, prepare=[("char-vocab", {}), ("windows", {"length": 3, "stride": 2})])
    ds = load(spec, cache)
    assert ds.vocab == sorted("zéa€") == ["a", "z", "é", "€"]
    assert ds.n == 3
    np.testing.assert_array_equal(ds.fields["w"][0], [1, 2, 0])
    np.testing.assert_array_equal(ds.fields["w"][1], [0, 3, 1])


def test_text_from_memory(cache: Path) -> None:
    url = memory_url("c.txt")
    put_memory(url, "hello world".encode())
    spec = make_spec("text", url, [("w", "i32", (2,))], prepare=[("char-vocab", {}), ("windows", {"length": 2})])
    assert load(spec, cache).n == 5


@pytest.mark.parametrize("name", ["spirals", "moons", "blobs"])
def test_synthetic_classification(name: str, cache: Path) -> None:
    options = {"name": name, "n": 90, "classes": 2 if name == "moons" else 3, "seed": 4}
    spec = make_spec("synthetic", None, XY, options=options)
    first, second = load_dataset(spec, use_cache=False), load_dataset(spec, use_cache=False)
    assert first.n == 90 and first.fields["x"].shape == (90, 2) and first.fields["x"].dtype == np.float32
    assert first.content_hash == second.content_hash
    counts = np.bincount(first.fields["y"])
    assert counts.tolist() == [90 // options["classes"]] * options["classes"]
    other = load_dataset(make_spec("synthetic", None, XY, options={**options, "seed": 5}), use_cache=False)
    assert other.content_hash != first.content_hash


def test_synthetic_spirals_match_cs231n_radius() -> None:
    spec = make_spec("synthetic", None, XY, options={"name": "spirals", "n": 300, "noise": 0.0})
    ds = load_dataset(spec, use_cache=False)
    first_arm = ds.fields["x"][ds.fields["y"] == 0]
    radius = np.sort(np.linalg.norm(first_arm, axis=1))
    np.testing.assert_allclose(radius, np.linspace(0, 1, 100), atol=1e-6)
    assert len(set(ds.fields["y"][:12].tolist())) > 1, "examples are interleaved, not class by class"


def test_synthetic_blobs_dim_from_field() -> None:
    spec = make_spec("synthetic", None, [("x", "f32", (5,)), ("y", "i64", ())], options={"name": "blobs", "n": 12})
    assert load_dataset(spec, use_cache=False).fields["x"].shape == (12, 5)


def test_synthetic_linear_is_x_times_w() -> None:
    spec = make_spec("synthetic", None, [("x", "f64", (3,)), ("y", "f64", (2,))], options={"name": "linear", "n": 50, "noise": 0.0, "seed": 1})
    ds = load_dataset(spec, use_cache=False)
    w = np.array(ds.meta["synthetic"]["w"])
    np.testing.assert_allclose(ds.fields["x"] @ w, ds.fields["y"], atol=1e-12)
    scalar = make_spec("synthetic", None, [("x", "f32", (3,)), ("y", "f32", ())], options={"name": "linear", "n": 8})
    assert load_dataset(scalar, use_cache=False).fields["y"].shape == (8,)


# ---------------------------------------------------------------- prepare steps


def split_spec(tmp_path: Path, name: str = "train", part: Optional[str] = None, extra: Optional[list[tuple[str, dict[str, Any]]]] = None) -> LoaderSpec:
    x = np.arange(40, dtype=np.float64).reshape(20, 2)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(20))
    prepare = (extra or []) + [("split", {"train": 0.75, "seed": 3})]
    return make_spec("npz", "d.npz", XY, base=tmp_path, prepare=prepare, name=name, part=part)


def test_split_is_deterministic_and_partitions(tmp_path: Path, cache: Path) -> None:
    train = load(split_spec(tmp_path), cache)
    val = load(split_spec(tmp_path, name="eval"), cache)
    assert (train.n, val.n) == (15, 5)
    assert train.meta["split"]["part"] == "train" and val.meta["split"]["part"] == "val"
    assert sorted(train.fields["y"].tolist() + val.fields["y"].tolist()) == list(range(20))
    expected = np.random.Generator(np.random.PCG64(3)).permutation(20)
    np.testing.assert_array_equal(train.fields["y"], expected[:15])
    explicit = load(split_spec(tmp_path, name="other", part="train"), cache)
    assert explicit.content_hash == train.content_hash
    assert shared_examples(train, val) == [] and len(shared_examples(train, explicit)) == 15


def test_split_unknown_part(tmp_path: Path, cache: Path) -> None:
    message = data_error(split_spec(tmp_path, part="test"), cache)
    assert message.endswith("d.npz: part 'test' is not one a split makes (train, val)")


def test_normalize_uses_train_statistics(tmp_path: Path, cache: Path) -> None:
    normalize = [("normalize", {"field": "x"})]
    train = load(split_spec(tmp_path, extra=normalize), cache)
    val = load(split_spec(tmp_path, name="val", extra=normalize), cache)
    np.testing.assert_allclose(train.fields["x"].mean(axis=0), 0, atol=1e-6)
    np.testing.assert_allclose(train.fields["x"].std(axis=0), 1, atol=1e-5)
    stats = train.meta["normalize"]["x"]
    assert stats == val.meta["normalize"]["x"]
    raw = np.arange(40, dtype=np.float64).reshape(20, 2)[val.fields["y"]]
    np.testing.assert_allclose(val.fields["x"], (raw - stats["mean"]) / np.array(stats["std"]), rtol=1e-5)


def test_normalize_after_split_equals_before(tmp_path: Path, cache: Path) -> None:
    before = load(split_spec(tmp_path, extra=[("normalize", {"field": "x"})]), cache)
    spec = split_spec(tmp_path)
    spec.prepare.append(PrepareStep(kind="normalize", options={"field": "x"}))
    after = load(spec, cache)
    np.testing.assert_array_equal(before.fields["x"], after.fields["x"])


def test_normalize_without_split_and_constant_feature(tmp_path: Path, cache: Path) -> None:
    x = np.stack([np.arange(6.0), np.full(6, 2.0)], axis=1)
    np.savez(tmp_path / "d.npz", x=x, y=np.zeros(6, dtype=np.int32))
    ds = load(make_spec("npz", "d.npz", XY, base=tmp_path, prepare=[("normalize", {"field": "x"})]), cache)
    np.testing.assert_allclose(ds.fields["x"][:, 1], 0.0)
    assert ds.meta["normalize"]["x"]["std"][1] == 1.0


# ---------------------------------------------------------------- cache


def test_cache_hit_then_miss_on_changed_file(tmp_path: Path, cache: Path) -> None:
    write(tmp_path / "d.csv", "x_0,x_1,y\n1,2,0\n3,4,1\n")
    spec = make_spec("csv", "d.csv", XY, base=tmp_path)
    first = load(spec, cache)
    second = load(spec, cache)
    assert (first.meta["cache"], second.meta["cache"]) == ("miss", "hit")
    assert second.content_hash == first.content_hash
    for name in first.fields:
        np.testing.assert_array_equal(first.fields[name], second.fields[name])
        assert second.fields[name].dtype == first.fields[name].dtype
    files = list((cache / "data").iterdir())
    assert [f.suffix for f in files] == [".npz"] and files[0].stem == first.meta["cache_key"]
    write(tmp_path / "d.csv", "x_0,x_1,y\n1,2,0\n3,5,1\n")
    third = load(spec, cache)
    assert third.meta["cache"] == "miss" and third.meta["cache_key"] != first.meta["cache_key"]
    assert third.content_hash != first.content_hash


def test_cache_keys_on_pipeline_and_fields(tmp_path: Path, cache: Path) -> None:
    x, y = xy_arrays()
    np.savez(tmp_path / "d.npz", x=x, y=y)
    base = load(make_spec("npz", "d.npz", XY, base=tmp_path), cache)
    wider = load(make_spec("npz", "d.npz", [("x", "f64", (2,)), ("y", "i32", ())], base=tmp_path), cache)
    normalized = load(make_spec("npz", "d.npz", XY, base=tmp_path, prepare=[("normalize", {"field": "x"})]), cache)
    assert len({base.meta["cache_key"], wider.meta["cache_key"], normalized.meta["cache_key"]}) == 3
    assert wider.meta["cache"] == normalized.meta["cache"] == "miss"


def test_cache_survives_corruption_and_keeps_vocab(tmp_path: Path, cache: Path) -> None:
    write(tmp_path / "c.txt", "abcdefgh" * 4)
    spec = make_spec("text", "c.txt", [("w", "i32", (4,))], base=tmp_path, prepare=[("char-vocab", {}), ("windows", {"length": 4})])
    first = load(spec, cache)
    assert load(spec, cache).vocab == first.vocab == list("abcdefgh")
    (path,) = (cache / "data").iterdir()
    path.write_bytes(path.read_bytes()[:40])
    again = load(spec, cache)
    assert again.meta["cache"] == "miss" and again.content_hash == first.content_hash
    assert load(spec, cache).meta["cache"] == "hit"
    assert [p.name for p in (cache / "data").iterdir()] == [path.name]  # no temporary files left


def test_cache_bfloat16_round_trip(tmp_path: Path, cache: Path) -> None:
    pytest.importorskip("ml_dtypes")
    x, y = xy_arrays()
    np.savez(tmp_path / "d.npz", x=x, y=y)
    spec = make_spec("npz", "d.npz", [("x", "bf16", (2,)), ("y", "i32", ())], base=tmp_path)
    first, second = load(spec, cache), load(spec, cache)
    assert second.meta["cache"] == "hit" and second.fields["x"].dtype == first.fields["x"].dtype
    np.testing.assert_array_equal(second.fields["x"].astype(np.float32), first.fields["x"].astype(np.float32))


def test_default_cache_dir_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEXPGPU_CACHE", str(tmp_path / "env-cache"))
    assert default_cache_dir() == tmp_path / "env-cache"
    spec = make_spec("synthetic", None, XY, options={"name": "moons", "n": 10})
    assert load_dataset(spec).meta["cache"] == "miss"
    assert load_dataset(spec).meta["cache"] == "hit"
    assert len(list((tmp_path / "env-cache" / "data").iterdir())) == 1
    monkeypatch.delenv("SEXPGPU_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "sexpgpu"


# ---------------------------------------------------------------- data errors


def test_missing_file(tmp_path: Path, cache: Path) -> None:
    message = data_error(make_spec("csv", "nope.csv", XY, base=tmp_path), cache)
    assert message == f"loader 'train': {tmp_path / 'nope.csv'}: file not found"


def test_local_files_without_fsspec(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "fsspec", None)  # importing it now fails
    write(tmp_path / "d.csv", "x_0,x_1,y\n1,2,0\n3,4,1\n")
    assert load(make_spec("csv", "d.csv", XY, base=tmp_path), cache).n == 2
    assert data_error(make_spec("csv", "gone.csv", XY, base=tmp_path), cache).endswith("gone.csv: file not found")
    message = data_error(make_spec("csv", "memory://x/d.csv", XY), cache)
    assert message == "loader 'train': memory://x/d.csv: reading URLs needs fsspec (pip install fsspec)"


def test_missing_memory_file(cache: Path) -> None:
    url = memory_url("absent.npz")
    assert data_error(make_spec("npz", url, XY), cache) == f"loader 'train': {url}: file not found"


@pytest.mark.parametrize(
    ("kind", "name", "content", "what"),
    [
        ("csv", "e.csv", "", "empty source (the file has 0 bytes)"),
        ("csv", "e.csv", "x_0,x_1,y\n", "empty source (no rows after the header)"),
        ("csv", "e.csv", "\n\n", "empty source (no header row)"),
        ("jsonl", "e.jsonl", "\n  \n", "empty source (no JSON lines)"),
        ("text", "e.txt", "", "empty source (the file has 0 bytes)"),
    ],
)
def test_empty_sources(tmp_path: Path, cache: Path, kind: str, name: str, content: str, what: str) -> None:
    write(tmp_path / name, content)
    prepare = [("char-vocab", {}), ("windows", {"length": 3})] if kind == "text" else []
    spec = make_spec(kind, name, XY if kind != "text" else [("w", "i32", (3,))], base=tmp_path, prepare=prepare)
    assert data_error(spec, cache) == f"loader 'train': {tmp_path / name}: {what}"


def test_empty_npz(tmp_path: Path, cache: Path) -> None:
    np.savez(tmp_path / "d.npz", x=np.zeros((0, 2)), y=np.zeros(0, dtype=np.int32))
    assert data_error(make_spec("npz", "d.npz", XY, base=tmp_path), cache).endswith("d.npz: empty source (0 examples)")


def test_csv_float_in_integer_field_names_line_and_field(tmp_path: Path, cache: Path) -> None:
    write(tmp_path / "d.csv", "x_0,x_1,y\n1,2,0\n3,4,1.5\n")
    message = data_error(make_spec("csv", "d.csv", XY, base=tmp_path), cache)
    assert message == f"loader 'train': {tmp_path / 'd.csv'} line 3, field 'y': value 1.5 is not an integer (the field is i32)"


def test_csv_text_in_number_column(tmp_path: Path, cache: Path) -> None:
    write(tmp_path / "d.csv", "x_0,x_1,y\n1,2,0\n3,abc,1\n4,,1\n")
    message = data_error(make_spec("csv", "d.csv", XY, base=tmp_path), cache)
    assert message.endswith("d.csv line 3, field 'x': column 'x_1': 'abc' is not a number")


def test_csv_ragged_row(tmp_path: Path, cache: Path) -> None:
    write(tmp_path / "d.csv", "x_0,x_1,y\n1,2,0\n\n3,4\n")
    message = data_error(make_spec("csv", "d.csv", XY, base=tmp_path), cache)
    assert message.endswith("d.csv line 4: row has 2 values, expected 3 (one per header column)")


def test_csv_missing_column(tmp_path: Path, cache: Path) -> None:
    write(tmp_path / "d.csv", "x_0,y\n1,0\n")
    message = data_error(make_spec("csv", "d.csv", XY, base=tmp_path), cache)
    assert message.endswith("d.csv line 1, field 'x': no column 'x_1' in the header (columns: x_0, y)")


def test_csv_nan_names_line_field_and_element(tmp_path: Path, cache: Path) -> None:
    write(tmp_path / "d.csv", "x_0,x_1,y\n1,2,0\n3,4,1\n5,nan,1\n")
    message = data_error(make_spec("csv", "d.csv", XY, base=tmp_path), cache)
    assert message.endswith("d.csv line 4, field 'x': value nan at x[1] is not finite")


def test_jsonl_float_in_integer_field(tmp_path: Path, cache: Path) -> None:
    write(tmp_path / "d.jsonl", '{"x": [1, 2], "y": 1}\n\n{"x": [1, 2], "y": 2.5}\n')
    message = data_error(make_spec("jsonl", "d.jsonl", XY, base=tmp_path), cache)
    assert message.endswith("d.jsonl line 3, field 'y': value 2.5 is not an integer (the field is i32)")


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ('{"x": [1, 2, 3], "y": 1}', "field 'x': ragged: x has 3 values, expected 2"),
        ('{"x": [1, [2]], "y": 1}', "field 'x': x[1] is a list, expected a number"),
        ('{"x": [1, "2"], "y": 1}', "field 'x': x[1] is a string, expected a number"),
        ('{"x": [1, 2], "y": null}', "field 'y': y is null, expected a number"),
        ('{"x": [1, 2]}', "field 'y': no key 'y' (keys: x)"),
        ('{"x": [1, 2], "y": NaN}', "field 'y': value nan is not an integer (the field is i32)"),
        ("[1, 2]", "expected a JSON object, got a list"),
        ('{"x": [1, 2], "y": 1', "not valid JSON (Expecting ',' delimiter at column 21)"),
    ],
)
def test_jsonl_errors_name_line(tmp_path: Path, cache: Path, line: str, what: str) -> None:
    write(tmp_path / "d.jsonl", '{"x": [0, 0], "y": 0}\n' + line + "\n")
    message = data_error(make_spec("jsonl", "d.jsonl", XY, base=tmp_path), cache)
    separator = ", " if what.startswith("field") else ": "
    assert message == f"loader 'train': {tmp_path / 'd.jsonl'} line 2{separator}{what}"


def test_jsonl_infinity_in_float_field(tmp_path: Path, cache: Path) -> None:
    write(tmp_path / "d.jsonl", '{"x": [0, 0], "y": 0}\n{"x": [Infinity, 0], "y": 0}\n')
    message = data_error(make_spec("jsonl", "d.jsonl", XY, base=tmp_path), cache)
    assert message.endswith("line 2, field 'x': value inf at x[0] is not finite")


def test_npz_wrong_dtype_names_example(tmp_path: Path, cache: Path) -> None:
    x, _ = xy_arrays()
    np.savez(tmp_path / "d.npz", x=x, y=np.array([0, 1, 2, 0.5, 1, 1]))
    message = data_error(make_spec("npz", "d.npz", XY, base=tmp_path), cache)
    assert message.endswith("d.npz example 3, field 'y': value 0.5 is not an integer (the field is i32)")


def test_npz_nan_names_example_and_element(tmp_path: Path, cache: Path) -> None:
    x, y = xy_arrays()
    x[4, 1] = np.nan
    np.savez(tmp_path / "d.npz", x=x, y=y)
    message = data_error(make_spec("npz", "d.npz", XY, base=tmp_path), cache)
    assert message.endswith("d.npz example 4, field 'x': value nan at x[1] is not finite")


def test_npz_overflow_and_range(tmp_path: Path, cache: Path) -> None:
    x, y = xy_arrays()
    x[2, 0] = 1e6
    np.savez(tmp_path / "d.npz", x=x, y=y)
    spec = make_spec("npz", "d.npz", [("x", "f16", (2,)), ("y", "i32", ())], base=tmp_path)
    assert data_error(spec, cache).endswith("example 2, field 'x': value 1000000.0 at x[0] overflows f16")
    np.savez(tmp_path / "d.npz", x=xy_arrays()[0], y=np.array([0, 1, 2**40, 0, 0, 0]))
    assert data_error(make_spec("npz", "d.npz", XY, base=tmp_path), cache).endswith(
        "example 2, field 'y': value 1099511627776 is out of range for i32"
    )


def test_npz_string_array_and_object_array(tmp_path: Path, cache: Path) -> None:
    np.savez(tmp_path / "d.npz", x=np.array([["a", "b"]] * 3), y=np.zeros(3))
    assert data_error(make_spec("npz", "d.npz", XY, base=tmp_path), cache).endswith("field 'x': values of type <U1 cannot fill a f32 field")
    np.savez(tmp_path / "o.npz", x=np.array([None, 1], dtype=object), y=np.zeros(2))
    assert data_error(make_spec("npz", "o.npz", XY, base=tmp_path), cache).endswith("o.npz: holds Python objects; save plain numeric arrays")


def test_npz_shape_mismatch_missing_array_and_counts(tmp_path: Path, cache: Path) -> None:
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 3)), y=np.zeros(4, dtype=np.int64))
    message = data_error(make_spec("npz", "d.npz", XY, base=tmp_path), cache)
    assert message.endswith("d.npz, field 'x': values have shape (3) per example ((4 3) in all); the field declares (2)")
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 2)))
    assert data_error(make_spec("npz", "d.npz", XY, base=tmp_path), cache).endswith("d.npz, field 'y': no array 'y' in the archive (arrays: x)")
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 2)), y=np.zeros(5, dtype=np.int64))
    assert data_error(make_spec("npz", "d.npz", XY, base=tmp_path), cache).endswith("fields have different numbers of examples: 'x' 4, 'y' 5")


def test_not_an_archive_and_not_utf8(tmp_path: Path, cache: Path) -> None:
    (tmp_path / "bad.npz").write_bytes(b"not an archive")
    assert data_error(make_spec("npz", "bad.npz", XY, base=tmp_path), cache).endswith("bad.npz: is not an .npy or .npz file")
    (tmp_path / "trunc.npz").write_bytes(b"PK\x03\x04truncated")
    assert "trunc.npz: cannot read the arrays" in data_error(make_spec("npz", "trunc.npz", XY, base=tmp_path), cache)
    (tmp_path / "bad.csv").write_bytes(b"x_0,x_1,y\n1,2,\xff\n")
    assert data_error(make_spec("csv", "bad.csv", XY, base=tmp_path), cache).endswith("bad.csv line 2: not UTF-8 text (byte 14: b'\\xff')")


def test_fewer_examples_than_one_batch(tmp_path: Path, cache: Path) -> None:
    write(tmp_path / "d.csv", "x_0,x_1,y\n1,2,0\n3,4,1\n")
    message = data_error(make_spec("csv", "d.csv", XY, base=tmp_path, batch=3), cache)
    assert message == f"loader 'train': {tmp_path / 'd.csv'}: 2 examples are fewer than one batch of 3"
    load(make_spec("csv", "d.csv", XY, base=tmp_path, batch=2), cache)  # now cached: still checked
    assert data_error(make_spec("csv", "d.csv", XY, base=tmp_path, batch=3), cache) == message


def test_split_part_fewer_than_batch_names_part(tmp_path: Path, cache: Path) -> None:
    spec = split_spec(tmp_path, name="val")
    spec.batch = 6
    assert data_error(spec, cache).endswith("d.npz: 5 examples in part 'val' are fewer than one batch of 6")


@pytest.mark.parametrize(
    ("prepare", "fields", "what"),
    [
        ([], [("w", "i32", (3,))], "a text source needs (char-vocab) and then (windows) to become examples"),
        ([("char-vocab", {})], [("w", "i32", (3,))], "a token stream needs (windows) to become examples"),
        ([("char-vocab", {}), ("windows", {"length": 100})], [("w", "i32", (100,))], "12 tokens are fewer than one window of 100"),
        (
            [("char-vocab", {}), ("windows", {"length": 4})],
            [("w", "i32", (3,))],
            "windows of length 4 fill one field of shape (4) or two of shape (3) (inputs and next-token targets); declared: 'w' (3)",
        ),
        ([("char-vocab", {}), ("windows", {"len": 4})], [("w", "i32", (4,))], "(windows): unknown option :len; its options are: :length, a positive integer (required); :stride, a positive integer (default: the length)"),
        ([("char-vocab", {}), ("windows", {"length": 0})], [("w", "i32", (4,))], "(windows): :length must be a positive integer, got 0"),
        ([("windows", {"length": 4})], [("w", "i32", (4,))], "(windows) needs a token stream: a text source after (char-vocab), or a 1-D npy array"),
        (
            [("char-vocab", {}), ("windows", {"length": 4}), ("split", {"train": 1.5})],
            [("w", "i32", (4,))],
            "(split): :train must be a fraction F with 0 < F < 1, got 1.5",
        ),
    ],
)
def test_text_pipeline_errors(tmp_path: Path, cache: Path, prepare: list[tuple[str, dict[str, Any]]], fields: list[Any], what: str) -> None:
    write(tmp_path / "c.txt", "hello world!")
    spec = make_spec("text", "c.txt", fields, base=tmp_path, prepare=prepare, batch=1)
    assert data_error(spec, cache) == f"loader 'train': {tmp_path / 'c.txt'}: {what}"


def test_option_errors(tmp_path: Path, cache: Path) -> None:
    write(tmp_path / "d.csv", "a,b,y\n1,2,0\n")
    spec = make_spec("csv", "d.csv", XY, base=tmp_path, options={"columns": {"z": "a"}})
    assert data_error(spec, cache).endswith("d.csv: option columns names 'z', which are not declared fields")
    spec = make_spec("csv", "d.csv", XY, base=tmp_path, options={"columns": {"x": ["a"]}})
    assert data_error(spec, cache).endswith("d.csv, field 'x': option columns gives 1 columns for a field of 2 values")
    spec = make_spec("csv", "d.csv", XY, base=tmp_path, options={"sep": ";"})
    assert data_error(spec, cache).endswith(
        "d.csv: a csv source: unknown option :sep; its options are: :columns, a quoted plist such as '(:field \"name\") (optional); :delimiter, a string (default: \",\")")
    assert data_error(make_spec("npz", None, XY), cache) == "loader 'train': the npz source needs a file or URL"


def test_normalize_errors(tmp_path: Path, cache: Path) -> None:
    x, y = xy_arrays()
    np.savez(tmp_path / "d.npz", x=x, y=y)
    spec = make_spec("npz", "d.npz", XY, base=tmp_path, prepare=[("normalize", {"field": "y"})])
    assert data_error(spec, cache).endswith("d.npz, field 'y': (normalize) needs a float field; this one is int32")
    spec = make_spec("npz", "d.npz", XY, base=tmp_path, prepare=[("normalize", {"field": "z"})])
    assert data_error(spec, cache).endswith("d.npz: (normalize): :field must be the name of a declared field (x, y), got z")


def test_synthetic_errors(cache: Path) -> None:
    def message(options: dict[str, Any], fields: list[Any] = XY) -> str:
        return data_error(make_spec("synthetic", None, fields, options=options), cache)

    assert message({"name": "swirls", "n": 5}) == "loader 'train': synthetic:swirls: (synthetic): unknown data set :swirls; the data sets are :spirals, :moons, :blobs, :linear"
    assert message({"name": "spirals"}).endswith("a synthetic source needs :n, a positive integer; write (synthetic :NAME :n N ...)")
    assert message({"name": "spirals", "n": 9}, [("x", "f32", (3,)), ("y", "i32", ())]).endswith(
        "synthetic:spirals, field 'x': the inputs field must have shape (2), not (3)"
    )
    assert message({"name": "blobs", "n": 9, "dim": 4}).endswith("field 'x': the inputs field must have shape (4), not (2)")


def test_data_error_pickles_and_has_parts(tmp_path: Path, cache: Path) -> None:
    write(tmp_path / "d.csv", "x_0,x_1,y\n1,2,x\n")
    with pytest.raises(DataError) as info:
        load_dataset(make_spec("csv", "d.csv", XY, base=tmp_path), cache)
    error = info.value
    assert (error.loader, error.source, error.line, error.field) == ("train", str(tmp_path / "d.csv"), 2, "y")
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.line == 2


# ---------------------------------------------------------------- training batches


def numbered(n: int, length: int = 3) -> Dataset:
    tokens = np.arange(n * length, dtype=np.int32).reshape(n, length)
    fields = {"tokens": tokens, "targets": tokens + 1, "w": np.arange(n, dtype=np.float32)}
    return Dataset(fields, n, "h")


def ids(batch: dict[str, np.ndarray]) -> list[int]:
    return batch["w"].astype(int).tolist()


def test_unshuffled_order_and_drop_last() -> None:
    stream = BatchStream(numbered(7), 3)
    assert [ids(stream.next()) for _ in range(4)] == [[0, 1, 2], [3, 4, 5], [0, 1, 2], [3, 4, 5]]
    assert stream.state() == LoaderState(epoch=2, position=0, examples=12, tokens=36, batches=4)
    assert stream.batches_per_epoch == 2


def test_keep_last_partial_batch() -> None:
    stream = BatchStream(numbered(7), 3, drop_last=False)
    assert [ids(stream.next()) for _ in range(4)] == [[0, 1, 2], [3, 4, 5], [6], [0, 1, 2]]
    assert stream.state().epoch == 1


def test_shuffle_is_seeded_per_epoch() -> None:
    data = numbered(12)

    def epochs(seed: int) -> list[list[int]]:
        stream = BatchStream(data, 4, shuffle=True, seed=seed)
        return [sum((ids(stream.next()) for _ in range(3)), []) for _ in range(3)]

    first = epochs(7)
    assert first == epochs(7)
    assert all(sorted(epoch) == list(range(12)) for epoch in first)
    assert first[0] != first[1] != first[2]
    assert first != epochs(8)
    expected = np.random.Generator(np.random.PCG64(np.random.SeedSequence([7, 1]))).permutation(12)
    assert first[1] == expected.tolist()


@pytest.mark.parametrize("stop", [1, 2, 4, 5, 9])
def test_restore_continues_the_exact_order(stop: int) -> None:
    data = numbered(10)
    reference = BatchStream(data, 3, shuffle=True, seed=11)
    expected = [ids(reference.next()) for _ in range(12)]
    first = BatchStream(data, 3, shuffle=True, seed=11)
    seen = [ids(first.next()) for _ in range(stop)]
    saved = LoaderState.model_validate_json(first.state().model_dump_json())
    resumed = BatchStream(data, 3, shuffle=True, seed=11)
    resumed.restore(saved)
    seen += [ids(resumed.next()) for _ in range(12 - stop)]
    assert seen == expected
    assert resumed.state() == reference.state()


def test_counters_for_ctx() -> None:
    stream = BatchStream(numbered(8), 4)
    for _ in range(3):
        stream.next()
    assert stream.counters() == {"examples": 12, "tokens": 36, "epochs": 1, "batches": 3, "position": 4}
    floats_only = Dataset({"x": np.zeros((8, 5), np.float32), "y": np.zeros(8, np.int32)}, 8, "h")
    stream = BatchStream(floats_only, 4)
    stream.next()
    assert stream.state().tokens == 0


def test_stream_refuses_too_few_examples_and_bad_state() -> None:
    with pytest.raises(DataError, match="3 examples are fewer than one batch of 4"):
        BatchStream(numbered(3), 4)
    stream = BatchStream(numbered(5), 2)
    with pytest.raises(ValueError, match="position 5 is past the 5 examples"):
        stream.restore(LoaderState(position=5))


def test_batches_have_static_shape_and_dtype(tmp_path: Path, cache: Path) -> None:
    write(tmp_path / "c.txt", "the quick brown fox jumps over the lazy dog " * 3)
    spec = make_spec("text", "c.txt", LM, base=tmp_path, prepare=[("char-vocab", {}), ("windows", {"length": 5, "stride": 3})], batch=8)
    stream = BatchStream(load(spec, cache), 8, shuffle=True)
    for _ in range(20):
        batch = stream.next()
        assert batch["tokens"].shape == (8, 4) and batch["tokens"].dtype == np.int32
        np.testing.assert_array_equal(batch["tokens"][:, 1:], batch["targets"][:, :-1])


# ---------------------------------------------------------------- evaluation batches


@pytest.mark.parametrize(("n", "batch"), [(10, 4), (8, 4), (3, 5), (1, 1)])
def test_eval_covers_every_example_once(n: int, batch: int) -> None:
    data = numbered(n)
    batches = list(EvalBatches(data, batch))
    assert len(batches) == len(EvalBatches(data, batch)) == -(-n // batch)
    real: list[int] = []
    for b in batches:
        assert set(b) == {"tokens", "targets", "w", MASK_FIELD}
        assert b["tokens"].shape == (batch, 3) and b[MASK_FIELD].dtype == np.float32
        mask = b[MASK_FIELD].astype(bool)
        assert mask.tolist() == sorted(mask.tolist(), reverse=True)
        real += ids(b)[: int(mask.sum())]
        padding = b["w"][~mask]
        assert np.isin(padding, data.fields["w"]).all()  # padding repeats real examples
    assert real == list(range(n))
    assert sum(int(b[MASK_FIELD].sum()) for b in batches) == n


def test_ids_past_the_models_sizes_are_a_data_error(tmp_path: Path) -> None:
    """--set vocab=50 on a corpus of 96 characters: the embedding would clip the ids and the
    one-hot of the targets would miss them; the run refuses to train (exit 5), naming the
    field, its range, the vocabulary and the table it feeds. An ignore-index is allowed."""
    import shutil

    from conftest import REPO
    from sexpgpu.cli.main import main

    (tmp_path / ".git").mkdir()
    (tmp_path / "data").mkdir()
    shutil.copy(REPO / "examples" / "data" / "stdlib-docstrings.txt", tmp_path / "data")
    path = tmp_path / "c.lisp"
    path.write_text((REPO / "examples" / "charlm.lisp").read_text())
    assert main(["run", str(path), "--store", str(tmp_path / "runs"), "--set", "vocab=50", "--max-steps", "2"]) == 5
    assert main(["run", str(path), "--store", str(tmp_path / "runs"), "--max-steps", "2"]) == 0
    from sexpgpu.runtime.bounds import Bound, check_bounds

    data = Dataset({"y": np.array([0, 1, 2, -100], dtype=np.int32)}, 4, "h", None, {})
    check_bounds(data, {"y": Bound(3, "the 3 classes", {-100})}, "train")  # -100 is the ignore-index
    with pytest.raises(DataError, match=r"holds -100\.\.2.*the 3 classes: its values must be 0\.\.2"):
        check_bounds(data, {"y": Bound(3, "the 3 classes")}, "train")
