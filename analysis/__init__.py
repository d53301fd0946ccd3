"""The figures: one module per figure, each drawing from run folders only.

A module ``NAME`` here draws figure NAME from the runs of ``scenarios/NAME.toml``::

    def draw(sweep_dir: pathlib.Path, out_dir: pathlib.Path) -> list[pathlib.Path]

It reads the sweep's ``index.csv`` and run folders -- the traces, metrics and what the runs
measured for it (``[measure]``: sharpness, measured edges) -- and writes ``out_dir/NAME.png``
plus the plotted data as ``out_dir/NAME.csv``; it never runs a simulation or a gradient (an
import-linter contract: this package imports no driver and no numerics). The repository
keeps it at the top level as ``analysis/``; it is installed as ``asyncsim.analysis``, so
``asyncsim figures`` works from a wheel. Modules starting with ``_`` are shared helpers.
"""

import matplotlib

matplotlib.use("Agg")  # figures are files; never open a window (CI, headless servers)
