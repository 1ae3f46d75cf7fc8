"""The docs a newcomer follows stay true: the README is short and its links resolve; every command
in the README and docs/ names a script or module that exists, and every training command's
config validates as written (its keys exist, its values pass the rules); docs/config.md is what
the config tree generates. Running them is tests/system/e2e/test_docs_commands_run.py's job (slow:
each for 2 steps)."""

import importlib.util
import re
import shlex
import sys

import pytest

from helpers.docs_commands import PAGES, ROOT, documented_commands
from realhf.experiments.config_loading import compose_config
from realhf.experiments.validation import check_values

TRAINING = ("examples/run_async_ppo.sh", "training/main_async_ppo.py")
SFT = "training/main_sft.py"
OPTIONAL_STACKS = {"sglang"}  # a GPU extra, never installed here: its commands are the user's to run
PLACEHOLDER = re.compile(r"<\w+>|\[key=value")  # `python -m scripts.bench.<name>`, `[key=value ...]`


COMMANDS = documented_commands()


def test_the_readme_is_short_and_its_links_and_the_docs_links_resolve():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"


def test_the_walk_finds_the_commands():
    assert ("README.md", "bash examples/run_async_ppo.sh") in COMMANDS
    assert len(COMMANDS) > 20


@pytest.mark.parametrize("page,command", COMMANDS, ids=[f"{p}:{c[:60]}" for p, c in COMMANDS])
def test_a_documented_command_names_what_exists_and_its_config_validates(page, command):
    if PLACEHOLDER.search(command):
        pytest.skip(f"{page}: `{command}` is a pattern, not a command")
    words = shlex.split(command)
    if words[0] == "realhf-train":  # the console script (setup.py): the same run as the script
        words = ["python", "training/main_async_ppo.py", *words[1:]]
    program, args = words[0], words[1:]
    if program != "bash":
        if args[:1] == ["-m"]:
            module = args[1]
            if module.split(".")[0] in OPTIONAL_STACKS:
                return
            assert importlib.util.find_spec(module) is not None, f"{page}: `{command}`: no module {module}"
            return
    script, overrides = args[0], args[1:]
    assert (ROOT / script).exists(), f"{page}: `{command}`: {script} does not exist"
    if script == SFT:
        _check_sft_keys(page, command, overrides)
        return
    if script not in TRAINING:
        return
    config_name = {}
    if "--config-name" in overrides:
        i = overrides.index("--config-name")
        config_name, overrides = {"config_name": overrides[i + 1]}, overrides[:i] + overrides[i + 2 :]
    if "--help" in overrides:
        return
    cfg = compose_config([o for o in overrides if "=" in o], **config_name)
    if not cfg.gen_server.vllm.python:  # .venv-vllm is a file of the machine (the suite installs it meanwhile)
        cfg.gen_server.vllm.python = sys.executable
    check_values(cfg)  # the values and the keys; the files they name are the user's


def _check_sft_keys(page, command, overrides):
    """A warm-start command's keys are SFTConfig's and its values have their fields' types (the
    paths it names and the required ones are the user's)."""
    from omegaconf import OmegaConf

    from realhf.api.cli_args import SFTConfig
    from realhf.experiments.config_keys import check_overrides

    given = [o for o in overrides if "=" in o]
    unknown = check_overrides(given, SFTConfig)
    assert unknown is None, f"{page}: `{command}`: {unknown}"
    OmegaConf.merge(OmegaConf.structured(SFTConfig), OmegaConf.from_dotlist(given))
