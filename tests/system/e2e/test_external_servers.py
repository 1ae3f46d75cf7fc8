"""Issue 31, item 3: a run against generation servers started by hand (`gen_server.urls`): it
launches none, routes to them, updates their weights by broadcast, and leaves them running; a
second run against servers already ahead of it is refused before anything starts."""

import contextlib

import pytest

from helpers.http import http
from helpers.native_server import launch_server
from helpers.paths import REPO
from helpers.training_runs import SMALL_RUN, run_training

STEPS = 4
MODEL = f"{REPO}/assets/tiny-math/sft"


@pytest.mark.e2e
def test_a_run_uses_two_servers_started_by_hand_and_leaves_them_running(tmp_path, no_leftover_processes):
    with contextlib.ExitStack() as stack:
        started = [
            stack.enter_context(launch_server(tmp_path / f"server{i}.log", "--model-path", MODEL, "--n-threads", "1"))
            for i in range(2)
        ]
        urls = [url for _, url in started]
        overrides = [
            "allocation_mode=native.d2m1p1+d1m1p1",
            f"gen_server.urls=[{','.join(urls)}]",
            f"exp_ctrl.benchmark_steps={STEPS}",
            *SMALL_RUN,
        ]
        proc, metrics, log_dir = run_training(tmp_path, "external", *overrides, timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
        assert not list(log_dir.glob("generation_server-*.log")), "the run launched servers of its own"
        # Both servers still run and serve the run's last version, delivered by broadcast.
        for (p, url), i in zip(started, range(2)):
            assert p.poll() is None, f"server {url} was stopped by the run"
            status, info = http("GET", f"{url}/get_model_info")
            assert status == 200 and info["weight_version"] == str(STEPS), info
            assert "joined weight group" in (tmp_path / f"server{i}.log").read_text()
        trainer_log = (log_dir / "model_worker-0.log").read_text()
        assert f"version {STEPS}: " in trainer_log and "broadcast to 2 server(s)" in trainer_log, trainer_log[-2000:]

        # The same servers, a new run starting at version 0: refused before any process starts.
        proc, metrics, _ = run_training(tmp_path, "external-again", *overrides, timeout=120)
        assert proc.returncode != 0 and not metrics
        assert f"serves weight_version {STEPS}, ahead of this run's 0" in proc.stdout + proc.stderr
