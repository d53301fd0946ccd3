"""Deprecated (asyncsim 0.2): moved to asyncsim.drivers.real, asyncsim.calibrate and
asyncsim.cli.real.

Kept importing, with a DeprecationWarning, for one release.
"""

from asyncsim._moved import forward

forward(
    __name__,
    (
        "asyncsim.drivers.real",
        "asyncsim.drivers.real.run",
        "asyncsim.drivers.real.learner",
        "asyncsim.drivers.real.ps",
        "asyncsim.drivers.real.threads",
        "asyncsim.drivers.plugins",
        "asyncsim.calibrate",
        "asyncsim.cli.real",
    ),
    globals(),
    renamed={
        "real_command": "cmd_real",
        "calibrate_command": "cmd_calibrate",
        "compare_command": "cmd_compare",
    },
)
