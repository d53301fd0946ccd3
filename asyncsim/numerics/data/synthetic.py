"""The generated data sets: ``synthetic-cifar`` (the offline default) and ``gaussian``.

``synthetic-cifar``
    Deterministic 32x32x3, 10 classes, see :func:`synthetic_cifar` for its construction and
    measured hardness.
``gaussian``
    Standard normal features with zero labels, the data of the ``quadratic`` model's noise.

Both draw from ``numpy.random.Generator(SeedSequence(seed))`` streams (the global RNG is
never touched) and refuse, before anything is made, a size that does not fit in memory.
"""

from __future__ import annotations

import math

import numpy as np

from asyncsim._checks import integer, memory, nonneg
from asyncsim.numerics.data.dataset import Dataset, normalised
from asyncsim.numerics.data.registry import register_dataset

__all__ = ["gaussian", "synthetic_cifar"]


# Bytes per synthetic-cifar sample while the set is made: its float32 image (12,288 bytes)
# four times over (generating it peaks at about three: 34 kB per sample measured at 40,000
# samples; then the device's copy).
_SYNTHETIC_SAMPLE_BYTES = 4 * 32 * 32 * 3 * 4


def _check_fits(sizes: dict[str, int], sample_bytes: int, **more: int) -> None:
    """Refuse, before anything is made, a data set of ``sum(sizes)`` samples of
    ``sample_bytes`` that needs more than the machine's memory, under its largest size
    option (data.n_train = 1e9 was let through: each of numpy's allocations fit until it
    shuffled 10^9 labels for minutes; only sizes whose first allocation failed were
    refused, by build_dataset's MemoryError)."""
    n = sum(sizes.values())
    key = max({**sizes, **more}.items(), key=lambda kv: kv[1])[0]
    memory(key, n * sample_bytes, "the data set does not fit in this machine's memory: it "
           "needs", f" ({n:,} samples of {sample_bytes:,} bytes while it is made)")


