"""The SmolLM2 race's protocol (scripts/bench/vs_trl_smollm2.py): the declared file is complete and
checked, TRL's side is read off realhf's composed config (so the two cannot drift apart), a
realhf setting the TRL driver cannot match is refused, and the eval set shares no fact with
training. The race itself takes over an hour and TRL's own venv: `python -m scripts.bench vs_trl_smollm2`."""

import json

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
    with pytest.raises(SystemExit, match=r"evaluation.max_new_tokens=128 cuts off 0.12 of the base model's greedy"):
        race.score_base(_fake_score((0.12, 0.3)), p, "base", strict=True)
    assert race.score_base(_fake_score((0.12, 0.3)), p, "base", strict=False)["eval_budget_ok"] is False  # smoke: said


def test_time_to_target_is_the_first_greedy_checkpoint_at_the_target(tmp_path):
    p = race.load_protocol()
    accs = {"c1": 0.1, "c2": p.target, "c3": p.target - 0.05}

    def score(path, temperature):
        return {"accuracy": accs[path] if temperature == 0 else 0.5, "truncated": 0.0}

    runs = [
        {
            "system": "realhf",
            "seed": 1,
            "checkpoints": [
                {"clock_s": 100.0, "path": "c1"},
                {"clock_s": 200.0, "path": "c2"},
                {"clock_s": 300.0, "path": "c3"},
                {"clock_s": 1e6, "path": "late"},
            ],
        },
        {"system": "trl", "seed": 1, "checkpoints": [{"clock_s": 150.0, "path": "c1"}]},
        {"system": "trl", "seed": 2, "checkpoints": [{"clock_s": 1e6, "path": "late"}]},  # nothing inside
    ]
    start = {"start_greedy_accuracy": 0.05, "start_sampled_accuracy": 0.02, "base_path": "base"}
    race.evaluate(runs, score, p, p.budget_s, start, str(tmp_path))
    a, b, c = runs
    assert not c["reached"] and c["final_greedy_accuracy"] == 0.05 and c["final_accuracy"] == 0.02
    assert c["final_path"] == "base" and a["final_path"] == "c3"  # what the two-digit set scores last
    assert a["reached"] and a["time_to_target_s"] == 200.0 and a["final_greedy_accuracy"] == p.target - 0.05
    assert [c["clock_s"] for c in a["curve"]] == [0.0, 100.0, 200.0, 300.0]  # the save past the budget is out
    assert not b["reached"] and b["time_to_target_s"] == p.budget_s and b["final_accuracy"] == 0.5


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
