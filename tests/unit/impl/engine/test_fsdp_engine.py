"""FSDPEngine on the tiny-math model with real processes and real gloo.

One DP=2 run (two processes, helpers.fsdp_ranks) trains two PPO steps, publishes an HF
directory, writes a recovery checkpoint (realhf.impl.model.recover_checkpoint), trains a third
step, and repeats that step in a fresh engine restored from the checkpoint; then a critic (value
head) takes two value-loss steps. The DP=1 references run in this process on the union of the
two ranks' samples.
"""

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
    run_steps,
)
from helpers.gloo_ranks import launch_ranks


@pytest.fixture(scope="module")
def dp2_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp_dp2")
    launch_ranks("helpers.fsdp_ranks", out, world_size=2)
    return out


@pytest.fixture(scope="module")
def dp1_run():
    """(parameters, stats) after the same two steps at DP=1 (unwrapped: the DP=1 default)."""
    return dp1_steps(engine_config())


@pytest.fixture(scope="module")
def dp1_critic_run():
    """(initial parameters, parameters, stats) of the critic's two steps at DP=1."""
    return dp1_critic_steps()


@pytest.mark.system
def test_dp2_fsdp_takes_the_same_two_steps_as_dp1_on_the_union_of_the_data(dp2_run, dp1_run):
    dp1_params, dp1_stats = dp1_run
    dp2 = load_file(str(dp2_run / "params_step2.safetensors"))
    initial = load_file(os.path.join(TINY_SFT, "model.safetensors"))
    # The steps moved the weights (far more than the tolerance), and DP=2 moved them as DP=1 did.
    assert max_abs_diff({k: dp2[k] for k in initial}, initial) > 1e-3
    assert max_abs_diff(dp2, dp1_params) <= 1e-5
    # Adam's step hides a constant factor on the gradient; the loss and the (unclipped) gradient
    # norm show it: both are global token means, equal at DP=1 and DP=2.
    dp2_stats = json.loads((dp2_run / "stats.json").read_text())[:2]
    for dp1_step, dp2_step in zip(dp1_stats, dp2_stats):
        assert dp2_step["loss_weight"] == dp1_step["loss_weight"]
        for key in ("loss", "grad_norm", "lr"):
            assert dp2_step[key] == pytest.approx(dp1_step[key], rel=1e-5), key


