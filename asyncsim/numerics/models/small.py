"""Small models: an MLP, least squares and quadratics (stability studies)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from asyncsim._checks import choice, integer, nonneg, shape
from asyncsim.numerics.models.base import (
    DenseInput,
    Model,
    PyTree,
    classifier,
    he_std,
    normals,
    register_model,
    scaled,
    softmax_xent,
    zeros,
)

# --------------------------------------------------------------------------------------------
# Small baselines
# --------------------------------------------------------------------------------------------

#: Deepest MLP accepted (``model.hidden``); far beyond any study here, short of XLA's limits.
MAX_HIDDEN_LAYERS = 100


@register_model("mlp")
def mlp(
    *,
    hidden: Sequence[int] = (128,),
    input_shape: Sequence[int] = (32, 32, 3),
    num_classes: int = 10,
    activation: str = "relu",
    loss: str = "xent",
    input_pool: int = 1,
) -> Model:
    """MLP on flattened inputs; ReLU with He-normal init and softmax cross-entropy by default.

    Options (the defaults reproduce the original model bit for bit):

    * ``activation``: ``"relu"`` (He-normal hidden weights, std ``sqrt(2/fan_in)``) or
      ``"tanh"`` (LeCun-normal hidden weights, std ``sqrt(1/fan_in)``). The output layer is
      He-normal times ``sqrt(0.5)`` (= LeCun-normal) either way; biases start at zero.
    * ``loss``: ``"xent"`` (softmax cross-entropy) or ``"mse"``: squared error against the
      one-hot labels, ``0.5 * mean_b ||f(x_b) - onehot(y_b)||^2`` (the ``linear`` model's
      loss; Cohen et al., ICLR 2021, see edge-of-stability most clearly with it).
      :meth:`Model.error` is the argmax error for both.
    * ``input_pool``: ``k > 1`` average-pools an image input (``input_shape = (H, W, C)``,
      ``H`` and ``W`` divisible by ``k``) over non-overlapping ``k x k`` windows before
      flattening, e.g. 32x32x3 -> 8x8x3 = 192 features at ``k = 4``: a cheap low-dimensional
      input for CPU-scale studies. ``input_shape`` stays the un-pooled shape.
    """
    hidden, input_shape, num_classes, activation, loss_kind, pool = _mlp_options(
        hidden, input_shape, num_classes, activation, loss, input_pool)
    act = jax.nn.relu if activation == "relu" else jnp.tanh
    hidden_gain = 1.0 if activation == "relu" else math.sqrt(0.5)
    sizes = [int(np.prod(input_shape)) // (pool * pool), *hidden, num_classes]
    names = [f"dense{i + 1}" for i in range(len(sizes) - 2)] + ["fc"]
    init_fn = _dense_init(sizes, names, hidden_gain)
    features = _pooled_features(input_shape, pool)

    def from_first(params: PyTree, z: jax.Array) -> jax.Array:
        """Logits from the first layer's pre-activation z (params[names[0]] unused)."""
        h = z
        for name in names[1:]:
            h = act(h) @ params[name]["w"] + params[name]["b"]
        return h

    def apply(params: PyTree, x: jax.Array) -> jax.Array:
        first = params[names[0]]
        return from_first(params, features(x) @ first["w"] + first["b"])

    if loss_kind == "xent":
        def head(rest: PyTree, z: jax.Array, y: jax.Array) -> jax.Array:
            return softmax_xent(from_first(rest, z), y)

        return dataclasses.replace(classifier("mlp", init_fn, apply, input_shape, num_classes),
                                   dense_input=DenseInput(names[0], features, head))

    def mse_of(pred: jax.Array, y: jax.Array) -> jax.Array:
        target = jax.nn.one_hot(y, num_classes, dtype=jnp.float32)
        return 0.5 * jnp.mean(jnp.sum((pred.astype(jnp.float32) - target) ** 2, axis=-1))

    def mse(params: PyTree, x: jax.Array, y: jax.Array) -> jax.Array:
        return mse_of(apply(params, x), y)

    def mse_head(rest: PyTree, z: jax.Array, y: jax.Array) -> jax.Array:
        return mse_of(from_first(rest, z), y)

    return Model("mlp", init_fn, apply, mse, input_shape, num_classes,
                 dense_input=DenseInput(names[0], features, mse_head))


