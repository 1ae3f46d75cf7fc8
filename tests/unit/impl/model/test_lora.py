"""actor.lora on the FSDPEngine (DP=1, in this process), with the real peft library: only the
adapters train, the published HF directory is the merged model, the reference is the base with
the adapters disabled, and recovery restores the adapters and their optimizer state. DP=2 is
tests/unit/impl/engine/test_lora_dp2.py."""

import json

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader

from helpers.fsdp_ranks import TINY_SFT, engine_config, full_params, make_batch, open_engines, run_steps, token_logprobs
from helpers.lora_ranks import LORA, lora_config
from realhf.impl.model import recover_checkpoint
from realhf.impl.model.lora import BaseModelView


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def base_weights():
    return load_file(f"{TINY_SFT}/model.safetensors")


@pytest.mark.parametrize("shard_single_rank", [False, True], ids=["unsharded", "fsdp2"])
def test_only_adapters_train_and_the_optimizer_holds_only_them(shard_single_rank, base_weights):
    with open_engines(lora_config(shard_single_rank=shard_single_rank)) as (engine,):
        names = {id(p): n for n, p in engine.model.named_parameters()}
        in_optimizer = [names[id(p)] for g in engine.optimizer.param_groups for p in g["params"]]
        assert in_optimizer and all(".lora_A." in n or ".lora_B." in n for n in in_optimizer)
        # 7 projections x 2 layers, each with an A and a B
        assert len(in_optimizer) == 28
        assert sum(p.numel() for g in engine.optimizer.param_groups for p in g["params"]) == engine.n_trainable
        if shard_single_rank:  # the decoder layers were found inside peft's wrapper and sharded one by one
            from torch.distributed.fsdp import FSDPModule

            layers = [m for m in engine.model.modules() if type(m).__name__ == "FSDPQwen2DecoderLayer"]
            assert len(layers) == 2 and all(isinstance(m, FSDPModule) for m in layers)
        run_steps(engine, [0, 1], rank=0, world_size=1)
        params = full_params(engine)
    for hf_name, w in base_weights.items():
        key = f"base_model.model.{hf_name}"
        if key not in params:  # an adapted module's own weight and bias sit in its base_layer
            module, tensor = key.rsplit(".", 1)
            key = f"{module}.base_layer.{tensor}"
        assert torch.equal(params[key], w), f"{hf_name}: the base moved"
    assert any(float(v.abs().max()) > 0 for k, v in params.items() if ".lora_B." in k)  # B left 0: it trained


@pytest.mark.parametrize("shard_single_rank", [False, True], ids=["unsharded", "fsdp2"])
# peft's get_peft_model, called here directly, asks transformers a deprecated question.
@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
def test_published_checkpoint_is_the_merged_model_peft_computes(tmp_path, shard_single_rank):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    with open_engines(lora_config(shard_single_rank=shard_single_rank)) as (engine,):
        run_steps(engine, [0, 1], rank=0, world_size=1)
        engine.save_hf(tmp_path / "hf", tokenizer_source=TINY_SFT)
        adapters = {k: v for k, v in full_params(engine).items() if ".lora_" in k}

    # peft's own merge of the same adapters into a fresh copy of the base
    ref = get_peft_model(
        AutoModelForCausalLM.from_pretrained(TINY_SFT),
        LoraConfig(r=LORA.r, lora_alpha=LORA.alpha, target_modules=LORA.target_modules),
    )
    loaded = ref.load_state_dict(adapters, strict=False)
    assert not loaded.unexpected_keys
    expected = ref.merge_and_unload().state_dict()

    published = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    assert not [k for k in published if "lora" in k or "base_layer" in k or k.startswith("base_model")]
    assert set(published) <= set(expected)
    for k, v in published.items():
        assert torch.allclose(v, expected[k], atol=1e-5, rtol=0), f"{k}: {(v - expected[k]).abs().max()}"
    delta = (
        published["model.layers.0.self_attn.q_proj.weight"]
        - load_file(f"{TINY_SFT}/model.safetensors")["model.layers.0.self_attn.q_proj.weight"]
    )
    assert float(delta.abs().max()) > 1e-4  # the adapters are in it
    assert (tmp_path / "hf" / "tokenizer.json").is_file()


