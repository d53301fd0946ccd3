"""A run folder's files: the one atomic writer, the one remover and the one reader.

Every file asyncsim writes into a run folder (the trace's parquet tables, ``summary.json``,
checkpoints, parameters, metrics) goes through :func:`atomic`: it is written under a
temporary name in the same folder and renamed into place, which POSIX makes atomic. So a run
killed at any moment leaves each file either absent, as it was, or complete.

None of them follows a symbolic link out of a run folder (:func:`no_link`): a folder someone
sent may carry links to anywhere, so a write, a new folder or the lock through a link inside
a run folder is refused in one line, and :func:`remove` removes a link, never its target.

Every such file is read back through :func:`read` (``read_json``, ``read_toml``,
``read_csv``, ``read_parquet``, ``read_npz``): a file that is missing, empty, truncated or
garbled (a disk error, a hand edit, a half-copied folder), or not a regular file of a sane
size (a FIFO, /dev/zero: :func:`regular_file`), is a :class:`DamagedFile`, one line naming
the file, what is wrong and what to do, never a parser's traceback or a hang.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import stat
import urllib.error
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np


class WriteError(OSError):
    """A file could not be written (a full disk, a quota, a file-size limit, a read-only
    folder): one line naming the file; its temporary file is gone and the file as it was."""

    def __str__(self) -> str:
        return str(self.strerror)


class DamagedFile(ValueError):
    """A run-folder file that cannot be read as what it should be: one line naming it."""


# What a failed write reports: the storage's refusals, not a caller's other OSErrors (a
# download's URLError passes through the same block).
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO,
                           errno.EACCES, errno.EPERM})


# ----------------------------------------------------------------------------- links
# The names of a run folder's files (docs/run-folders.md) and of a sweep folder's index.
PROVENANCE = "provenance.json"
SCENARIO_TOML = "scenario.toml"  # the scenario the run ran, resolved
PARAMS = "params.npz"  # the final parameters
SUMMARY = "summary.json"
TRACE_META = "trace_meta.json"
SWEEP_INDEX = "index.csv"

# Files only asyncsim writes: a folder holding one is a run folder (provenance.json comes with
# its start, summary.json with its end, trace_meta.json with its trace) or a sweep folder
# (index.csv). Not its lock: ".lock" is a common name, and a folder is marked as written by
# this process while it holds the lock (:func:`writing`).
RUN_MARKS = (PROVENANCE, SUMMARY, TRACE_META, SWEEP_INDEX)

# The run folders this process holds the lock of (asyncsim.runs.locked), as absolute paths
# (links not resolved): a folder so new that it holds no mark yet is a run folder too.
_WRITING: set[Path] = set()


class LinkInFolder(DamagedFile):
    """A symbolic link inside a run folder where asyncsim would write or remove: refused in
    one line naming the link, since a folder someone sent may carry a link to anywhere."""


@contextlib.contextmanager
def writing(folder: str | os.PathLike) -> Iterator[None]:
    """Mark ``folder`` as a run folder this process writes, for the block (the lock's
    holder, asyncsim.runs.locked), so :func:`no_link` guards it before it has a mark."""
    key = Path(os.path.abspath(folder))
    added = key not in _WRITING
    _WRITING.add(key)
    try:
        yield
    finally:
        if added:
            _WRITING.discard(key)


def run_root(path: str | os.PathLike) -> Path | None:
    """The outermost run or sweep folder ``path`` lies in, read lexically (no link is
    followed; the folder itself may be reached through links, the user's own): an ancestor
    that holds one of :data:`RUN_MARKS` or that this process is writing. None outside any."""
    root = None
    for d in Path(os.path.abspath(path)).parents:
        if d in _WRITING or any(os.path.lexists(d / m) for m in RUN_MARKS):
            root = d
    return root


def no_link(path: str | os.PathLike) -> Path:
    """``path``, once it is certain that writing, creating or removing it follows no link out
    of the run folder it lies in (:func:`run_root`): neither ``path`` nor any folder between
    that run folder and it is a symbolic link. Otherwise a one-line :class:`LinkInFolder`
    naming the link. Outside any run folder nothing is checked: links there are the
    user's own. The one check of every writer here (:func:`atomic`, :func:`make_folder`) and
    of the lock (asyncsim.runs.locked)."""
    path = Path(path)
    given = Path(os.getcwd(), path)  # absolute, with any ".." kept (Path keeps them)
    if ".." in given.parts:
        # "RUN/link/../x" reads as RUN/x but goes through the link: every prefix as given
        # is checked, and a link that lies in any run folder is refused.
        for i in range(2, len(given.parts) + 1):
            q = Path(*given.parts[:i])
            if q.is_symlink() and (root := run_root(q)) is not None:
                raise link_refused(q, root)
        return path
    root = run_root(path)
    if root is None:
        return path
    absolute = Path(os.path.abspath(path))
    for p in (*reversed(absolute.parents), absolute):
        if len(p.parts) > len(root.parts) and p.is_symlink():
            raise link_refused(p, root)
    return path


def no_links_inside(folder: str | os.PathLike) -> None:
    """Refuse, in one line naming the first, a run folder that holds a symbolic link
    anywhere inside it: a run resumed there would write through it (the links are not
    followed while looking)."""
    folder = Path(folder)
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            raise link_refused(p, folder)


def link_refused(link: Path, root: Path) -> LinkInFolder:
    """The one-line refusal of ``link``, a symbolic link inside the run folder ``root``."""
    return LinkInFolder(f"{link}: a symbolic link inside the run folder {root}, where asyncsim "
                        "writes; it follows no link out of a run folder: remove the link")


def make_folder(folder: str | os.PathLike) -> Path:
    """``folder`` and its missing parents, created (no error if they exist) once
    :func:`no_link` allows it: a missing folder below a link would be created wherever the
    link points."""
    folder = no_link(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def remove(path: str | os.PathLike) -> None:
    """Remove ``path``: a file, or a folder with everything in it. A symbolic link is removed
    itself, never what it points to (a run folder's ``inputs`` linked to someone's folder
    loses the link, not their files). The one remover of run folders (``--force``, a run
    stopped by bad input)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        for p in path.iterdir():
            remove(p)
        path.rmdir()
    else:
        path.unlink()


@contextlib.contextmanager
def atomic(path: str | os.PathLike, *, fsync: bool = False) -> Iterator[Path]:
    """``with atomic(p) as tmp: write tmp`` -> ``tmp`` renamed to ``p`` when the block ends
    without an exception (``fsync``: flushed to disk first, for checkpoints); on an exception
    the temporary file is removed and ``p`` is untouched. A write the storage refuses (full
    disk, ...) raises :class:`WriteError`, so a megabyte checkpoint cut short never stays on
    a full disk and the user reads one line, not a traceback. Inside a run folder, a path
    through a symbolic link is refused first (:func:`no_link`); a file left at the temporary
    name (a killed write, or a planted link) is removed, never written through."""
    path = no_link(path)
    tmp = path.with_name(f".{path.name}.tmp")
    if os.path.lexists(tmp):
        tmp.unlink()
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if isinstance(e, WriteError) or not _refused(e):
            raise
        raise WriteError(e.errno, f"cannot write {path}: {e.strerror or e}"
                         f"{_space(path.parent, tmp)}") from e
    finally:
        tmp.unlink(missing_ok=True)


def _space(folder: Path, tmp: Path) -> str:
    """What the failed write needed and what there was: the bytes it had written, the
    space free where it writes."""
    import shutil

    try:
        done = tmp.stat().st_size
        free = shutil.disk_usage(folder).free
    except OSError:
        return ""
    return (f" (it needed more than the {done / 2**20:.3g} MiB written; "
            f"{free / 2**20:.3g} MiB free in {folder})")


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


def write_parquet(path: str | os.PathLike, columns: Mapping[str, Any]) -> None:
    """A table of equal-length columns (arrays or sequences, each keeping its numpy dtype)
    as a parquet file: how every run-folder table is written (pyarrow, snappy, no index).

    Written with pyarrow directly, not through a pandas DataFrame: a run then never imports
    pandas, about 0.2 s of every ``asyncsim run``'s start-up (benchmarks/bench_startup.py).
    ``read_parquet`` (pandas) reads it back as the DataFrame of ``columns``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_arrays([_arrow(pa, np.asarray(v)) for v in columns.values()],
                                 names=list(columns))
    with atomic(path) as tmp:
        pq.write_table(table, tmp)


def save_figure(fig, path: str | os.PathLike, **savefig: Any) -> Path:
    """``fig.savefig(path, **savefig)``, atomically (a killed draw never leaves half a PNG
    where a figure was), in the format ``path``'s suffix names; creates missing folders.
    Every figure asyncsim writes goes through here."""
    path = Path(path)
    make_folder(path.parent)
    with atomic(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".").lower() or "png", **savefig)
    return path


def _arrow(pa, a: np.ndarray):
    """A numpy column as an arrow array. Numbers are wrapped around their buffer: ``pa.array``
    would import pandas (pyarrow checks every input for a pandas object)."""
    if a.dtype.kind in "iuf" and a.ndim == 1:
        # Arrow's buffers are little-endian and contiguous: a column that is not is copied.
        a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        return pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), len(a),
                                     [None, pa.py_buffer(a)])
    return pa.array(a)


def csv_text(columns: Mapping[str, Any]) -> str:
    """The CSV text of a table of numbers: what ``pandas.DataFrame(columns).to_csv(
    index=False)`` writes (tested), without pandas (see :func:`write_parquet`).

    Each column is typed as pandas types it: all booleans -> ``True``/``False``; all
    integers -> integers; otherwise numbers -> float64, written shortest round-trip
    (``repr``), NaN and ``None`` as an empty field."""
    import csv
    import io

    names = list(columns)
    cells = [_csv_cells(list(columns[k])) for k in names]
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")  # pandas' writer: quoted where needed
    out.writerow(names)
    out.writerows(zip(*cells, strict=True))
    return buf.getvalue()


def _csv_cells(values: list) -> list[str]:
    def kind(v) -> str:
        if isinstance(v, bool | np.bool_):
            return "bool"
        if isinstance(v, int | np.integer):
            return "int"
        return "float"

    kinds = {kind(v) for v in values}
    if kinds == {"bool"} or kinds == {"int"}:
        return [str(int(v) if kinds == {"int"} else bool(v)) for v in values]
    if "bool" in kinds:
        raise TypeError("csv_text: a column mixes booleans with numbers")
    out = []
    for v in values:
        x = math.nan if v is None else float(v)
        out.append("" if math.isnan(x) else repr(x))
    return out


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
def toml_value(v: Any) -> str:
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
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        if not v:
            return "{}"
        return "{ " + ", ".join(f"{_key(k)} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def _key(k: str) -> str:
    return k if k.replace("-", "").replace("_", "").isalnum() else json.dumps(k)


def dump_toml(d: Mapping[str, Any], _prefix: str = "") -> str:
    """A small TOML writer (tomllib only reads): a table's scalars, then its sub-tables."""
    scalars = [(k, v) for k, v in d.items() if not (isinstance(v, Mapping) and v)]
    tables = [(k, v) for k, v in d.items() if isinstance(v, Mapping) and v]
    out = [f"[{_prefix}]"] if _prefix and scalars else []
    out += [f"{_key(k)} = {toml_value(v)}" for k, v in scalars]
    for k, v in tables:
        out += ["", dump_toml(v, f"{_prefix}.{_key(k)}" if _prefix else _key(k)).rstrip("\n")]
    return "\n".join(out).strip("\n") + "\n"


# ----------------------------------------------------------------------------- reading
# What to do about a damaged file of a run folder (a checkpoint's callers say "start over").
REDO = "redo the run that wrote it with --force (or resume it, if it is unfinished)"


def damaged(label: str, why: BaseException | str, advice: str = REDO) -> DamagedFile:
    """The one-line :class:`DamagedFile` of ``label`` (a file, and what it is): ``why`` a
    parser's exception (its type and first 160 characters) or a text."""
    if isinstance(why, BaseException):
        text = " ".join(str(why).split())[:160] or type(why).__name__
        why = f"{type(why).__name__}: {text}"
    return DamagedFile(f"{label}: damaged ({why}); {advice}")


def _label(path: Path, what: str | None) -> str:
    return f"{path}" + (f" ({what})" if what else "")


# The most the reader takes of a file of each kind: far above what asyncsim writes (a
# scenario is a few KiB, a 10^8-gradient trace a few GiB), far below what would exhaust a
# machine's memory. A larger file is refused before a byte of it is read.
MAX_BYTES = {"json": 64 * 2**20, "toml": 16 * 2**20, "csv": 4 * 2**30,
             "parquet": 16 * 2**30, "npz": 16 * 2**30, "tarball": 4 * 2**30}

# What a path that is not a regular file is, for the message.
_FILE_TYPES = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISSOCK, "a socket"))