def _mlp_options(hidden, input_shape, num_classes, activation, loss, input_pool):
    """The checked options of an :func:`mlp`, in its order (the first wrong one is
    refused)."""
    empty = isinstance(hidden, Sequence) and not isinstance(hidden, str) and len(hidden) == 0
    hidden = () if empty else shape("hidden", hidden)
    if len(hidden) > MAX_HIDDEN_LAYERS:
        # XLA compiles one fused step per layer: thousands of layers take minutes to compile
        # (or abort) long before any gradient, so refuse at the scenario instead
        raise ValueError(
            f"hidden: at most {MAX_HIDDEN_LAYERS} layers, got {len(hidden)}")
    input_shape = shape("input_shape", input_shape)
    num_classes = integer("num_classes", num_classes)
    activation = choice("activation", activation, ("relu", "tanh"))
    loss_kind = choice("loss", loss, ("xent", "mse"))
    pool = integer("input_pool", input_pool)
    if pool > 1 and (len(input_shape) != 3 or input_shape[0] % pool or input_shape[1] % pool):
        raise ValueError(f"input_pool: {pool} needs input_shape (H, W, C) with H and W "
                         f"divisible by it, got {input_shape}")
    return hidden, input_shape, num_classes, activation, loss_kind, pool


def _dense_init(sizes: list[int], names: list[str], hidden_gain: float):
    """``init(key)`` of dense layers ``sizes[i] -> sizes[i + 1]`` named ``names``: weights
    He-normal times ``hidden_gain`` (the output layer ``fc`` times ``sqrt(0.5)``), zero
    biases."""

    def init_fn(key: jax.Array) -> PyTree:
        draws = normals(key, list(zip(sizes[:-1], sizes[1:], strict=True)))
        return {
            name: {
                "w": scaled(scaled(n01, he_std(a)),
                            hidden_gain if name != "fc" else math.sqrt(0.5)),
                "b": zeros((b,)),
            }
            for n01, name, a, b in zip(draws, names, sizes[:-1], sizes[1:], strict=True)
        }

    return init_fn


