"""P2's update loop exactly as its authors ran it: a numpy (float32) transcription.

P2 = Giladi, Nacson, Hoffer, Soudry, "At stability's edge: how to adjust hyperparameters to
preserve minima selection in asynchronous training of neural networks?" (ICLR 2020). Its
official code is the GitHub repository ``paper-submissions/delay_stability`` at commit
``bdd5e631ae82b35d174cfd636af87d9dd61b4537`` (PyTorch). Nothing of it is copied here: this is
our own numpy rendering of the loop it runs, written to test asyncsim against
(tests/unit/test_p2_parity.py). Every piece cites the file:line range of that commit it
transcribes (lines counted in the files as stored at that commit):

* ``trainer.py:67-81`` ``Trainer._schedule_worker`` (round_robin / random / normal schedules
  and the per-worker staleness counters), ``trainer.py:83-103`` ``Trainer._step`` (pull the
  worker's copy, compute a gradient there, push it with ``self.epoch`` and
  ``self.training_steps``), ``trainer.py:120-122`` (the step index ``epoch * len(loader) +
  i``), ``main.py:271`` and ``main.py:278-285`` (``training_steps`` from 0, ``trainer.epoch =
  epoch`` for each pass over the loader, so a step's epoch is ``steps // len(loader)``),
* ``main.py:234-235`` (the server: the requested one if ``delay > 0``, else ``ssgd``),
* ``parameter_server.py:42-55`` (every worker's copy starts as the initial weights),
  ``parameter_server.py:242-286`` ``HSGD`` (``--server asgd``), ``parameter_server.py:289-345``
  ``MSGD`` (shifted momentum: one momentum buffer per worker), ``parameter_server.py:348-392``
  ``SSGD`` (what delay 0 runs),
* ``utils/optim.py:35`` (``torch.optim.SGD(params, lr=0)``: momentum, dampening and weight
  decay 0 until the regime sets them), ``utils/optim.py:42-82`` ``OptimRegime.update`` and
  ``utils/optim.py:84-102`` ``OptimRegime.adjust``,
* ``models/resnet.py:165-170`` ``ResNet.regularization_pre_step`` (``grad += weight_decay *
  weight`` for the weights of Conv2d / Linear modules, never their biases or the BatchNorm
  parameters) and ``models/resnet.py:295-302`` (the shape of ``ResNet_cifar``'s regime: phase
  0 sets lr, momentum, dampening and ``weight_decay = 0`` in the optimizer, later phases only
  the rate),
* PyTorch's ``torch.optim.SGD.step`` (``torch/optim/sgd.py``; the arithmetic has been the same
  since PyTorch 0.4): ``d_p = grad (+ wd p)``; with momentum, a parameter without a buffer
  gets ``buf = clone(d_p)`` (its first step is undampened), else ``buf = momentum buf + (1 -
  dampening) d_p``; ``d_p = d_p + momentum buf`` (nesterov) or ``buf``; ``p = p - lr d_p``.

Parameters are asyncsim's nested dicts of float32 arrays (``{"fc": {"w": ..., "b": ...}}``);
the "weights" that ``regularization_pre_step`` decays are the leaves of rank >= 2 (an
``nn.Linear``'s ``weight`` is its rank-2 matrix, a ``Conv2d``'s its rank-4 kernel; biases and
BatchNorm scales are rank 1).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy.stats import norm

REPO = "paper-submissions/delay_stability"
COMMIT = "bdd5e631ae82b35d174cfd636af87d9dd61b4537"

Params = dict[str, Any]  # nested dict of float32 numpy arrays
GradFn = Callable[[Params, int, int], Params]  # (params, worker, batch_index) -> grads


# ----------------------------------------------------------------------------- pytrees
def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for k in sorted(tree):
        v = tree[k]
        path = f"{prefix}/{k}" if prefix else k
        if isinstance(v, Mapping):
            out.update(_flatten(v, path))
        else:
            out[path] = np.array(v, dtype=np.float32)  # a copy (clone / deepcopy)
    return out


def _unflatten(flat: Mapping[str, np.ndarray]) -> Params:
    out: Params = {}
    for path, v in flat.items():
        node = out
        *heads, last = path.split("/")
        for h in heads:
            node = node.setdefault(h, {})
        node[last] = v
    return out


# ----------------------------------------------------------------------------- regime
def cifar_regime(lr: float, momentum: float = 0.0, dampening: float = 0.0,
                 decay_epochs: Sequence[int] = (), decay_factor: float = 0.1) -> list[dict]:
    """A regime shaped like ``ResNet_cifar``'s (models/resnet.py:295-302): phase 0 sets the
    rate, momentum, dampening and ``weight_decay = 0`` (weight decay is the model's
    ``regularization_pre_step``); each later phase, from its epoch on, only the rate, ``lr *
    decay_factor ** k`` (computed as there, a Python float product)."""
    phases = [{"epoch": 0, "optimizer": "SGD", "lr": lr, "dampening": dampening,
               "weight_decay": 0, "momentum": momentum}]
    for k, e in enumerate(decay_epochs, start=1):
        phases.append({"epoch": e, "lr": lr * decay_factor ** k})
    return phases


class OptimRegime:
    """utils/optim.py:13-102: an SGD whose settings a regime list reconfigures."""

    def __init__(self, regime: list[dict]):
        # utils/optim.py:35, torch.optim.SGD(params, lr=0): the param group's defaults.
        self.group = {"lr": 0.0, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0,
                      "nesterov": False}
        self.state: dict[str, dict[str, np.ndarray]] = {}  # optimizer.state[p]
        self.regime = regime
        self.current_regime_phase: int | None = None

    def update(self, epoch: int, train_steps: int) -> None:
        """utils/optim.py:42-82."""
        if self.regime is None:
            return
        update_optimizer = False
        if self.current_regime_phase is None:  # :48-57, the first phase that has started
            update_optimizer = True
            for regime_phase, regime_setting in enumerate(self.regime):
                start_epoch = regime_setting.get("epoch", 0)
                start_step = regime_setting.get("step", 0)
                if epoch >= start_epoch or train_steps >= start_step:
                    self.current_regime_phase = regime_phase
                    break
        if len(self.regime) > self.current_regime_phase + 1:  # :58-64, at most one phase on
            next_phase = self.current_regime_phase + 1
            start_epoch = self.regime[next_phase].get("epoch", math.inf)
            start_step = self.regime[next_phase].get("step", math.inf)
            if epoch >= start_epoch or train_steps >= start_step:
                self.current_regime_phase = next_phase
                update_optimizer = True
        setting = copy.deepcopy(self.regime[self.current_regime_phase])
        if any(k in setting for k in ("lr_decay_rate", "step_lambda", "epoch_lambda")):
            # :68-79: rate formulas; P2's CIFAR regimes use none of them.
            raise NotImplementedError("rate formulas are not transcribed")
        if update_optimizer:
            self.adjust(setting)

    def adjust(self, setting: dict) -> None:
        """utils/optim.py:84-102: the group's keys that the setting names take its values
        (``optimizer = "SGD"`` keeps the SGD)."""
        if setting.get("optimizer", "SGD") != "SGD":
            raise NotImplementedError("only SGD is transcribed")
        for key in self.group:
            if key in setting and setting[key] != self.group[key]:
                self.group[key] = setting[key]

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        """torch.optim.SGD.step on every parameter that has a gradient, in place."""
        g = self.group
        lr, momentum = np.float32(g["lr"]), g["momentum"]
        wd, dampening = g["weight_decay"], g["dampening"]
        for name, p in params.items():
            d_p = grads.get(name)
            if d_p is None:
                continue
            if wd != 0:
                d_p = d_p + np.float32(wd) * p
            if momentum != 0:
                st = self.state.setdefault(name, {})
                if "momentum_buffer" not in st:
                    buf = st["momentum_buffer"] = d_p.copy()  # clone: undampened first step
                else:
                    buf = (np.float32(momentum) * st["momentum_buffer"]
                           + np.float32(1 - dampening) * d_p)
                    st["momentum_buffer"] = buf
                d_p = d_p + np.float32(momentum) * buf if g["nesterov"] else buf
            params[name] = (p - lr * d_p).astype(np.float32)


# ----------------------------------------------------------------------------- servers
def regularization_pre_step(params: dict[str, np.ndarray], grads: dict[str, np.ndarray],
                            weight_decay: float) -> None:
    """models/resnet.py:165-170: ``m.weight.grad.add_(self.weight_decay * m.weight)`` for
    conv and linear weights (the rank >= 2 leaves), with the server's current weights."""
    for name, w in params.items():
        if w.ndim >= 2 and name in grads:
            grads[name] = grads[name] + np.float32(weight_decay) * w


