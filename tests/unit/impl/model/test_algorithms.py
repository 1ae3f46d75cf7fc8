"""The algorithm menu's registries (realhf/impl/model/algorithms.py) against references written
as plain loops: the advantage estimators dr_grpo and batch_norm (global over two real gloo
ranks), the loss aggregations, the adaptive KL controller, and the config rules of the ppo
section that name them."""

import math

import pytest
import torch

from realhf.api import choices
from realhf.api.algorithms import ADV_ESTIMATORS as ADV_ESTIMATORS_MENU
from realhf.api.cli_args import PPOHyperparameters
from realhf.api.train_batch import TrainBatch
from realhf.experiments.validation import ConfigError, check_ppo
from realhf.impl.model import algorithms
from realhf.system.trainer import actor


def _batch(rewards, group_ids, width: int = 6, seed: int = 0) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    n = len(rewards)
    loss_mask = torch.rand(n, width - 1, generator=g) < 0.7
    loss_mask[:, 0] = True
    return TrainBatch(
        input_ids=torch.zeros(n, width, dtype=torch.long),
        attention_mask=torch.ones(n, width, dtype=torch.long),
        loss_mask=loss_mask,
        behav_logprobs=torch.zeros(n, width - 1),
        rewards=torch.tensor(rewards, dtype=torch.float32),
        group_ids=torch.tensor(group_ids),
    )


# ---- registries ---------------------------------------------------------------------------------


ADV_ESTIMATORS = ("grpo", "dr_grpo", "batch_norm", "gae", "reinforce")  # the built-ins


def test_every_choice_has_a_registry_entry_and_an_unknown_name_is_refused_naming_the_field():
    assert ADV_ESTIMATORS_MENU.names()[:5] == list(ADV_ESTIMATORS)
    assert tuple(algorithms.LOSS_AGGREGATIONS) == choices.LOSS_AGG_MODES
    with pytest.raises(ValueError, match=r"ppo.adv_estimator='grpoo': choose one of \['grpo', 'dr_grpo'"):
        algorithms.estimator("grpoo")
    with pytest.raises(ValueError, match=r"ppo.loss_agg_mode='seq-mean': choose one of \['token-mean'"):
        algorithms.aggregation("seq-mean")


def test_the_kl_is_a_loss_term_for_per_sample_estimators_and_a_reward_term_for_gae_and_reinforce():
    in_loss = {name: actor.kl_in_loss(PPOHyperparameters(adv_estimator=name, kl_ctl=0.1)) for name in ADV_ESTIMATORS}
    assert in_loss == {"grpo": True, "dr_grpo": True, "batch_norm": True, "gae": False, "reinforce": False}
    assert not actor.kl_in_loss(PPOHyperparameters(adv_estimator="batch_norm", kl_ctl=0.0))


# ---- advantages ---------------------------------------------------------------------------------


def test_dr_grpo_subtracts_the_group_mean_only():
    rewards, groups = [1.0, -1.0, -1.0, 3.0, 1.0, 1.0, -1.0], [7, 7, 7, 2, 2, 9, 9]
    batch = _batch(rewards, groups)
    adv, returns = actor.compute_advantages(batch, PPOHyperparameters(adv_estimator="dr_grpo"))
    for i in range(len(rewards)):
        members = [rewards[j] for j in range(len(rewards)) if groups[j] == groups[i]]
        want = rewards[i] - sum(members) / len(members)
        m = batch.loss_mask[i]
        assert torch.allclose(adv[i][m], torch.full((int(m.sum()),), want), atol=1e-6), i
        assert (adv[i][~m] == 0).all()
    assert torch.equal(returns, adv)


