"""The numerics layer: the update core, learning-rate rules, models, data and the compiled
gradient and update programs of a scenario.

Nothing here imports SimPy, Ray, the timing layer or scenario files (an import-linter
contract in pyproject.toml): numerics are pure JAX functions of parameters, batches and the
timing *rows* a driver hands them. Modules: :mod:`.core` (the optax-style update pair),
:mod:`.lr_rules` (the one table of learning-rate rules), :mod:`.models`, :mod:`.data`,
:mod:`.numerics` (:class:`~asyncsim.numerics.numerics.Numerics`: a scenario's programs).
"""

from asyncsim.numerics.compile_cache import enable as _enable_compile_cache

# Before anything compiles: JAX's persistent compilation cache (compile_cache's docstring).
_enable_compile_cache()
