"""``python -m asyncsim.cli``: the same as the ``asyncsim`` command."""

from asyncsim.cli import console

console()
