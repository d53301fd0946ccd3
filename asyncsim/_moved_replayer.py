"""What asyncsim 0.1's ``asyncsim.replayer`` had that is now a method (for its shim)."""

from __future__ import annotations

from asyncsim.trace import Trace


def truncate(trace: Trace, updates: int) -> Trace:
    """Deprecated: :meth:`asyncsim.trace.Trace.truncate`."""
    return trace.truncate(updates, stop_reason="diverged")
