"""The realhf-vs-TRL protocol (scripts/bench/vs_trl.py): the declared file is complete and checked,
and the per-seed and median figures come out right on made-up runs. The race itself takes about
50 minutes and TRL's own venv, so it runs only by hand (`python -m scripts.bench vs_trl`)."""

import pytest
import yaml

from scripts.bench import vs_trl


def test_the_shipped_protocol_declares_every_fact_and_is_fair():
    p = vs_trl.load_protocol()
    assert len(p.seeds) >= 3 and 0 < p.target < 1 and p.budget_s > 0 and p.save_every_s > 0
    assert p.numerics == "fp32" and p.bf16 is False  # the same numerics on both sides
    assert p.evaluation["n_prompts"] >= 500 and p.evaluation["n_samples"] >= 1
    assert p.realhf["overrides"] == []  # the default a user runs


def _write(tmp_path, **change):
    raw = yaml.safe_load(vs_trl.PROTOCOL.read_text())
    raw.update(change)
    path = tmp_path / "protocol.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    "change, error",
    [
        ({"seeds": [1, 2]}, "seeds must be 3 or more distinct seeds"),
        ({"seeds": [1, 1, 2]}, "seeds must be 3 or more distinct seeds"),
        ({"target": 1.5}, "target must be an accuracy"),
        ({"numerics": "fp16"}, "numerics must be fp32 or bf16"),
        ({"numerics": "bf16"}, "realhf's trainer has no bf16 mode"),
        ({"budget": 3}, "unknown keys \\['budget'\\]"),
        ({"trl": {"sweep_budget_s": 60, "sweep_margin": 0.05, "sweep": []}}, "trl.sweep must list at least one"),
        ({"trl": {"sweep_margin": 0.05, "sweep": [{"threads": 2, "groups": 16, "minibatches": 3}]}}, "minibatches"),
        ({"trl": {"sweep": [{"threads": 2, "groups": 16, "minibatches": 2}]}}, "trl.sweep_margin must be a fraction"),
    ],
)
def test_a_bad_protocol_is_refused_naming_the_file_and_the_key(tmp_path, change, error):
    path = _write(tmp_path, **change)
    with pytest.raises(ValueError, match=error) as e:
        vs_trl.load_protocol(path)
    assert str(path) in str(e.value)


def test_a_missing_key_is_named(tmp_path):
    raw = yaml.safe_load(vs_trl.PROTOCOL.read_text())
    del raw["target"]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=r"missing keys \['target'\]"):
        vs_trl.load_protocol(path)


def _run(system, seed, t, sps, acc, greedy, reached=True):
    return {
        "system": system,
        "seed": seed,
        "time_to_target_s": t,
        "samples_per_s": sps,
        "final_accuracy": acc,
        "final_greedy_accuracy": greedy,
        "reached": reached,
        "curve": [{"clock_s": 0.0, "accuracy": 0.3}, {"clock_s": t, "accuracy": acc}],
    }


def test_medians_ratio_and_per_seed_figures():
    runs = [
        _run("realhf", 1, 50.0, 300.0, 0.66, 0.75),
        _run("trl", 1, 120.0, 200.0, 0.64, 0.70),
        _run("trl", 2, 150.0, 210.0, 0.60, 0.68),
        _run("realhf", 2, 70.0, 310.0, 0.62, 0.74),
        _run("realhf", 3, 60.0, 290.0, 0.70, 0.76),
        _run("trl", 3, 300.0, 190.0, 0.45, 0.60, reached=False),  # never reached: counts as the budget
    ]
    s = vs_trl.summarize(runs, [1, 2, 3])
    assert s["systems"]["realhf"]["time_to_target_s"] == {"median": 60.0, "min": 50.0, "max": 70.0}
    assert s["systems"]["trl"]["time_to_target_s"]["median"] == 150.0
    assert s["systems"]["trl"]["reached"] == 2 and s["systems"]["realhf"]["reached"] == 3
    assert s["trl_over_realhf_time_to_target_median"] == pytest.approx(2.5)
    assert s["realhf_over_trl_samples_per_s_median"] == pytest.approx(300.0 / 200.0)
    assert s["final_accuracy_realhf_minus_trl_median"] == pytest.approx(0.66 - 0.60)
    by_seed = {x["seed"]: x for x in s["per_seed"]}
    assert by_seed[2]["trl_over_realhf_time_to_target"] == pytest.approx(150 / 70, abs=1e-3)
    assert by_seed[3]["trl_final_greedy_accuracy"] == 0.60

    res = {
        "declared": "2026-11-26",
        "target": 0.5,
        "seeds": [1, 2, 3],
        "budget_s": 300,
        "save_every_s": 10,
        "numerics": "fp32",
        "trl_numerics": "fp32",
        "start_accuracy": 0.3,
        "start_greedy_accuracy": 0.6,
        "trl_sweep_budget_s": 60,
        "trl_sweep": [{"threads": 2, "groups": 16, "minibatches": 2, "steps": 40, "samples_per_s": 200.0}],
        "trl_setting": {"threads": 2, "groups": 16, "minibatches": 2},
        "runs": runs,
        **s,
    }
    rendered = vs_trl.tables(res)
    assert [len(rows) for _, _, rows in rendered] == [1, 3, 2, 6]
    assert "2.5" in rendered[2][0]


def test_a_looser_trl_setting_must_beat_the_ones_listed_before_it_by_the_margin():
    def s(threads, groups, sps):
        return {"threads": threads, "groups": groups, "minibatches": groups // 8, "samples_per_s": sps}

    exact_1, exact_2, loose = s(1, 16, 134.4), s(2, 16, 219.5), s(2, 32, 224.2)
    assert vs_trl.pick_setting([exact_1, exact_2, loose], 0.05) is exact_2  # 2% faster: noise
    assert vs_trl.pick_setting([exact_1, exact_2, s(2, 32, 240.0)], 0.05)["groups"] == 32  # 9%: real
    assert vs_trl.pick_setting([exact_1, exact_2, loose], 0.0) is loose


def test_the_systems_alternate_which_goes_first_by_seed():
    assert vs_trl.race_order([1, 2, 3]) == [
        (1, "realhf"), (1, "trl"), (2, "trl"), (2, "realhf"), (3, "realhf"), (3, "trl"),
    ]  # fmt: skip
