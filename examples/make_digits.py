"""Writes examples/data/digits.npz from scikit-learn's bundled handwritten digits.

Provenance: the "Optical Recognition of Handwritten Digits" data set (UCI ML repository,
E. Alpaydin and C. Kaynak, 1998), as bundled inside scikit-learn (BSD-3-Clause) and loaded
with sklearn.datasets.load_digits, which reads a file shipped in the package: nothing is
downloaded. 1,797 images of 8x8 pixels with values 0..16, labels 0..9.

The npz holds `image` (f32, N x 1 x 8 x 8, scaled to [0, 1]) and `label` (i32, N), the
fields examples/cnn.lisp declares. Needs the `examples` extra:

    pip install -e '.[examples]' && python examples/make_digits.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def main() -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    labels = digits.target.astype(np.int32)
    target = Path(__file__).parent / "data" / "digits.npz"
    target.parent.mkdir(exist_ok=True)
    np.savez_compressed(target, image=images, label=labels)
    print(f"{target}: {len(labels)} images, classes {sorted(set(labels.tolist()))}")


if __name__ == "__main__":
    main()
