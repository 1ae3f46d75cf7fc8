"""Tensor parallelism of FSDPEngine (realhf.impl.engine.tensor_parallel) with real processes and
real gloo: layouts d1m2 (two processes) and d2m2 (four) train the PPO steps of helpers.fsdp_ranks
and must take the step the unwrapped DP=1 engine takes on the same data; the HF directory, the
streamed weights and the recovery checkpoint of a split model equal its gathered parameters."""

import json
import os

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

LAYOUTS = {"d1m2": (2, 2), "d2m2": (4, 2)}  # (processes, tp)


# d1m2 in CI; d2m2 (four processes, dp and tp together) with --runslow, where the random-batch
# stress test also runs it (test_dp_stress.py).
@pytest.fixture(scope="module", params=["d1m2", pytest.param("d2m2", marks=pytest.mark.slow)])
def tp_run(request, tmp_path_factory):
    world_size, tp = LAYOUTS[request.param]
    out = tmp_path_factory.mktemp(f"tp_{request.param}")
    launch_ranks("helpers.tp_ranks", out, world_size=world_size, timeout=240, extra_env={"TP": str(tp)})
    return out


@pytest.fixture(scope="module")
def dp1_run():
    return dp1_steps(engine_config())


@pytest.fixture(scope="module")
def dp1_critic_run():
    """(initial parameters, parameters, stats) of the critic's two steps at DP=1."""
    return dp1_critic_steps()


@pytest.mark.system
def test_a_split_model_takes_the_dp1_step(tp_run, dp1_run):
    dp1_params, dp1_stats = dp1_run
    tp = load_file(str(tp_run / "params_step2.safetensors"))
    initial = load_file(os.path.join(TINY_SFT, "model.safetensors"))
    assert max_abs_diff({k: tp[k] for k in initial}, initial) > 1e-3  # the steps moved the weights
    assert max_abs_diff(tp, dp1_params) <= 1e-5
    tp_stats = json.loads((tp_run / "stats.json").read_text())[:2]
    for dp1_step, tp_step in zip(dp1_stats, tp_stats):
        assert tp_step["loss_weight"] == dp1_step["loss_weight"]  # counted once per replica, not per tp rank
        for key in ("loss", "grad_norm", "lr"):
            assert tp_step[key] == pytest.approx(dp1_step[key], rel=1e-5), key


@pytest.mark.system
def test_a_split_models_hf_directory_and_streamed_weights_are_its_parameters(tp_run):
    from transformers import AutoModelForCausalLM

    params = load_file(str(tp_run / "params_step2.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(str(tp_run / "hf"))
    assert max_abs_diff(dict(model.state_dict()), params) == 0.0
    streamed = load_file(str(tp_run / "hf_tensors.safetensors"))
    assert max_abs_diff(streamed, {k: params[k] for k in streamed}) == 0.0
    assert set(params) - set(streamed) <= {"lm_head.weight"}  # a tied head is sent once, as the embedding


@pytest.mark.system
def test_a_split_model_resumes_from_its_recovery_checkpoint_exactly(tp_run):
    assert (
        max_abs_diff(
            load_file(str(tp_run / "params_step3.safetensors")),
            load_file(str(tp_run / "params_step3_recovered.safetensors")),
        )
        == 0.0
    )
    stats = json.loads((tp_run / "stats.json").read_text())
    assert stats[2] == stats[3]


@pytest.mark.system
def test_a_tp_recovery_checkpoint_loads_into_an_unsplit_engine(tp_run):
    """Resume at another layout: the d?m2 checkpoint into one unwrapped rank (DCP reshards)."""
    from realhf.impl.model import recover_checkpoint

    with open_engines(engine_config()) as (engine,):
        recover_checkpoint.load(tp_run / "recover", {"actor": engine}, 0, engine.device)
        loaded = full_params(engine)
    assert max_abs_diff(loaded, load_file(str(tp_run / "params_step2.safetensors"))) == 0.0


@pytest.mark.system
def test_a_split_critic_takes_the_dp1_steps(tp_run, dp1_critic_run):
    initial, dp1_params, dp1_stats = dp1_critic_run
    assert max_abs_diff(load_file(str(tp_run / "critic_init.safetensors")), initial) == 0.0
    tp = load_file(str(tp_run / "critic_step2.safetensors"))
    assert max_abs_diff(tp, initial) > 1e-3
    assert max_abs_diff(tp, dp1_params) <= 1e-5
    for dp1_step, tp_step in zip(dp1_stats, json.loads((tp_run / "critic_stats.json").read_text())):
        for key in ("loss", "grad_norm"):
            assert tp_step[key] == pytest.approx(dp1_step[key], rel=1e-5), key


def test_a_model_whose_heads_do_not_divide_is_refused_naming_them():
    from realhf.impl.engine.tensor_parallel import check_tp_fits

    with open_engines(engine_config()) as (engine,):
        layers = list(engine.model.model.layers)
        with pytest.raises(ValueError, match=r"m3 .*num_attention_heads=4.*lower m"):
            check_tp_fits(engine.model, layers, 3, "actor")
        check_tp_fits(engine.model, layers, 2, "actor")  # 4 heads, 4 kv heads, 512 MLP: fine


def test_clip_grad_norm_matches_torch_on_plain_tensors():
    from realhf.impl.engine.tensor_parallel import clip_grad_norm

    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(3)]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    for p, q in zip(a, b):
        p.grad = torch.randn(5, 3)
        q.grad = p.grad.clone()
    want = torch.nn.utils.clip_grad_norm_(a, 0.5)
    got = clip_grad_norm(b, 0.5)
    assert float(got) == pytest.approx(float(want), rel=1e-6)
    for p, q in zip(a, b):
        assert torch.allclose(p.grad, q.grad, atol=1e-7)
