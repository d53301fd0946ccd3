"""A protocol's view of the real PS: the part of :class:`asyncsim.timing.cluster.Simulation`
protocols use (``version``, ``env.event()``, ``apply_update(grads)``), so the scenario's
unchanged protocol object decides the PS's updates on the wall clock."""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["Clock"]


class _Event:
    """Stand-in for a SimPy event: protocols only create, ``succeed`` and test it."""

    __slots__ = ("callbacks", "triggered")

    def __init__(self):
        self.callbacks: list[Callable[[], None]] = []
        self.triggered = False

    def succeed(self):
        self.triggered = True
        cbs, self.callbacks = self.callbacks, []
        for cb in cbs:
            cb()


class _Env:
    def event(self):
        return _Event()


class Clock:
    """The part of :class:`asyncsim.timing.cluster.Simulation` protocols use: ``version``,
    ``env.event()``, ``apply_update(grads)``."""

    def __init__(self, apply: Callable[[Sequence[tuple]], None]):
        self.env = _Env()
        self.version = 0
        self._apply = apply

    def apply_update(self, grads):
        self._apply(list(grads))

    def note_pull(self, learner, version):  # hardsync/ssp never need it; kept for plug-ins
        pass
