"""The mlp's backwards-compatible options: ``loss = "mse"``, ``activation = "tanh"`` and
``input_pool`` (used by the P2-F2/P2-F4 edge-of-stability runs)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asyncsim.numerics.models import get_model, num_params

KEY = jax.random.PRNGKey(0)


def _data(shape, b=6, k=10, seed=1):
    kx, ky = jax.random.split(jax.random.PRNGKey(seed))
    return (jax.random.normal(kx, (b, *shape), jnp.float32),
            jax.random.randint(ky, (b,), 0, k))


def _forward_np(params, x, act):
    h = np.asarray(x, np.float64).reshape(x.shape[0], -1)
    names = sorted(k for k in params if k != "fc")
    for name in names:
        h = act(h @ np.asarray(params[name]["w"]) + np.asarray(params[name]["b"]))
    return h @ np.asarray(params["fc"]["w"]) + np.asarray(params["fc"]["b"])


def test_defaults_unchanged_relu_xent():
    m = get_model("mlp", hidden=[8], input_shape=[4, 4, 3])
    assert m == m  # builds
    p = m.init(KEY)
    ref = get_model("mlp", hidden=[8], input_shape=[4, 4, 3], activation="relu",
                    loss="xent", input_pool=1)
    for a, b in zip(jax.tree_util.tree_leaves(p), jax.tree_util.tree_leaves(ref.init(KEY)),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    x, y = _data((4, 4, 3))
    logits = _forward_np(p, x, lambda z: np.maximum(z, 0))
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    want = -np.mean(logp[np.arange(len(y)), np.asarray(y)])
    np.testing.assert_allclose(float(m.loss(p, x, y)), want, rtol=1e-5)


def test_mse_loss_matches_formula_and_error_is_argmax():
    m = get_model("mlp", hidden=[8], input_shape=[4, 4, 3], activation="tanh", loss="mse")
    p = m.init(KEY)
    x, y = _data((4, 4, 3))
    out = _forward_np(p, x, np.tanh)
    np.testing.assert_allclose(np.asarray(m.apply(p, x)), out, rtol=1e-5, atol=1e-6)
    onehot = np.eye(10)[np.asarray(y)]
    want = 0.5 * np.mean(np.sum((out - onehot) ** 2, axis=-1))
    np.testing.assert_allclose(float(m.loss(p, x, y)), want, rtol=1e-5)
    err = np.mean(out.argmax(-1) != np.asarray(y))
    np.testing.assert_allclose(float(m.error(p, x, y)), err)
    loss, g = jax.value_and_grad(m.loss)(p, x, y)
    assert np.isfinite(float(loss))
    assert all(np.all(np.isfinite(np.asarray(v))) for v in jax.tree_util.tree_leaves(g))


def test_mse_hessian_top_eigenvalue_positive_at_init():
    from asyncsim.stability.sharpness import sharpness

    m = get_model("mlp", hidden=[8], input_shape=[4, 4, 3], activation="tanh", loss="mse")
    x, y = _data((4, 4, 3), b=32)
    lam = sharpness(m, m.init(KEY), x, y, method="lanczos", max_iter=30)
    assert lam > 0  # MSE: Gauss-Newton part is PSD and dominates at init


def test_tanh_init_is_lecun():
    m = get_model("mlp", hidden=[256], input_shape=[256], activation="tanh")
    w = np.asarray(m.init(KEY)["dense1"]["w"])
    assert abs(w.std() * np.sqrt(256) - 1.0) < 0.05  # std sqrt(1/fan_in)


def test_input_pool_averages_blocks():
    m = get_model("mlp", hidden=[5], input_shape=[8, 8, 3], input_pool=4, loss="mse")
    p = m.init(KEY)
    assert p["dense1"]["w"].shape == (2 * 2 * 3, 5)
    assert num_params(p) == 12 * 5 + 5 + 5 * 10 + 10
    assert m.input_shape == (8, 8, 3)
    x, _ = _data((8, 8, 3))
    pooled = np.asarray(x).reshape(6, 2, 4, 2, 4, 3).mean(axis=(2, 4))
    want = _forward_np(p, pooled, lambda z: np.maximum(z, 0))
    np.testing.assert_allclose(np.asarray(m.apply(p, x)), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opts", [{"loss": "hinge"}, {"activation": "gelu"},
                                  {"input_pool": 3}, {"input_pool": 0},
                                  {"input_pool": 2, "input_shape": [16]}])
def test_bad_options_are_value_errors(opts):
    kw = {"input_shape": [8, 8, 3], **opts}
    with pytest.raises(ValueError):
        get_model("mlp", **kw)


def test_scenario_accepts_the_options():
    from asyncsim.scenario import load_scenario

    scn = load_scenario({"model": {"name": "mlp", "hidden": [4], "loss": "mse",
                                   "activation": "tanh", "input_pool": 4},
                         "data": {"name": "synthetic-cifar", "n_train": 64, "n_test": 10,
                                  "batch_size": 64}})
    assert scn.model.options["loss"] == "mse"
