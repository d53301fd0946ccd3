"""Models: pure ``init``/``apply``/``loss`` function triples keyed by name.

Contract (other modules code against exactly this; docs/design.md):

* A :class:`Model` bundles ``init(key) -> params`` (a nested dict ``{"layer": {"w": .., "b": ..}}``
  of float32 arrays), ``apply(params, x) -> logits`` (pure, no mutable state),
  ``loss(params, x, y) -> scalar mean loss over the batch``, the per-example ``input_shape`` and
  ``num_classes`` (``None`` for regression / quadratic models).
* :meth:`Model.error` is the classification error rate (fraction wrong); for models without
  classes it is the loss.
* :func:`get_model` builds a registered model from keyword options; an unknown name or a bad
  option raises :class:`ValueError` naming what is allowed (the scenario layer turns it into a
  ``ScenarioError``). :func:`register_model` opens the registry to users.
* :func:`grad_fn` is ``jax.value_and_grad(model.loss)``; it is *not* jitted, callers jit.

Built-ins
---------
``cifar10-full``
    P1's Caffe ``cifar10_full`` network (Zhang et al. 2016), 89,578 parameters, NHWC.
``resnet20`` / ``resnet44``
    P2's CIFAR ResNets (He et al. 2016, option-A identity shortcuts), ~0.27M / ~0.66M params.
``mlp``, ``linear``
    Small baselines; ``linear`` is least squares (a second convex case). ``mlp`` options
    ``activation`` (relu | tanh), ``loss`` (xent | mse on one-hot labels) and ``input_pool``
    (average-pool images k x k before flattening) serve edge-of-stability studies (P2-F2/F4).
``quadratic``
    ``0.5 * sum_i lambda_i (w_i - w*_i)^2`` plus optional gradient noise, for stability studies
    (P2's edge ``eta * lambda_max < 2 sin(pi / (4 tau + 2))``).

BatchNorm policy (ResNets)
--------------------------
Models are pure: ``norm="batch"`` normalises with the *current batch's* statistics both in
training and in evaluation; there are no running averages, hence no state for asynchronous
learners to overwrite. This differs from P2's official code, where the server's running
statistics are overwritten by those of whichever worker pushed last. Evaluation results
therefore depend (weakly) on the evaluation batch size; evaluate with large batches (>= 100).
``norm="none"`` is a normalisation-free variant with Fixup-style initialisation (Zhang,
Dauphin & Ma 2019): the last conv of each residual branch starts at zero, so every block starts
as the identity and the network trains stably without normalisation.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from asyncsim._registry import PluginRegistry, build, callable_value

PyTree = Any

__all__ = [
    "DenseInput",
    "Model",
    "available_models",
    "expand_parts",
    "get_model",
    "grad_fn",
    "grad_parts",
    "num_params",
    "quadratic_spectrum",
    "register_model",
]


# --------------------------------------------------------------------------------------------
# The contract
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DenseInput:
    """An optional fact about a model: its first layer is dense on features of the input,
    ``z = features(x) @ params[name]["w"] + params[name]["b"]``, and the loss is
    ``head(rest, z, y)`` with ``rest`` the parameters without ``params[name]``.

    Then a gradient's kernel part is ``features(x)^T dL/dz``, so a gradient can be kept as
    the [batch, out] cotangent dL/dz instead of the [in, out] kernel gradient and expanded
    when it is applied (:func:`grad_parts`, :func:`expand_parts`). The replayer's scan path
    uses this to keep pending gradients instead of stale parameter versions (README,
    Performance): for an MLP on images the first kernel is nearly all the parameters.
    """

    name: str
    features: Callable[[jax.Array], jax.Array]
    head: Callable[[PyTree, jax.Array, jax.Array], jax.Array]


@dataclass(frozen=True)
class Model:
    """A pure model. See the module docstring for the contract.

    ``hessian_eigenvalues`` is set only for models whose Hessian is known in closed form (the
    ``quadratic``); it is a float64 numpy array, sorted as the parameter coordinates.
    ``dense_input`` (optional, :class:`DenseInput`) says the first layer is dense.
    """

    name: str
    init: Callable[[jax.Array], PyTree]
    apply: Callable[[PyTree, jax.Array], jax.Array]
    loss: Callable[[PyTree, jax.Array, jax.Array], jax.Array]
    input_shape: tuple[int, ...]
    num_classes: int | None
    hessian_eigenvalues: np.ndarray | None = None
    dense_input: DenseInput | None = None

    def error(self, params: PyTree, x: jax.Array, y: jax.Array) -> jax.Array:
        """Fraction of wrongly classified examples; for non-classifiers, the loss."""
        if self.num_classes is None:
            return self.loss(params, x, y)
        logits = self.apply(params, x)
        return jnp.mean((jnp.argmax(logits, axis=-1) != y).astype(jnp.float32))


_registry: PluginRegistry[Callable[..., Model]] = PluginRegistry(
    "asyncsim.models", "model", "model.name",
    adapt=callable_value("a factory f(**options) -> Model"))


def register_model(name: str, *, replace: bool = False
                   ) -> Callable[[Callable[..., Model]], Callable[..., Model]]:
    """Decorator registering a factory ``f(**options) -> Model`` under ``name``.

    An installed package can instead expose the factory under the entry-point group
    ``asyncsim.models`` (docs/plugins.md); a name registered here wins over it. A name
    taken by another factory is a ValueError naming both unless ``replace``
    (:meth:`asyncsim._registry.PluginRegistry.register`).
    """
    return _registry.decorator(name, replace=replace)


def available_models() -> list[str]:
    """Sorted names of the models: built-ins, registered factories and entry points."""
    return _registry.names()


def model_factory(name: str) -> Callable[..., Model]:
    """The factory registered (or installed) as ``name``; ScenarioError under ``model.name``
    for an unknown name."""
    return _registry.get(name)


def get_model(name: str, *, base_dir: str | os.PathLike | None = None,
              **options: Any) -> Model:
    """Build model ``name`` with ``options``; a relative ``Path`` option resolves against
    ``base_dir`` (a scenario's: its file's folder), as a data set's and a delay model's do.

    Raises ValueError for an unknown name (a :class:`~asyncsim.errors.ScenarioError` under
    ``model.name`` listing the allowed names) or for an option the factory does not accept
    or rejects (listing the factory's parameters).
    """
    return build(model_factory(name), options, key="model", what=_registry.what, name=name,
                 also=("name",), base_dir=base_dir)


def num_params(params: PyTree) -> int:
    """Total number of scalar parameters in a pytree."""
    return int(sum(np.prod(np.shape(leaf)) for leaf in jax.tree_util.tree_leaves(params)))


def tree_bytes(tree: PyTree) -> int:
    """Bytes of a pytree's arrays (or their ``jax.ShapeDtypeStruct`` s), each at its dtype."""
    return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))