class Server:
    """``HSGD`` (parameter_server.py:242-286), ``MSGD`` (:289-345) and ``SSGD`` (:348-392)
    for W = delay + 1 workers, i.e. HSGD's group size ``_tau = 2 ** (log2 W - log2(delay +
    1)) = 1`` (:249): every push steps the optimizer."""

    def __init__(self, kind: str, params0: Params, regime: list[dict], *, delay: int,
                 weight_decay: float):
        if kind not in ("asgd", "msgd", "ssgd"):
            raise ValueError(f"unknown server {kind!r}")
        self.kind = kind
        self.workers = delay + 1
        if kind == "ssgd":
            assert delay == 0  # :351
        self.params = _flatten(params0)  # the server model's weights
        self.optimizer = OptimRegime(regime)
        self.weight_decay = weight_decay
        # :42-55: every worker's copy starts as the initial weights (deepcopy each).
        self._shards_weights = [_flatten(params0) for _ in range(self.workers)]
        # :293, MSGD: one momentum buffer (per parameter) per worker, None until it pushes.
        self._shards_momentum: list[dict[str, np.ndarray] | None] = [None] * self.workers
        self._has_grad = False  # p.grad is None until the first push set it

    def pull(self, worker_id: int) -> Params:
        """HSGD/MSGD :285-286: the worker's copy, the server weights as they stood after its
        own last push; SSGD :391-392: the current weights."""
        src = self.params if self.kind == "ssgd" else self._shards_weights[worker_id]
        return _unflatten({k: v.copy() for k, v in src.items()})

    def push(self, worker_id: int, gradients: Params, epoch: int, training_steps: int) -> None:
        """HSGD.push :260-283, MSGD.push :320-345, SSGD.push :368-389 (no gradient clipping,
        ``grad_clip = -1``; no tensorboard; ``regularizer_post_step`` is a no-op, the ResNet
        has none: :57-63)."""
        self.optimizer.update(epoch, training_steps)  # :261 / :321 / :369
        # _accumulate_gradients :252-258 (/ _tau = 1) and :360-366 (/ workers_number = 1)
        buffer = {k: v / np.float32(1) for k, v in _flatten(gradients).items()}
        # (worker_id + 1) % _tau == 0 (:264, :324) and worker_id + 1 == workers_number
        # (:372) hold for every push with W = delay + 1 workers and _tau = 1.
        if self.kind == "msgd":
            self._load_worker_momentum(worker_id)  # :325
        # zero_grad + _set_model_gradients (:265-266 / :326-327 / :373-374): the server's
        # gradients are the buffer.
        grads = dict(buffer)
        self._has_grad = True
        regularization_pre_step(self.params, grads, self.weight_decay)  # :267 / :328 / :375
        self.optimizer.step(self.params, grads)  # :277 / :338 / :385
        if self.kind == "ssgd":
            return
        # :280-281 / :341-343: the worker's copy is the new server weights (clone=True) and,
        # for MSGD, its momentum buffer is the optimizer's.
        self._shards_weights[worker_id] = {k: v.copy() for k, v in self.params.items()}
        if self.kind == "msgd":
            self._save_worker_momentum(worker_id)

    def _load_worker_momentum(self, worker_id: int) -> None:
        """parameter_server.py:300-309: the worker's buffers into the optimizer, or none (the
        SGD step then starts a fresh one as a copy of the step); skipped while ``p.grad`` is
        None (the very first push, where the optimizer has no buffer anyway)."""
        if not self._has_grad:
            return
        saved = self._shards_momentum[worker_id]
        for name in self.params:
            st = self.optimizer.state.setdefault(name, {})
            if saved is not None:
                st["momentum_buffer"] = saved[name]
            else:
                st.pop("momentum_buffer")  # a KeyError there too, if the buffer were absent

    def _save_worker_momentum(self, worker_id: int) -> None:
        """parameter_server.py:311-318 (``.to`` on the same device and dtype is the same
        tensor, which only this worker's next push loads again, so a reference is exact)."""
        self._shards_momentum[worker_id] = {
            name: self.optimizer.state[name]["momentum_buffer"] for name in self.params}


