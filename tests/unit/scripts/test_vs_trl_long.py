"""The long-reasoning race's protocol and harness (scripts/bench/vs_trl_long.py): the declared file
is complete and checked, TRL's side is read off realhf's composed config, the three systems
rotate which runs first, time to target is the first sampled checkpoint at the target, and the
race goes on where it stopped, also from a state file saved elsewhere. The race itself takes
hours and TRL's own venv: `python -m scripts.bench vs_trl_long`."""

import json
from pathlib import Path

import pytest
import yaml

from scripts.bench import vs_trl_long as race


def test_the_shipped_protocol_is_complete_and_fair():
    p = race.load_protocol()
    assert len(p.seeds) >= 3 and 0 < p.target < 1 and p.save_every_s < p.budget_s and p.numerics == "fp32"
    assert p.realhf["config"] == "async-ppo-long" and p.realhf["overrides"] == []  # the example as a user runs it
    assert p.evaluation["max_new_tokens"] >= 512 and p.evaluation["n_samples"] >= 4
    race.check_algorithm(p, "protocol")  # raises SystemExit on a mismatch
    sync = race.realhf_config(p, sync=True)
    assert sync.max_head_offpolicyness == 0 and not sync.ppo.use_decoupled_loss
    assert {s["continuous_batching"] for s in p.trl["sweep"]} == {True, False}  # TRL's own refill is swept


def _write(tmp_path, **change):
    raw = yaml.safe_load(race.PROTOCOL.read_text())
    raw.update(change)
    path = tmp_path / "protocol.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    "change, error",
    [
        ({"seeds": [1, 2]}, "seeds must be 3 or more"),
        ({"numerics": "bf16"}, "numerics must be fp32"),
        ({"realhf": {"config": "async-ppo-long", "overrides": []}}, "realhf needs exactly config"),
        (
            {"realhf": {"config": "async-ppo-long", "overrides": [], "sync_overrides": ["ppo.kl_ctl=0"]}},
            "must hold max_head_offpolicyness=0",
        ),
        ({"evaluation": {"split": "test", "n_prompts": 500}}, "evaluation needs exactly"),
        ({"save_every_s": 5000}, "0 < save_every_s < budget_s"),
        ({"trl": {"sweep_margin": 0.05, "sweep": [{"threads": 2, "groups": 16}]}}, "needs exactly"),
        ({"budget": 9}, r"unknown keys \['budget'\]"),
    ],
)
def test_a_bad_protocol_is_refused_naming_the_file_and_the_key(tmp_path, change, error):
    path = _write(tmp_path, **change)
    with pytest.raises(ValueError, match=error) as e:
        race.load_protocol(path)
    assert str(path) in str(e.value)


def test_a_sweep_setting_with_other_samples_per_optimizer_step_is_refused(tmp_path):
    raw = yaml.safe_load(race.PROTOCOL.read_text())
    raw["trl"]["sweep"].append({"threads": 2, "groups": 16, "minibatches": 4, "continuous_batching": False})
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(SystemExit, match="not realhf's 64 samples per optimizer step"):
        race.check_algorithm(race.load_protocol(path), str(path))


def test_trls_side_is_read_off_realhfs_config():
    args = race.trl_driver_args(race.realhf_config(race.load_protocol()))
    opts = dict(zip(args[::2], args[1::2]))
    assert opts["--model"].endswith("assets/tiny-long/sft") and opts["--max-new-tokens"] == "768"
    assert opts["--train-data"].endswith("assets/tiny-long/data/train.jsonl") and opts["--reward"] == "check-work"


def test_each_seed_runs_all_three_systems_the_first_one_rotating():
    order = race.race_order([1, 2, 3])
    assert order[:3] == [(1, "realhf"), (1, "trl"), (1, "realhf_sync")]
    assert [s for seed, s in order if seed == 2][0] == "trl" and [s for seed, s in order if seed == 3][
        0
    ] == "realhf_sync"
    assert sorted(order) == sorted((seed, s) for seed in (1, 2, 3) for s in race.SYSTEMS)