def test_batch_norm_whitens_the_rewards_over_every_sample_of_the_step():
    rewards, groups = [1.0, -1.0, -1.0, 3.0, 1.0, 1.0, -1.0], [7, 7, 7, 2, 2, 9, 9]
    batch = _batch(rewards, groups)
    cfg = PPOHyperparameters(adv_estimator="batch_norm", reward_output_scaling=2.0)
    adv, _ = actor.compute_advantages(batch, cfg)
    scores = [2.0 * r for r in rewards]
    mean = sum(scores) / len(scores)
    var = sum((s - mean) ** 2 for s in scores) / len(scores)
    for i, s in enumerate(scores):
        m = batch.loss_mask[i]
        # The groups play no part: sample 3 (3.0) and sample 5 (1.0, whose group mean is 1.0)
        # get values a group-relative estimator would not give them.
        assert torch.allclose(adv[i][m], torch.full((int(m.sum()),), (s - mean) / math.sqrt(var + 1e-5)), atol=1e-5)


def _batch_norm_on_rank(rank, world_size, init_file, shards, out_file):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        rewards, groups = shards[rank]
        adv, _ = actor.compute_advantages(
            _batch(rewards, groups, seed=rank), PPOHyperparameters(adv_estimator="batch_norm")
        )
        torch.save(adv[:, 0].clone(), f"{out_file}.{rank}")  # column 0 is trained in every row
    finally:
        dist.destroy_process_group()


@pytest.mark.system
def test_batch_norm_statistics_are_global_across_dp_ranks(tmp_path):
    # Rank 1's rewards are all higher: local statistics would give each rank mean-zero advantages.
    shards = [([1.0, -1.0, -1.0, -1.0], [0, 0, 1, 1]), ([3.0, 1.0, 3.0], [2, 2, 3])]
    torch.multiprocessing.spawn(
        _batch_norm_on_rank, args=(2, str(tmp_path / "init"), shards, str(tmp_path / "out")), nprocs=2
    )
    got = torch.cat([torch.load(tmp_path / f"out.{r}") for r in range(2)])
    whole = [r for rewards, _ in shards for r in rewards]
    mean = sum(whole) / len(whole)
    std = math.sqrt(sum((r - mean) ** 2 for r in whole) / len(whole) + 1e-5)
    assert torch.allclose(got, torch.tensor([(r - mean) / std for r in whole]), atol=1e-5)


# ---- loss aggregation ---------------------------------------------------------------------------


def _reference_aggregate(loss, mask, mode) -> float:
    """The minibatch loss written out: token-mean over all trained tokens, or the mean over
    sequences (with at least one trained token) of each one's token mean or token sum."""
    tokens, per_seq = [], []
    for i in range(loss.shape[0]):
        row = [float(loss[i, t]) for t in range(loss.shape[1]) if mask[i, t]]
        tokens += row
        if row:
            per_seq.append(sum(row) / len(row) if mode == "seq-mean-token-mean" else sum(row))
    if mode == "token-mean":
        return sum(tokens) / len(tokens)
    return sum(per_seq) / len(per_seq)


@pytest.mark.parametrize("mode", choices.LOSS_AGG_MODES)
def test_each_aggregation_over_any_split_of_the_rows_is_the_reference_mean(mode):
    """The engine divides Σ loss_sum by Σ weight over micro-batches and DP ranks, which split a
    minibatch by rows: every split must give the reference."""
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(9, 8, generator=g) < 0.6
    mask[4] = False  # a row without trained tokens counts as no sequence
    loss = torch.where(mask, torch.randn(9, 8, generator=g, dtype=torch.float64), torch.zeros((), dtype=torch.float64))
    agg = algorithms.aggregation(mode)
    want = _reference_aggregate(loss, mask, mode)
    for split in ([9], [4, 5], [1, 3, 2, 3]):
        parts = torch.arange(9).split(split)
        total = sum(float(agg.loss_sum(loss[p], mask[p])) for p in parts)
        weight = sum(agg.weight(mask[p]) for p in parts)
        assert total / weight == pytest.approx(want, abs=1e-12), split
    if mode != "token-mean":  # the modes really differ on ragged rows
        assert want != pytest.approx(_reference_aggregate(loss, mask, "token-mean"), abs=1e-6)


