"""realhf.experiments.rm and training/main_rm.py: the pair batch and the Bradley–Terry loss
against their definitions, the refusals, and a real run of the command on the tiny model whose
reward model then ranks held-out pairs it never saw (loaded as HF loads it), and scores an RL
step's samples as the `reward_model` node does."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import paths
from helpers.chat_tokenizers import tiny_tokenizer
from helpers.fsdp_ranks import TINY_SFT
from realhf.api.cli_args import RMConfig
from realhf.experiments.rm import BradleyTerry, Pair, encode_pair, pair_accuracy, to_pair_batch, train_rm
from realhf.experiments.sft import engine_config
from realhf.impl.dataset.prompt_dataset import load_prompts, parse_row
from realhf.impl.dataset.table_formats import DatasetFormatError
from realhf.impl.model.reward_card import RewardCard, read_card, write_card
from realhf.system.trainer.actor import sequence_scores, token_logprobs

TRAIN = f"{paths.TINY_MATH}/data/train.jsonl"
TEST = f"{paths.TINY_MATH}/data/test.jsonl"


def test_a_pair_is_two_rows_of_prompt_answer_and_eos_and_scores_are_read_at_the_last_token():
    batch = to_pair_batch([Pair([5, 6, 7, 2], [5, 6, 2], 2), Pair([5, 9, 2], [5, 9, 8, 8, 2], 2)], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 2, 0], [5, 6, 2, 0, 0], [5, 9, 2, 0, 0], [5, 9, 8, 8, 2]]
    assert batch.group_ids.tolist() == [0, 0, 1, 1]
    # The answers' tokens (what an implicit reward sums): column j is token j+1, the prompt is 2 tokens.
    assert batch.loss_mask.int().tolist() == [[0, 1, 1, 0], [0, 1, 0, 0], [0, 1, 0, 0], [0, 1, 1, 1]]
    output = torch.arange(20, dtype=torch.float32).reshape(4, 5, 1)  # [n, T, 1]: value = 5·row + position
    assert sequence_scores(output, batch).tolist() == [3.0, 7.0, 12.0, 19.0]


def test_the_loss_is_minus_log_sigmoid_of_the_margin_summed_over_the_pairs():
    batch = to_pair_batch([Pair([1, 2], [1, 2], 1), Pair([1, 2], [1, 2], 1)], pad_id=0)
    output = torch.zeros(4, 2, 1)
    output[:, 1, 0] = torch.tensor([2.0, 0.5, -1.0, 1.0])  # pair 0: margin 1.5; pair 1: -2
    bt = BradleyTerry()
    loss = bt.loss(output, batch, torch.arange(4))
    expected = -(torch.nn.functional.logsigmoid(torch.tensor(1.5)) + torch.nn.functional.logsigmoid(torch.tensor(-2.0)))
    assert float(loss) == pytest.approx(float(expected))
    assert bt.n_pairs(batch) == 2
    stats = bt.step_stats()
    assert stats["accuracy"] == 0.5 and stats["margin"] == pytest.approx(-0.25)
    assert stats["loss"] == pytest.approx(float(expected) / 2)


def test_a_row_needs_both_answers():
    tok = tiny_tokenizer()
    with pytest.raises(DatasetFormatError, match="needs 'chosen' and 'rejected' answer texts"):
        encode_pair(tok, parse_row({"query_id": "q", "prompt": "Q", "chosen": "a"}), chat=False)
    with pytest.raises(DatasetFormatError, match="'chosen' and 'rejected' are the same text"):
        encode_pair(tok, parse_row({"query_id": "q", "prompt": "Q", "chosen": "a", "rejected": "a"}), chat=False)
    # An empty answer (a policy that stopped at once) is a rejected answer like any other.
    _, empty, _ = encode_pair(
        tok, parse_row({"query_id": "q", "prompt": "Q", "chosen": "a", "rejected": ""}), chat=False
    )
    assert empty[-1] == tok.eos_token_id and empty[-2] != tok.eos_token_id
    chosen, rejected, prompt_len = encode_pair(
        tok, parse_row({"query_id": "q", "prompt": "Q", "chosen": "a", "rejected": "b"}), chat=False
    )
    assert chosen[-1] == rejected[-1] == tok.eos_token_id and chosen[:-2] == rejected[:-2]
    assert chosen[:prompt_len] == tok.encode("Q", add_special_tokens=False) and prompt_len == len(chosen) - 2


def test_a_pair_is_never_split_over_forwards(tmp_path):
    # No knob could split it (RMConfig has no micro_batch_tokens), and the engine takes each
    # rank's share of the pairs at once.
    assert "micro_batch_tokens" not in {f.name for f in dataclasses.fields(RMConfig)}
    cfg = RMConfig(model_path=TINY_SFT, output_path=str(tmp_path / "rm"), train_path=TRAIN, eval_n=-1)
    assert engine_config(cfg, 0, value_head=True, name="rm").micro_batch_tokens == 0


def _pairs(path: str, n: int, out) -> str:
    """Pairs built from the task's reference solutions: chosen, the reference; rejected, the
    same working with a wrong final answer (a mismatch the model must learn to see)."""
    rows = []
    for r in load_prompts(path)[:n]:
        sol = r.solutions[0]
        work, answer = sol.rsplit("#### ", 1)
        wrong = str(int(answer) + 1 + int(r.query_id[-1]) % 3)
        rows.append({"query_id": r.query_id, "prompt": r.prompt, "chosen": sol, "rejected": f"{work}#### {wrong}"})
    out.write_text("".join(json.dumps(x) + "\n" for x in rows))
    return str(out)


def _train_command(root, steps: int, *overrides: str):
    """training/main_rm.py on pairs made from the task's solutions; (output dir, test pairs,
    the printed result, stdout)."""
    train, test = _pairs(TRAIN, 512, root / "train.jsonl"), _pairs(TEST, 128, root / "test.jsonl")
    out = root / "rm"
    proc = subprocess.run(
        [sys.executable, "training/main_rm.py", f"model_path={TINY_SFT}", f"output_path={out}", f"train_path={train}",
         f"test_path={test}", f"steps={steps}", "batch_size=32", "warmup_steps=5", "log_interval=20", "device=cpu",
         *overrides],
        cwd=paths.REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RM result: ", 1)[1].splitlines()[0])
    return out, test, result, proc.stdout


@pytest.fixture(scope="module")
def trained_rm(tmp_path_factory):
    return _train_command(tmp_path_factory.mktemp("rm"), 60)


@pytest.fixture(scope="module")
def trained_implicit_rm(tmp_path_factory):
    return _train_command(tmp_path_factory.mktemp("implicit_rm"), 30, "kind=implicit", "beta=0.1", "lr=3e-4")


@pytest.mark.system
def test_the_command_trains_a_reward_model_that_ranks_held_out_pairs(trained_rm):
    out, test, result, stdout = trained_rm
    print(stdout[-1500:])
    # Chance is 0.5; the model sees the working and must notice the final answer disagrees.
    assert result["test"]["accuracy"] >= 0.75, result["test"]
    assert result["final"]["loss"] < 0.6931, result["final"]  # below log 2: better than a constant score
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    cfg = RMConfig(test_path=test)
    again = pair_accuracy(str(out), load_prompts(test, required=()), cfg)
    assert again["accuracy"] == pytest.approx(result["test"]["accuracy"])


def _scored_by_the_step(out, test, kind: str):
    """Six held-out pairs scored by the step's nodes as a trainer rank runs them: (the batch, the
    reward node's stats). `kind`: ppo.graph.reward_model_kind (implicit: the reference first)."""
    from transformers import AutoTokenizer

    from realhf.api.cli_args import ModelTrainEvalConfig, PPOHyperparameters, StepGraphConfig
    from realhf.api.worker_configs import ModelWorkerConfig
    from realhf.system.trainer.ppo_actor import build_engines
    from realhf.system.trainer.ppo_step import build_graph
    from realhf.system.trainer.step_ops import StepContext, run_node

    tok = AutoTokenizer.from_pretrained(str(out))
    rows = load_prompts(test, required=())[:6]
    batch = to_pair_batch([encode_pair(tok, r, chat=False) for r in rows], pad_id=tok.pad_token_id or 0)
    ppo = PPOHyperparameters(graph=StepGraphConfig(reward_model=True, reward_model_kind=kind))
    cfg = ModelWorkerConfig(
        actor=ModelTrainEvalConfig(path=TINY_SFT), reward=ModelTrainEvalConfig(path=str(out)), ppo=ppo, device="cpu"
    )
    graph = build_graph(ppo)
    nodes = ["ref_inf", "reward_inf"] if kind == "implicit" else ["reward_inf"]
    engines = build_engines(cfg, 0, roles=[graph.node(n).model for n in nodes])
    try:
        ctx = StepContext(engines, None, None, ppo, 0)
        stats = [run_node(ctx, batch, graph.node(n)) for n in nodes][-1]
    finally:
        for e in engines.values():
            e.destroy()
    return batch, stats


