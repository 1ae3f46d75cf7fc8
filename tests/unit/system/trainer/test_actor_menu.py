"""The algorithm menu inside a train step, on the real tiny model and a real FSDPEngine at DP=1:
the entropy (against a plain per-position reference) and its bonus, the loss aggregations
through the engine's weight contract, the adaptive KL coefficient a PPOActor carries from step
to step, logs, and keeps across a recovery checkpoint. No processes, no sockets."""

import pytest
import torch

from helpers.fsdp_ranks import open_engines
from helpers.trajectories import TINY_SFT, flat_params, load_rows, make_groups, pack
from realhf.api.choices import LOSS_AGG_MODES
from realhf.api.cli_args import ModelTrainEvalConfig, OptimizerConfig, PPOHyperparameters
from realhf.impl.engine.fsdp_engine import FSDPEngineConfig
from realhf.impl.model import recover_checkpoint
from realhf.impl.model.batching import micro_batches, minibatch_rows
from realhf.system.trainer import actor
from realhf.system.trainer.ppo_actor import PPOActor


def _config(lr: float = 1e-3, micro_batch_tokens: int = 0) -> FSDPEngineConfig:
    optimizer = OptimizerConfig(lr=lr, gradient_clipping=1.0)
    return FSDPEngineConfig(
        model=ModelTrainEvalConfig(path=TINY_SFT, optimizer=optimizer),
        device="cpu",
        micro_batch_tokens=micro_batch_tokens,
        shared_prompt=False,
    )


@pytest.fixture(scope="module")
def msgs(tiny):
    model, tok = tiny
    return make_groups(model, tok, load_rows(4), group_size=4)


def _logprobs(engine, batch):
    return engine.forward(batch, lambda out, mb: actor.token_logprobs(out, mb))


def _steps(engine, batch, cfg, kl_coef=None):
    """What PPOActor.train_step does (without the deferral), returning the step's stats."""
    batch.advantages, batch.returns = actor.compute_advantages(batch, cfg, kl_coef)
    loss = actor.ActorLoss(batch, cfg, kl_coef)
    weight = 0.0
    for rows in minibatch_rows(batch, cfg.ppo_n_minibatches):
        weight += engine.train_batch(batch.select(rows), loss.for_rows(rows), loss.weight)["loss_weight"]
    return {**loss.global_stats(weight), "weight": weight}


# ---- entropy --------------------------------------------------------------------------------------


def test_entropy_is_that_of_the_temperature_scaled_distribution_and_zero_on_padding(tiny, msgs):
    model, _ = tiny
    batch = pack(msgs[:2])
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits  # [N, T, V]
    logp, entropy = actor.token_logprobs_and_entropy(logits, batch, temperature=0.7)
    assert torch.equal(logp, actor.token_logprobs(logits, batch, temperature=0.7))
    for i in range(batch.n_seqs):
        for j in range(batch.input_ids.shape[1] - 1):
            if not batch.attention_mask[i, j + 1]:
                assert entropy[i, j] == 0
                continue
            p = torch.softmax(logits[i, j].double() / 0.7, dim=0)
            want = -sum(float(q) * float(torch.log(q)) for q in p if q > 0)
            assert float(entropy[i, j]) == pytest.approx(want, abs=1e-4), (i, j)


def test_entropy_is_logged_always_and_the_bonus_alone_raises_it(msgs):
    """With zero advantages and no KL the policy loss has no gradient: the bonus is the only
    force, and one step with it raises the entropy of the batch's positions; without it the
    weights do not move at all."""
    results = {}
    for coef in (0.0, 0.5):
        batch = pack(msgs)
        cfg = PPOHyperparameters(ppo_n_minibatches=1, entropy_coef=coef, reward_output_scaling=0.0)
        with open_engines(_config(lr=1e-3)) as (engine,):

            def mean_entropy(batch=batch):
                h = engine.forward(batch, lambda out, mb: actor.token_logprobs_and_entropy(out, mb)[1])
                return float(h[batch.loss_mask].mean())

            before, params = mean_entropy(), flat_params(engine)
            batch.prox_logprobs = _logprobs(engine, batch)
            stats = _steps(engine, batch, cfg)
            results[coef] = (before, mean_entropy(), stats, float((flat_params(engine) - params).abs().max()))
    (before0, after0, stats0, moved0), (before, after, stats, moved) = results[0.0], results[0.5]
    assert stats0["entropy"] == pytest.approx(before0, rel=1e-4)  # logged without a bonus too
    assert moved0 == 0.0 and after0 == before0
    assert stats["loss"] == pytest.approx(-0.5 * before, rel=1e-4)  # −coef·H, token-mean
    assert moved > 0 and after > before + 1e-3, (before, after)