def grad_fn(model: Model) -> Callable[[PyTree, jax.Array, jax.Array], tuple[jax.Array, PyTree]]:
    """``(params, x, y) -> (loss, grads)``; jit-friendly but not jitted (callers jit)."""
    return jax.value_and_grad(model.loss)


def grad_parts(model: Model, params: PyTree, x: jax.Array,
               y: jax.Array) -> tuple[jax.Array, tuple[PyTree, jax.Array]]:
    """``(loss, (rest_grads, dL/dz))`` for a model with :attr:`Model.dense_input`: the
    gradient with its first kernel left factored (see :class:`DenseInput`)."""
    d = model.dense_input
    first = params[d.name]
    z = d.features(x) @ first["w"] + first["b"]
    rest = {k: v for k, v in params.items() if k != d.name}
    loss, (g_rest, g_z) = jax.value_and_grad(d.head, argnums=(0, 1))(rest, z, y)
    return loss, (g_rest, g_z)


def expand_parts(model: Model, parts: tuple[PyTree, jax.Array], features: jax.Array) -> PyTree:
    """The full gradient from :func:`grad_parts`'s parts and ``features(x)`` of the same
    input: the first kernel's gradient is ``features^T dL/dz``, its bias's ``sum_b dL/dz``."""
    d = model.dense_input
    g_rest, g_z = parts
    return {**g_rest, d.name: {"w": features.T @ g_z, "b": jnp.sum(g_z, axis=0)}}


