"""Deprecated (asyncsim 0.2): moved to asyncsim.numerics.models.imagenet.

Kept importing, with a DeprecationWarning, for one release.
"""

from asyncsim._moved import forward

forward(__name__, ("asyncsim.numerics.models.imagenet",), globals())