@pytest.mark.system
def test_the_reward_model_node_scores_a_step_as_hf_does(trained_rm):
    from transformers import AutoModelForTokenClassification

    out, test, _, _ = trained_rm
    batch, stats = _scored_by_the_step(out, test, "value_head")
    hf = AutoModelForTokenClassification.from_pretrained(str(out)).eval()
    with torch.no_grad():
        expected = sequence_scores(hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, batch)
    assert torch.allclose(batch.get("rewards/rm"), expected, atol=1e-5)
    assert stats["mean"] == pytest.approx(float(expected.mean()), abs=1e-5)


@pytest.mark.system
def test_two_ranks_take_the_steps_one_rank_takes(trained_rm, tmp_path):
    """dp=2 (two rank processes over gloo, pairs split by tokens, whole pairs per rank) against
    dp=1 on the same pairs: the same loss at every step, to float rounding."""
    _, test, _, _ = trained_rm
    train = _pairs(TRAIN, 64, tmp_path / "train.jsonl")
    runs = {}
    for dp in (1, 2):
        cfg = RMConfig(
            model_path=TINY_SFT, output_path=str(tmp_path / f"rm{dp}"), train_path=train, eval_n=-1,
            steps=4, batch_size=16, warmup_steps=1, dp=dp, device="cpu", log_interval=100,
        )  # fmt: skip
        runs[dp] = train_rm(cfg, log=lambda msg: None)["history"]
    for one, two in zip(runs[1], runs[2]):
        assert two["loss"] == pytest.approx(one["loss"], abs=1e-4)
        assert two["accuracy"] == one["accuracy"]


