"""Data sets and deterministic mini-batch sampling.

Contract (docs/design.md, "Determinism"):

* :class:`Dataset` holds float32 train/test arrays ``(N, *input_shape)`` normalised with the
  *train* set's per-channel mean/std, int32 labels and ``num_classes``.
* :func:`get_dataset` ``(name, *, seed, base_dir=None, **options)`` builds a registered data
  set (relative path options resolve against ``base_dir``); an unknown name or a bad option
  raises :class:`ValueError` naming what is allowed. Missing files, failed downloads and
  refused files raise :class:`DataError` (a ValueError) with a one-line message.
* :func:`batch_indices` ``(seed, learner, step, batch_size, n)`` is a pure, jittable function
  of ``(seed, learner, step)`` (which may be traced int32 values) giving the train indices of
  one learner's mini-batch. Results never depend on event interleaving or call order.

Sampling policy of :func:`batch_indices`: each learner walks through its own random
permutation of the train set, a fresh one per (learner, epoch), where learner ``l``'s epoch
``e`` covers its sample positions ``p = step * batch_size + j`` with ``p // n == e``. So within
one learner no example repeats inside an epoch (sampling without replacement, as in ordinary
data loaders), and a batch that straddles two epochs takes the tail of one permutation and the
head of the next. The permutation is not materialised: index ``p % n`` is mapped through a
keyed bijection of ``[0, 2**k)`` (odd-multiply / add / xor-shift rounds, ``2**k >= n``) with
cycle walking into ``[0, n)``, which costs O(batch_size) instead of sorting ``n`` keys per step
(a sort of 50k keys per gradient would cost a third of a small gradient on CPU). The round keys
come from ``fold_in(fold_in(fold_in(PRNGKey(seed), learner), epoch), 0)``. Positions are
computed in uint32, so a learner may take up to ``2**32 / batch_size`` steps.

Built-ins
---------
``synthetic-cifar`` (offline default)
    Deterministic 32x32x3, 10 classes, see :func:`synthetic_cifar` for its construction and
    measured hardness.
``cifar10``
    The real CIFAR10 from the standard python tarball (local path, cache, or an explicitly
    allowed download with SHA-256 verification). A data file runs no code: the batches are
    unpickled admitting only the numpy globals CIFAR10 is made of, and what is downloaded
    and trusted (URL, checksum) comes from code or the environment, never a scenario file.
``gaussian``
    Standard normal features with zero labels, the data of the ``quadratic`` model's noise.
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from asyncsim._checks import flag, integer, memory, nonneg
from asyncsim._io import atomic
from asyncsim._registry import PluginRegistry, build, callable_value, option_defaults
from asyncsim.errors import ScenarioError
from asyncsim.numerics import _cifar10

__all__ = [
    "CIFAR10_SHA256",
    "CIFAR10_URL",
    "DataError",
    "Dataset",
    "available_datasets",
    "batch_indices",
    "default_cache_dir",
    "download_source",
    "fetch",
    "get_dataset",
    "register_dataset",
]


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


_registry: PluginRegistry[Callable[..., Dataset]] = PluginRegistry(
    "asyncsim.datasets", "data set", "data.name",
    adapt=callable_value("a factory f(*, seed, **options) -> Dataset"))


def register_dataset(name: str, *, replace: bool = False) -> Callable[[Callable], Callable]:
    """Decorator registering a factory ``f(*, seed, **options) -> Dataset`` under ``name``.

    An installed package can instead expose the factory under the entry-point group
    ``asyncsim.datasets`` (docs/plugins.md); a name registered here wins over it, and a
    name another factory holds is a ValueError unless ``replace`` (``PluginRegistry.register``).
    """
    return _registry.decorator(name, replace=replace)


def available_datasets() -> list[str]:
    """Sorted names of the data sets: built-ins, registered factories and entry points."""
    return _registry.names()


def dataset_factory(name: str) -> Callable[..., Dataset]:
    """The factory registered (or installed) as ``name``; ScenarioError under ``data.name``
    for an unknown name."""
    return _registry.get(name)


def get_dataset(name: str, *, seed: int, base_dir: str | os.PathLike | None = None,
                **options: Any) -> Dataset:
    """Build data set ``name``; ValueError for an unknown name or option (listing the allowed).

    Options annotated ``Path`` (cifar10's ``path`` and ``cache_dir``) take a string or a path;
    ``~`` is expanded and a relative one resolves against ``base_dir``, which a scenario's
    data set gets as the scenario file's folder (:attr:`asyncsim.config.Scenario.base_dir`),
    and otherwise against the working directory.
    """
    return build(dataset_factory(name), options, key="data", what="data", name=name,
                 noun="option", also=("name", "batch_size"), fixed={"seed": seed},
                 reraise=(DataError,), base_dir=base_dir)


def declared_train_size(name: str, options: Mapping[str, Any]) -> int | None:
    """The train-set size of data set ``name`` with ``options`` without building it:
    ``n_train`` as given, else the factory's integer default; None when only building the
    data set can tell (a real CIFAR10 subset-less load is 50,000, but a plug-in may differ)."""
    n = options.get("n_train")
    if n is None:
        try:
            n = option_defaults(dataset_factory(name)).get("n_train")
        except ScenarioError:
            return None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def train_size(name: str, options: Mapping[str, Any]) -> int:
    """:func:`declared_train_size`, or CIFAR10's 50,000 when it is not declared (run lengths
    in epochs before the data set is built)."""
    n = declared_train_size(name, options)
    return 50_000 if n is None else n


def check_batch_size(batch_size: int, n_train: int, data_name: str) -> None:
    """A mini-batch draws without replacement from one pass over the train set (see
    :func:`batch_indices`), so it holds at most ``n_train`` samples."""
    if batch_size > n_train:
        raise ScenarioError("data.batch_size",
                            f"is {batch_size}, more than the {n_train} training samples of "
                            f"data {data_name!r}; allowed: 1 to {n_train} (a full batch)")


def _normalise(name: str, xtr, ytr, xte, yte, num_classes: int) -> Dataset:
    """Per-channel standardisation with the train set's statistics.

    Sums are taken per example in float32 (short sums) and across examples in float64, which
    is accurate and several times faster than float64 reductions over the whole array.
    """
    c = xtr.shape[-1]
    xtr = np.asarray(xtr, np.float32)
    flat = xtr.reshape(len(xtr), -1, c)
    count = flat.shape[0] * flat.shape[1]
    mean = flat.sum(axis=1).sum(axis=0, dtype=np.float64) / count
    sq = np.einsum("npc,npc->nc", flat, flat).sum(axis=0, dtype=np.float64) / count
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


# --------------------------------------------------------------------------------------------
# Mini-batch sampling
# --------------------------------------------------------------------------------------------

_ROUNDS = 4


def _bits_for(n: int) -> int:
    return max(1, int(n - 1).bit_length())


def _permute(keys: jax.Array, i: jax.Array, n: int) -> jax.Array:
    """Keyed bijection of [0, n) applied to ``i`` (uint32), by cycle walking on [0, 2**k)."""
    k = _bits_for(n)
    mask = jnp.uint32((1 << k) - 1)
    shift = max(1, k // 2)
    mult = keys[:_ROUNDS] | jnp.uint32(1)  # odd multipliers are bijective mod 2**k
    add = keys[_ROUNDS:]

    def bijection(x: jax.Array) -> jax.Array:
        for r in range(_ROUNDS):
            x = (x * mult[r] + add[r]) & mask
            x = x ^ (x >> shift)  # xor with a right shift is invertible
        return x

    def walk(x: jax.Array) -> jax.Array:
        # Iterating a bijection of [0, 2**k) until it lands in [0, n) is a bijection of [0, n);
        # since 2**k < 2n the expected number of extra rounds is below one.
        x = bijection(x)
        return jax.lax.while_loop(lambda v: v >= jnp.uint32(n), bijection, x)

    return walk(i)


def batch_indices(seed, learner, step, batch_size: int, n: int) -> jax.Array:
    """int32[batch_size] train indices of learner ``learner``'s ``step``-th mini-batch.

    Pure and jittable in ``(seed, learner, step)``; ``batch_size`` and ``n`` are static.
    See the module docstring for the sampling policy (a per-(learner, epoch) permutation).
    """
    batch_size = int(batch_size)
    n = int(n)
    if batch_size <= 0 or n <= 0:
        raise ValueError(f"batch_size and n must be positive, got {batch_size}, {n}")
    base = jax.random.fold_in(jax.random.PRNGKey(seed), learner)
    pos = jnp.asarray(step).astype(jnp.uint32) * jnp.uint32(batch_size) + jnp.arange(
        batch_size, dtype=jnp.uint32
    )
    epoch = pos // jnp.uint32(n)
    offset = pos % jnp.uint32(n)

    def one(e: jax.Array, i: jax.Array) -> jax.Array:
        key = jax.random.fold_in(jax.random.fold_in(base, e), 0)
        keys = jax.random.bits(key, (2 * _ROUNDS,), jnp.uint32)
        return _permute(keys, i, n)

    return jax.vmap(one)(epoch, offset).astype(jnp.int32)


# --------------------------------------------------------------------------------------------
# synthetic-cifar
# --------------------------------------------------------------------------------------------


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


def _smooth_fields(rng: np.random.Generator, count: int, size: int, freq: int) -> np.ndarray:
    """``count`` random smooth RGB images (size x size x 3) from low-frequency Fourier terms.

    Amplitudes fall off as 1/(1+|f|) so coarse structure dominates, like natural images.
    Each field has zero mean and unit std.
    """
    f = np.arange(-freq, freq + 1)
    fy, fx = np.meshgrid(f, f, indexing="ij")
    fy, fx = fy.ravel(), fx.ravel()
    keep = (fy > 0) | ((fy == 0) & (fx > 0))  # one of each +-f pair; no DC term
    fy, fx = fy[keep], fx[keep]
    amp = 1.0 / (1.0 + np.hypot(fy, fx))
    coords = np.arange(size) / size
    phase_y = 2 * np.pi * np.outer(fy, coords)  # (F, size)
    phase_x = 2 * np.pi * np.outer(fx, coords)
    basis_c = np.cos(phase_y[:, :, None] + phase_x[:, None, :]).reshape(len(fy), -1)
    basis_s = np.sin(phase_y[:, :, None] + phase_x[:, None, :]).reshape(len(fy), -1)
    basis = np.concatenate([basis_c, basis_s]) * np.concatenate([amp, amp])[:, None]
    coef = rng.standard_normal((count, 3, basis.shape[0]))
    # Correlate the colour channels a little, as in natural images.
    mix = np.array([[1.0, 0.5, 0.3], [0.5, 1.0, 0.5], [0.3, 0.5, 1.0]])
    coef = np.einsum("ij,njf->nif", mix, coef)
    img = (coef @ basis).reshape(count, 3, size, size).transpose(0, 2, 3, 1)
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
    x += (w @ distractors.reshape(distractors.shape[0], -1)).reshape(n, size, size, 3)
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
    streams; the global RNG is never touched. 12k images take ~1.7 s on a busy 2-core CPU.

    Measured hardness at the defaults (seed 0, 10k train / 2k test): cifar10-full (He init)
    trained with plain jitted SGD, lr 0.01, momentum 0.9, batch 64, per-epoch permutation
    sampling, reaches test error 0.824 after half an epoch, then 0.753, 0.686, 0.595, 0.556, 0.522,
    0.496, 0.439, 0.399, 0.386, 0.385 after epochs 1-10 (error on 2k train images 0.771 at
    epoch 1, 0.333 at epoch 10; chance is 0.90). So the error falls over several epochs
    rather than in one step and is well below 50% by epoch 7. A linear softmax (300 SGD
    steps, lr 0.002, batch 64, 2k train images) clearly beats chance (< 0.6, see tests).
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
    return _normalise("synthetic-cifar", xtr, ytr, xte, yte, num_classes)


# --------------------------------------------------------------------------------------------
# gaussian
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# cifar10 (real)
# --------------------------------------------------------------------------------------------

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
# SHA-256 of cifar-10-python.tar.gz (170,498,071 bytes; MD5 c58f30108f718f92721af3b95e74349a).
# The same constant is used by Keras' cifar10 loader (file_hash) and TFDS; checked against them.
CIFAR10_SHA256 = "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce"


def default_cache_dir() -> Path:
    """``$ASYNCSIM_CACHE`` if set, else ``~/.cache/asyncsim``."""
    env = os.environ.get("ASYNCSIM_CACHE")
    return Path(env).expanduser() if env else Path("~/.cache/asyncsim").expanduser()


def fetch(url: str, dest: Path, sha256: str, *, timeout: float = 60.0) -> Path:
    """Fetch ``url`` to ``dest`` atomically, verifying its SHA-256.

    Streams into a temporary file next to ``dest`` (:func:`asyncsim._io.atomic`) and renames
    it into place only when the checksum matches; on a mismatch or any error the temporary
    file is deleted, so the cache never holds a partial or unverified file.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with (atomic(dest) as tmp, open(tmp, "wb") as out,
              urllib.request.urlopen(url, timeout=timeout) as resp):
            h = hashlib.sha256()
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                h.update(chunk)
                out.write(chunk)
            got = h.hexdigest()
            if got.lower() != sha256.lower():  # raised inside: the file is not kept
                raise DataError(f"checksum mismatch for {url}: expected sha256 {sha256}, "
                                f"got {got}")
    except OSError as err:
        raise DataError(f"download of {url} failed: {err}") from err
    return dest


