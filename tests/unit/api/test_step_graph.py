"""realhf/api/step_graph.py: a step's nodes in waves, and every graph that cannot run refused
with the node and the fault named. Pure Python, no torch."""

import pytest

from realhf.api.step_graph import GraphError, StepGraph, StepNode, node_from_dict


def _known(op):
    return None if op in ("a", "b", "train") else f"unknown op {op!r}"


def _check(*nodes):
    return StepGraph(nodes).check(_known, ["actor", "ref"])


def test_nodes_run_in_waves_each_after_what_it_reads():
    g = _check(
        StepNode("late", "b", "actor", ("x", "y")),
        StepNode("x_of_ids", "a", "actor", ("input_ids",), ("x",)),
        StepNode("y_of_x", "a", "ref", ("x",), ("y",)),
        StepNode("z_of_ids", "a", "ref", ("input_ids",), ("z",)),
    )
    assert [[n.name for n in wave] for wave in g.order()] == [["x_of_ids", "z_of_ids"], ["y_of_x"], ["late"]]
    assert g.models() == ["actor", "ref"]
    assert g.describe() == "x_of_ids, z_of_ids | y_of_x | late"
    assert g.writer("y").name == "y_of_x" and g.writer("input_ids") is None


@pytest.mark.parametrize(
    "nodes, message",
    [
        ([StepNode("n", "a", "actor", ("nothing",))], "node 'n' reads 'nothing', which no node writes"),
        (
            [StepNode("p", "a", "", ("q_out",), ("p_out",)), StepNode("q", "a", "", ("p_out",), ("q_out",))],
            r"the nodes \['p', 'q'\] wait for each other \(a cycle\)",
        ),
        ([StepNode("n", "a", "", ("n_out",), ("n_out",))], "node 'n' reads a tensor it writes itself"),
        ([StepNode("n", "nope", "")], "node 'n': unknown op 'nope'"),
        ([StepNode("n", "a", "critic")], r"node 'n' runs on model 'critic'; known models: \['actor', 'ref'\]"),
        ([StepNode("n", "a", ""), StepNode("n", "b", "")], "two nodes are named 'n'"),
        (
            [StepNode("n", "a", "", (), ("t",)), StepNode("m", "b", "", (), ("t",))],
            "tensor 't' is written by node 'm' and by node 'n'",
        ),
        ([StepNode("n", "a", "", (), ("rewards",))], "tensor 'rewards' is written by node 'n' and by the rollout"),
        ([StepNode("", "a", "")], "a node without a name"),
        ([StepNode("n", "", "")], "node 'n' names no op"),
    ],
)
def test_a_graph_that_cannot_run_is_refused_naming_the_node(nodes, message):
    with pytest.raises(GraphError, match=message):
        _check(*nodes)


def test_a_node_from_config_refuses_unknown_keys_and_a_string_for_a_list():
    n = node_from_dict({"name": "n", "op": "a", "inputs": ["input_ids"], "args": {"w": 2}}, "ppo.graph.add[0]")
    assert n == StepNode("n", "a", "", ("input_ids",), (), {"w": 2})
    with pytest.raises(GraphError, match=r"ppo.graph.add\[0\]: unknown key\(s\) \['input'\]"):
        node_from_dict({"name": "n", "op": "a", "input": ["x"]}, "ppo.graph.add[0]")
    with pytest.raises(GraphError, match=r"ppo.graph.add\[1\].outputs: a list of tensor names, got 'x'"):
        node_from_dict({"name": "n", "op": "a", "outputs": "x"}, "ppo.graph.add[1]")


def test_reward_terms_are_the_outputs_named_rewards_slash_something():
    g = _check(
        StepNode("rm", "a", "ref", ("input_ids",), ("rewards/rm",)),
        StepNode("len", "b", "", ("loss_mask",), ("rewards/length", "other")),
    )
    assert g.reward_terms() == ["rewards/rm", "rewards/length"]