# ----------------------------------------------------------------------------- schedule
class Schedule:
    """trainer.py:67-81, ``Trainer._schedule_worker``. Draws come from a numpy Generator (the
    official code draws ``random.sample`` and ``np.random.choice`` from the global RNGs)."""

    def __init__(self, kind: str, workers: int, rng: np.random.Generator | None = None):
        if kind not in ("round_robin", "random", "normal"):
            raise TypeError(f"Invalid scheduling used: {kind}")  # :76-77
        self.kind, self.workers = kind, workers
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self.workers_staleness = [0] * workers  # trainer.py:32

    def __call__(self, i: int) -> tuple[int, int]:
        """The worker of step ``i`` and its staleness (the ``delay_hist`` key, :78)."""
        w = self.workers
        if self.kind == "round_robin":  # :68-69
            worker = i % w
        elif self.kind == "random":  # :70-71, uniform
            worker = int(self.rng.integers(w))
        else:  # :72-75
            probs = norm.cdf(self.workers_staleness, loc=w, scale=w / 4)
            probs = probs / probs.sum()
            worker = int(self.rng.choice(w, p=probs))
        staleness = self.workers_staleness[worker]  # :78
        self.workers_staleness = [x + 1 for x in self.workers_staleness]  # :79
        self.workers_staleness[worker] = 0  # :80
        return worker, staleness