# A mirror of the tarball is the environment's business, never a scenario file's: a file
# someone sends you could otherwise point download = true at any tarball with its checksum.
CIFAR10_URL_ENV = "ASYNCSIM_CIFAR10_URL"
CIFAR10_SHA256_ENV = "ASYNCSIM_CIFAR10_SHA256"
_MIRROR_HINT = (f"the canonical URL and SHA-256 are built in, and a mirror is set in the "
                f"environment: {CIFAR10_URL_ENV} (verified against the canonical checksum) "
                f"and, for a mirror of other bytes, {CIFAR10_SHA256_ENV}")


def download_source() -> tuple[str, str]:
    """``(url, sha256)`` that a ``download = true`` load fetches and verifies.

    The canonical :data:`CIFAR10_URL` and :data:`CIFAR10_SHA256` unless the environment
    names a mirror: ``$ASYNCSIM_CIFAR10_URL`` alone is verified against the canonical
    checksum, with ``$ASYNCSIM_CIFAR10_SHA256`` against that one. A checksum without a URL,
    or one that is not 64 hex digits, is a :class:`DataError` (an empty variable is unset).
    """
    url = os.environ.get(CIFAR10_URL_ENV) or None
    sha = os.environ.get(CIFAR10_SHA256_ENV) or None
    if sha is not None and url is None:
        # A checksum alone would make the canonical URL's bytes checked against it: it only
        # means something for a mirror, so a stray one is a mistake to report.
        raise DataError(f"{CIFAR10_SHA256_ENV} is set but {CIFAR10_URL_ENV} is not: a "
                        f"checksum of its own only verifies a mirror; set {CIFAR10_URL_ENV} "
                        f"too, or unset {CIFAR10_SHA256_ENV}")
    if sha is not None and not (len(sha) == 64 and all(c in "0123456789abcdefABCDEF"
                                                       for c in sha)):
        raise DataError(f"{CIFAR10_SHA256_ENV} must be 64 hex digits (a SHA-256), got {sha!r}")
    return url or CIFAR10_URL, (sha or CIFAR10_SHA256).lower()