def _saves(root, *clocks):
    out = []
    for i, clock in enumerate(clocks):
        d = root / f"save{i}"
        d.mkdir(parents=True)
        out.append({"clock_s": clock, "path": str(d)})
    return out


def test_time_to_target_is_the_first_sampled_checkpoint_at_the_target(tmp_path):
    p = race.load_protocol()
    saves = _saves(tmp_path / "a", 150.0, 300.0, 450.0, 1e6)
    accs = dict(zip([c["path"] for c in saves], [0.55, p.target, p.target - 0.01, 0.99]))
    scored = []

    def score(path, temperature, n_prompts, k=1):
        scored.append((path, temperature, k))
        return {"accuracy": accs[path] if temperature else 0.8, "mean_new_tokens": 120.0}

    start = {"start_accuracy": 0.562, "start_greedy_accuracy": 0.796}
    a = {"system": "realhf", "seed": 1, "checkpoints": saves}
    race.score_run(a, score, p, p.budget_s, start, 500, 8)
    assert a["reached"] and a["time_to_target_s"] == 300.0 and a["final_accuracy"] == p.target - 0.01
    assert [c["clock_s"] for c in a["curve"]] == [0.0, 150.0, 300.0, 450.0]  # the save past the budget is out
    assert a["final_greedy_accuracy"] == 0.8 and (saves[2]["path"], 0.0, 1) in scored
    assert all(k == 8 for _, t, k in scored if t == 1.0) and not any(Path(c["path"]).exists() for c in saves)
    b = {"system": "trl", "seed": 1, "checkpoints": _saves(tmp_path / "b", 1e6)}  # nothing inside the budget
    race.score_run(b, score, p, p.budget_s, {**start, "start_accuracy": 0.99}, 500, 8)
    assert not b["reached"] and b["time_to_target_s"] == p.budget_s  # the warm start's own score never counts


class _FakeRace:
    """The race's stages without training or a model: each run leaves saves at 150 and 300 s."""

    def __init__(self, monkeypatch, tmp_path):
        self.calls, self.fail = [], None
        self.host = {"cpu_model": "EPYC", "cpu_flags": "avx2 avx512f", "commit": "abc", "date": "d"}
        monkeypatch.setattr(race, "ensure_data", lambda: None)
        monkeypatch.setattr(race, "this_host", lambda: dict(self.host))
        monkeypatch.setattr(race, "task_evaluator", lambda *a: self.score)
        monkeypatch.setattr(race.vs_trl, "sweep", self.sweep)
        monkeypatch.setattr(race, "run_system", self.run)

    def score(self, path, temperature, n_prompts, k=1):
        self.calls.append(("score", path))
        acc = 0.5 if "tiny-long" in path else (0.6 if "realhf" in path else 0.55)
        return {"accuracy": acc, "mean_new_tokens": 100.0}

    def sweep(self, p, work, budget, driver_args):
        self.calls.append(("sweep",))
        return [{**s, "samples_per_s": 5.0 + i, "steps": 2, "bf16": False} for i, s in enumerate(p.trl["sweep"])]

    def run(self, p, system, seed, setting, work, budget):
        self.calls.append((system, seed))
        if self.fail == (system, seed):
            raise KeyboardInterrupt
        saves = _saves(Path(work, f"{system}-{seed}-{len(self.calls)}"), 150.0, 300.0)
        return {"system": system, "seed": seed, "steps": 4, "samples_per_s": 30.0, "bf16": False, "checkpoints": saves}

    def runs(self):
        return [c for c in self.calls if c[0] in race.SYSTEMS]