@pytest.mark.system
def test_hf_directory_saved_at_dp2_loads_with_transformers_and_equals_the_engine_parameters(dp2_run):
    from transformers import AutoModelForCausalLM

    hf = dp2_run / "hf"
    config = json.loads((hf / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]  # not FSDP's generated wrapper class
    assert (hf / "tokenizer.json").is_file()  # copied from the source model
    model = AutoModelForCausalLM.from_pretrained(str(hf))
    engine_params = load_file(str(dp2_run / "params_step2.safetensors"))
    assert max_abs_diff(dict(model.state_dict()), engine_params) == 0.0


@pytest.mark.system
def test_load_recover_into_fresh_engines_continues_exactly_as_without_the_save(dp2_run):
    continued = load_file(str(dp2_run / "params_step3.safetensors"))
    recovered = load_file(str(dp2_run / "params_step3_recovered.safetensors"))
    assert max_abs_diff(continued, recovered) == 0.0
    stats = json.loads((dp2_run / "stats.json").read_text())
    assert stats[2] == stats[3]  # same loss, grad norm and (cosine-scheduled) LR
    assert stats[2]["lr"] < stats[1]["lr"]  # the schedule moved on; it was not restarted
    assert not list(dp2_run.glob(".tmp-*"))  # the temporary directory was renamed into place
    info = json.loads((dp2_run / "recover" / "recover_info.json").read_text())
    assert info == {"version": 2, "dp_size": 2, "roles": ["actor"]}
    assert sorted(p.name for p in (dp2_run / "recover" / "rng").iterdir()) == ["rank0.pt", "rank1.pt"]


@pytest.mark.system
def test_a_dp2_recovery_checkpoint_resumes_into_tensor_parallel_ranks(dp2_run, tmp_path):
    """Resume at another layout (issue 32): the d2m1 checkpoint into d1m2 ranks (DCP reshards the
    FSDP shards into the split layers); the step after it is the one the d2m1 engine took."""
    launch_ranks(
        "helpers.tp_ranks", tmp_path, world_size=2, extra_env={"TP": "2", "RESUME_FROM": str(dp2_run / "recover")}
    )
    continued = load_file(str(dp2_run / "params_step3.safetensors"))
    assert max_abs_diff(load_file(str(tmp_path / "resumed_step3.safetensors")), continued) <= 1e-5
    resumed = json.loads((tmp_path / "stats.json").read_text())[0]
    d2 = json.loads((dp2_run / "stats.json").read_text())[2]
    assert resumed["lr"] == d2["lr"] and resumed["loss"] == pytest.approx(d2["loss"], rel=1e-5)


@pytest.mark.system
def test_dp2_value_head_starts_as_the_dp1_one_on_every_rank(dp2_run, dp1_critic_run):
    # The head is random (a causal-LM checkpoint has none); a rank that drew its own would show
    # here as a gathered head that is part one draw, part the other.
    initial, _, _ = dp1_critic_run
    dp2_initial = load_file(str(dp2_run / "critic_init.safetensors"))
    assert "score.weight" in dp2_initial and float(dp2_initial["score.weight"].abs().max()) > 0
    assert max_abs_diff(dp2_initial, initial) == 0.0


@pytest.mark.system
def test_dp2_critic_takes_the_same_two_steps_as_dp1_on_the_union_of_the_data(dp2_run, dp1_critic_run):
    initial, dp1_params, dp1_stats = dp1_critic_run
    dp2 = load_file(str(dp2_run / "critic_step2.safetensors"))
    assert max_abs_diff(dp2, initial) > 1e-3  # the value loss moved the weights
    assert max_abs_diff(dp2, dp1_params) <= 1e-5
    dp2_stats = json.loads((dp2_run / "critic_stats.json").read_text())
    for dp1_step, dp2_step in zip(dp1_stats, dp2_stats):
        assert dp2_step["loss_weight"] == dp1_step["loss_weight"]
        for key in ("loss", "grad_norm", "lr"):
            assert dp2_step[key] == pytest.approx(dp1_step[key], rel=1e-5), key


@pytest.mark.system
def test_load_hf_puts_the_saved_weights_into_a_sharded_engine(dp2_run):
    from realhf.impl.engine.fsdp_engine import FSDPEngine

    # Sharded at DP=1 (the engine makes its own one-rank group), so the weights land in DTensors
    # and the tied LM head, stored once in the file, is filled through the embedding.
    engine = FSDPEngine(engine_config(shard_single_rank=True))
    try:
        engine.initialize()
        assert engine.sharded
        engine.load_hf(dp2_run / "hf")
        loaded = full_params(engine)
    finally:
        engine.destroy()
    assert max_abs_diff(loaded, load_file(str(dp2_run / "params_step2.safetensors"))) == 0.0


# The switch goes by the name this transformers takes: its old name warns (and goes in v6).
@pytest.mark.filterwarnings("error:.*gradient_checkpointing_enable.*:FutureWarning")
@pytest.mark.parametrize("shard_single_rank", [False, True], ids=["unwrapped", "fsdp"])
def test_activation_checkpointing_makes_the_same_update(shard_single_rank):
    """`gradient_checkpointing` recomputes activations in the backward (under FSDP2 too): the
    steps must be those of the plain model."""
    import dataclasses

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results = []
        for checkpointing in (False, True):
            config = engine_config(shard_single_rank=shard_single_rank)
            config.model = dataclasses.replace(config.model, gradient_checkpointing=checkpointing)
            with open_engines(config) as (engine,):
                # `is_activation_checkpointing` in newer transformers, `is_gradient_checkpointing` before.
                on = getattr(engine.model, "is_activation_checkpointing", None)
                assert (engine.model.is_gradient_checkpointing if on is None else on) == checkpointing
                stats = run_steps(engine, [0, 1], rank=0, world_size=1)
                results.append((full_params(engine), stats))
    finally:
        torch.set_num_threads(threads)
    (plain, plain_stats), (ckpt, ckpt_stats) = results
    assert max_abs_diff(plain, ckpt) <= 1e-6
    assert [s["loss"] for s in ckpt_stats] == pytest.approx([s["loss"] for s in plain_stats], rel=1e-5)
