"""realhf.experiments.sft, piece by piece: what a row trains on (prompt + solution, chat messages,
a trace), the batch layout and loss, the token split across DP ranks, the LR schedule, the data
formats and column names, and the refusals. DP=2 against DP=1 over real processes:
test_sft_ranks.py; the command: tests/unit/training/test_main_sft.py."""

import json
import math

import pytest
import torch

from helpers.chat_tokenizers import CHATML, tiny_tokenizer
from helpers.fsdp_ranks import TINY_SFT
from helpers.paths import TINY_MATH
from realhf.api.cli_args import DatasetColumnsConfig, SFTConfig
from realhf.api.prompt import PromptRow
from realhf.experiments.sft import (
    encode_example,
    engine_config,
    load_training_rows,
    nll_sum,
    split_by_tokens,
    to_train_batch,
    train_sft,
)
from realhf.impl.dataset.prompt_dataset import parse_row
from realhf.impl.dataset.prompt_encoding import encode_prompt
from realhf.impl.dataset.table_formats import DatasetFormatError
from realhf.impl.model.optim import lr_factor


def _row(**fields) -> PromptRow:
    return parse_row({"query_id": "q", **fields})


def test_loss_mask_covers_completion_and_eos_only():
    batch = to_train_batch([([10, 11, 12, 13, 2], 3), ([10, 11, 2], 2)], pad_id=0)
    assert batch.input_ids.tolist() == [[10, 11, 12, 13, 2], [10, 11, 2, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    # Column t-1 trains token t: tokens 13 and EOS of the first row, EOS of the second.
    assert batch.loss_mask.int().tolist() == [[0, 0, 1, 1], [0, 1, 0, 0]]
    # A flag per token (a multi-turn episode): the same columns.
    flagged = to_train_batch([([10, 11, 12, 13, 2], [0, 0, 0, 1, 1])], pad_id=0)
    assert flagged.loss_mask.int().tolist() == [[0, 0, 1, 1]]
    empty = to_train_batch([], pad_id=0)  # a rank with nothing this step
    assert empty.n_seqs == 0 and empty.input_ids.shape == (0, 2)


def test_the_loss_is_the_sum_of_minus_log_p_over_trained_tokens():
    torch.manual_seed(0)
    logits = torch.randn(1, 5, 7)  # [1, T, V]
    batch = to_train_batch([([1, 2, 3, 4, 5], 3)], pad_id=0)
    logp = torch.log_softmax(logits[0], -1)
    # Targets 4 (predicted at position 2) and 5 (at position 3); the prompt is not trained on.
    expected = -(logp[2, 4] + logp[3, 5])
    assert torch.allclose(nll_sum(logits, batch, torch.arange(1)), expected)


def test_a_prompt_row_trains_on_its_first_solution_and_eos_after_the_prompt_the_rollouts_see():
    row = _row(prompt="Q: 1+1?\nA:", solutions=[" 1+1=2\n#### 2", " other"])
    for template, chat in (("", False), (CHATML, True)):
        tok = tiny_tokenizer(template)
        ids, n_prompt = encode_example(tok, row, chat)
        assert ids[:n_prompt] == encode_prompt(tok, row.as_dict(), chat)  # the RL prompt, templated or not
        assert tok.decode(ids[n_prompt:]) == " 1+1=2\n#### 2</s>"


def test_a_chat_row_trains_on_its_assistant_turns_only_the_earlier_messages_are_the_prompt():
    tok = tiny_tokenizer(CHATML)
    messages = [
        {"role": "system", "content": "Add."},
        {"role": "user", "content": "1+1"},
        {"role": "assistant", "content": " 2"},
        {"role": "user", "content": "and 2+2"},
        {"role": "assistant", "content": " 4"},
        {"role": "user", "content": "bye"},  # after the last answer: nothing to train, left out
    ]
    ids, flags = encode_example(tok, _row(messages=messages), chat=True)
    assert len(flags) == len(ids)
    prompt = encode_prompt(tok, {"messages": messages[:2]}, chat=True)  # what an RL episode starts from
    assert ids[: len(prompt)] == prompt and not any(flags[: len(prompt)])
    assert tok.decode([t for t, f in zip(ids, flags) if f]) == " 2</s> 4</s>"
    # The user turn between the answers as an episode appends it (realhf.system.rollout.episode.Gen): after
    # the EOS the model ended its answer with (here not the template's <|im_end|>), generation
    # prompt after it.
    assert tok.decode(ids[len(prompt) :]) == " 2</s><|im_start|>user\nand 2+2<|im_end|>\n<|im_start|>assistant\n 4</s>"


def test_a_row_without_anything_to_train_on_is_refused_naming_it(tmp_path):
    with pytest.raises(DatasetFormatError, match=r"^row: nothing to train on"):
        encode_example(tiny_tokenizer(), _row(prompt="Q"), chat=False)
    with pytest.raises(DatasetFormatError, match=r"^row: the chat messages begin with an assistant turn"):
        encode_example(tiny_tokenizer(CHATML), _row(messages=[{"role": "assistant", "content": "x"}]), chat=True)
    with pytest.raises(DatasetFormatError, match=r"^row: sft_trace has no assistant turn"):
        encode_example(tiny_tokenizer(CHATML), _row(prompt="Q", sft_trace=[{"role": "tool", "content": "1"}]), True)
    # Before training starts, naming the file and line.
    path = tmp_path / "train.jsonl"
    path.write_text('{"query_id": "a", "prompt": "Q", "solutions": ["x"]}\n{"query_id": "b", "prompt": "Q"}\n')
    with pytest.raises(DatasetFormatError, match=rf"^{path}:2: nothing to train on"):
        load_training_rows(SFTConfig(train_path=str(path)))


def test_split_by_tokens_gives_every_example_to_one_rank_about_equally_and_the_same_on_every_rank():
    lengths = [30, 5, 17, 22, 9, 41, 3, 12]
    for n_ranks in (1, 2, 3):
        shares = split_by_tokens(lengths, n_ranks)
        assert shares == split_by_tokens(lengths, n_ranks)  # deterministic: each rank computes it alone
        assert sorted(i for s in shares for i in s) == list(range(len(lengths)))
        totals = [sum(lengths[i] for i in s) for s in shares]
        assert max(totals) - min(totals) <= max(lengths)
    assert split_by_tokens(lengths, 1) == [list(range(len(lengths)))]  # DP=1: the batch as drawn
    assert split_by_tokens([7], 2) == [[0], []]  # fewer examples than ranks: a rank trains nothing


@pytest.mark.parametrize("warmup, steps", [(20, 200), (0, 10), (3, 7), (7, 25), (29, 100), (10, 10), (12, 10)])
def test_the_schedule_warms_up_for_warmup_steps_then_decays_by_cosine_to_zero(warmup, steps):
    opt = engine_config(SFTConfig(warmup_steps=warmup, steps=steps), 0).model.optimizer
    factor = lr_factor(opt.lr_scheduler_type, steps, opt.warmup_steps_proportion, opt.min_lr_ratio)

    def expected(step):  # warm-up from 1/warmup to 1, then cosine to 0 at `steps`
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, steps - warmup))))

    assert [factor(s) for s in range(steps + 1)] == [expected(s) for s in range(steps + 1)]


