"""A user's own policy loss and advantage estimator, in a module of their own (not the package):
what `ppo.policy_loss=helpers.user_algorithms:sigmoid_ratio` and
`ppo.adv_estimator=helpers.user_algorithms:rloo` choose (docs: "Algorithms and their keys")."""

import torch

from realhf.api.algorithms import policy_loss_spec, register_adv_estimator, register_policy_loss


def sigmoid_ratio(log_ratio, advantages, eps_clip, eps_clip_high):
    """−A·2σ(ρ): at ρ = 0 it is −A with gradient −A/2 per unit ρ, and it saturates where PPO's
    ratio would be clipped. No clip, so no token is ever reported clipped."""
    return -advantages * 2 * torch.sigmoid(log_ratio), torch.zeros_like(log_ratio, dtype=torch.bool)


# The same surrogate, declared unclipped (ppo.c_clip is then refused) and registered by name:
# `ppo.policy_loss=sigmoid` in any process that imported this module.
SIGMOID = policy_loss_spec(sigmoid_ratio, clipped=False)
register_policy_loss("sigmoid", clipped=False)(sigmoid_ratio)


@register_adv_estimator("rloo")
def rloo(scores, group_ids):
    """REINFORCE leave-one-out: each sample's score minus the mean of the others of its group."""
    adv = torch.zeros_like(scores, dtype=torch.float32)
    for g in torch.unique(group_ids):
        idx = group_ids == g
        k = int(idx.sum())
        s = scores[idx].float()
        adv[idx] = s - (s.sum() - s) / max(k - 1, 1) if k > 1 else torch.zeros_like(s)
    return adv
