"""Reading CIFAR10's python batches without running code a file names.

The loader of :func:`asyncsim.numerics.data.cifar10.cifar10`: :func:`load` reads the five
train batches and the test batch from a ``cifar-10-python.tar.gz`` tarball or an extracted
``cifar-10-batches-py`` folder.

Contract: a batch is unpickled by :class:`_CifarUnpickler`, which admits only the globals
CIFAR10's batches are made of (numpy's ``_reconstruct``, ``ndarray`` and ``dtype``, and a
latin-1-only ``_codecs.encode``); any other global (``posix.system``, ``builtins.open``,
``numpy.save``) is refused before it is imported or called. Every problem with a file — a
refused global, a damaged pickle, a batch of the wrong shape or types, a missing member — is
a :class:`CifarFileError` with one line naming the file or member, which the data set's
factory raises as a :class:`~asyncsim.numerics.data.DataError`. (No imports from asyncsim:
how a file is read safely is apart from where it comes from.)
"""

from __future__ import annotations

import io
import pickle
import tarfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from asyncsim._io import DamagedFile, regular_file


class CifarFileError(ValueError):
    """A CIFAR10 file that cannot be used; the message is one line naming it."""


CIFAR_DIR = "cifar-10-batches-py"
TRAIN = [f"data_batch_{i}" for i in range(1, 6)]
TEST = "test_batch"

# What a CIFAR10 python batch is, for the messages that refuse something else.
_CIFAR_HOLDS = ("a CIFAR10 python batch is a pickled dict of b'batch_label' (bytes), b'labels' "
                "(a list of N ints 0-9), b'data' (a uint8 numpy array of shape (N, 3072)) and "
                "b'filenames' (a list of bytes), built only from numpy's _reconstruct, ndarray "
                "and dtype")
# The function numpy's ndarray.__reduce__ names (numpy.core.multiarray._reconstruct before
# numpy 2, numpy._core.multiarray._reconstruct since), taken from numpy itself rather than
# imported by either name: importing numpy.core warns on numpy 2.
_NP_RECONSTRUCT = np.empty(0, np.uint8).__reduce__()[0]


def _latin1_encode(text: Any, encoding: Any = "utf-8", errors: Any = "strict") -> bytes:
    """``_codecs.encode`` only as a Python 3 protocol-2 pickle of ``bytes`` calls it.

    Python 2 writes its ``str`` (the real batches' keys, labels and pixel buffer) with the
    BINSTRING opcodes, but Python 3 has no opcode for ``bytes`` below protocol 3 and writes
    ``_codecs.encode(<latin-1 text>, "latin1")`` instead, so a batch re-pickled by Python 3
    with protocol 2 (as tests/unit/test_data.py's fixture is) needs it. Only that call is
    admitted: any other codec (e.g. one that decompresses) makes the batch a damaged one.
    """
    if not (isinstance(text, str) and encoding in ("latin1", "latin-1") and errors == "strict"):
        raise pickle.UnpicklingError(f"_codecs.encode is admitted only as encode(text, "
                                     f"'latin1'), got encoding {encoding!r}")
    return text.encode("latin-1")


# (module, name) -> the object a CIFAR10 batch may name; nothing else is ever imported.
_CIFAR_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _NP_RECONSTRUCT,  # the real files (numpy 1.x)
    ("numpy._core.multiarray", "_reconstruct"): _NP_RECONSTRUCT,  # re-pickled with numpy 2
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1_encode,  # see _latin1_encode
}


class _Refused(pickle.UnpicklingError):
    """A global outside :data:`_CIFAR_GLOBALS` (raised before anything is imported)."""

    def __init__(self, module: str, name: str):
        super().__init__(f"{module}.{name}")
        self.qualname = f"{module}.{name}"


class _CifarUnpickler(pickle.Unpickler):
    """An unpickler that builds only what a CIFAR10 batch holds.

    ``pickle.loads`` imports and calls whatever global a pickle names (``posix.system``,
    ``builtins.exec``): a data file would run code. Every way a pickle reaches an object
    that is not a plain container or scalar goes through :meth:`find_class` (GLOBAL,
    STACK_GLOBAL, INST and the copyreg EXT opcodes alike; persistent ids are refused by the
    base class), so refusing there every global outside :data:`_CIFAR_GLOBALS` leaves a
    pickle nothing to build but plain containers and scalars, numpy arrays and dtypes, and
    latin-1 ``bytes``.
    """

    def find_class(self, module: str, name: str) -> Any:
        obj = _CIFAR_GLOBALS.get((module, name))
        if obj is None:
            raise _Refused(module, name)
        return obj