def test_rows_are_read_as_the_rl_run_reads_them_with_its_column_names(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text(
        "\n".join(
            json.dumps({"id": f"r{i}", "question": f"Q: {i}+1?\nA:", "answer": f" #### {i + 1}"}) for i in range(3)
        )
    )
    cfg = SFTConfig(train_path=str(path), max_train_rows=2)
    cfg.dataset.columns = DatasetColumnsConfig(query_id="id", prompt="question", solutions="answer")
    rows = load_training_rows(cfg)
    assert [(r.query_id, r.prompt, r.solutions) for r in rows] == [
        ("r0", "Q: 0+1?\nA:", (" #### 1",)),
        ("r1", "Q: 1+1?\nA:", (" #### 2",)),
    ]
    # The RL run's key names the column that is missing.
    cfg.dataset.columns = DatasetColumnsConfig(query_id="id")
    with pytest.raises(DatasetFormatError, match=r"set dataset.columns.prompt=<field> or dataset.columns.messages"):
        load_training_rows(cfg)


def test_a_parquet_file_trains(tmp_path):
    pytest.importorskip("datasets")
    import datasets

    rows = [json.loads(line) for line in open(f"{TINY_MATH}/data/train.jsonl")][:16]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
    cfg = SFTConfig(
        model_path=TINY_SFT, output_path=str(tmp_path / "out"), train_path=str(tmp_path / "train.parquet"),
        steps=2, batch_size=4, eval_n=-1, device="cpu",
    )  # fmt: skip
    report = train_sft(cfg, log=lambda _: None)
    assert len(report["losses"]) == 2 and all(math.isfinite(x) for x in report["losses"])


def test_bad_settings_are_refused_naming_the_key():
    ok = dict(model_path="m", output_path="o", train_path="t", eval_n=-1)
    for bad, key in (
        ({"dp": 0}, "dp must be >= 1"),
        ({"collective_timeout": 0.0}, "collective_timeout must be > 0"),
        ({"device": "tpu"}, "device='tpu': choose one of"),
        ({"micro_batch_tokens": -1}, "micro_batch_tokens must be >= 0"),
        ({"param_dtype": "fp8"}, "param_dtype='fp8'"),
    ):
        with pytest.raises(SystemExit, match=key):
            train_sft(SFTConfig(**ok, **bad))
    cfg = SFTConfig(**ok)
    cfg.lora.r, cfg.lora.target_modules = 4, []
    with pytest.raises(SystemExit, match=r"lora.target_modules is empty"):
        train_sft(cfg)
    cfg = SFTConfig(**ok)
    cfg.dataset.chat_template = "maybe"
    with pytest.raises(SystemExit, match=r"dataset.chat_template='maybe'"):
        train_sft(cfg)
