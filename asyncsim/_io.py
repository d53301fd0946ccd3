"""Writing files so that a reader never sees half of one: the one atomic writer.

Every file asyncsim writes into a run folder (the trace's parquet tables, ``summary.json``,
checkpoints, parameters, metrics) goes through :func:`atomic`: it is written under a
temporary name in the same folder and renamed into place, which POSIX makes atomic. So a run
killed at any moment leaves each file either absent, as it was, or complete.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import urllib.error
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np


class WriteError(OSError):
    """A file could not be written (a full disk, a quota, a file-size limit, a read-only
    folder): one line naming the file; its temporary file is gone and the file as it was."""

    def __str__(self) -> str:
        return str(self.strerror)


# What a failed write reports: the storage's refusals, not a caller's other OSErrors (a
# download's URLError passes through the same block).
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO,
                           errno.EACCES, errno.EPERM})


@contextlib.contextmanager
def atomic(path: str | os.PathLike, *, fsync: bool = False) -> Iterator[Path]:
    """``with atomic(p) as tmp: write tmp`` -> ``tmp`` renamed to ``p`` when the block ends
    without an exception (``fsync``: flushed to disk first, for checkpoints); on an exception
    the temporary file is removed and ``p`` is untouched. A write the storage refuses (full
    disk, ...) raises :class:`WriteError`, so a megabyte checkpoint cut short never stays on
    a full disk and the user reads one line, not a traceback."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if isinstance(e, WriteError) or not _refused(e):
            raise
        raise WriteError(e.errno, f"cannot write {path}: {e.strerror or e}") from e
    finally:
        tmp.unlink(missing_ok=True)


def _refused(e: OSError) -> bool:
    if e.errno in _WRITE_ERRNOS:
        return True
    # pyarrow's IOError carries no errno, only the system's message (a download's URLError,
    # which has none either, is not a write).
    return (e.errno is None and not isinstance(e, urllib.error.URLError)
            and any(os.strerror(n) in str(e) for n in _WRITE_ERRNOS))


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(jsonable(obj), indent=2, sort_keys=True) + "\n")


def jsonable(x: Any) -> Any:
    """``x`` with numpy scalars as Python numbers, paths as strings and non-finite floats as
    ``None`` (NaN) or ``"inf"``/``"-inf"`` (JSON has neither)."""
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, Path):
        return str(x)
    return x


# ----------------------------------------------------------------------------- TOML out
def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if math.isnan(v):
            return "nan"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        if not v:
            return "{}"
        return "{ " + ", ".join(f"{_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def _key(k: str) -> str:
    return k if k.replace("-", "").replace("_", "").isalnum() else json.dumps(k)


def dump_toml(d: Mapping[str, Any], _prefix: str = "") -> str:
    """A small TOML writer (tomllib only reads): a table's scalars, then its sub-tables."""
    scalars = [(k, v) for k, v in d.items() if not (isinstance(v, Mapping) and v)]
    tables = [(k, v) for k, v in d.items() if isinstance(v, Mapping) and v]
    out = [f"[{_prefix}]"] if _prefix and scalars else []
    out += [f"{_key(k)} = {_toml_value(v)}" for k, v in scalars]
    for k, v in tables:
        out += ["", dump_toml(v, f"{_prefix}.{_key(k)}" if _prefix else _key(k)).rstrip("\n")]
    return "\n".join(out).strip("\n") + "\n"