def schedule_staleness(kind: str, workers: int, steps: int, seed: int) -> np.ndarray:
    """The staleness of each of ``steps`` scheduled steps (the schedule alone: no
    gradients)."""
    sched = Schedule(kind, workers, np.random.default_rng(seed))
    return np.fromiter((sched(i)[1] for i in range(steps)), np.int64, steps)


# ----------------------------------------------------------------------------- the loop
def run_official(params0: Params, grad: GradFn, *, delay: int, server: str,
                 regime: list[dict], weight_decay: float, steps: int, steps_per_epoch: int,
                 schedule: str = "round_robin", seed: int = 0
                 ) -> tuple[Params, list[tuple[int, int]]]:
    """``steps`` training steps of P2's official loop with W = delay + 1 workers.

    Args:
        params0: the initial weights (asyncsim's pytree; not modified).
        grad: the gradient oracle ``grad(params, worker, batch_index) -> grads``,
            ``batch_index`` the number of gradients that worker computed before.
        delay: ``--delay``; server: ``--server`` (``asgd`` -> HSGD, ``msgd`` -> MSGD;
            delay 0 runs SSGD whatever it says, main.py:234).
        regime: the optimizer regime (:func:`cifar_regime`); weight_decay: the model's
            ``weight_decay`` (``regime_wd``, applied by ``regularization_pre_step``).
        steps_per_epoch: ``len(train_loader)`` (``n_train // batch_size``, drop_last).
        schedule: ``round_robin`` | ``random`` | ``normal``; seed: its Generator's seed.

    Returns:
        The server's final weights and ``(worker, staleness)`` per step.
    """
    kind = server if delay > 0 else "ssgd"  # main.py:234
    ps = Server(kind, params0, regime, delay=delay, weight_decay=weight_decay)
    sched = Schedule(schedule, delay + 1, np.random.default_rng(seed))
    computed = [0] * (delay + 1)
    record: list[tuple[int, int]] = []
    for training_steps in range(steps):  # main.py:271, trainer.py:102
        epoch, i = divmod(training_steps, steps_per_epoch)  # main.py:278-279, trainer.py:120
        worker, stale = sched(epoch * steps_per_epoch + i)  # trainer.py:122
        record.append((worker, stale))
        params_w = ps.pull(worker)  # trainer.py:85, _set_parameters(training=True)
        g = grad(params_w, worker, computed[worker])  # trainer.py:86-97
        computed[worker] += 1
        ps.push(worker, g, epoch, training_steps)  # trainer.py:101
    return _unflatten(ps.params), record
