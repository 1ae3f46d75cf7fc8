"""The shared-prompt forward against one full forward per row: the same logits on every real
token and the same gradients, for Qwen2 (GQA, q/k/v biases, tied embeddings) and Llama; and the
micro-batch plan that keeps a group's rows together."""

import pytest
import torch

from helpers.tiny_models import make_random_causal_lm
from realhf.api.trajectory import Sample, Trajectory
from realhf.impl.engine.shared_prompt import shared_prompt_logits, shares_prompts
from realhf.impl.model.batching import micro_batches, pack_trajectories


def batch_of(prompt_lens, answers_per_group, seed=0):
    """Groups of rows with a shared random prompt each and random answers of varied lengths."""
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for i, (p, lengths) in enumerate(zip(prompt_lens, answers_per_group)):
        prompt = torch.randint(3, 250, (p,), generator=g).tolist()
        samples = [Sample(torch.randint(3, 250, (n,), generator=g).tolist(), [0.0] * n, [0] * n, 1.0) for n in lengths]
        trajs.append(Trajectory(f"q{i}", prompt, samples))
    return pack_trajectories(trajs, pad_id=0)


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = make_random_causal_lm(str(tmp_path_factory.mktemp(request.param)), request.param)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).train()


def grads_of(model, logits_fn, mask):
    model.zero_grad(set_to_none=True)
    logits = logits_fn()
    # A loss over every real position, weighted so each position's gradient differs.
    weights = torch.linspace(0.5, 1.5, logits.shape[1])[None, :, None]
    (logits.log_softmax(-1) * weights)[mask].sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


# The cache goes by the name this transformers takes: its old name warns (and goes in 5.40).
@pytest.mark.filterwarnings("error:.*past_key_values.*:FutureWarning")
def test_shared_prompt_logits_and_gradients_equal_one_forward_per_row(model):
    # Prompts of different lengths (the shorter one is padded among the prompts), answers of
    # different lengths, one of them empty, and a group of one.
    b = batch_of([5, 9, 3], [[4, 1, 7], [2, 6], [0, 5, 3, 3]])
    mask = b.attention_mask.bool()
    plain, g_plain = grads_of(
        model, lambda: model(input_ids=b.input_ids, attention_mask=b.attention_mask, use_cache=False).logits, mask
    )
    shared, g_shared = grads_of(
        model, lambda: shared_prompt_logits(model, b.input_ids, b.attention_mask, b.group_ids, b.prompt_lens), mask
    )
    assert shared.shape == plain.shape
    torch.testing.assert_close(shared[mask], plain[mask], rtol=1e-4, atol=1e-4)
    assert g_plain.keys() == g_shared.keys()
    for name, g in g_plain.items():  # float32 sums in another order: relative to the gradient's scale
        assert float((g_shared[name] - g).abs().max()) <= 1e-4 * float(g.abs().max()), name


def test_rows_of_a_group_must_share_a_group_to_share_anything():
    assert shares_prompts(torch.tensor([0, 0, 1]))
    assert not shares_prompts(torch.tensor([0, 1, 2]))
    assert not shares_prompts(torch.tensor([4]))


def test_by_group_micro_batches_keep_groups_together_and_stay_within_the_budget():
    b = batch_of([6, 4, 8, 5], [[1, 9, 3], [12, 2], [4, 4, 4, 4], [7]])
    rows = torch.arange(b.n_seqs)
    budget = 40
    chunks = micro_batches(b, rows, budget, by_group=True)
    assert sorted(torch.cat(chunks).tolist()) == rows.tolist()
    order = torch.cat(chunks)
    groups = b.group_ids[order].tolist()
    # Contiguous: once a group's rows end, it never appears again.
    assert all(groups.index(g) + groups.count(g) - 1 == len(groups) - 1 - groups[::-1].index(g) for g in set(groups))
    lengths, prompts = b.attention_mask.sum(1), b.prompt_lens
    for c in chunks:
        if len(c) > 1:
            cost = len(set(b.group_ids[c].tolist())) * int(prompts[c].max()) + len(c) * int(
                (lengths[c] - prompts[c]).max()
            )
            assert cost <= budget
    # Without by_group, rows go in order of length, groups mixed.
    plain = torch.cat(micro_batches(b, rows, budget))
    assert b.attention_mask[plain].sum(1).tolist() == sorted(lengths.tolist())
