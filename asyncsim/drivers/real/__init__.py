"""Real distributed runs on Ray: learner actors and a parameter-server actor computing the
same programs as the simulated drivers (:mod:`.learner`, :mod:`.ps`), started by
:func:`real_run` (:mod:`.run`). Ray is an optional dependency (``pip install
asyncsim[ray]``); this package imports it, so nothing outside the real driver imports this
package eagerly.
"""

from asyncsim.drivers.real.run import (
    RealCluster,
    RealRunError,
    check_supported,
    ensure_ray,
    ray_executor,
    real_run,
    shutdown_ray,
)

__all__ = ["RealCluster", "RealRunError", "check_supported", "ensure_ray", "ray_executor",
           "real_run", "shutdown_ray"]
