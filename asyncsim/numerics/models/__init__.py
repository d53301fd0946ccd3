"""Models: pure ``init``/``apply``/``loss`` triples keyed by name (the contract is in
:mod:`.base`).

Built-ins: P1's ``cifar10-full`` and P2's ``resnet20``/``resnet44`` (:mod:`.cifar`),
``mlp``, ``linear`` and ``quadratic`` (:mod:`.small`), the P1-F4 ``alexnet``
(:mod:`.imagenet`). Adding a model touches one file: a factory ``f(**options) -> Model``
decorated with :func:`register_model` (or exposed through the ``asyncsim.models``
entry-point group; docs/plugins.md).
"""

from asyncsim.numerics.models import cifar, imagenet, small  # noqa: F401  (register built-ins)
from asyncsim.numerics.models.base import (
    DenseInput,
    Model,
    available_models,
    expand_parts,
    get_model,
    grad_fn,
    grad_parts,
    model_factory,
    num_params,
    quadratic_spectrum,
    register_model,
    tree_bytes,
)
from asyncsim.numerics.models.cifar import (
    cifar10_full,
    local_response_norm_within_channel,
    resnet20,
    resnet44,
)
from asyncsim.numerics.models.imagenet import alexnet
from asyncsim.numerics.models.small import linear, mlp, quadratic

__all__ = [
    "DenseInput", "Model", "alexnet", "available_models", "cifar10_full", "expand_parts",
    "get_model", "grad_fn", "grad_parts", "linear", "local_response_norm_within_channel",
    "mlp", "model_factory", "num_params", "quadratic", "quadratic_spectrum", "register_model",
    "resnet20", "resnet44", "tree_bytes",
]
