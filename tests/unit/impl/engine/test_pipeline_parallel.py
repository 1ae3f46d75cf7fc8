"""Pipeline parallelism of FSDPEngine (realhf.impl.engine.pipeline_parallel) with real processes
and real gloo: layouts d1m1p2 (two processes), d2m1p2 and d1m2p2 (four) train the PPO steps of
helpers.fsdp_ranks and must take the step the unwrapped DP=1 engine takes on the same data; the
HF directory, the streamed weights and the recovery checkpoint of a pipelined model equal its
gathered parameters, under the unsplit model's names."""

import json

import pytest
import torch
from safetensors.torch import load_file

from helpers.fsdp_ranks import (
    TINY_SFT,
    dp1_critic_steps,
    dp1_steps,
    engine_config,
    full_params,
    max_abs_diff,
    open_engines,
)
from helpers.gloo_ranks import launch_ranks

# (processes, pp, tp); the four-process layouts run with --runslow
LAYOUTS = {
    "d1m1p2": (2, 2, 1),
    "d2m1p2": pytest.param((4, 2, 1), marks=pytest.mark.slow),
    "d1m2p2": pytest.param((4, 2, 2), marks=pytest.mark.slow),
}


@pytest.fixture(scope="module", params=list(LAYOUTS.values()), ids=list(LAYOUTS))
def pp_run(request, tmp_path_factory):
    world_size, pp, tp = request.param
    out = tmp_path_factory.mktemp(f"pp_w{world_size}p{pp}m{tp}")
    (out / "layout.json").write_text(json.dumps([world_size, pp, tp]))
    launch_ranks("helpers.pp_ranks", out, world_size=world_size, timeout=240, extra_env={"PP": str(pp), "TP": str(tp)})
    return out


@pytest.fixture(scope="module")
def dp1_run():
    return dp1_steps(engine_config())


@pytest.fixture(scope="module")
def dp1_critic_run():
    """(initial parameters, parameters, stats) of the critic's two steps at DP=1."""
    return dp1_critic_steps()


