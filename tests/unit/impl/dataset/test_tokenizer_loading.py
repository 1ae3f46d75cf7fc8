"""`load_tokenizer` gives what AutoTokenizer gives — the same class, the same ids, the same chat
text — and, once the class is remembered, without importing AutoTokenizer (so without torch:
1.3 s of CPU in every rollout worker's start)."""

import glob
import json
import os
import subprocess
import sys

import pytest

from helpers.paths import REPO
from realhf.impl.dataset import tokenizer_loading
from realhf.impl.dataset.tokenizer_loading import load_tokenizer

SHIPPED = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(REPO, "assets", "*", "*", "tokenizer_config.json")))
TEXTS = ["Q: Max has 5 shells. He finds 2 more.\nA: 5+2=7\n#### 7", "  spaces\tand\nnew lines ", "héllo wörld 😀"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _auto():
    """transformers' AutoTokenizer class (looked up each time: transformers replaces its own
    module object in sys.modules once its modeling code is imported, so a patch of the module's
    attribute may not be seen; the class is one object)."""
    from transformers import AutoTokenizer

    return AutoTokenizer


def _no_auto(*a, **k):
    raise AssertionError("AutoTokenizer was used although the class was remembered")


def _same(a, b):
    assert type(a) is type(b)
    for text in TEXTS:
        assert a(text)["input_ids"] == b(text)["input_ids"]
        assert a.decode(a(text)["input_ids"]) == b.decode(b(text)["input_ids"])
    assert (a.eos_token_id, a.bos_token_id, a.pad_token_id, len(a)) == (
        b.eos_token_id,
        b.bos_token_id,
        b.pad_token_id,
        len(b),
    )
    if a.chat_template:
        assert a.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True) == b.apply_chat_template(
            CHAT, tokenize=False, add_generation_prompt=True
        )


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: os.path.relpath(p, os.path.join(REPO, "assets")))
def test_a_remembered_class_loads_what_autotokenizer_loads_without_it(path, monkeypatch):
    want = _auto().from_pretrained(path)
    _same(load_tokenizer(path), want)  # first load: AutoTokenizer picks, the class is remembered
    monkeypatch.setattr(_auto(), "from_pretrained", _no_auto)
    _same(load_tokenizer(path), want)


def test_a_model_of_another_architecture_is_remembered_as_its_own_class(tmp_path, monkeypatch):
    from helpers.tiny_models import make_random_causal_lm

    path = make_random_causal_lm(str(tmp_path / "llama"), arch="llama")
    src = SHIPPED[0]
    for f in ("tokenizer.json", "tokenizer_config.json"):
        with open(os.path.join(src, f), "rb") as i, open(os.path.join(path, f), "wb") as o:
            o.write(i.read())
    want = _auto().from_pretrained(path)
    _same(load_tokenizer(path), want)
    monkeypatch.setattr(_auto(), "from_pretrained", _no_auto)
    _same(load_tokenizer(path), want)


def test_changed_files_are_loaded_afresh_and_a_bad_record_is_not_trusted(tmp_path, monkeypatch):
    path = tmp_path / "tok"
    path.mkdir()
    for f in os.listdir(SHIPPED[0]):
        if not f.endswith(".safetensors"):
            (path / f).write_bytes(open(os.path.join(SHIPPED[0], f), "rb").read())
    load_tokenizer(str(path))
    calls = []
    real = _auto().from_pretrained

    def counting(p):
        calls.append(p)
        return real(p)

    monkeypatch.setattr(_auto(), "from_pretrained", counting)
    load_tokenizer(str(path))
    assert calls == []  # remembered
    cfg = path / "tokenizer_config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "model_max_length": 77}))
    assert load_tokenizer(str(path)).model_max_length == 77 and len(calls) == 1  # new files: picked again
    key = tokenizer_loading._class_key(str(path))
    memo = tokenizer_loading.PassedChecks(tokenizer_loading._MEMO)
    for bad in ("os:system", "transformers.no_such_module:X", "transformers.tokenization_utils_base:not a name"):
        memo.record(key, bad)
        assert load_tokenizer(str(path)).model_max_length == 77  # not trusted: AutoTokenizer again
    assert len(calls) == 4


@pytest.mark.system  # starts an interpreter
def test_a_fresh_process_loads_a_remembered_tokenizer_without_importing_torch(tmp_path):
    code = (
        "import sys; from realhf.impl.dataset.tokenizer_loading import load_tokenizer; "
        f"t = load_tokenizer({SHIPPED[0]!r}); print(type(t).__name__, 'torch' in sys.modules)"
    )
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONPATH=REPO)
    run = lambda: subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)  # noqa: E731
    first, second = run(), run()
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout.split() == [type(_auto().from_pretrained(SHIPPED[0])).__name__, "True"]
    assert second.stdout.split() == [first.stdout.split()[0], "False"]
