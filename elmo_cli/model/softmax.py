"""The softmax shared by both directions: sampled for training, full (vocabulary-chunked) for evaluation.

The sampled loss follows TensorFlow's ``sampled_softmax_loss`` as bilm-tf used it (bilm-tf's): one set of distinct
negatives per call from the log-uniform law ``P(k) = log((k+2)/(k+1)) / log(V+1)``, every logit corrected by
subtracting the log of its expected count, and negatives equal to a row's own target masked out.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def log_uniform_probs(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``P(k) = log((k+2)/(k+1)) / log(V+1)`` for each id, float64."""
    k = ids.to(torch.float64)
    return torch.log1p(1.0 / (k + 1.0)) / math.log(vocab_size + 1.0)


def log_uniform_sample(n: int, vocab_size: int, generator: torch.Generator) -> tuple[torch.Tensor, int]:
    """Draw ``n`` distinct ids from the log-uniform law by rejection, as TF's unique candidate sampler.

    The draws come in chunks of ``max(2n, 1024)`` uniforms from `generator`; each chunk's ids not seen in an earlier
    chunk are kept in order of first draw until there are ``n``. (Each chunk is compared with a mask of the ids seen,
    not the whole history made unique again: 8,192 negatives from 15,682 words take about 44,000 draws, and
    re-sorting them all at each chunk took twice the time; `benchmarks/bench_inputs.py`.)

    # Returns
    ids, shape `(n,)` int64, in order of first draw; and the number of draws it took (for the expected counts).
    When ``n >= vocab_size`` every id is returned once and the draw count is reported as infinite (-1).
    """
    if n >= vocab_size:
        return torch.arange(vocab_size), -1
    log_range = math.log(vocab_size + 1.0)
    chunk = max(2 * n, 1024)
    seen: np.ndarray | None = None  # made when a second chunk is needed (a large vocabulary seldom needs one)
    kept: list[np.ndarray] = []
    count = drawn = 0
    while True:
        u = torch.rand(chunk, generator=generator, dtype=torch.float64).numpy()
        # Inverse CDF of the log-uniform law: floor(exp(u * log(V+1))) - 1 in [0, V).
        draws = np.minimum(np.floor(np.exp(u * log_range)).astype(np.int64) - 1, vocab_size - 1)
        ids, first = np.unique(draws, return_index=True)  # this chunk's distinct ids, where each came first
        if seen is not None:
            new = ~seen[ids]
            ids, first = ids[new], first[new]
        order = np.argsort(first)  # the positions are distinct: any sort gives the order of first draw
        ids, first = ids[order], first[order]
        if count + len(ids) >= n:
            kept.append(ids[:n - count])
            return torch.from_numpy(np.concatenate(kept)), drawn + int(first[n - count - 1]) + 1
        if seen is None:
            seen = np.zeros(vocab_size, dtype=bool)
        seen[ids] = True
        kept.append(ids)
        count, drawn = count + len(ids), drawn + chunk


def expected_counts(ids: torch.Tensor, vocab_size: int, num_tries: int) -> torch.Tensor:
    """Expected number of times each id appears in ``num_tries`` draws: ``1 - (1 - p)^tries`` (1 when exhaustive)."""
    if num_tries < 0:
        return torch.ones(ids.shape, dtype=torch.float64, device=ids.device)
    p = log_uniform_probs(ids, vocab_size)
    return -torch.expm1(num_tries * torch.log1p(-p))