@pytest.mark.system
def test_an_implicit_reward_model_ranks_held_out_pairs_and_carries_its_card(trained_implicit_rm):
    out, test, result, stdout = trained_implicit_rm
    print(stdout[-1500:])
    # The causal LM's own next-token knowledge sees a final answer that disagrees with the working
    # (0.984 measured at 60 steps; the value head reaches 0.898 on the same pairs).
    assert result["test"]["accuracy"] >= 0.9, result["test"]
    card = read_card(str(out))
    assert card == RewardCard("implicit", 0.1, os.path.abspath(TINY_SFT))
    assert json.loads((out / "config.json").read_text())["architectures"][0].endswith("ForCausalLM")
    again = pair_accuracy(str(out), load_prompts(test, required=()), RMConfig(test_path=test))
    assert again["accuracy"] == pytest.approx(result["test"]["accuracy"])


@pytest.mark.system
def test_the_implicit_reward_node_scores_a_step_as_its_definition_over_hf_models(trained_implicit_rm):
    from transformers import AutoModelForCausalLM

    out, test, _, _ = trained_implicit_rm
    batch, stats = _scored_by_the_step(out, test, "implicit")
    ids, mask = batch.input_ids, batch.attention_mask
    with torch.no_grad():
        logp = [
            token_logprobs(
                AutoModelForCausalLM.from_pretrained(p).eval()(input_ids=ids, attention_mask=mask).logits, batch
            )
            for p in (str(out), TINY_SFT)
        ]
    expected = 0.1 * ((logp[0] - logp[1]) * batch.loss_mask).sum(-1)  # beta * sum over the answers' tokens
    assert torch.allclose(batch.get("rewards/rm"), expected, atol=1e-4)
    assert stats["mean"] == pytest.approx(float(expected.mean()), abs=1e-4)
    assert (expected[0::2] > expected[1::2]).float().mean() >= 0.8  # it prefers the right answers


