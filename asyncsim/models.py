"""Models: pure ``init``/``apply``/``loss`` function triples keyed by name.

Contract (other modules code against exactly this; DESIGN.md, "Data and models"):

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

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from asyncsim._factory import build
from asyncsim._plugins import PluginRegistry, callable_value

PyTree = Any

__all__ = [
    "DenseInput",
    "Model",
    "available_models",
    "expand_parts",
    "get_model",
    "grad_fn",
    "grad_parts",
    "local_response_norm_within_channel",
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


def register_model(name: str) -> Callable[[Callable[..., Model]], Callable[..., Model]]:
    """Decorator registering a factory ``f(**options) -> Model`` under ``name``.

    An installed package can instead expose the factory under the entry-point group
    ``asyncsim.models`` (docs/plugins.md); a name registered here wins over it.
    """
    return _registry.decorator(name)


def available_models() -> list[str]:
    """Sorted names of the models: built-ins, registered factories and entry points."""
    return _registry.names()


def model_factory(name: str) -> Callable[..., Model]:
    """The factory registered (or installed) as ``name``; ScenarioError under ``model.name``
    for an unknown name."""
    return _registry.get(name)


def get_model(name: str, **options: Any) -> Model:
    """Build model ``name`` with ``options``.

    Raises ValueError for an unknown name (a :class:`~asyncsim.errors.ScenarioError` under
    ``model.name`` listing the allowed names) or for an option the factory does not accept
    or rejects (listing the factory's parameters).
    """
    return build("model", name, model_factory(name), options)


def num_params(params: PyTree) -> int:
    """Total number of scalar parameters in a pytree."""
    return int(sum(np.prod(np.shape(leaf)) for leaf in jax.tree_util.tree_leaves(params)))


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


def _softmax_xent(logits: jax.Array, y: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, y.astype(jnp.int32)[:, None], axis=-1))


def _classifier(
    name: str,
    init: Callable[[jax.Array], PyTree],
    apply: Callable[[PyTree, jax.Array], jax.Array],
    input_shape: Sequence[int],
    num_classes: int,
) -> Model:
    def loss(params: PyTree, x: jax.Array, y: jax.Array) -> jax.Array:
        return _softmax_xent(apply(params, x), y)

    return Model(name, init, apply, loss, tuple(int(s) for s in input_shape), int(num_classes))


def _as_shape(value: Any, what: str) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ValueError(f"{what} must be a list of positive integers, got {value!r}")
    out = []
    for v in value:
        if not isinstance(v, int | np.integer) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{what} must be a list of positive integers, got {value!r}")
        out.append(int(v))
    return tuple(out)


def _pos_int(value: Any, what: str) -> int:
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def _choice(value: Any, what: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def _conv(x: jax.Array, w: jax.Array, stride: int = 1, pad: int | str = "SAME") -> jax.Array:
    padding = [(pad, pad), (pad, pad)] if isinstance(pad, int) else pad
    return jax.lax.conv_general_dilated(
        x, w, (stride, stride), padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def _he_normal(key: jax.Array, shape: Sequence[int], fan_in: int) -> jax.Array:
    return jax.random.normal(key, shape, jnp.float32) * jnp.float32(math.sqrt(2.0 / fan_in))


def _caffe_pool_padding(size: int, k: int, s: int) -> int:
    """Extra high-side padding so that pooling uses Caffe's ceil mode (32 -> 16 -> 8 -> 4)."""
    out = -(-(size - k) // s) + 1  # ceil((size - k) / s) + 1
    return max(0, (out - 1) * s + k - size)


def _max_pool_ceil(x: jax.Array, k: int = 3, s: int = 2) -> jax.Array:
    ph = _caffe_pool_padding(x.shape[1], k, s)
    pw = _caffe_pool_padding(x.shape[2], k, s)
    return jax.lax.reduce_window(
        x, -jnp.inf, jax.lax.max, (1, k, k, 1), (1, s, s, 1), ((0, 0), (0, ph), (0, pw), (0, 0))
    )


def _avg_pool_ceil(x: jax.Array, k: int = 3, s: int = 2) -> jax.Array:
    # Caffe's AVE pooling with pad 0 divides by the number of in-bounds elements of a window
    # clipped at the border (pool_size uses min(hstart + k, height + pad)).
    ph = _caffe_pool_padding(x.shape[1], k, s)
    pw = _caffe_pool_padding(x.shape[2], k, s)
    padding = ((0, 0), (0, ph), (0, pw), (0, 0))
    total = jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, k, k, 1), (1, s, s, 1), padding)
    ones = jnp.ones((1, x.shape[1], x.shape[2], 1), x.dtype)
    count = jax.lax.reduce_window(ones, 0.0, jax.lax.add, (1, k, k, 1), (1, s, s, 1), padding)
    return total / count


