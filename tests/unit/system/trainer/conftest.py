import pytest
import torch

from helpers.trajectories import load_rows, load_tiny, make_groups


@pytest.fixture(scope="module")
def msgs():
    """Three tiny-math prompts, four samples each, with the SFT model's behaviour log-probs."""
    torch.set_num_threads(1)
    model, tok = load_tiny()
    return make_groups(model, tok, load_rows(3), group_size=4)
