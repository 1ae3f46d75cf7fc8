"""Issue 47: the train step is a graph from config. One run through the real system covers what a
user adds (CI time): a node of the user's own (examples/step_nodes/brevity.py, a reward term on
the trainer's ranks), a learned reward (a reward model trained by training/main_rm.py just
before, scoring every sample as a `reward_model` node) and the reference, both on the node
worker, a process of their own. A graph that cannot run is refused before any process starts,
naming the node."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

from helpers.fsdp_ranks import TINY_SFT
from helpers.paths import REPO, TESTS_DIR, TINY_MATH
from helpers.training_runs import SMALL_RUN, check_finished_run, run_training, small_run, trial_processes
from realhf.impl.dataset.prompt_dataset import load_prompts

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, TESTS_DIR]))
# Hydra's override grammar: a list of dicts, strings with ':' or '/' quoted.
BREVITY = (
    "ppo.graph.add=[{name:brevity,op:'examples/step_nodes/brevity.py:brevity',"
    "inputs:[loss_mask],outputs:['rewards/brevity'],args:{per_token:0.01}}]"
)


def _reward_model(tmp_path) -> str:
    """A small reward model (training/main_rm.py, 10 steps): right answers against the same
    working with a wrong final answer."""
    rows = []
    for r in load_prompts(os.path.join(TINY_MATH, "data", "train.jsonl"))[:64]:
        work, answer = r.solutions[0].rsplit("#### ", 1)
        rows.append(
            {
                "query_id": r.query_id,
                "prompt": r.prompt,
                "chosen": r.solutions[0],
                "rejected": f"{work}#### {int(answer) + 2}",
            }
        )
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(x) + "\n" for x in rows))
    out = tmp_path / "rm"
    proc = subprocess.run(
        [sys.executable, "training/main_rm.py", f"model_path={TINY_SFT}", f"output_path={out}",
         f"train_path={pairs}", "steps=10", "batch_size=16", "warmup_steps=1", "eval_n=-1", "device=cpu"],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=ENV,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return str(out)


@pytest.mark.e2e
def test_a_users_node_a_reward_model_and_the_reference_on_its_own_process_train_through_the_real_system(
    tmp_path, no_leftover_processes
):
    rm = _reward_model(tmp_path)
    steps = 4
    proc, metrics, log_dir = run_training(
        tmp_path,
        "graph-user-node",
        f"exp_ctrl.benchmark_steps={steps}",
        *SMALL_RUN,
        BREVITY,
        f"reward.path={rm}",
        "ppo.graph.reward_model=true",
        "ppo.kl_ctl=0.1",
        "ppo.graph.own_process=[ref_inf,reward_inf]",
        timeout=600,
        env=ENV,
    )
    check_finished_run(proc, metrics, steps, 2, tmp_path)
    # The user's node ran every step: minus 0.01 a generated token (1 to 24 of them) per sample.
    assert all(-0.24 <= m["brevity/mean"] <= -0.01 for m in metrics), [m.get("brevity/mean") for m in metrics]
    # The reward model scored every sample on the node worker (its numbers came back).
    assert all("reward_inf/mean" in m and "reward_inf/std" in m for m in metrics), metrics[0]
    # The reference ran on the node worker and its log-probs reached the right rows: at step 1
    # every sample came from version 0, the reference's own weights, so they match the sampler's
    # to float noise; the KL in the actor's loss is small then (the step's later minibatches
    # train an actor that has already moved: 0.0004-0.027 measured; a reference row sent to
    # another sample's place gives a KL of order 1).
    assert metrics[0]["ref_inf_behav_abs_diff"] < 1e-3, metrics[0]
    assert 0 <= metrics[0]["kl_ref"] < 0.1, [m["kl_ref"] for m in metrics]
    master_log = (log_dir / "master_worker-0.log").read_text()
    assert "step actor_inf, ref_inf, reward_inf, brevity | advantages | actor_train" in master_log
    assert "and 1 node worker" in master_log
    node_log = (log_dir / "node_worker-0.log").read_text()
    assert "nodes ['ref_inf', 'reward_inf'], engines ref" in node_log and "reward " in node_log
    model_log = (log_dir / "model_worker-0.log").read_text()
    loaded = next(line for line in model_log.splitlines() if "loaded in" in line and " params" in line)
    # The trainer holds only the actor: the reference and the reward model live on the node worker.
    assert "actor " in loaded and "ref " not in loaded and "reward " not in loaded, loaded
    # Every worker says where its start went (the time a restarted trial takes to train again).
    assert re.search(r"device and process groups \d+\.\ds, loaded in \d+\.\ds", loaded), loaded
    for log in (model_log, node_log, master_log):
        assert re.search(r"configured; running \(\d+\.\ds from process start to imported, \d+\.\ds to configure\)", log)


@pytest.mark.e2e
def test_a_step_that_cannot_run_is_refused_before_any_process_starts(tmp_path, no_leftover_processes):
    t0 = time.monotonic()
    proc, metrics, _ = run_training(
        tmp_path, "graph-refused", *SMALL_RUN, "ppo.kl_ctl=0.1", "ppo.graph.drop=[ref_inf]", timeout=120, env=ENV
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and metrics == []
    assert "node 'actor_train' reads 'ref_logprobs', which no node writes" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert time.monotonic() - t0 < 60
    assert trial_processes(str(tmp_path)) == []


@pytest.mark.e2e
@pytest.mark.slow
def test_the_reference_on_its_own_process_feeds_every_rank_of_a_tensor_parallel_dp2_trainer(
    tmp_path, no_leftover_processes
):
    """DP=2 × TP=2 (four model workers, two DP heads): the node worker computes each DP rank's
    reference log-probs and every rank of that replica gets them. Rows given to the wrong rank
    would differ from the sampler's by far more than float noise at step 1."""
    steps = 3
    proc, metrics, _ = run_training(
        tmp_path, "graph-dp2", f"exp_ctrl.benchmark_steps={steps}", *small_run(2), "allocation_mode=native.d1m1p1+d2m2p1",
        "ppo.kl_ctl=0.1", "ppo.graph.own_process=[ref_inf]", timeout=900, env=ENV,
    )  # fmt: skip
    check_finished_run(proc, metrics, steps, 2, tmp_path)
    assert metrics[0]["ref_inf_behav_abs_diff"] < 1e-3, metrics[0]
    assert 0 <= metrics[0]["kl_ref"] < 0.01, [m["kl_ref"] for m in metrics]
