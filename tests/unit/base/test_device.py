"""realhf.base.device on this GPU-less machine: the one place `cluster.device` becomes a torch device."""

import pytest
import torch

from realhf.base.device import cap_memory, dist_backend, pick_device

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="asserts what a machine without a GPU does")


def test_auto_picks_the_cpu_when_no_gpu_is_visible():
    assert pick_device("auto", local_rank=0) == torch.device("cpu")
    assert pick_device("auto", local_rank=3) == torch.device("cpu")


def test_cpu_is_the_cpu():
    assert pick_device("cpu") == torch.device("cpu")


def test_a_gpu_device_without_a_gpu_is_refused_naming_cluster_device():
    with pytest.raises(ValueError, match=r"cluster\.device=cuda .*no GPU.*cluster\.device=cpu or auto"):
        pick_device("cuda", local_rank=0)


def test_an_unknown_device_name_is_refused_listing_the_choices():
    with pytest.raises(ValueError, match=r"cluster\.device must be one of auto, cpu, cuda, got 'gpu'"):
        pick_device("gpu")


def test_the_cpu_collectives_run_on_gloo():
    assert dist_backend(torch.device("cpu")) == "gloo"


def test_gpu_collectives_run_on_nccl():
    assert dist_backend(torch.device("cuda", 0)) == "nccl"


def test_a_shared_gpu_caps_this_process_memory_and_a_whole_one_or_the_cpu_does_not(monkeypatch):
    capped = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: capped.append((f, d)))
    cap_memory(torch.device("cuda", 1), 0.5)
    assert capped == [(0.5, torch.device("cuda", 1))]
    cap_memory(torch.device("cuda", 0), 1.0)  # its GPU alone
    cap_memory(torch.device("cpu"), 0.5)  # the CPU has no cap
    assert len(capped) == 1


@pytest.mark.parametrize(
    "version_py, built_for_gpu",
    [
        ("cuda: Optional[str] = None\nhip: Optional[str] = None\n", False),  # the CPU wheel
        ("cuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n", True),
        ("cuda = None\nhip = '6.2'\n", True),
        ("__version__ = '9'\n", True),  # a layout it does not know: torch itself is asked
    ],
)
def test_a_cpu_only_torch_build_is_recognised_without_importing_torch(tmp_path, monkeypatch, version_py, built_for_gpu):
    import importlib.util

    from realhf.base import device_names

    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "version.py").write_text(version_py)
    spec = importlib.util.spec_from_file_location("torch", pkg / "__init__.py", submodule_search_locations=[str(pkg)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "torch" else None)
    assert device_names.torch_built_for_gpu() is built_for_gpu


@pytest.mark.system
def test_the_installed_torch_build_is_read_right_and_validation_needs_no_torch_for_a_cpu_run():
    import subprocess
    import sys

    import torch

    from realhf.base.device_names import torch_built_for_gpu

    assert torch_built_for_gpu() == (torch.version.cuda is not None or torch.version.hip is not None)
    # The launcher's device checks and the manager's modules stay free of torch (a second of CPU each).
    code = (
        "import sys; from realhf.experiments.validation import check_device; check_device('auto'); "
        "check_device('cpu'); import realhf.system.manager.gserver_manager; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
