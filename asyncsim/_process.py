"""Settings of the processes asyncsim starts itself: the ``asyncsim`` command
(:func:`asyncsim.cli.console`) and the figure worker (``python -m asyncsim.figures``).
Never applied on import: a notebook or a test that imports asyncsim keeps its own."""

from __future__ import annotations

import gc

# The cyclic garbage collector's thresholds (CPython's default: 700, 10, 10). Importing a
# run's modules (JAX, optax, pyarrow) leaves ~110,000 long-lived objects the collector
# tracks, and with the defaults a warm smoke quickstart ran 272 young, 24 middle and 2 full
# collections, 0.17-0.19 s of its ~2.3 s (gc.callbacks, measured); these thresholds leave 10
# young collections and no full one, 0.05-0.06 s. The collector only frees reference cycles
# (everything else is freed by reference counting), so it runs less often, not never, and
# changes no value computed.
GC_THRESHOLDS = (20_000, 20, 10)


def tune_gc() -> None:
    """Set :data:`GC_THRESHOLDS` for this process (a process asyncsim starts)."""
    gc.set_threshold(*GC_THRESHOLDS)
