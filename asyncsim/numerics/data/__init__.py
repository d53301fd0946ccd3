"""Data sets and deterministic mini-batch sampling.

* :mod:`.dataset`: what a data set is (:class:`Dataset`, :class:`DataError`);
* :mod:`.registry`: names to factories (:func:`get_dataset`, :func:`register_dataset`,
  :func:`train_size`);
* :mod:`.batches`: which examples a learner's step reads (:func:`batch_indices`);
* the built-ins: :mod:`.synthetic` (``synthetic-cifar``, the offline default, and
  ``gaussian``) and :mod:`.cifar10` (the real CIFAR10, read by :mod:`.cifar10_batches`
  without running code a file names).

Importing this package registers the built-ins.
"""

from asyncsim.numerics.data import cifar10 as _cifar10
from asyncsim.numerics.data import synthetic as _synthetic
from asyncsim.numerics.data.batches import batch_indices
from asyncsim.numerics.data.cifar10 import (
    CIFAR10_SHA256,
    CIFAR10_URL,
    default_cache_dir,
    download_source,
    fetch,
)
from asyncsim.numerics.data.dataset import DataError, Dataset
from asyncsim.numerics.data.registry import (
    available_datasets,
    check_batch_size,
    dataset_factory,
    declared_train_size,
    get_dataset,
    register_dataset,
    train_size,
)

del _cifar10, _synthetic  # imported for their registrations

__all__ = [
    "CIFAR10_SHA256",
    "CIFAR10_URL",
    "DataError",
    "Dataset",
    "available_datasets",
    "batch_indices",
    "check_batch_size",
    "dataset_factory",
    "declared_train_size",
    "default_cache_dir",
    "download_source",
    "fetch",
    "get_dataset",
    "register_dataset",
    "train_size",
]
