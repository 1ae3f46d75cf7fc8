"""The SmolLM2 race's protocol (scripts/bench/vs_trl_smollm2.py): the declared file is complete and
checked, TRL's side is read off realhf's composed config (so the two cannot drift apart), a
realhf setting the TRL driver cannot match is refused, and the eval set shares no fact with
training. The race itself takes over an hour and TRL's own venv: `python -m scripts.bench vs_trl_smollm2`."""

import json
from pathlib import Path

import pytest
import yaml

from scripts.bench import vs_trl_smollm2 as race
from scripts.bench.trl_driver import load_prompts


def test_the_shipped_protocol_is_complete_and_fair():
    p = race.load_protocol()
    assert len(p.seeds) >= 3 and 0 < p.target < 1 and p.budget_s > 0 and p.save_every_s > 0
    assert p.numerics == "fp32" and not p.bf16
    assert p.realhf == {"config": "async-ppo-smollm2", "overrides": []}  # the example as a user runs it
    assert 0 < p.held_out["fraction"] < 1 and p.ood_set["digits"] >= 2 and p.evaluation["max_new_tokens"] >= 64


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
        ({"target": 0.0}, "target must be an accuracy"),
        ({"numerics": "bf16"}, "numerics must be fp32"),
        ({"ood_set": {"digits": 1, "steps": 1, "n_prompts": 200, "seed": 7}}, "ood_set needs digits"),
        ({"held_out": {"fraction": 1.0, "n_prompts": 200, "seed": 7}}, "held_out needs fraction"),
        ({"evaluation": {"max_new_tokens": 96}}, "evaluation needs exactly"),
        ({"realhf": {"config": "async-ppo-smollm2"}}, "realhf needs exactly config"),
        ({"trl": {"sweep_margin": 0.05, "sweep": [{"threads": 2}]}}, "needs exactly threads, groups, minibatches"),
        ({"budget": 9}, r"unknown keys \['budget'\]"),
    ],
)
def test_a_bad_protocol_is_refused_naming_the_file_and_the_key(tmp_path, change, error):
    path = _write(tmp_path, **change)
    with pytest.raises(ValueError, match=error) as e:
        race.load_protocol(path)
    assert str(path) in str(e.value)


def test_trls_side_is_read_off_realhfs_config():
    cfg = race.realhf_config(race.load_protocol())
    assert race.algorithm_mismatches(cfg) == []
    args = race.trl_driver_args(cfg)
    opts = dict(zip(args[::2], args[1::2]))
    assert opts["--model"].endswith("assets/smollm2-135m-instruct")
    assert opts["--train-data"].endswith("assets/smollm2-math/data/train.jsonl")
    assert float(opts["--lr"]) == cfg.actor.optimizer.lr == 2e-4
    assert float(opts["--temperature"]) == 0.7 and float(opts["--beta"]) == 0.0
    assert opts["--max-new-tokens"] == "24" and opts["--group-size"] == "8"
    assert opts["--reward"] == "answer"  # rollout.env.check_work=false
    i = args.index("--lora-r")
    assert args[i : i + 4] == ["--lora-r", "16", "--lora-alpha", "32.0"]
    assert args[args.index("--lora-targets") + 1].split(",") == cfg.actor.lora.target_modules
    assert race.samples_per_optimizer_step(cfg) == 32


def test_a_setting_the_trl_driver_cannot_match_is_named():
    p = race.load_protocol()
    p = race.Protocol(
        **{
            **p.__dict__,
            "realhf": {"config": p.realhf["config"], "overrides": ["ppo.eps_clip=0.3", "ppo.adv_estimator=dr_grpo"]},
        }
    )
    bad = race.algorithm_mismatches(race.realhf_config(p))
    assert len(bad) == 2 and bad[0].startswith("ppo.eps_clip: realhf 0.3") and bad[1].startswith("ppo.adv_estimator")


