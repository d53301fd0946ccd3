"""The timing layer: SimPy learners, links and parameter server; protocols; delay models.

Nothing here imports JAX, optax or Ray, or any numerics (an import-linter contract in
pyproject.toml): timing never looks at gradient values, so a trace can be simulated alone
(``asyncsim trace``) at any scale. Modules: :mod:`.delays` (delay models), :mod:`.protocols`
(when the PS updates and which gradients it takes), :mod:`.cluster` (the SimPy processes
that produce a :class:`~asyncsim.trace.Trace`).
"""