def local_response_norm_within_channel(
    x: jax.Array, size: int = 3, alpha: float = 5e-5, beta: float = 0.75
) -> jax.Array:
    """Caffe's LRN with ``norm_region: WITHIN_CHANNEL`` on an NHWC tensor.

    Caffe builds it as square -> AVE pool (kernel ``size``, stride 1, pad ``(size-1)/2``) ->
    power(shift 1, scale alpha, power -beta) -> product. With that padding every window's
    pool_size is ``size**2`` (zero padding counted), so
    ``y = x / (1 + alpha / size**2 * sum_{size x size window} x**2) ** beta``.
    """
    pad = (size - 1) // 2
    sq_sum = jax.lax.reduce_window(
        x * x,
        0.0,
        jax.lax.add,
        (1, size, size, 1),
        (1, 1, 1, 1),
        ((0, 0), (pad, pad), (pad, pad), (0, 0)),
    )
    return x * (1.0 + (alpha / size**2) * sq_sum) ** (-beta)


# --------------------------------------------------------------------------------------------
# cifar10-full (P1)
# --------------------------------------------------------------------------------------------


@register_model("cifar10-full")
def cifar10_full(*, lrn: bool = True, init: str = "he", num_classes: int = 10) -> Model:
    """P1's Caffe ``cifar10_full`` network, NHWC, 89,578 parameters (10 classes).

    conv1 5x5x32 pad 2 -> max-pool 3/2 -> ReLU -> LRN -> conv2 5x5x32 pad 2 + ReLU ->
    avg-pool 3/2 -> LRN -> conv3 5x5x64 pad 2 + ReLU -> avg-pool 3/2 -> fc 1024 -> 10.
    Pooling uses Caffe's ceil mode (32 -> 16 -> 8 -> 4). LRN is within-channel, size 3,
    alpha 5e-5, beta 0.75 (see :func:`local_response_norm_within_channel`).

    Options: ``lrn`` (False drops both LRN layers), ``init``: ``"he"`` (default: He-normal
    weights, zero biases) or ``"caffe"`` (Caffe's gaussian std 1e-4 / 1e-2 / 1e-2 / 1e-2 with
    zero biases). He init is the default because Caffe's tiny conv1 std makes the first epochs
    nearly flat, and P1's 140-epoch schedule is out of reach on a CPU; "caffe" is there for a
    faithful reproduction on a GPU.
    """
    if not isinstance(lrn, bool):
        raise ValueError(f"lrn must be true or false, got {lrn!r}")
    init = _choice(init, "init", ("he", "caffe"))
    num_classes = _pos_int(num_classes, "num_classes")
    shapes = {
        "conv1": (5, 5, 3, 32),
        "conv2": (5, 5, 32, 32),
        "conv3": (5, 5, 32, 64),
        "fc": (4 * 4 * 64, num_classes),
    }
    caffe_std = {"conv1": 1e-4, "conv2": 1e-2, "conv3": 1e-2, "fc": 1e-2}

    def init_fn(key: jax.Array) -> PyTree:
        keys = jax.random.split(key, len(shapes))
        params = {}
        for k, (layer, shape) in zip(keys, shapes.items(), strict=True):
            fan_in = int(np.prod(shape[:-1]))
            if init == "he":
                w = _he_normal(k, shape, fan_in)
            else:
                w = jax.random.normal(k, shape, jnp.float32) * jnp.float32(caffe_std[layer])
            params[layer] = {"w": w, "b": jnp.zeros((shape[-1],), jnp.float32)}
        return params

    def norm(h: jax.Array) -> jax.Array:
        return local_response_norm_within_channel(h) if lrn else h

    def apply(params: PyTree, x: jax.Array) -> jax.Array:
        h = _conv(x, params["conv1"]["w"], pad=2) + params["conv1"]["b"]
        h = norm(jax.nn.relu(_max_pool_ceil(h)))
        h = jax.nn.relu(_conv(h, params["conv2"]["w"], pad=2) + params["conv2"]["b"])
        h = norm(_avg_pool_ceil(h))
        h = jax.nn.relu(_conv(h, params["conv3"]["w"], pad=2) + params["conv3"]["b"])
        h = _avg_pool_ceil(h)
        h = h.reshape(h.shape[0], -1)
        return h @ params["fc"]["w"] + params["fc"]["b"]

    return _classifier("cifar10-full", init_fn, apply, (32, 32, 3), num_classes)


# --------------------------------------------------------------------------------------------
# CIFAR ResNets (P2)
# --------------------------------------------------------------------------------------------


