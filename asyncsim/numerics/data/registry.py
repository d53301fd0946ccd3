"""The data sets' registry: a name and its options to a :class:`~.dataset.Dataset`.

Contract: :func:`get_dataset` ``(name, *, seed, base_dir=None, **options)`` builds a
registered data set (relative path options resolve against ``base_dir``); an unknown name or
a bad option raises :class:`ValueError` naming what is allowed; the factory's
:class:`~.dataset.DataError` passes through. Factories register with
:func:`register_dataset` or the entry-point group ``asyncsim.datasets``. The train-set size
is known before a data set is built (:func:`declared_train_size`, :func:`train_size`), so a
run length in epochs and the batch size can be checked first.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from asyncsim._registry import PluginRegistry, build, callable_value, option_defaults
from asyncsim.errors import ScenarioError
from asyncsim.numerics.data.dataset import DataError, Dataset

__all__ = ["available_datasets", "check_batch_size", "dataset_factory", "declared_train_size",
           "get_dataset", "register_dataset", "train_size"]


_registry: PluginRegistry[Callable[..., Dataset]] = PluginRegistry(
    "asyncsim.datasets", "data set", "data.name",
    adapt=callable_value("a factory f(*, seed, **options) -> Dataset"))


def register_dataset(name: str, *, replace: bool = False) -> Callable[[Callable], Callable]:
    """Decorator registering a factory ``f(*, seed, **options) -> Dataset`` under ``name``.

    An installed package can instead expose the factory under the entry-point group
    ``asyncsim.datasets`` (docs/plugins.md); a name registered here wins over it, and a
    name another factory holds is a ValueError unless ``replace`` (``PluginRegistry.register``).
    """
    return _registry.decorator(name, replace=replace)


def available_datasets() -> list[str]:
    """Sorted names of the data sets: built-ins, registered factories and entry points."""
    return _registry.names()


def dataset_factory(name: str) -> Callable[..., Dataset]:
    """The factory registered (or installed) as ``name``; ScenarioError under ``data.name``
    for an unknown name."""
    return _registry.get(name)


def get_dataset(name: str, *, seed: int, base_dir: str | os.PathLike | None = None,
                **options: Any) -> Dataset:
    """Build data set ``name``; ValueError for an unknown name or option (listing the allowed).

    Options annotated ``Path`` (cifar10's ``path`` and ``cache_dir``) take a string or a path;
    ``~`` is expanded and a relative one resolves against ``base_dir``, which a scenario's
    data set gets as the scenario file's folder (:attr:`asyncsim.config.Scenario.base_dir`),
    and otherwise against the working directory.
    """
    return build(dataset_factory(name), options, key="data", what=_registry.what, name=name,
                 also=("name", "batch_size"), fixed={"seed": seed},
                 reraise=(DataError,), base_dir=base_dir)


def declared_train_size(name: str, options: Mapping[str, Any]) -> int | None:
    """The train-set size of data set ``name`` with ``options`` without building it:
    ``n_train`` as given, else the factory's integer default; None when only building the
    data set can tell (a real CIFAR10 subset-less load is 50,000, but a plug-in may differ)."""
    n = options.get("n_train")
    if n is None:
        try:
            n = option_defaults(dataset_factory(name)).get("n_train")
        except ScenarioError:
            return None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def train_size(name: str, options: Mapping[str, Any]) -> int:
    """:func:`declared_train_size`, or CIFAR10's 50,000 when it is not declared (run lengths
    in epochs before the data set is built)."""
    n = declared_train_size(name, options)
    return 50_000 if n is None else n


def check_batch_size(batch_size: int, n_train: int, data_name: str) -> None:
    """A mini-batch draws without replacement from one pass over the train set (see
    :func:`batch_indices`), so it holds at most ``n_train`` samples."""
    if batch_size > n_train:
        raise ScenarioError("data.batch_size",
                            f"is {batch_size}, more than the {n_train} training samples of "
                            f"data {data_name!r}; allowed: 1 to {n_train} (a full batch)")
