"""Specification of `cluster.gpu_placement` (realhf.base.placement): which GPUs every generation
server and trainer rank gets, with which share of their memory, and which layouts are refused.

A slot is written (node, local GPU indices, memory fraction)."""

import itertools

import pytest

from realhf.base.allocation_mode import AllocationMode, AllocationModeError
from realhf.base.placement import PLACEMENT_MODES, Placement, Slot, place


def slots(p: Placement):
    """(servers, trainer ranks) as (node, gpus, fraction) tuples."""
    as_tuple = lambda s: (s.node, s.gpus, pytest.approx(s.memory_fraction))  # noqa: E731
    return [as_tuple(s) for s in p.servers], [as_tuple(s) for s in p.trainer]


def placed(text, n_nodes, n_gpus, mode="auto", fraction=0.5):
    return place(AllocationMode.parse(text), n_nodes, n_gpus, mode, fraction)


def refusal(text, n_nodes, n_gpus, mode="auto", fraction=0.5) -> str:
    with pytest.raises(AllocationModeError) as info:
        placed(text, n_nodes, n_gpus, mode, fraction)
    return str(info.value)


# ---- one GPU per node ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "shared"])
def test_one_gpu_holds_a_server_and_the_trainer_sharing_its_memory(mode):
    p = placed("native.d1m1p1+d1m1p1", 1, 1, mode)
    assert p.mode == "shared"
    assert slots(p) == ([(0, (0,), 0.5)], [(0, (0,), 0.5)])


def test_the_server_takes_gen_memory_fraction_and_the_trainer_the_rest():
    p = placed("native.d1m1p1+d1m1p1", 1, 1, "shared", fraction=0.7)
    assert slots(p) == ([(0, (0,), 0.7)], [(0, (0,), 0.3)])


def test_separate_on_one_gpu_is_refused_naming_the_gpus_each_role_needs_and_the_way_out():
    message = refusal("native.d1m1p1+d1m1p1", 1, 1, "separate")
    assert message.startswith("allocation_mode='native.d1m1p1+d1m1p1': cluster.gpu_placement=separate needs ")
    assert "1 GPUs for generation + 1 for the trainer = 2, but the cluster has 1 node(s) × 1 GPUs = 1" in message
    assert "cluster.gpu_placement=shared (or auto) fits them on 1 GPUs" in message


def test_two_nodes_of_one_gpu_keep_server_and_trainer_apart():
    p = placed("native.d1+d1", 2, 1)
    assert p.mode == "separate"
    assert slots(p) == ([(0, (0,), 1.0)], [(1, (0,), 1.0)])


# ---- 2, 4, 8 GPUs per node -------------------------------------------------------------------------


def test_two_gpus_give_the_server_and_the_trainer_one_each_when_they_fit():
    p = placed("native.d1+d1", 1, 2)
    assert p.mode == "separate"
    assert slots(p) == ([(0, (0,), 1.0)], [(0, (1,), 1.0)])


def test_shared_on_two_gpus_puts_both_from_gpu_0_even_where_separate_would_fit():
    p = placed("native.d1+d1", 1, 2, "shared")
    assert slots(p) == ([(0, (0,), 0.5)], [(0, (0,), 0.5)])


def test_where_a_gpu_holds_only_one_role_that_process_has_it_alone():
    # 2 servers and 1 trainer rank on 2 GPUs: only GPU 0 holds both.
    p = placed("native.d2+d1", 1, 2)
    assert p.mode == "shared"
    assert slots(p) == ([(0, (0,), 0.5), (0, (1,), 1.0)], [(0, (0,), 0.5)])
    # 1 server and 2 trainer ranks: rank 1 has GPU 1 alone.
    p = placed("native.d1+d2", 1, 2)
    assert slots(p) == ([(0, (0,), 0.5)], [(0, (0,), 0.5), (0, (1,), 1.0)])