def _resnet(name: str, n: int, width: int, norm: str, num_classes: int) -> Model:
    """He et al. (2016) CIFAR ResNet with 6n+2 layers and option-A (zero-pad) shortcuts."""
    width = _pos_int(width, "width")
    norm = _choice(norm, "norm", ("batch", "none"))
    num_classes = _pos_int(num_classes, "num_classes")
    chans = [16 * width, 32 * width, 64 * width]
    # (layer name, cin, cout, stride, is the last conv of a residual branch)
    convs: list[tuple[str, int, int, int, bool]] = [("conv_in", 3, chans[0], 1, False)]
    blocks: list[tuple[str, int, int, int]] = []
    cin = chans[0]
    for s, cout in enumerate(chans):
        for b in range(n):
            stride = 2 if (s > 0 and b == 0) else 1
            prefix = f"s{s + 1}_b{b}"
            convs.append((f"{prefix}_conv1", cin, cout, stride, False))
            convs.append((f"{prefix}_conv2", cout, cout, 1, True))
            blocks.append((prefix, cin, cout, stride))
            cin = cout
    num_blocks = len(blocks)

    def init_fn(key: jax.Array) -> PyTree:
        keys = jax.random.split(key, len(convs) + 1)
        params: dict[str, dict[str, jax.Array]] = {}
        for k, (layer, ci, co, _, last) in zip(keys[:-1], convs, strict=True):
            if norm == "none" and last:
                w = jnp.zeros((3, 3, ci, co), jnp.float32)  # Fixup: branch starts at zero
            elif norm == "none" and layer != "conv_in":
                # Fixup rescales the branch's other layers by L^(-1/(2m-2)), m = 2 layers.
                w = _he_normal(k, (3, 3, ci, co), 9 * ci) * num_blocks ** (-0.5)
            else:
                w = _he_normal(k, (3, 3, ci, co), 9 * ci)
            params[layer] = {"w": w}
            if norm == "batch":
                # BN scale/shift; the conv needs no bias in front of BN.
                params[layer.replace("conv", "bn")] = {
                    "w": jnp.ones((co,), jnp.float32),
                    "b": jnp.zeros((co,), jnp.float32),
                }
            else:
                params[layer]["b"] = jnp.zeros((co,), jnp.float32)
        fc_w = (
            jnp.zeros((chans[-1], num_classes), jnp.float32)  # Fixup zero-inits the classifier
            if norm == "none"
            else jax.random.normal(keys[-1], (chans[-1], num_classes), jnp.float32)
            * jnp.float32(1.0 / math.sqrt(chans[-1]))
        )
        params["fc"] = {"w": fc_w, "b": jnp.zeros((num_classes,), jnp.float32)}
        return params

    def conv_norm(params: PyTree, layer: str, h: jax.Array, stride: int) -> jax.Array:
        h = _conv(h, params[layer]["w"], stride=stride, pad=1)
        if norm == "none":
            return h + params[layer]["b"]
        # Batch statistics in training and evaluation alike: no running state (module docs).
        mean = jnp.mean(h, axis=(0, 1, 2))
        var = jnp.var(h, axis=(0, 1, 2))
        bn = params[layer.replace("conv", "bn")]
        return (h - mean) * jax.lax.rsqrt(var + 1e-5) * bn["w"] + bn["b"]

    def apply(params: PyTree, x: jax.Array) -> jax.Array:
        h = jax.nn.relu(conv_norm(params, "conv_in", x, 1))
        for prefix, ci, co, stride in blocks:
            r = jax.nn.relu(conv_norm(params, f"{prefix}_conv1", h, stride))
            r = conv_norm(params, f"{prefix}_conv2", r, 1)
            sc = h
            if stride != 1 or ci != co:
                # Option A: subsample and zero-pad channels (parameter-free, as in He et al.).
                sc = sc[:, ::stride, ::stride, :]
                extra = co - ci
                sc = jnp.pad(sc, ((0, 0), (0, 0), (0, 0), (extra // 2, extra - extra // 2)))
            h = jax.nn.relu(sc + r)
        h = jnp.mean(h, axis=(1, 2))
        return h @ params["fc"]["w"] + params["fc"]["b"]

    return _classifier(name, init_fn, apply, (32, 32, 3), num_classes)


@register_model("resnet20")
def resnet20(*, width: int = 1, norm: str = "batch", num_classes: int = 10) -> Model:
    """ResNet-20 for CIFAR (n = 3 blocks per stage), ~0.27M parameters at width 1."""
    return _resnet("resnet20", 3, width, norm, num_classes)


@register_model("resnet44")
def resnet44(*, width: int = 1, norm: str = "batch", num_classes: int = 10) -> Model:
    """ResNet-44 for CIFAR (n = 7), P2's default network, ~0.66M parameters at width 1."""
    return _resnet("resnet44", 7, width, norm, num_classes)


# --------------------------------------------------------------------------------------------
# Small baselines
# --------------------------------------------------------------------------------------------


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
    empty = isinstance(hidden, Sequence) and not isinstance(hidden, str) and len(hidden) == 0
    hidden = () if empty else _as_shape(hidden, "hidden")
    input_shape = _as_shape(input_shape, "input_shape")
    num_classes = _pos_int(num_classes, "num_classes")
    activation = _choice(activation, "activation", ("relu", "tanh"))
    loss_kind = _choice(loss, "loss", ("xent", "mse"))
    act = jax.nn.relu if activation == "relu" else jnp.tanh
    hidden_gain = 1.0 if activation == "relu" else math.sqrt(0.5)
    pool = _pos_int(input_pool, "input_pool")
    if pool > 1 and (len(input_shape) != 3 or input_shape[0] % pool or input_shape[1] % pool):
        raise ValueError(f"input_pool = {pool} needs input_shape (H, W, C) with H and W "
                         f"divisible by it, got {input_shape}")
    n_in = int(np.prod(input_shape)) // (pool * pool)
    sizes = [n_in, *hidden, num_classes]
    names = [f"dense{i + 1}" for i in range(len(sizes) - 2)] + ["fc"]

    def init_fn(key: jax.Array) -> PyTree:
        keys = jax.random.split(key, len(names))
        return {
            name: {
                "w": _he_normal(k, (a, b), a) * (hidden_gain if name != "fc" else math.sqrt(0.5)),
                "b": jnp.zeros((b,), jnp.float32),
            }
            for k, name, a, b in zip(keys, names, sizes[:-1], sizes[1:], strict=True)
        }

    def features(x: jax.Array) -> jax.Array:
        if pool > 1:
            hh, ww, cc = input_shape
            x = x.reshape(x.shape[0], hh // pool, pool, ww // pool, pool, cc).mean(axis=(2, 4))
        return x.reshape(x.shape[0], -1)

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
            return _softmax_xent(from_first(rest, z), y)

        return dataclasses.replace(_classifier("mlp", init_fn, apply, input_shape, num_classes),
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


@register_model("linear")
def linear(*, input_shape: Sequence[int] = (32, 32, 3), num_classes: int | None = 10) -> Model:
    """Least squares on flattened inputs (convex), params ``{"fc": {"w", "b"}}``, zero init.

    With ``num_classes = K`` the K outputs regress the one-hot labels (mean over the batch of
    ``0.5 * ||f(x) - onehot(y)||^2``) and :meth:`Model.error` is the argmax error; with
    ``num_classes = 0`` (or None) there is a single output regressing ``y`` as a float and the
    error is the loss.
    """
    input_shape = _as_shape(input_shape, "input_shape")
    k = None if num_classes in (None, 0) else _pos_int(num_classes, "num_classes")
    d = int(np.prod(input_shape))
    out = k or 1

    def init_fn(key: jax.Array) -> PyTree:
        del key  # deterministic: the convex problem has a unique-ish optimum anyway
        return {"fc": {"w": jnp.zeros((d, out), jnp.float32), "b": jnp.zeros((out,), jnp.float32)}}

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
        raise ValueError(f"spectrum must be a table with keys max, min[, kind], got {spec!r}")
    hi, lo = float(spec["max"]), float(spec["min"])
    kind = _choice(spec.get("kind", "linear"), "spectrum.kind", ("linear", "log"))
    if not (math.isfinite(hi) and math.isfinite(lo)) or hi < lo:
        raise ValueError(f"spectrum needs finite min <= max, got {spec!r}")
    if kind == "log":
        if lo <= 0:
            raise ValueError(f"a log spectrum needs min > 0, got {lo}")
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
            raise ValueError(f"eigenvalues must be a non-empty list of finite numbers: {lam}")
        if dim is not None and _pos_int(dim, "dim") != lam.size:
            raise ValueError(f"dim = {dim} but {lam.size} eigenvalues were given")
    else:
        dim = _pos_int(dim if dim is not None else 10, "dim")
        lam = np.ones(dim) if spectrum is None else _spectrum(dim, spectrum)
    noise = float(noise)
    if not (math.isfinite(noise) and noise >= 0):
        raise ValueError(f"noise must be a finite number >= 0, got {noise}")
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


# The P1-F4 AlexNet-style model lives in its own module; importing it here registers
# "alexnet" whenever the registry is, however asyncsim was imported.
from asyncsim import models_imagenet as _models_imagenet  # noqa: E402,F401
