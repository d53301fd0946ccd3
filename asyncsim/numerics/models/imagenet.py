"""An AlexNet-style ImageNet model for P1-F4 (Zhang et al. 2016, ImageNet, lambda = 18, mu = 16).

Registers ``alexnet`` with :func:`asyncsim.numerics.models.register_model` when imported.
Layout as in Caffe's ``bvlc_alexnet`` (Krizhevsky et al. 2012): conv1 11x11/4 96 -> ReLU ->
LRN -> max-pool 3/2 -> conv2 5x5 256 pad 2 -> ReLU -> LRN -> max-pool 3/2 -> conv3 3x3 384
-> conv4 3x3 384 -> conv5 3x3 256 -> max-pool 3/2 -> fc6 4096 -> fc7 4096 -> fc8 classes,
ReLU after every hidden layer. Differences, all to keep models pure and simple: no grouped
convolutions (one tower, as in Krizhevsky's "one weird trick"), cross-channel LRN as in
Caffe (size 5, alpha 1e-4, beta 0.75, k 1), and **no dropout** (models here are
deterministic ``apply(params, x)`` functions). Input NHWC, 227x227x3 by default
(``image_size`` option; the spatial size after conv5's pool sets fc6's width).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from asyncsim._checks import flag, integer
from asyncsim.numerics.models.base import (
    Model,
    classifier,
    he_std,
    normals,
    register_model,
    scaled,
    zeros,
)

__all__ = ["alexnet"]


def _conv(x, w, stride=1, pad=0):
    return jax.lax.conv_general_dilated(
        x, w, (stride, stride), [(pad, pad), (pad, pad)],
        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _max_pool(x, k=3, s=2):
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, k, k, 1), (1, s, s, 1), "VALID")


def _lrn_across(x, size=5, alpha=1e-4, beta=0.75, k=1.0):
    """Caffe's ACROSS_CHANNELS LRN: x / (k + alpha/size * sum of squares over channels)^beta."""
    sq = jnp.square(x)
    half = size // 2
    padded = jnp.pad(sq, [(0, 0), (0, 0), (0, 0), (half, half)])
    s = jax.lax.reduce_window(padded, 0.0, jax.lax.add, (1, 1, 1, size), (1, 1, 1, 1), "VALID")
    return x / jnp.power(k + (alpha / size) * s, beta)


def _out(n: int, k: int, s: int, p: int = 0) -> int:
    return (n + 2 * p - k) // s + 1


@register_model("alexnet")
def alexnet(*, num_classes: int = 1000, image_size: int = 227, lrn: bool = True) -> Model:
    """AlexNet-style network (module docstring): 62,378,344 parameters at 227x227x3."""
    num_classes = integer("num_classes", num_classes)
    image_size = integer("image_size", image_size)
    flag("lrn", lrn)
    s = _out(image_size, 11, 4)          # conv1
    s = _out(s, 3, 2)                    # pool1
    s = _out(s, 3, 2)                    # conv2 keeps size (pad 2), pool2
    s = _out(s, 3, 2)                    # conv3-5 keep size (pad 1), pool5
    if s < 1:
        raise ValueError(f"image_size {image_size} is too small for AlexNet (needs >= 67)")
    shapes = {
        "conv1": (11, 11, 3, 96), "conv2": (5, 5, 96, 256), "conv3": (3, 3, 256, 384),
        "conv4": (3, 3, 384, 384), "conv5": (3, 3, 384, 256),
        "fc6": (s * s * 256, 4096), "fc7": (4096, 4096), "fc8": (4096, num_classes),
    }

    def init_fn(key):
        draws = normals(key, list(shapes.values()))
        return {name: {"w": scaled(n01, he_std(int(np.prod(shp[:-1])))),
                       "b": zeros((shp[-1],))}
                for n01, (name, shp) in zip(draws, shapes.items(), strict=True)}

    def norm(h):
        return _lrn_across(h) if lrn else h

    def apply(params, x):
        relu = jax.nn.relu
        h = _max_pool(norm(relu(_conv(x, params["conv1"]["w"], 4) + params["conv1"]["b"])))
        h = _max_pool(norm(relu(_conv(h, params["conv2"]["w"], 1, 2) + params["conv2"]["b"])))
        h = relu(_conv(h, params["conv3"]["w"], 1, 1) + params["conv3"]["b"])
        h = relu(_conv(h, params["conv4"]["w"], 1, 1) + params["conv4"]["b"])
        h = _max_pool(relu(_conv(h, params["conv5"]["w"], 1, 1) + params["conv5"]["b"]))
        h = h.reshape(h.shape[0], -1)
        h = relu(h @ params["fc6"]["w"] + params["fc6"]["b"])
        h = relu(h @ params["fc7"]["w"] + params["fc7"]["b"])
        return h @ params["fc8"]["w"] + params["fc8"]["b"]

    return classifier("alexnet", init_fn, apply, (image_size, image_size, 3), num_classes)
