"""actor.lora under FSDP2 at DP=2, and split over two tensor-parallel ranks (d1m2: adapters split
with their projections, realhf.impl.engine.tensor_parallel.layer_plan), over real gloo (two
processes, helpers.lora_ranks): the ranks take the step DP=1 takes on the union of their samples, the published directory is the merged
model, the reference is the base, and a fresh engine restored from the recovery checkpoint
continues exactly as the engine that wrote it."""

import json

import pytest
import torch
from safetensors.torch import load_file

from helpers.fsdp_ranks import TINY_SFT, dp1_steps, engine_config, make_batch, token_logprobs
from helpers.gloo_ranks import launch_ranks
from helpers.lora_ranks import LORA, lora_config
from realhf.impl.engine.fsdp_engine import FSDPEngine


@pytest.fixture(scope="module", params=["d2m1", "d1m2"])
def dp2_run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"lora_{request.param}")
    tp = 2 if request.param == "d1m2" else 1
    launch_ranks("helpers.lora_ranks", out, world_size=2, extra_env={"TP": str(tp)})
    return out


@pytest.fixture(scope="module")
def dp1_run():
    """Parameters and stats after the same two steps at DP=1 (unwrapped)."""
    return dp1_steps(lora_config())


@pytest.mark.system
def test_dp2_lora_takes_the_same_two_steps_as_dp1_on_the_union_of_the_data(dp2_run, dp1_run):
    dp1_params, dp1_stats = dp1_run
    dp2_params = load_file(str(dp2_run / "params_step2.safetensors"))
    dp2_stats = json.loads((dp2_run / "stats.json").read_text())[:2]
    assert set(dp2_params) == set(dp1_params)
    for k, v in dp1_params.items():
        assert torch.allclose(dp2_params[k], v, atol=1e-5, rtol=0), f"{k}: {(dp2_params[k] - v).abs().max()}"
    for a, b in zip(dp2_stats, dp1_stats):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)


@pytest.mark.system
def test_dp2_publishes_base_plus_scaled_adapter_product(dp2_run):
    params = load_file(str(dp2_run / "params_step2.safetensors"))
    published = load_file(str(dp2_run / "hf" / "model.safetensors"))
    scaling = LORA.alpha / LORA.r
    for module in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"):
        peft_name = f"base_model.model.{module}"
        a, b = params[f"{peft_name}.lora_A.default.weight"], params[f"{peft_name}.lora_B.default.weight"]
        expected = params[f"{peft_name}.base_layer.weight"] + scaling * b @ a  # [out, in]
        assert torch.allclose(published[f"{module}.weight"], expected, atol=1e-5, rtol=0)
        assert float((b @ a).abs().max()) > 1e-4  # the adapters trained
    assert torch.equal(published["model.norm.weight"], params["base_model.model.model.norm.weight"])


@pytest.mark.system
def test_dp2_reference_log_probs_are_the_base_model_s(dp2_run):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    base = FSDPEngine(engine_config(trainable=False))
    try:
        base.initialize()
        expected = base.forward(make_batch(), token_logprobs)
    finally:
        base.destroy()
        torch.set_num_threads(threads)
    ref = load_file(str(dp2_run / "ref_logprobs.safetensors"))["ref"]
    assert torch.allclose(ref, expected, atol=1e-5)


@pytest.mark.system
def test_dp2_recovery_continues_exactly_as_without_the_save(dp2_run):
    continued = load_file(str(dp2_run / "params_step3.safetensors"))
    resumed = load_file(str(dp2_run / "params_step3_recovered.safetensors"))
    base = load_file(f"{TINY_SFT}/model.safetensors")
    for k, v in continued.items():
        assert torch.allclose(resumed[k], v, atol=1e-6, rtol=0), f"{k}: {(resumed[k] - v).abs().max()}"
    # the base stayed the base through training, saving and restoring
    assert torch.equal(
        resumed["base_model.model.model.layers.1.self_attn.v_proj.base_layer.weight"],
        base["model.layers.1.self_attn.v_proj.weight"],
    )
    stats = json.loads((dp2_run / "stats.json").read_text())
    assert stats[3]["loss"] == pytest.approx(stats[2]["loss"], abs=1e-6)