def _reward_dir(path, card=None, arch="LlamaForCausalLM"):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": [arch]}))
    if card is not None:
        write_card(path, card)
    return str(path)


def test_a_reward_model_is_refused_at_start_where_the_run_would_misread_it(tmp_path):
    from realhf.api.cli_args import AsyncPPOConfig
    from realhf.experiments.file_validation import check_reward_card
    from realhf.experiments.validation import ConfigError

    cfg = AsyncPPOConfig()
    cfg.actor.path = TINY_SFT
    cfg.ppo.graph.reward_model = True
    cfg.reward.path = _reward_dir(tmp_path / "implicit", RewardCard("implicit", 0.1, TINY_SFT))
    with pytest.raises(
        ConfigError, match="is a reward model of kind implicit .* set ppo.graph.reward_model_kind=implicit"
    ):
        check_reward_card(cfg)
    cfg.ppo.graph.reward_model_kind = "implicit"
    check_reward_card(cfg)  # its reference is the run's (actor.path, ref.path being empty)
    cfg.ref.path = str(tmp_path)
    with pytest.raises(ConfigError, match=f"this run's reference is '{tmp_path}' .* set ref.path={TINY_SFT}"):
        check_reward_card(cfg)
    cfg.ref.path, cfg.ppo.graph.reward_model_kind = "", "value_head"
    cfg.reward.path = _reward_dir(tmp_path / "old", arch="LlamaForTokenClassification")  # a value head, card-less
    check_reward_card(cfg)
    cfg.reward.path = _reward_dir(tmp_path / "policy")  # a causal LM with no card: not a reward model
    with pytest.raises(ConfigError, match="has no realhf_reward.json and is no token-classification model"):
        check_reward_card(cfg)
    (tmp_path / "policy" / "realhf_reward.json").write_text("{")
    with pytest.raises(ConfigError, match="realhf_reward.json: not a reward model card"):
        check_reward_card(cfg)


def test_the_implicit_loss_is_bradley_terry_on_beta_times_the_log_ratio_plus_the_chosen_nll():
    from realhf.experiments.rm import ImplicitBradleyTerry

    torch.manual_seed(0)
    batch = to_pair_batch([Pair([1, 2, 3, 4], [1, 2, 5], 2), Pair([1, 6, 7], [1, 6, 8, 9], 2)], pad_id=0)
    logits = torch.randn(4, batch.input_ids.shape[1], 10)
    batch.ref_logprobs = token_logprobs(torch.randn_like(logits), batch)
    logp = token_logprobs(logits, batch)
    mask = batch.loss_mask.float()
    scores = 0.5 * ((logp - batch.ref_logprobs) * mask).sum(-1)  # the definition, by hand
    bt = -torch.nn.functional.logsigmoid(scores[0::2] - scores[1::2]).sum()
    nll = -((logp * mask).sum(-1) / mask.sum(-1))[0::2].sum()  # per token, chosen answers only
    rows = torch.arange(4)
    assert float(ImplicitBradleyTerry(0.5).loss(logits, batch, rows)) == pytest.approx(float(bt), rel=1e-6)
    assert float(ImplicitBradleyTerry(0.5, 2.0).loss(logits, batch, rows)) == pytest.approx(
        float(bt + 2 * nll), rel=1e-6
    )
