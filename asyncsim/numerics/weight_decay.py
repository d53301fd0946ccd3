"""Weight decay of the update core: its scope and per-prefix multipliers (a piece of the
chain, :mod:`asyncsim.numerics.chain`).

Every gradient takes the decay term of the fresh master weights theta (the weights at the
update, not those the gradient was computed on; P2's official code also decays the master
weights): ``g_l + wd_p theta`` with ``wd_p = weight_decay * mult(p)``, ``mult(p)`` the
multiplier of the longest ``weight_decay_mult`` prefix matching the parameter's path (P1's
Caffe recipe: ``{"fc" = 250.0}``), 1 where none does, and 0 on the parameters of rank < 2
under ``weight_decay_scope = "weights"`` (P2's ResNet decays conv kernels and dense
matrices, never biases or normalisation scales). The term is added where the gradients are
weighted: in the softsync aggregate (:mod:`asyncsim.numerics.aggregation`) or in each
shifted buffer's step (:mod:`asyncsim.numerics.momentum`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from asyncsim.errors import ScenarioError
from asyncsim.numerics.chain import Piece

PyTree = Any

__all__ = ["path_str", "wd_multipliers", "weight_decay"]


def path_str(path) -> str:
    """A pytree key path as ``"fc/w"`` (dict keys, attribute names, sequence indices)."""
    parts = []
    for k in path:
        if isinstance(k, jax.tree_util.DictKey):
            parts.append(str(k.key))
        elif isinstance(k, jax.tree_util.GetAttrKey):
            parts.append(k.name)
        elif isinstance(k, jax.tree_util.SequenceKey):
            parts.append(str(k.idx))
        elif isinstance(k, jax.tree_util.FlattenedIndexKey):
            parts.append(str(k.key))
        else:  # pragma: no cover - exotic custom nodes
            parts.append(str(k))
    return "/".join(parts)


def _prefix_matches(prefix: str, path: str) -> bool:
    # Whole path components only: "fc" matches "fc/w" but not "fc2/w".
    prefix = prefix.strip("/")
    return prefix == "" or path == prefix or path.startswith(prefix + "/")


def wd_multipliers(params: PyTree, mult: dict[str, float], scope: str = "all") -> PyTree:
    """A pytree of Python floats: the weight-decay multiplier of each leaf (longest prefix);
    0 for the leaves of rank < 2 under scope ``"weights"`` (biases, normalisation scales)."""

    def one(path, leaf):
        if scope == "weights" and jnp.ndim(leaf) < 2:
            return 0.0
        p = path_str(path)
        best = max(
            (k for k in mult if _prefix_matches(k, p)),
            key=lambda k: len(k.strip("/")),
            default=None,
        )
        return 1.0 if best is None else float(mult[best])

    return jax.tree_util.tree_map_with_path(one, params)


def check_multipliers(params: PyTree, mult: dict[str, float], scope: str) -> None:
    """Raise a ScenarioError under ``optimizer.weight_decay_mult.<prefix>`` for a prefix
    that matches no parameter (under scope ``"weights"``: no parameter of rank >= 2), likely
    a typo."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    # Under scope "weights" only the parameters of rank >= 2 take weight decay at all.
    paths = [path_str(p) for p, leaf in flat if scope == "all" or jnp.ndim(leaf) >= 2]
    for prefix in mult:
        if not any(_prefix_matches(prefix, p) for p in paths):
            what = ("matches no parameter" if scope == "all" else
                    "matches no parameter of rank >= 2 (weight_decay_scope = \"weights\")")
            raise ScenarioError(f"optimizer.weight_decay_mult.{prefix}",
                                f"{what}; parameters: {', '.join(paths)}")


def weight_decay(mult: dict[str, float], scope: str) -> Piece:
    """The decay of each parameter: ``Update.wd = hyper["weight_decay"]`` and
    ``Update.decay``, each leaf's multiplier (:func:`wd_multipliers`), for the pieces that
    weight the gradients. ``init`` checks the prefixes (:func:`check_multipliers`)."""

    def init(params):
        check_multipliers(params, mult, scope)
        return {}

    def update(u, state):
        return u._replace(wd=state.hyper["weight_decay"],
                          decay=wd_multipliers(u.params, mult, scope)), state

    return Piece(init, update)
