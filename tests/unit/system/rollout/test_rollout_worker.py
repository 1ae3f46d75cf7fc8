"""Integration of the generation side on real processes (issue 3, "Integration").

One native generation server (`python -m realhf.launch_server` on the tiny-math SFT model), the
GserverManager and two RolloutWorkers (started by LocalLauncher), and in this process the DP
head's side: a NameResolvingZmqPuller feeding a StreamDataset, all on real Redis. The test plays
the trainer: it takes groups, checks them, and publishes new versions by writing weight
directories and `model_version`.
"""

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid

import pytest
import torch

from helpers import shared_template
from helpers.http import http
from helpers.paths import TINY_MATH
from helpers.wait import stop_process, wait_for
from realhf.api.cli_args import GenerationHyperparameters
from realhf.api.trajectory import Trajectory
from realhf.api.worker_configs import GserverManagerConfig, RolloutWorkerConfig
from realhf.base import name_resolve, names
from realhf.base.process import die_with_parent
from realhf.base.secret import auth_headers
from realhf.base.trial_files import published_version_dir
from realhf.scheduler.local import LocalLauncher, WorkerSpec
from realhf.system.streams.push_pull_stream import NameResolvingZmqPuller
from realhf.system.trainer.stream_dataset import StreamDataset, StreamTimeoutError

pytestmark = pytest.mark.system

MODEL = os.path.join(TINY_MATH, "sft")
DATA = os.path.join(TINY_MATH, "data", "train.jsonl")
EOS = 2
B, ETA, GROUP, MAX_NEW = 2, 1, 4, 24
# The servers' context as the workers are told it: prompts over 30 tokens (tiny-math's run from 24
# to 33) leave no room for MAX_NEW and are dropped once, counted (what validation would have
# refused, for rows beyond its scan of a large file).
MAX_PROMPT = 30


def start_native_server(log_path: str):
    """`python -m realhf.launch_server` on a free port; returns (process, url)."""
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "realhf.launch_server", "--model-path", MODEL, "--host", "127.0.0.1", "--port", "0"],
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=die_with_parent,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with open(log_path) as f:
            for line in f:
                if "ready at http://" in line:
                    return proc, line.strip().split("ready at ")[-1]
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"native generation server did not become ready: {open(log_path).read()[-2000:]}")


def get_json(url: str, headers=None):
    status, body = http("GET", url, timeout=10, headers=headers)
    assert status == 200, f"GET {url}: {status} {body}"
    return body


def publish_version(fileroot: str, exp: str, trial: str, version: int):
    """What the trainer does after a step: the HF directory, then the version key."""
    tmp = str(published_version_dir(fileroot, "actor", version)) + ".tmp"
    shutil.copytree(MODEL, tmp)
    os.rename(tmp, published_version_dir(fileroot, "actor", version))
    name_resolve.add(names.model_version(exp, trial, "actor"), version, replace=True)


@torch.no_grad()
def recomputed_logprobs(model, prompt_ids, output_ids):
    ids = torch.tensor([list(prompt_ids) + list(output_ids)])
    logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(output_ids)[:, None])[:, 0]