def test_stage_layers_are_contiguous_and_as_even_as_possible():
    from realhf.impl.engine.pipeline_parallel import stage_layers

    assert stage_layers(2, 2) == [range(0, 1), range(1, 2)]
    assert stage_layers(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    assert [len(r) for r in stage_layers(28, 4)] == [7, 7, 7, 7]


@pytest.mark.system
def test_a_pipelined_model_takes_the_dp1_step(pp_run, dp1_run):
    dp1_params, dp1_stats = dp1_run
    pp = load_file(str(pp_run / "params_step2.safetensors"))
    initial = load_file(f"{TINY_SFT}/model.safetensors")
    assert max_abs_diff({k: pp[k] for k in initial}, initial) > 1e-3  # the steps moved the weights
    assert max_abs_diff(pp, dp1_params) <= 1e-5
    # A tied head: the last stage's copy took the embedding's step.
    assert torch.equal(pp["lm_head.weight"], pp["model.embed_tokens.weight"])
    pp_stats = json.loads((pp_run / "stats.json").read_text())[:2]
    for dp1_step, pp_step in zip(dp1_stats, pp_stats):
        assert pp_step["loss_weight"] == dp1_step["loss_weight"]  # counted once per replica, not per stage
        for key in ("loss", "grad_norm", "lr"):
            assert pp_step[key] == pytest.approx(dp1_step[key], rel=1e-5), key


@pytest.mark.system
def test_every_rank_gets_the_forward_results_of_its_rows(pp_run):
    """Computed on the last stage, broadcast to the pipeline: rank r holds the log-probs of its dp
    rank's rows, as the unwrapped engine computes them."""
    from helpers.fsdp_ranks import make_batch, rank_rows, token_logprobs

    world_size, pp, tp = json.loads((pp_run / "layout.json").read_text())
    dp = world_size // (pp * tp)
    with open_engines(engine_config()) as (engine,):
        want = [engine.forward(make_batch().select(rank_rows(0, d, dp)), token_logprobs) for d in range(dp)]
    for rank in range(world_size):
        got = load_file(str(pp_run / f"logprobs{rank}.safetensors"))["logprobs"]
        torch.testing.assert_close(got, want[(rank // tp) % dp], rtol=0, atol=1e-5)


@pytest.mark.system
def test_every_stage_counts_the_whole_models_parameters(pp_run, dp1_run):
    with open_engines(engine_config()) as (engine,):
        whole = [engine.n_params, engine.n_trainable]
    for f in sorted(pp_run.glob("n_params*.json")):
        assert json.loads(f.read_text()) == whole, f.name


@pytest.mark.system
def test_a_pipelined_models_hf_directory_and_streamed_weights_are_its_parameters(pp_run):
    from transformers import AutoModelForCausalLM

    params = load_file(str(pp_run / "params_step2.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(str(pp_run / "hf"))
    assert max_abs_diff(dict(model.state_dict()), params) == 0.0
    streamed = load_file(str(pp_run / "hf_tensors.safetensors"))
    assert max_abs_diff(streamed, {k: params[k] for k in streamed}) == 0.0
    assert set(params) - set(streamed) == {"lm_head.weight"}  # a tied head is sent once, as the embedding


@pytest.mark.system
def test_a_pipelined_model_resumes_from_its_recovery_checkpoint_exactly(pp_run):
    assert (
        max_abs_diff(
            load_file(str(pp_run / "params_step3.safetensors")),
            load_file(str(pp_run / "params_step3_recovered.safetensors")),
        )
        == 0.0
    )
    stats = json.loads((pp_run / "stats.json").read_text())
    assert stats[2] == stats[3]


@pytest.mark.system
def test_a_pp_recovery_checkpoint_loads_into_an_unsplit_engine(pp_run):
    """Resume at another layout: every stage's part (original names) into one unwrapped rank."""
    from realhf.impl.model import recover_checkpoint

    with open_engines(engine_config()) as (engine,):
        recover_checkpoint.load(pp_run / "recover", {"actor": engine}, 0, engine.device)
        loaded = full_params(engine)
        assert int(engine.optimizer.state_dict()["state"][0]["step"]) == 2  # Adam's state came along
    assert max_abs_diff(loaded, load_file(str(pp_run / "params_step2.safetensors"))) == 0.0


@pytest.mark.system
def test_a_pipelined_critic_takes_the_dp1_steps(pp_run, dp1_critic_run):
    initial, dp1_params, dp1_stats = dp1_critic_run
    assert max_abs_diff(load_file(str(pp_run / "critic_init.safetensors")), initial) == 0.0
    pp = load_file(str(pp_run / "critic_step2.safetensors"))
    assert max_abs_diff(pp, initial) > 1e-3
    assert max_abs_diff(pp, dp1_params) <= 1e-5
    for dp1_step, pp_step in zip(dp1_stats, json.loads((pp_run / "critic_stats.json").read_text())):
        for key in ("loss", "grad_norm"):
            assert pp_step[key] == pytest.approx(dp1_step[key], rel=1e-5), key


@pytest.mark.system
def test_a_non_finite_loss_on_the_last_stage_skips_the_step_on_every_rank(pp_run):
    ranks = [json.loads(f.read_text()) for f in sorted(pp_run.glob("critic_nan*.json"))]
    assert len(ranks) >= 2
    assert all(r == {"skipped": 1.0, "unchanged": True} for r in ranks)


def test_a_model_with_fewer_layers_than_stages_is_refused_naming_them():
    from realhf.impl.engine.pipeline_parallel import split_model
    from realhf.impl.model.model_loading import load_causal_lm

    model = load_causal_lm(engine_config().model)
    with pytest.raises(ValueError, match=r"p3 needs at least one decoder layer per stage; .* has 2 .*lower p"):
        split_model(model, 0, 3, value_head=False, where="actor")