def test_merged_checkpoint_gives_the_log_probs_of_the_adapted_model(tmp_path):
    from transformers import AutoModelForCausalLM

    batch = make_batch()
    with open_engines(lora_config()) as (engine,):
        run_steps(engine, [0, 1], rank=0, world_size=1)
        adapted = engine.forward(batch, token_logprobs)  # [N, T-1]
        engine.save_hf(tmp_path / "hf")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    with torch.no_grad():
        logits = merged(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    assert torch.allclose(token_logprobs(logits, batch), adapted, atol=1e-4)


@pytest.mark.parametrize("shard_single_rank", [False, True], ids=["unsharded", "fsdp2"])
def test_reference_log_probs_with_adapters_disabled_are_the_base_model_s(shard_single_rank):
    batch = make_batch()
    base_cfg = engine_config(trainable=False)
    with open_engines(base_cfg, lora_config(shard_single_rank=shard_single_rank)) as (base, engine):
        expected = base.forward(batch, token_logprobs)  # [N, T-1] the plain SFT model
        run_steps(engine, [0, 1], rank=0, world_size=1)
        ref = BaseModelView(engine)
        before = engine.forward(batch, token_logprobs)
        reference = ref.forward(batch, token_logprobs)
        after = engine.forward(batch, token_logprobs)
        assert ref.n_params == base.n_params
    assert torch.allclose(reference, expected, atol=1e-6)
    assert float((before - expected).abs().max()) > 1e-3  # the adapters do change the policy
    assert torch.equal(before, after)  # and are back on after the reference's forward


def test_recovery_restores_adapters_and_optimizer_and_keeps_no_base_weights(tmp_path, base_weights):
    with open_engines(lora_config()) as (engine,):
        run_steps(engine, [0, 1], rank=0, world_size=1)
        recover_checkpoint.save(tmp_path / "recover", {"actor": engine}, 0, 1, engine.device, extra={"version": 2})
        run_steps(engine, [0], rank=0, world_size=1)
        continued = full_params(engine)
    keys = list(FileSystemReader(str(tmp_path / "recover" / "actor")).read_metadata().state_dict_metadata)
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all(".lora_" in k for k in model_keys), model_keys[:5]
    assert any(k.startswith("optim.state.") and "exp_avg_sq" in k for k in keys)

    with open_engines(lora_config()) as (fresh,):
        recover_checkpoint.load(tmp_path / "recover", {"actor": fresh}, 0, fresh.device)
        run_steps(fresh, [0], rank=0, world_size=1)
        resumed = full_params(fresh)
    for k, v in continued.items():
        assert torch.allclose(resumed[k], v, atol=1e-6, rtol=0), f"{k}: {(resumed[k] - v).abs().max()}"
    assert torch.equal(
        resumed["base_model.model.model.layers.0.mlp.up_proj.base_layer.weight"],
        base_weights["model.layers.0.mlp.up_proj.weight"],
    )


def test_a_target_module_the_model_lacks_is_refused_naming_it_and_the_linear_modules():
    cfg = lora_config()
    cfg.model.lora.target_modules = ["q_proj", "query_key_value"]
    with pytest.raises(ValueError) as e:
        with open_engines(cfg):
            pass
    message = str(e.value)
    assert "actor.lora.target_modules" in message and "query_key_value" in message
    assert "gate_proj" in message and "o_proj" in message  # the modules that do exist


def test_load_hf_into_a_lora_engine_is_refused(tmp_path):
    with open_engines(lora_config()) as (engine,):
        with pytest.raises(ValueError, match="LoRA"):
            engine.load_hf(TINY_SFT)


def test_a_lora_trainer_with_a_kl_term_loads_one_model_and_its_reference_is_the_base():
    from realhf.api.cli_args import ModelTrainEvalConfig, PPOHyperparameters
    from realhf.api.worker_configs import ModelWorkerConfig
    from realhf.system.trainer.ppo_actor import build_engines, reference_logprobs

    actor = ModelTrainEvalConfig(path=TINY_SFT, lora=LORA)
    cfg = ModelWorkerConfig(actor=actor, ppo=PPOHyperparameters(kl_ctl=0.1), device="cpu")
    engines = build_engines(cfg, 0, roles=["actor", "ref"])
    try:
        assert sorted(engines) == ["actor", "ref"]
        assert isinstance(engines["ref"], BaseModelView) and engines["ref"].actor is engines["actor"]
        batch = make_batch()
        run_steps(engines["actor"], [0, 1], rank=0, world_size=1)
        reference_logprobs(engines["ref"], batch, temperature=1.0)
        with open_engines(engine_config(trainable=False)) as (base,):
            expected = base.forward(batch, token_logprobs)
        assert torch.allclose(batch.ref_logprobs, expected, atol=1e-6)
    finally:
        for engine in reversed(list(engines.values())):
            engine.destroy()


def test_a_gqa_llama_with_tied_embeddings_trains_the_same_adapters_with_activation_checkpointing(tmp_path):
    """SmolLM2's shape in small (Llama, GQA, tied embeddings), sharded by FSDP2 at DP=1:
    recomputing activations in the backward makes the same adapter update."""
    from helpers.tiny_models import make_random_causal_lm

    path = make_random_causal_lm(str(tmp_path / "llama"), "llama", vocab_size=258, tie_word_embeddings=True)
    adapters = []
    for checkpointing in (False, True):
        cfg = lora_config(shard_single_rank=True)
        cfg.model.path, cfg.model.gradient_checkpointing = path, checkpointing
        with open_engines(cfg) as (engine,):
            run_steps(engine, [0, 1], rank=0, world_size=1)
            adapters.append({k: v for k, v in full_params(engine).items() if ".lora_" in k})
            engine.save_hf(tmp_path / f"hf{int(checkpointing)}")
    assert len(adapters[0]) == 28 and set(adapters[0]) == set(adapters[1])
    for k, v in adapters[0].items():
        assert torch.allclose(adapters[1][k], v, atol=1e-5, rtol=0), f"{k}: {(adapters[1][k] - v).abs().max()}"
    published = load_file(str(tmp_path / "hf1" / "model.safetensors"))
    module = "base_model.model.model.layers.1.self_attn.k_proj"  # [kv heads x head dim, hidden] under GQA
    a, b = adapters[1][f"{module}.lora_A.default.weight"], adapters[1][f"{module}.lora_B.default.weight"]
    base = load_file(f"{path}/model.safetensors")["model.layers.1.self_attn.k_proj.weight"]
    assert torch.allclose(
        published["model.layers.1.self_attn.k_proj.weight"], base + LORA.alpha / LORA.r * b @ a, atol=1e-5, rtol=0
    )