# ---- the KL coefficient -------------------------------------------------------------------------


def test_the_adaptive_kl_controller_follows_the_proportional_rule_and_saves_its_state():
    ctl = algorithms.KLController(0.1, kl_target=0.02, kl_horizon=1000)
    want = 0.1
    for kl, n in ((0.03, 128), (0.5, 128), (0.0, 64), (0.019, 128)):
        ctl.update(kl, n)
        error = min(max(kl / 0.02 - 1, -0.2), 0.2)  # 0.5 and 0.0 hit the clip
        want *= 1 + error * n / 1000
        assert ctl.value == pytest.approx(want, rel=1e-12)
    state = ctl.state_dict()
    fresh = algorithms.KLController(0.1, kl_target=0.02, kl_horizon=1000)
    fresh.load_state_dict(state)
    assert fresh.value == ctl.value != 0.1
    fixed = algorithms.KLController(0.1)  # kl_target 0: kl_ctl throughout, and a saved value is not restored
    fixed.update(5.0, 128)
    fixed.load_state_dict(state)
    assert fixed.value == 0.1


# ---- config rules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(policy_loss="trpo"), "ppo.policy_loss='trpo': choose one of ['ppo', 'gspo', 'cpgd', 'gpg']"),
        (dict(loss_agg_mode="seq-sum"), "ppo.loss_agg_mode='seq-sum': choose one of"),
        (dict(adv_estimator="drgrpo"), "ppo.adv_estimator='drgrpo': choose one of"),
        (dict(policy_loss="gpg", c_clip=3.0), "ppo.c_clip=3.0: the dual clip bounds a clipped loss"),
        (dict(entropy_coef=-0.01), "ppo.entropy_coef must be >= 0"),
        (dict(kl_target=0.01), "ppo.kl_target=0.01 adapts the KL coefficient starting from ppo.kl_ctl"),
        (dict(kl_target=0.01, kl_ctl=0.1, kl_horizon=0), "ppo.kl_horizon must be > 0"),
        (dict(kl_target=-1.0), "ppo.kl_target must be >= 0"),
    ],
)
def test_menu_values_that_cannot_run_are_refused_naming_the_field(fields, message):
    with pytest.raises(ConfigError) as e:
        check_ppo(PPOHyperparameters(**fields))
    assert message in str(e.value)


def test_every_menu_choice_passes_the_rules():
    for name in ("ppo", "gspo", "cpgd", "gpg"):
        check_ppo(PPOHyperparameters(policy_loss=name))
    for name in choices.LOSS_AGG_MODES:
        check_ppo(PPOHyperparameters(loss_agg_mode=name))
    for name in ADV_ESTIMATORS:
        check_ppo(PPOHyperparameters(adv_estimator=name))
    check_ppo(PPOHyperparameters(kl_ctl=0.1, kl_target=0.02, entropy_coef=0.01, policy_loss="gspo", c_clip=3.0))


# ---- a user's own loss and estimator (realhf.api.algorithms) -------------------------------------


def test_a_users_own_policy_loss_from_their_module_is_wrapped_like_the_built_ins():
    from helpers.user_algorithms import sigmoid_ratio
    from realhf.impl.model.utils.ppo_functional import actor_loss_fn

    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(3, 5, generator=g, dtype=torch.float64)).requires_grad_()
    old = logp.detach() + 0.2 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    prox = logp.detach() + 0.1 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    adv = torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.rand(3, 5, generator=g) > 0.3
    for name in ("helpers.user_algorithms:sigmoid_ratio", "helpers.user_algorithms:SIGMOID", "sigmoid"):
        loss, stats = actor_loss_fn(logp, old, adv, 0.2, mask, proximal_logprobs=prox, policy_loss=name)
        # The trainer's wrapping: the behaviour weight exp(prox - old), the mask, the token mean.
        per_token = sigmoid_ratio(logp - prox, adv, 0.2, 0.2)[0] * torch.exp(prox - old)
        want = per_token[mask].sum() / mask.sum()
        assert torch.allclose(loss, want), name
        assert float(stats["clip_fraction"]) == 0.0
    (grad,) = torch.autograd.grad(loss, logp)
    (want_grad,) = torch.autograd.grad(want, logp)
    assert torch.allclose(grad, want_grad)


