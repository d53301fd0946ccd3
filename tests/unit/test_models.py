"""Tests of asyncsim.numerics.models: shapes, parameter counts, gradients, LRN, the registry."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asyncsim.numerics.models import (
    Model,
    available_models,
    expand_parts,
    get_model,
    grad_fn,
    grad_parts,
    local_response_norm_within_channel,
    num_params,
    quadratic_spectrum,
    register_model,
    tree_bytes,
)

KEY = jax.random.PRNGKey(0)


def _batch(model: Model, b: int = 2, seed: int = 1):
    kx, ky = jax.random.split(jax.random.PRNGKey(seed))
    x = jax.random.normal(kx, (b, *model.input_shape), jnp.float32)
    y = jax.random.randint(ky, (b,), 0, model.num_classes or 1)
    return x, y


def _init(model: Model):
    # Jitted init: eager op-by-op dispatch is slow on a busy 2-core CPU.
    return jax.jit(model.init)(KEY)


def _param_shapes(model: Model):
    return jax.eval_shape(model.init, KEY)


def test_builtin_names():
    assert {"cifar10-full", "resnet20", "resnet44", "mlp", "quadratic", "linear"} <= set(
        available_models()
    )


def test_tree_bytes_counts_each_leaf_at_its_dtype():
    tree = {"w": jnp.zeros((3, 4), jnp.float32), "b": jnp.zeros(5, jnp.bfloat16),
            "n": jax.ShapeDtypeStruct((2,), jnp.int32)}
    assert tree_bytes(tree) == 3 * 4 * 4 + 5 * 2 + 2 * 4


def test_cifar10_full_exact_param_count_and_logits():
    m = get_model("cifar10-full")
    p = _init(m)
    assert num_params(p) == 89_578
    assert set(p) == {"conv1", "conv2", "conv3", "fc"}
    assert p["fc"]["w"].shape == (1024, 10)  # Caffe ceil-mode pooling: 32 -> 16 -> 8 -> 4
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(p))
    x, y = _batch(m, 3)
    assert jax.eval_shape(m.apply, p, x).shape == (3, 10)
    err = float(jax.jit(m.error)(p, x, y))
    assert 0.0 <= err <= 1.0


@pytest.mark.parametrize("opts", [{"lrn": False}, {"init": "caffe"}])
def test_cifar10_full_variants(opts):
    m = get_model("cifar10-full", **opts)
    p = _init(m)
    assert num_params(p) == 89_578
    if opts.get("init") == "caffe":
        assert float(jnp.std(p["conv1"]["w"])) < 1e-3  # Caffe's std 1e-4 on conv1
    x = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
    assert jax.eval_shape(m.apply, p, x).shape == (2, 10)


def _lrn_loop(x: np.ndarray, size: int, alpha: float, beta: float) -> np.ndarray:
    """Caffe WITHIN_CHANNEL LRN written out: scale = 1 + alpha/size^2 * sum of squares."""
    n, h, w, c = x.shape
    pad = (size - 1) // 2
    out = np.empty_like(x, dtype=np.float64)
    for b in range(n):
        for i in range(h):
            for j in range(w):
                for k in range(c):
                    s = 0.0
                    for di in range(-pad, pad + 1):
                        for dj in range(-pad, pad + 1):
                            ii, jj = i + di, j + dj
                            if 0 <= ii < h and 0 <= jj < w:
                                s += float(x[b, ii, jj, k]) ** 2
                    out[b, i, j, k] = x[b, i, j, k] / (1 + alpha / size**2 * s) ** beta
    return out


def test_lrn_matches_direct_loop():
    rng = np.random.default_rng(0)
    # Large values so the normalisation is far from the identity (alpha = 5e-5 is tiny).
    x = (rng.standard_normal((2, 5, 4, 3)) * 60).astype(np.float32)
    got = np.asarray(local_response_norm_within_channel(jnp.asarray(x), 3, 5e-5, 0.75))
    want = _lrn_loop(x, 3, 5e-5, 0.75)
    assert np.abs(want / x - 1).max() > 0.05  # the test is not vacuous
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize(
    "name, opts, expected",
    [
        ("resnet20", {}, 269_722),
        ("resnet44", {}, 658_586),
        ("resnet20", {"norm": "none"}, None),
        ("resnet20", {"width": 2}, None),
    ],
)
def test_resnet_shapes_and_counts(name, opts, expected):
    m = get_model(name, **opts)
    shapes = _param_shapes(m)  # no compute: eval_shape
    count = num_params(shapes)
    if expected is not None:
        assert count == expected
    if name == "resnet20" and opts.get("width") == 2:
        assert 1_000_000 < count < 1_200_000  # about 4x the width-1 count
    x = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
    assert jax.eval_shape(m.apply, shapes, x).shape == (2, 10)


def test_resnet_param_counts_are_papers():
    # He et al. (2016), Table 6: ResNet-20 0.27M, ResNet-44 0.66M.
    assert round(num_params(_param_shapes(get_model("resnet20"))) / 1e6, 2) == 0.27
    assert round(num_params(_param_shapes(get_model("resnet44"))) / 1e6, 2) == 0.66


@pytest.mark.slow
def test_resnet_batchnorm_is_pure_and_uses_batch_stats():
    m = get_model("resnet20")
    params = _init(m)
    xb, _ = _batch(m, 3)
    f = jax.jit(m.apply)
    a = np.asarray(f(params, xb))
    np.testing.assert_array_equal(a, np.asarray(f(params, xb)))  # no hidden state
    # Batch statistics in evaluation too: example 0's logits depend on the rest of the batch.
    other = xb.at[1:].multiply(5.0)
    assert not np.allclose(np.asarray(f(params, other))[0], a[0], atol=1e-4)


def test_mlp_options():
    m = get_model("mlp", hidden=[64, 32], input_shape=[8, 8, 1], num_classes=3)
    p = _init(m)
    assert num_params(p) == 64 * 64 + 64 + 64 * 32 + 32 + 32 * 3 + 3
    x = jax.ShapeDtypeStruct((5, 8, 8, 1), jnp.float32)
    assert jax.eval_shape(m.apply, p, x).shape == (5, 3)
    assert get_model("mlp", hidden=[]).init(KEY).keys() == {"fc"}


def test_quadratic_gradient_and_hessian():
    lam = [4.0, 1.0, 0.25]
    m = get_model("quadratic", eigenvalues=lam)
    p = _init(m)
    np.testing.assert_array_equal(np.asarray(p["w"]), np.ones(3))  # w* + 1, w* = 0
    x = jnp.zeros((4, 3))
    y = jnp.zeros((4,), jnp.int32)
    loss, g = grad_fn(m)(p, x, y)
    assert float(loss) == pytest.approx(0.5 * sum(lam))
    np.testing.assert_allclose(np.asarray(g["w"]), np.asarray(lam) * 1.0, rtol=1e-6)
    hess = jax.hessian(lambda w: m.loss({"w": w}, x, y))(p["w"])
    np.testing.assert_allclose(np.linalg.eigvalsh(np.asarray(hess))[::-1], lam, rtol=1e-6)
    np.testing.assert_allclose(quadratic_spectrum(m), lam)
    assert m.num_classes is None
    assert float(m.error(p, x, y)) == pytest.approx(float(loss))


def test_quadratic_noise_and_spectrum():
    m = get_model("quadratic", dim=4, spectrum={"max": 10.0, "min": 0.1, "kind": "log"}, noise=2)
    np.testing.assert_allclose(m.hessian_eigenvalues, [10.0, 10 ** (1 / 3), 10 ** (-1 / 3), 0.1])
    p = {"w": jnp.asarray([0.5, -1.0, 2.0, 0.0])}
    x = jax.random.normal(KEY, (8, 4))
    _, g = grad_fn(m)(p, x, jnp.zeros(8, jnp.int32))
    want = m.hessian_eigenvalues * np.asarray(p["w"]) + 2 * np.asarray(x).mean(0)
    np.testing.assert_allclose(np.asarray(g["w"]), want, rtol=1e-5, atol=1e-6)
    lin = get_model("quadratic", dim=3, spectrum={"max": 3, "min": 1})
    np.testing.assert_allclose(lin.hessian_eigenvalues, [3, 2, 1])
    assert lin.input_shape == (3,)


def test_linear_is_least_squares():
    m = get_model("linear", input_shape=[3], num_classes=2)
    p = _init(m)
    assert num_params(p) == 3 * 2 + 2
    x = jnp.ones((2, 3))
    y = jnp.asarray([0, 1])
    assert float(m.loss(p, x, y)) == pytest.approx(0.5)  # zero init, one-hot targets
    r = get_model("linear", input_shape=[3], num_classes=0)
    assert r.num_classes is None
    assert r.apply(r.init(KEY), x).shape == (2,)


_SMALL = [
    ("cifar10-full", {}),
    pytest.param("resnet20", {"norm": "none"}, marks=pytest.mark.slow),  # ~11 s to compile
    ("mlp", {"hidden": [16]}),
    ("quadratic", {"dim": 5, "noise": 0.5}),
    ("linear", {}),
]


@pytest.mark.parametrize("name, opts", _SMALL)
def test_every_model_loss_finite_and_grad_jits(name, opts):
    m = get_model(name, **opts)
    p = _init(m)
    x, y = _batch(m, 2)
    loss, grads = jax.jit(grad_fn(m))(p, x, y)
    assert np.isfinite(float(loss))
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(p)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree_util.tree_leaves(grads))
    assert float(loss) == pytest.approx(float(jax.jit(m.loss)(p, x, y)), rel=1e-5)
    if name == "resnet20":  # norm="none": Fixup init (shares this test's compile)
        assert all(float(jnp.abs(v["w"]).max()) == 0 for k, v in p.items() if k.endswith("conv2"))
        assert not any(k.startswith("bn") for k in p)
        # Zero-init classifier: uniform logits, loss log(10), and gradients still reach fc.
        assert float(loss) == pytest.approx(np.log(10), rel=1e-5)
        assert float(jnp.abs(grads["fc"]["w"]).max()) > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet20", "resnet44"])
def test_resnet_batchnorm_grad_jits(name):
    m = get_model(name)
    p = _init(m)
    x, y = _batch(m, 2)
    loss, _ = jax.jit(grad_fn(m))(p, x, y)
    assert np.isfinite(float(loss))


def test_unknown_model_lists_allowed():
    with pytest.raises(ValueError, match="allowed: .*cifar10-full.*resnet44"):
        get_model("vgg16")


def test_unknown_or_bad_option_lists_parameters():
    # One option checker for every plug-in kind: each message names the scenario key.
    with pytest.raises(ValueError, match=r"model.depth: unknown option for model 'resnet20'; "
                                         r"allowed: name, width, norm"):
        get_model("resnet20", depth=3)
    with pytest.raises(ValueError, match="model.norm: unknown value 'layer'; allowed: batch, none"):
        get_model("resnet20", norm="layer")
    with pytest.raises(ValueError, match="model.init: unknown value .*; allowed: he, caffe"):
        get_model("cifar10-full", init="xavier")
    with pytest.raises(ValueError, match=r"model.noise: must be a finite number >= 0, got -1"):
        get_model("quadratic", dim=3, noise=-1)
    with pytest.raises(ValueError, match=r"model.hidden: must be a list of positive integers"):
        get_model("mlp", hidden=[0])
    with pytest.raises(ValueError, match=r"model.lrn: must be true or false, got 1"):
        get_model("cifar10-full", lrn=1)


def test_register_user_model(fresh_registries):
    @register_model("test-tiny")
    def tiny(*, k: int = 2) -> Model:
        return get_model("mlp", hidden=[], input_shape=[k], num_classes=2)

    assert "test-tiny" in available_models()
    assert get_model("test-tiny", k=3).input_shape == (3,)


PLUGIN_WITH_TYPE_CHECKING_IMPORT = """
from __future__ import annotations
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from not_installed_anywhere import Thing
from asyncsim.numerics.models import get_model