def _mib(n: int) -> str:
    return f"{n / 2**20:.4g} MiB"


def regular_file(path: str | os.PathLike, kind: str, *, what: str | None = None) -> int:
    """The size of ``path``, a regular file (a symbolic link to one is followed) of at most
    ``MAX_BYTES[kind]``; anything else -- a FIFO, whose opening blocks, a device such as
    /dev/zero, which never ends, a folder, a file too large -- is a one-line
    :class:`DamagedFile`, raised from ``os.stat`` alone, before the file is opened. The
    stat's own errors (``FileNotFoundError``, ...) pass through. The one check of every
    file asyncsim reads: :func:`read` makes it; so must a reader of its own (a scenario
    file, a delay model's CSV)."""
    path = Path(path)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        is_a = next((name for test, name in _FILE_TYPES if test(st.st_mode)), "an unknown kind")
        raise DamagedFile(f"{_label(path, what)}: not a regular file ({is_a}); allowed: a "
                          "regular file (a symbolic link to one is followed)")
    if st.st_size > MAX_BYTES[kind]:
        raise DamagedFile(f"{_label(path, what)}: {_mib(st.st_size)}; allowed: a {kind} file "
                          f"of at most {_mib(MAX_BYTES[kind])}")
    return st.st_size


def read(path: str | os.PathLike, kind: str, *, what: str | None = None,
         columns: list[str] | None = None) -> Any:
    """Read ``path`` as ``kind`` (``"json"``: a JSON object; ``"toml"``; ``"csv"`` and
    ``"parquet"``: a DataFrame, ``columns``: only those; ``"npz"``: a dict of arrays, no
    pickles), or raise a one-line :class:`DamagedFile` (``what``: what the file is, for the
    message). Only a regular file of at most ``MAX_BYTES[kind]`` is read
    (:func:`regular_file`)."""
    path = Path(path)
    label = _label(path, what)
    try:
        regular_file(path, kind, what=what)
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DamagedFile(f"{label}: missing; {REDO}") from None
    except OSError as e:
        raise DamagedFile(f"{label}: cannot be read: {e.strerror or e}") from None
    if not raw:
        raise DamagedFile(f"{label}: empty; {REDO}")
    try:
        return _READERS[kind](raw, label, columns)
    except (DamagedFile, MemoryError):
        raise  # out of memory is this machine's limit, not damage to the file
    except RecursionError:  # tomllib and json recurse per level of nesting
        raise damaged(label, "nested too deeply") from None
    except Exception as e:  # every parser's own error: the file is not what it should be
        raise damaged(label, e) from None


