"""A whole launched run (DP=2 trainer, gloo): every listening socket of every process it starts is
on loopback, its HTTP endpoints want the trial's secret, and the secret is in no log and no
command line (issue 14, item 2)."""

import socket
import subprocess
import sys
import time

import psutil
import pytest

from helpers.http import http
from helpers.training_runs import Run, small_run
from realhf.base.network import bind_gloo_to

STEPS = 20  # long enough that every worker still listens when the sockets are listed after step 1


def _listening(pids):
    out = []
    for pid in pids:
        for _ in range(20):  # a process opening and closing files meanwhile can fail one scan
            try:
                conns = psutil.Process(pid).net_connections(kind="inet")
                break
            except psutil.NoSuchProcess:
                conns = []
                break
            except (psutil.Error, OSError):
                time.sleep(0.05)
        else:
            raise AssertionError(f"could not list the sockets of pid {pid}")
        out += [(pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return out


@pytest.mark.e2e
def test_a_run_listens_on_loopback_only_and_never_shows_its_secret(tmp_path, no_leftover_processes):
    run = Run(
        tmp_path,
        "listeners",
        *small_run(2),
        f"exp_ctrl.benchmark_steps={STEPS}",
        "exp_ctrl.ckpt_freq_steps=0",
        "allocation_mode=native.d1m1p1+d2m1p1",
        "cluster.worker_template=",  # the launch's own template (the default), not the suite's shared one
    )
    try:
        run.wait_steps(1, timeout=300)
        secret = run.secret()
        assert len(secret) >= 32
        run.track()  # a worker first seen between fork and exec had no command line yet
        pids = [pid for pid, (cmd, _) in run.seen.items() if psutil.pid_exists(pid)] + [run.proc.pid]
        listeners = _listening(pids)
        kinds = {run.seen.get(pid, ("launcher",))[0].split("configs/")[-1] for pid, _, _ in listeners}
        # The trainer ranks (gloo, TCPStore, trajectory pullers), the master, the servers, the manager.
        assert {
            "model_worker-0.yaml",
            "model_worker-1.yaml",
            "master_worker-0.yaml",
            "gserver_manager-0.yaml",
            "generation_server-0.yaml",
        } <= kinds, kinds
        assert listeners and all(ip == "127.0.0.1" for _, ip, _ in listeners), listeners
        # Every worker was forked from the launch's own worker template (cluster.fork_workers, the
        # default), which names the trial's log dir.
        for pid, (cmd, _) in run.seen.items():
            if "realhf.apps.remote worker" in cmd and psutil.pid_exists(pid):
                parent = " ".join(psutil.Process(pid).parent().cmdline())
                assert "realhf.apps.worker_template" in parent and str(run.log_dir) in parent, (cmd, parent)

        url = run.manager_url()
        assert http("GET", f"{url}/status", timeout=10)[0] == 401
        assert http("GET", f"{url}/status", timeout=10, headers={"Authorization": "Bearer nope"})[0] == 403
        status, body = http("GET", f"{url}/status", timeout=10, headers=run.auth())
        assert status == 200 and body["auth_refused"] == {"missing": 1, "wrong": 1}
        cmdlines = [cmd for cmd, _ in run.seen.values()] + [" ".join(psutil.Process(run.proc.pid).cmdline())]
        assert run.finish(timeout=300) == 0, run.output()[-3000:]
    finally:
        run.stop()
    assert not [c for c in cmdlines if secret in c]
    assert secret not in run.output()
    leaked = []
    for path in tmp_path.rglob("*"):
        # The workers' config files (0600 in a 0700 directory) are how the secret is handed over.
        if path.is_file() and path.parent.name != "configs" and secret.encode() in path.read_bytes():
            leaked.append(str(path))
    assert not leaked


def _non_loopback_ipv4():
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


_GLOO_LISTENERS = """
import datetime, json, sys
import psutil, torch.distributed as dist
from realhf.base.network import bind_gloo_to
bind_gloo_to(sys.argv[1])
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
print(json.dumps(sorted({c.laddr.ip for c in psutil.Process().net_connections(kind="inet")
                         if c.status == psutil.CONN_LISTEN})))
"""


def test_gloo_listens_on_the_bind_host_not_on_the_hostnames_address():
    """Here the hostname resolves to 127.0.0.1, so bind to another interface's address to see
    that gloo follows cluster.bind_host rather than the hostname."""
    ip = _non_loopback_ipv4()
    if ip is None:
        pytest.skip("no non-loopback IPv4 interface to bind to")
    out = subprocess.run([sys.executable, "-c", _GLOO_LISTENERS, ip], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == f'["{ip}"]'


def test_bind_gloo_to_names_the_field_for_an_address_of_no_interface():
    with pytest.raises(ValueError, match=r"cluster\.bind_host='192\.0\.2\.254'"):
        bind_gloo_to("192.0.2.254")