def _pooled_features(input_shape: tuple[int, ...], pool: int):
    """The flattened input of a batch, average-pooled over ``pool x pool`` windows first
    when ``pool > 1``."""

    def features(x: jax.Array) -> jax.Array:
        if pool > 1:
            hh, ww, cc = input_shape
            x = x.reshape(x.shape[0], hh // pool, pool, ww // pool, pool, cc).mean(axis=(2, 4))
        return x.reshape(x.shape[0], -1)

    return features


@register_model("linear")
def linear(*, input_shape: Sequence[int] = (32, 32, 3), num_classes: int | None = 10) -> Model:
    """Least squares on flattened inputs (convex), params ``{"fc": {"w", "b"}}``, zero init.

    With ``num_classes = K`` the K outputs regress the one-hot labels (mean over the batch of
    ``0.5 * ||f(x) - onehot(y)||^2``) and :meth:`Model.error` is the argmax error; with
    ``num_classes = 0`` (or None) there is a single output regressing ``y`` as a float and the
    error is the loss.
    """
    input_shape = shape("input_shape", input_shape)
    k = None if num_classes in (None, 0) else integer("num_classes", num_classes)
    d = int(np.prod(input_shape))
    out = k or 1

    def init_fn(key: jax.Array) -> PyTree:
        del key  # deterministic: the convex problem has a unique-ish optimum anyway
        return {"fc": {"w": zeros((d, out)), "b": zeros((out,))}}

    def features(x: jax.Array) -> jax.Array:
        return x.reshape(x.shape[0], -1)

    def apply(params: PyTree, x: jax.Array) -> jax.Array:
        pred = features(x) @ params["fc"]["w"] + params["fc"]["b"]
        return pred if k else pred[:, 0]

    def loss_of(pred: jax.Array, y: jax.Array) -> jax.Array:
        target = jax.nn.one_hot(y, k) if k else y.astype(jnp.float32)
        sq = (pred - target) ** 2
        return 0.5 * jnp.mean(jnp.sum(sq, axis=-1) if k else sq)

    def loss(params: PyTree, x: jax.Array, y: jax.Array) -> jax.Array:
        return loss_of(apply(params, x), y)

    def head(rest: PyTree, z: jax.Array, y: jax.Array) -> jax.Array:
        del rest  # the one layer is the dense input layer
        return loss_of(z if k else z[:, 0], y)

    return Model("linear", init_fn, apply, loss, input_shape, k,
                 dense_input=DenseInput("fc", features, head))


# --------------------------------------------------------------------------------------------
# Quadratic (P2 stability studies)
# --------------------------------------------------------------------------------------------


def _spectrum(dim: int, spec: Mapping[str, Any]) -> np.ndarray:
    allowed = {"max", "min", "kind"}
    if not isinstance(spec, Mapping) or set(spec) - allowed or not {"max", "min"} <= set(spec):
        raise ValueError(f"spectrum: must be a table with keys max, min[, kind], got {spec!r}")
    hi, lo = float(spec["max"]), float(spec["min"])
    kind = choice("spectrum.kind", spec.get("kind", "linear"), ("linear", "log"))
    if not (math.isfinite(hi) and math.isfinite(lo)) or hi < lo:
        raise ValueError(f"spectrum: needs finite min <= max, got {spec!r}")
    if kind == "log":
        if lo <= 0:
            raise ValueError(f"spectrum: a log spectrum needs min > 0, got {lo}")
        return np.geomspace(hi, lo, dim)
    return np.linspace(hi, lo, dim)


@register_model("quadratic")
def quadratic(
    *,
    dim: int | None = None,
    eigenvalues: Sequence[float] | None = None,
    spectrum: Mapping[str, Any] | None = None,
    noise: float = 0.0,
) -> Model:
    """Diagonal quadratic ``L(w) = 0.5 sum_i lambda_i (w_i - w*_i)^2 + noise * mean_b(x_b . w)``.

    ``w* = 0``. Give the Hessian eigenvalues either as ``eigenvalues`` (a list; ``dim`` is then
    optional) or as ``spectrum = {max, min, kind = "linear" | "log"}`` with ``dim``, coordinate 0
    holding ``max``; neither gives ``dim`` eigenvalues of 1. ``x`` is a batch of standard normal
    features of shape ``(B, dim)`` (the ``gaussian`` dataset), so the noise term adds a zero-mean
    gradient perturbation ``noise * mean_b x_b`` with per-coordinate variance ``noise**2 / B``;
    with ``noise = 0`` the data are ignored. Labels are ignored.

    ``init`` ignores its key and returns ``w = w* + 1`` (all ones) so that every run of a
    stability study starts from the same point and divergence is a property of (eta, tau) only.
    The spectrum is exposed as ``model.hessian_eigenvalues`` / :func:`quadratic_spectrum`.
    """
    if eigenvalues is not None and spectrum is not None:
        raise ValueError("give either eigenvalues or spectrum, not both")
    if eigenvalues is not None:
        lam = np.asarray([float(v) for v in eigenvalues], np.float64)
        if lam.ndim != 1 or lam.size == 0 or not np.all(np.isfinite(lam)):
            raise ValueError(f"eigenvalues: must be a non-empty list of finite numbers: {lam}")
        if dim is not None and integer("dim", dim) != lam.size:
            raise ValueError(f"dim: {dim} but {lam.size} eigenvalues were given")
    else:
        dim = integer("dim", dim if dim is not None else 10)
        lam = np.ones(dim) if spectrum is None else _spectrum(dim, spectrum)
    noise = nonneg("noise", noise)
    d = lam.size
    lam32 = jnp.asarray(lam, jnp.float32)

    def init_fn(key: jax.Array) -> PyTree:
        del key  # deterministic start, see the docstring
        return {"w": jnp.ones((d,), jnp.float32)}

    def apply(params: PyTree, x: jax.Array) -> jax.Array:
        # Per-example "prediction" x_b . w, so apply has a well-defined output.
        return x.reshape(x.shape[0], -1) @ params["w"]

    def loss(params: PyTree, x: jax.Array, y: jax.Array) -> jax.Array:
        del y
        w = params["w"]
        value = 0.5 * jnp.sum(lam32 * w * w)
        if noise:
            value = value + noise * jnp.mean(apply(params, x))
        return value

    return Model("quadratic", init_fn, apply, loss, (d,), None, hessian_eigenvalues=lam)
