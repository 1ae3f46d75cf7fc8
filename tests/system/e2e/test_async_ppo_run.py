"""The whole system on real processes: Redis, a native generation server, the manager, two
rollout workers, a model worker and the master, driven by training/main_async_ppo.py."""

import os

import pytest

from helpers.paths import TESTS_DIR
from helpers.training_runs import run_training
from helpers.training_runs import trial_processes as _trial_processes

ETA = 2  # small, so that the run reaches the bound within a short test


def _check_run(proc, metrics, steps, eta, tmp_path):
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert [m["step"] for m in metrics] == list(range(1, steps + 1)), out[-3000:]
    # No trained group was more than η versions behind the trainer.
    assert max(m["head_offpolicyness_max"] for m in metrics) <= eta
    # Weight updates reached the generation server: late batches hold no version-0 tokens.
    last = metrics[-1]
    assert last["version"] == steps
    assert last["version"] - last["head_offpolicyness_max"] >= steps - eta > 0
    assert "reward curve" in proc.stdout
    # Piped output: the curves PNG is saved, and no progress bar is drawn (test_watching_a_run.py: a terminal).
    assert "reward and accuracy curves (PNG): " in proc.stdout and " ETA " not in proc.stdout
    assert _trial_processes(str(tmp_path)) == []


def _reward_gain(metrics, n=20):
    first = sum(m["reward_mean"] for m in metrics[:n]) / n
    final = sum(m["reward_mean"] for m in metrics[-n:]) / n
    print(f"reward: first {n} steps {first:+.3f}, last {n} steps {final:+.3f}")
    return first, final


@pytest.mark.e2e
def test_async_run_learns_respects_staleness_updates_servers_and_leaves_nothing(tmp_path, no_leftover_processes):
    steps = 100
    proc, metrics, _ = run_training(tmp_path, "e2e", f"exp_ctrl.benchmark_steps={steps}",
                                    f"max_head_offpolicyness={ETA}", "evaluation.n_prompts=0")
    _check_run(proc, metrics, steps, ETA, tmp_path)
    assert any(m["head_offpolicyness_max"] > 0 for m in metrics)  # it did run ahead of the trainer
    # A clear rise of the training reward (±1 per answer): measured +0.10 to +0.2 over 100 steps
    # of the default; noise of the difference of two 20-step means is about 0.045.
    first, final = _reward_gain(metrics)
    assert final >= first + 0.05, f"reward did not rise: first 20 steps {first:+.3f}, last 20 {final:+.3f}"


@pytest.mark.e2e
def test_synchronous_baseline_trains_only_on_the_current_version(tmp_path, no_leftover_processes):
    steps = 10
    proc, metrics, _ = run_training(tmp_path, "sync", f"exp_ctrl.benchmark_steps={steps}",
                                    "max_head_offpolicyness=0", "ppo.use_decoupled_loss=false",
                                    "evaluation.n_prompts=0")
    _check_run(proc, metrics, steps, 0, tmp_path)
    assert all(m["head_offpolicyness_max"] == 0 for m in metrics)


@pytest.mark.e2e
@pytest.mark.slow
def test_async_run_raises_the_reward(tmp_path, no_leftover_processes):
    steps = 300
    proc, metrics, _ = run_training(tmp_path, "learn", f"exp_ctrl.benchmark_steps={steps}",
                                    "evaluation.n_prompts=0", timeout=1800)
    _check_run(proc, metrics, steps, 4, tmp_path)
    # NOTES' criterion: mean reward of the last 20 steps ≥ mean of the first 20 + 0.08.
    first, final = _reward_gain(metrics)
    assert final >= first + 0.08, f"reward did not rise: first 20 steps {first:+.3f}, last 20 {final:+.3f}"


CRITIC_RUN = ["ppo.adv_estimator=gae", "ppo.adv_norm=true", "critic.optimizer.lr=5e-4", "evaluation.n_prompts=0"]


@pytest.mark.e2e
def test_ppo_with_a_critic_at_dp2_warms_the_critic_up_then_trains_both(tmp_path, no_leftover_processes):
    steps, warmup = 12, 3
    proc, metrics, _ = run_training(tmp_path, "critic", f"exp_ctrl.benchmark_steps={steps}", *CRITIC_RUN,
                                    f"ppo.critic_warmup_steps={warmup}", "allocation_mode=native.d1m1p1+d2m1p1",
                                    f"max_head_offpolicyness={ETA}")
    _check_run(proc, metrics, steps, ETA, tmp_path)
    out = proc.stdout + proc.stderr
    assert "actor_inf -> ref_inf -> critic_inf -> critic_train -> actor_train" in out
    assert all(m.get("actor_frozen") == 1.0 and "loss" not in m for m in metrics[:warmup])
    assert all("loss" in m and "actor_frozen" not in m for m in metrics[warmup:])
    assert all(m["value_loss"] > 0 and "critic_inf_value_mean" in m for m in metrics)
    # The value head starts random (values near 0, returns near ±1): within a few steps it
    # predicts the returns better than it did at the start.
    first, last = metrics[0]["value_abs_error"], sum(m["value_abs_error"] for m in metrics[-4:]) / 4
    print(f"critic |V - R|: step 1 {first:.3f}, last 4 steps {last:.3f}")
    assert last < 0.9 * first, (first, last)


@pytest.mark.e2e
@pytest.mark.slow
def test_ppo_with_a_critic_raises_the_success_rate(tmp_path, no_leftover_processes):
    steps = 150
    proc, metrics, _ = run_training(tmp_path, "critic-learn", f"exp_ctrl.benchmark_steps={steps}", *CRITIC_RUN,
                                    "ppo.critic_warmup_steps=10", timeout=1800)
    _check_run(proc, metrics, steps, 4, tmp_path)
    first = sum(m["success_rate"] for m in metrics[:20]) / 20
    final = sum(m["success_rate"] for m in metrics[-20:]) / 20
    print(f"success rate with a critic (gae): first 20 steps {first:.3f}, last 20 {final:.3f}")
    assert final >= first + 0.05, (first, final)


@pytest.mark.e2e
def test_a_failing_worker_stops_the_whole_run_and_names_itself(tmp_path, no_leftover_processes):
    # A user environment that raises when it starts: the rollout workers fail after the config
    # check passed; with restarts off the first death ends the run, naming worker, file and line.
    env = dict(os.environ, PYTHONPATH=TESTS_DIR)
    proc, metrics, log_dir = run_training(tmp_path, "fail", "rollout.env.type=helpers.broken_env:BrokenEnv",
                                          "cluster.restart_policy.rollout_worker=false", "evaluation.n_prompts=0",
                                          timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "rollout_worker/" in out and "failed" in out
    assert "broken_env.py\", line 9" in out and "failed to start (on purpose)" in out  # the log tail
    assert metrics == []
    assert _trial_processes(str(tmp_path)) == []
