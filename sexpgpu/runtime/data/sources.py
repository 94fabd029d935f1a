"""Parsing a source's bytes into field arrays (npz, npy, csv, jsonl), a text, or a token stream."""

from __future__ import annotations

import csv
import io
import json
import zipfile
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from ...ir.dtypes import DType
from .check import check_counts, coerce_array, error_from_array_load, show_shape
from .raw import Origin, Raw, decode_utf8
from .spec import DataError, FieldSpec, LoaderSpec
from .synthetic import generate


@dataclass
class Work:
    """The data between steps: field columns, or a text / token stream waiting for windows."""

    origin: Origin
    columns: dict[str, np.ndarray] = field(default_factory=dict)
    text: Optional[str] = None
    stream: Optional[np.ndarray] = None
    vocab: Optional[list[str]] = None
    split: Optional[tuple[np.ndarray, np.ndarray]] = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0


def parse_source(spec: LoaderSpec, raw: Raw) -> Work:
    return PARSERS[spec.source.kind](spec, raw)


def _wants_stream(spec: LoaderSpec) -> bool:
    return any(step.kind == "windows" for step in spec.prepare)


def _table(columns: dict[str, np.ndarray], origin: Origin) -> Work:
    if check_counts(columns, origin) == 0:
        raise origin.error("empty source (0 examples)")
    return Work(origin, columns)


