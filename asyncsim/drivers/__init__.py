"""The drivers: what executes a run's numerics from its timing, all through one
:class:`~asyncsim.drivers.driver.Driver`.

:mod:`.online` (SimPy timing with gradients as it goes), :mod:`.trace_only` (timing alone),
:mod:`.replay` (a recorded trace as a loop of the same compiled steps: bit-identical to
online), :mod:`.scan` (the compiled-chunk executor), :mod:`.vmapped` (sweep points as one
program), :mod:`.choose` (measured choices among them) and :mod:`.real` (Ray actors). A
driver never imports the API or the CLI (an import-linter contract).
"""
