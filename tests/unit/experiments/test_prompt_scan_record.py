"""The token scan of the training prompts runs once per content (realhf.base.passed_checks):
an unchanged start skips loading the tokenizer (seconds: transformers imports torch), any change
of what the scan depends on runs it again, and a scan that fails is never recorded."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers.paths import REPO, TINY_MATH
from realhf.base.passed_checks import KeyDigest, PassedChecks
from realhf.experiments import file_validation
from realhf.experiments.file_validation import check_prompts, load_rows
from realhf.experiments.validation import ConfigError

SFT = os.path.join(TINY_MATH, "sft")
CONTEXT = 256


@pytest.fixture
def loads(monkeypatch, tmp_path):
    """A private cache of its own, and the tokenizer loads of the scan counted."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    calls = []
    real = file_validation._load_tokenizer
    monkeypatch.setattr(file_validation, "_load_tokenizer", lambda path: calls.append(path) or real(path))
    return calls


def _rows(tmp_path, prompts, name="train.jsonl"):
    path = tmp_path / name
    path.write_text(
        "".join(
            json.dumps({"query_id": str(i), "prompt": p, "solutions": ["#### 1"]}) + "\n" for i, p in enumerate(prompts)
        )
    )
    return load_rows("dataset.path", str(path))


def _model_copy(tmp_path):
    path = tmp_path / "model"
    shutil.copytree(SFT, path, ignore=shutil.ignore_patterns("*.safetensors"))
    return str(path)


def test_an_unchanged_scan_runs_once_and_every_input_it_depends_on_runs_it_again(tmp_path, loads):
    rows = _rows(tmp_path, ["1+1", "2+3", "7*8"])
    model = _model_copy(tmp_path)
    assert check_prompts("dataset.path", rows, model, "auto", 32, CONTEXT) == 3
    assert check_prompts("dataset.path", rows, model, "auto", 32, CONTEXT) == 3
    assert len(loads) == 1  # the second start did not load the tokenizer
    changed = [
        lambda: check_prompts(
            "dataset.path", _rows(tmp_path, ["1+1", "2+3", "7*9"], "b.jsonl"), model, "auto", 32, CONTEXT
        ),
        lambda: check_prompts("dataset.path", rows, model, "auto", 33, CONTEXT),
        lambda: check_prompts("dataset.path", rows, model, "auto", 32, CONTEXT + 1),
        lambda: check_prompts("dataset.path", rows, model, "off", 32, CONTEXT),
        lambda: check_prompts("dataset.path", rows, model, "auto", 32, CONTEXT, vocab_size=258),
        lambda: check_prompts("dataset.path", rows[:2], model, "auto", 32, CONTEXT),
    ]
    for n, scan in enumerate(changed, start=2):
        scan()
        assert len(loads) == n
    # A tokenizer file edited in place (the same directory): scanned again; the weights are not read.
    config = os.path.join(model, "tokenizer_config.json")
    with open(config) as f:
        tok_config = json.load(f)
    tok_config["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with open(config, "w") as f:
        json.dump(tok_config, f)
    check_prompts("dataset.path", rows, model, "auto", 32, CONTEXT)
    assert len(loads) == len(changed) + 2
    (tmp_path / "model" / "model.safetensors").write_bytes(b"new weights")
    check_prompts("dataset.path", rows, model, "auto", 32, CONTEXT)
    assert len(loads) == len(changed) + 2


def test_a_failed_scan_is_not_recorded_and_fails_again(tmp_path, loads):
    rows = _rows(tmp_path, ["1+1", "1" * 400])
    for _ in range(2):
        with pytest.raises(ConfigError, match=r"train.jsonl:2: prompt has \d+ tokens"):
            check_prompts("dataset.path", rows, SFT, "auto", 32, CONTEXT)
    assert len(loads) == 2
    assert not [p for p in os.listdir(PassedChecks("prompt-scan").dir) if p.startswith("prompt-scan")]


def test_a_cache_that_cannot_be_written_only_costs_a_scan(tmp_path, loads):
    checks = PassedChecks("x", directory=str(tmp_path / "missing" / "dir"))
    checks.record("k")  # nowhere to write: nothing raised, nothing recorded
    assert not checks.passed("k")


def test_the_key_tells_inputs_apart():
    assert KeyDigest("k").add("ab", "c").hexdigest() != KeyDigest("k").add("a", "bc").hexdigest()
    assert KeyDigest("k").add(None).hexdigest() != KeyDigest("k").add("None").hexdigest()
    assert KeyDigest("k").add(1).hexdigest() == KeyDigest("k").add(1).hexdigest()
    assert KeyDigest("k").hexdigest() != KeyDigest("j").hexdigest()


@pytest.mark.system
def test_a_second_start_of_the_same_experiment_validates_without_importing_torch(tmp_path):
    """The launcher's own start (validate_experiment in a fresh process): the first imports torch
    (the tokenizer's), the second does not."""
    program = (
        "import sys\n"
        "from realhf.experiments.config_loading import compose_config\n"
        "from realhf.experiments.validate import validate_experiment\n"
        f"validate_experiment(compose_config(['cluster.fileroot={tmp_path}/runs']))\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    outs = [
        subprocess.run([sys.executable, "-c", program], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        for _ in range(2)
    ]
    for out in outs:
        assert out.returncode == 0, out.stderr[-3000:]
    assert [o.stdout.strip().splitlines()[-1] for o in outs] == ["torch imported: True", "torch imported: False"]
