"""`python -m realhf.launch_server` as a real subprocess: serving, weight swaps, clean exit."""

import os
import signal
import subprocess
import threading
import time

import pytest
import torch

from helpers.http import http
from helpers.native_server import launch_server
from helpers.sglang_client import generate
from helpers.wait import wait_for

PROMPT = [7, 8, 9, 10]


@pytest.fixture
def launched(qwen_path, tmp_path, no_leftover_processes):
    log_path = tmp_path / "server.log"
    flags = ["--n-threads", "1", "--max-running-requests", "16", "--context-length", "512", "--weight-version", "3"]
    with launch_server(log_path, "--model-path", qwen_path, *flags) as (proc, url):
        yield proc, url, log_path


@pytest.mark.system
def test_weight_swap_from_disk_changes_outputs_and_weight_version(launched, qwen_path_b, hf_ref, hf_ref_b, gpt2_path):
    proc, url, _ = launched
    before = generate(url, PROMPT, max_new_tokens=16, temperature=0.0, ignore_eos=True)
    assert before["meta_info"]["weight_version"] == "3"  # a string, as SGLang's
    assert before["output_ids"] == hf_ref.greedy(PROMPT, 16)

    status, body = http("POST", f"{url}/update_weights_from_disk", {"model_path": qwen_path_b, "weight_version": 4})
    assert status == 200 and body["success"] is True, body
    after = generate(url, PROMPT, max_new_tokens=16, temperature=0.7, ignore_eos=True)
    assert after["meta_info"]["weight_version"] == "4"
    got = torch.tensor([t[0] for t in after["meta_info"]["output_token_logprobs"]])
    assert torch.allclose(got, hf_ref_b.logprobs(PROMPT, after["output_ids"], 0.7), atol=1e-4)
    greedy = generate(url, PROMPT, max_new_tokens=16, temperature=0.0, ignore_eos=True)["output_ids"]
    assert greedy == hf_ref_b.greedy(PROMPT, 16) and greedy != before["output_ids"]

    # An incompatible checkpoint is refused with a message; version 4 keeps serving.
    status, body = http("POST", f"{url}/update_weights_from_disk", {"model_path": gpt2_path, "weight_version": 5})
    assert status == 400 and body["success"] is False and "gpt2" in body["message"]
    assert generate(url, PROMPT, max_new_tokens=2)["meta_info"]["weight_version"] == "4"
    assert http("GET", f"{url}/get_model_info")[1]["weight_version"] == "4"


@pytest.mark.system
def test_a_model_folder_with_a_tokenizer_is_served_text_and_sigterm_stops_the_server_cleanly(
    tmp_path, no_leftover_processes
):
    # As a new user starts it: the committed tiny model, whose folder has a tokenizer.
    from transformers import AutoTokenizer

    model = os.path.join(os.path.dirname(__file__), "..", "..", "assets", "tiny-math", "sft")
    log_path = tmp_path / "server.log"
    with launch_server(log_path, "--model-path", model, "--max-running-requests", "4") as (proc, url):
        body = {"text": "1+2=", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
        status, out = http("POST", f"{url}/generate", body)
        assert status == 200, out
        tokenizer = AutoTokenizer.from_pretrained(model)
        assert out["text"] == tokenizer.decode(out["output_ids"], skip_special_tokens=True)
        assert out["meta_info"]["prompt_tokens"] == len(tokenizer.encode("1+2="))
        assert http("GET", f"{url}/get_model_info")[1]["tokenizer_path"] == model
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, log_path.read_text()
    assert "stopped" in log_path.read_text()


@pytest.mark.system
def test_sigterm_while_a_weight_groups_rendezvous_waits_stops_the_server_in_seconds(launched):
    """A gloo rendezvous cannot be interrupted: a server asked to stop while one waits (its sender
    gave up on another member, which died) exits without waiting out the group's timeout (60 s)."""
    from realhf.base.weight_group import HostedStore

    proc, url, log_path = launched
    store = HostedStore("127.0.0.1", 120)  # the sender's store; the sender itself never joins
    body = {
        "master_address": "127.0.0.1",
        "master_port": store.port,
        "rank_offset": 1,
        "world_size": 2,
        "group_name": "abandoned",
        "backend": "gloo",
    }
    threading.Thread(target=http, args=("POST", f"{url}/init_weights_update_group", body), daemon=True).start()
    wait_for(lambda: store.store.num_keys() > 0, 30, "the server's rendezvous to reach the store")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=60) == 0, log_path.read_text()
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server was still running 60 s after SIGTERM:\n{log_path.read_text()[-3000:]}")
    took = time.monotonic() - t0
    # uvicorn gives the request 5 s to finish, then cancels it; the rendezvous thread is a daemon.
    assert took < 15, f"the server took {took:.1f}s to stop"
    assert "stopped" in log_path.read_text()
    store.close()


def test_engine_options_are_the_fields_of_native_engine_config_with_their_defaults():
    import dataclasses

    from realhf.api.cli_args import NativeEngineConfig
    from realhf.launch_server import dataclass_from_args, parse_args

    args = parse_args(["--model-path", "m"])
    assert dataclass_from_args(NativeEngineConfig, args) == NativeEngineConfig()
    flags = [
        "--n-threads",
        "2",
        "--max-running-requests",
        "8",
        "--context-length",
        "64",
        "--dtype",
        "bfloat16",
        "--kind",
        "hf",
        "--random-seed",
        "7",
        "--decode-attention",
        "torch",
        "--keep-running-on-update",
    ]
    config = dataclass_from_args(NativeEngineConfig, parse_args(["--model-path", "m", *flags]))
    assert dataclasses.asdict(config) == dict(
        n_threads=2,
        max_running_requests=8,
        context_length=64,
        dtype="bfloat16",
        kind="hf",
        seed=7,
        keep_running_on_update=True,
        decode_attention="torch",
    )


@pytest.mark.parametrize(
    "flags", [["--dtype", "float16"], ["--kind", "vllm"], ["--n-threads", "0"], ["--tp-size", "2"]]
)
def test_bad_engine_options_are_refused_before_anything_loads(flags, capsys):
    from realhf.launch_server import parse_args

    with pytest.raises(SystemExit) as info:
        parse_args(["--model-path", "m", *flags])
    assert info.value.code == 2 and flags[0] in capsys.readouterr().err


def test_device_flags_pick_the_engine_device_and_a_missing_gpu_is_refused(monkeypatch, capsys):
    from realhf.launch_server import parse_args

    assert parse_args(["--model-path", "m", "--device", "cpu", "--base-gpu-id", "2"]).engine_device == torch.device(
        "cpu"
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as info:
        parse_args(["--model-path", "m", "--device", "cuda"])
    assert info.value.code == 2 and "--device cuda" in capsys.readouterr().err


def test_an_offline_hub_id_is_refused_before_the_model_loads(monkeypatch, capsys):
    from realhf.launch_server import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["--model-path", "realhf-test/NoSuchModel", "--port", "0"]) == 2
    assert (
        "--model-path='realhf-test/NoSuchModel' is not a local directory, the hub is offline (HF_HUB_OFFLINE=1)"
        in capsys.readouterr().err
    )
