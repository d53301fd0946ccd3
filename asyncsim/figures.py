"""``asyncsim figures``: draw paper figures from existing run folders only.

Each figure has one scenario ``scenarios/NAME.toml`` (a sweep with ``[figure] name = NAME``)
and one module ``analysis/NAME.py`` (installed as ``asyncsim.analysis.NAME``) exposing::

    def draw(sweep_dir: pathlib.Path, out_dir: pathlib.Path) -> list[pathlib.Path]

which reads the sweep's ``index.csv`` and run folders (never reruns a simulation) and writes
``out_dir/NAME.png`` plus the plotted data as ``out_dir/NAME.csv``. A module that draws one
run folder instead of a sweep (the quickstart) says ``DRAWS = "run"``, so that a scenario
naming it is checked to fit before it runs (:func:`check_figure_fits`). The run folders of a
figure live in ``runs/NAME`` (``runs/NAME-smoke`` etc. for other profiles).
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

from asyncsim import runs
from asyncsim.errors import ScenarioError, did_you_mean


def drawable_figures() -> list[str]:
    """Every figure name ``asyncsim figures NAME`` and ``[figure] name`` accept: the modules
    of the figure package ``asyncsim.analysis`` (the repository's ``analysis/``; names
    starting with ``_`` are shared helpers). Only these names are ever imported: a name
    read from a scenario file or a run folder never reaches a file path."""
    package = importlib.import_module("asyncsim.analysis")
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__)
                  if not m.name.startswith("_"))


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
    draws = getattr(load_analysis(name), "DRAWS", "sweep")
    if draws == "run" and scn.sweep:
        raise ScenarioError("figure.name", f"{name!r} draws one run folder; this scenario "
                            "is a sweep: name a sweep's figure or remove [figure]")
    if draws == "sweep" and not scn.sweep:
        raise ScenarioError("figure.name", f"{name!r} draws a sweep; this scenario is a "
                            "single run (no [sweep]): add its sweep or remove [figure]")


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
    if (d / "index.csv").exists() or (d / "summary.json").exists():
        return d
    seeds = [p for p in d.glob("seed*") if p.name[4:].isdigit() and (p / "summary.json").exists()]
    return min(seeds, key=lambda p: int(p.name[4:])) if seeds else d


def figure_out(source: Path, profile: str | None) -> Path:
    """Where a figure drawn from the run folders at ``source`` goes by default:
    ``figures/`` for the default profile; for another, the sweep folder's ``figures/`` or
    the run folder itself (as ``asyncsim run --profile P`` draws it)."""
    if profile in (None, "default"):
        return Path("figures")
    return source if (source / runs.SUMMARY).exists() else source / "figures"


def draw_figure(name: str, sweep: str | Path, out: str | Path = "figures") -> list[Path]:
    """Draw figure ``name`` from the run folders at ``sweep`` into ``out``; a figure that
    cannot be drawn (a damaged run folder) leaves no ``out`` folder it created."""
    module = load_analysis(name)
    out = Path(out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
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
    for name in names or drawable:
        d = figure_runs(name, runs_dir, profile)
        if d is None:
            if names:
                raise ScenarioError("", f"no runs in {sweep_dir(name, runs_dir, profile)}; run "
                                    f"`asyncsim run scenarios/{name}.toml` first", file=name)
            continue
        target = out if out is not None else figure_out(d, profile)
        inside = Path(target).resolve().is_relative_to(d.resolve())
        # Drawn into the runs' folder: as its one writer (a sweep may still be running).
        with runs.locked(d) if inside else contextlib.nullcontext():
            written += draw_figure(name, d, target)
    if not names and not written:
        raise ScenarioError("", f"no figure to draw: {Path(runs_dir)} holds runs of none of "
                            f"{', '.join(drawable)}; run `asyncsim run scenarios/NAME.toml` "
                            "first", file="asyncsim figures")
    return written
