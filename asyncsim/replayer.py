"""Deprecated (asyncsim 0.2): moved to asyncsim.drivers (replay, scan, vmapped, choose)
and asyncsim.api.

Kept importing, with a DeprecationWarning, for one release.
"""

from asyncsim._moved import forward

forward(
    __name__,
    (
        "asyncsim.api",  # replay, replay_folder: the public ones, with the measurements
        "asyncsim.drivers.replay",
        "asyncsim.drivers.scan",
        "asyncsim.drivers.slots",
        "asyncsim.drivers.vmapped",
        "asyncsim.drivers.choose",
        "asyncsim._compat",
    ),
    globals(),
)
