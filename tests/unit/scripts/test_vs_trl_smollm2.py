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
    assert p.eval_set["digits"] >= 2 and p.evaluation["max_new_tokens"] >= 64


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
        ({"eval_set": {"digits": 1, "steps": 1, "n_prompts": 200, "seed": 7}}, "eval_set needs digits"),
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


def _train_rows(path, numbers):
    rows = [
        {
            "query_id": f"t{i}",
            "messages": [{"role": "user", "content": f"Ann has {a} pens. She gets {b} more."}],
            "solutions": [f"#### {a + b}"],
        }
        for i, (a, b) in enumerate(numbers)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_eval_set_shares_no_fact_with_training(tmp_path):
    p = race.load_protocol()
    train = tmp_path / "train.jsonl"
    _train_rows(train, [(1, 9), (3, 4)])
    got = race.write_eval_set(p, str(train), tmp_path / "ood.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "ood.jsonl").read_text().splitlines()]
    assert len(rows) == got["n_prompts"] == p.eval_set["n_prompts"]
    assert got["eval_min_operand"] >= 10 and got["train_max_number"] == 9
    assert all(r["messages"][0]["content"].endswith(race.INSTRUCTION) for r in rows)
    # The same values make the same set (a pure function of the protocol).
    again = race.write_eval_set(p, str(train), tmp_path / "again.jsonl")
    assert (tmp_path / "again.jsonl").read_text() == (tmp_path / "ood.jsonl").read_text() and again == {
        **got,
        "path": again["path"],
    }

    _train_rows(train, [(12, 3)])  # a training story with a two-digit number: facts may overlap
    with pytest.raises(ValueError, match="facts may overlap"):
        race.write_eval_set(p, str(train), tmp_path / "bad.jsonl")


def test_the_trl_driver_reads_chat_rows_as_conversations(tmp_path):
    pytest.importorskip("datasets")
    chat, text = tmp_path / "chat.jsonl", tmp_path / "text.jsonl"
    _train_rows(chat, [(2, 5)])
    text.write_text(json.dumps({"query_id": "p", "prompt": "Q: 1+1?\nA:", "solutions": ["#### 2"]}) + "\n")
    assert load_prompts(str(chat))[0]["prompt"] == [{"role": "user", "content": "Ann has 2 pens. She gets 5 more."}]
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
    start = {"start_greedy_accuracy": 0.05, "start_sampled_accuracy": 0.02}
    race.evaluate(runs, score, p, p.budget_s, start, str(tmp_path))
    a, b, c = runs
    assert not c["reached"] and c["final_greedy_accuracy"] == 0.05 and c["final_accuracy"] == 0.02
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