def test_four_gpus_hold_a_tensor_parallel_server_and_two_trainer_ranks():
    p = placed("sglang.d1m2+d2", 1, 4)
    assert p.mode == "separate"
    assert slots(p) == ([(0, (0, 1), 1.0)], [(0, (2,), 1.0), (0, (3,), 1.0)])
    # Shared, the server's two GPUs each hold a trainer rank.
    p = placed("sglang.d1m2+d2", 1, 4, "shared")
    assert slots(p) == ([(0, (0, 1), 0.5)], [(0, (0,), 0.5), (0, (1,), 0.5)])


def test_eight_gpus_split_four_and_four():
    p = placed("sglang.d4+d4", 1, 8)
    assert p.mode == "separate"
    assert [s.gpus for s in p.servers] == [(0,), (1,), (2,), (3,)]
    assert [s.gpus for s in p.trainer] == [(4,), (5,), (6,), (7,)]


def test_eight_gpus_share_when_the_servers_alone_take_them_all():
    # 4 servers × m2 = 8 GPUs + 4 trainer ranks: 12 apart do not fit, so auto shares.
    p = placed("sglang.d4m2+d4", 1, 8)
    assert p.mode == "shared"
    assert slots(p)[0] == [(0, (0, 1), 0.5), (0, (2, 3), 0.5), (0, (4, 5), 1.0), (0, (6, 7), 1.0)]
    assert slots(p)[1] == [(0, (r,), 0.5) for r in range(4)]


def test_a_layout_that_fits_neither_way_is_refused_naming_both_needs():
    message = refusal("sglang.d4+d4", 1, 2)
    assert "needs 4 GPUs for generation and 4 for the trainer: 8 apart (cluster.gpu_placement=separate)" in message
    assert "or 4 shared (cluster.gpu_placement=shared), but the cluster has 1 node(s) × 2 GPUs = 2" in message
    assert "raise cluster.n_nodes or cluster.n_gpus_per_node" in message


def test_shared_is_refused_when_one_role_alone_needs_more_gpus_than_there_are():
    message = refusal("native.d4+d1", 1, 2, "shared")
    assert "cluster.gpu_placement=shared needs max(4 GPUs for generation, 1 for the trainer) = 4" in message
    assert "1 node(s) × 2 GPUs = 2" in message


# ---- two nodes ---------------------------------------------------------------------------------


def test_gpus_are_counted_over_nodes():
    # 4 + 4 = 8 fits one node of 8 and two nodes of 4; not one node of 4 kept apart.
    mode = AllocationMode.parse("sglang.d4+d4")
    assert place(mode, 1, 8, "separate").mode == "separate"
    p = place(mode, 2, 4, "separate")
    assert slots(p) == ([(0, (g,), 1.0) for g in range(4)], [(1, (g,), 1.0) for g in range(4)])
    with pytest.raises(AllocationModeError, match=r"= 8, but the cluster has 1 node\(s\) × 4 GPUs = 4"):
        place(mode, 1, 4, "separate")


def test_the_trainer_starts_where_the_servers_end_even_mid_node():
    p = placed("native.d3+d1", 2, 2, "separate")
    assert [(s.node, s.gpus) for s in p.servers] == [(0, (0,)), (0, (1,)), (1, (0,))]
    assert [(s.node, s.gpus) for s in p.trainer] == [(1, (1,))]


def test_shared_on_two_nodes_pairs_servers_and_ranks_on_each_node():
    p = placed("sglang.d2m2+d4", 2, 2)
    assert p.mode == "shared"
    assert slots(p) == (
        [(0, (0, 1), 0.5), (1, (0, 1), 0.5)],
        [(0, (0,), 0.5), (0, (1,), 0.5), (1, (0,), 0.5), (1, (1,), 0.5)],
    )


