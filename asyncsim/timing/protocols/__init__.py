"""Parameter-server protocols: when an update happens and which gradients it takes.

A protocol sees only timing (which learner pushed what, when) — never gradient values — so
it runs unchanged in trace-only, online and real (Ray) runs. Built-ins (P1, P2, Ho et al.):

``hardsync``
    The PS waits for one gradient from every learner, averages them and updates; learners
    wait for the new version before pulling (a barrier). τ ≡ 0; SGD with batch μλ.
``softsync`` (``n``)
    P1's n-softsync: the PS updates after any c = ⌊λ/n⌋ gradients arrive (a fast learner may
    contribute twice); no barrier. n = 1 is close to synchronous, n = λ is async.
``async``
    One update per gradient (= λ-softsync), Downpour-style.
``fixed-delay`` (``tau``, ``schedule``)
    P2's simulation of delay with N = τ+1 workers on one device: each step one worker applies
    the gradient it computed on the copy it last pulled, then pulls the new version.
    ``round-robin`` gives staleness exactly τ after the first τ updates; ``random`` picks a
    uniformly random worker each step (geometric staleness); ``normal`` is P2's official
    draw, worker k with probability ∝ Φ((s_k − loc)/scale) (``loc``, ``scale``: N and N/4);
    ``race`` (not P2's) lets the workers race with normal step times (mean 1, coefficient of
    variation ``cv``), which concentrates the delays near N − 1.
``ssp`` (``s``)
    Stale synchronous parallel (Ho et al., NIPS 2013): each gradient is applied on arrival,
    but a learner whose clock (its number of pushed gradients) leads the slowest learner's by
    more than ``s`` waits before pulling. The bound is on clocks, as SSP defines it; the PS
    staleness of a gradient is not bounded by s (it still grows with λ).

Learners that come and go (``cluster.availability``, and a real run's lost learners) reach
a protocol through :meth:`Protocol.on_lost` / :meth:`Protocol.on_back`: ``hardsync`` rounds
complete with the learners that are up (a learner that went down after delivering its
gradient counts in that round, not the next ones, until it is back; back, it rejoins at the
next round, or at once when no learner is left in this one); ``ssp`` bounds clocks
over the live learners, and one that is back rejoins the bound with its own clock (its
gradients count, so the others wait for it to catch up to within s, as for any slow
learner); ``softsync`` keeps c: with fewer than c learners up, the live ones fill each update
(one may contribute several gradients), and with none up no update happens; ``async`` and
``fixed-delay`` (``race``) just see fewer arrivals.

The package holds one module per concept: :mod:`.base` (the contract, the registry,
:func:`make_protocol`), :mod:`.softsync` (``async``, ``softsync``), :mod:`.hardsync`,
:mod:`.ssp`, :mod:`.fixed_delay` and :mod:`.recorded` (what a run folder's ``[protocol]``
table means across versions).

Plug-ins: subclass :class:`Protocol`, decorate with :func:`register_protocol` or expose it
through the entry-point group ``asyncsim.protocols``. A protocol's options are the keyword
parameters of its ``__init__(self, learners, *, ...)``, the built-ins' as a plug-in's:
``protocol = { kind = "softsync", n = 4 }`` builds ``Softsync(learners, n=4)``, checked by
the one option checker of every plug-in kind (:func:`make_protocol`).
"""

from asyncsim.timing.protocols.base import (
    Protocol,
    available_protocols,
    get_protocol_class,
    make_protocol,
    protocol_options,
    register_protocol,
)
from asyncsim.timing.protocols.fixed_delay import FixedDelay
from asyncsim.timing.protocols.hardsync import Hardsync
from asyncsim.timing.protocols.recorded import drop_defaults, timing_revision
from asyncsim.timing.protocols.softsync import Async, Softsync
from asyncsim.timing.protocols.ssp import SSP

__all__ = ["SSP", "Async", "FixedDelay", "Hardsync", "Protocol", "Softsync",
           "available_protocols", "drop_defaults", "get_protocol_class", "make_protocol",
           "protocol_options", "register_protocol", "timing_revision"]
