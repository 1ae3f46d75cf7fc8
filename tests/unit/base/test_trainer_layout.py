"""realhf.base.trainer_layout: which trainer rank holds which part, as the engine's mesh lays them out."""

import itertools

import pytest
import torch

from realhf.base.trainer_layout import TrainerLayout


@pytest.mark.parametrize(
    "dp, tp, pp", [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (2, 1, 2), (1, 2, 2), (2, 2, 2), (3, 2, 2)]
)
def test_ranks_are_laid_out_like_a_row_major_pp_dp_tp_mesh(dp, tp, pp):
    layout = TrainerLayout.of(dp * tp * pp, tp, pp)
    assert (layout.dp, layout.world) == (dp, dp * tp * pp)
    # init_device_mesh((pp, dp, tp)) numbers ranks row-major: the mesh's own index of each coordinate.
    mesh = torch.arange(layout.world).reshape(pp, dp, tp)
    for p, d, t in itertools.product(range(pp), range(dp), range(tp)):
        rank = int(mesh[p, d, t])
        assert layout.coords(rank) == (d, t, p)
    assert layout.heads() == [int(mesh[0, d, 0]) for d in range(dp)]
    replicas = [layout.replica(d) for d in range(dp)]
    assert sorted(r for rep in replicas for r in rep) == list(range(layout.world))  # each rank in one replica
    for d, rep in enumerate(replicas):
        assert rep[0] == layout.head(d) and sorted(rep) == sorted(int(x) for x in mesh[:, d, :].flatten())


def test_a_world_that_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="6 trainer ranks do not divide into tp=2 x pp=2"):
        TrainerLayout.of(6, 2, 2)
