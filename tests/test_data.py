"""Tests of asyncsim.data: synthetic-cifar, batch sampling, the CIFAR10 loader and download.

No test touches the internet: the CIFAR10 tests build a tiny tarball in the real format in
tmp_path and serve it from a loopback HTTP server.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import pickle
import tarfile
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asyncsim.numerics.data import (
    CIFAR10_SHA256,
    DataError,
    Dataset,
    available_datasets,
    batch_indices,
    default_cache_dir,
    get_dataset,
    register_dataset,
)

# One jitted sampler for every test: eager op-by-op dispatch is slow on a busy CPU.
_bi = jax.jit(batch_indices, static_argnums=(3, 4))

# --------------------------------------------------------------------------------------------
# synthetic-cifar
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small() -> Dataset:
    return get_dataset("synthetic-cifar", seed=3, n_train=2000, n_test=500)


def test_registry():
    assert {"synthetic-cifar", "cifar10", "gaussian"} <= set(available_datasets())
    with pytest.raises(ValueError, match="allowed: .*cifar10.*synthetic-cifar"):
        get_dataset("mnist", seed=0)
    with pytest.raises(ValueError, match=r"data.n_trian: unknown option for data "
                                         r"'synthetic-cifar'; allowed: name, batch_size, n_train"):
        get_dataset("synthetic-cifar", seed=0, n_trian=5)
    with pytest.raises(ValueError, match="data.n_train: must be a positive integer"):
        get_dataset("synthetic-cifar", seed=0, n_train=-5)


def test_registered_factory_options_checked_like_models(fresh_registries):
    """A plug-in data set gets the same option check as a model: named unknown options are
    refused listing the allowed ones (never ``seed``, which asyncsim passes itself), a
    factory with ``**options`` receives whatever the scenario gives, and DataError (a
    missing file) passes through unchanged."""
    seen = {}

    @register_dataset("plug-fixed")
    def fixed(*, seed, size=4):
        if size > 8:
            raise DataError("no file for size > 8")
        return get_dataset("gaussian", seed=seed, n_train=size, n_test=size)

    @register_dataset("plug-any")
    def anything(*, seed, **options):
        seen.update(options, seed=seed)
        return get_dataset("gaussian", seed=seed, n_train=4, n_test=4)

    assert get_dataset("plug-fixed", seed=1, size=6).x_train.shape[0] == 6
    with pytest.raises(ValueError, match=r"data.sise: unknown option for data 'plug-fixed'; "
                                         r"allowed: name, batch_size, size "
                                         r"\(did you mean 'size'\?\)$"):
        get_dataset("plug-fixed", seed=1, sise=6)
    with pytest.raises(DataError, match="no file"):
        get_dataset("plug-fixed", seed=1, size=9)
    get_dataset("plug-any", seed=2, colour="red")
    assert seen == {"colour": "red", "seed": 2}


def test_batch_larger_than_the_train_set_is_refused(fresh_registries):
    """A mini-batch draws without replacement from one pass, so batch_size <= n_train: the
    scenario check refuses more when n_train is declared (given, or the factory's default),
    and the engine when only the built data set knows its size."""
    from asyncsim.errors import ScenarioError
    from asyncsim.numerics.numerics import Numerics
    from asyncsim.scenario import load_scenario

    def scn(data):
        return load_scenario({"model": {"name": "mlp", "hidden": [4]}, "data": data,
                              "run": {"updates": 1}})

    with pytest.raises(ScenarioError, match=r"data.batch_size: is 64, more than the 32 "
                                            r"training samples of data 'synthetic-cifar'; "
                                            r"allowed: 1 to 32 \(a full batch\)"):
        scn({"name": "synthetic-cifar", "n_train": 32, "batch_size": 64})
    with pytest.raises(ScenarioError, match="more than the 10000 training samples"):
        scn({"name": "synthetic-cifar", "batch_size": 10_001})  # the factory's default
    scn({"name": "synthetic-cifar", "n_train": 32, "batch_size": 32})  # a full batch is fine

    @register_dataset("plug-sized")
    def sized(*, seed, size=4):
        return get_dataset("synthetic-cifar", seed=seed, n_train=size, n_test=size)

    late = scn({"name": "plug-sized", "size": 8, "batch_size": 9})  # size unknown until built
    with pytest.raises(ScenarioError, match="is 9, more than the 8 training samples"):
        Numerics(late)


def test_synthetic_shapes_dtypes_balance(small):
    assert small.x_train.shape == (2000, 32, 32, 3)
    assert small.x_test.shape == (500, 32, 32, 3)
    assert small.x_train.dtype == np.float32 and small.y_train.dtype == np.int32
    assert small.num_classes == 10
    # Normalised with train statistics.
    np.testing.assert_allclose(small.x_train.mean(axis=(0, 1, 2), dtype=np.float64), 0, atol=1e-4)
    np.testing.assert_allclose(small.x_train.std(axis=(0, 1, 2), dtype=np.float64), 1, atol=1e-4)
    # Test labels are exactly balanced; train labels up to the 5% label noise.
    assert np.all(np.bincount(small.y_test, minlength=10) == 50)
    counts = np.bincount(small.y_train, minlength=10)
    assert counts.min() >= 170 and counts.max() <= 230


def test_synthetic_deterministic_per_seed(small):
    again = get_dataset("synthetic-cifar", seed=3, n_train=2000, n_test=500)
    for field in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(small, field), getattr(again, field))
    other = get_dataset("synthetic-cifar", seed=4, n_train=2000, n_test=500)
    assert not np.array_equal(small.x_train, other.x_train)
    assert not np.array_equal(small.y_train, other.y_train)


def test_synthetic_does_not_touch_global_rng():
    np.random.seed(123)  # noqa: NPY002
    before = np.random.random()  # noqa: NPY002
    np.random.seed(123)  # noqa: NPY002
    get_dataset("synthetic-cifar", seed=0, n_train=20, n_test=10)
    assert np.random.random() == before  # noqa: NPY002


def test_synthetic_is_learnable_but_not_trivial(small):
    """A linear softmax with a few hundred jitted SGD steps clearly beats chance (90%)."""
    x = jnp.asarray(small.x_train.reshape(len(small.x_train), -1))
    y = jnp.asarray(small.y_train)
    xt = jnp.asarray(small.x_test.reshape(len(small.x_test), -1))
    yt = jnp.asarray(small.y_test)

    def loss(p, xb, yb):
        logp = jax.nn.log_softmax(xb @ p["w"] + p["b"])
        return -jnp.mean(jnp.take_along_axis(logp, yb[:, None], axis=1))

    @jax.jit
    def step(p, s):
        idx = batch_indices(0, 0, s, 64, x.shape[0])
        g = jax.grad(loss)(p, x[idx], y[idx])
        return jax.tree.map(lambda a, b: a - 0.002 * b, p, g)

    p = {"w": jnp.zeros((3072, 10)), "b": jnp.zeros(10)}
    for s in range(300):
        p = step(p, s)
    err = float(jnp.mean(jnp.argmax(xt @ p["w"] + p["b"], 1) != yt))
    assert err < 0.6, err


def test_gaussian():
    d = get_dataset("gaussian", seed=1, dim=7, n_train=100, n_test=10)
    assert d.x_train.shape == (100, 7) and d.x_test.shape == (10, 7)
    assert d.x_train.dtype == np.float32
    assert not d.y_train.any() and d.y_train.dtype == np.int32
    e = get_dataset("gaussian", seed=1, dim=7, n_train=100, n_test=10)
    np.testing.assert_array_equal(d.x_train, e.x_train)


# --------------------------------------------------------------------------------------------
# batch_indices
# --------------------------------------------------------------------------------------------


def test_batch_indices_deterministic_and_jittable():
    ref = np.asarray(_bi(1, 2, 3, 16, 1000))
    assert ref.dtype == np.int32 and ref.shape == (16,)
    assert ref.min() >= 0 and ref.max() < 1000
    got = _bi(jnp.int32(1), jnp.int32(2), jnp.int32(3), 16, 1000)
    np.testing.assert_array_equal(np.asarray(got), ref)
    assert not np.array_equal(np.asarray(_bi(1, 3, 3, 16, 1000)), ref)
    assert not np.array_equal(np.asarray(_bi(2, 2, 3, 16, 1000)), ref)
    assert not np.array_equal(np.asarray(_bi(1, 2, 4, 16, 1000)), ref)


def test_batch_indices_independent_of_call_order():
    f = _bi
    keys = [(s, l, t) for s in (0, 1) for l in range(3) for t in range(4)]
    forward = {k: np.asarray(f(*k, 8, 100)) for k in keys}
    backward = {k: np.asarray(f(*k, 8, 100)) for k in reversed(keys)}
    for k in keys:
        np.testing.assert_array_equal(forward[k], backward[k])
    # vmapped over learners (as a driver grouping gradients would) gives the same batches.
    vm = jax.jit(jax.vmap(lambda l: batch_indices(0, l, 2, 8, 100)))(jnp.arange(3))
    for l in range(3):
        np.testing.assert_array_equal(np.asarray(vm[l]), forward[(0, l, 2)])


@pytest.mark.parametrize("n, b", [(100, 10), (97, 8), (10, 3), (1, 1), (50000, 128)])
def test_batch_indices_is_a_permutation_per_epoch(n, b):
    steps = min(-(-3 * n // b), 40)  # three epochs, or the first 40 steps
    many = jax.jit(jax.vmap(lambda s: batch_indices(5, 1, s, b, n)))
    idx = np.asarray(many(jnp.arange(steps))).ravel()
    if steps * b >= 3 * n:
        for e in range(3):
            assert sorted(idx[e * n : (e + 1) * n].tolist()) == list(range(n))
        if n > 5:  # a fresh permutation each epoch
            assert not np.array_equal(idx[:n], idx[n : 2 * n])
    else:
        assert len(np.unique(idx)) == len(idx)  # no repeats within the first epoch


# --------------------------------------------------------------------------------------------
# cifar10: a tiny fixture in the real format, local and over a loopback server
# --------------------------------------------------------------------------------------------

_PER_BATCH = 4


def _make_cifar_tarball(tmp_path: Path) -> tuple[Path, dict]:
    """5 train batches + test batch of 4 images each, pickled and tarred the CIFAR way."""
    rng = np.random.default_rng(0)
    batches = {}
    members = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (_PER_BATCH, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, _PER_BATCH)]
        batches[name] = (data, labels)
        obj = {
            b"batch_label": name.encode(),
            b"labels": labels,
            b"data": data,
            b"filenames": [b"x.png"] * _PER_BATCH,
        }
        members[name] = pickle.dumps(obj, protocol=2)
    members["batches.meta"] = pickle.dumps({b"label_names": [b"c%d" % i for i in range(10)]})
    tar_path = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(tar_path, "w:gz") as tar:
        for name, raw in members.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return tar_path, batches


def _check_loaded(d: Dataset, batches: dict) -> None:
    assert d.x_train.shape == (5 * _PER_BATCH, 32, 32, 3)
    assert d.x_test.shape == (_PER_BATCH, 32, 32, 3)
    ytr = sum((batches[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    np.testing.assert_array_equal(d.y_train, ytr)
    np.testing.assert_array_equal(d.y_test, batches["test_batch"][1])
    # CHW rows -> NHWC: undo the per-channel standardisation and compare a known pixel.
    raw = np.concatenate([batches[f"data_batch_{i}"][0] for i in range(1, 6)]).astype(np.float64)
    img = raw.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1) / 255
    mean, std = img.mean(axis=(0, 1, 2)), img.std(axis=(0, 1, 2))
    np.testing.assert_allclose(d.x_train, (img - mean) / std, atol=1e-4)


def test_cifar10_reads_tarball_and_folder(tmp_path):
    tar_path, batches = _make_cifar_tarball(tmp_path)
    _check_loaded(get_dataset("cifar10", seed=0, path=str(tar_path)), batches)
    with tarfile.open(tar_path) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    for folder in (tmp_path / "x", tmp_path / "x" / "cifar-10-batches-py"):
        _check_loaded(get_dataset("cifar10", seed=0, path=str(folder)), batches)
    sub = get_dataset("cifar10", seed=0, path=str(tar_path), n_train=7, n_test=2)
    assert sub.x_train.shape[0] == 7 and sub.y_test.shape == (2,)


def test_cifar10_missing_is_a_clear_error_without_network(tmp_path, monkeypatch):
    monkeypatch.setenv("ASYNCSIM_CACHE", str(tmp_path / "cache"))
    assert default_cache_dir() == tmp_path / "cache"
    with pytest.raises(DataError, match="download = true"):
        get_dataset("cifar10", seed=0)
    with pytest.raises(DataError, match="does not exist"):
        get_dataset("cifar10", seed=0, path=str(tmp_path / "nope.tar.gz"))
    # A file that is not a tarball: one line (tarfile's own message spans five).
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tarball\n" * 8)
    with pytest.raises(DataError, match="expected the python version") as e:
        get_dataset("cifar10", seed=0, path=str(junk))
    assert "\n" not in str(e.value) and "not a gzip file" in str(e.value)


def test_cifar10_canonical_checksum_constant():
    assert CIFAR10_SHA256 == "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce"


@pytest.fixture
def loopback(tmp_path):
    """An HTTP server on 127.0.0.1 (ephemeral port) serving tmp_path/'www'."""
    root = tmp_path / "www"
    root.mkdir()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(root), **kw)

        def log_message(self, *args):  # keep test output clean
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_cifar10_download_verified_and_cached(tmp_path, loopback):
    root, base = loopback
    tar_path, batches = _make_cifar_tarball(tmp_path)
    (root / "c.tar.gz").write_bytes(tar_path.read_bytes())
    sha = hashlib.sha256(tar_path.read_bytes()).hexdigest()
    cache = tmp_path / "cache"
    url = f"{base}/c.tar.gz"
    d = get_dataset("cifar10", seed=0, url=url, sha256=sha, cache_dir=str(cache), download=True)
    _check_loaded(d, batches)
    assert sorted(p.name for p in cache.iterdir()) == ["cifar-10-python.tar.gz"]
    # Cached: a second load needs no server (the URL now 404s).
    (root / "c.tar.gz").unlink()
    _check_loaded(
        get_dataset("cifar10", seed=0, url=url, sha256=sha, cache_dir=str(cache), download=True),
        batches,
    )


def test_cifar10_download_checksum_mismatch_leaves_nothing(tmp_path, loopback):
    root, base = loopback
    tar_path, _ = _make_cifar_tarball(tmp_path)
    (root / "c.tar.gz").write_bytes(tar_path.read_bytes())
    cache = tmp_path / "cache"
    url = f"{base}/c.tar.gz"
    with pytest.raises(DataError, match=r"checksum mismatch for http://127\.0\.0\.1.*expected"):
        get_dataset(
            "cifar10", seed=0, url=url, sha256="0" * 64, cache_dir=str(cache), download=True
        )
    assert list(cache.iterdir()) == []
    with pytest.raises(DataError, match="failed"):
        get_dataset(
            "cifar10",
            seed=0,
            url=f"{base}/missing",
            sha256="0" * 64,
            cache_dir=str(cache),
            download=True,
        )
    assert list(cache.iterdir()) == []
