"""Deprecated (asyncsim 0.2): moved to asyncsim.numerics.numerics.

Kept importing, with a DeprecationWarning, for one release.
"""

from asyncsim._moved import forward

forward(
    __name__,
    ("asyncsim.numerics.numerics", "asyncsim.drivers.driver", "asyncsim.drivers.build",
     "asyncsim.drivers.checkpoint", "asyncsim._compat"),
    globals(),
    renamed={"_INIT_TAG": "INIT_TAG", "_Shared": "Programs"},
)
