"""The data layer: loader specs in, prepared and cached datasets out, batches for training and eval.

load_dataset reads the source (any fsspec URL, or a path relative to spec.base_dir), hashes
its bytes, and returns the cached prepared dataset for (content, pipeline, fields, part) when
there is one; otherwise it parses, validates and prepares, then caches. Every problem with the
data raises DataError naming what is wrong and where (file, line or example, field).

    spec.py       what the compiler hands the data layer (LoaderSpec), DataError, Dataset
    load.py       load_dataset: read, parse, check, prepare, cache
    raw.py        source bytes: URL resolution, fsspec reads, decoding
    sources.py    parsing bytes into field arrays (npz npy csv jsonl text synthetic)
    check.py      field shape, dtype and finiteness checks that name the spot
    prepare.py    prepare steps (char-vocab windows split normalize)
    synthetic.py  deterministic synthetic datasets
    cache.py      the content-addressed cache of prepared datasets
    stream.py     batches for training (resumable) and evaluation
"""
