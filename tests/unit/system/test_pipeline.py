"""The dataflow-graph builder of docs/architecture.md §7: topological order and errors that name the node."""

import pytest

from realhf.system.pipeline import ModelCall, Pipeline, PipelineError, ppo_pipeline


def _names(p):
    return [n.name for n in p.order()]


def test_order_puts_every_node_after_its_dependencies_and_keeps_insertion_order_for_ties():
    p = (Pipeline("custom")
         .add_node("train", ModelCall("train_step"), deps=["inf_b", "inf_a"])
         .add_node("inf_a", ModelCall("inference", {"model": "actor"}))
         .add_node("inf_b", ModelCall("inference", {"model": "ref"}), deps=["inf_a"])
         .add_node("critic", ModelCall("inference", {"model": "critic"})))
    assert _names(p) == ["inf_a", "critic", "inf_b", "train"]


def test_unknown_dependency_is_an_error_naming_the_node_and_the_dependency():
    p = Pipeline("ppo").add_node("actor_train", ModelCall("train_step"), deps=["actor_inff"])
    with pytest.raises(PipelineError, match=r"node 'actor_train' depends on unknown node 'actor_inff'"):
        p.order()


def test_cycle_is_an_error_naming_the_nodes_on_it():
    p = (Pipeline("loop")
         .add_node("a", ModelCall("x"), deps=["c"])
         .add_node("b", ModelCall("x"), deps=["a"])
         .add_node("c", ModelCall("x"), deps=["b"])
         .add_node("free", ModelCall("x")))
    # Execution direction: b runs after a, c after b, a after c.
    with pytest.raises(PipelineError, match=r"pipeline 'loop': dependency cycle through a -> b -> c -> a"):
        p.order()


def test_self_dependency_is_a_cycle():
    with pytest.raises(PipelineError, match="cycle through a -> a"):
        Pipeline("p").add_node("a", ModelCall("x"), deps=["a"]).order()


def test_duplicate_node_name_is_refused():
    p = Pipeline("p").add_node("a", ModelCall("x"))
    with pytest.raises(PipelineError, match="node 'a' is declared twice"):
        p.add_node("a", ModelCall("y"))


@pytest.mark.parametrize(
    "recompute,use_ref,expected",
    [
        (True, False, ["actor_inf", "actor_train"]),
        (True, True, ["actor_inf", "ref_inf", "actor_train"]),
        (False, True, ["ref_inf", "actor_train"]),
        (False, False, ["actor_train"]),
    ],
)
def test_builtin_ppo_graph_runs_proximal_then_reference_inference_before_training(recompute, use_ref, expected):
    order = ppo_pipeline(recompute_logprob=recompute, use_ref=use_ref).order()
    assert [n.name for n in order] == expected
    calls = {n.name: n.call for n in order}
    if recompute:
        assert calls["actor_inf"] == ModelCall("inference", {"model": "actor"})
    if use_ref:
        assert calls["ref_inf"] == ModelCall("inference", {"model": "ref"})
    assert calls["actor_train"].handler == "train_step"