def read_json(path, **kw) -> dict[str, Any]:
    return read(path, "json", **kw)


def read_toml(path, **kw) -> dict[str, Any]:
    return read(path, "toml", **kw)


def read_csv(path, **kw):
    return read(path, "csv", **kw)


def read_parquet(path, **kw):
    """``columns=[...]``: only those (a missing one is damage)."""
    return read(path, "parquet", **kw)


def read_npz(path, **kw) -> dict[str, np.ndarray]:
    return read(path, "npz", **kw)


def array_hash(arrays: Iterable[Any]) -> str:
    """SHA-256 over, for each array in order, its dtype, its shape and its bytes in C order:
    equal hashes, equal arrays (:func:`asyncsim.numerics.core.param_hash` of a pytree's
    leaves; :func:`read_params` checks a folder's params.npz with it)."""
    h = hashlib.sha256()
    for leaf in arrays:
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def read_params(folder: str | os.PathLike) -> dict[str, np.ndarray]:
    """A run folder's ``params.npz`` (its leaves by pytree path, in tree order), checked
    against the ``param_hash`` its ``summary.json`` records where the run finished: weights
    edited after the run are a one-line DamagedFile, never read as the run's."""
    path = Path(folder) / PARAMS
    z = read_npz(path, what="the final parameters")
    summary = Path(folder) / SUMMARY
    if not summary.exists():
        return z  # an unfinished run: no record yet (its checkpoint is what resumes)
    recorded = read_json(summary).get("param_hash")
    if not isinstance(recorded, str):
        raise damaged(summary, "no param_hash, the record params.npz is checked against")
    if any(a.dtype.kind == "V" for a in z.values()):
        # npz keeps an extension dtype's bytes, not its name (bfloat16 comes back as raw
        # 2-byte records), so the hash of what was saved cannot be recomputed from it.
        return z
    got = array_hash(z.values())
    if got != recorded:
        raise DamagedFile(f"{path}: does not match the param_hash summary.json records "
                          f"({recorded[:12]}…; its arrays hash to {got[:12]}…): the "
                          f"parameters were changed after the run wrote them; {REDO}")
    return z


