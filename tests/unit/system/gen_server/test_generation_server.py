"""The GenerationServer worker as a real process under LocalLauncher, on a real Redis."""

import psutil
import pytest

from helpers import sglang_standin, shared_template
from helpers.http import http
from helpers.sglang_client import generate
from helpers.wait import wait_for
from realhf.api.cli_args import NativeEngineConfig
from realhf.api.worker_configs import GenerationServerConfig
from realhf.base import name_resolve, names
from realhf.base.secret import auth_headers
from realhf.experiments.worker_validation import validate_worker_config
from realhf.scheduler.local import LocalLauncher, WorkerSpec, log_tail
from realhf.system.worker_base import STATUS_COMPLETE, WorkerContext

EXP = "gen-server-test"


def _wait_for_servers(launcher, exp, trial, n, timeout=90.0):
    key = names.gen_servers(exp, trial)

    def registered():
        urls = name_resolve.get_subtree(key)
        if len(urls) >= n:
            return urls
        failure = launcher._check_workers()
        if failure is not None:
            pytest.fail(f"no {n} entries under {key} ({failure[1]}); log:\n{log_tail(failure[0].log_path)}")
        return None

    try:
        return wait_for(registered, timeout, f"{n} entries under {key}", interval=0.1)
    except TimeoutError as e:
        pytest.fail(f"{e}; log:\n{log_tail(launcher._procs[0].log_path)}")


def _complete(exp, trial, launcher):
    name_resolve.add(names.experiment_status(exp, trial), STATUS_COMPLETE, replace=True)
    launcher.wait(timeout=60)


@pytest.mark.system
def test_native_server_registers_under_gen_servers_serves_and_deregisters_on_exit(
    redis_name_resolve, qwen_path, hf_ref, tmp_path, no_leftover_processes
):
    trial = "native"
    cfg = GenerationServerConfig(
        model_path=qwen_path, weight_version=2, native=NativeEngineConfig(max_running_requests=8, context_length=256)
    )
    launcher = LocalLauncher(
        EXP,
        trial,
        str(tmp_path),
        name_resolve_config=redis_name_resolve,
        startup_timeout=60,
        worker_template=shared_template.address(),
    )
    with launcher:
        launcher.submit(WorkerSpec("generation_server", 2, [cfg, cfg]))
        urls = _wait_for_servers(launcher, EXP, trial, 2)
        assert len(set(urls)) == 2 and all(u.startswith("http://127.0.0.1:") for u in urls)
        for url in urls:
            out = generate(
                url,
                [5, 6, 7],
                max_new_tokens=8,
                temperature=0.0,
                ignore_eos=True,
                headers=auth_headers(launcher.secret),
            )
            assert out["output_ids"] == hf_ref.greedy([5, 6, 7], 8)
            assert out["meta_info"]["weight_version"] == "2"
        _complete(EXP, trial, launcher)
        assert all(p.exited == 0 for p in launcher._procs)
    name_resolve.reconfigure(redis_name_resolve)
    assert name_resolve.get_subtree(names.gen_servers(EXP, trial)) == []


@pytest.mark.system
def test_sglang_backend_worker_launches_waits_for_health_and_registers(
    redis_name_resolve, tmp_path, no_leftover_processes
):
    trial = "sglang"
    cfg = GenerationServerConfig(backend="sglang", model_path="/models/fake", tp_size=2, base_gpu_id=2)
    cfg.sglang.startup_timeout = 30
    launcher = LocalLauncher(EXP, trial, str(tmp_path), name_resolve_config=redis_name_resolve, startup_timeout=60)
    env = {"PYTHONPATH": sglang_standin.install(tmp_path / "fake"), "FAKE_SGLANG_DELAY": "0.5"}
    with launcher:
        launcher.submit(WorkerSpec("generation_server", 1, [cfg], env=env))
        (url,) = _wait_for_servers(launcher, EXP, trial, 1)
        assert http("GET", f"{url}/health", headers=auth_headers(launcher.secret))[0] == 200
        # SGLang requires the run's secret too, and got it through an owner-only file, not argv.
        assert http("GET", f"{url}/health")[0] == 401
        tree = [p for proc in launcher._procs for p in psutil.Process(proc.process.pid).children(recursive=True)]
        sglang = [p for p in tree if "sglang_entry" in " ".join(p.cmdline())]
        assert sglang and all(launcher.secret not in " ".join(p.cmdline()) for p in tree)
        key_file = tmp_path / "logs" / EXP / trial / "configs" / "sglang-key-0"
        assert key_file.read_text() == launcher.secret and key_file.stat().st_mode & 0o777 == 0o600
        log = (tmp_path / "logs" / EXP / trial / "sglang-0.log").read_text()
        assert "--tp-size', '2'" in log and "--base-gpu-id', '2'" in log and "--skip-tokenizer-init" in log
        assert launcher.secret not in log
        _complete(EXP, trial, launcher)


