"""Plug-in points of the algorithm: the policy loss (`ppo.policy_loss`) and the advantage estimator
(`ppo.adv_estimator`), each chosen in config by a built-in name, a name registered with the
decorator below, or `module.path:function` / `path/to/file.py:function` of the user's own code
(imported in every process that needs it, like an agent's type; realhf.base.importing):

    # my_pkg/losses.py                                 # ppo.policy_loss=my_pkg.losses:sigmoid_ratio
    def sigmoid_ratio(log_ratio, advantages, eps_clip, eps_clip_high):
        return -advantages * 2 * torch.sigmoid(log_ratio), torch.zeros_like(log_ratio, dtype=torch.bool)

    # my_pkg/advantages.py                             # ppo.adv_estimator=my_pkg.advantages:rloo
    def rloo(scores, group_ids):                       # one advantage per sample
        ...

A policy loss is a *surrogate*: (per-token log-ratio to the proximal policy, advantages,
eps_clip, eps_clip_high) → (per-token loss, where a clip was the active term). The trainer wraps
it the same way for every choice (realhf.impl.model.utils.ppo_functional.actor_loss_fn): the
decoupled behaviour weight, its cap, the dual clip, the masking and the token reduction. Wrap a
function with `policy_loss_spec(fn, sequence_level=True)` for a GSPO-like loss (the log-ratio is
the sequence's mean on every token) or `clipped=False` when it has no clip the dual clip could
bound. An advantage estimator maps (scores [N], group ids [N]) to one advantage per sample, the
same on each of its tokens; the KL to a reference then goes into the loss. GAE-style per-token
estimators (a critic's values) are built in only.

This module imports nothing of the trainer: a built-in's flags are declared here and its function
is imported from where it is defined at its first call, so the master (which only needs the flags)
never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from realhf.base.importing import import_object

Surrogate = Callable[..., Any]  # (log_ratio, advantages, eps_clip, eps_clip_high) -> (loss, clip_active)
PerSampleAdvantages = Callable[..., Any]  # (scores [N], group_ids [N]) -> advantages [N]


@dataclass(frozen=True)
class PolicyLoss:
    surrogate: Surrogate
    sequence_level: bool = False  # the log-ratio is the sequence's mean on each token (GSPO)
    clipped: bool = True  # has a clip the dual clip (ppo.c_clip) may bound


@dataclass(frozen=True)
class AdvantageEstimator:
    # scores [N], group ids [N] → one advantage per sample, the same on each of its tokens;
    # None: per-token rewards through GAE (built-in: realhf.system.trainer.actor).
    per_sample: Optional[PerSampleAdvantages]
    kl_in_reward: bool = False  # the KL to the reference is subtracted from the reward, not added to the loss
    needs_critic: bool = False


def policy_loss_spec(fn: Surrogate, *, sequence_level: bool = False, clipped: bool = True) -> PolicyLoss:
    return PolicyLoss(fn, sequence_level, clipped)


class _Builtin:
    """A built-in's function by import path, imported at its first call. The specs and their flags
    (needs_critic, sequence_level, ...) are then known where the math never runs (the launcher's
    validation, the master's list of model calls) without importing the trainer and torch."""

    __slots__ = ("path", "_fn")

    def __init__(self, path: str):
        self.path, self._fn = path, None

    def __call__(self, *args, **kwargs):
        if self._fn is None:
            self._fn = import_object(self.path, "built-in")
        return self._fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<built-in {self.path}>"


def _function(spec: Any) -> Any:
    """The function a spec wraps (a registered bare function is its own)."""
    return getattr(spec, "surrogate", None) or getattr(spec, "per_sample", None) or spec


class _Menu:
    """Choices of one config field: registered objects, built-in specs, or `module:name`."""

    def __init__(self, field: str, kind: type, wrap: Callable[[Any], Any], builtins: Dict[str, Any]):
        self.field, self.kind, self._wrap = field, kind, wrap
        self._builtins = dict(builtins)
        self._registered: Dict[str, Any] = {}

    def register(self, name: str, obj: Any) -> None:
        if name in self._builtins or (name in self._registered and self._registered[name] != obj):
            raise ValueError(f"{self.field} name {name!r} is already taken")
        self._registered[name] = obj

    def names(self) -> list:
        return list(self._builtins) + list(self._registered)

    def registered(self) -> Dict[str, str]:
        """Every name `get` accepts, with where its object lives (a registered one: its module)."""
        found = {}
        for name, spec in self._builtins.items():  # a per-token one (gae) has no function to name
            fn = _function(spec)
            found[name] = fn.path if isinstance(fn, _Builtin) else f"{__name__}:{name}"
        for name, obj in self._registered.items():
            fn = _function(obj)
            found[name] = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', name)}"
        return found

    def get(self, name: str) -> Any:
        """The object `name` chooses; a ValueError naming the field and the choices otherwise."""
        if name in self._registered:
            return self._registered[name]
        if name in self._builtins:
            return self._builtins[name]
        path = name if ":" in name else None
        if path is None:
            raise ValueError(
                f"{self.field}={name!r}: choose one of {self.names()} or 'module.path:function' / "
                "'path/to/file.py:function'"
            )
        obj = import_object(path, self.field)
        obj = obj if isinstance(obj, self.kind) else self._wrap(obj)
        if not isinstance(obj, self.kind):
            raise ValueError(f"{self.field}={name!r} names {obj!r}, not a {self.kind.__name__} or a function")
        return obj


def _as_policy_loss(obj: Any) -> Any:
    return PolicyLoss(obj) if callable(obj) else obj


def _as_estimator(obj: Any) -> Any:
    return AdvantageEstimator(obj) if callable(obj) else obj


# The built-ins: each spec's flags here, its math where it is defined (imported at the first call).
_F = "realhf.impl.model.utils.ppo_functional"
_A = "realhf.impl.model.algorithms"
_clipped_ratio = _Builtin(f"{_F}:clipped_ratio")
POLICY_LOSSES = _Menu(
    "ppo.policy_loss",
    PolicyLoss,
    _as_policy_loss,
    {
        "ppo": PolicyLoss(_clipped_ratio),
        "gspo": PolicyLoss(_clipped_ratio, sequence_level=True),
        "cpgd": PolicyLoss(_Builtin(f"{_F}:clipped_log_ratio")),
        "gpg": PolicyLoss(_Builtin(f"{_F}:no_clip"), clipped=False),
    },
)
ADV_ESTIMATORS = _Menu(
    "ppo.adv_estimator",
    AdvantageEstimator,
    _as_estimator,
    {
        "grpo": AdvantageEstimator(_Builtin(f"{_A}:grpo_advantages")),
        "dr_grpo": AdvantageEstimator(_Builtin(f"{_A}:dr_grpo_advantages")),
        "batch_norm": AdvantageEstimator(_Builtin(f"{_A}:batch_norm_advantages")),
        # Per-token, over the critic's values (realhf.system.trainer.actor); reinforce: zero values.
        "gae": AdvantageEstimator(None, kl_in_reward=True, needs_critic=True),
        "reinforce": AdvantageEstimator(None, kl_in_reward=True),
    },
)


def register_policy_loss(name: str, *, sequence_level: bool = False, clipped: bool = True):
    """`@register_policy_loss("mine")` on a surrogate: `ppo.policy_loss=mine` chooses it in every
    process that imported the module (an import path needs no registration)."""

    def deco(fn: Surrogate) -> Surrogate:
        POLICY_LOSSES.register(name, PolicyLoss(fn, sequence_level, clipped))
        return fn

    return deco


def register_adv_estimator(name: str, *, kl_in_reward: bool = False):
    """`@register_adv_estimator("mine")` on a per-sample estimator (scores, group_ids) → advantages."""

    def deco(fn: PerSampleAdvantages) -> PerSampleAdvantages:
        ADV_ESTIMATORS.register(name, AdvantageEstimator(fn, kl_in_reward, False))
        return fn

    return deco


def policy_loss(name: str) -> PolicyLoss:
    return POLICY_LOSSES.get(name)


def adv_estimator(name: str) -> AdvantageEstimator:
    return ADV_ESTIMATORS.get(name)
