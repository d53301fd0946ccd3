"""Deprecated (asyncsim 0.2): moved to asyncsim.numerics.core and asyncsim.numerics.lr_rules.

Kept importing, with a DeprecationWarning, for one release.
"""

from asyncsim._moved import forward

forward(__name__, ("asyncsim.numerics.core", "asyncsim.numerics.lr_rules"), globals())
