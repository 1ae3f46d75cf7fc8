"""Which versions the evaluator takes and evaluates (realhf/system/evaluator/eval_schedule.py), the hard links
that keep a taken version through the trainer's prune, pass@k, and how the experiment launches
the evaluator (only with exp_ctrl.eval_freq_steps > 0)."""

import os

import pytest

from helpers.paths import REPO
from realhf.impl.model.checkpoint import prune_versions
from realhf.system.evaluator.eval_schedule import EvalSchedule, take_version
from realhf.system.evaluator.pass_at_k import pass_at_k


def _publish(root, version, weights=b"w" * 1000):
    d = root / str(version)
    d.mkdir(parents=True)
    (d / "config.json").write_text('{"v": %d}' % version)
    (d / "model.safetensors").write_bytes(weights)
    return d


# ---- the schedule (no I/O) ----------------------------------------------------------------------


def test_only_multiples_of_n_are_due_and_each_is_taken_once():
    s = EvalSchedule(every=4)
    assert [s.to_take(v) for v in (0, 1, 3)] == [None, None, None]
    assert s.to_take(4) == 4
    s.took(4, ok=True)
    assert s.to_take(4) is None and s.to_take(7) is None  # taken already; 8 not reached
    assert s.to_take(9) == 8


def test_a_free_evaluator_evaluates_the_newest_waiting_version_and_reports_the_skipped_ones():
    s = EvalSchedule(every=4)
    for v in (4, 8, 12):  # all three seen while one evaluation ran
        s.took(s.to_take(v), ok=True)
    pick = s.next()
    assert (pick.version, pick.skipped, pick.release) == (12, [4, 8], [4, 8])
    assert s.next() is None  # nothing waits any more
    s.took(s.to_take(16), ok=True)
    pick = s.next()
    assert (pick.version, pick.skipped) == (16, [])


def test_versions_passed_unseen_or_pruned_before_they_were_taken_are_skipped_not_retried():
    s = EvalSchedule(every=4)
    assert s.to_take(10) == 8  # the trainer went 3 -> 10 between two reads: 4 was never seen
    s.took(8, ok=False)  # and 8 was pruned before it could be linked
    assert s.to_take(11) is None and s.next() is None
    s.took(s.to_take(12), ok=True)
    assert s.next().skipped == [4, 8]


def test_a_restarted_evaluator_carries_on_after_its_last_recorded_version():
    s = EvalSchedule(every=4, evaluated=8)
    assert s.to_take(9) is None and s.to_take(12) == 12


# ---- hard links (real files) ---------------------------------------------------------------------


def test_a_taken_version_survives_the_trainers_prune(tmp_path):
    published = tmp_path / "published_weights" / "actor"
    _publish(published, 4, weights=b"version four")
    assert take_version(published / "4", tmp_path / "evaluator" / "4")
    for v in (5, 6):
        _publish(published, v)
    assert 4 in prune_versions(published, keep=2)  # the trainer's own prune, as after each step
    assert not (published / "4").exists()
    taken = tmp_path / "evaluator" / "4"
    assert (taken / "model.safetensors").read_bytes() == b"version four"
    assert (taken / "config.json").read_text() == '{"v": 4}'
    assert os.stat(taken / "model.safetensors").st_nlink == 1  # a link, not a copy: now the only name
    assert sorted(p.name for p in (tmp_path / "evaluator").iterdir()) == ["4"]  # no .tmp- left


def test_linking_copies_no_bytes(tmp_path):
    published = tmp_path / "published"
    src = _publish(published, 8)
    take_version(src, tmp_path / "taken" / "8")
    assert os.stat(tmp_path / "taken" / "8" / "model.safetensors").st_ino == os.stat(src / "model.safetensors").st_ino


def test_a_version_pruned_before_it_is_taken_leaves_nothing(tmp_path):
    (tmp_path / "taken").mkdir()
    assert not take_version(tmp_path / "published" / "4", tmp_path / "taken" / "4")
    assert not (tmp_path / "taken" / "4").exists()
    assert [p.name for p in (tmp_path / "taken").iterdir()] == []


def test_a_directory_without_its_config_is_not_a_whole_version(tmp_path):
    d = _publish(tmp_path / "published", 4)
    (d / "config.json").unlink()  # what a prune half-way through leaves
    assert not take_version(d, tmp_path / "taken" / "4")
    assert not (tmp_path / "taken" / "4").exists()


# ---- pass@k -------------------------------------------------------------------------------------


def test_pass_at_k_counts_prompts_with_at_least_one_right_answer():
    assert pass_at_k([0, 1, 2]) == pytest.approx(2 / 3)  # right answers per prompt, of k each
    assert pass_at_k([0, 0]) == 0.0 and pass_at_k([3]) == 1.0
    with pytest.raises(ValueError, match="no prompts"):
        pass_at_k([])


# ---- launch ------------------------------------------------------------------------------------


@pytest.fixture
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)


def test_the_evaluator_is_launched_only_when_asked_for_with_the_root_values(_repo_cwd):
    from realhf.experiments.async_ppo import initial_setup
    from realhf.experiments.config_loading import compose_config

    off = {s.worker_type for s in initial_setup(compose_config(["trial_name=t"]))}
    assert "evaluator" not in off
    cfg = compose_config(
        [
            "trial_name=t",
            "exp_ctrl.eval_freq_steps=4",
            "evaluation.during_n_prompts=16",
            "evaluation.during_samples=2",
            "evaluation.sampled_temperature=0.7",
            "seed=7",
        ]
    )
    specs = {s.worker_type: s for s in initial_setup(cfg)}
    spec = specs["evaluator"]
    ev = spec.configs[0]
    assert spec.count == 1 and spec.restart and spec.cpus == 0  # restartable; holds no CPU on Ray
    assert (ev.eval_freq_steps, ev.n_prompts, ev.samples, ev.temperature, ev.seed) == (4, 16, 2, 0.7, 7)
    assert (ev.nice, ev.n_threads) == (10, 1)
    assert ev.run_dir == specs["model_worker"].configs[0].run_dir  # where the trainer publishes
    assert ev.metrics_path == os.path.join(specs["master_worker"].configs[0].log_dir, "eval_metrics.jsonl")
    assert specs["master_worker"].configs[0].expected_workers["evaluator"] == 1  # named in stall reports


@pytest.mark.parametrize(
    "override, field",
    [
        ("evaluation.during_nice=20", "evaluation.during_nice"),
        ("evaluation.during_samples=0", "evaluation.during_samples"),
        ("dataset.test_path=nowhere.jsonl", "dataset.test_path"),
    ],
)
def test_a_bad_evaluation_setting_is_refused_naming_the_field(_repo_cwd, override, field):
    from realhf.experiments.async_ppo import ConfigError, initial_setup
    from realhf.experiments.config_loading import compose_config

    cfg = compose_config(["trial_name=t", "exp_ctrl.eval_freq_steps=4", "evaluation.n_prompts=0", override])
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        initial_setup(cfg)
