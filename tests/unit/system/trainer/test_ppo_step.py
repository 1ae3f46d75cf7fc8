"""realhf/system/trainer/ppo_step.py and step_ops.py on the real tiny model at DP=1: the default
step's graph for each setting, one step run node by node equal to the calls it replaced (same
seed, same batch: log-probs, loss and weights within 1e-6), a user's own node joining the
rewards, and every graph that cannot run refused before any engine is built."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from helpers.trajectories import flat_params, pack, trainer_config
from realhf.api.cli_args import (
    PPOHyperparameters,
    StepGraphConfig,
    StepNodeConfig,
)
from realhf.api.step_graph import GraphError
from realhf.api.train_batch import REQUIRED_FIELDS, batch_from_tensors
from realhf.base import serialization
from realhf.system.trainer.ppo_actor import PPOActor, PPOCritic, build_engines, reference_logprobs
from realhf.system.trainer.ppo_step import BUILTIN_OPS, build_graph, default_graph, trainer_models, waves
from realhf.system.trainer.step_ops import OPS, StepContext, run_node

BREVITY = "examples/step_nodes/brevity.py:brevity"  # a file path, from the launch directory (the repository)


def _waves(ppo) -> list:
    return [[n.name for n in wave] for wave in waves(build_graph(ppo))]


# ---- the declared steps ------------------------------------------------------------------------------


def test_the_default_step_of_each_setting():
    # GRPO's advantages read only the rollout's rewards: they need not wait for the forwards.
    assert _waves(PPOHyperparameters()) == [["actor_inf", "advantages"], ["actor_train"]]
    assert _waves(PPOHyperparameters(kl_ctl=0.1)) == [["actor_inf", "ref_inf", "advantages"], ["actor_train"]]
    # GAE with a KL reward: the advantages read the reference's and the proximal log-probs.
    gae = build_graph(PPOHyperparameters(adv_estimator="gae", kl_ctl=0.1))
    assert [[n.name for n in w] for w in waves(gae)] == [
        ["actor_inf", "ref_inf", "critic_inf"],
        ["advantages"],
        ["critic_train", "actor_train"],
    ]
    assert {"values", "ref_logprobs", "prox_logprobs"} <= set(gae.node("advantages").inputs)
    assert gae.models() == ["actor", "ref", "critic"]
    assert _waves(PPOHyperparameters(prox_logp="loglinear")) == [["advantages"], ["actor_train"]]
    assert _waves(PPOHyperparameters(adv_estimator="reinforce")) == [["actor_inf", "advantages"], ["actor_train"]]
    # A learned reward: its scores are a reward term the advantages wait for.
    rm = build_graph(PPOHyperparameters(graph=StepGraphConfig(reward_model=True, reward_weights={"rewards": 0})))
    assert [[n.name for n in w] for w in waves(rm)] == [["actor_inf", "reward_inf"], ["advantages"], ["actor_train"]]
    assert rm.node("advantages").args == {"weights": {"rewards": 0}} and rm.models() == ["actor", "reward"]
    with pytest.raises(GraphError, match=r"reward_weights: \['rewards/rm'\] are no reward source of the step"):
        build_graph(PPOHyperparameters(graph=StepGraphConfig(reward_weights={"rewards/rm": 1.0})))
    assert "behav_versions" in default_graph(PPOHyperparameters(prox_logp="loglinear")).node("actor_train").inputs
    # An implicit reward model is a log-ratio to the reference: the reference runs with no KL
    # term (kl_ctl=0), and the reward waits for its log-probs; the actor's update does not read them.
    implicit = build_graph(PPOHyperparameters(graph=StepGraphConfig(reward_model=True, reward_model_kind="implicit")))
    assert [[n.name for n in w] for w in waves(implicit)] == [
        ["actor_inf", "ref_inf"],
        ["reward_inf"],
        ["advantages"],
        ["actor_train"],
    ]
    assert implicit.node("reward_inf").op == "implicit_reward" and "ref_logprobs" in implicit.node("reward_inf").inputs
    assert "ref_logprobs" not in implicit.node("actor_train").inputs


def test_the_built_in_ops_are_the_ones_declared():
    assert set(OPS) == set(BUILTIN_OPS)


def test_a_users_node_joins_the_rewards_and_runs_before_the_advantages():
    add = StepNodeConfig(name="brevity", op=BREVITY, inputs=["loss_mask"], outputs=["rewards/brevity"])
    g = build_graph(PPOHyperparameters(graph=StepGraphConfig(add=[add])))
    assert "rewards/brevity" in g.node("advantages").inputs
    assert [[n.name for n in w] for w in waves(g)] == [["actor_inf", "brevity"], ["advantages"], ["actor_train"]]
    # From config as Hydra gives it: a dict per node.
    as_dict = {"name": "brevity", "op": BREVITY, "inputs": ["loss_mask"], "outputs": ["rewards/brevity"]}
    assert build_graph(PPOHyperparameters(graph=StepGraphConfig(add=[as_dict]))) == g


@pytest.mark.parametrize(
    "graph, message",
    [
        (
            {"drop": ["ref_inf"]},
            "node 'actor_train' reads 'ref_logprobs', which no node writes",
        ),
        ({"drop": ["actor_infer"]}, r"ppo.graph.drop: \['actor_infer'\] not in the default step"),
        ({"drop": ["actor_train"]}, r"a step trains the actor once .* found \[\]"),
        ({"add": [{"name": "x", "op": "nope"}]}, "node 'x': unknown op 'nope' .* built-in: "),
        ({"add": [{"name": "x", "op": "helpers.user_step_nodes:missing"}]}, "node 'x': .*missing"),
        ({"add": [{"name": "x", "op": "examples/step_nodes/nowhere.py:f"}]}, "node 'x': .*nowhere.py"),
        (
            {"add": [{"name": "x", "op": "values", "model": "actor", "outputs": ["v"]}]},
            "op values runs on model 'critic'",
        ),
        ({"add": [{"name": "x", "op": "logprobs", "model": "ref", "outputs": ["a", "b"]}]}, "op logprobs writes one"),
        ({"add": [{"name": "x", "op": "train_actor", "model": "actor"}]}, "trains the actor once"),
        (
            {
                "add": [
                    {"name": "after", "op": BREVITY, "inputs": ["advantages"], "outputs": ["late"]},
                    {"name": "later", "op": BREVITY, "inputs": ["late"], "outputs": ["later"]},
                ]
            },
            r"\['later'\] would run after 'actor_train'",
        ),
        ({"add": [{"name": "x", "op": BREVITY, "model": "policy", "outputs": ["rewards/x"]}]}, "model 'policy'; known"),
    ],
)
def test_a_step_that_cannot_run_is_refused_naming_the_node(graph, message):
    ppo = PPOHyperparameters(kl_ctl=0.1, graph=StepGraphConfig(**graph))
    with pytest.raises(GraphError, match=message):
        build_graph(ppo)


# ---- the step, node by node, against the calls it replaced -------------------------------------------


def _old_step(engines, ppo, batch):
    """The calls the master made before the step was a graph: actor_inf, ref_inf, critic_inf,
    critic_train, actor_train (the advantages computed by the first train call)."""
    actor = PPOActor(engines["actor"], ppo)
    critic = PPOCritic(engines["critic"], ppo, actor.kl) if "critic" in engines else None
    if "actor_inf" in default_graph(ppo).names():
        actor.compute_logprobs(batch)
    if "ref" in engines:
        reference_logprobs(engines["ref"], batch, ppo.gen.temperature)
    stats = {}
    if critic is not None:
        critic.compute_values(batch)
        stats.update(critic.train_step(batch))
    stats.update(actor.train_step(batch, 0))
    return stats


def _graph_step(engines, ppo, batch, graph=None):
    actor = PPOActor(engines["actor"], ppo)
    critic = PPOCritic(engines["critic"], ppo, actor.kl) if "critic" in engines else None
    ctx = StepContext(engines, actor, critic, ppo, version=0)
    stats = {}
    for wave in waves(graph or build_graph(ppo)):
        for node in wave:
            stats.update(run_node(ctx, batch, node).get("stats", {}))
    return stats


@pytest.mark.parametrize(
    "ppo",
    [
        {"ppo_n_minibatches": 2},  # GRPO: the first minibatch's proximal log-probs deferred
        {"ppo_n_minibatches": 2, "kl_ctl": 0.1},  # a reference, the KL in the loss
        {"ppo_n_minibatches": 2, "adv_estimator": "gae", "kl_ctl": 0.1},  # a critic, the KL in the reward
        {"ppo_n_minibatches": 2, "prox_logp": "loglinear"},  # no actor_inf
    ],
    ids=["grpo", "grpo-kl", "gae-kl", "loglinear"],
)
def test_one_step_of_the_graph_equals_the_calls_it_replaced(msgs, ppo):
    cfg = trainer_config(**ppo)
    roles = default_graph(cfg.ppo).models()
    results = []
    for step in (_old_step, _graph_step):
        engines = build_engines(cfg, 0, roles=roles)
        try:
            batch = pack(msgs)
            stats = step(engines, cfg.ppo, batch)
            results.append((batch, stats, {r: flat_params(e) for r, e in engines.items() if r != "ref"}))
        finally:
            for e in reversed(list(engines.values())):
                e.destroy()
    (b_old, s_old, w_old), (b_new, s_new, w_new) = results
    for name in ("prox_logprobs", "ref_logprobs", "values", "advantages", "returns"):
        old, new = getattr(b_old, name), getattr(b_new, name)
        assert (old is None) == (new is None), name
        if old is not None:
            assert float((old - new).abs().max()) <= 1e-6, name
    assert s_old.keys() == s_new.keys()
    for key, value in s_old.items():
        assert s_new[key] == pytest.approx(value, abs=1e-6), key
    for role in w_old:
        assert float((w_old[role] - w_new[role]).abs().max()) <= 1e-6, role
    assert float((w_old["actor"] - _params_of_fresh(cfg)).abs().max()) > 0  # the step moved the weights


def _params_of_fresh(cfg):
    engines = build_engines(cfg, 0, roles=["actor"])
    try:
        return flat_params(engines["actor"])
    finally:
        engines["actor"].destroy()


def test_a_users_reward_term_changes_the_advantages_it_joins(msgs):
    cfg = trainer_config(ppo_n_minibatches=1, adv_estimator="batch_norm")
    add = StepNodeConfig(
        name="brevity", op=BREVITY, inputs=["loss_mask"], outputs=["rewards/brevity"], args={"per_token": 0.05}
    )
    graph = build_graph(dataclasses.replace(cfg.ppo, graph=StepGraphConfig(add=[add])))
    engines = build_engines(cfg, 0, roles=["actor"])
    try:
        plain, shaped = pack(msgs), pack(msgs)
        _graph_step(engines, cfg.ppo, plain, build_graph(cfg.ppo))
        stats = _graph_step(engines, cfg.ppo, shaped, graph)
    finally:
        engines["actor"].destroy()
    bonus = shaped.get("rewards/brevity")
    assert torch.equal(bonus, -0.05 * shaped.loss_mask.sum(dim=1).float())
    # batch_norm: (r - mean) / std over the step; a length-dependent term moves the advantages.
    assert float((shaped.advantages - plain.advantages).abs().max()) > 1e-3
    assert torch.equal(shaped.rewards, plain.rewards)  # the rollout's rewards are left as they were
    assert stats["n_tokens"] == shaped.n_tokens


def test_a_node_that_does_not_write_its_outputs_or_lacks_an_input_fails_naming_it(msgs):
    cfg = trainer_config()
    add = StepNodeConfig(name="lazy", op="helpers.user_step_nodes:writes_nothing", outputs=["rewards/lazy"])
    graph = build_graph(dataclasses.replace(cfg.ppo, graph=StepGraphConfig(add=[add])))
    ctx = StepContext({}, None, None, cfg.ppo, 0)
    with pytest.raises(
        RuntimeError,
        match=r"step node 'lazy' \(helpers.user_step_nodes:writes_nothing\) did not write \['rewards/lazy'\]",
    ):
        run_node(ctx, pack(msgs), graph.node("lazy"))
    with pytest.raises(RuntimeError, match=r"step node 'actor_train': its inputs \[.*'advantages'.*\] are not there"):
        run_node(ctx, pack(msgs), graph.node("actor_train"))


# ---- a node on a process of its own (ppo.graph.own_process) --------------------------------------------


def test_only_nodes_on_the_reference_or_on_no_model_may_run_off_the_trainer():
    ok = build_graph(PPOHyperparameters(kl_ctl=0.1, graph=StepGraphConfig(own_process=["ref_inf"])))
    assert trainer_models(ok, ["ref_inf"]) == ["actor"] and trainer_models(ok, []) == ["actor", "ref"]
    with pytest.raises(GraphError, match=r"own_process\[0\]='actor_inf' \(proximal_logprobs on actor\) must run on"):
        build_graph(PPOHyperparameters(graph=StepGraphConfig(own_process=["actor_inf"])))
    with pytest.raises(GraphError, match=r"own_process\[0\]='ref_inf': no such node"):
        build_graph(PPOHyperparameters(graph=StepGraphConfig(own_process=["ref_inf"])))  # kl_ctl=0: no reference


def test_the_reference_on_the_wire_gives_what_it_gives_on_the_trainers_batch(msgs):
    """What the node worker computes from the tensors the master takes from a rank (msgpack both
    ways) equals the trainer's own ref_inf on its batch."""
    cfg = trainer_config(kl_ctl=0.1)
    graph = build_graph(dataclasses.replace(cfg.ppo, graph=StepGraphConfig(own_process=["ref_inf"])))
    node = graph.node("ref_inf")
    engines = build_engines(cfg, 0, roles=["ref"])
    try:
        ctx = StepContext(engines, None, None, cfg.ppo, 0)
        here = pack(msgs)
        run_node(ctx, here, node)
        sent = {n: here.get(n) for n in (*REQUIRED_FIELDS, "prompt_lens", *node.inputs)}
        away = batch_from_tensors(serialization.loads(serialization.dumps(sent)))
        stats = run_node(ctx, away, node)
        back = serialization.loads(serialization.dumps({"ref_logprobs": away.get("ref_logprobs")}))
    finally:
        engines["ref"].destroy()
    assert torch.equal(back["ref_logprobs"], here.ref_logprobs)
    assert stats["model"] == "ref" and stats["n_tokens"] == here.n_tokens


def test_reward_weights_scale_each_source_before_the_advantages(msgs):
    """{rewards: 0}: the step learns from the reward terms alone — its advantages are those of a
    batch whose reward is the term."""
    cfg = trainer_config(ppo_n_minibatches=1, adv_estimator="batch_norm")
    add = StepNodeConfig(name="brevity", op=BREVITY, inputs=["loss_mask"], outputs=["rewards/brevity"])
    graph = build_graph(dataclasses.replace(cfg.ppo, graph=StepGraphConfig(add=[add], reward_weights={"rewards": 0.0})))
    actor = SimpleNamespace(kl=SimpleNamespace(value=0.0))  # all the advantages read of the actor
    ctx = StepContext({}, actor, None, cfg.ppo, 0)
    only_term, reference = pack(msgs), pack(msgs)
    for name in ("brevity", "advantages"):
        run_node(ctx, only_term, graph.node(name))
    reference.rewards = only_term.get("rewards/brevity").clone()
    run_node(ctx, reference, build_graph(cfg.ppo).node("advantages"))
    assert torch.allclose(only_term.advantages, reference.advantages)
