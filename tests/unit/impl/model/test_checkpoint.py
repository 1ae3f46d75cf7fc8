"""The weight files on the real tiny model: published versions (complete HF directories, the
newest kept) and the recovery state (optimizer, schedule and version round trip)."""

import json
import os

import torch
from safetensors.torch import load_file

from realhf.api.cli_args import OptimizerConfig, PPOHyperparameters
from realhf.api.trajectory import Trajectory
from realhf.base.trial_files import published_weights_dir
from realhf.impl.model import actor, checkpoint
from realhf.impl.model.batching import pack_trajectories
from realhf.impl.model.optim import make_optimizer

from helpers.trajectories import TINY_SFT, load_rows, load_tiny, make_groups


def test_published_versions_are_complete_hf_dirs_and_only_the_last_two_are_kept(tiny, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, _ = tiny
    for v in (1, 2, 3):
        checkpoint.publish_weights(model, str(tmp_path), "actor", v, tokenizer_source=TINY_SFT, keep=2)
    root = published_weights_dir(str(tmp_path), "actor")
    assert sorted(os.listdir(root)) == ["2", "3"]  # no temp dirs left, version 1 pruned
    loaded = AutoModelForCausalLM.from_pretrained(root / "3")
    AutoTokenizer.from_pretrained(root / "3")
    weights = load_file(root / "3" / "model.safetensors")
    ref = model.state_dict()
    for name, w in weights.items():
        assert torch.equal(w, ref[name]), name
    assert json.loads((root / "3" / "config.json").read_text())["model_type"] == "qwen2"
    assert loaded.config.vocab_size == model.config.vocab_size


def test_recovery_state_round_trips_optimizer_schedule_and_version(tiny, tmp_path):
    model, tok = tiny
    model_copy, _ = load_tiny()
    opt, sched = make_optimizer(model_copy, OptimizerConfig(lr_scheduler_type="cosine"), total_steps=20)
    batch = pack_trajectories([Trajectory.from_msg(m) for m in make_groups(model, tok, load_rows(2), 2)], 0)
    batch.prox_logprobs = actor.inference_logprobs(model_copy, batch)
    actor.ppo_train_step(model_copy, opt, sched, batch, PPOHyperparameters(), 1.0)
    checkpoint.save_recover_state(tmp_path / "rec", model_copy, opt, sched, version=7, tokenizer_source=None)
    assert checkpoint.has_recover_state(tmp_path / "rec")
    restored, _ = load_tiny()
    opt2, sched2 = make_optimizer(restored, OptimizerConfig(lr_scheduler_type="cosine"), total_steps=20)
    info = checkpoint.load_recover_state(tmp_path / "rec", opt2, sched2)
    assert info["version"] == 7
    assert sched2.last_epoch == sched.last_epoch == 2
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert s1.keys() == s2.keys() and all(torch.equal(s1[k]["exp_avg"], s2[k]["exp_avg"]) for k in s1)


def test_publishing_keeps_the_newest_versions_and_drops_those_after_a_resumed_one(tiny, tmp_path):
    model, _ = tiny
    root = published_weights_dir(str(tmp_path), "actor")
    for v in (1, 2, 3, 4, 5, 6):  # a run that got to version 6, then was resumed from version 4
        checkpoint.publish_weights(model, str(tmp_path), "actor", v, None, keep=2)
    assert sorted(int(p.name) for p in root.iterdir()) == [5, 6]
    checkpoint.publish_weights(model, str(tmp_path), "actor", 4, None, keep=2)
    # 5 and 6 came from steps that will be trained again; a server must load 4, not be told it is gone.
    assert sorted(int(p.name) for p in root.iterdir()) == [4]
    assert (root / "4" / "config.json").is_file()
