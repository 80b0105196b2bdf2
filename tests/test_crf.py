"""The CRF head against enumeration of every label sequence, and the span schemes' allowed transitions."""
import itertools

import pytest
import torch

from elmo_cli.tasks.crf import CRF, allowed_transitions, count_violations
from elmo_cli.tasks.metrics import detect_span_scheme


def _random_crf(n_labels: int, seed: int) -> CRF:
    g = torch.Generator().manual_seed(seed)
    crf = CRF(n_labels)
    with torch.no_grad():
        for p in (crf.transitions, crf.start, crf.end):
            p.copy_(torch.randn(p.shape, generator=g))
    return crf


def _score(crf: CRF, emissions: torch.Tensor, path: tuple[int, ...]) -> float:
    """The path's score written out term by term."""
    s = crf.start[path[0]] + crf.end[path[-1]]
    for t, y in enumerate(path):
        s = s + emissions[t, y]
        if t:
            s = s + crf.transitions[path[t - 1], y]
    return float(s)


def _batch(lengths: list[int], n_labels: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    emissions = torch.randn(len(lengths), max(lengths), n_labels, generator=g)
    mask = torch.arange(max(lengths)).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    return emissions, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_log_partition_score_and_viterbi_equal_enumeration(seed):
    n_labels, lengths = 3, [4, 1, 3, 2]
    crf = _random_crf(n_labels, seed)
    emissions, mask = _batch(lengths, n_labels, seed + 10)
    log_z = crf.log_partition(emissions, mask)
    best = crf.decode(emissions, mask)
    for b, n in enumerate(lengths):
        scores = {p: _score(crf, emissions[b], p) for p in itertools.product(range(n_labels), repeat=n)}
        want_z = torch.logsumexp(torch.tensor(list(scores.values()), dtype=torch.float64), 0).item()
        assert log_z[b].item() == pytest.approx(want_z, abs=1e-5)
        assert tuple(best[b]) == max(scores, key=scores.get)
        tags = torch.zeros(max(lengths), dtype=torch.long)
        path = max(scores, key=scores.get)
        tags[:n] = torch.tensor(path)
        got = crf.path_score(emissions[b : b + 1], tags.unsqueeze(0), mask[b : b + 1]).item()
        assert got == pytest.approx(scores[path], abs=1e-5)


def test_loss_is_a_proper_negative_log_likelihood():
    """exp(-nll) summed over every path of a row is 1, and the loss trains the gold path up."""
    crf = _random_crf(3, 4)
    emissions, mask = _batch([3], 3, 5)
    total = 0.0
    for p in itertools.product(range(3), repeat=3):
        total += torch.exp(-crf.neg_log_likelihood(emissions, torch.tensor([p]), mask)).item()
    assert total == pytest.approx(1.0, abs=1e-5)
    gold = torch.tensor([[2, 0, 1]])
    opt = torch.optim.SGD(crf.parameters(), lr=0.5)
    before = crf.neg_log_likelihood(emissions, gold, mask).item()
    for _ in range(20):
        opt.zero_grad()
        crf.neg_log_likelihood(emissions, gold, mask).sum().backward()
        opt.step()
    assert crf.neg_log_likelihood(emissions, gold, mask).item() < before / 2
    assert crf.decode(emissions, mask)[0] == [2, 0, 1]


@pytest.mark.parametrize("scheme", ["BIO", "IOB1", "BIOES"])
def test_constrained_viterbi_is_the_best_allowed_path(scheme):
    labels = {"BIO": ["B-X", "I-X", "B-Y", "I-Y", "O"], "IOB1": ["B-X", "I-X", "I-Y", "O"],
              "BIOES": ["B-X", "I-X", "E-X", "S-X", "O"]}[scheme]
    start, trans, end = allowed_transitions(labels, scheme)
    crf = _random_crf(len(labels), 7)
    crf.constrain(labels, scheme)
    emissions, mask = _batch([4, 3, 1], len(labels), 8)
    best = crf.decode(emissions, mask)
    for b, n in enumerate([4, 3, 1]):
        ok = [p for p in itertools.product(range(len(labels)), repeat=n)
              if start[p[0]] and end[p[-1]] and all(trans[x, y] for x, y in zip(p, p[1:]))]
        assert tuple(best[b]) == max(ok, key=lambda p: _score(crf, emissions[b], p))


def test_scheme_rules():
    bio = ["B-X", "I-X", "B-Y", "I-Y", "O"]
    start, trans, end = allowed_transitions(bio, "BIO")
    i = {lab: k for k, lab in enumerate(bio)}
    assert not start[i["I-X"]] and start[i["B-X"]] and start[i["O"]]
    assert not trans[i["O"], i["I-X"]] and not trans[i["B-Y"], i["I-X"]] and trans[i["B-X"], i["I-X"]]
    assert trans[i["I-X"], i["I-X"]] and trans[i["I-X"], i["B-Y"]] and end.all()
    bioes = ["B-X", "I-X", "E-X", "S-X", "O"]
    start, trans, end = allowed_transitions(bioes, "BIOES")
    j = {lab: k for k, lab in enumerate(bioes)}
    assert not trans[j["B-X"], j["O"]] and trans[j["B-X"], j["E-X"]] and not trans[j["E-X"], j["I-X"]]
    assert not end[j["B-X"]] and end[j["S-X"]] and not start[j["E-X"]]
    assert allowed_transitions(["NOUN", "VERB"], None)[1].all()


def test_detect_and_count():
    assert detect_span_scheme([["B-X", "I-X", "O"]]) == "BIO"
    assert detect_span_scheme([["I-X", "I-X", "B-X", "O"]]) == "IOB1"
    assert detect_span_scheme([["S-X", "B-Y", "E-Y"]]) == "BIOES"
    assert detect_span_scheme([["NOUN", "VERB"]]) is None
    assert count_violations([["B-X", "I-X"], ["O", "I-X"], ["B-X", "I-Y"]], "BIO") == 2
    assert count_violations([["B-X", "O"]], "BIOES") == 1
