"""Smoke-profile tests of the P1 figure scenarios: each runs its sweep end to end (a tiny
model, a few updates), draws its figure into the run folder, and redraws it from the run
folders only (the ``asyncsim figures`` path). Smoke outputs go to pytest's tmp_path, never
to figures/.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pandas as pd
import pytest
from figure_inputs import assert_refused

from asyncsim.cli import main
from asyncsim.figures import draw_figure

REPO = Path(__file__).resolve().parents[2]
FIGURES = ["p1_f2_speedup", "p1_f3_lr_modulation", "p1_beyond", "p1_tradeoff"]
PAPER = ["p1_f2_speedup", "p1_f3_lr_modulation", "p1_tradeoff"]


@pytest.fixture(scope="module", params=FIGURES)
def smoke_sweep(request, tmp_path_factory):
    name = request.param
    out = tmp_path_factory.mktemp(name) / "runs"
    rc = main(["run", str(REPO / "scenarios" / f"{name}.toml"), "--profile", "smoke",
               "--out", str(out), "--quiet"])
    assert rc == 0
    return name, out


# What each figure reads besides every point's summary.json, scenario.toml, provenance.json.
READS = {"p1_f2_speedup": ("eval", "protocol.n"), "p1_f3_lr_modulation": ("eval", "protocol.n"),
         "p1_beyond": ("updates", "protocol.n"), "p1_tradeoff": ("eval", "protocol.n")}


@pytest.mark.parametrize("damage", ["summary", "scenario", "provenance", "read", "option"])
def test_a_wrong_typed_value_is_one_line_and_nothing_drawn(smoke_sweep, tmp_path, capsys,
                                                           damage):
    name, out = smoke_sweep
    which = {"read": READS[name][0], "option": READS[name][1]}.get(damage, damage)
    assert_refused(name, out, which, tmp_path, capsys)


def test_smoke_profile_runs_and_draws(smoke_sweep, tmp_path):
    name, out = smoke_sweep
    index = pd.read_csv(out / "index.csv")
    assert len(index) >= 3 and (index["status"] == "complete").all()
    png, csv = out / "figures" / f"{name}.png", out / "figures" / f"{name}.csv"
    assert png.exists()
    summaries = {p: json.loads((out / p / "summary.json").read_text())
                 for p in index["point"]}
    # Redraw from the run folders only, elsewhere (what `asyncsim figures NAME` does).
    again = draw_figure(name, out, tmp_path / "redraw")
    assert tmp_path / "redraw" / f"{name}.png" in again
    # The plotted data are the runs' own numbers.
    if name == "p1_f3_lr_modulation":
        table = pd.read_csv(tmp_path / "redraw" / f"{name}_table.csv")
        assert set(table["rule"]) == {"constant", "inverse-staleness"}
        # hardsync (tau = 0) is one run, drawn under both rules
        assert (table["setup"] == "hardsync").sum() == 2
        errors = sorted(s["final_test_error"] for s in summaries.values())
        assert sorted(set(table["final_test_error_mean"])) == sorted(set(errors))
        # A failure is a run that diverged or never learned (its summary.json says which);
        # the smoke runs stay near chance, so some never learn.
        failed = sum(bool(s["diverged"] or s["never_learned"]) for s in summaries.values())
        hard = [s for s in summaries.values() if s["staleness_max"] == 0]
        twice = sum(bool(s["diverged"] or s["never_learned"]) for s in hard)  # in both rows
        assert table["failed"].sum() == failed + twice
        assert table["never_learned"].sum() == sum(bool(s["never_learned"]) for s in
                                                   summaries.values()) + sum(
            bool(s["never_learned"]) for s in hard)
    if name == "p1_f2_speedup":
        data = pd.read_csv(csv)
        # One panel per link model, each with its own λ = 1 baseline (one run, drawn for
        # both protocols).
        assert list(dict.fromkeys(data["link"])) == ["private links",
                                                     "shared PS interface 10 Gb/s, fair"]
        alone = data[data["learners"] == 1]
        assert (alone["speedup_per_epoch"] == 1.0).all() and len(alone) == 4
        assert set(data["staleness_mean"]) == {s["staleness_mean"] for s in summaries.values()}
        # The shared interface adds its transfers to every step: each point is slower.
        per = data.pivot_table(index=["protocol", "learners"], columns="link",
                               values="sim_time_per_epoch")
        assert (per["shared PS interface 10 Gb/s, fair"] > per["private links"]).all()
    if name == "p1_tradeoff":
        check_tradeoff(tmp_path / "redraw", index, summaries, out)
    if name == "p1_beyond":
        data = pd.read_csv(csv)
        # the x axis: the run's rate x its measured initial sharpness / the delayed edge
        assert sorted(data["sharpness0"]) == sorted(
            s["initial_sharpness"] for s in summaries.values())
        assert (data["x"] == data["rate"] * data["sharpness0"] / data["edge"]).all()
        inv = data["lr_rule"] == "inverse-staleness"  # α0/τ at the run's mean staleness
        assert (data["rate"][inv] == data["alpha0"][inv] / data["tau"][inv].clip(lower=1)).all()
        assert (data["rate"][~inv] == data["alpha0"][~inv]).all()


def check_tradeoff(drawn: Path, index: pd.DataFrame, summaries: dict, out: Path) -> None:
    """P1's trade-off table from the smoke runs, by hand: per (setup, rule) the seeds'
    final test errors, their 95% interval (two seeds: t = 12.706 times half their
    difference), failures (diverged or never learned) and the time to the target."""
    from asyncsim.analysis._common import time_to_target

    from asyncsim.results import open_run

    table = pd.read_csv(drawn / "p1_tradeoff_table.csv")
    assert list(table[["setup", "rule"]].itertuples(index=False, name=None)) == [
        ("hardsync", "hardsync"), ("4-softsync", "α0/τ"), ("30-softsync", "α0"),
        ("30-softsync", "α0/τ")]
    target = 0.9  # the smoke profile's [figure] target_test_error
    for row in table.itertuples():
        kind = "hardsync" if row.setup == "hardsync" else "softsync"
        rule = {"α0/τ": "inverse-staleness"}.get(row.rule, "constant")
        sel = index[(index["protocol.kind"] == kind)
                    & (index["optimizer.lr_rule"] == rule)
                    & ((index["protocol.n"] == int(row.setup.split("-")[0]))
                       if kind == "softsync" else True)]
        assert row.seeds == len(sel) == 2
        runs = [open_run(out / p) for p in sel["point"]]
        finals = [float(r.evals["test_error"].iloc[-1]) for r in runs]
        assert row.final_test_error_mean == pytest.approx(sum(finals) / 2)
        assert row.final_test_error_ci95 == pytest.approx(12.706 * abs(finals[0] - finals[1])
                                                          / 2)
        failed = [bool(summaries[p]["diverged"] or summaries[p]["never_learned"])
                  for p in sel["point"]]
        assert row.failed == sum(failed)
        times = [time_to_target(r.evals, target)[0] for r, f in zip(runs, failed, strict=True)
                 if not f]
        times = [t for t in times if t == t]
        assert row.reached_target == len(times)
        if times:
            assert row.time_to_target == pytest.approx(sum(times) / len(times))


def test_the_t_quantiles_are_students():
    from asyncsim.analysis._common import t975
    from scipy import stats

    for df in range(1, 31):  # the table, to 3 decimals
        assert t975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=5e-4)
    for df in (31, 40, 100, 1000):  # the expansion
        assert t975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-5)


def test_caption_says_what_the_figure_was_made_from(smoke_sweep):
    from asyncsim.analysis._common import describe_runs

    from asyncsim.scenario import load_scenario

    name, out = smoke_sweep
    scn = load_scenario(REPO / "scenarios" / f"{name}.toml", profile="smoke")
    text = describe_runs(out)
    assert f"data {scn.data.name} ({scn.data.options['n_train']:,} train" in text, text
    assert f"model {scn.model.name}" in text and "parameters)" in text, text
    assert text.endswith(f"regenerate: asyncsim run {REPO / 'scenarios' / name}.toml "
                         "--profile smoke"), text


def test_caption_does_not_claim_a_scenario_regenerates_modified_runs(tmp_path):
    from asyncsim.analysis._common import describe_runs

    src = REPO / "scenarios" / "quickstart.toml"
    out = tmp_path / "qs"
    assert main(["trace", str(src), "--profile", "smoke", "--out", str(out), "--quiet"]) == 0
    assert describe_runs(out).endswith(f"regenerate: asyncsim run {src} --profile smoke")
    again = tmp_path / "qs2"
    assert main(["trace", str(src), "--profile", "smoke", "--set", "optimizer.lr=0.5",
                 "--out", str(again), "--quiet"]) == 0
    assert "(modified: --set" in describe_runs(again)


def test_caption_of_runs_read_from_a_pipe_reads_no_pipe(tmp_path):
    # A run read from a FIFO records that name; drawing its figure reopened it for the
    # caption and waited forever for a writer. Now only a regular file is read; a device or
    # a name too long for the system is not one either.
    import contextlib
    import os
    import threading

    from asyncsim.analysis._common import describe_runs

    fifo = tmp_path / "s.toml"
    os.mkfifo(fifo)
    text = (REPO / "scenarios" / "quickstart.toml").read_text()
    writer = threading.Thread(target=fifo.write_text, args=(text,), daemon=True)
    writer.start()
    out = tmp_path / "qs"
    assert main(["trace", str(fifo), "--profile", "smoke", "--out", str(out), "--quiet"]) == 0
    writer.join(10)
    captions: list[str] = []
    reader = threading.Thread(target=lambda: captions.append(describe_runs(out)), daemon=True)
    reader.start()
    reader.join(60)
    if reader.is_alive():  # blocked on the FIFO: let it end, then fail
        with contextlib.suppress(OSError):  # (no reader there: nothing to unblock)
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
        pytest.fail("describe_runs opened the FIFO the run was read from")
    assert captions[0].endswith(f"scenario: {fifo} (not a scenario file here; each run "
                                "folder's scenario.toml reruns it)"), captions[0]
    prov = out / "provenance.json"
    for name, says in (("/dev/zero", "not a scenario file here"),
                       ("x" * 5000 + ".toml", "not found here")):
        prov.write_text(json.dumps(json.loads(prov.read_text()) | {"scenario_file": name}))
        assert f"scenario: {name} ({says}" in describe_runs(out)


@pytest.mark.parametrize("name", PAPER)
def test_paper_profile_resolves(name):
    from asyncsim.scenario import load_scenario

    scn = load_scenario(REPO / "scenarios" / f"{name}.toml", profile="paper")
    assert scn.sweep and scn.run.epochs == 140


def test_f4_scenario_and_alexnet():
    """P1-F4 is paper-scale only: its file parses and its model builds (shapes only)."""
    import jax

    from asyncsim.numerics.models import get_model

    raw = tomllib.loads((REPO / "scenarios" / "p1_f4_imagenet.toml").read_text())
    assert raw["cluster"]["learners"] == 18 and raw["data"]["batch_size"] == 16
    model = get_model("alexnet", num_classes=1000, image_size=227)
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    n = sum(int(x.size) for x in jax.tree_util.tree_leaves(shapes))
    assert n == 62_378_344
    small = get_model("alexnet", num_classes=10, image_size=67)
    params = jax.jit(small.init)(jax.random.PRNGKey(0))  # jitted: op by op takes ~3x longer
    x = jax.numpy.zeros((2, 67, 67, 3))
    assert jax.jit(small.apply)(params, x).shape == (2, 10)


def test_asyncsim_figures_finds_a_single_run_scenarios_run_folder(tmp_path, monkeypatch, capsys):
    # `asyncsim run scenarios/quickstart.toml` writes runs/quickstart[-P]/seed0 (not a sweep);
    # `asyncsim figures` redraws from it by name and by default, and says when nothing is there.
    monkeypatch.chdir(tmp_path)
    assert main(["figures", "--profile", "smoke"]) == 2
    assert "no figure to draw: runs holds runs of none of" in capsys.readouterr().err
    assert main(["run", str(REPO / "scenarios" / "quickstart.toml"), "--profile", "smoke",
                 "--set", 'model={name="mlp", hidden=[4]}', "--quiet"]) == 0
    assert (tmp_path / "runs" / "quickstart-smoke" / "seed0" / "summary.json").exists()
    for args in (["quickstart"], []):
        out = tmp_path / f"figs{len(args)}"
        assert main(["figures", *args, "--profile", "smoke", "--out", str(out)]) == 0
        assert (out / "quickstart.png").exists()
        run = tmp_path / "runs" / "quickstart-smoke" / "seed0"
        pd.testing.assert_frame_equal(pd.read_csv(out / "quickstart.csv"),
                                      pd.read_csv(run / "eval.csv"))


def test_open_sweep_reads_the_numbers_the_figure_plots(smoke_sweep):
    """asyncsim.open_sweep on a figure's sweep: one row per point, its keys beside its
    summary; P1-F3's table is the same final errors, and its learning curves the same
    evaluations, as the figure's CSVs."""
    import asyncsim

    name, out = smoke_sweep
    sweep = asyncsim.open_sweep(out)
    index = pd.read_csv(out / "index.csv")
    from asyncsim.scenario import load_scenario
    from asyncsim.scenario.points import sweep_points

    # The keys the scenario's [sweep] varies, in the order the points first name them.
    points = sweep_points(load_scenario(REPO / "scenarios" / f"{name}.toml", profile="smoke"))
    assert sweep.keys == list(dict.fromkeys(k for p in points for k in p))
    assert len(sweep.table) == len(index) == len(points)
    assert sweep.table["final_test_error"].tolist() == index["final_test_error"].tolist()
    if name != "p1_f3_lr_modulation":
        return
    t = sweep.table
    figure = pd.read_csv(out / "figures" / f"{name}_table.csv")
    soft = t[t["protocol.kind"] == "softsync"]
    for row in soft.to_dict("records"):
        drawn = figure[(figure["rule"] == row["optimizer.lr_rule"])
                       & (figure["setup"] == f"{int(row['protocol.n'])}-softsync")]
        assert drawn["final_test_error_mean"].tolist() == [row["final_test_error"]]
    curves = pd.read_csv(out / "figures" / f"{name}.csv")
    ev = sweep.evals()
    mine = ev[ev["protocol.kind"] == "softsync"].set_index(["optimizer.lr_rule", "epoch"])
    theirs = curves[curves["setup"] != "hardsync"].set_index(["rule", "epoch"])
    assert mine["test_error"].sort_index().tolist() == theirs["test_error"].sort_index().tolist()