def test_a_users_policy_loss_and_estimator_pass_validation_and_bad_ones_are_refused_naming_the_field():
    check_ppo(
        PPOHyperparameters(
            policy_loss="helpers.user_algorithms:sigmoid_ratio", adv_estimator="helpers.user_algorithms:rloo"
        )
    )
    with pytest.raises(
        ConfigError, match=r"ppo.c_clip=3.0: .*ppo.policy_loss=helpers.user_algorithms:SIGMOID has none"
    ):
        check_ppo(PPOHyperparameters(policy_loss="helpers.user_algorithms:SIGMOID", c_clip=3.0))
    with pytest.raises(ConfigError, match=r"ppo.policy_loss='no_such_pkg.losses:mine': no module 'no_such_pkg'"):
        check_ppo(PPOHyperparameters(policy_loss="no_such_pkg.losses:mine"))
    with pytest.raises(ConfigError, match=r"module 'helpers.user_algorithms' has no attribute 'nope'"):
        check_ppo(PPOHyperparameters(adv_estimator="helpers.user_algorithms:nope"))


def test_a_users_estimator_gives_one_advantage_per_sample():
    from helpers.user_algorithms import rloo

    est = algorithms.estimator("helpers.user_algorithms:rloo")
    assert est.per_sample is rloo and not est.needs_critic and not est.kl_in_reward
    adv = est.per_sample(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 0, 1, 1]))
    assert torch.allclose(adv, torch.tensor([1.0, -0.5, -0.5, 0.0, 0.0]))


@pytest.mark.system
def test_the_master_and_the_ppo_checks_choose_every_built_in_without_importing_torch():
    # A built-in's flags are declared in realhf.api.algorithms; its function is imported at its
    # first call. torch costs 2-3 s of CPU in the launcher and in the master (measured 2.6 s).
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from realhf.api.cli_args import PPOHyperparameters\n"
        "from realhf.experiments.validation import check_ppo\n"
        "from realhf.system.trainer.ppo_step import build_graph\n"
        "from realhf.system import worker_class\n"
        "worker_class('master_worker')\n"
        f"for est in {ADV_ESTIMATORS!r}:\n"
        "    for loss in ('ppo', 'gspo', 'cpgd', 'gpg'):\n"
        "        c = PPOHyperparameters(adv_estimator=est, policy_loss=loss)\n"
        "        check_ppo(c)\n"
        "        print(est, loss, build_graph(c).names())\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "False", out.stdout
    assert "gae ppo ['actor_inf', 'critic_inf', 'advantages', 'critic_train', 'actor_train']" in lines
    assert "grpo gpg ['actor_inf', 'advantages', 'actor_train']" in lines


def test_a_built_in_runs_its_function_from_where_it_is_defined():
    spec = ADV_ESTIMATORS_MENU.get("dr_grpo")
    scores, groups = torch.tensor([1.0, 0.0, 2.0, 2.0]), torch.tensor([0, 0, 1, 1])
    assert torch.equal(spec.per_sample(scores, groups), torch.tensor([0.5, -0.5, 0.0, 0.0]))
    assert spec.per_sample.path == "realhf.impl.model.algorithms:dr_grpo_advantages"
    assert ADV_ESTIMATORS_MENU.get("gae").needs_critic and ADV_ESTIMATORS_MENU.get("gae").per_sample is None
