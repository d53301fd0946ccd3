"""Deprecated (asyncsim 0.2): moved to asyncsim.timing.cluster.

Kept importing, with a DeprecationWarning, for one release.
"""

from asyncsim._moved import forward

forward(__name__, ("asyncsim.timing.cluster",), globals())
