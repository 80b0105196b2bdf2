"""The shared softmax: sampled loss (TF's sampled_softmax_loss as bilm-tf used it) and the full softmax."""
from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from benchmarks.bench_inputs import resorting_sample
from elmo_cli.model.softmax import SharedSoftmax, expected_counts, log_uniform_sample


def test_every_class_sampled_equals_full_softmax():
    torch.manual_seed(0)
    sm = SharedSoftmax(30, 8)
    with torch.no_grad():
        sm.bias.normal_()
    h, targets = torch.randn(12, 8), torch.randint(0, 30, (12,))
    sampled, tries = log_uniform_sample(64, 30, torch.Generator().manual_seed(0))
    assert tries == -1 and sorted(sampled.tolist()) == list(range(30))
    full = -sm.log_probs(h, targets, chunk_size=7).mean()
    torch.testing.assert_close(sm.sampled_loss(h, targets, sampled, tries), full, atol=1e-5, rtol=1e-5)


def test_negatives_follow_the_log_uniform_law():
    V, n = 20, 20000
    g = torch.Generator().manual_seed(123)
    first = np.array([int(log_uniform_sample(1, V, g)[0][0]) for _ in range(n)])
    k = np.arange(V)
    p = np.log((k + 2) / (k + 1)) / np.log(V + 1)
    observed = np.bincount(first, minlength=V)
    chi2 = float(((observed - n * p) ** 2 / (n * p)).sum())
    assert chi2 < 43.82  # chi-square, 19 degrees of freedom, p = 0.001
    # a set of distinct negatives, and its expected counts use the number of draws it took
    ids, tries = log_uniform_sample(50, 1000, g)
    assert len(set(ids.tolist())) == 50 and tries >= 50
    q = expected_counts(ids, 1000, tries)
    assert ((q > 0) & (q <= 1)).all()
    k0 = float(ids[0])
    torch.testing.assert_close(q[0], torch.tensor(1 - (1 - math.log((k0 + 2) / (k0 + 1))
                                                         / math.log(1001)) ** tries, dtype=torch.float64))


def test_accidental_hits_are_masked():
    torch.manual_seed(1)
    V, P = 100, 6
    sm = SharedSoftmax(V, P)
    sampled = torch.tensor([0, 3, 5, 9, 17])
    tries = 11
    targets = torch.tensor([3, 50, 9, 17])  # rows 0, 2, 3 hit a sampled id
    h = torch.randn(4, P)
    loss = sm.sampled_loss(h, targets, sampled, tries)
    logq_s = torch.log(expected_counts(sampled, V, tries)).float()
    logq_t = torch.log(expected_counts(targets, V, tries)).float()
    per_row = []
    for i in range(4):
        true = h[i] @ sm.weight[targets[i]] + sm.bias[targets[i]] - logq_t[i]
        keep = sampled != targets[i]
        neg = h[i] @ sm.weight[sampled[keep]].t() + sm.bias[sampled[keep]] - logq_s[keep]
        per_row.append(torch.logsumexp(torch.cat([true[None], neg]), 0) - true)
    torch.testing.assert_close(loss, torch.stack(per_row).mean())


def test_sparse_gradients_equal_dense_and_touch_only_used_rows():
    torch.manual_seed(2)
    dense, sparse = SharedSoftmax(50, 4), SharedSoftmax(50, 4, sparse=True)
    sparse.load_state_dict(dense.state_dict())
    h, targets = torch.randn(7, 4), torch.randint(0, 50, (7,))
    sampled, tries = log_uniform_sample(10, 50, torch.Generator().manual_seed(3))
    dense.sampled_loss(h, targets, sampled, tries).backward()
    sparse.sampled_loss(h, targets, sampled, tries).backward()
    assert sparse.weight.grad.is_sparse and sparse.bias.grad.is_sparse
    torch.testing.assert_close(sparse.weight.grad.to_dense(), dense.weight.grad)
    torch.testing.assert_close(sparse.bias.grad.to_dense(), dense.bias.grad)
    used = set(targets.tolist()) | set(sampled.tolist())
    untouched = [i for i in range(50) if i not in used]
    assert (dense.weight.grad[untouched] == 0).all()
    assert set(sparse.weight.grad.coalesce().indices()[0].tolist()) <= used


def test_both_directions_in_one_lookup_give_each_directions_loss_and_gradients():
    """`sampled_losses` (one lookup for both directions) against `sampled_loss` called once per direction."""
    torch.manual_seed(4)
    one, apart = SharedSoftmax(60, 8), SharedSoftmax(60, 8)
    apart.load_state_dict(one.state_dict())
    g = torch.Generator().manual_seed(7)
    parts = [(torch.randn(9, 8), torch.randint(0, 60, (9,)), *log_uniform_sample(12, 60, g)) for _ in range(2)]
    together = one.sampled_losses(parts)
    separate = [apart.sampled_loss(*p) for p in parts]
    for a, b in zip(together, separate):
        torch.testing.assert_close(a, b)
    sum(together).backward()
    sum(separate).backward()
    torch.testing.assert_close(one.weight.grad, apart.weight.grad)
    torch.testing.assert_close(one.bias.grad, apart.bias.grad)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3000), vocab=st.integers(2, 6000), seed=st.integers(0, 2**31 - 1))
@example(n=8192, vocab=15_682, seed=0)  # many chunks: 44,012 draws
@example(n=2900, vocab=3000, seed=1)
def test_the_sampler_draws_what_resorting_every_draw_drew(n, vocab, seed):
    """The same ids in the same order and the same draw count as the sampler that re-sorted all its draws at every
    chunk (until 2026-12-05; `benchmarks/bench_inputs.py` times the two), from the same generator, which is left in
    the same state (a resumed run draws on from it)."""
    mine, ref = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    ids, tries = log_uniform_sample(n, vocab, mine)
    ref_ids, ref_tries = resorting_sample(n, vocab, ref)
    assert torch.equal(ids, ref_ids) and tries == ref_tries
    assert torch.equal(mine.get_state(), ref.get_state())
    if n < vocab:
        assert len(set(ids.tolist())) == n and 0 <= int(ids.min()) and int(ids.max()) < vocab