def npz_member(path, name: str | None = None, *, what: str | None = None,
               advice: str = REDO) -> np.ndarray | None:
    """One member of an npz archive, read without decompressing the others (``name=None``:
    only check that the archive opens); a missing or damaged archive, or member, is a
    one-line :class:`DamagedFile`."""
    path = Path(path)
    label = _label(path, what)
    try:
        regular_file(path, "npz", what=what)
        with np.load(path, allow_pickle=False) as z:
            return None if name is None else z[name]
    except DamagedFile:
        raise
    except FileNotFoundError:
        raise DamagedFile(f"{label}: missing; {advice}") from None
    except MemoryError:
        raise
    except Exception as e:
        raise damaged(label, e, advice) from None


def _json(raw: bytes, label: str, columns=None) -> dict[str, Any]:
    obj = json.loads(raw.decode())
    if not isinstance(obj, dict):
        raise damaged(label, "not a JSON object")
    return obj


def _toml(raw: bytes, label: str, columns=None) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(raw.decode())


def _csv(raw: bytes, label: str, columns=None):
    import csv
    import io

    import pandas as pd  # imported here: this module is on the CLI's fast error path

    text = raw.decode()
    # A truncated table parses: its last row is short (pandas fills NaN) or cut mid-number.
    rows = list(csv.reader(io.StringIO(text)))
    if not text.endswith("\n") or any(len(r) != len(rows[0]) for r in rows[1:]):
        raise damaged(label, "truncated: a row has fewer fields than the header, or the "
                      "last line is cut")
    return pd.read_csv(io.StringIO(text))


def _parquet(raw: bytes, label: str, columns: list[str] | None = None):
    import io

    import pandas as pd

    return pd.read_parquet(io.BytesIO(raw), columns=columns)


def _npz(raw: bytes, label: str, columns=None) -> dict[str, np.ndarray]:
    import io

    with np.load(io.BytesIO(raw), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


# kind -> reader(raw bytes, label for messages, columns: what of a table to read, or None).
_READERS = {"json": _json, "toml": _toml, "csv": _csv, "parquet": _parquet, "npz": _npz}