def _main(capsys, *args):
    assert race.main(list(args)) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_the_race_goes_on_where_it_stopped_and_from_a_saved_state(tmp_path, monkeypatch, capsys):
    fake, work = _FakeRace(monkeypatch, tmp_path), tmp_path / "race"
    first = _main(capsys, "--seeds", "1", "--work-dir", str(work))
    assert fake.runs() == [("realhf", 1), ("trl", 1), ("realhf_sync", 1)] and first["seeds"] == [1]
    assert first["trl_setting"] == {**race.load_protocol().trl["sweep"][-1]}  # the fastest by more than the margin
    # realhf reaches the target at its first save (150 s), TRL never: its time is the budget.
    assert first["per_seed"][0]["trl_over_realhf_time_to_target"] == race.load_protocol().budget_s / 150.0
    assert first["systems"]["trl"]["reached"] == 0 and first["systems"]["realhf_sync"]["reached"] == 1
    assert first["systems"]["realhf"]["final_accuracy"]["median"] == 0.6 and not first["complete"]

    fake.fail = ("trl", 2)  # seed 2 goes TRL first: stopped before anything of it is scored
    with pytest.raises(KeyboardInterrupt):
        race.main(["--work-dir", str(work)])
    saved = tmp_path / "saved_state.json"  # a later session on a fresh machine: only the state travels
    saved.write_text((work / "race_state.json").read_text())
    fake.fail = None
    last = _main(capsys, "--work-dir", str(tmp_path / "fresh"), "--state", str(saved))
    assert last["complete"] and last["seeds"] == [1, 2, 3] and len(last["runs"]) == 9
    assert fake.runs()[3:] == [("trl", 2), ("trl", 2), ("realhf_sync", 2), ("realhf", 2)] + [
        ("realhf_sync", 3),
        ("realhf", 3),
        ("trl", 3),
    ]
    assert fake.calls.count(("sweep",)) == 1  # the base and the sweep are not run again


def test_a_seed_from_another_host_is_run_again_and_another_protocol_is_refused(tmp_path, monkeypatch, capsys):
    fake, work = _FakeRace(monkeypatch, tmp_path), str(tmp_path / "race")
    fake.fail = ("realhf_sync", 1)
    with pytest.raises(KeyboardInterrupt):
        race.main(["--seeds", "1", "--work-dir", work])
    fake.fail, fake.host = None, {**fake.host, "cpu_flags": "avx2"}
    out = _main(capsys, "--seeds", "1", "--work-dir", work)
    assert fake.runs()[3:] == [("realhf", 1), ("trl", 1), ("realhf_sync", 1)] and out["hosts"] == ["EPYC (avx2)"]
    other = tmp_path / "protocol.yaml"
    other.write_text(race.PROTOCOL.read_text().replace("target: 0.585", "target: 0.6"))
    with pytest.raises(SystemExit, match="pass another --work-dir"):
        race.main(["--protocol", str(other), "--work-dir", work])


def test_trls_reward_logs_which_prompts_it_scored_in_order(tmp_path):
    from scripts.bench.trl_driver import load_prompts, make_reward

    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"query_id": q, "prompt": f"Q: {a}+{a}?\nA:", "solutions": [f"#### {2 * a}"]}) + "\n"
            for q, a in (("train-1", 1), ("train-2", 2))
        )
    )
    rows = load_prompts(str(data))
    assert [r["query_id"] for r in rows] == ["train-1", "train-2"]  # TRL hands dataset columns to the reward
    log = tmp_path / "samples.jsonl"
    reward, grader = make_reward(check_work=False, sample_log=str(log))
    try:
        got = reward(
            ["p1", "p2"], [" #### 2", " #### 5"], [r["solutions"] for r in rows], query_id=["train-1", "train-2"]
        )
        reward(["p1"], [" #### 2"], [rows[0]["solutions"]], query_id=["train-1"])
    finally:
        grader.close()
    assert got == [1.0, 0.0]
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(x["query_id"], x["reward"]) for x in lines] == [(["train-1", "train-2"], [1.0, 0.0]), (["train-1"], [1.0])]