class SharedSoftmax(nn.Module):
    """Output layer ``logits = h @ weight.T + bias`` over the vocabulary, shared by both directions.

    ``weight (V, P)``, ``bias (V,)``; stored in ``softmax.hdf5`` as ``W`` and ``b``. With ``sparse=True`` the
    sampled loss gathers its rows with sparse gradients, so an optimizer touches only the rows a batch used.

    With ``row_grads`` set (a GPU's training step, `elmo_cli.row_updates`), the sampled loss instead gathers its
    rows as leaves of their own: after the backward pass ``gathered`` holds ``(ids (M,), weight rows (M, P),
    bias rows (M,))`` whose ``.grad`` are the rows' gradients, dense and of a fixed size (a sparse gradient's
    size is known only after the GPU has summed it, so the host would wait), and `weight` and `bias` get none.
    """

    def __init__(self, vocab_size: int, dim: int, sparse: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, dim).normal_(0.0, 1.0 / math.sqrt(dim)))
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self.sparse = sparse
        self.row_grads = False
        self.gathered: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @property
    def vocab_size(self) -> int:
        return self.weight.shape[0]

    def _rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.row_grads and torch.is_grad_enabled():
            w, b = self.weight.detach()[ids].requires_grad_(), self.bias.detach()[ids].requires_grad_()
            self.gathered = (ids, w, b)
            return w, b
        w = F.embedding(ids, self.weight, sparse=self.sparse)
        # gather, not embedding of bias.unsqueeze(1): the view's backward cannot take a sparse gradient.
        b = torch.gather(self.bias, 0, ids, sparse_grad=self.sparse)
        return w, b

    def sampled_loss(self, h: torch.Tensor, targets: torch.Tensor, sampled: torch.Tensor, num_tries: int
                     ) -> torch.Tensor:
        """Mean sampled-softmax negative log-likelihood.

        # Parameters
        h : shape `(N, P)`; targets : shape `(N,)` int64; sampled : shape `(S,)` distinct negative ids with the
        `num_tries` draws it took (`log_uniform_sample`).

        # Returns
        scalar loss.
        """
        return self.sampled_losses([(h, targets, sampled, num_tries)])[0]

    def sampled_losses(self, parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]]
                       ) -> list[torch.Tensor]:
        """`sampled_loss` of each ``(h, targets, sampled, num_tries)`` (a training step's two directions), their
        rows of ``weight`` and ``bias`` gathered in one lookup.

        Why one lookup: each lookup's backward writes a gradient the size of the whole softmax (zeroed, then the
        rows added), and the lookups' gradients are then summed; for a vocabulary of 15k words and four lookups a
        step that was about 3.4 ms of a 125 ms step on 2 threads, one lookup 1.0 ms (`benchmarks/bench_step.py`).
        """
        ids = torch.cat([t for _, targets, sampled, _ in parts for t in (targets, sampled)])
        w_rows, b_rows = self._rows(ids)  # (sum N + S, P), (sum N + S,)
        sizes = [n for _, targets, sampled, _ in parts for n in (targets.shape[0], sampled.shape[0])]
        w_split, b_split = w_rows.split(sizes), b_rows.split(sizes)
        return [self._loss(h, targets, w_split[2 * k], b_split[2 * k], sampled, w_split[2 * k + 1],
                           b_split[2 * k + 1], num_tries)
                for k, (h, targets, sampled, num_tries) in enumerate(parts)]

    def _loss(self, h: torch.Tensor, targets: torch.Tensor, w_true: torch.Tensor, b_true: torch.Tensor,
              sampled: torch.Tensor, w_neg: torch.Tensor, b_neg: torch.Tensor, num_tries: int) -> torch.Tensor:
        """The loss of `sampled_loss`, given the targets' rows ``(N, P), (N,)`` and the negatives' ``(S, P), (S,)``."""
        V = self.vocab_size
        # on the ids' own device: a GPU step does not wait here to copy them to the host
        log_q_true = torch.log(expected_counts(targets, V, num_tries)).to(h.device, h.dtype)
        log_q_neg = torch.log(expected_counts(sampled, V, num_tries)).to(h.device, h.dtype)
        N, P = h.shape
        true_logit = (h * w_true).sum(-1) + (b_true - log_q_true)  # (N,)
        # One (N, 1 + S) logit matrix built in place: column 0 (a zero placeholder row in the product) takes the
        # true logit, then cross_entropy's fused log-softmax. Fewer passes over N x S than logsumexp over a cat.
        w_all = torch.cat([w_neg.new_zeros(1, P), w_neg])  # (1 + S, P)
        b_all = torch.cat([b_neg.new_zeros(1), b_neg - log_q_neg])  # (1 + S,)
        logits = torch.addmm(b_all.to(h.dtype), h, w_all.t().to(h.dtype))  # (N, 1 + S)
        logits[:, 0] = true_logit
        logits[:, 1:].masked_fill_(sampled.unsqueeze(0) == targets.unsqueeze(1), float("-inf"))  # accidental hits
        return F.cross_entropy(logits, torch.zeros(N, dtype=torch.long, device=h.device))

    def log_probs(self, h: torch.Tensor, targets: torch.Tensor, chunk_size: int = 65536) -> torch.Tensor:
        """Full-softmax log-probability of each target, computed in vocabulary chunks (memory O(N * chunk)).

        # Parameters
        h : shape `(N, P)`; targets : shape `(N,)` int64.

        # Returns
        shape `(N,)`, float32 log P(target | h), accumulated in float32 with a running logsumexp.
        """
        h32 = h.float()
        lse = torch.full((h.shape[0],), float("-inf"), device=h.device)
        for start in range(0, self.vocab_size, chunk_size):
            w = self.weight[start : start + chunk_size].float()
            logits = torch.addmm(self.bias[start : start + chunk_size].float(), h32, w.t())  # (N, chunk)
            # logsumexp in place: one buffer per chunk, no temporaries the size of the logits
            top = logits.amax(dim=1, keepdim=True)  # (N, 1)
            chunk_lse = logits.sub_(top).exp_().sum(dim=1).log_() + top.squeeze(1)
            lse = torch.logaddexp(lse, chunk_lse)
        true_logit = (h32 * self.weight[targets].float()).sum(-1) + self.bias[targets].float()
        return true_logit - lse