# ---- loss aggregation through the engine ---------------------------------------------------------


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_aggregation_gives_the_same_update_whole_or_in_micro_batches_and_the_reference_loss(msgs, mode):
    """Micro-batches split a minibatch by rows exactly as DP ranks do, and the engine divides
    their summed losses by their summed weights: the update must not depend on the split."""
    results = []
    for budget in (0, 90):
        batch = pack(msgs)
        cfg = PPOHyperparameters(ppo_n_minibatches=1, loss_agg_mode=mode, kl_ctl=0.1)
        assert budget == 0 or len(micro_batches(batch, torch.arange(batch.n_seqs), budget)) > 2
        with open_engines(_config(micro_batch_tokens=budget)) as (engine,):
            batch.prox_logprobs = _logprobs(engine, batch)
            batch.ref_logprobs = batch.prox_logprobs - 0.05
            stats = _steps(engine, batch, cfg)
            results.append((flat_params(engine), stats))
    (w_whole, s_whole), (w_mb, s_mb) = results
    assert torch.allclose(w_whole, w_mb, atol=2e-5)
    assert s_whole["loss"] == pytest.approx(s_mb["loss"], rel=1e-4, abs=1e-6)
    # Before the step the ratio is 1, so each token's loss is −A + kl_ctl·k3(logp ‖ ref): the
    # reported loss is that, aggregated as the mode says (a sequence is a row with trained tokens).
    m = batch.loss_mask
    k3 = torch.exp(torch.tensor(-0.05)) - 1 + 0.05
    per_token = torch.where(m, -batch.advantages + 0.1 * k3, torch.zeros(()))
    seqs = [i for i in range(batch.n_seqs) if m[i].any()]
    if mode == "token-mean":
        want = float(per_token.sum()) / int(m.sum())
        assert s_whole["weight"] == int(m.sum())
    else:
        per_seq = [float(per_token[i].sum()) / (int(m[i].sum()) if mode == "seq-mean-token-mean" else 1) for i in seqs]
        want = sum(per_seq) / len(seqs)
        assert s_whole["weight"] == len(seqs)
    assert s_whole["loss"] == pytest.approx(want, abs=1e-5)
    assert s_whole["n_tokens"] == int(m.sum())


# ---- the adaptive KL coefficient ------------------------------------------------------------------


def test_the_actor_adapts_logs_and_recovers_its_kl_coefficient(msgs, tmp_path):
    cfg = PPOHyperparameters(ppo_n_minibatches=2, kl_ctl=0.1, kl_target=0.001, kl_horizon=200)
    with open_engines(_config(lr=1e-4), _config(lr=1e-4)) as (engine, fresh_engine):
        trainer = PPOActor(engine, cfg)
        coefs, kls = [], []
        for _ in range(2):
            batch = pack(msgs)
            trainer.compute_logprobs(batch)
            batch.ref_logprobs = batch.prox_logprobs - 0.3  # far above the target: the coefficient grows
            stats = trainer.train_step(batch)
            coefs.append(stats["kl_coef"])
            kls.append(stats["kl_ref"])
        # The step's measured KL (k3 of the 0.3 offset ≈ 0.05) is far above 0.001: +20% per
        # 200 samples, 16 samples a step.
        assert kls[0] > 0.01
        assert coefs[0] == 0.1
        assert coefs[1] == pytest.approx(0.1 * (1 + 0.2 * batch.n_seqs / 200), rel=1e-9)
        assert trainer.kl.value == pytest.approx(coefs[1] * (1 + 0.2 * batch.n_seqs / 200), rel=1e-9)

        # The model worker's recovery checkpoint carries PPOActor.state_dict() in its info.
        path = tmp_path / "recover"
        recover_checkpoint.save(
            path, {"actor": engine}, 0, 1, engine.device, extra={"version": 2, "actor_state": trainer.state_dict()}
        )
        resumed = PPOActor(fresh_engine, cfg)
        info = recover_checkpoint.load(path, {"actor": fresh_engine}, 0, fresh_engine.device)
        resumed.load_state_dict(info["actor_state"])
        assert resumed.kl.value == trainer.kl.value != 0.1


def test_a_fixed_kl_coefficient_is_logged_and_stays(msgs):
    cfg = PPOHyperparameters(ppo_n_minibatches=1, kl_ctl=0.1)
    with open_engines(_config(lr=1e-4)) as (engine,):
        trainer = PPOActor(engine, cfg)
        batch = pack(msgs)
        trainer.compute_logprobs(batch)
        batch.ref_logprobs = batch.prox_logprobs - 0.3
        stats = trainer.train_step(batch)
    assert stats["kl_coef"] == 0.1 and trainer.kl.value == 0.1 and stats["kl_ref"] > 0.01
