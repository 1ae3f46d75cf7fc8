"""The vllm backend's command line and interpreter check (realhf/impl/inference/vllm_launcher.py);
the server it starts, for real: tests/system/engines/."""

import sys

import pytest

from realhf.api.cli_args import VLLMConfig
from realhf.impl.inference.vllm_launcher import (
    DEFAULT_PYTHON,
    LAUNCHER_FIELDS,
    REPO_ROOT,
    VLLMMissing,
    build_vllm_command,
    server_env,
    vllm_python,
)
from realhf.launch_vllm_server import parse_args


def test_every_server_field_reaches_the_server_by_its_option_and_parses_back(tmp_path):
    key = tmp_path / "key"
    key.write_text("s3cret")
    cfg = VLLMConfig(dtype="bfloat16", context_length=512, max_num_seqs=8, kv_cache_gib=0.5, enforce_eager=False)
    cmd = build_vllm_command(
        "/venv/bin/python",
        "/models/m",
        "127.0.0.1",
        31000,
        cfg,
        seed=7,
        weight_version=3,
        gpu_share=0.5,
        secret_file=str(key),
        weights_root="/run/published",
        max_request_bytes=1 << 20,
    )
    assert cmd[:3] == ["/venv/bin/python", "-m", "realhf.launch_vllm_server"]
    args = parse_args(cmd[3:])
    assert (args.model_path, args.host, args.port, args.seed, args.weight_version) == (
        "/models/m",
        "127.0.0.1",
        31000,
        7,
        3,
    )
    assert (args.gpu_share, args.weights_root, args.max_request_bytes) == (0.5, "/run/published", 1 << 20)
    assert args.secret == "s3cret" and "s3cret" not in cmd
    for name, value in vars(cfg).items():
        if name not in LAUNCHER_FIELDS:
            assert getattr(args, name) == value, name
    assert not any(f in " ".join(cmd) for f in ("--python", "--startup-timeout"))


def test_bad_values_are_refused_naming_them():
    with pytest.raises(ValueError, match="model_path is empty"):
        build_vllm_command("/p", "", "h", 1, VLLMConfig())
    with pytest.raises(ValueError, match="gpu_share"):
        build_vllm_command("/p", "/m", "h", 1, VLLMConfig(), gpu_share=0)


def test_a_missing_interpreter_names_the_field_and_the_set_up_command(tmp_path):
    with pytest.raises(VLLMMissing, match=r"gen_server.vllm.python=/no/python: no interpreter .*setup_env.sh vllm"):
        vllm_python(VLLMConfig(python="/no/python"))
    assert DEFAULT_PYTHON.endswith(".venv-vllm/bin/python")


@pytest.mark.system
def test_an_interpreter_without_vllm_is_refused_with_its_error():
    # This suite's own interpreter has no vllm (it lives in .venv-vllm).
    try:
        import vllm  # noqa: F401

        pytest.skip("vllm is importable here")
    except ImportError:
        pass
    with pytest.raises(VLLMMissing, match="cannot import vllm"):
        vllm_python(VLLMConfig(python=sys.executable))
    assert vllm_python(VLLMConfig(python=sys.executable), check=False) == sys.executable


def test_the_child_finds_this_clones_realhf_first():
    env = server_env({"X": "1"})
    assert env["PYTHONPATH"].split(":")[0] == REPO_ROOT and env["X"] == "1"


def test_per_server_binding_gives_each_server_its_own_cores():
    from realhf.impl.inference.vllm_launcher import per_server_cores

    assert [per_server_cores([0, 1], i, 2) for i in range(2)] == ["0", "1"]
    assert [per_server_cores(list(range(8)), i, 2) for i in range(2)] == ["0-3", "4-7"]
    assert [per_server_cores([0, 1, 2], i, 2) for i in range(2)] == ["0", "1"]  # the odd core left free
    assert [per_server_cores([0, 1], i, 3) for i in range(3)] == ["0", "1", "0"]  # more servers than cores
    assert per_server_cores([0, 2, 4, 6], 0, 2) == "0,2"
    assert per_server_cores([5], 0, 1) == "5"
    with pytest.raises(ValueError, match="server 2 of 2"):
        per_server_cores([0, 1], 2, 2)
