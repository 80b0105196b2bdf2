"""A linear-chain CRF head for taggers: the log partition by the forward algorithm, the score of a label path, and
exact Viterbi decoding, optionally restricted to the transitions a span scheme allows.

Shapes at the boundary: emissions ``(B, T, L)`` float, tags ``(B, T)`` long, mask ``(B, T)`` bool with each row's
real tokens first (a row of length n has mask[:n] true). The score of a path y of length n is

    start[y_0] + sum_t emissions[t, y_t] + sum_{t>0} transitions[y_{t-1}, y_t] + end[y_{n-1}]

and the model's probability of y is exp(score(y) - log Z). Scheme constraints (`allowed_transitions`) apply to
decoding only: training sees every path, so a gold sequence that breaks the scheme still has a finite loss (the
training data is counted for such sequences, `count_violations`, and the count reported).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from elmo_cli.tasks.metrics import split_label

SCHEMES = ("BIO", "IOB1", "BIOES")


def allowed_transitions(labels: list[str] | tuple[str, ...], scheme: str | None
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What `scheme` allows, as boolean arrays: first label ``(L,)``, ``label[i] -> label[j]`` ``(L, L)``, and last
    label ``(L,)``. None allows everything (labels that are not spans: UPOS, genres)."""
    n = len(labels)
    start, trans, end = np.ones(n, bool), np.ones((n, n), bool), np.ones(n, bool)
    if scheme is None:
        return start, trans, end
    if scheme not in SCHEMES:
        raise ValueError(f"unknown span scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")
    parts = [split_label(lab) for lab in labels]
    for j, (tag, kind) in enumerate(parts):
        if scheme == "BIO":
            start[j] = tag != "I"
        elif scheme == "IOB1":
            start[j] = tag != "B"
        else:
            start[j] = tag in ("B", "S", "O")
            end[j] = tag in ("E", "S", "O")
        for i, (ptag, pkind) in enumerate(parts):
            inside = ptag in ("B", "I") and pkind == kind
            if scheme == "BIO":
                trans[i, j] = tag != "I" or inside
            elif scheme == "IOB1":
                trans[i, j] = tag != "B" or inside
            else:
                opened = ptag in ("B", "I")  # an open chunk must continue (I) or close (E) with its own type
                trans[i, j] = (tag in ("I", "E") and inside) if opened else tag in ("B", "S", "O")
    return start, trans, end


def count_violations(sequences: list[list[str]], scheme: str | None) -> int:
    """How many sequences contain a start, transition or end that `scheme` forbids."""
    if scheme is None:
        return 0
    labels = sorted({lab for seq in sequences for lab in seq})
    index = {lab: i for i, lab in enumerate(labels)}
    start, trans, end = allowed_transitions(labels, scheme)
    bad = 0
    for seq in sequences:
        ids = [index[lab] for lab in seq]
        if ids and (not start[ids[0]] or not end[ids[-1]] or
                    any(not trans[a, b] for a, b in zip(ids, ids[1:]))):
            bad += 1
    return bad


