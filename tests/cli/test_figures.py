"""Figures read run folders only: what a figure plots was measured by its scenario's run and
stored in its folder, so drawing needs no JAX (an import-linter contract forbids the figure
code importing drivers or numerics; this checks the running code), and the figure code ships
in the package, so ``asyncsim figures`` works from an installed wheel outside the checkout."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import TINY
from figure_inputs import assert_refused

from asyncsim import figures
from asyncsim._io import DamagedFile, dump_toml
from asyncsim.cli import main
from asyncsim.figures import FigureWorker, draw_figure
from asyncsim.stability.closed_form import edge

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trace_sweeps(tmp_path_factory):
    """The smoke runs of two timing-only figure scenarios (P2-F3 also measures its edges)."""
    runs = tmp_path_factory.mktemp("fig") / "runs"
    for name in ("p2_f3", "p1_f1_staleness"):
        assert main(["run", str(REPO / "scenarios" / f"{name}.toml"), "--profile", "smoke",
                     "--out", str(runs / f"{name}-smoke"), "--quiet", "--no-figure"]) == 0
    return runs


@pytest.mark.parametrize("name,damage", [
    (name, damage) for name, extra in (("p1_f1_staleness", "protocol.n"), ("p2_f3", "edges"))
    for damage in ("summary", "scenario", "provenance", extra)])
def test_a_wrong_typed_value_is_one_line_and_nothing_drawn(trace_sweeps, tmp_path, capsys,
                                                           name, damage):
    assert_refused(name, trace_sweeps / f"{name}-smoke", damage, tmp_path, capsys)


def test_the_run_stores_what_the_figure_plots(trace_sweeps):
    edges = pd.read_csv(trace_sweeps / "p2_f3-smoke" / "edges.csv")
    assert sorted(edges["momentum"].unique()) == ["dampened", "heavy-ball", "none", "shifted"]
    assert sorted(edges["tau"].unique()) == [0, 2] and len(edges) == 8
    for r in edges.itertuples():  # the measured edge is within 1% of P2's closed form
        assert r.measured == pytest.approx(edge(r.tau, r.momentum, r.beta), rel=0.01)


def _draw(code: str, *, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, env=env, timeout=300)


def test_figures_draw_without_jax(trace_sweeps, tmp_path):
    """JAX made unimportable: drawing still works, from the stored measurements."""
    code = ("import sys; sys.modules['jax'] = None; "
            "from asyncsim.figures import draw_figure; "
            f"print(draw_figure('p2_f3', {str(trace_sweeps / 'p2_f3-smoke')!r}, "
            f"{str(tmp_path)!r}))")
    r = _draw(code, cwd=REPO)
    assert r.returncode == 0, r.stderr
    drawn = pd.read_csv(tmp_path / "p2_f3.csv")
    stored = pd.read_csv(trace_sweeps / "p2_f3-smoke" / "edges.csv")
    assert drawn["measured"].tolist() == stored["measured"].tolist()


def test_asyncsim_figures_works_from_an_installed_wheel(trace_sweeps, tmp_path):
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(wheels), str(REPO)], check=True, capture_output=True,
                   timeout=300)
    (wheel,) = wheels.glob("asyncsim-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                    "--target", str(site), str(wheel)], check=True, capture_output=True,
                   timeout=300)
    elsewhere = tmp_path / "elsewhere"  # no analysis/ or asyncsim/ folder here
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    code = ("import asyncsim, sys; from asyncsim.cli import main; "
            "print(asyncsim.__file__); "
            f"sys.exit(main(['figures', 'p1_f1_staleness', '--runs', "
            f"{str(trace_sweeps)!r}, '--profile', 'smoke', '--out', 'figs']))")
    r = _draw(code, cwd=elsewhere, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(str(site))  # the wheel, not the checkout
    assert (elsewhere / "figs" / "p1_f1_staleness.png").exists()
    drawn = pd.read_csv(elsewhere / "figs" / "p1_f1_staleness.csv")
    assert set(drawn.columns) >= {"n", "staleness", "freq"} and len(drawn) > 3


@pytest.fixture(scope="module")
def p2_f1_runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("p2_f1") / "p2_f1-smoke"
    assert main(["run", str(REPO / "scenarios" / "p2_f1.toml"), "--profile", "smoke",
                 "--out", str(out), "--quiet"]) == 0
    return out


@pytest.mark.parametrize("damage", ["summary", "scenario", "provenance", "protocol.tau"])
def test_p2_f1_refuses_a_wrong_typed_value(p2_f1_runs, tmp_path, capsys, damage):
    assert_refused("p2_f1", p2_f1_runs, damage, tmp_path, capsys)


def test_p2_f1_plots_the_rate_each_run_recorded(p2_f1_runs):
    """Each row of P2-F1's CSV is one run (2 delays x 2 momenta x 2 regimes in smoke) with
    the rate it recorded (P2's eta_tau at the nominal delay), its train and test error and
    their gap; the table aggregates them per (momentum, rule, delay)."""
    import math

    out = p2_f1_runs
    data = pd.read_csv(out / "figures" / "p2_f1.csv")
    assert len(data) == 8
    index = pd.read_csv(out / "index.csv")
    for r in data.itertuples():
        point = out / index[(index["protocol.tau"] == r.tau)
                            & (index["optimizer.lr_rule"] == r.lr_rule)
                            & (index["optimizer.momentum.kind"] == r.momentum)]["point"].iloc[0]
        summary = json.loads((point / "summary.json").read_text())
        assert r.eta == summary["lr_at_tau"]
        hand = r.eta0 * math.sin(math.pi / (4 * r.tau + 2))  # P2's eta_tau
        assert r.eta == pytest.approx(hand if r.lr_rule == "stability-edge" else r.eta0,
                                      rel=1e-15)
        assert r.final_train_error == summary["final_train_error"]
        assert r.gap == pytest.approx(summary["final_test_error"] - summary["final_train_error"])
        # The official long regime: eta_tau runs train three times the epochs.
        assert r.epochs == (6 if r.lr_rule == "stability-edge" else 2)
    table = pd.read_csv(out / "figures" / "p2_f1_table.csv")
    assert len(table) == 8 and (table["seeds"] == 1).all()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny run whose scenario names the quickstart figure, drawn by ``asyncsim run``
    (in its FigureWorker)."""
    root = tmp_path_factory.mktemp("worker")
    path = root / "s.toml"
    path.write_text(dump_toml(dict(TINY, figure={"name": "quickstart"})))
    out = root / "run"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    return out


def _same_files(a: list[Path], b: list[Path]) -> None:
    assert [p.name for p in a] == [p.name for p in b] == ["quickstart.png", "quickstart.csv"]
    for x, y in zip(a, b, strict=True):
        assert x.read_bytes() == y.read_bytes(), x.name


@pytest.mark.parametrize("damage", ["summary", "scenario", "provenance", "eval"])
def test_quickstart_refuses_a_wrong_typed_value(tiny_run, tmp_path, capsys, damage):
    assert_refused("quickstart", tiny_run, damage, tmp_path, capsys)


def test_quickstart_figure_is_laid_out_in_one_pass_with_nothing_cut_or_overlapping(
        tiny_run, tmp_path):
    """`asyncsim run` waits for the quickstart figure, so it is laid out by hand (no
    tight_layout, no bbox_inches="tight": one draw). Its title, its two panels (tick labels,
    axis labels and titles included) and its footer lie on the canvas and do not overlap --
    also with a title long enough to wrap onto a second line."""
    import tomllib

    import matplotlib.pyplot as plt
    from asyncsim.analysis import quickstart

    long = tmp_path / "run"
    shutil.copytree(tiny_run, long)
    scn = tomllib.loads((long / "scenario.toml").read_text())
    scn["name"] = "a-scenario-name-long-enough-to-wrap-the-title-" * 2
    (long / "scenario.toml").write_text(dump_toml(scn))
    for run, title_lines in ((tiny_run, 1), (long, 2)):
        fig, _ = quickstart.figure(run)
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        title = fig._suptitle
        assert title.get_text().count("\n") + 1 == title_lines
        footer = fig.texts[-1]
        assert footer.get_text().startswith("Runs:")
        # A panel's tight box holds what it draws: its tick labels, axis labels and title.
        boxes = {"title": title.get_window_extent(r), "footer": footer.get_window_extent(r)}
        boxes.update({f"panel {i}": ax.get_tightbbox(r) for i, ax in enumerate(fig.axes)})
        canvas = fig.bbox
        for name, bb in boxes.items():
            assert (bb.x0 >= canvas.x0 - 0.5 and bb.y0 >= canvas.y0 - 0.5
                    and bb.x1 <= canvas.x1 + 0.5 and bb.y1 <= canvas.y1 + 0.5), (run, name)
        names = list(boxes)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                # 8 pixels (0.08 in) apart at least: closer, two texts read as one
                assert not boxes[a].padded(4).overlaps(boxes[b].padded(4)), (run, a, b)
        plt.close(fig)


def test_asyncsim_run_draws_in_its_worker_the_files_drawn_here(tiny_run, tmp_path,
                                                                monkeypatch):
    """The worker runs the same figure code on the same folder in another process: the
    same bytes as drawing it here, and drawn there (this process's drawing is disabled)."""
    here = draw_figure("quickstart", tiny_run, tmp_path / "here")
    _same_files([tiny_run / p.name for p in here], here)  # what `asyncsim run` drew

    def no_drawing_here(*a, **k):
        raise AssertionError("drawn in this process, not in the worker")

    monkeypatch.setattr(figures, "draw_figure", no_drawing_here)
    with FigureWorker("quickstart") as worker:
        there = worker.draw(tiny_run, tmp_path / "there")
    _same_files(here, there)


def test_a_worker_that_fails_leaves_the_figure_and_its_error_to_this_process(tiny_run,
                                                                             tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_run, bad)
    (bad / "eval.csv").write_text("version,sim_time\n3,")  # truncated
    with pytest.raises(DamagedFile) as here:
        draw_figure("quickstart", bad, tmp_path / "here")
    with pytest.raises(DamagedFile) as via_worker:
        FigureWorker("quickstart").draw(bad, tmp_path / "there")
    assert str(via_worker.value) == str(here.value)
    assert not (tmp_path / "there").exists()  # as without the worker: no folder left
    # A worker that died before it was used: drawn here.
    worker = FigureWorker("quickstart")
    worker._proc.kill()
    _same_files(draw_figure("quickstart", tiny_run, tmp_path / "a"),
                worker.draw(tiny_run, tmp_path / "b"))


def test_a_worker_not_used_is_ended_at_once_without_drawing(tmp_path):
    """A run that fails or is refused does not wait for its worker's imports: the worker
    is terminated, not asked to finish (it would read its input only after them)."""
    worker = FigureWorker("quickstart")
    proc = worker._proc
    with worker:
        pass
    assert proc.returncode == -signal.SIGTERM and worker._proc is None


class _Recorded(FigureWorker):
    """A FigureWorker that logs its start, its draw and its end (in ``log``)."""

    log: list = []

    def __init__(self, name):
        super().__init__(name)
        self.log.append(("start", name, self))

    def draw(self, *a, **k):
        self.log.append(("draw", self.name, self))
        return super().draw(*a, **k)

    def close(self):
        self.log.append(("close", self.name, self, self._proc is not None))
        super().close()


@pytest.fixture
def recorded(monkeypatch):
    """The workers ``asyncsim run`` starts, and when it validates its scenario (the load
    that imports JAX)."""
    from asyncsim.cli import commands

    log = _Recorded.log = []
    monkeypatch.setattr(figures, "FigureWorker", _Recorded)
    load = commands.load_args

    def load_args(args, *, validate=True):
        log.append(("load", validate))
        return load(args, validate=validate)

    monkeypatch.setattr(commands, "load_args", load_args)
    return log


def test_asyncsim_run_starts_its_worker_before_the_load_that_imports_jax(tmp_path,
                                                                          recorded):
    """The worker's imports overlap this process's imports, not the run (cli/commands.py
    early_worker): it is started between the quick load and the validating one, and it is
    the one worker that draws."""
    path = tmp_path / "s.toml"
    path.write_text(dump_toml(dict(TINY, figure={"name": "quickstart"})))
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    (_, validate), start, (_, validated), draw, end = recorded
    assert (validate, validated) == (False, True)
    assert start[:2] == ("start", "quickstart") and draw == ("draw", "quickstart", start[2])
    assert end == ("close", "quickstart", start[2], False)  # it had drawn: nothing to end
    assert [p.name for p in (tmp_path / "run").glob("quickstart.*")] != []


def test_a_worker_started_early_is_ended_when_the_validating_load_refuses(tmp_path,
                                                                            recorded, capsys):
    """An unknown model passes the quick load (a registry check): the worker started after
    it is ended when the validating load refuses the scenario, which is reported as without
    the worker, and no folder is left."""
    path = tmp_path / "s.toml"
    path.write_text(dump_toml(dict(TINY, model={"name": "no-such-model"},
                                   figure={"name": "quickstart"})))
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert "model.name: unknown model 'no-such-model'" in capsys.readouterr().err
    assert [e[0] for e in recorded] == ["load", "start", "load", "close"]
    assert recorded[3][3] and recorded[1][2]._proc is None  # ended, not left running
    assert not (tmp_path / "run").exists()


def test_a_worker_for_a_file_changed_between_the_loads_is_ended_before_the_trace(
        tmp_path, recorded, monkeypatch):
    """The quick load saw a run with a figure; the full load, a trace-only scenario (the
    file changed in between): the worker is ended before the trace runs, not after it."""
    from asyncsim.cli import commands

    path = tmp_path / "s.toml"
    path.write_text(dump_toml(dict(TINY, figure={"name": "quickstart"})))
    load = commands.load_args

    def load_args(args, *, validate=True):
        if validate:
            path.write_text(dump_toml(dict(TINY, run={"updates": 5, "trace_only": True})))
        return load(args, validate=validate)

    monkeypatch.setattr(commands, "load_args", load_args)
    trace = commands.cmd_trace

    def cmd_trace(args, scn=None):
        recorded.append(("trace",))
        return trace(args, scn)

    monkeypatch.setattr(commands, "cmd_trace", cmd_trace)
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    assert [e[0] for e in recorded] == ["load", "start", "load", "close", "trace", "close"]
    # ended before the trace; the way out finds nothing left to end
    assert recorded[3][3] and not recorded[5][3] and recorded[1][2]._proc is None


def test_the_quick_load_imports_no_jax(tmp_path):
    """What makes the early start pay: the worker is started before this process imports
    JAX (in a fresh interpreter; this one has it already)."""
    path = tmp_path / "s.toml"
    path.write_text(dump_toml(dict(TINY, figure={"name": "quickstart"})))
    code = ("import sys; from asyncsim.cli.commands import early_worker; "
            "from asyncsim.cli.parser import build_parser; "
            f"w = early_worker(build_parser().parse_args(['run', {str(path)!r}])); "
            "print(w.name, 'jax' in sys.modules); w.close()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["quickstart", "False"]


@pytest.mark.parametrize("case", ["draws", "no-figure", "sweep", "trace-only", "bad key"])
def test_which_runs_start_their_worker_early(tmp_path, case):
    """Only a single run that will draw its figure: not with --no-figure, not a sweep or a
    trace-only run (they draw no run folder's figure here), not a scenario the quick load
    refuses (the full load reports it)."""
    from asyncsim.cli.commands import early_worker
    from asyncsim.cli.parser import build_parser

    scn = dict(TINY, figure={"name": "quickstart"})
    flags = ["--no-figure"] if case == "no-figure" else []
    if case == "sweep":
        scn["sweep"] = {"seed": [1, 2]}
    elif case == "trace-only":
        scn["run"] = {"updates": 30, "trace_only": True}
    elif case == "bad key":
        scn["run"] = {"updates": 30, "bogus": 1}
    path = tmp_path / "s.toml"
    path.write_text(dump_toml(scn))
    worker = early_worker(build_parser().parse_args(["run", str(path), *flags]))
    if case == "draws":
        with worker:
            assert worker.name == "quickstart" and worker._proc.poll() is None
    else:
        assert worker is None


@pytest.mark.skipif(sys.platform == "win32", reason="no /dev/stdin")
def test_a_piped_scenario_is_read_once(tmp_path):
    """A scenario piped in (``asyncsim run /dev/stdin``) can be read only once: the early
    worker's quick load must not take it, or the full load reads nothing and runs the
    defaults."""
    out = tmp_path / "run"
    text = dump_toml(dict(TINY, name="piped", run={"updates": 5, "trace_only": True}))
    r = subprocess.run([sys.executable, "-m", "asyncsim.cli", "run", "/dev/stdin", "--out",
                        str(out), "--quiet"], input=text, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (out / "scenario.toml").read_text().startswith('name = "piped"')


def test_what_a_figure_draws_is_read_from_its_source_without_importing_matplotlib():
    code = ("import json, sys; from asyncsim.figures import drawable_figures, figure_draws; "
            "print(json.dumps({n: figure_draws(n) for n in drawable_figures()})); "
            "print('matplotlib' in sys.modules)")
    r = _draw(code, cwd=REPO)
    assert r.returncode == 0, r.stderr
    draws, imported = r.stdout.splitlines()
    assert imported == "False"
    # The same as importing each module and reading DRAWS (default "sweep").
    draws = json.loads(draws)
    assert draws == {n: getattr(figures.load_analysis(n), "DRAWS", "sweep")
                     for n in figures.drawable_figures()}
    assert draws["quickstart"] == "run" and draws["p2_f3"] == "sweep"
