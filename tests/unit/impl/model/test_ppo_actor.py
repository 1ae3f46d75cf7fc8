"""PPOActor on the real tiny model: the proximal log-prob deferral it carries from `inference` to
`train_step`, the reference it loads only for a KL term, and resuming from a recovery checkpoint.
No processes, no sockets."""

import dataclasses

import pytest
import torch

from realhf.api.cli_args import ModelTrainEvalConfig, OptimizerConfig, PPOHyperparameters
from realhf.api.trajectory import Trajectory
from realhf.api.worker_configs import ModelWorkerConfig
from realhf.impl.model.actor import first_minibatch_rows
from realhf.impl.model.batching import pack_trajectories
from realhf.impl.model.ppo_actor import PPOActor

from helpers.trajectories import TINY_SFT, load_rows, load_tiny, make_groups


@pytest.fixture(scope="module")
def msgs():
    torch.set_num_threads(1)
    model, tok = load_tiny()
    return make_groups(model, tok, load_rows(3), group_size=4)


def _batch(msgs):
    return pack_trajectories([Trajectory.from_msg(m) for m in msgs], pad_id=0)


def _trainer(**ppo) -> PPOActor:
    torch.manual_seed(0)
    model, _ = load_tiny()
    return PPOActor(model, None, PPOHyperparameters(ppo_n_minibatches=2, **ppo), OptimizerConfig(lr=1e-3), 0)


def _weights(trainer: PPOActor) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in trainer.actor.parameters()])


def test_actor_inference_leaves_the_first_minibatch_to_the_train_forward_with_the_same_update(msgs):
    results = []
    for defer in (False, True):
        trainer = _trainer()
        assert trainer.can_defer_prox  # the tiny model has no dropout, GRPO needs no proximal before training
        trainer.can_defer_prox = defer
        batch = _batch(msgs)
        inf = trainer.inference(batch, "actor")
        first = first_minibatch_rows(batch.n_seqs, 2)
        skipped = int(batch.loss_mask[first].sum())
        assert inf["n_tokens"] == batch.n_tokens - (skipped if defer else 0)
        assert (batch.prox_logprobs[first].abs().sum() == 0) == defer
        stats = trainer.train_step(batch)
        results.append((_weights(trainer), stats, batch.prox_logprobs))
    (w_full, s_full, p_full), (w_def, s_def, p_def) = results
    assert torch.allclose(p_full, p_def, atol=1e-5)  # the train forward filled the skipped rows in
    assert torch.allclose(w_full, w_def, atol=1e-6)
    assert s_full.keys() == s_def.keys()
    assert s_full["importance_ratio"] == pytest.approx(s_def["importance_ratio"], abs=1e-5)


def test_a_deferral_belongs_to_the_batch_it_was_made_for(msgs):
    # Plain PPO on the behaviour log-probs: a batch trained without actor_inf has no proximal
    # log-probs, and must not inherit the deferral of a batch that had one.
    trainer = _trainer(use_decoupled_loss=False, recompute_logprob=False)
    trainer.inference(_batch(msgs[:2]), "actor")
    other = _batch(msgs[1:])
    stats = trainer.train_step(other)
    assert other.prox_logprobs is None and stats["n_tokens"] == other.n_tokens


def test_kl_reward_through_gae_needs_the_proximal_logprobs_up_front():
    assert not _trainer(group_adv_norm=False, kl_ctl=0.1).can_defer_prox
    assert _trainer(group_adv_norm=True, kl_ctl=0.1).can_defer_prox


def test_reference_inference_needs_a_reference_and_a_known_role(msgs):
    trainer = _trainer()
    with pytest.raises(ValueError, match="no reference model is loaded"):
        trainer.inference(_batch(msgs), "ref")
    with pytest.raises(ValueError, match="model must be 'actor' or 'ref', got 'critic'"):
        trainer.inference(_batch(msgs), "critic")


def _config(run_dir, **ppo) -> ModelWorkerConfig:
    return ModelWorkerConfig(actor=ModelTrainEvalConfig(path=TINY_SFT, optimizer=OptimizerConfig(lr=1e-3)),
                             ppo=PPOHyperparameters(**ppo), run_dir=str(run_dir))


def test_the_reference_is_loaded_frozen_and_only_for_a_kl_term(tmp_path):
    assert PPOActor.from_config(_config(tmp_path)).ref is None
    trainer = PPOActor.from_config(_config(tmp_path, kl_ctl=0.1))
    assert not trainer.ref.training and not any(p.requires_grad for p in trainer.ref.parameters())
    assert all(p.requires_grad for p in trainer.actor.parameters())
    assert trainer.recovered is None


def test_resuming_takes_weights_optimizer_and_version_from_the_recovery_checkpoint(msgs, tmp_path):
    cfg = _config(tmp_path)
    trainer = PPOActor.from_config(cfg, recover_path=tmp_path / "none-yet")  # nothing to resume: a fresh start
    assert trainer.recovered is None
    batch = _batch(msgs)
    trainer.inference(batch, "actor")
    trainer.train_step(batch)
    trainer.save_recover_state(tmp_path / "rec", version=3, tokenizer_source=TINY_SFT, extra={"step": 3})

    resumed = PPOActor.from_config(cfg, recover_path=tmp_path / "rec")
    assert resumed.recovered["version"] == 3 and resumed.recovered["step"] == 3
    assert torch.equal(_weights(resumed), _weights(trainer))
    assert resumed.lr_scheduler.last_epoch == trainer.lr_scheduler.last_epoch == 2  # two minibatches
    s1, s2 = trainer.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert s1.keys() == s2.keys() and all(torch.equal(s1[k]["exp_avg"], s2[k]["exp_avg"]) for k in s1)


def test_the_actor_loads_in_the_configured_dtype(tmp_path):
    cfg = _config(tmp_path)
    cfg = dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, dtype="bfloat16"))
    assert next(PPOActor.from_config(cfg).actor.parameters()).dtype == torch.bfloat16
