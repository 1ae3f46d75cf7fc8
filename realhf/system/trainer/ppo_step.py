"""One train step, declared: the nodes of the PPO/GRPO step, what each reads and writes.

    default_graph(ppo)   the step the settings ask for, top to bottom:
        actor_inf     proximal log-probs of the current weights   (decoupled loss with
                      prox_logp=recompute, or recompute_logprob without it)
        ref_inf       reference log-probs                          (kl_ctl > 0, or an implicit
                                                                     reward model, which reads them)
        critic_inf    the critic's values                          (an estimator that needs a
                                                                     critic: adv_estimator=gae)
        reward_inf    a learned reward, rewards/rm                 (ppo.graph.reward_model, the
                                                                     model at reward.path: a value
                                                                     head, or implicit: its log-ratio
                                                                     to the reference)
        advantages    advantages and returns from the rewards (+ every `rewards/<source>` term)
        critic_train  the clipped value loss                       (with critic_inf)
        actor_train   the policy loss; the version advances and the weights are published
    build_graph(ppo)     the default with `ppo.graph.drop` left out and `ppo.graph.add` added,
                         checked (realhf.api.step_graph.StepGraph.check)

The master runs the graph's waves (realhf.system.master.master_worker), every trainer rank runs
each node's op (realhf.system.trainer.step_ops), and the tensors between nodes are the fields
of the step's TrainBatch, by name. The three inference nodes need nothing of each other: where
they run on different processes they run at the same time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from realhf.api.algorithms import adv_estimator
from realhf.api.cli_args import PPOHyperparameters
from realhf.api.step_graph import GraphError, StepGraph, StepNode, node_from_dict
from realhf.base.importing import IMPORT_PATH_FORMS, is_file_path

# The tensors a forward of the batch reads.
TOKENS = ("input_ids", "attention_mask", "loss_mask", "prompt_lens")
MODELS = ("actor", "ref", "critic", "reward")


@dataclass(frozen=True)
class OpSpec:
    models: Tuple[str, ...]  # the engines it can run on; ("",): none
    writes: Optional[Tuple[str, ...]]  # the tensors it writes; None: the one its node names


# The built-in ops (realhf.system.trainer.step_ops implements them).
BUILTIN_OPS: Dict[str, OpSpec] = {
    "proximal_logprobs": OpSpec(("actor",), ("prox_logprobs", "prox_computed")),
    "logprobs": OpSpec(("ref", "actor"), None),
    "values": OpSpec(("critic",), ("values",)),
    "advantages": OpSpec(("",), ("advantages", "returns")),
    "reward_model": OpSpec(("reward",), None),
    "implicit_reward": OpSpec(("reward",), None),
    "train_critic": OpSpec(("critic",), ()),
    "train_actor": OpSpec(("actor",), ()),
}


def needs_proximal(ppo: PPOHyperparameters) -> bool:
    return (ppo.prox_logp == "recompute") if ppo.use_decoupled_loss else ppo.recompute_logprob


def default_graph(ppo: PPOHyperparameters) -> StepGraph:
    """The PPO/GRPO step of these settings (with a critic for adv_estimator=gae)."""
    est = adv_estimator(ppo.adv_estimator)
    implicit = ppo.graph.reward_model and ppo.graph.reward_model_kind == "implicit"
    prox, kl, critic = needs_proximal(ppo), ppo.kl_ctl > 0, est.needs_critic
    ref = kl or implicit
    nodes: List[StepNode] = []
    if prox:
        nodes.append(StepNode("actor_inf", "proximal_logprobs", "actor", TOKENS, ("prox_logprobs", "prox_computed")))
    if ref:
        nodes.append(StepNode("ref_inf", "logprobs", "ref", TOKENS, ("ref_logprobs",)))
    if critic:
        nodes.append(StepNode("critic_inf", "values", "critic", TOKENS, ("values",)))
    if implicit:
        nodes.append(StepNode("reward_inf", "implicit_reward", "reward", TOKENS + ("ref_logprobs",), ("rewards/rm",)))
    elif ppo.graph.reward_model:
        nodes.append(StepNode("reward_inf", "reward_model", "reward", ("input_ids", "attention_mask"), ("rewards/rm",)))
    # GAE and REINFORCE subtract the KL (proximal or behaviour log-probs vs the reference) from the reward.
    kl_reward = kl and est.kl_in_reward
    adv_in = ["rewards", "group_ids", "loss_mask", "behav_logprobs"] + ["rewards/rm"] * ppo.graph.reward_model
    adv_in += ["values"] * critic + ["ref_logprobs"] * kl_reward + ["prox_logprobs"] * (kl_reward and prox)
    nodes.append(StepNode("advantages", "advantages", "", tuple(adv_in), ("advantages", "returns")))
    if critic:
        nodes.append(StepNode("critic_train", "train_critic", "critic", TOKENS + ("values", "returns"), ()))
    train_in = TOKENS + ("behav_logprobs", "advantages") + ("prox_logprobs", "prox_computed") * prox
    train_in += ("ref_logprobs",) * kl + ("behav_versions",) * (ppo.use_decoupled_loss and ppo.prox_logp == "loglinear")
    nodes.append(StepNode("actor_train", "train_actor", "actor", train_in, ()))
    return StepGraph(tuple(nodes))


def waves(graph: StepGraph) -> List[List[StepNode]]:
    """The order the step runs in: the graph's waves, the actor's update last in its wave (the
    nodes beside it read the weights the step started from)."""
    return [sorted(wave, key=lambda n: n.op == "train_actor") for wave in graph.order()]


def _op_problem(op: str) -> Optional[str]:
    if op in BUILTIN_OPS:
        return None
    if ":" in op:
        from realhf.base.importing import import_object

        try:
            fn = import_object(op, "op")
        except ValueError as e:
            return str(e)
        return None if callable(fn) else f"op {op!r} is not callable"
    kind = "file" if is_file_path(op) else "name"
    return f"unknown op {op!r} ({kind}); built-in: {sorted(BUILTIN_OPS)}, or your own as {IMPORT_PATH_FORMS}"


def _check_builtins(graph: StepGraph, where: str) -> None:
    for n in graph.nodes:
        spec = BUILTIN_OPS.get(n.op)
        if spec is None:
            continue
        if n.model not in spec.models:
            want = " or ".join(repr(m) for m in spec.models) if spec.models != ("",) else "none ('')"
            raise GraphError(f"{where}: node {n.name!r}: op {n.op} runs on model {want}, not {n.model!r}")
        if spec.writes is None and len(n.outputs) != 1:
            raise GraphError(f"{where}: node {n.name!r}: op {n.op} writes one tensor; outputs {list(n.outputs)}")
        if spec.writes is not None and tuple(n.outputs) != spec.writes:
            raise GraphError(f"{where}: node {n.name!r}: op {n.op} writes {list(spec.writes)}, not {list(n.outputs)}")
    trains = [n.name for n in graph.nodes if n.op == "train_actor"]
    if len(trains) != 1:
        raise GraphError(f"{where}: a step trains the actor once (one node with op train_actor); found {trains}")
    # The actor's update ends the step: whatever else runs must see the weights it started from.
    waves = {n.name: i for i, wave in enumerate(graph.order()) for n in wave}
    late = [n.name for n in graph.nodes if waves[n.name] > waves[trains[0]]]
    if late:
        raise GraphError(f"{where}: {late} would run after {trains[0]!r} (the actor's update ends the step)")


def build_graph(ppo: PPOHyperparameters, check_ops: Callable[[str], Optional[str]] = _op_problem) -> StepGraph:
    """The step the config asks for: the default, less `ppo.graph.drop`, plus `ppo.graph.add`;
    refused (GraphError) where it cannot run."""
    base = default_graph(ppo)
    unknown = [d for d in ppo.graph.drop if d not in base.names()]
    if unknown:
        raise GraphError(f"ppo.graph.drop: {unknown} not in the default step {base.names()}")
    nodes = [n for n in base.nodes if n.name not in ppo.graph.drop]
    for i, spec in enumerate(ppo.graph.add):
        d = spec if isinstance(spec, dict) else dict(vars(spec))
        nodes.append(node_from_dict(d, f"ppo.graph.add[{i}]"))
    # Every reward term of the graph joins the rewards the advantages read, by its weight.
    terms = StepGraph(tuple(nodes)).reward_terms()
    weights = dict(ppo.graph.reward_weights)
    unknown = sorted(set(weights) - {"rewards", *terms})
    if unknown:
        raise GraphError(
            f"ppo.graph.reward_weights: {unknown} are no reward source of the step; the sources are "
            f"{['rewards', *terms]} ('rewards' is the rollout's, 'rewards/<source>' a node's output)"
        )
    nodes = [
        StepNode(
            n.name, n.op, n.model, n.inputs + tuple(t for t in terms if t not in n.inputs), n.outputs,
            {**n.args, "weights": weights} if weights else n.args,
        )
        if n.op == "advantages"
        else n
        for n in nodes
    ]  # fmt: skip
    graph = StepGraph(tuple(nodes)).check(check_ops, MODELS)
    _check_builtins(graph, "ppo.graph")
    _check_placement(graph, ppo.graph.own_process)
    return graph


# What can run off the trainer: the weights of a trained model live on the trainer's ranks, and
# the advantages read the actor's KL coefficient there.
PLACEABLE_MODELS = ("ref", "reward", "")
TRAINER_ONLY_OPS = ("proximal_logprobs", "values", "advantages", "train_critic", "train_actor")


def _check_placement(graph: StepGraph, own_process) -> None:
    for i, name in enumerate(own_process):
        if name not in graph.names():
            raise GraphError(f"ppo.graph.own_process[{i}]={name!r}: no such node in the step {graph.names()}")
        node = graph.node(name)
        if node.op in TRAINER_ONLY_OPS or node.model not in PLACEABLE_MODELS:
            raise GraphError(
                f"ppo.graph.own_process[{i}]={name!r} ({node.op} on {node.model or 'no model'}) must run on the "
                "trainer's ranks: only nodes on the frozen reference or on no model run on a process of their own"
            )


def trainer_models(graph: StepGraph, own_process) -> List[str]:
    """The engines the trainer's ranks hold: those of the nodes that run there, the actor first."""
    return ["actor"] + [
        m
        for m in graph.models()
        if m != "actor" and any(n.model == m and n.name not in own_process for n in graph.nodes)
    ]
