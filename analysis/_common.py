"""Small helpers shared by the P1 figure scripts: read a sweep's run folders, label points,
write a figure and its data. They read run folders only; nothing here runs a simulation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # figures are files; never open a window (CI, headless servers)
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

RULE_LABEL = {"constant": "α = α0", "inverse-staleness": "α = α0/τ",
              "inverse-mean-staleness": "α = α0/⟨τ⟩", "stability-edge": "stability edge"}


def finished_points(sweep_dir: Path) -> list[Path]:
    """The run folders of a sweep's complete points (``summary.json`` written), in
    ``index.csv`` order; a sweep may still be running. The folder recorded in the index may
    be relative to another working directory: a point's folder is always sweep_dir/point."""
    index = pd.read_csv(Path(sweep_dir) / "index.csv")
    folders = [Path(sweep_dir) / p for p in index["point"]]
    return [f for f in folders if (f / "summary.json").exists()]


def load_points(sweep_dir: Path, *, trace_only_ok: bool = False) -> pd.DataFrame:
    """The sweep's ``index.csv`` with each point's run folder, its resolved scenario values
    and summary; only complete points (a sweep may still be running). Trace-only points (no
    ``eval.csv``) are kept only with ``trace_only_ok`` (column ``has_eval`` says which)."""
    rows = []
    for folder in finished_points(sweep_dir):
        has_eval = (folder / "eval.csv").exists()
        if not (has_eval or trace_only_ok):
            continue  # a trace-only point (no numerics to draw)
        scn = _read_toml(folder / "scenario.toml")
        summary = json.loads((folder / "summary.json").read_text())
        proto = scn.get("protocol", {})
        opt = scn.get("optimizer", {})
        rows.append({
            "point": folder.name, "folder": folder, "seed": scn.get("seed", 0),
            "protocol": proto.get("kind"), "n": proto.get("n"),
            "learners": scn.get("cluster", {}).get("learners"),
            "batch_size": scn.get("data", {}).get("batch_size"),
            "lr": opt.get("lr"), "lr_rule": opt.get("lr_rule", "constant"),
            "warmup_updates": opt.get("schedule", {}).get("warmup_updates", 0),
            "scenario": scn, "summary": summary, "has_eval": has_eval,
        })
    return pd.DataFrame(rows)


def _read_toml(path: Path) -> dict:
    import tomllib

    return tomllib.loads(path.read_text())


def setup_label(protocol: str, n) -> str:
    """``hardsync`` or ``N-softsync`` (P1's names)."""
    if protocol == "softsync" and n is not None and not _isnan(n):
        return f"{int(n)}-softsync"
    return str(protocol)


def _isnan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def read_eval(folder: Path) -> pd.DataFrame:
    return pd.read_csv(Path(folder) / "eval.csv")


def save(fig, data: pd.DataFrame, out_dir: Path, name: str) -> list[Path]:
    """Write ``NAME.png`` (small: 100 dpi) and ``NAME.csv`` (every plotted series)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    png, csv = out_dir / f"{name}.png", out_dir / f"{name}.csv"
    fig.savefig(png, dpi=100, bbox_inches="tight")
    plt.close(fig)
    data.to_csv(csv, index=False)
    return [png, csv]