class CRF(nn.Module):
    """Transition scores ``(L, L)`` (from, to), start ``(L,)`` and end ``(L,)`` scores over L labels, learned; the
    emissions come from the tagger. `constrain` sets the scheme's forbidden moves for decoding."""

    def __init__(self, n_labels: int):
        super().__init__()
        self.n_labels = n_labels
        self.transitions = nn.Parameter(torch.zeros(n_labels, n_labels))
        self.start = nn.Parameter(torch.zeros(n_labels))
        self.end = nn.Parameter(torch.zeros(n_labels))
        # decoding constraints: 0 where allowed, -inf where forbidden (buffers, saved with the model)
        self.register_buffer("start_mask", torch.zeros(n_labels))
        self.register_buffer("transition_mask", torch.zeros(n_labels, n_labels))
        self.register_buffer("end_mask", torch.zeros(n_labels))

    def constrain(self, labels: list[str] | tuple[str, ...], scheme: str | None) -> None:
        start, trans, end = allowed_transitions(labels, scheme)
        for buf, allowed in ((self.start_mask, start), (self.transition_mask, trans), (self.end_mask, end)):
            buf.copy_(torch.from_numpy(np.where(allowed, 0.0, -np.inf)).to(buf))

    def log_partition(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """log Z per row ``(B,)``: log-sum-exp of the scores of every label path of the row's length."""
        alpha = self.start + emissions[:, 0]  # (B, L)
        for t in range(1, emissions.shape[1]):
            step = torch.logsumexp(alpha.unsqueeze(2) + self.transitions, dim=1) + emissions[:, t]  # (B, L)
            alpha = torch.where(mask[:, t].unsqueeze(1), step, alpha)
        return torch.logsumexp(alpha + self.end, dim=1)

    def path_score(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The score of the label path `tags` per row ``(B,)`` (positions outside `mask` ignored)."""
        m = mask.to(emissions.dtype)
        emit = emissions.gather(2, tags.unsqueeze(2)).squeeze(2)  # (B, T)
        trans = self.transitions[tags[:, :-1], tags[:, 1:]] * m[:, 1:]  # (B, T-1)
        last = tags.gather(1, (mask.sum(1, keepdim=True) - 1).clamp(min=0)).squeeze(1)  # (B,)
        return self.start[tags[:, 0]] + (emit * m).sum(1) + trans.sum(1) + self.end[last]

    def neg_log_likelihood(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``log Z - score(gold)`` per row ``(B,)``; the training loss is its sum over rows."""
        return self.log_partition(emissions, mask) - self.path_score(emissions, tags, mask)

    def viterbi(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The best label path of each row (Viterbi, exact) within the constraints set by `constrain`, on tensors
        only, so the exported graph decodes with the same code (`model.time_loop`: a Python loop here, an ONNX
        ``Scan`` in the graph).

        # Parameters
        emissions : `(B, T, L)`; mask : bool `(B, T)`, each row's tokens first.

        # Returns
        label ids `(B, T)` int64, 0 at padding.
        """
        from elmo_cli.tasks.model import time_loop

        B, T, L = emissions.shape
        trans = (self.transitions + self.transition_mask).detach()  # (L, L), from -> to
        first = (self.start + self.start_mask).detach()  # (L,)
        same = torch.arange(L, device=emissions.device).expand(B, L)  # back pointers of a padding step
        steps = torch.arange(T, device=emissions.device).view(T, 1).expand(T, B)

        def forward_step(score, xs):  # score (B, L): the best path ending in each label
            e_t, m_t, t = xs  # (B, L), (B,), (B,)
            best, arg = (score.unsqueeze(2) + trans).max(dim=1)  # (B, L) over the previous label
            new = torch.where((t == 0).unsqueeze(1), first + e_t, best + e_t)
            keep = m_t.unsqueeze(1)
            back = torch.where(keep & (t != 0).unsqueeze(1), arg, same)
            return torch.where(keep, new, score), back.clone()

        def backward_step(label, back_t):  # label (B,): the path's label at step t
            return back_t.gather(1, label.unsqueeze(1)).squeeze(1), label.clone()

        xs = (emissions.detach().transpose(0, 1), mask.transpose(0, 1), steps)
        score, back = time_loop(forward_step, emissions.new_zeros(B, L), xs)  # (B, L), (T, B, L)
        last = (score + (self.end + self.end_mask).detach()).argmax(dim=1)  # (B,): the label at each row's end
        path = time_loop(backward_step, last, back.flip(0))[1].flip(0)  # (T, B)
        return path.transpose(0, 1) * mask.to(path.dtype)

    @torch.no_grad()
    def decode(self, emissions: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
        """The best label path of each row as lists (`viterbi`), each of its row's length."""
        paths = self.viterbi(emissions, mask).tolist()
        return [p[:n] for p, n in zip(paths, mask.sum(1).tolist())]
