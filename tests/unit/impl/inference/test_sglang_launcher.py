"""The sglang backend without sglang: command construction and the readiness / teardown logic,
against a stand-in `sglang.launch_server` that parses SGLang's flags strictly."""

import re
import time

import psutil
import pytest

from helpers import sglang_standin
from realhf.api.cli_args import SGLangConfig
from realhf.base.network import find_free_port
from realhf.impl.inference.server_process import ServerLaunchError, ServerProcess, http_healthy
from realhf.impl.inference.sglang_launcher import build_sglang_command

pytestmark = pytest.mark.system


def flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def test_command_has_the_required_sglang_flags_and_only_the_configured_optional_ones():
    cmd = build_sglang_command(
        "/models/m", "10.0.0.5", 30001, SGLangConfig(), tp_size=2, base_gpu_id=4, seed=7, python="/usr/bin/python3"
    )
    assert cmd[:3] == ["/usr/bin/python3", "-m", "sglang.launch_server"]
    assert flag(cmd, "--model-path") == "/models/m" and "--skip-tokenizer-init" in cmd
    assert flag(cmd, "--tp-size") == "2" and flag(cmd, "--base-gpu-id") == "4"
    assert flag(cmd, "--random-seed") == "7" and flag(cmd, "--host") == "10.0.0.5" and flag(cmd, "--port") == "30001"
    assert flag(cmd, "--mem-fraction-static") == "0.8" and flag(cmd, "--dtype") == "bfloat16"
    assert "--enable-metrics" in cmd
    for default_off in (
        "--context-length",
        "--max-running-requests",
        "--chunked-prefill-size",
        "--attention-backend",
        "--disable-radix-cache",
    ):
        assert default_off not in cmd

    cfg = SGLangConfig(
        context_length=4096,
        max_running_requests=64,
        chunked_prefill_size=8192,
        attention_backend="triton",
        disable_radix_cache=True,
        enable_metrics=False,
        extra_args=["--schedule-policy", "lpm"],
    )
    cmd = build_sglang_command("/m", "127.0.0.1", 1, cfg)
    assert flag(cmd, "--context-length") == "4096" and flag(cmd, "--max-running-requests") == "64"
    assert flag(cmd, "--chunked-prefill-size") == "8192" and flag(cmd, "--attention-backend") == "triton"
    assert "--disable-radix-cache" in cmd and "--enable-metrics" not in cmd
    assert cmd[-2:] == ["--schedule-policy", "lpm"]


def test_command_refuses_bad_values_naming_the_field():
    with pytest.raises(ValueError, match="model_path"):
        build_sglang_command("", "h", 1, SGLangConfig())
    with pytest.raises(ValueError, match="tp_size"):
        build_sglang_command("/m", "h", 1, SGLangConfig(), tp_size=0)
    with pytest.raises(ValueError, match=r"gpu_share must lie in \(0, 1\], got 0"):
        build_sglang_command("/m", "h", 1, SGLangConfig(), gpu_share=0)


def test_a_server_sharing_its_gpus_with_the_trainer_keeps_its_static_memory_inside_its_share():
    # mem_fraction_static is of a whole GPU; with half a GPU, SGLang gets 0.8 of that half.
    cmd = build_sglang_command("/m", "h", 1, SGLangConfig(mem_fraction_static=0.8), gpu_share=0.5)
    assert flag(cmd, "--mem-fraction-static") == "0.4"
    cmd = build_sglang_command("/m", "h", 1, SGLangConfig(mem_fraction_static=0.85), gpu_share=1.0)
    assert flag(cmd, "--mem-fraction-static") == "0.85"


def _process(tmp_path, env, timeout=30.0, cfg=None):
    port = find_free_port()
    cmd = build_sglang_command("/models/m", "127.0.0.1", port, cfg or SGLangConfig(context_length=128))
    env = {"PYTHONPATH": sglang_standin.install(tmp_path / "fake"), **env}
    return ServerProcess(
        cmd,
        f"http://127.0.0.1:{port}",
        str(tmp_path / "sglang.log"),
        startup_timeout=timeout,
        health_timeout=2.0,
        env=env,
        poll_interval=0.1,
    )


def test_start_waits_for_health_and_stop_kills_the_whole_tree(tmp_path, no_leftover_processes):
    server = _process(tmp_path, {"FAKE_SGLANG_DELAY": "1.0", "FAKE_SGLANG_CHILD": "1"})
    t0 = time.monotonic()
    server.start()
    try:
        assert time.monotonic() - t0 >= 1.0  # not before /health said 200
        assert http_healthy(server.url, 2.0) and server.exit_code() is None
        child_pid = int(re.search(r"child pid (\d+)", server.log_tail()).group(1))
        assert psutil.pid_exists(child_pid)
    finally:
        server.stop()
    assert server.exit_code() is not None
    assert not psutil.pid_exists(child_pid) or psutil.Process(child_pid).status() == psutil.STATUS_ZOMBIE


def test_a_server_that_exits_early_fails_fast_with_its_url_and_log_tail(tmp_path, no_leftover_processes):
    server = _process(tmp_path, {"FAKE_SGLANG_EXIT": "3"})
    t0 = time.monotonic()
    with pytest.raises(ServerLaunchError) as e:
        server.start()
    assert time.monotonic() - t0 < 20
    msg = str(e.value)
    assert server.url in msg and "code 3" in msg and "CUDA error: fake failure" in msg


def test_a_server_that_never_gets_healthy_times_out_naming_the_url_and_is_killed(tmp_path, no_leftover_processes):
    server = _process(tmp_path, {"FAKE_SGLANG_DELAY": "600"}, timeout=2.0)
    with pytest.raises(ServerLaunchError, match=re.escape(f"{server.url}/health")) as e:
        server.start()
    assert "fake sglang starting" in str(e.value)
    assert server.exit_code() is not None


def test_an_unknown_flag_reaches_sglang_and_fails_there(tmp_path, no_leftover_processes):
    # extra_args go verbatim; the stand-in parses strictly like SGLang's argparse.
    server = _process(tmp_path, {}, cfg=SGLangConfig(extra_args=["--no-such-flag"]))
    with pytest.raises(ServerLaunchError, match="no-such-flag"):
        server.start()


def test_with_a_key_file_the_server_requires_the_key_and_no_command_line_shows_it(tmp_path, no_leftover_processes):
    key = "k" * 64
    key_file = tmp_path / "key"
    key_file.write_text(key)
    port = find_free_port()
    cmd = build_sglang_command("/models/m", "127.0.0.1", port, SGLangConfig(), api_key_file=str(key_file))
    assert cmd[1:5] == ["-m", "realhf.impl.inference.sglang_entry", "--api-key-file", str(key_file)] and key not in cmd
    env = {"PYTHONPATH": sglang_standin.install(tmp_path / "fake")}
    url = f"http://127.0.0.1:{port}"
    server = ServerProcess(
        cmd,
        url,
        str(tmp_path / "sglang.log"),
        startup_timeout=30,
        health_timeout=2.0,
        env=env,
        poll_interval=0.1,
        headers={"Authorization": f"Bearer {key}"},
    ).start()
    try:
        assert http_healthy(url, 2.0, {"Authorization": f"Bearer {key}"})
        assert not http_healthy(url, 2.0) and not http_healthy(url, 2.0, {"Authorization": "Bearer nope"})
        assert key not in " ".join(psutil.Process(server.popen.pid).cmdline())
    finally:
        server.stop()
