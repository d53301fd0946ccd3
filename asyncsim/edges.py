"""Deprecated (asyncsim 0.2): moved to asyncsim.stability.measured.

Kept importing, with a DeprecationWarning, for one release.
"""

from asyncsim._moved import forward

forward(__name__, ("asyncsim.stability.measured", "asyncsim.stability.measure",
                   "asyncsim._compat"), globals())