def _turns(size: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of 2*pi*m/size for m = 0..size-1, from a fixed Taylor series in Python
    floats: IEEE-754 arithmetic, one rounding per operation, so the same bits on every
    machine (numpy's sin/cos may run another libm or SIMD polynomial per CPU)."""
    cos, sin = [], []
    for m in range(size):
        m = m - size if 2 * m > size else m  # |x| <= pi, where 40 terms reach 1e-30
        x = 2.0 * math.pi * m / size
        c, s, term = 0.0, 0.0, 1.0  # term = x**k / k!
        for k in range(40):
            if k % 2 == 0:
                c += -term if k % 4 == 2 else term
            else:
                s += -term if k % 4 == 3 else term
            term = term * x / (k + 1)
        cos.append(c)
        sin.append(s)
    return np.array(cos), np.array(sin)


def _fixed_order_matmul(a: np.ndarray, b: np.ndarray, block: int = 256) -> np.ndarray:
    """``a @ b`` for ``a`` (m, k) and ``b`` (k, p), summed over k in index order with one
    rounding per product and per sum (a numpy multiply, then an add: no BLAS, no fused
    multiply-add), so its bits do not depend on the CPU model, the BLAS kernel or the thread
    count. Blocks of ``block`` rows keep the running sum in cache (0.24 s for a (10,000, 32)
    by (32, 3,072) float32 product here, against 0.04 s in BLAS)."""
    out = np.zeros((a.shape[0], b.shape[1]), np.result_type(a, b))
    for start in range(0, a.shape[0], block):
        rows, weights = out[start:start + block], a[start:start + block]
        for k in range(b.shape[0]):
            rows += weights[:, k, None] * b[k]
    return out


def _smooth_fields(rng: np.random.Generator, count: int, size: int, freq: int) -> np.ndarray:
    """``count`` random smooth RGB images (size x size x 3) from low-frequency Fourier terms.

    Amplitudes fall off as 1/(1+|f|) so coarse structure dominates, like natural images.
    Each field has zero mean and unit std. Only correctly rounded operations (+, -, *, /,
    sqrt), numpy's fixed-order reductions and :func:`_turns`' table make it, so its bits are
    the same on every machine.
    """
    f = np.arange(-freq, freq + 1)
    fy, fx = np.meshgrid(f, f, indexing="ij")
    fy, fx = fy.ravel(), fx.ravel()
    keep = (fy > 0) | ((fy == 0) & (fx > 0))  # one of each +-f pair; no DC term
    fy, fx = fy[keep], fx[keep]
    amp = 1.0 / (1.0 + np.sqrt((fy * fy + fx * fx).astype(np.float64)))
    # The phase 2*pi*(fy*y + fx*x)/size in whole turns of the table: exact integers.
    grid = np.arange(size)
    turn = (fy[:, None, None] * grid[None, :, None] + fx[:, None, None] * grid[None, None, :])
    turn = (turn % size).reshape(len(fy), -1)
    cos, sin = _turns(size)
    basis = np.concatenate([cos[turn] * amp[:, None], sin[turn] * amp[:, None]])
    coef = rng.standard_normal((count, 3, basis.shape[0]))
    # Correlate the colour channels a little, as in natural images.
    mix = np.array([[1.0, 0.5, 0.3], [0.5, 1.0, 0.5], [0.3, 0.5, 1.0]])
    coef = _fixed_order_matmul(mix, coef.transpose(1, 0, 2).reshape(3, -1))
    coef = coef.reshape(3, count, -1).transpose(1, 0, 2).reshape(count * 3, -1)
    img = _fixed_order_matmul(coef, basis).reshape(count, 3, size, size).transpose(0, 2, 3, 1)
    img -= img.mean(axis=(1, 2, 3), keepdims=True)
    img /= img.std(axis=(1, 2, 3), keepdims=True)
    return img.astype(np.float32)


def _synthetic_split(
    rng: np.random.Generator,
    prototypes: np.ndarray,
    distractors: np.ndarray,
    n: int,
    *,
    num_classes: int,
    max_shift: int,
    pixel_noise: float,
    clutter: float,
    label_noise: float,
) -> tuple[np.ndarray, np.ndarray]:
    k_per_class, big = prototypes.shape[1], prototypes.shape[2]
    size = 32
    y = np.arange(n) % num_classes  # exact class balance before label noise
    rng.shuffle(y)
    proto = rng.integers(0, k_per_class, n)
    # Random translation: crop a 32x32 window out of the (32 + 2 * max_shift)^2 prototype.
    oy = rng.integers(0, big - size + 1, n)
    ox = rng.integers(0, big - size + 1, n)
    flip = rng.random(n) < 0.5
    rows = oy[:, None] + np.arange(size)[None, :]  # (n, 32)
    cols = ox[:, None] + np.arange(size)[None, :]
    cols = np.where(flip[:, None], cols[:, ::-1], cols)
    # One flat int32 gather of RGB pixels is much faster than 4-d fancy indexing.
    which = (y * k_per_class + proto).astype(np.int32) * np.int32(big * big)
    flat = which[:, None, None] + rows[:, :, None].astype(np.int32) * big + cols[:, None, :]
    x = np.take(prototypes.reshape(-1, 3), flat.astype(np.int32), axis=0)
    contrast = rng.uniform(0.4, 1.2, (n, 1, 1, 1)).astype(np.float32)
    brightness = rng.normal(0.0, 0.3, (n, 1, 1, 3)).astype(np.float32)
    x *= contrast
    x += brightness
    # Structured clutter: a random mix of class-independent smooth fields.
    w = rng.standard_normal((n, distractors.shape[0])).astype(np.float32)
    w *= np.float32(clutter / np.sqrt(distractors.shape[0]))
    x += _fixed_order_matmul(w, distractors.reshape(distractors.shape[0], -1)).reshape(
        n, size, size, 3)
    # Pixel noise: uniform with unit variance (drawing uniforms is ~3x faster than normals).
    noise = rng.random((n, size, size, 3), dtype=np.float32)
    noise -= np.float32(0.5)
    noise *= np.float32(pixel_noise * np.sqrt(12.0))
    x += noise
    if label_noise > 0:
        flip_label = rng.random(n) < label_noise
        y = np.where(flip_label, rng.integers(0, num_classes, n), y)
    return x, y.astype(np.int32)


@register_dataset("synthetic-cifar")
def synthetic_cifar(
    *,
    seed: int,
    n_train: int = 10000,
    n_test: int = 2000,
    difficulty: float = 1.0,
    prototypes: int = 4,
    max_shift: int = 4,
    label_noise: float = 0.05,
    num_classes: int = 10,
) -> Dataset:
    """A deterministic CIFAR-shaped classification set (32x32x3, 10 classes).

    Construction: per class ``prototypes`` random smooth images (low-frequency Fourier terms,
    40x40 so they can be translated); a sample is one of its class's prototypes, translated by
    up to ``max_shift`` pixels, randomly flipped, with random contrast and per-channel
    brightness, plus class-independent structured clutter (a random mix of 32 smooth fields)
    and per-pixel noise (uniform with unit variance: uniforms are ~3x cheaper to draw).
    ``difficulty`` scales clutter (1.2 x difficulty) and pixel noise (1.0 x difficulty);
    ``label_noise`` re-draws that fraction of *training* labels uniformly (test labels stay
    clean, so test error measures generalisation). Train and test
    share the prototypes and are drawn from ``numpy.random.Generator(SeedSequence(seed))``
    streams; the global RNG is never touched. Its bits are the same on every machine: the
    arithmetic on the draws uses no BLAS and no transcendental function, only correctly
    rounded operations in a fixed order (docs/reproducibility.md; golden hashes in
    tests/unit/test_data.py). 12k images take 1.0-1.3 s on the 2-core machine while it runs
    other work (BLAS's products would take 0.7-0.8 s, with bits that depend on the CPU).

    Measured hardness at the defaults (seed 0, 10k train / 2k test): cifar10-full (He init)
    trained with plain SGD (one learner with zero delay), lr 0.01, heavy-ball 0.9, batch 64,
    per-epoch permutation sampling, reaches test error 0.822 after half an epoch, then
    0.753, 0.623, 0.555, 0.466, 0.415, 0.361, 0.335, 0.300, 0.317 and 0.303 after epochs 1-10
    (chance is 0.90): the error falls over several epochs rather than in one step. The
    quickstart (8 learners, 4-softsync, 4k images, 6 epochs) ends at 0.744. A linear softmax
    (300 SGD steps, lr 0.002, batch 64, 2k train images) clearly beats chance (< 0.6, see
    tests).
    """
    n_train = integer("n_train", n_train)
    n_test = integer("n_test", n_test)
    difficulty = nonneg("difficulty", difficulty)
    prototypes = integer("prototypes", prototypes)
    num_classes = integer("num_classes", num_classes)
    max_shift = integer("max_shift", max_shift, low=0, high=16)
    label_noise = nonneg("label_noise", label_noise)
    if label_noise > 1:
        raise ValueError(f"label_noise: must be in [0, 1], got {label_noise}")
    _check_fits({"n_train": n_train, "n_test": n_test}, _SYNTHETIC_SAMPLE_BYTES)
    ss = np.random.SeedSequence([int(seed), 0x5C1FA5])
    s_proto, s_train, s_test = (np.random.Generator(np.random.PCG64(s)) for s in ss.spawn(3))
    big = 32 + 2 * max_shift
    protos = _smooth_fields(s_proto, num_classes * prototypes, big, freq=4)
    protos = protos.reshape(num_classes, prototypes, big, big, 3)
    distractors = _smooth_fields(s_proto, 32, 32, freq=6)
    kw = dict(
        num_classes=num_classes,
        max_shift=max_shift,
        pixel_noise=1.0 * difficulty,
        clutter=1.2 * difficulty,
    )
    xtr, ytr = _synthetic_split(
        s_train, protos, distractors, n_train, label_noise=label_noise, **kw
    )
    xte, yte = _synthetic_split(s_test, protos, distractors, n_test, label_noise=0.0, **kw)
    return normalised("synthetic-cifar", xtr, ytr, xte, yte, num_classes)


@register_dataset("gaussian")
def gaussian(*, seed: int, dim: int = 10, n_train: int = 10000, n_test: int = 1000) -> Dataset:
    """Standard normal features (N, dim), all labels 0: the ``quadratic`` model's noise data.

    Not re-normalised (the features are already standard normal by construction).
    """
    dim = integer("dim", dim)
    n_train = integer("n_train", n_train)
    n_test = integer("n_test", n_test)
    _check_fits({"n_train": n_train, "n_test": n_test}, 2 * 4 * dim, dim=dim)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), 0x6A55])))
    xtr = rng.standard_normal((n_train, dim), dtype=np.float32)
    xte = rng.standard_normal((n_test, dim), dtype=np.float32)
    return Dataset(
        "gaussian",
        xtr,
        np.zeros(n_train, np.int32),
        xte,
        np.zeros(n_test, np.int32),
        1,
    )
