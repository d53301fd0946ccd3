"""P1's CIFAR10 network (Caffe ``cifar10_full``) and P2's CIFAR ResNets."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from asyncsim._checks import choice, flag, integer
from asyncsim.numerics.models.base import (
    Model,
    PyTree,
    classifier,
    conv2d,
    he_std,
    normals,
    ones,
    register_model,
    scaled,
    zeros,
)


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
    flag("lrn", lrn)
    init = choice("init", init, ("he", "caffe"))
    num_classes = integer("num_classes", num_classes)
    shapes = {
        "conv1": (5, 5, 3, 32),
        "conv2": (5, 5, 32, 32),
        "conv3": (5, 5, 32, 64),
        "fc": (4 * 4 * 64, num_classes),
    }
    caffe_std = {"conv1": 1e-4, "conv2": 1e-2, "conv3": 1e-2, "fc": 1e-2}

    def init_fn(key: jax.Array) -> PyTree:
        draws = normals(key, list(shapes.values()))
        params = {}
        for n01, (layer, shape) in zip(draws, shapes.items(), strict=True):
            std = he_std(int(np.prod(shape[:-1]))) if init == "he" else caffe_std[layer]
            params[layer] = {"w": scaled(n01, std), "b": zeros((shape[-1],))}
        return params

    def norm(h: jax.Array) -> jax.Array:
        return local_response_norm_within_channel(h) if lrn else h

    def apply(params: PyTree, x: jax.Array) -> jax.Array:
        h = conv2d(x, params["conv1"]["w"], pad=2) + params["conv1"]["b"]
        h = norm(jax.nn.relu(_max_pool_ceil(h)))
        h = jax.nn.relu(conv2d(h, params["conv2"]["w"], pad=2) + params["conv2"]["b"])
        h = norm(_avg_pool_ceil(h))
        h = jax.nn.relu(conv2d(h, params["conv3"]["w"], pad=2) + params["conv3"]["b"])
        h = _avg_pool_ceil(h)
        h = h.reshape(h.shape[0], -1)
        return h @ params["fc"]["w"] + params["fc"]["b"]

    return classifier("cifar10-full", init_fn, apply, (32, 32, 3), num_classes)


# --------------------------------------------------------------------------------------------
# CIFAR ResNets (P2)
# --------------------------------------------------------------------------------------------


def _resnet_layers(n: int, chans: list[int]):
    """The convolutions ``(layer name, cin, cout, stride, is the last conv of a residual
    branch)`` and the residual blocks ``(prefix, cin, cout, stride)`` of a 6n+2-layer CIFAR
    ResNet with stage widths ``chans``."""
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
    return convs, blocks


def _resnet(name: str, n: int, width: int, norm: str, num_classes: int) -> Model:
    """He et al. (2016) CIFAR ResNet with 6n+2 layers and option-A (zero-pad) shortcuts."""
    width = integer("width", width)
    norm = choice("norm", norm, ("batch", "none"))
    num_classes = integer("num_classes", num_classes)
    chans = [16 * width, 32 * width, 64 * width]
    convs, blocks = _resnet_layers(n, chans)
    num_blocks = len(blocks)

    def init_fn(key: jax.Array) -> PyTree:
        # One key per conv and one for the classifier. Fixup starts each branch's last conv
        # and the classifier at zero: those draw nothing with their keys (None), and None
        # is what makes them zeros below.
        draws = normals(key, [None if norm == "none" and last else (3, 3, ci, co)
                              for _, ci, co, _, last in convs]
                        + [None if norm == "none" else (chans[-1], num_classes)])
        params: dict[str, dict[str, jax.Array]] = {}
        for n01, (layer, ci, co, _, _) in zip(draws[:-1], convs, strict=True):
            if n01 is None:
                w = zeros((3, 3, ci, co))  # Fixup: branch starts at zero
            elif norm == "none" and layer != "conv_in":
                # Fixup rescales the branch's other layers by L^(-1/(2m-2)), m = 2 layers.
                w = scaled(scaled(n01, he_std(9 * ci)), num_blocks ** (-0.5))
            else:
                w = scaled(n01, he_std(9 * ci))
            params[layer] = {"w": w}
            if norm == "batch":
                # BN scale/shift; the conv needs no bias in front of BN.
                params[layer.replace("conv", "bn")] = {
                    "w": ones((co,)),
                    "b": zeros((co,)),
                }
            else:
                params[layer]["b"] = zeros((co,))
        fc_w = (
            zeros((chans[-1], num_classes))  # Fixup zero-inits the classifier
            if draws[-1] is None
            else scaled(draws[-1], 1.0 / math.sqrt(chans[-1]))
        )
        params["fc"] = {"w": fc_w, "b": zeros((num_classes,))}
        return params

    def conv_norm(params: PyTree, layer: str, h: jax.Array, stride: int) -> jax.Array:
        h = conv2d(h, params[layer]["w"], stride=stride, pad=1)
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

    return classifier(name, init_fn, apply, (32, 32, 3), num_classes)


@register_model("resnet20")
def resnet20(*, width: int = 1, norm: str = "batch", num_classes: int = 10) -> Model:
    """ResNet-20 for CIFAR (n = 3 blocks per stage), ~0.27M parameters at width 1."""
    return _resnet("resnet20", 3, width, norm, num_classes)


@register_model("resnet44")
def resnet44(*, width: int = 1, norm: str = "batch", num_classes: int = 10) -> Model:
    """ResNet-44 for CIFAR (n = 7), P2's default network, ~0.66M parameters at width 1."""
    return _resnet("resnet44", 7, width, norm, num_classes)
