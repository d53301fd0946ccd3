"""The real CIFAR10 from the standard python tarball, at a local path, in the cache, or
downloaded (only when asked) from its canonical address with SHA-256 verification.

A data file runs no code: the batches are unpickled admitting only the numpy globals CIFAR10
is made of (:mod:`.cifar10_batches`), and what is downloaded and trusted (URL, checksum)
comes from code or the environment, never a scenario file.
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
from pathlib import Path

import numpy as np

from asyncsim._checks import flag, integer
from asyncsim._io import atomic
from asyncsim.numerics.data import cifar10_batches
from asyncsim.numerics.data.dataset import DataError, Dataset, normalised
from asyncsim.numerics.data.registry import register_dataset

__all__ = ["CIFAR10_SHA256", "CIFAR10_URL", "cifar10", "default_cache_dir", "download_source",
           "fetch"]


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
    batch is made of (:mod:`.cifar10_batches`): a file that names any other global
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
        xtr, ytr, xte, yte = cifar10_batches.load(source)
    except cifar10_batches.CifarFileError as err:
        raise DataError(str(err)) from None
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), 0xC1FA])))
    if n_train is not None:
        n_train = integer("n_train", n_train)
        xtr, ytr = _subset(rng, xtr, ytr, n_train)
    if n_test is not None:
        n_test = integer("n_test", n_test)
        xte, yte = _subset(rng, xte, yte, n_test)
    return normalised(
        "cifar10", xtr.astype(np.float32) / 255, ytr, xte.astype(np.float32) / 255, yte, 10
    )


def _subset(rng: np.random.Generator, x: np.ndarray, y: np.ndarray, n: int):
    if n > len(x):
        raise ValueError(f"subset of {n} requested from {len(x)} examples")
    idx = np.sort(rng.permutation(len(x))[:n])
    return x[idx], y[idx]
