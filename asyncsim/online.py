"""Deprecated (asyncsim 0.2): moved to asyncsim.drivers.online and asyncsim.drivers.driver.

Kept importing, with a DeprecationWarning, for one release.
"""

from asyncsim._moved import forward

forward(
    __name__,
    ("asyncsim.api", "asyncsim.drivers.online", "asyncsim.drivers.driver",
     "asyncsim.drivers.build", "asyncsim.drivers.checkpoint", "asyncsim.drivers.metrics"),
    globals(),
    renamed={"_Recorder": "Recorder"},
)