def _load_arrays(raw: Raw) -> Any:
    if not raw.data.startswith((b"\x93NUMPY", b"PK\x03\x04", b"PK\x05\x06")):
        raise DataError("is not an .npy or .npz file", source=raw.where)
    try:
        return np.load(io.BytesIO(raw.data), allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise error_from_array_load(exc, raw.where) from None


def _parse_npz(spec: LoaderSpec, raw: Raw) -> Work:
    options = spec.source.options
    archive = _load_arrays(raw)
    if isinstance(archive, np.ndarray):
        raise DataError("is a single .npy array, not an .npz archive (use the npy source)", source=raw.where)
    origin = Origin(raw.where)
    mapping: dict[str, str] = options.get("map", {})
    _check_field_keys(mapping, spec, "map", raw.where)
    columns: dict[str, np.ndarray] = {}
    for spec_field in spec.fields:
        name = mapping.get(spec_field.name, spec_field.name)
        if name not in archive.files:
            raise origin.error(f"no array '{name}' in the archive (arrays: {', '.join(archive.files) or 'none'})", field=spec_field.name)
        try:
            array = archive[name]
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
            raise error_from_array_load(exc, raw.where) from None
        columns[spec_field.name] = coerce_array(array, spec_field, origin)
    return _table(columns, origin)


def _parse_npy(spec: LoaderSpec, raw: Raw) -> Work:
    options = spec.source.options
    array = _load_arrays(raw)
    if not isinstance(array, np.ndarray):
        raise DataError("is an .npz archive, not a single .npy array (use the npz source)", source=raw.where)
    origin = Origin(raw.where)
    if _wants_stream(spec):
        return Work(origin, stream=_token_stream(array, origin))
    name = options.get("field", spec.fields[0].name)
    by_name = {f.name: f for f in spec.fields}
    if name not in by_name:
        raise origin.error(f"option field names '{name}', which is not a declared field")
    others = [f.name for f in spec.fields if f.name != name]
    if others:
        raise origin.error(f"an npy source fills one field ('{name}'); no data for {', '.join(map(repr, others))}")
    return _table({name: coerce_array(array, by_name[name], origin)}, origin)


def _token_stream(array: np.ndarray, origin: Origin) -> np.ndarray:
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise origin.error(f"a token stream must be a 1-D integer array; this one is {array.dtype} of shape {show_shape(array.shape)}")
    if array.size == 0:
        raise origin.error("empty source (0 tokens)")
    return array.astype(np.int64)


def _parse_text(spec: LoaderSpec, raw: Raw) -> Work:
    return Work(Origin(raw.where), text=decode_utf8(raw))


def _parse_csv(spec: LoaderSpec, raw: Raw) -> Work:
    options = spec.source.options
    header, header_line, rows, lines = _csv_rows(decode_utf8(raw), raw.where, str(options.get("delimiter", ",")))
    origin = Origin(raw.where, np.asarray(lines, dtype=np.int64))
    table = np.array(rows, dtype=str)
    _check_field_keys(options.get("columns", {}), spec, "columns", raw.where)
    index = {name: i for i, name in enumerate(header)}
    columns: dict[str, np.ndarray] = {}
    for spec_field in spec.fields:
        names = _csv_columns(spec_field, options.get("columns", {}), raw.where)
        missing = [name for name in names if name not in index]
        if missing:
            raise DataError(
                f"no column '{missing[0]}' in the header (columns: {', '.join(header)})",
                source=raw.where, line=header_line, field=spec_field.name,
            )
        cells = table[:, [index[name] for name in names]]
        values = _parse_numbers(cells, names, spec_field, origin)
        columns[spec_field.name] = coerce_array(values.reshape((len(rows), *spec_field.shape)), spec_field, origin)
    return _table(columns, origin)


def _csv_rows(text: str, where: str, delimiter: str) -> tuple[list[str], int, list[list[str]], list[int]]:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    header: Optional[list[str]] = None
    header_line = 0
    rows: list[list[str]] = []
    lines: list[int] = []
    try:
        for row in reader:
            if not row:
                continue
            if header is None:
                header, header_line = [name.strip() for name in row], reader.line_num
                _check_header(header, where, header_line)
                continue
            if len(row) != len(header):
                raise DataError(f"row has {len(row)} values, expected {len(header)} (one per header column)", source=where, line=reader.line_num)
            rows.append(row)
            lines.append(reader.line_num)
    except csv.Error as exc:
        raise DataError(f"not valid CSV: {exc}", source=where, line=reader.line_num) from None
    if header is None:
        raise DataError("empty source (no header row)", source=where)
    if not rows:
        raise DataError("empty source (no rows after the header)", source=where)
    return header, header_line, rows, lines


def _check_field_keys(mapping: Any, spec: LoaderSpec, option: str, where: str) -> None:
    if not isinstance(mapping, dict):
        raise DataError(f"option {option} must map field names to names in the source", source=where)
    unknown = sorted(set(mapping) - {f.name for f in spec.fields})
    if unknown:
        raise DataError(f"option {option} names {', '.join(map(repr, unknown))}, which are not declared fields", source=where)


def _check_header(header: list[str], where: str, line: int) -> None:
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise DataError(f"column '{name}' appears twice in the header", source=where, line=line)
        seen.add(name)


def _csv_columns(spec_field: FieldSpec, mapping: dict[str, Any], where: str) -> list[str]:
    """A scalar field reads column NAME; a field of k elements reads NAME_0 .. NAME_{k-1} (C order)."""
    given = mapping.get(spec_field.name)
    if given is not None:
        names = [given] if isinstance(given, str) else [str(name) for name in given]
        if len(names) != spec_field.size:
            raise DataError(f"option columns gives {len(names)} columns for a field of {spec_field.size} values", source=where, field=spec_field.name)
        return names
    if not spec_field.shape:
        return [spec_field.name]
    return [f"{spec_field.name}_{i}" for i in range(spec_field.size)]


def _parse_numbers(cells: np.ndarray, names: list[str], spec_field: FieldSpec, origin: Origin) -> np.ndarray:
    cells = np.char.strip(cells)
    if spec_field.dtype is DType.bool:
        lowered = np.char.lower(cells)
        cells = np.where(lowered == "true", "1", np.where(lowered == "false", "0", cells))
    if spec_field.dtype.is_int or spec_field.dtype is DType.bool:
        try:
            return cells.astype(np.int64)
        except (ValueError, OverflowError):
            pass
    try:
        return cells.astype(np.float64)
    except ValueError:
        _raise_not_number(cells, names, spec_field, origin)
        raise origin.error("values are not numbers", field=spec_field.name) from None


def _raise_not_number(cells: np.ndarray, names: list[str], spec_field: FieldSpec, origin: Origin) -> None:
    for (row, column), cell in np.ndenumerate(cells):
        try:
            float(cell)
        except ValueError:
            what = "empty value" if cell == "" else f"{str(cell)!r} is not a number"
            raise origin.error(f"column '{names[column]}': {what}", example=row, field=spec_field.name) from None


def _parse_jsonl(spec: LoaderSpec, raw: Raw) -> Work:
    flat: dict[str, list[list[Any]]] = {f.name: [] for f in spec.fields}
    lines: list[int] = []
    for number, line in enumerate(decode_utf8(raw).split("\n"), start=1):
        if not line.strip():
            continue
        record = _json_object(line, raw.where, number)
        for spec_field in spec.fields:
            if spec_field.name not in record:
                keys = ", ".join(map(str, record)) or "none"
                raise DataError(f"no key '{spec_field.name}' (keys: {keys})", source=raw.where, line=number, field=spec_field.name)
            flat[spec_field.name].append(_flatten(record[spec_field.name], spec_field, raw.where, number))
        lines.append(number)
    if not lines:
        raise DataError("empty source (no JSON lines)", source=raw.where)
    origin = Origin(raw.where, np.asarray(lines, dtype=np.int64))
    columns = {f.name: coerce_array(_json_array(flat[f.name], f, origin), f, origin) for f in spec.fields}
    return _table(columns, origin)


def _json_object(line: str, where: str, number: int) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"not valid JSON ({exc.msg} at column {exc.colno})", source=where, line=number) from None
    if not isinstance(record, dict):
        raise DataError(f"expected a JSON object, got {_json_type(record)}", source=where, line=number)
    return record


