"""Per-step metrics: the ranks' fetch and train replies merged into one row, and its log line."""

import io

from rich.console import Console

from realhf.system.stats.stats_logger import NoSpreadWatch, StatsLogger, format_line, step_metrics


def test_step_metrics_merge_the_ranks_staleness_rewards_and_throughput():
    fetch = [
        {
            "batch": {
                "n_groups": 1,
                "n_samples": 2,
                "reward_sum": 1.0,
                "n_success": 2,
                "n_groups_no_spread": 1,
                "n_no_eos": 0,
                "gen_tokens": 30,
                "output_tokens": 30,
                "head_offpolicyness": [2],
                "tail_offpolicyness": [1],
                "agent_metrics": {"turns": [3.0, 2, 1.0, 2.0], "tool_calls": [1.0, 1, 1.0, 1.0]},
            }
        },
        {
            "batch": {
                "n_groups": 1,
                "n_samples": 2,
                "reward_sum": -1.0,
                "n_success": 0,
                "n_groups_no_spread": 0,
                "n_no_eos": 1,
                "gen_tokens": 10,
                "output_tokens": 10,
                "head_offpolicyness": [0],
                "tail_offpolicyness": [0],
                "agent_metrics": {"turns": [5.0, 2, 2.0, 3.0]},
            }
        },
    ]
    train = [{"version": 5, "stats": {"loss": 0.5}, "train_time_s": 1.0}] * 2
    m = step_metrics(3, 5, fetch, train, {}, stale_dropped=4, step_time_s=2.0, wait_time_s=0.5, training_samples=6)
    assert m["reward_mean"] == 0.0 and m["success_rate"] == 0.5 and m["no_eos_rate"] == 0.25
    assert m["frac_reward_zero_std"] == 0.5  # one of the two groups had no spread
    assert (m["head_offpolicyness_mean"], m["head_offpolicyness_max"]) == (1.0, 2)
    assert (m["tail_offpolicyness_mean"], m["tail_offpolicyness_max"]) == (0.5, 1)
    assert m["samples_per_s"] == 2.0 and m["gen_tokens_per_s"] == 20.0 and m["loss"] == 0.5
    # The agents' own numbers: the mean over every sample that reported one, across the ranks.
    assert m["agent/turns"] == 2.0 and m["agent/tool_calls"] == 1.0
    assert not any(k.startswith("agent/") and k.endswith(("_min", "_max")) for k in m)  # only where asked
    asked = step_metrics(3, 5, fetch, train, {}, 4, 2.0, 0.5, 6, agent_extremes=["turns"])
    assert (asked["agent/turns_min"], asked["agent/turns_max"]) == (1.0, 3.0) and "agent/tool_calls_min" not in asked
    every = step_metrics(3, 5, fetch, train, {}, 4, 2.0, 0.5, 6, agent_extremes=["*"])
    assert (every["agent/tool_calls_min"], every["agent/tool_calls_max"]) == (1.0, 1.0)
    line = format_line(m)
    assert line.startswith("[bold]step 3[/bold] v5") and "head_stale 1.00 | /max 2" in line and "dropped 4" in line


def test_trained_qids_log_keeps_the_steps_up_to_the_resumed_checkpoint(tmp_path):
    import json

    from realhf.system.stats.stats_logger import TrainedQidsLog

    path = str(tmp_path / "logs" / "trained_qids.jsonl")
    log = TrainedQidsLog(path, last_step=0)
    for step in (1, 2, 3):
        log.write(step, [f"a{step}", f"b{step}"])
    log.close()
    log = TrainedQidsLog(path, last_step=2)  # resumed from the checkpoint of step 2: step 3 runs again
    log.write(3, ["c3"])
    log.close()
    lines = [json.loads(line) for line in open(path)]
    assert lines == [{"step": 1, "qids": ["a1", "b1"]}, {"step": 2, "qids": ["a2", "b2"]}, {"step": 3, "qids": ["c3"]}]


def test_completions_go_to_their_file_with_the_step_and_print_literally(tmp_path):
    import io
    import json

    from rich.console import Console

    from realhf.system.stats.stats_logger import CompletionsLog, StatsLogger

    path = str(tmp_path / "logs" / "completions.jsonl")
    log = CompletionsLog(path, last_step=0)
    for step in (1, 2):
        log.write(step, [{"qid": f"q{step}", "completion": "[bold]é :smile:"}, {"qid": "r", "completion": ""}])
    log.close()
    log = CompletionsLog(path, last_step=1)  # resumed from the checkpoint of step 1: step 2 runs again
    log.close()
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    assert rows == [
        {"step": 1, "qid": "q1", "completion": "[bold]é :smile:"},
        {"step": 1, "qid": "r", "completion": ""},
    ]

    out = io.StringIO()
    stats = StatsLogger(str(tmp_path / "metrics.jsonl"), console=Console(file=out, highlight=False, soft_wrap=True))
    stats.echo_lines(["  completion 1/1 | [bold]x[/bold] :smile:"])  # the model's text, not markup
    stats.close()
    assert out.getvalue() == "  completion 1/1 | [bold]x[/bold] :smile:\n"


def test_a_run_whose_groups_have_no_spread_is_warned_once_naming_the_causes(tmp_path):
    watch = NoSpreadWatch(threshold=0.9, patience=3)
    flat = {"frac_reward_zero_std": 1.0, "reward_mean": -0.5}
    assert [watch.check(flat), watch.check(flat)] == [None, None]
    assert watch.check({"frac_reward_zero_std": 0.5}) is None  # a step with spread ends the stretch
    assert [watch.check(flat), watch.check(flat)] == [None, None]
    warning = watch.check(flat)
    assert "the last 3 steps learnt (almost) nothing" in warning and "100% of this step's groups" in warning
    assert "never (or always) solves the task" in warning and "reward is constant" in warning
    assert watch.check(flat) is None  # once
    assert NoSpreadWatch().check({"step": 1}) is None  # an evaluator row has no such number

    out = io.StringIO()
    logger = StatsLogger(str(tmp_path / "metrics.jsonl"), console=Console(file=out, width=400), echo=False)
    for step in range(12):
        logger.log({"step": step, "version": step, "frac_reward_zero_std": 0.95, "reward_mean": -0.5})
    logger.close()
    assert out.getvalue().count("warning:") == 1 and "the last 10 steps" in out.getvalue()


def test_batch_summary_counts_the_groups_whose_rewards_are_all_equal():
    from realhf.api.trajectory import Sample, Trajectory
    from realhf.impl.model.batching import batch_summary

    def group(*rewards):
        return Trajectory("q", [1], [Sample([4], [-0.5], [0], r) for r in rewards])

    summary = batch_summary([group(1.0, 1.0), group(1.0, -1.0), group(-0.5, -0.5, -0.5), group(1.0)], version=1)
    assert summary["n_groups_no_spread"] == 2  # a group of one sample has no spread to lack
