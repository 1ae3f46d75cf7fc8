"""realhf's levers against its default (scripts/bench/levers.py): the declared file is complete and
checked, and the summary's medians and ratios are right. The measurement itself takes about an
hour, so it runs only by hand (`python -m scripts.bench levers`)."""

import pytest
import yaml

from scripts.bench import levers


def test_the_shipped_levers_file_is_checked_and_names_its_base_protocol():
    base, named = levers.load_levers()
    assert base.target == 0.5 and len(base.seeds) >= 3  # the vs-TRL protocol's rules
    assert named["prox_loglinear"] == ["ppo.prox_logp=loglinear"] and named["mb4096"] == ["ppo.micro_batch_tokens=4096"]
    assert all(name != levers.DEFAULT for name in named)


@pytest.mark.parametrize(
    "change, error",
    [
        ({"extra": 1}, "unknown keys ['extra']"),
        ({"levers": {}}, "levers must map a name"),
        ({"levers": {"default": ["seed=2"]}}, "levers.default"),
        ({"levers": {"x": []}}, "levers.x: a non-empty list"),
        ({"levers": {"x": ["no-equals-sign"]}}, "levers.x: a non-empty list"),
        ({"budget_s": 0}, "budget_s: a positive number"),
        ({"save_every_s": "10"}, "save_every_s: a positive number"),
    ],
)
def test_a_bad_levers_file_is_refused_naming_the_key(tmp_path, change, error):
    raw = yaml.safe_load(levers.LEVERS.read_text())
    raw.update(change)
    raw["base"] = str(levers.LEVERS.with_name(raw["base"]))
    path = tmp_path / "levers.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=error.replace("[", r"\[").replace("]", r"\]")) as e:
        levers.load_levers(path)
    assert str(path) in str(e.value)


def test_a_slower_hosts_levers_file_replaces_the_base_budget_and_cadence_only():
    base, _ = levers.load_levers()
    slow, named = levers.load_levers(levers.LEVERS.with_name("protocol_levers_avx2.yaml"))
    assert (slow.budget_s, slow.save_every_s) == (480.0, 15.0) != (base.budget_s, base.save_every_s)
    assert (slow.target, slow.seeds, slow.realhf) == (base.target, base.seeds, base.realhf)
    assert named == {"prox_loglinear": ["ppo.prox_logp=loglinear"]}


def _run(lever, seed, t, sps, reached=True):
    return {
        "lever": lever,
        "seed": seed,
        "overrides": [] if lever == "default" else ["ppo.prox_logp=loglinear"],
        "time_to_target_s": t,
        "samples_per_s": sps,
        "final_accuracy": 0.6,
        "final_greedy_accuracy": 0.7,
        "steps": 100,
        "reached": reached,
        "curve": [{"clock_s": 0.0, "accuracy": 0.3}, {"clock_s": t, "accuracy": 0.6}],
    }


def test_the_summary_gives_each_lever_its_ratio_to_the_default_per_seed_and_as_medians():
    runs = [
        _run("default", 1, 100.0, 300.0),
        _run("x", 1, 80.0, 330.0),
        _run("default", 2, 120.0, 290.0),
        _run("x", 2, 100.0, 320.0),
        _run("default", 3, 300.0, 310.0, reached=False),
        _run("x", 3, 90.0, 340.0),
    ]
    s = levers.summarize(runs, ["default", "x"])
    assert s["default"]["default_over_lever_time_to_target"] == 1.0
    assert s["x"]["default_over_lever_time_to_target"] == pytest.approx(120.0 / 90.0, abs=1e-3)
    assert s["x"]["per_seed_default_over_lever"] == {1: 1.25, 2: 1.2, 3: pytest.approx(300 / 90, abs=1e-3)}
    assert s["x"]["lever_over_default_samples_per_s"] == pytest.approx(330.0 / 300.0, abs=1e-3)
    assert s["default"]["reached"] == 2 and s["x"]["reached"] == 3
    res = {
        "protocol": "p.yaml",
        "target": 0.5,
        "start_accuracy": 0.3,
        "budget_s": 300,
        "seeds": [1, 2, 3],
        "levers": s,
        "runs": runs,
    }
    rendered = levers.tables(res)
    assert [len(rows) for _, _, rows in rendered] == [2, 6]
