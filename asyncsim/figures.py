"""``asyncsim figures``: draw paper figures from existing run folders only.

Each figure has one scenario ``scenarios/NAME.toml`` (a sweep with ``[figure] name = NAME``)
and one module ``analysis/NAME.py`` (installed as ``asyncsim.analysis.NAME``) exposing::

    def draw(sweep_dir: pathlib.Path, out_dir: pathlib.Path) -> list[pathlib.Path]

which reads the sweep's ``index.csv`` and run folders (never reruns a simulation) and writes
``out_dir/NAME.png`` plus the plotted data as ``out_dir/NAME.csv``. A module that draws one
run folder instead of a sweep (the quickstart) says ``DRAWS = "run"``, so that a scenario
naming it is checked to fit before it runs (:func:`check_figure_fits`; ``DRAWS`` is read
from the module's source, so this check imports no plotting library). The run folders of a
figure live in ``runs/NAME`` (``runs/NAME-smoke`` etc. for other profiles).

``asyncsim run`` draws its scenario's figure in a :class:`FigureWorker`: a second process,
started before the run, that imports the figure's module (matplotlib: about half a second)
while the run computes, then draws when the run folder is complete -- the same code on the
same folder, so the same files; where the worker fails, the figure is drawn here instead.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from asyncsim import _io, runs
from asyncsim.errors import ScenarioError, did_you_mean


def drawable_figures() -> list[str]:
    """Every figure name ``asyncsim figures NAME`` and ``[figure] name`` accept: the modules
    of the figure package ``asyncsim.analysis`` (the repository's ``analysis/``; names
    starting with ``_`` are shared helpers). Only these names are ever imported: a name
    read from a scenario file or a run folder never reaches a file path. Listing them
    imports nothing of the package (its modules import matplotlib)."""
    return sorted(m.name for m in pkgutil.iter_modules(_analysis_path())
                  if not m.name.startswith("_"))


def _analysis_path() -> list[str]:
    spec = importlib.util.find_spec("asyncsim.analysis")  # imports asyncsim only
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the figure package asyncsim.analysis is not installed")
    return list(spec.submodule_search_locations)


def check_figure(name: object, *, key: str = "figure.name", file: str | None = None) -> str:
    """``name`` if it is a registered figure (:func:`drawable_figures`); else a one-line
    ScenarioError under ``key`` listing them. ``asyncsim run`` checks a scenario's
    ``[figure] name`` with it before running anything, ``asyncsim figures`` its arguments."""
    drawable = drawable_figures()
    if not isinstance(name, str) or name not in drawable:
        raise ScenarioError(key, f"unknown figure {name!r}; figures: "
                            f"{', '.join(drawable) or '(none)'}"
                            f"{did_you_mean(str(name), drawable)}", file=file)
    return name


def check_figure_fits(name: str, scn) -> None:
    """Refuse, before running, a figure that cannot be drawn from what ``scn`` writes: a
    figure of one run folder (its module's ``DRAWS = "run"``) for a sweep, or a sweep's
    figure for a single run."""
    draws = figure_draws(name)
    if draws == "run" and scn.sweep:
        raise ScenarioError("figure.name", f"{name!r} draws one run folder; this scenario "
                            "is a sweep: name a sweep's figure or remove [figure]")
    if draws == "sweep" and not scn.sweep:
        raise ScenarioError("figure.name", f"{name!r} draws a sweep; this scenario is a "
                            "single run (no [sweep]): add its sweep or remove [figure]")


def figure_draws(name: str) -> str:
    """What figure ``name`` draws, ``"run"`` or ``"sweep"`` (the default): its module's
    top-level ``DRAWS = "..."``, read from the source without running it (a run checks this
    before it starts; importing the module would import matplotlib)."""
    name = check_figure(name)
    for folder in _analysis_path():
        src = Path(folder) / f"{name}.py"
        if src.is_file():
            break
    else:  # a compiled-only install: import it
        return getattr(load_analysis(name), "DRAWS", "sweep")
    for node in ast.parse(src.read_text(encoding="utf-8")).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "DRAWS"):
            if not (isinstance(node.value, ast.Constant) and node.value.value in ("run", "sweep")):
                raise ValueError(f"{src}: DRAWS must be the literal 'run' or 'sweep'")
            return node.value.value
    return "sweep"


def load_analysis(name: str) -> ModuleType:
    return importlib.import_module(f"asyncsim.analysis.{check_figure(name)}")


def sweep_dir(name: str, runs_dir: str | Path = "runs", profile: str | None = None) -> Path:
    return runs.sweep_out(name, profile, runs_dir)


def figure_runs(name: str, runs_dir: str | Path = "runs",
                profile: str | None = None) -> Path | None:
    """Where ``asyncsim run scenarios/NAME.toml [--profile P]`` left what figure NAME is
    drawn from: the sweep folder ``runs/NAME[-P]``, or for a single-run scenario such as the
    quickstart its run folder ``runs/NAME[-P]/seedN`` (the lowest seed there); None if
    there is no such folder."""
    d = sweep_dir(name, runs_dir, profile)
    if not d.is_dir():
        return None
    if (d / runs.SWEEP_INDEX).exists() or (d / _io.SUMMARY).exists():
        return d
    seeds = [p for p in d.glob("seed*") if p.name[4:].isdigit() and (p / _io.SUMMARY).exists()]
    return min(seeds, key=lambda p: int(p.name[4:])) if seeds else d


def figure_out(source: Path, profile: str | None) -> Path:
    """Where a figure drawn from the run folders at ``source`` goes by default:
    ``figures/`` for the default profile; for another, the sweep folder's ``figures/`` or
    the run folder itself (as ``asyncsim run --profile P`` draws it)."""
    if profile in (None, "default"):
        return Path("figures")
    return _figures_in(source)


def _figures_in(source: Path) -> Path:
    """The one place inside the run folders at ``source`` that figures are drawn into: the
    sweep folder's ``figures/``, or a single run's folder itself."""
    return source if (source / _io.SUMMARY).exists() else source / "figures"


def _check_target(target: Path, source: Path) -> None:
    """Figures drawn from ``source`` go into ``target`` (``--out``): refused in one line when
    that lies in a run or sweep folder other than at :func:`_figures_in` ``source`` (a file
    drawn into a sweep folder's root, or into another run, is one its run never wrote)."""
    home = runs.run_folder_of(target / "figure.png")
    own = _figures_in(source)
    if home is not None and target.resolve() != own.resolve():
        where = "" if target.resolve() == home else "inside "
        kind = "sweep" if (home / runs.SWEEP_INDEX).exists() else "run"
        raise ScenarioError("--out", f"{target} is {where}the {kind} folder {home}, whose "
                            f"files only its {kind} writes (figures drawn from {source} go "
                            f"there only into {own}); choose a folder elsewhere",
                            file="asyncsim figures")


def draw_figure(name: str, sweep: str | Path, out: str | Path = "figures") -> list[Path]:
    """Draw figure ``name`` from the run folders at ``sweep`` into ``out``; a figure that
    cannot be drawn (a damaged run folder) leaves no ``out`` folder it created."""
    module = load_analysis(name)
    out = Path(out)
    created = not out.exists()
    _io.make_folder(out)
    try:
        return module.draw(Path(sweep), out)
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()  # only if empty: a figure drawn before the failure stays
        raise


def draw_figures(names: list[str] | None, *, runs_dir: str | Path = "runs",
                 out: str | Path | None = None, profile: str | None = None) -> list[Path]:
    """Draw each named figure (default: every one whose runs exist) from its run folders,
    into ``out``; by default ``figures/`` for the default profile, and for another profile
    beside its runs (:func:`figure_out`), so smoke-scale figures never replace the
    committed ones."""
    written: list[Path] = []
    drawable = drawable_figures()
    for name in names or []:
        check_figure(name, key="", file=name)
    todo = []
    for name in names or drawable:
        d = figure_runs(name, runs_dir, profile)
        if d is None:
            if names:
                flag = "" if profile in (None, "default") else f" --profile {profile}"
                raise ScenarioError("", f"no runs in {sweep_dir(name, runs_dir, profile)}; run "
                                    f"`asyncsim run scenarios/{name}.toml{flag}` first",
                                    file=name)
            continue
        if out is None:
            target = figure_out(d, profile)  # its own place, whatever folder holds runs/
        else:
            target = Path(out)
            _check_target(target, d)  # every figure's, before any is drawn
        todo.append((name, d, target))
    for name, d, target in todo:
        inside = target.resolve().is_relative_to(d.resolve())
        # Drawn into the runs' folder: as its one writer (a sweep may still be running).
        with runs.locked(d) if inside else contextlib.nullcontext():
            written += draw_figure(name, d, target)
    if not names and not written:
        raise ScenarioError("", f"no figure to draw: {Path(runs_dir)} holds runs of none of "
                            f"{', '.join(drawable)}; run `asyncsim run scenarios/NAME.toml` "
                            "first", file="asyncsim figures")
    return written


class FigureWorker:
    """A process that imports figure ``name``'s module now and draws it later.

    ``asyncsim run`` starts one for a run whose scenario names a figure, before it imports
    JAX (:func:`asyncsim.cli.commands.early_worker`), so that the figure's imports
    (matplotlib, about half a second of every such run) overlap its own instead of following
    the run; :meth:`draw` then hands it the finished run folder and waits.
    It runs :func:`draw_figure` on the same folder, so it writes the same files; if it
    fails in any way (it died, it could not import, the figure raised), :meth:`draw` draws
    the figure in this process instead, so a figure's error is raised here as without the
    worker. A worker never used is ended (:meth:`close`) without drawing.
    """

    def __init__(self, name: str):
        self.name = check_figure(name)
        try:
            self._proc: subprocess.Popen | None = subprocess.Popen(
                [sys.executable, "-m", "asyncsim.figures", "--serve", self.name],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True)
        except (OSError, ValueError, TypeError):  # no interpreter to start: drawn here
            self._proc = None

    def draw(self, sweep: str | Path, out: str | Path = "figures") -> list[Path]:
        """:func:`draw_figure` ``(name, sweep, out)``, in the worker where it can."""
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                reply, _ = proc.communicate(json.dumps([str(sweep), str(out)]) + "\n")
                if proc.returncode == 0:
                    return [Path(p) for p in json.loads(reply)["paths"]]
            except (OSError, ValueError, KeyError, TypeError):
                proc.kill()
                proc.wait()
        return draw_figure(self.name, sweep, out)

    def close(self) -> None:
        """End a worker that was not used (the run failed or was refused), at once: it has
        written nothing (its warm-up draws to memory), and waiting for it to finish its
        imports would delay the run's error message by a second."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            try:
                proc.communicate(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()

    def __enter__(self) -> FigureWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _serve(name: str) -> int:
    """The worker's side: import the figure's module, wait for ``[sweep, out]`` on stdin,
    draw, reply ``{"paths": [...]}`` on stdout. Exit status 1 tells the caller to draw the
    figure itself (so its errors and warnings reach the user as without the worker)."""
    reply, sys.stdout = sys.stdout, sys.stderr  # the reply is the only thing on stdout
    load_analysis(name)
    _warm_up()
    line = sys.stdin.readline()
    if not line:
        return 0  # not needed after all
    sweep, out = json.loads(line)
    try:
        paths = draw_figure(name, sweep, out)
    except BaseException:  # noqa: BLE001 - the caller redraws and reports it
        return 1
    reply.write(json.dumps({"paths": [str(p) for p in paths]}))
    reply.flush()
    # Its files are written and closed: skip the interpreter's teardown of matplotlib,
    # pandas and JAX (a tenth of a second or more that the caller would wait for).
    os._exit(0)


def _warm_up() -> None:
    """Pay, while the run computes, what the figure's first draw would pay after it:
    matplotlib's first-draw costs (fonts loaded, text laid out, the PNG writer), drawing a
    throwaway figure to a buffer, and the run folder's readers' imports (pyarrow's parquet
    and dataset modules, pandas' parquet and CSV code: ~20 ms on first use), reading and
    writing a tiny table. Its own Figure, outside pyplot's figure list, so the real figure
    is drawn as in a fresh process. One pass, as analysis/quickstart.py draws."""
    import io

    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3))
    FigureCanvasAgg(fig)
    a, b = fig.subplots(1, 2)
    a.plot([0.0, 1.0], [0.0, 1.0], marker="o", ms=3)
    a.set_xlabel("simulated time τ")
    b.bar([0, 1], [0.5, 0.5])
    b.set_title("mean 0.00", fontsize=9)
    fig.suptitle("warm-up", fontsize=8)
    fig.text(0.0, 0.0, "caption", fontsize=7)
    fig.savefig(io.BytesIO(), format="png", dpi=100)
    buf = io.BytesIO()
    pq.write_table(pa.table({"a": pa.array([0], pa.int64())}), buf)
    pd.read_parquet(io.BytesIO(buf.getvalue())).to_csv(io.StringIO(), index=False)


if __name__ == "__main__":  # python -m asyncsim.figures --serve NAME (FigureWorker)
    if len(sys.argv) != 3 or sys.argv[1] != "--serve":
        sys.exit("usage: python -m asyncsim.figures --serve NAME")
    from asyncsim._process import tune_gc

    tune_gc()  # (its imports: 0.10-0.14 s of collections with the defaults, 0.05 s with it)
    sys.exit(_serve(sys.argv[2]))
