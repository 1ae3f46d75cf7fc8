"""A node of your own in the train step (docs/trainer.md, "The step as a graph"): a reward term
that takes `args.per_token` off a sample's reward for each token it generated.

    python training/main_async_ppo.py \
      "ppo.graph.add=[{name:brevity,op:'examples/step_nodes/brevity.py:brevity',inputs:[loss_mask],outputs:['rewards/brevity'],args:{per_token:0.01}}]"

It runs on every trainer rank, on the step's batch (realhf.api.train_batch.TrainBatch); the
numbers it returns are logged as `brevity/<key>`.
"""

import torch


def brevity(ctx, batch, node):
    per_token = float(node.args.get("per_token", 0.01))
    bonus = -per_token * batch.loss_mask.sum(dim=1).to(torch.float32)  # [N]: one per sample
    batch.set(node.outputs[0], bonus)
    return {"mean": float(bonus.mean())}
