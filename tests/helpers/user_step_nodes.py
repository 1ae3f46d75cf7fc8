"""A user's node that says it writes a tensor and does not (realhf.system.trainer.step_ops refuses it)."""


def writes_nothing(ctx, batch, node):
    return {}
