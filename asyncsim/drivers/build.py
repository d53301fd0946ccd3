"""What the drivers build from a scenario for the layers below: its :class:`Simulation`, its
:class:`Numerics` and a message's size. The drivers see the whole scenario; the timing layer
takes its parts of it (the cluster, the protocol, the timing seed), the numerics theirs (the
model, the data set, the optimizer) and the timing facts the drivers pass down.
"""

from __future__ import annotations

import math
from typing import Any

import jax

from asyncsim.config import Scenario
from asyncsim.numerics.models import num_params
from asyncsim.numerics.numerics import Numerics
from asyncsim.numerics.parts import build_model
from asyncsim.timing.cluster import Simulation
from asyncsim.timing.protocols import make_protocol

__all__ = ["message_bytes", "numerics_for", "simulation_for"]


def simulation_for(scn: Scenario, **kw: Any) -> Simulation:
    """``scn``'s :class:`Simulation`: its cluster and protocol, its timing seed and the folder
    its relative files are read from. ``kw``: :class:`Simulation`'s other keywords
    (``msg_bytes``, ``on_update``, ``track_reads``)."""
    return Simulation(scn.cluster, scn.protocol, seed=scn.timing_seed, base_dir=scn.base_dir,
                      **kw)


def numerics_for(scn: Scenario, **kw: Any) -> Numerics:
    """``scn``'s :class:`Numerics`: its model, data and optimizer parts, told the protocol's
    gradients per update (a timing fact that epoch-based schedules need) and its nominal
    delay (for ``lr_staleness = "nominal"``). ``kw``: :class:`Numerics`' other keywords
    (``grouping``)."""
    proto = make_protocol(scn.protocol, scn.cluster.learners)
    return Numerics(scn.model, scn.data, scn.optimizer, seed=scn.seed,
                    num_learners=scn.cluster.learners, base_dir=scn.base_dir,
                    source=scn.source, grads_per_update=1.0 / proto.updates_per_gradient(),
                    nominal_staleness=proto.nominal_staleness(), **kw)


def message_bytes(scn: Scenario, *, always: bool = False) -> int | None:
    """4 bytes per model parameter, when a message's size matters and is not given: a link,
    or the PS's shared interface in its direction, has a finite bandwidth and no ``bytes``
    (with ``always``, in any case)."""
    net = scn.cluster.network
    if not always and not any(link.bytes is None and (math.isfinite(link.bandwidth) or (
            shared is not None and math.isfinite(shared.bandwidth)))
               for link, shared in ((net.pull, net.ps_egress), (net.push, net.ps_ingress))):
        return None
    # A ScenarioError under `model` for an option it refuses.
    model = build_model(scn.model, source=scn.source, base_dir=scn.base_dir)
    return 4 * num_params(jax.eval_shape(model.init, jax.random.PRNGKey(0)))