def seeded(seed: int = 0, width: int = 8, depth: int | None = None, other: Thing | None = None):
    return get_model("mlp", hidden=[width])
"""


def test_user_model_options_are_checked_by_annotation_one_by_one(fresh_registries, tmp_path,
                                                                 tiny):
    """A plug-in whose annotations name a type only its TYPE_CHECKING block imports keeps the
    checks of its other options; a model may take an option named ``seed`` (only a data set's
    seed is asyncsim's)."""
    ns: dict = {}
    exec(compile(PLUGIN_WITH_TYPE_CHECKING_IMPORT, "plug.py", "exec"), ns)
    register_model("seeded")(ns["seeded"])
    from asyncsim.scenario import load_scenario

    def with_model(**options):
        return load_scenario({**tiny.base, "model": {"name": "seeded", **options}})

    assert with_model(seed=3, width=4).model.options == {"seed": 3, "width": 4}
    with pytest.raises(ValueError, match="model.width: must be an integer, got 'wide'"):
        with_model(width="wide")
    with pytest.raises(ValueError, match="model.seed: must be an integer, got 'x'"):
        with_model(seed="x")
    with pytest.raises(ValueError, match="model.depth: must be an integer, got .deep."):
        with_model(depth="deep")  # no default to infer from: only its annotation says
    assert get_model("seeded", other=object(), width=2).init is not None
    with pytest.raises(ValueError, match="data.seed: unknown option"):
        tiny(data={"seed": 1})


@pytest.mark.parametrize("name,opts", [
    ("mlp", {}), ("mlp", {"hidden": []}),
    ("mlp", {"hidden": [16, 8], "activation": "tanh", "loss": "mse", "input_pool": 4}),
    ("linear", {}), ("linear", {"num_classes": 0}),
])
def test_dense_input_parts_expand_to_the_gradient(name, opts):
    """A gradient kept as (the other layers' gradients, dL/dz of the dense input layer)
    expands to jax.grad's gradient: the replayer's gradient store relies on it."""
    model = get_model(name, **opts)
    assert model.dense_input is not None
    params = jax.tree_util.tree_map(lambda a: a + 0.01, model.init(KEY))  # linear: zeros
    x, y = _batch(model, b=5)
    loss, grads = jax.jit(grad_fn(model))(params, x, y)
    loss2, parts = jax.jit(lambda p, x, y: grad_parts(model, p, x, y))(params, x, y)
    again = jax.jit(lambda parts, x: expand_parts(model, parts, model.dense_input.features(x)))(
        parts, x)
    assert parts[1].shape[0] == 5 and model.dense_input.name not in parts[0]
    np.testing.assert_allclose(float(loss2), float(loss), rtol=1e-6)
    assert jax.tree_util.tree_structure(again) == jax.tree_util.tree_structure(grads)
    for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(again),
                    strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7)
    assert get_model("cifar10-full").dense_input is None  # convolutional: no such layer