def _train_rows(path, facts):
    rows = []
    for i, (a, op, b) in enumerate(facts):
        verb = "gets" if op == "+" else "loses"
        c = a + b if op == "+" else a - b
        content = f"Ann has {a} pens. She {verb} {b}. How many pens does she have now? {race.INSTRUCTION}"
        rows.append(
            {
                "query_id": f"t{i}",
                "messages": [{"role": "user", "content": content}],
                "solutions": [f" {a}{op}{b}={c}\n#### {c}"],
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_facts_are_read_off_one_step_solutions():
    assert race.fact_of({"solutions": [" 7-3=4\n#### 4"]}) == (7, "-", 3)
    with pytest.raises(ValueError, match="row 'q': not a one-step story"):
        race.fact_of({"query_id": "q", "solutions": [" 7-3=4\n4+2=6\n#### 6"]})


def test_the_race_trains_without_the_held_out_facts_and_asks_only_them(tmp_path):
    p = race.load_protocol()
    facts = [(a, "+", b) for a in range(1, 10) for b in range(1, 10)] + [
        (a, "-", b) for a in range(1, 10) for b in range(1, a + 1)
    ]
    train = tmp_path / "train.jsonl"
    _train_rows(train, facts * 2)  # each fact twice, as in a real draw
    got = race.write_race_data(p, str(train), tmp_path / "data", n_held_out=40, n_ood=30)
    read = {k: [json.loads(line) for line in open(v)] for k, v in got["paths"].items()}
    held = {race.fact_of(r) for r in read["held_out"]}
    kept = {race.fact_of(r) for r in read["train"]}
    assert got["facts"] == len(set(facts))
    listed = {(int(f.split(op)[0]), op, int(f.split(op)[1])) for f in got["held_out_facts"] for op in "+-" if op in f}
    keys = {race._unordered(f) for f in facts}
    assert len({race._unordered(f) for f in listed}) == round(p.held_out["fraction"] * len(keys))
    assert not {(b, "+", a) for a, op, b in held if op == "+"} & kept  # the other order is held out too
    assert held and not held & kept  # never trained on what is asked
    assert held <= {
        (int(f.split(op)[0]), op, int(f.split(op)[1])) for f in got["held_out_facts"] for op in "+-" if op in f
    }
    assert got["train_rows"] + got["train_rows_dropped"] == 2 * len(facts) and got["train_rows"] == len(read["train"])
    assert len(read["held_out"]) == 40 and len({r["messages"][0]["content"] for r in read["held_out"]}) == 40
    assert all(r["messages"][0]["content"].endswith(race.INSTRUCTION) for r in read["held_out"] + read["ood"])
    assert len(read["ood"]) == 30 and got["ood_min_operand"] >= 10 and got["train_max_number"] == 9
    # A pure function of the protocol and the rows.
    again = race.write_race_data(p, str(train), tmp_path / "again", n_held_out=40, n_ood=30)
    for k in got["paths"]:
        assert open(got["paths"][k]).read() == open(again["paths"][k]).read()

    _train_rows(train, facts + [(12, "+", 3)])  # a training story with a two-digit number: ood facts may overlap
    with pytest.raises(ValueError, match="ood operands reach down to 1[0-9], training stories go up to 12"):
        race.write_race_data(p, str(train), tmp_path / "bad", n_held_out=1, n_ood=30)


def test_the_trl_driver_reads_chat_rows_as_conversations(tmp_path):
    pytest.importorskip("datasets")
    chat, text = tmp_path / "chat.jsonl", tmp_path / "text.jsonl"
    _train_rows(chat, [(2, "+", 5)])
    text.write_text(json.dumps({"query_id": "p", "prompt": "Q: 1+1?\nA:", "solutions": ["#### 2"]}) + "\n")
    assert load_prompts(str(chat))[0]["prompt"][0]["content"].startswith("Ann has 2 pens. She gets 5.")
    assert load_prompts(str(text))[0]["prompt"] == "Q: 1+1?\nA:"
    assert load_prompts(str(text), chat=True)[0]["prompt"] == [{"role": "user", "content": "Q: 1+1?\nA:"}]


def _fake_score(truncated):
    def score(path, temperature):
        cut = truncated[temperature > 0]
        return {"accuracy": 0.1 if temperature == 0 else 0.05, "truncated": cut, "mean_new_tokens": 40.0}

    return score


def test_an_answer_budget_that_cuts_off_the_base_model_is_refused_before_any_training():
    p = race.load_protocol()
    start = race.score_base(_fake_score((0.02, 0.3)), p, "base", strict=True)
    assert start["eval_budget_ok"] and start["start_greedy_accuracy"] == 0.1 and start["start_sampled_accuracy"] == 0.05
    assert start["base_truncated_sampled"] == 0.3  # recorded beside the sampled score
    with pytest.raises(SystemExit, match=r"evaluation.max_new_tokens=256 cuts off 0.12 of the base model's greedy"):
        race.score_base(_fake_score((0.12, 0.3)), p, "base", strict=True)
    assert race.score_base(_fake_score((0.12, 0.3)), p, "base", strict=False)["eval_budget_ok"] is False  # smoke: said


def _saves(root, *clocks):
    out = []
    for i, clock in enumerate(clocks):
        d = root / f"save{i}"
        d.mkdir(parents=True)
        out.append({"clock_s": clock, "path": str(d)})
    return out


def test_time_to_target_is_the_first_greedy_checkpoint_at_the_target_and_scored_saves_are_deleted(tmp_path):
    p = race.load_protocol()
    a_saves = _saves(tmp_path / "a", 100.0, 200.0, 300.0, 1e6)
    accs = dict(zip([c["path"] for c in a_saves], [0.1, p.target, p.target - 0.05, 0.99]))
    scored = []

    def score(path, temperature):
        scored.append((path, temperature))
        return {"accuracy": accs.get(path, 0.1) if temperature == 0 else 0.5, "truncated": 0.0}

    def score_ood(path, temperature):
        return {"accuracy": 0.2 if path == a_saves[2]["path"] else 0.0, "truncated": 0.0}

    start = {"start_greedy_accuracy": 0.05, "start_sampled_accuracy": 0.02, "ood_start_greedy_accuracy": 0.07}
    a = {"system": "realhf", "seed": 1, "checkpoints": a_saves}
    b = {"system": "trl", "seed": 1, "checkpoints": _saves(tmp_path / "b", 150.0)}
    c = {"system": "trl", "seed": 2, "checkpoints": _saves(tmp_path / "c", 1e6)}  # nothing inside the budget
    for r in (a, b, c):
        race.score_run(r, score, score_ood, p, p.budget_s, start, str(tmp_path))
    assert a["reached"] and a["time_to_target_s"] == 200.0 and a["final_greedy_accuracy"] == p.target - 0.05
    assert [x["clock_s"] for x in a["curve"]] == [0.0, 100.0, 200.0, 300.0]  # the save past the budget is out
    assert a["final_ood_greedy_accuracy"] == 0.2 and a["checkpoints_saved"] == 4  # the last save inside, two-digit
    assert not b["reached"] and b["time_to_target_s"] == p.budget_s and b["final_accuracy"] == 0.5
    assert not c["reached"] and c["final_greedy_accuracy"] == 0.05 and c["final_accuracy"] == 0.02
    assert c["final_ood_greedy_accuracy"] == 0.07  # scored as the base model
    assert (a_saves[3]["path"], 0.0) not in scored and (a_saves[2]["path"], 0.7) in scored
    assert not any(Path(x["path"]).exists() for x in a_saves)  # every save deleted once scored


class _FakeRace:
    """The race's stages without training or a model: each run leaves one save per 100 s."""

    def __init__(self, monkeypatch, tmp_path):
        self.calls, self.host = [], {"cpu_model": "EPYC", "cpu_flags": "avx2", "commit": "abc", "date": "d"}
        self.fail = None
        data = {
            "paths": {k: str(tmp_path / f"{k}.jsonl") for k in ("train", "held_out", "ood")},
            "held_out_facts": ["1+2", "2+1"],
            "ood_prompts": 200,
            "ood_min_operand": 10,
            "train_max_number": 9,
        }
        monkeypatch.setattr(race, "prepare_assets", lambda cfg: None)
        monkeypatch.setattr(race, "write_race_data", lambda *a: data)
        monkeypatch.setattr(race, "this_host", lambda: dict(self.host))
        monkeypatch.setattr(race, "evaluator", lambda p, path, n, work: self.score)
        monkeypatch.setattr(race, "sweep", self.sweep)
        monkeypatch.setattr(race.vs_trl, "run_realhf", lambda p, seed, work, *a: self.run("realhf", seed, work))
        monkeypatch.setattr(race.vs_trl, "run_trl", lambda p, seed, setting, work, *a: self.run("trl", seed, work))

    def score(self, path, temperature):
        self.calls.append(("score", path))
        return {"accuracy": 0.3 if "smollm2" in path else 0.6, "truncated": 0.0, "mean_new_tokens": 30.0}

    def sweep(self, p, cfg, work, budget):
        self.calls.append(("sweep",))
        return [{**s, "samples_per_s": 1.0, "steps": 2, "bf16": False} for s in p.trl["sweep"]]

    def run(self, system, seed, work):
        self.calls.append((system, seed))
        if self.fail == (system, seed):
            raise KeyboardInterrupt
        saves = _saves(Path(work, f"{system}-{seed}-{len(self.calls)}"), 100.0, 200.0)
        r = {"system": system, "seed": seed, "steps": 4, "samples_per_s": 1.0, "checkpoints": saves}
        return {**r, "bf16": False} if system == "trl" else r

    def runs(self):
        return [c for c in self.calls if c[0] in ("realhf", "trl")]


def _main(capsys, *args):
    assert race.main(list(args)) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_the_race_goes_on_where_it_stopped_across_invocations(tmp_path, monkeypatch, capsys):
    fake, work = _FakeRace(monkeypatch, tmp_path), str(tmp_path / "race")
    first = _main(capsys, "--seeds", "1", "--work-dir", work)
    assert first["seeds"] == [1] and not first["complete"] and first["seeds_missing"] == [2, 3]
    assert fake.runs() == [("realhf", 1), ("trl", 1)]
    assert first["per_seed"][0]["trl_over_realhf_time_to_target"] == 1.0 and first["hosts"] == ["EPYC (avx2)"]
    assert not any(Path(work).glob("*-1-*/save*"))  # scored, then deleted
    n_scores = len([c for c in fake.calls if c[0] == "score"])

    fake.fail = ("trl", 2)  # seed 2 goes TRL first (alternating): stopped before anything of it is scored
    with pytest.raises(KeyboardInterrupt):
        race.main(["--work-dir", work])
    fake.fail, fake.host = None, {**fake.host, "cpu_flags": "avx2 avx512f"}  # another machine goes on
    last = _main(capsys, "--work-dir", work)
    assert last["complete"] and last["seeds"] == [1, 2, 3] and len(last["runs"]) == 6
    assert fake.runs()[2:] == [("trl", 2), ("trl", 2), ("realhf", 2), ("realhf", 3), ("trl", 3)]
    assert fake.calls.count(("sweep",)) == 1  # the base and the sweep are not run again
    assert len([c for c in fake.calls if c[0] == "score"]) - n_scores == 4 * 4  # 4 runs x (2 greedy, sampled, ood)
    assert last["hosts"] == ["EPYC (avx2 avx512f)", "EPYC (avx2)"]


def test_half_a_pair_from_another_host_is_run_again_and_another_protocol_is_refused(tmp_path, monkeypatch, capsys):
    fake, work = _FakeRace(monkeypatch, tmp_path), str(tmp_path / "race")
    fake.fail = ("trl", 1)
    with pytest.raises(KeyboardInterrupt):
        race.main(["--seeds", "1", "--work-dir", work])
    fake.fail, fake.host = None, {**fake.host, "cpu_model": "Xeon"}
    out = _main(capsys, "--seeds", "1", "--work-dir", work)
    assert fake.runs() == [("realhf", 1), ("trl", 1), ("realhf", 1), ("trl", 1)]  # realhf again, beside TRL
    assert out["hosts"] == ["Xeon (avx2)"] and len(out["runs"]) == 2

    other = tmp_path / "protocol.yaml"
    other.write_text(race.PROTOCOL.read_text().replace("target: 0.50", "target: 0.55"))
    with pytest.raises(SystemExit, match="not this full one .*pass another --work-dir"):
        race.main(["--protocol", str(other), "--work-dir", work])
    with pytest.raises(SystemExit, match=r"--seeds 4: the protocol's seeds are \[1, 2, 3\]"):
        race.main(["--seeds", "4", "--work-dir", work])


# peft's get_peft_model, called here directly, asks transformers a deprecated question.
@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
def test_a_trl_peft_save_is_merged_into_its_base_for_the_evaluator(tmp_path):
    peft = pytest.importorskip("peft")
    import torch
    from transformers import AutoModelForCausalLM

    from scripts.bench.common import REPO

    base = f"{REPO}/assets/tiny-math/sft"
    model = peft.get_peft_model(
        AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    with torch.no_grad():  # B starts at zero: make the adapter change the model
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    save = tmp_path / "run" / "checkpoints" / "version3"
    model.save_pretrained(save)
    ids = torch.tensor([[1, 5, 9, 12, 7]])
    want = model(input_ids=ids).logits
    merged = race.merged_dir({"path": str(save), "adapter_of": base}, str(tmp_path))
    got = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)(input_ids=ids).logits
    plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-4) and not torch.allclose(plain, want, atol=1e-3)
    assert race.merged_dir({"path": "/a/realhf/save"}, str(tmp_path)) == "/a/realhf/save"  # merged already