def _refuse_from_file(option: str) -> ValueError:
    # The "option: message" form is the plug-in contract (asyncsim._registry.call_checked):
    # it is reported as a ScenarioError under data.<option>.
    return ValueError(f"{option}: cannot be set in a scenario (a file someone sends you must "
                      f"not choose what is downloaded and trusted); {_MIRROR_HINT}")


@register_dataset("cifar10")
def cifar10(
    *,
    seed: int,
    path: Path | None = None,
    cache_dir: Path | None = None,
    download: bool = False,
    n_train: int | None = None,
    n_test: int | None = None,
    url: object = None,
    sha256: object = None,
) -> Dataset:
    """CIFAR10 from the standard python tarball ``cifar-10-python.tar.gz``.

    Source order: ``path`` (a tarball or an extracted ``cifar-10-batches-py`` folder) if given;
    else ``<cache_dir>/cifar-10-python.tar.gz`` (``cache_dir`` defaults to
    ``$ASYNCSIM_CACHE`` or ``~/.cache/asyncsim``); if that is missing and ``download = true``,
    :func:`download_source` (the canonical URL, or a mirror named in the environment) is
    fetched there with SHA-256 verification (see :func:`fetch`). Nothing is ever downloaded
    unless ``download`` is true, so tests and CI never touch the network. Relative ``path``
    and ``cache_dir`` in a scenario resolve against the scenario file's folder, ``~`` is
    expanded. ``n_train`` / ``n_test`` keep a subset chosen by ``seed`` (a seeded
    permutation, so the subset is reproducible). Pixels are standardised per channel with
    train statistics (of the subset actually used).

    The batches are unpickled by a loader that admits only the numpy globals a CIFAR10
    batch is made of (:mod:`asyncsim.numerics._cifar10`): a file that names any other global
    is refused with a :class:`DataError` before anything it names is imported or called.

    ``url`` and ``sha256`` are not options: they are parameters only to refuse them, under
    ``data.url`` / ``data.sha256``, with a message pointing to ``$ASYNCSIM_CIFAR10_URL`` and
    ``$ASYNCSIM_CIFAR10_SHA256`` (an unknown-option error would not say where they went).
    """
    for option, value in (("url", url), ("sha256", sha256)):
        if value is not None:
            raise _refuse_from_file(option)
    flag("download", download)
    if path is not None:
        source = Path(path).expanduser().absolute()  # messages name the file looked for
        if not source.exists():
            raise DataError(f"CIFAR10 path {source} does not exist")
    else:
        cache = (Path(cache_dir).expanduser().absolute() if cache_dir is not None
                 else default_cache_dir())
        source = cache / "cifar-10-python.tar.gz"
        if not source.exists():
            if not download:
                raise DataError(
                    f"CIFAR10 not found at {source}; set data.path to a local "
                    f"cifar-10-python.tar.gz, or data.download = true to fetch "
                    f"{os.environ.get(CIFAR10_URL_ENV) or CIFAR10_URL}"
                )
            from_url, checksum = download_source()
            fetch(from_url, source, checksum)
    try:
        xtr, ytr, xte, yte = _cifar10.load(source)
    except _cifar10.CifarFileError as err:
        raise DataError(str(err)) from None
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), 0xC1FA])))
    if n_train is not None:
        n_train = integer("n_train", n_train)
        xtr, ytr = _subset(rng, xtr, ytr, n_train)
    if n_test is not None:
        n_test = integer("n_test", n_test)
        xte, yte = _subset(rng, xte, yte, n_test)
    return _normalise(
        "cifar10", xtr.astype(np.float32) / 255, ytr, xte.astype(np.float32) / 255, yte, 10
    )


def _subset(rng: np.random.Generator, x: np.ndarray, y: np.ndarray, n: int):
    if n > len(x):
        raise ValueError(f"subset of {n} requested from {len(x)} examples")
    idx = np.sort(rng.permutation(len(x))[:n])
    return x[idx], y[idx]