def quadratic_spectrum(model: Model) -> np.ndarray:
    """Hessian eigenvalues of a model with a closed-form Hessian (the ``quadratic``)."""
    if model.hessian_eigenvalues is None:
        raise ValueError(f"model {model.name!r} has no closed-form Hessian spectrum")
    return model.hessian_eigenvalues


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def softmax_xent(logits: jax.Array, y: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, y.astype(jnp.int32)[:, None], axis=-1))


def classifier(
    name: str,
    init: Callable[[jax.Array], PyTree],
    apply: Callable[[PyTree, jax.Array], jax.Array],
    input_shape: Sequence[int],
    num_classes: int,
) -> Model:
    def loss(params: PyTree, x: jax.Array, y: jax.Array) -> jax.Array:
        return softmax_xent(apply(params, x), y)

    return Model(name, init, apply, loss, tuple(int(s) for s in input_shape), int(num_classes))


def conv2d(x: jax.Array, w: jax.Array, stride: int = 1, pad: int | str = "SAME") -> jax.Array:
    padding = [(pad, pad), (pad, pad)] if isinstance(pad, int) else pad
    return jax.lax.conv_general_dilated(
        x, w, (stride, stride), padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


# Initialisers run once per run. Each JAX op on a new shape is a program to trace, lower and
# compile (or load from the compilation cache): a warm run paid ~0.05 s for each layer's
# draw. So a model's normal draws are one program (:func:`normals`: the key split and every
# layer's draw, the bits of drawing them one by one), and the scaling and the zeros are done
# on the host: numpy's float32 multiply rounds as XLA's does, so the values are the bits the
# device ops gave. (Jitting a whole init would fuse the scaling into the sampler and change
# the last bits of every model's initial weights.)
def normals(key: jax.Array, shapes: Sequence[Sequence[int] | None]) -> list:
    """float32 ``N(0, 1)`` draws: entry ``i`` is ``jax.random.normal(keys[i], shapes[i])``
    with ``keys = jax.random.split(key, len(shapes))``, or None where ``shapes[i]`` is None
    (that key is left unused). One compiled program for all of them, the same bits as the
    draws one by one (tests/unit/test_models.py); host arrays, or tracers when ``key`` is traced
    (an init under ``jax.eval_shape`` or ``jit``)."""
    shapes = tuple(None if s is None else tuple(int(d) for d in s) for s in shapes)
    if isinstance(key, jax.core.Tracer):
        return _normals(key, shapes)
    return [None if x is None else np.asarray(x) for x in _normals_jit(key, shapes)]


def _normals(key: jax.Array, shapes: tuple) -> list:
    keys = jax.random.split(key, len(shapes))
    return [None if s is None else jax.random.normal(keys[i], s, jnp.float32)
            for i, s in enumerate(shapes)]


_normals_jit = jax.jit(_normals, static_argnums=1)


def he_std(fan_in: int) -> float:
    """He et al. (2015)'s standard deviation ``sqrt(2 / fan_in)``."""
    return math.sqrt(2.0 / fan_in)


def scaled(x: jax.Array, factor: float) -> jax.Array:
    """``x * factor`` in float32 (``factor`` rounded to float32 first, as JAX rounds a
    Python scalar), on the host; traced (an init under ``jax.eval_shape`` or ``jit``), the
    same multiply on the device."""
    if isinstance(x, jax.core.Tracer):
        return x * jnp.float32(factor)
    return jax.device_put(np.asarray(x) * np.float32(factor))


def zeros(shape: Sequence[int]) -> jax.Array:
    """float32 zeros for an initialiser, with no program to compile."""
    return jax.device_put(np.zeros(tuple(shape), np.float32))


def ones(shape: Sequence[int]) -> jax.Array:
    """float32 ones for an initialiser, with no program to compile."""
    return jax.device_put(np.ones(tuple(shape), np.float32))
