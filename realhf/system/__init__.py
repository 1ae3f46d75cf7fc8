"""The seven workers (the evaluator and the node worker only when asked for), the streams between them, and the lifecycle they share."""

from realhf.base.importing import resolve

# Imported lazily: a rollout worker must not pay for torch, a trainer not for FastAPI.
WORKER_CLASSES = {
    "master_worker": "realhf.system.master.master_worker:MasterWorker",
    "model_worker": "realhf.system.trainer.model_worker:ModelWorker",
    "rollout_worker": "realhf.system.rollout.rollout_worker:RolloutWorker",
    "generation_server": "realhf.system.gen_server.generation_server:GenerationServer",
    "gserver_manager": "realhf.system.manager.gserver_manager:GserverManager",
    "evaluator": "realhf.system.evaluator.evaluator_worker:Evaluator",  # only with exp_ctrl.eval_freq_steps > 0
    "node_worker": "realhf.system.node.node_worker:NodeWorker",  # only with ppo.graph.own_process
}


def worker_class(worker_type: str):
    """The class of a built-in worker type, or of a `module:Class` path (tests, extensions)."""
    return resolve(worker_type, {}, "worker type", WORKER_CLASSES)
