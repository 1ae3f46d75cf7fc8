"""User code named in config (realhf.base.importing): `module.path:Name` found from the launch
directory and user_paths, `path/to/file.py:Name` relative to the launch directory or absolute,
and errors that name the key, the path tried and what was missing."""

import os
import sys
import textwrap

import pytest
from omegaconf import OmegaConf

from realhf.base import importing
from realhf.base.importing import import_object, use_import_roots

AGENT_SOURCE = textwrap.dedent(
    """
    from realhf.api.agent import Agent

    class RetryAgent(Agent):
        async def run_episode(self, row, gen, env):
            return 1.0

    def score(prompt, completion, **row):
        return 1.0
    """
)


@pytest.fixture
def launch_dir(tmp_path, monkeypatch):
    """A launch directory outside the repository, with this process's import state restored after."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(importing, "_launch_dir", None)
    monkeypatch.setattr(importing, "_user_paths", [])
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "retry.py").write_text(AGENT_SOURCE)
    return tmp_path


def test_a_module_beside_the_launch_directory_resolves_without_pythonpath(launch_dir):
    (launch_dir / f"mod_{launch_dir.name}.py").write_text("VALUE = 41\n")
    name = f"mod_{launch_dir.name}:VALUE"
    with pytest.raises(ValueError, match="no module"):
        import_object(name, "k")
    use_import_roots(str(launch_dir))
    assert import_object(name, "k") == 41


def test_a_module_in_a_user_path_resolves(launch_dir):
    (launch_dir / "lib").mkdir()
    (launch_dir / "lib" / f"libmod_{launch_dir.name}.py").write_text("VALUE = 7\n")
    assert use_import_roots(str(launch_dir), ["lib"]) == [str(launch_dir), str(launch_dir / "lib")]
    assert import_object(f"libmod_{launch_dir.name}:VALUE", "k") == 7


def test_a_file_path_is_read_from_the_launch_directory_not_the_working_directory(launch_dir, monkeypatch):
    use_import_roots(str(launch_dir))
    monkeypatch.chdir("/")
    cls = import_object("agents/retry.py:RetryAgent", "rollout.agent.type")
    assert cls.__name__ == "RetryAgent"
    # The same file by its absolute path, or named again: one module, the same class.
    assert import_object(f"{launch_dir}/agents/retry.py:RetryAgent", "k") is cls
    assert import_object("agents/retry.py:score", "k").__module__ == cls.__module__


def test_a_file_path_works_for_every_open_key(launch_dir):
    from realhf.api.agent import agent_class
    from realhf.api.algorithms import policy_loss

    use_import_roots(str(launch_dir))
    (launch_dir / "losses.py").write_text(
        "def mine(log_ratio, advantages, eps_clip, eps_clip_high):\n    return 0, 0\n"
    )
    assert agent_class("agents/retry.py:RetryAgent").__name__ == "RetryAgent"
    assert policy_loss("losses.py:mine").surrogate.__name__ == "mine"


def test_a_missing_file_is_named_with_the_path_tried(launch_dir):
    use_import_roots(str(launch_dir))
    with pytest.raises(ValueError) as e:
        import_object("agents/retyr.py:RetryAgent", "rollout.agent.type")
    msg = str(e.value)
    assert msg.startswith("rollout.agent.type='agents/retyr.py:RetryAgent': the file ")
    assert f"{launch_dir}/agents/retyr.py does not exist" in msg and f"launch directory {launch_dir}" in msg


def test_a_missing_attribute_is_named_with_the_closest_one(launch_dir):
    use_import_roots(str(launch_dir))
    with pytest.raises(ValueError) as e:
        import_object("agents/retry.py:RetryAgnt", "rollout.agent.type")
    assert str(e.value) == (
        f"rollout.agent.type='agents/retry.py:RetryAgnt': file {launch_dir}/agents/retry.py has no attribute "
        "'RetryAgnt'; did you mean 'RetryAgent'?"
    )
    with pytest.raises(ValueError, match=r"module 'json' has no attribute 'dump_s'; did you mean 'dumps'\?"):
        import_object("json:dump_s", "k")


def test_a_file_that_raises_on_import_is_named_with_its_error(launch_dir):
    (launch_dir / "broken.py").write_text("import no_such_dependency_xyz\n")
    use_import_roots(str(launch_dir))
    with pytest.raises(ValueError, match=r"k='broken.py:X': importing .*broken.py failed: ModuleNotFoundError"):
        import_object("broken.py:X", "k")
    with pytest.raises(ValueError, match=r"must be 'module.path:Name' or 'path/to/file.py:Name'"):
        import_object("broken.py", "k")


def test_a_worker_imports_from_the_launch_directory_its_context_names(launch_dir, monkeypatch):
    """realhf.apps.remote: the worker class itself may be the user's, named by a file relative to the
    launch directory the launcher recorded, whatever the worker's own working directory."""
    from realhf.apps.remote import load_worker

    (launch_dir / "my_worker.py").write_text(
        "from realhf.system.worker_base import Worker\n\nclass MyWorker(Worker):\n    pass\n"
    )
    config = launch_dir / "worker.yaml"
    context = {"worker_type": "mine", "launch_dir": str(launch_dir), "user_paths": [str(launch_dir / "agents")]}
    config.write_text(OmegaConf.to_yaml({"worker_class": "my_worker.py:MyWorker", "context": context}))
    monkeypatch.chdir("/")
    worker = load_worker(str(config))
    assert type(worker).__name__ == "MyWorker"
    assert sys.path.index(str(launch_dir)) < sys.path.index(str(launch_dir / "agents"))
    assert importing.launch_dir() == str(launch_dir) and os.getcwd() == "/"


def test_an_old_builtin_path_names_where_the_plugin_moved():
    with pytest.raises(ValueError) as e:
        import_object("realhf.impl.agent.tool_agent:ToolAgent", "rollout.agent.type")
    assert "'realhf.plugins.agents.tool_agent:ToolAgent'" in str(e.value)
    assert str(e.value).startswith("rollout.agent.type=")
    # and the new path is the class itself
    from realhf.plugins.agents.tool_agent import ToolAgent

    assert import_object("realhf.plugins.agents.tool_agent:ToolAgent") is ToolAgent
