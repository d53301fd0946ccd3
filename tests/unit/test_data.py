"""Tests of asyncsim.numerics.data: synthetic-cifar, batch sampling, the CIFAR10 loader and
download.

No test touches the internet: the CIFAR10 tests build a tiny tarball in the real format in
tmp_path and serve it from a loopback HTTP server.
"""

from __future__ import annotations

import dataclasses
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
    with pytest.raises(ValueError, match=r"data.n_trian: unknown option for data set "
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
    with pytest.raises(ValueError, match=r"data.sise: unknown option for data set 'plug-fixed'; "
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
    from asyncsim.drivers.build import numerics_for
    from asyncsim.errors import ScenarioError
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
        numerics_for(late)


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


# The data sets' hashes (Dataset.hash) on every machine: they are made without BLAS and
# without libm's or numpy's SIMD transcendental functions (correctly rounded operations in a
# fixed order), so no CPU model, BLAS kernel or thread count changes them. A change to the
# generators changes these, and every committed number measured on them (CHANGELOG).
GOLDEN_DATA = [
    ("synthetic-cifar", dict(seed=0, n_train=300, n_test=100),
     "f87ebf7770d3eca8f1ed4fb7b7afe5bfbc8a392ff356bf0f0a4ebba642a329da"),
    ("synthetic-cifar", dict(seed=7, n_train=64, n_test=16, difficulty=0.5, prototypes=2,
                             max_shift=2, label_noise=0.2),
     "2b89e4d3a0898687279bf8305695de8f6520467f25635f235aa306882629780b"),
    ("gaussian", dict(seed=1, dim=7, n_train=100, n_test=10),
     "968324c3d3b6c6a219df150d1468fb3cdc243bf08cd78031fd3b1749381d7079"),
]


@pytest.mark.parametrize(("name", "options", "digest"), GOLDEN_DATA)
def test_generated_data_sets_have_their_golden_hash(name, options, digest):
    assert get_dataset(name, **options).hash() == digest


def test_data_hash_sees_every_array_and_the_name(small):
    """Dataset.hash changes with one flipped bit of any array, a label, or the name."""
    base = small.hash()
    assert base == get_dataset("synthetic-cifar", seed=3, n_train=2000, n_test=500).hash()
    for field in ("x_train", "y_train", "x_test", "y_test"):
        arr = getattr(small, field).copy()
        arr.view(np.uint8).reshape(-1)[-1] ^= 1
        assert dataclasses.replace(small, **{field: arr}).hash() != base, field
    assert dataclasses.replace(small, name="other").hash() != base


def test_fixed_order_product_and_turns_are_what_they_stand_for():
    """The machine-independent pieces of the generator: the fixed-order product equals a
    float64 matrix product to rounding, in every block split; the turn table equals
    cos/sin of 2*pi*m/size to 1e-15."""
    from asyncsim.numerics.data.synthetic import _fixed_order_matmul, _turns

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((300, 7)), rng.standard_normal((7, 5))
    want = a @ b
    for block in (1, 64, 256, 1000):
        got = _fixed_order_matmul(a, b, block=block)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)
        np.testing.assert_array_equal(got, _fixed_order_matmul(a, b))  # blocks: same bits
    for size in (32, 40):
        cos, sin = _turns(size)
        x = 2 * np.pi * np.arange(size) / size
        np.testing.assert_allclose(cos, np.cos(x), rtol=0, atol=1e-15)
        np.testing.assert_allclose(sin, np.sin(x), rtol=0, atol=1e-15)


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


def test_cifar10_download_verified_and_cached(tmp_path, loopback, monkeypatch):
    """A mirror and its checksum come from the environment; the download is verified,
    cached, and a cached file needs no server."""
    root, base = loopback
    tar_path, batches = _make_cifar_tarball(tmp_path)
    (root / "c.tar.gz").write_bytes(tar_path.read_bytes())
    sha = hashlib.sha256(tar_path.read_bytes()).hexdigest()
    cache = tmp_path / "cache"
    monkeypatch.setenv("ASYNCSIM_CIFAR10_URL", f"{base}/c.tar.gz")
    monkeypatch.setenv("ASYNCSIM_CIFAR10_SHA256", sha.upper())  # hex digits in either case
    d = get_dataset("cifar10", seed=0, cache_dir=str(cache), download=True)
    _check_loaded(d, batches)
    assert sorted(p.name for p in cache.iterdir()) == ["cifar-10-python.tar.gz"]
    # Cached: a second load needs no server (the URL now 404s).
    (root / "c.tar.gz").unlink()
    _check_loaded(get_dataset("cifar10", seed=0, cache_dir=cache, download=True), batches)


def test_cifar10_download_checksum_mismatch_leaves_nothing(tmp_path, loopback, monkeypatch):
    root, base = loopback
    tar_path, _ = _make_cifar_tarball(tmp_path)
    (root / "c.tar.gz").write_bytes(tar_path.read_bytes())
    cache = tmp_path / "cache"
    monkeypatch.setenv("ASYNCSIM_CIFAR10_URL", f"{base}/c.tar.gz")
    monkeypatch.setenv("ASYNCSIM_CIFAR10_SHA256", "0" * 64)
    with pytest.raises(DataError, match=r"checksum mismatch for http://127\.0\.0\.1.*expected"):
        get_dataset("cifar10", seed=0, cache_dir=str(cache), download=True)
    assert list(cache.iterdir()) == []
    # A mirror URL without a checksum of its own is held to the canonical one.
    monkeypatch.delenv("ASYNCSIM_CIFAR10_SHA256")
    with pytest.raises(DataError, match=f"expected sha256 {CIFAR10_SHA256}"):
        get_dataset("cifar10", seed=0, cache_dir=str(cache), download=True)
    assert list(cache.iterdir()) == []
    monkeypatch.setenv("ASYNCSIM_CIFAR10_URL", f"{base}/missing")
    with pytest.raises(DataError, match="failed"):
        get_dataset("cifar10", seed=0, cache_dir=str(cache), download=True)
    assert list(cache.iterdir()) == []


def test_cifar10_checksum_from_the_environment_needs_a_mirror_url(tmp_path, monkeypatch):
    """A checksum alone would vouch for nothing but the canonical file: an error, as is one
    that is not a SHA-256; neither touches the network or the cache."""
    cache = tmp_path / "cache"
    monkeypatch.delenv("ASYNCSIM_CIFAR10_URL", raising=False)
    monkeypatch.setenv("ASYNCSIM_CIFAR10_SHA256", "0" * 64)
    with pytest.raises(DataError, match="ASYNCSIM_CIFAR10_SHA256 is set but "
                                        "ASYNCSIM_CIFAR10_URL is not") as e:
        get_dataset("cifar10", seed=0, cache_dir=str(cache), download=True)
    assert "\n" not in str(e.value)
    monkeypatch.setenv("ASYNCSIM_CIFAR10_URL", "http://127.0.0.1:9/c.tar.gz")
    monkeypatch.setenv("ASYNCSIM_CIFAR10_SHA256", "not-a-checksum")
    with pytest.raises(DataError, match="must be 64 hex digits"):
        get_dataset("cifar10", seed=0, cache_dir=str(cache), download=True)
    assert not cache.exists() or list(cache.iterdir()) == []


_MIN_SCENARIO = """
seed = 0
[model]
name = "mlp"
hidden = [4]
[run]
updates = 2
"""


@pytest.mark.parametrize("option,value", [("url", "http://127.0.0.1:9/evil.tar.gz"),
                                          ("sha256", "0" * 64)])
def test_cifar10_url_and_sha256_are_refused_in_a_scenario(tmp_path, option, value):
    """What is downloaded and trusted is never a scenario file's choice: data.url and
    data.sha256 are refused in one line under their key, pointing to the environment."""
    from asyncsim.errors import ScenarioError
    from asyncsim.numerics.parts import build_dataset
    from asyncsim.scenario import load_scenario

    path = tmp_path / "s.toml"
    path.write_text(_MIN_SCENARIO + f'[data]\nname = "cifar10"\nbatch_size = 4\n'
                                    f'download = true\ncache_dir = "cache"\n'
                                    f'{option} = "{value}"\n')
    with pytest.raises(ScenarioError) as e:
        loaded = load_scenario(path)
        build_dataset(loaded.data, loaded.base_dir, seed=loaded.seed, source=loaded.source)
    msg = str(e.value)
    assert msg.startswith(f"{path}: data.{option}: cannot be set in a scenario"), msg
    assert "ASYNCSIM_CIFAR10_URL" in msg and "ASYNCSIM_CIFAR10_SHA256" in msg
    assert "\n" not in msg
    assert not (tmp_path / "cache").exists()  # refused before anything is fetched
    with pytest.raises(ScenarioError, match=f"data.{option}: cannot be set in a scenario"):
        get_dataset("cifar10", seed=0, download=True, cache_dir=str(tmp_path / "cache"),
                    **{option: value})


def test_cifar10_relative_paths_resolve_against_the_scenario_folder(tmp_path, monkeypatch):
    """``path`` and ``cache_dir`` are paths like a delay's CSV: relative ones resolve against
    the scenario file's folder (its base_dir), not the working directory."""
    from asyncsim.numerics.parts import build_dataset
    from asyncsim.scenario import load_scenario

    folder = tmp_path / "scenario"
    folder.mkdir()
    _, batches = _make_cifar_tarball(folder)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    path = folder / "s.toml"
    path.write_text(_MIN_SCENARIO + '[data]\nname = "cifar10"\nbatch_size = 4\n'
                                    'path = "cifar-10-python.tar.gz"\n')
    scn = load_scenario(path)
    assert scn.base_dir == folder
    d = get_dataset(scn.data.name, seed=scn.seed, base_dir=scn.base_dir, **scn.data.options)
    _check_loaded(d, batches)
    # What every driver builds.
    _check_loaded(build_dataset(scn.data, scn.base_dir, seed=scn.seed), batches)
    # A run folder records the path absolute (the data set is too big to copy).
    from asyncsim.drivers.folder_scenario import folder_scenario

    assert folder_scenario(scn)[0]["data"]["path"] == str(folder / "cifar-10-python.tar.gz")
    with pytest.raises(DataError, match=f"CIFAR10 path {elsewhere / 'cifar-10-python'}"):
        get_dataset("cifar10", seed=0, path="cifar-10-python.tar.gz")  # no base_dir: the cwd
    path.write_text(_MIN_SCENARIO + '[data]\nname = "cifar10"\nbatch_size = 4\n'
                                    'cache_dir = "."\n')
    scn = load_scenario(path)
    d = get_dataset(scn.data.name, seed=scn.seed, base_dir=scn.base_dir, **scn.data.options)
    _check_loaded(d, batches)


# --------------------------------------------------------------------------------------------
# cifar10: a data file runs no code
# --------------------------------------------------------------------------------------------


class _Reduces:
    """An object whose unpickling calls ``fn(*args)`` (what a malicious pickle does)."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _payloads(marker: Path) -> dict[str, bytes]:
    """Pickles whose loading would create ``marker``, each naming a global the loader must
    refuse: a shell command, a file opened for writing, and numpy-looking np.save."""
    import builtins
    import os
    import shlex

    return {
        "posix.system": pickle.dumps(_Reduces(os.system, f"touch {shlex.quote(str(marker))}"),
                                     protocol=2),
        "io.open": pickle.dumps({b"data": _Reduces(builtins.open, str(marker), "w"),
                                 b"labels": [0]}, protocol=2),
        # Nested in an otherwise real-looking batch, after an admitted numpy array.
        "numpy.save": pickle.dumps({b"batch_label": b"x", b"data": np.zeros((1, 3072), np.uint8),
                                    b"labels": _Reduces(np.save, str(marker),
                                                        np.zeros(1, np.uint8))}, protocol=4),
    }


def _crafted_sources(tmp_path: Path, payload: bytes) -> tuple[Path, Path]:
    """A ``cifar-10-batches-py`` folder and a tarball in the real format whose
    ``data_batch_1`` is ``payload`` (the other batches are genuine)."""
    tar_path, _ = _make_cifar_tarball(tmp_path)
    with tarfile.open(tar_path) as tar:
        tar.extractall(tmp_path / "crafted", filter="data")
    folder = tmp_path / "crafted" / "cifar-10-batches-py"
    (folder / "data_batch_1").write_bytes(payload)
    crafted_tar = tmp_path / "crafted.tar.gz"
    with tarfile.open(crafted_tar, "w:gz") as tar:
        tar.add(folder, arcname="cifar-10-batches-py")
    return folder, crafted_tar


@pytest.mark.parametrize("refused", ["posix.system", "io.open", "numpy.save"])
def test_cifar10_refuses_a_batch_that_would_run_code(tmp_path, refused):
    marker = tmp_path / "MARKER.npy"  # .npy: np.save would write exactly this name
    folder, tar_path = _crafted_sources(tmp_path, _payloads(marker)[refused])
    for source, where in ((folder, str(folder / "data_batch_1")),
                          (tar_path, f"cifar-10-batches-py/data_batch_1 in {tar_path}")):
        with pytest.raises(DataError) as e:
            get_dataset("cifar10", seed=0, path=source)
        msg = str(e.value)
        assert "\n" not in msg, msg
        assert msg.startswith(f"CIFAR10 batch {where}: refused to unpickle the global "
                              f"{refused}"), msg
        assert "a CIFAR10 python batch is a pickled dict of b'batch_label'" in msg
        assert not marker.exists()


def _py2_pickle(obj) -> bytes:
    """``obj`` pickled as CIFAR10's own Python 2 files are: protocol 2, ``str`` and ``bytes``
    as Python 2 byte strings (BINSTRING, no ``_codecs.encode``), and numpy 1.x's module
    name ``numpy.core.multiarray``."""
    import struct

    class Py2Pickler(pickle._Pickler):
        dispatch = dict(pickle._Pickler.dispatch)

        def save_str8(self, s):
            raw = s.encode("latin-1") if isinstance(s, str) else s
            if len(raw) < 256:
                self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
            else:
                self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
            self.memoize(s)

        dispatch[bytes] = save_str8
        dispatch[str] = save_str8

    buf = io.BytesIO()
    Py2Pickler(buf, protocol=2).dump(obj)
    raw = buf.getvalue()
    assert b"_codecs" not in raw
    return raw.replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")


def test_cifar10_reads_python2_batches_without_codecs(tmp_path):
    """The real files' own format: numpy.core.multiarray._reconstruct, ndarray, dtype and
    Python 2 byte strings (what the restricted loader is for)."""
    tar_path, batches = _make_cifar_tarball(tmp_path)
    with tarfile.open(tar_path) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    folder = tmp_path / "x" / "cifar-10-batches-py"
    for name, (data, labels) in batches.items():
        raw = _py2_pickle({b"batch_label": name.encode(), b"labels": labels, b"data": data,
                           b"filenames": [b"x.png"] * _PER_BATCH})
        assert b"cnumpy.core.multiarray\n_reconstruct\n" in raw
        (folder / name).write_bytes(raw)
    _check_loaded(get_dataset("cifar10", seed=0, path=folder), batches)


@pytest.mark.parametrize("payload,says", [
    (b"", "is damaged (EOFError"),
    (b"\x80\x02}q\x00(X\x04\x00\x00", "is damaged ("),  # truncated
    (b"garbage, not a pickle\n" * 4, "is damaged (ValueError"),  # 'g' is the GET opcode
    (pickle.dumps([1, 2, 3], protocol=2), "holds a list, not a batch dict"),
    (pickle.dumps({b"data": [[0] * 3072], b"labels": [0]}, protocol=2),
     "holds b'data' a list of 1 with [0, 0,"),
    (pickle.dumps({b"data": np.zeros((1, 3072)), b"labels": [0]}, protocol=2),
     "holds b'data' a float64 array of shape (1, 3072) and b'labels' a list of 1;"),
    (pickle.dumps({b"data": np.zeros((2, 1024), np.uint8), b"labels": [0, 1]}, protocol=2),
     "holds b'data' a uint8 array of shape (2, 1024)"),
    (pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [0.5]}, protocol=2),
     "and b'labels' a list of 1 with 0.5;"),
    (pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [2**40]}, protocol=2),
     f"and b'labels' a list of 1 with {2**40};"),  # int32 would overflow: not a traceback
    (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [1]}, protocol=2),
     "and b'labels' a list of 1;"),
    # _codecs.encode is admitted for latin-1 bytes only, not as a general transform.
    (b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00xX\x05\x00\x00\x00rot13\x86R.",
     "admitted only as encode(text, 'latin1')"),
], ids=["empty", "truncated", "garbage", "list", "data-list", "data-float", "data-shape",
        "labels-float", "labels-big", "labels-short", "codecs-rot13"])
def test_cifar10_damaged_batches_are_one_line_errors(tmp_path, payload, says):
    folder, tar_path = _crafted_sources(tmp_path, payload)
    for source in (folder, tar_path):
        with pytest.raises(DataError, match="CIFAR10 batch .*data_batch_1") as e:
            get_dataset("cifar10", seed=0, path=source)
        msg = str(e.value)
        assert "\n" not in msg and says in msg, msg


_TINY_RUN = _MIN_SCENARIO.replace("updates = 2", "updates = 3") + """
[cluster]
learners = 2
[data]
name = "synthetic-cifar"
batch_size = 4
n_train = 32
n_test = 16
"""


def test_a_crafted_cifar10_path_in_a_run_folder_runs_no_code(tmp_path, capsys):
    """A run folder is a contract: a scenario.toml whose [data] points cifar10 at a crafted
    batch is refused by `asyncsim replay` (and `run`) in one line, and nothing it names runs;
    data.url is refused the same way."""
    import tomllib

    from asyncsim.cli import main
    from asyncsim.runs import dump_toml

    marker = tmp_path / "MARKER.npy"
    folder, _ = _crafted_sources(tmp_path, _payloads(marker)["posix.system"])
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(_TINY_RUN)
    run_dir = tmp_path / "run"
    assert main(["trace", str(scenario), "--out", str(run_dir), "--quiet"]) == 0
    saved = run_dir / "scenario.toml"
    raw = tomllib.loads(saved.read_text())
    raw["data"] = {"name": "cifar10", "batch_size": 4, "path": str(folder.parent)}
    saved.write_text(dump_toml(raw))
    capsys.readouterr()
    assert main(["replay", str(run_dir), "--out", str(tmp_path / "rep"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "refused to unpickle the global posix.system" in err and "data_batch_1" in err
    assert not marker.exists()
    for table, says in (({"path": str(folder.parent)}, "refused to unpickle the global"),
                        ({"download": True, "url": "http://127.0.0.1:9/c.tar.gz"},
                         "data.url: cannot be set in a scenario")):
        raw["data"] = {"name": "cifar10", "batch_size": 4, **table}
        scenario.write_text(dump_toml(raw))
        assert main(["run", str(scenario), "--out", str(tmp_path / "r2"), "--force",
                     "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err, err
        assert not marker.exists()
