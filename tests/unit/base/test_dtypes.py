"""The one map of model dtypes: names without torch, torch dtypes on demand."""

import subprocess
import sys

import pytest
import torch

from realhf.base.dtypes import DTYPE_NAMES, torch_dtype


@pytest.mark.system
def test_dtype_names_import_without_torch():
    code = "import sys; from realhf.base.dtypes import DTYPE_NAMES; print('torch' in sys.modules, DTYPE_NAMES)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False ('float32', 'bfloat16')"


def test_every_name_maps_to_the_torch_dtype_of_that_name():
    assert [torch_dtype(n) for n in DTYPE_NAMES] == [torch.float32, torch.bfloat16]


def test_an_unknown_dtype_is_refused_naming_the_allowed_ones():
    with pytest.raises(ValueError, match=r"dtype must be one of \['bfloat16', 'float32'\], got 'float16'"):
        torch_dtype("float16")