def test_a_server_never_straddles_two_nodes():
    # 2 servers of 3 GPUs on nodes of 4: the second would hold GPUs of both nodes.
    message = refusal("sglang.d2m3+d1", 2, 4)
    assert "2 generation servers of 3 GPUs each do not divide into nodes of 4 GPUs" in message
    assert "choose m·p dividing n_gpus_per_node" in message
    # One server of 3 fits on node 0.
    assert placed("sglang.d1m3+d1", 2, 4).servers[0].gpus == (0, 1, 2)


def test_a_server_larger_than_a_node_is_refused():
    message = refusal("sglang.d1m4p2+d1", 2, 4)
    assert "each generation server needs 8 GPUs (m4 × p2) on one node, but a node has 4" in message


# ---- the CPU -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", PLACEMENT_MODES)
def test_without_gpus_every_process_runs_on_the_cpu_at_fraction_one(mode):
    p = placed("native.d2+d3", 1, 0, mode)
    assert p.mode == "cpu"
    assert slots(p) == ([(0, (), 1.0)] * 2, [(0, (), 1.0)] * 3)
    assert str(p.servers[0]) == "CPU"


def test_sglang_is_refused_on_the_cpu_with_the_native_alternative_suggested():
    message = refusal("sglang.d2+d1", 1, 0)
    assert "the sglang engine needs GPUs but n_gpus_per_node=0" in message and "'native.d2m1p1+d1m1p1'" in message


# ---- inputs, the log, launchers that choose GPUs themselves --------------------------------------


@pytest.mark.parametrize(
    "kw, field", [({"mode": "packed"}, "gpu_placement"), ({"fraction": 1.0}, "gen_memory_fraction")]
)
def test_a_mode_or_fraction_out_of_range_is_refused_naming_its_field(kw, field):
    with pytest.raises(ValueError, match=f"cluster.{field}"):
        placed("native.d1+d1", 1, 1, **kw)


def test_the_log_has_one_line_per_role_with_the_mode():
    lines = placed("native.d1+d1", 1, 1).describe()
    assert lines == [
        "gpu placement shared: generation servers 0: node 0 GPU 0 (0.5 of memory)",
        "gpu placement shared: trainer ranks 0: node 0 GPU 0 (0.5 of memory)",
    ]


def test_role_shares_give_every_process_of_a_role_its_smallest_share():
    p = placed("native.d2+d1", 1, 2).role_shares()
    assert [s.memory_fraction for s in p.servers] == [0.5, 0.5]
    assert [s.gpus for s in p.servers] == [(0,), (1,)]  # the GPUs themselves are unchanged


LAYOUTS = [
    f"{engine}.d{gd}m{tp}+d{td}"
    for engine, gd, tp, td in itertools.product(["sglang"], [1, 2, 3, 4], [1, 2], [1, 2, 3, 4, 8])
]


@pytest.mark.parametrize("n_nodes, n_gpus", [(1, 1), (1, 2), (1, 4), (1, 8), (2, 1), (2, 2), (2, 4), (2, 8)])
@pytest.mark.parametrize("mode", PLACEMENT_MODES)
def test_no_gpu_is_promised_more_than_its_memory_and_every_gpu_exists(n_nodes, n_gpus, mode):
    for text in LAYOUTS:
        try:
            p = placed(text, n_nodes, n_gpus, mode, fraction=0.6)
        except AllocationModeError:
            continue
        promised = {}
        for s in (*p.servers, *p.trainer):
            assert 0 <= s.node < n_nodes and all(0 <= g < n_gpus for g in s.gpus), (text, s)
            for g in s.gpus:
                promised[s.node, g] = promised.get((s.node, g), 0.0) + s.memory_fraction
        assert all(total <= 1.0 + 1e-9 for total in promised.values()), (text, p)
        if p.mode == "separate":
            assert all(s.memory_fraction == 1.0 for s in (*p.servers, *p.trainer))


def test_a_slot_reads_as_its_node_gpus_and_share():
    assert str(Slot(1, (2, 3), 0.25)) == "node 1 GPU 2,3 (0.25 of memory)"
    assert str(Slot(0, (0,))) == "node 0 GPU 0"
