"""``python -m asyncsim``: the same as the ``asyncsim`` command."""

if __name__ == "__main__":  # (imported, as by pkgutil's walk of the package, it does nothing)
    from asyncsim.cli import console

    console()
