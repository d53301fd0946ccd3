"""``python -m asyncsim.cli``: the same as the ``asyncsim`` command."""

import sys

from asyncsim.cli import main

sys.exit(main())
