"""``asyncsim figures``: draw paper figures from existing run folders only.

Each figure has one scenario ``scenarios/NAME.toml`` (a sweep with ``[figure] name = NAME``)
and one module ``analysis/NAME.py`` exposing::

    def draw(sweep_dir: pathlib.Path, out_dir: pathlib.Path) -> list[pathlib.Path]

which reads the sweep's ``index.csv`` and run folders (never reruns a simulation) and writes
``out_dir/NAME.png`` plus the plotted data as ``out_dir/NAME.csv``. The run folders of a
figure live in ``runs/NAME`` (``runs/NAME-smoke`` etc. for other profiles).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from asyncsim.errors import ScenarioError, did_you_mean

REPO = Path(__file__).resolve().parent.parent
ANALYSIS = REPO / "analysis"


def available_figures() -> list[str]:
    if not ANALYSIS.is_dir():
        return []
    return sorted(p.stem for p in ANALYSIS.glob("p[0-9]_f*.py"))


def drawable_figures() -> list[str]:
    """Every figure name ``asyncsim figures NAME`` and ``[figure] name`` accept: the
    modules of analysis/ (those starting with ``_`` are shared helpers)."""
    if not ANALYSIS.is_dir():
        return []
    return sorted(p.stem for p in ANALYSIS.glob("[!_]*.py"))


def load_analysis(name: str) -> ModuleType:
    path = ANALYSIS / f"{name}.py"
    if not path.exists():
        raise ScenarioError("figure.name", f"no analysis/{name}.py; figures: "
                            f"{', '.join(drawable_figures()) or '(none)'}")
    spec = importlib.util.spec_from_file_location(f"asyncsim_analysis_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def sweep_dir(name: str, runs_dir: str | Path = "runs", profile: str | None = None) -> Path:
    suffix = "" if profile in (None, "default") else f"-{profile}"
    return Path(runs_dir) / f"{name}{suffix}"


def draw_figure(name: str, sweep: str | Path, out: str | Path = "figures") -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return load_analysis(name).draw(Path(sweep), out)


def draw_figures(names: list[str] | None, *, runs_dir: str | Path = "runs",
                 out: str | Path = "figures", profile: str | None = None) -> list[Path]:
    """Draw each named figure (default: every one whose runs exist) from its run folders."""
    written: list[Path] = []
    drawable = drawable_figures()
    for name in names or []:
        if name not in drawable:
            raise ScenarioError("", f"unknown figure {name!r}; figures: "
                                f"{', '.join(drawable) or '(none)'}"
                                f"{did_you_mean(name, drawable)}", file=name)
    for name in names or available_figures():
        d = sweep_dir(name, runs_dir, profile)
        if not d.exists():
            if names:
                raise ScenarioError("", f"no runs in {d}; run `asyncsim run scenarios/{name}.toml`"
                                    " first", file=name)
            continue
        written += draw_figure(name, d, out)
    return written
