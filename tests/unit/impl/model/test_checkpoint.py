"""Published weight versions on the real tiny model (realhf/impl/model/checkpoint.py): complete
HF directories written atomically, the newest kept. (The recovery checkpoint is
test_recover_checkpoint.py's.)"""

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from helpers.trajectories import TINY_SFT
from realhf.base.trial_files import published_version_dir, published_weights_dir
from realhf.impl.model import checkpoint


def _publish(model, run_dir, version: int, keep: int = 2, tokenizer_source=TINY_SFT, current=None):
    """What the model worker does per version: the HF directory, then the pruning."""
    checkpoint.save_hf_dir(model, published_version_dir(str(run_dir), "actor", version), tokenizer_source)
    return checkpoint.prune_versions(published_weights_dir(str(run_dir), "actor"), keep, current=current)


def test_published_versions_are_complete_hf_dirs_and_only_the_last_two_are_kept(tiny, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, _ = tiny
    for v in (1, 2, 3):
        _publish(model, tmp_path, v)
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


def test_publishing_keeps_the_newest_versions_and_drops_those_after_a_resumed_one(tiny, tmp_path):
    model, _ = tiny
    root = published_weights_dir(str(tmp_path), "actor")
    for v in (1, 2, 3, 4, 5, 6):  # a run that got to version 6, then was resumed from version 4
        _publish(model, tmp_path, v, tokenizer_source=None)
    assert sorted(int(p.name) for p in root.iterdir()) == [5, 6]
    doomed = _publish(model, tmp_path, 4, tokenizer_source=None, current=4)
    # 5 and 6 came from steps that will be trained again; a server must load 4, not be told it is gone.
    assert sorted(doomed) == [5, 6]
    assert sorted(int(p.name) for p in root.iterdir()) == [4]
    assert (root / "4" / "config.json").is_file()


def test_republishing_a_version_replaces_it_whole(tiny, tmp_path):
    model, _ = tiny
    out = published_version_dir(str(tmp_path), "actor", 3)
    checkpoint.save_hf_dir(model, out, TINY_SFT)
    (out / "stale.txt").write_text("from the run before the resume")
    checkpoint.save_hf_dir(model, out, None)
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()
    assert not (out / "tokenizer.json").exists()  # the new copy, not a merge with the old one
    assert sorted(p.name for p in out.parent.iterdir()) == ["3"]  # no .old-/.tmp- leftovers


def test_a_failed_save_leaves_the_previous_version_and_no_temporary_directory(tiny, tmp_path, monkeypatch):
    model, _ = tiny
    out = published_version_dir(str(tmp_path), "actor", 1)
    checkpoint.save_hf_dir(model, out, TINY_SFT)
    before = sorted(p.name for p in out.iterdir())

    def die(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(model, "save_pretrained", die)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save_hf_dir(model, out, TINY_SFT)
    assert sorted(p.name for p in out.iterdir()) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["1"]


def test_pruning_ignores_what_is_not_a_version(tmp_path):
    for name in ("1", "2", "3", ".tmp-4-abc", "notes"):
        (tmp_path / name).mkdir()
    assert checkpoint.prune_versions(tmp_path, keep=1) == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-4-abc", "3", "notes"]
    assert checkpoint.prune_versions(tmp_path, keep=0) == [3]