@pytest.mark.e2e
def test_server_manager_and_two_rollout_workers_stream_consistent_trajectories(
    tmp_path, redis_name_resolve, no_leftover_processes
):
    exp, trial = "rollout-integration", uuid.uuid4().hex[:8]
    fileroot = str(tmp_path)
    server, url = start_native_server(str(tmp_path / "server.log"))
    launcher = LocalLauncher(
        exp,
        trial,
        fileroot,
        name_resolve_config=redis_name_resolve,
        startup_timeout=120,
        worker_template=shared_template.address(),
    )
    out = {}
    dataset = None
    try:
        launcher.start()
        name_resolve.add_subentry(names.gen_servers(exp, trial), url)
        dataset = StreamDataset(
            NameResolvingZmqPuller(exp, trial, 0, secret=launcher.secret), parse=Trajectory.from_msg
        )
        launcher.submit(
            WorkerSpec(
                "gserver_manager",
                1,
                [
                    GserverManagerConfig(
                        groups_per_step=B,
                        max_head_offpolicyness=ETA,
                        n_servers=1,
                        run_dir=fileroot,
                        weight_sync="disk",  # this test publishes versions to disk itself
                        poll_interval=0.1,
                        max_concurrent_rollouts=8,
                        schedule_policy="least_requests",
                    )
                ],
            )
        )
        launcher.submit(
            WorkerSpec(
                "rollout_worker",
                2,
                [
                    RolloutWorkerConfig(
                        dataset_path=DATA,
                        tokenizer_path=MODEL,
                        group_size=GROUP,
                        max_concurrent_rollouts=4,
                        new_tokens_per_chunk=8,
                        gconfig=GenerationHyperparameters(max_new_tokens=MAX_NEW),
                        log_every_groups=1,
                        context_tokens=MAX_NEW + MAX_PROMPT,
                    )
                    for _ in range(2)
                ],
            )
        )
        # The launcher supervises from this (main) thread; the trainer's part runs beside it and
        # ends the trial by marking it COMPLETE.
        trainer = threading.Thread(
            target=_play_trainer, args=(dataset, fileroot, exp, trial, out, auth_headers(launcher.secret)), daemon=True
        )
        trainer.start()
        launcher.wait(timeout=400)
    finally:
        name_resolve.add(names.experiment_status(exp, trial), "COMPLETE", replace=True)
        launcher.stop_all()
        if dataset is not None:
            dataset.close()  # a trainer thread still waiting fails at once
            trainer.join(timeout=30)
        stop_process(server, timeout=15)
    if "error" in out:
        raise out["error"]
    v0, v1, v2, status = out["v0"], out["v1"], out["v2"], out["status"]

    groups = v0 + v1 + v2
    assert len({t.qid for t in groups}) == len(groups)
    assert status["accepted"] == len(groups) and status["version"] == 2
    assert status["ended"]["bad_prompt"] > 0 and all(len(t.prompt_ids) <= MAX_PROMPT for t in groups), status
    assert {t.version_end for t in v0} == {0} and all(t.version_end <= 1 for t in v1)
    assert all(t.version_start >= 1 and t.version_end <= 2 for t in v2)

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(MODEL).eval()  # every version holds these weights
    for t in groups:
        assert len(t.samples) == GROUP and t.metadata["query_id"] in t.qid
        for s in t.samples:
            n = len(s.output_ids)
            assert 0 < n <= MAX_NEW and len(s.logprobs) == len(s.versions) == n
            assert s.versions.tolist() == sorted(s.versions.tolist())  # a sample's tokens only move forward in version
            assert s.no_eos == (s.output_ids[-1] != EOS) and (s.no_eos or n <= MAX_NEW)
            assert s.reward in (-1.0, 1.0)
            ref = recomputed_logprobs(model, t.prompt_ids, s.output_ids)
            assert torch.allclose(torch.tensor(s.logprobs.tolist()), ref, atol=2e-4), (t.qid, s.logprobs, ref.tolist())


def _play_trainer(dataset, fileroot, exp, trial, out, auth):
    def take(n, timeout):
        return dataset.get(n, timeout=timeout)

    try:
        # Version 0: the staleness rule admits exactly (η + 1)·B groups, and then nothing more.
        out["v0"] = take((ETA + 1) * B, timeout=180)
        try:
            dataset.get(1, timeout=1.5)
            raise AssertionError(f"a group beyond (η + 1)·B = {(ETA + 1) * B} arrived at version 0")
        except StreamTimeoutError:
            pass
        # Version 1: B more groups are admitted; the server is updated in the background.
        publish_version(fileroot, exp, trial, 1)
        out["v1"] = take(B, timeout=60)
        manager = name_resolve.get(names.gserver_manager(exp, trial))
        wait_for(
            lambda: get_json(f"{manager}/status", auth)["servers"][0]["version"] == 1, 30, "the server at version 1"
        )
        # Version 2: these groups start after the server holds version >= 1.
        publish_version(fileroot, exp, trial, 2)
        out["v2"] = take(B, timeout=60)
        # A worker reports /finish_rollout just after its push: wait for the last reports.
        n = (ETA + 1) * B + 2 * B
        wait_for(lambda: get_json(f"{manager}/status", auth)["accepted"] == n, 30, f"{n} accepted groups")
        out["status"] = get_json(f"{manager}/status", auth)
    except BaseException as e:  # noqa: BLE001 - re-raised by the test
        out["error"] = e
    finally:
        name_resolve.add(names.experiment_status(exp, trial), "COMPLETE", replace=True)
