"""Errors that users see.

A :class:`ScenarioError` always names the file, the key and what is allowed, so the CLI can
print it as one line and exit with status 2 (see ``asyncsim.cli``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ScenarioError(ValueError):
    """An invalid scenario: which file, which key, what is allowed.

    ``str(err)`` is the one-line message the CLI prints, e.g.
    ``scenarios/x.toml: protocol.n: must be an integer in 1..8 (cluster.learners), got 12``.
    """

    def __init__(self, key: str, message: str, file: str | None = None):
        self.key = key
        self.message = message
        self.file = file
        # args rebuild the error: SimPy re-raises a process's exception as type(e)(*e.args),
        # and pickling (Ray) does the same.
        super().__init__(key, message, file)

    def __str__(self) -> str:
        return self._render()

    def _render(self) -> str:
        where = self.file or "<scenario>"
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"

    def with_file(self, file: str | None) -> ScenarioError:
        """The same error, attributed to ``file`` (keeps an existing attribution)."""
        if self.file is not None or file is None:
            return self
        return ScenarioError(self.key, self.message, file=file)

    def under(self, prefix: str) -> ScenarioError:
        """The same error with its key nested under ``prefix`` (``cluster`` + ``compute``)."""
        key = f"{prefix}.{self.key}" if self.key else prefix
        return ScenarioError(key, self.message, file=self.file)


def first_line(e: BaseException | str) -> str:
    """The first line of an error's message (its type's name if it has none): what a
    :class:`ScenarioError` quotes of a library's or a plug-in's error, whose message may run
    to many lines (JAX's tracer errors do)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def did_you_mean(name: object, allowed: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the allowed name closest to a misspelt ``name``
    (``inverse_staleness`` -> ``inverse-staleness``, ``hiden`` -> ``hidden``, ``p1-f3`` ->
    ``p1_f3_lr_modulation``), else ``""``. Case and ``_`` vs ``-`` are ignored; a unique
    prefix wins over a close spelling. Appended to every unknown-name message, after the
    list of what is allowed."""
    if not isinstance(name, str) or not name:
        return ""

    def norm(s: str) -> str:
        return s.lower().replace("_", "-")

    by_norm = {norm(a): a for a in allowed}
    key = norm(name)
    prefixed = [a for n, a in by_norm.items() if n.startswith(key)]
    if key in by_norm:
        hint = [by_norm[key]]
    elif len(prefixed) == 1:
        hint = prefixed
    else:
        hint = [by_norm[n] for n in difflib.get_close_matches(key, list(by_norm), n=1)]
    return f" (did you mean {hint[0]!r}?)" if hint and hint[0] != name else ""