@pytest.mark.system
def test_a_backend_server_that_dies_ends_its_worker_naming_the_exit_code(
    redis_name_resolve, tmp_path, no_leftover_processes
):
    """The path a killed vLLM or SGLang server takes (the launcher then restarts the worker: the
    slow test_vllm_run.py kill test and tests/system/faults/test_generation_server_kill.py)."""
    trial = "sglang-dies"
    cfg = GenerationServerConfig(backend="sglang", model_path="/models/fake")
    cfg.sglang.startup_timeout = 30
    launcher = LocalLauncher(EXP, trial, str(tmp_path), name_resolve_config=redis_name_resolve, startup_timeout=60)
    env = {"PYTHONPATH": sglang_standin.install(tmp_path / "fake")}
    with launcher:
        launcher.submit(WorkerSpec("generation_server", 1, [cfg], env=env))
        (url,) = _wait_for_servers(launcher, EXP, trial, 1)
        worker = psutil.Process(launcher._procs[0].process.pid)
        (server,) = [p for p in worker.children(recursive=True) if "sglang_entry" in " ".join(p.cmdline())]
        server.kill()
        failed, _ = wait_for(launcher._check_workers, 30, "the generation server worker to exit")
        log = log_tail(failed.log_path)
        assert f"sglang server {url} exited with code -9" in log, log


@pytest.mark.parametrize(
    "change,field",
    [
        (dict(backend="trtllm"), "backend"),
        (dict(model_path=""), "model_path"),
        (dict(tp_size=2), "tp_size"),
        (dict(startup_timeout=0), "startup_timeout"),
    ],
)
def test_config_errors_name_the_field(change, field):
    cfg = GenerationServerConfig(**{"model_path": "/m", **change})
    with pytest.raises(ValueError, match=field):
        validate_worker_config(cfg)
    cfg = GenerationServerConfig(model_path="/m")
    cfg.native.kind = "onnx"
    with pytest.raises(ValueError, match="native.kind"):
        validate_worker_config(cfg)
    cfg = GenerationServerConfig(model_path="/m")
    cfg.native.decode_attention = "fast"
    with pytest.raises(ValueError, match="native.decode_attention"):
        validate_worker_config(cfg)


def test_the_native_engine_runs_on_pick_device_of_the_configured_device_and_gpu_index(monkeypatch, qwen_path):
    # The worker's own wiring, without a launcher: the device object pick_device returns for
    # (cfg.device, cfg.base_gpu_id) is the one the engine and its runner hold, capped at the
    # config's gpu_memory_fraction.
    import torch

    from helpers.native_server import held_tensors
    from realhf.base import device as device_module
    from realhf.base import logging
    from realhf.system.gen_server.generation_server import GenerationServer

    cpu, asked = torch.device("cpu"), []

    def pick(name, local_rank=0):
        asked.append((name, local_rank))
        return cpu

    monkeypatch.setattr(device_module, "pick_device", pick)
    capped = []
    monkeypatch.setattr(device_module, "cap_memory", lambda device, fraction: capped.append((device, fraction)))
    cfg = GenerationServerConfig(
        model_path=qwen_path,
        device="cpu",
        base_gpu_id=3,
        gpu_memory_fraction=0.5,
        native=NativeEngineConfig(max_running_requests=4, context_length=64),
    )
    server = GenerationServer.__new__(GenerationServer)  # no worker context needed for _start_native
    server.name = "generation_server/0"
    server.logger = logging.getLogger(server.name)
    server.ctx = WorkerContext(experiment_name=EXP, trial_name="device", worker_type="generation_server")
    try:
        port = server._start_native(cfg, seed=1)
        assert asked == [("cpu", 3)]
        assert capped == [(cpu, 0.5)]  # the placement's share of a GPU it would share with the trainer
        assert server._engine.device is cpu and server._engine.runner.device is cpu
        assert all(t.device == cpu for _, t in held_tensors(server._engine))
        out = generate(f"http://127.0.0.1:{port}", [5, 6, 7], max_new_tokens=4, temperature=0.0, ignore_eos=True)
        assert len(out["output_ids"]) == 4
    finally:
        for part in (getattr(server, "_server", None), getattr(server, "_engine", None)):
            if part is not None:
                part.stop()
