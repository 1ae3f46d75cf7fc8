"""The shared worker template's rules for which launch it serves (in-process: no fork)."""

import os
import sys
import time

import realhf.apps.worker_template as wt


def test_only_what_an_interpreter_reads_as_it_starts_decides_a_launch():
    env = {"PYTHONPATH": "/x", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "REALHF_TRIAL": "t", "HOME": "/h"}
    assert wt.start_env(env) == {"PYTHONPATH": "/x", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def test_a_realhf_module_changed_since_the_template_started_makes_it_stale():
    template = wt.Template()
    assert template._stale() == ""  # started now: nothing it imported is newer
    template.started = 0.0  # every module it imported is newer than that
    why = template._stale()
    assert why.startswith(os.path.dirname(os.path.dirname(wt.__file__))) and "changed since the template started" in why
    template.started = time.time() + 60
    assert template._stale() == ""


class _Channel:
    def __init__(self):
        self.sent = []

    def sendall(self, data):
        import msgpack

        self.sent.append(msgpack.unpackb(data))


def test_a_hello_is_answered_ready_or_refused_naming_what_differs(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    template = wt.Template()
    launcher = wt._Launcher(_Channel(), greeted=False)
    hello = {"python": sys.executable, "env": dict(os.environ), "package": wt._PACKAGE_DIR}
    template._greet(launcher, hello)
    assert launcher.sock.sent == [{"op": "ready", "pid": os.getpid(), "import_s": 0.0}] and launcher.greeted
    for other, why in [
        ({**hello, "python": "/other/python"}, "the launch runs /other/python"),
        ({**hello, "package": "/site-packages/realhf/"}, "the launch runs realhf from /site-packages/realhf/"),
        ({**hello, "env": {**os.environ, "OMP_NUM_THREADS": "4"}}, "differs in OMP_NUM_THREADS"),
    ]:
        launcher = wt._Launcher(_Channel(), greeted=False)
        template._greet(launcher, other)
        (reply,) = launcher.sock.sent
        assert reply["op"] == "refused" and reply["id"] == 0 and why in reply["error"] and not launcher.greeted
    launcher = wt._Launcher(_Channel(), greeted=False)
    template._handle(launcher, {"op": "fork", "id": 3})  # no hello first: nothing is forked
    assert launcher.sock.sent == [{"op": "refused", "id": 3, "error": "no hello before the fork"}]
