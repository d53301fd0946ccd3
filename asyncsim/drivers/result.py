"""What a finished run returns (every driver's :meth:`Driver.finish`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from asyncsim.trace import Trace

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class RunResult:
    """A finished run: its trace, metrics, summary and final parameters.

    ``evals`` (one row per evaluation: ``eval.csv``) and ``updates`` (the trace's update
    table with each update's mean batch loss, ``train_loss``: ``updates.parquet``) are
    pandas DataFrames made on first use from ``eval_columns`` / ``update_columns``: a run
    itself never imports pandas (0.2 s of every run's start-up)."""

    trace: Trace
    summary: dict[str, Any]
    eval_columns: dict[str, list]
    update_columns: dict[str, np.ndarray]
    params: Any
    out: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def evals(self) -> pd.DataFrame:
        import pandas as pd  # here: a run never imports pandas (docs/design.md)

        return pd.DataFrame(self.eval_columns)

    @functools.cached_property
    def updates(self) -> pd.DataFrame:
        import pandas as pd  # here: a run never imports pandas (docs/design.md)

        return pd.DataFrame(self.update_columns)

    @property
    def gradients(self) -> pd.DataFrame:
        return self.trace.gradients_df()