def _bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


@pytest.mark.parametrize("seed", [0, 5])
def test_normals_are_the_draws_one_by_one_to_the_bit(seed):
    # One program for every layer's draw (a warm run's init was one program per layer
    # shape): each entry is jax.random.normal with its split key, bit for bit; None leaves
    # its key unused without moving the others.
    from asyncsim.numerics.models.base import normals

    key = jax.random.fold_in(jax.random.PRNGKey(seed), 3)
    shapes = [(5, 5, 3, 32), None, (1024, 10), (7,), None]
    keys = jax.random.split(key, len(shapes))
    got = normals(key, shapes)
    assert [g is None for g in got] == [s is None for s in shapes]
    for k, s, g in zip(keys, shapes, got, strict=True):
        if s is not None:
            assert isinstance(g, np.ndarray) and g.shape == s
            np.testing.assert_array_equal(_bits(g), _bits(jax.random.normal(k, s, jnp.float32)))
    # Traced (jax.eval_shape, as drivers size a model), the same shapes.
    traced = jax.eval_shape(lambda k: normals(k, shapes), key)
    assert [None if t is None else t.shape for t in traced] == shapes


def test_builtin_inits_are_scaled_draws_one_by_one():
    # The initial weights are float32(normal draw) * float32(std), drawn one layer at a time
    # with the layer's split key: pinned here for P1's network (He init) and a Fixup ResNet
    # (layers that start at zero leave their keys unused), so batching the draws into one
    # program changed no model's initial weights.
    from asyncsim.numerics.numerics import init_key

    key = init_key(4)
    m = get_model("cifar10-full")
    p = m.init(key)
    keys = jax.random.split(key, 4)
    for k, layer in zip(keys, ["conv1", "conv2", "conv3", "fc"], strict=True):
        shape = p[layer]["w"].shape
        want = np.asarray(jax.random.normal(k, shape, jnp.float32)) * np.float32(
            np.sqrt(2.0 / np.prod(shape[:-1])))
        np.testing.assert_array_equal(_bits(p[layer]["w"]), _bits(want))
        np.testing.assert_array_equal(np.asarray(p[layer]["b"]), 0.0)
    r = get_model("resnet20", norm="none")
    pr = r.init(key)
    convs = [name for name in pr if "conv" in name]  # conv_in, s1_b0_conv1, s1_b0_conv2, ..
    rkeys = jax.random.split(key, len(convs) + 1)
    # conv_in is plain He; s1_b0_conv1 is He rescaled by L^(-1/2), its second
    # starts at zero; the classifier starts at zero (Fixup).
    w_in = np.asarray(jax.random.normal(rkeys[0], (3, 3, 3, 16), jnp.float32)) * np.float32(
        np.sqrt(2.0 / 27))
    np.testing.assert_array_equal(_bits(pr["conv_in"]["w"]), _bits(w_in))
    assert convs[1:3] == ["s1_b0_conv1", "s1_b0_conv2"] and len(convs) == 19
    w1 = np.asarray(jax.random.normal(rkeys[1], (3, 3, 16, 16), jnp.float32)) * np.float32(
        np.sqrt(2.0 / 144))
    w1 = w1 * np.float32(9 ** -0.5)  # 9 residual blocks
    np.testing.assert_array_equal(_bits(pr["s1_b0_conv1"]["w"]), _bits(w1))
    assert not np.any(np.asarray(pr[convs[2]]["w"])) and not np.any(np.asarray(pr["fc"]["w"]))
