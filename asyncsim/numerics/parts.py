"""The model and the data set of a scenario's ``[model]`` and ``[data]`` parts, refused in
one line (a ScenarioError under the key that sets the size) when an option is wrong or the
machine's memory is too small for them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

from asyncsim import _checks
from asyncsim.config import DataConfig, ModelConfig
from asyncsim.errors import ScenarioError
from asyncsim.numerics.data import Dataset, get_dataset
from asyncsim.numerics.models import Model, get_model, num_params

__all__ = ["PARAM_BYTES", "build_dataset", "build_model"]


# Bytes a run holds per model parameter at the least: float32 parameters, one gradient and
# the update's result (momentum buffers and stale versions add more).
PARAM_BYTES = 3 * 4


def build_model(model: ModelConfig, *, source: str | None = None,
                base_dir: str | os.PathLike | None = None) -> Model:
    """The model of a scenario's ``[model]`` part (its relative file options resolved against
    ``base_dir``); a refused option is a ScenarioError under ``model.*`` (naming the
    scenario file ``source``), and so is a model too big for this machine's memory (counted
    from its shapes, before any parameter exists: ``model.hidden = [10**11]`` would abort
    XLA)."""
    try:
        built = get_model(model.name, base_dir=base_dir, **model.options)
        _check_model_fits(built, model.options)
    except ScenarioError as e:
        raise e.with_file(source) from None
    return built


def _check_model_fits(model: Model, options: Any) -> None:
    key = _size_option("model", options)
    what = "the model does not fit in this machine's memory"
    try:
        count = num_params(jax.eval_shape(model.init, jax.random.PRNGKey(0)))
    except (MemoryError, OverflowError, ValueError, TypeError) as e:
        # The shapes alone are too big (numpy's and XLA's refusals of a dimension beyond
        # 64 bits); a ValueError from a model with sizes that fit is the model's own.
        have = _checks.physical_memory()
        if isinstance(e, ValueError | TypeError) and not (
                have is not None and 4 * _largest_int(options) > have):
            raise
        raise ScenarioError(key, f"{what} ({' '.join(str(e).split())[:120]})") from None
    _checks.memory(key, count * PARAM_BYTES, f"{what}: its {count:,} parameters need",
                 f" ({PARAM_BYTES} bytes each: float32 parameters, a gradient, the update)")


def _size_option(section: str, options: Any) -> str:
    """The key of the option that sets the size of a model or data set, for a refusal of
    its size: the one holding the largest integer (``model.hidden = [10**11]``,
    ``data.n_train``), else ``section``."""
    sizes = {k: _largest_int(v) for k, v in options.items()}
    top = max(sizes, key=sizes.__getitem__, default=None)
    return f"{section}.{top}" if top is not None and sizes[top] > 0 else section


def _largest_int(value: Any) -> int:
    """The largest integer in an option's value (lists and tables searched), else 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, list | tuple):
        return max((_largest_int(v) for v in value), default=0)
    return 0


def build_dataset(data: DataConfig, base_dir: Path | None, *, seed: int,
                  source: str | None = None) -> Dataset:
    """The data set of a scenario's ``[data]`` part drawn with ``seed``; relative file
    options (cifar10's ``path``) resolve against ``base_dir`` (the scenario file's folder). A
    refused option or a missing file is a ScenarioError under ``data.*`` naming ``source``."""
    try:
        return get_dataset(data.name, seed=seed, base_dir=base_dir, **data.options)
    except ScenarioError as e:
        raise e.with_file(source) from None
    except ValueError as e:  # DataError: a missing file, a refused download
        raise ScenarioError("data", str(e), file=source) from None
    except MemoryError as e:  # numpy's _ArrayMemoryError: one line, not 38
        raise ScenarioError(_size_option("data", data.options), f"the data set does not "
                            f"fit in this machine's memory ({' '.join(str(e).split())[:120]})",
                            file=source) from None
