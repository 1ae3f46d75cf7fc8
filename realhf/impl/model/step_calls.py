"""The model calls of one train step: the one place they are listed.

The master runs them in this order on every DP rank (`MasterWorker._train_calls`), the model
worker builds the engines they name (`ppo_actor.roles_of`), and the start-up log prints them.
Which calls a step makes follows from three settings:

    actor_inf     proximal log-probs (ppo.use_decoupled_loss with ppo.prox_logp=recompute, or
                  ppo.recompute_logprob without the decoupled loss)
    ref_inf       reference log-probs (ppo.kl_ctl > 0)
    critic_inf    values for GAE        } an estimator that needs a critic (ppo.adv_estimator=gae)
    critic_train  the value loss         }
    actor_train   advantages, the policy loss, version + 1, weights published
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from realhf.api.algorithms import adv_estimator
from realhf.api.cli_args import PPOHyperparameters


@dataclass(frozen=True)
class ModelCall:
    name: str  # as logged: actor_inf, ref_inf, critic_inf, critic_train, actor_train
    handler: str  # the model worker's request handler that runs it
    model: str  # the engine it runs on


def step_calls(ppo: PPOHyperparameters) -> List[ModelCall]:
    calls = []
    if (ppo.prox_logp == "recompute") if ppo.use_decoupled_loss else ppo.recompute_logprob:
        calls.append(ModelCall("actor_inf", "inference", "actor"))
    if ppo.kl_ctl > 0:
        calls.append(ModelCall("ref_inf", "inference", "ref"))
    if adv_estimator(ppo.adv_estimator).needs_critic:
        calls += [ModelCall("critic_inf", "inference", "critic"), ModelCall("critic_train", "critic_train", "critic")]
    return calls + [ModelCall("actor_train", "train_step", "actor")]


def step_models(ppo: PPOHyperparameters) -> List[str]:
    """The engines a trainer with these settings holds, the actor first."""
    return list(dict.fromkeys(["actor"] + [c.model for c in step_calls(ppo)]))