def _unpickle(raw: bytes, where: str) -> dict:
    """The batch dict pickled in ``raw`` (``where`` names its file or tarball member).

    Raises:
        CifarFileError: one line naming ``where``: for a global a CIFAR10 batch does not use
            (nothing is imported or called), for a damaged pickle, or for anything but a
            batch dict with a uint8 array of pixels and a list of int labels.
    """
    try:
        # The CIFAR batches are Python 2 pickles: bytes keys need encoding="bytes".
        obj = _CifarUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except _Refused as err:
        raise CifarFileError(f"CIFAR10 batch {where}: refused to unpickle the global "
                        f"{err.qualname}, which a data file has no use for (it could run "
                        f"code); {_CIFAR_HOLDS}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError, OverflowError, MemoryError, RecursionError) as err:
        # A truncated or corrupted file, or numpy refusing a forged array state; the
        # message of some of these spans lines.
        why = " ".join(str(err).split()) or "no details"
        raise CifarFileError(f"CIFAR10 batch {where} is damaged ({type(err).__name__}: {why}); "
                        f"{_CIFAR_HOLDS}") from None
    if not isinstance(obj, dict):
        raise CifarFileError(f"CIFAR10 batch {where} holds a {type(obj).__name__}, not a batch "
                        f"dict; {_CIFAR_HOLDS}")
    data, labels = obj.get(b"data"), obj.get(b"labels")
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2
            and data.shape[1] == 3072 and isinstance(labels, list)
            and len(labels) == len(data) and all(_is_label(v) for v in labels)):
        raise CifarFileError(f"CIFAR10 batch {where} holds b'data' {_kind(data)} and b'labels' "
                        f"{_kind(labels)}; {_CIFAR_HOLDS}")
    return obj


def _is_label(v: Any) -> bool:
    return type(v) is int and 0 <= v < 10  # not a bool, and one of the ten classes


def _kind(value: Any) -> str:
    """What a batch entry is, for a message: ``missing``, ``a float64 array of shape (1,
    3072)``, ``a list of 3 with 0.5``."""
    if value is None:
        return "missing"
    if isinstance(value, np.ndarray):
        return f"a {value.dtype} array of shape {value.shape}"
    if isinstance(value, list):
        bad = [v for v in value if not _is_label(v)][:1]
        return f"a list of {len(value)}" + (f" with {bad[0]!r}" if bad else "")
    return f"a {type(value).__name__}"


def _read_batches(source: Path) -> dict[str, dict]:
    """Read the six batch dicts from a tarball or an extracted ``cifar-10-batches-py`` folder
    (each through :func:`_unpickle`, which runs no code a file names)."""
    names = [*TRAIN, TEST]
    out: dict[str, dict] = {}
    if source.is_dir():
        folder = source / CIFAR_DIR if (source / CIFAR_DIR).is_dir() else source
        for name in names:
            f = folder / name
            if not f.is_file():
                raise CifarFileError(f"CIFAR10 folder {folder} lacks {name}")
            try:
                raw = f.read_bytes()
            except OSError as err:
                raise CifarFileError(f"cannot read CIFAR10 batch {f}: {err}") from None
            out[name] = _unpickle(raw, str(f))
        return out
    try:
        regular_file(source, "tarball")  # not a FIFO (opening it blocks), not /dev/zero
    except DamagedFile as err:
        raise CifarFileError(str(err)) from None
    try:
        with tarfile.open(source, "r:*") as tar:
            members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
            for name in names:
                if name not in members:
                    raise CifarFileError(f"CIFAR10 tarball {source} lacks {CIFAR_DIR}/{name}")
                fobj = tar.extractfile(members[name])
                assert fobj is not None
                out[name] = _unpickle(fobj.read(), f"{members[name].name} in {source}")
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        # One line: tarfile's "could not be opened" lists every method it tried on its own line.
        why = "; ".join(x.strip(" -").rstrip(":") for x in str(err).splitlines() if x.strip())
        raise CifarFileError(f"cannot read CIFAR10 tarball {source} (expected the python version, "
                        f"cifar-10-python.tar.gz): {why}") from err
    return out


def _to_nhwc(batch: dict) -> tuple[np.ndarray, np.ndarray]:
    """Images ``(N, 32, 32, 3)`` and int32 labels of a batch :func:`_unpickle` checked."""
    data, labels = batch[b"data"], np.asarray(batch[b"labels"], np.int32)
    # Rows are 1024 red, 1024 green, 1024 blue values, each plane row-major (CHW).
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def load(source: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_test, y_test)`` of the tarball or folder ``source``: uint8
    images ``(N, 32, 32, 3)`` and int32 labels, the five train batches in order."""
    batches = _read_batches(source)
    parts = [_to_nhwc(batches[name]) for name in TRAIN]
    xte, yte = _to_nhwc(batches[TEST])
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            xte, yte)
