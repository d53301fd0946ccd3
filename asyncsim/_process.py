"""Settings of the processes asyncsim starts itself: the ``asyncsim`` command
(:func:`asyncsim.cli.console`) and the figure worker (``python -m asyncsim.figures``).
Never applied on import: a notebook or a test that imports asyncsim keeps its own."""

from __future__ import annotations

import contextlib
import gc
import signal
import threading

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


# Ctrl-C, kept. Python raises KeyboardInterrupt in whatever Python code runs when the signal
# arrives; if that is a garbage-collector callback (JAX registers one that frees XLA
# buffers) or a ``__del__``, the interpreter prints "Exception ignored" and drops it: the
# run went on to its end and exited 0. So the ``asyncsim`` command's handler also records
# it, and the Driver raises it again after the next update (:func:`raise_if_interrupted`).
_interrupted = False


def _on_sigint(signum, frame):
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def raise_if_interrupted() -> None:
    """Raise the KeyboardInterrupt of a Ctrl-C that was lost (see above); nothing
    otherwise (one global read: the Driver calls it after every update)."""
    global _interrupted
    if _interrupted:
        _interrupted = False
        raise KeyboardInterrupt


@contextlib.contextmanager
def sigint_kept():
    """While it is open, Ctrl-C in this process is also recorded, so that a lost one is
    raised again (:func:`raise_if_interrupted`). Installed only in the main thread and over
    Python's own handler: a program that handles SIGINT itself keeps its handler."""
    global _interrupted
    ours = (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    if not ours:
        # Another handler, or this one already (a call inside a verb): nothing to do.
        yield
        return
    _interrupted = False
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is _on_sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        _interrupted = False  # after the restore: a Ctrl-C from now on is Python's own
