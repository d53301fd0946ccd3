"""What a data set is: train/test arrays standardised with the train set's statistics.

Contract: :class:`Dataset` holds float32 train/test arrays ``(N, *input_shape)`` normalised
with the *train* set's per-channel mean/std (:func:`normalised`), int32 labels and
``num_classes``. Data that cannot be had (a missing file, a refused download, a checksum
mismatch) is a :class:`DataError` (a ValueError) with a one-line message.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

__all__ = ["DataError", "Dataset", "normalised"]


class DataError(ValueError):
    """Data that cannot be had: a missing file, a refused download, a checksum mismatch."""


@dataclass(frozen=True)
class Dataset:
    """Train/test arrays; see the module docstring for the contract."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    def hash(self) -> str:
        """SHA-256 of the name, the class count and every array's dtype, shape and bytes:
        equal hashes, equal data sets."""
        h = hashlib.sha256(f"{self.name}\0{self.num_classes}".encode())
        for a in (self.x_train, self.y_train, self.x_test, self.y_test):
            a = np.ascontiguousarray(a)
            h.update(f"\0{a.dtype.str}{a.shape}".encode())
            h.update(a.tobytes())
        return h.hexdigest()


def normalised(name: str, xtr, ytr, xte, yte, num_classes: int) -> Dataset:
    """Per-channel standardisation with the train set's statistics.

    Sums are taken per example in float32 (short sums) and across examples in float64, which
    is accurate and several times faster than float64 reductions over the whole array; they
    are numpy's fixed-order reductions of correctly rounded squares (no BLAS, no einsum), so
    the statistics' bits do not depend on the machine. Blocks of examples bound the
    squares' scratch memory.
    """
    c = xtr.shape[-1]
    xtr = np.asarray(xtr, np.float32)
    flat = xtr.reshape(len(xtr), -1, c)
    count = flat.shape[0] * flat.shape[1]
    mean = flat.sum(axis=1).sum(axis=0, dtype=np.float64) / count
    squares = np.concatenate([np.square(flat[i:i + 4096]).sum(axis=1)
                              for i in range(0, len(flat), 4096)] or [np.zeros((0, c))])
    sq = squares.sum(axis=0, dtype=np.float64) / count
    std = np.sqrt(np.maximum(sq - mean**2, 0.0))
    std = np.where(std > 0, std, 1.0)
    m32, inv32 = mean.astype(np.float32), (1.0 / std).astype(np.float32)

    def norm(x: np.ndarray) -> np.ndarray:
        x = np.array(x, np.float32, copy=True)
        x -= m32
        x *= inv32
        return x

    return Dataset(
        name,
        norm(xtr),
        np.asarray(ytr, np.int32),
        norm(xte),
        np.asarray(yte, np.int32),
        int(num_classes),
    )