def _flatten(value: Any, spec_field: FieldSpec, where: str, line: int) -> list[Any]:
    out: list[Any] = []

    def fail(what: str) -> DataError:
        return DataError(what, source=where, line=line, field=spec_field.name)

    def walk(item: Any, depth: int, path: str) -> None:
        if depth == len(spec_field.shape):
            if isinstance(item, bool) and spec_field.dtype is not DType.bool:
                raise fail(f"{path} is {str(item).lower()}, expected a number")
            if not isinstance(item, (int, float)):
                raise fail(f"{path} is {_json_type(item)}, expected a number")
            out.append(item)
            return
        expected = spec_field.shape[depth]
        if not isinstance(item, list):
            raise fail(f"{path} is {_json_type(item)}, expected a list of {expected} values")
        if len(item) != expected:
            raise fail(f"ragged: {path} has {len(item)} values, expected {expected}")
        for i, element in enumerate(item):
            walk(element, depth + 1, f"{path}[{i}]")

    walk(value, 0, spec_field.name)
    return out


def _json_array(rows: list[list[Any]], spec_field: FieldSpec, origin: Origin) -> np.ndarray:
    try:
        array = np.array(rows)
    except OverflowError:
        array = np.array(rows, dtype=object)
    if array.dtype == object:
        raise origin.error("an integer is too large for 64 bits", field=spec_field.name)
    return array.reshape((len(rows), *spec_field.shape))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), type(value).__name__)


def _parse_synthetic(spec: LoaderSpec, raw: Raw) -> Work:
    origin = Origin(raw.where)
    arrays, meta = generate(spec.source.options, spec.fields, raw.where)
    columns = {f.name: coerce_array(arrays[f.name], f, origin) for f in spec.fields}
    work = _table(columns, origin)
    work.meta["synthetic"] = meta
    return work


PARSERS: dict[str, Callable[[LoaderSpec, Raw], Work]] = {
    "npz": _parse_npz,
    "npy": _parse_npy,
    "csv": _parse_csv,
    "jsonl": _parse_jsonl,
    "text": _parse_text,
    "synthetic": _parse_synthetic,
}
