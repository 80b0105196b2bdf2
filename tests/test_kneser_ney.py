"""elmo_cli/kneser_ney.py: interpolated modified Kneser-Ney, checked by hand, in closed form and against a naive
dict-of-tuples reference written straight from the definition."""
from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter, defaultdict
from fractions import Fraction as F

import numpy as np
import pytest

from elmo_cli.kneser_ney import KneserNey, kneser_ney_perplexity, modified_kn_discounts
from vocab.errors import ElmoError
from vocab.vocabulary import Vocabulary

BOS, EOS, UNK, A, B = 0, 1, 2, 3, 4  # ids of <S>, </S>, <UNK>, a, b


def _corpus(seed: int, n: int = 40, vocab_size: int = 12, max_len: int = 9) -> list[np.ndarray]:
    """Random sentences over the non-special ids 2..V-1 (<UNK> included), some empty, Zipf-ish so n-grams repeat."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, vocab_size - 1)
    weights /= weights.sum()
    return [rng.choice(np.arange(2, vocab_size), size=rng.integers(0, max_len), p=weights) for _ in range(n)]


def _naive_kn(sentences, vocab_size: int, order: int, start: int, end: int):
    """p(w | history) from the definition, with tuples and dicts (forward reading of the given sentences)."""
    counts = [Counter() for _ in range(order + 1)]  # counts[k][k-gram] = raw count of windows ending at a target
    for s in sentences:
        seq = [start, *map(int, s), end]
        for i in range(1, len(seq)):
            for k in range(1, min(order, i + 1) + 1):
                counts[k][tuple(seq[i - k + 1:i + 1])] += 1
    adjusted = [None] + [dict() for _ in range(order)]
    for k in range(1, order + 1):
        for gram, c in counts[k].items():
            if k == order or gram[0] == start:
                adjusted[k][gram] = c
            else:
                adjusted[k][gram] = sum(1 for longer in counts[k + 1] if longer[1:] == gram)
    discounts, totals, masses = [None], [None], [None]
    for k in range(1, order + 1):
        n = Counter(adjusted[k].values())
        n1, n2, n3, n4 = n[1], n[2], n[3], n[4]
        y = n1 / (n1 + 2 * n2) if n1 + 2 * n2 else None
        raw = [1 - 2 * y * n2 / n1 if y is not None and n1 else None,
               2 - 3 * y * n3 / n2 if y is not None and n2 else None,
               3 - 4 * y * n4 / n3 if y is not None and n3 else None]
        d = [x if x is not None and 0 < x <= j else fb for x, j, fb in zip(raw, (1, 2, 3), (0.5, 1.0, 1.5))]
        discounts.append(d)
        total, mass = defaultdict(float), defaultdict(float)
        for gram, a in adjusted[k].items():
            total[gram[:-1]] += a
            mass[gram[:-1]] += d[min(a, 3) - 1]
        totals.append(total)
        masses.append(mass)

    def prob(history, word, k=order):
        if k == 0:
            return 1.0 / vocab_size
        if k - 1 > len(history):
            return prob(history, word, k - 1)
        ctx = tuple(history[len(history) - (k - 1):]) if k > 1 else ()
        lower = prob(history, word, k - 1)
        if totals[k].get(ctx, 0) == 0:
            return lower
        a = adjusted[k].get(ctx + (word,), 0)
        own = (a - discounts[k][min(a, 3) - 1]) / totals[k][ctx] if a else 0.0
        return own + masses[k][ctx] / totals[k][ctx] * lower

    return prob, discounts[1:]


# ---- by hand ---------------------------------------------------------------------------------------------------
# The hand corpus, V = 5 (<S> </S> <UNK> a b), forward:
#   <S> b </S> | <S> a a </S> | <S> a a a a </S> | <S> b a a </S>          14 targets
HAND = [np.array(s) for s in ([B], [A, A], [A, A, A, A], [B, A, A])]

# Unigram level (order 2 and order 3 models alike: both count continuations over the same bigram types):
#   continuation counts  a: left {<S>, a, b} = 3   b: {<S>} = 1   </S>: {b, a} = 2   <S>, <UNK>: 0
#   n1..n4 = 1, 1, 1, 0  ->  Y = 1/(1+2) = 1/3, D1 = 1 - 2(1/3)(1/1) = 1/3, D2 = 2 - 3(1/3)(1/1) = 1,
#   D3+ = 3 - 4(1/3)(0/1) = 3;  A = 6, discounted mass = 1/3 + 1 + 3 = 13/3, gamma = 13/18, uniform 13/90 each
#   p1(a) = (3-3)/6 + 13/90 = 13/90   p1(b) = (1-1/3)/6 + 13/90 = 23/90   p1(</S>) = (2-1)/6 + 13/90 = 28/90
#   p1(<S>) = p1(<UNK>) = 13/90                                                       (sum 90/90)
P1 = {A: F(13, 90), B: F(23, 90), EOS: F(28, 90), BOS: F(13, 90), UNK: F(13, 90)}


def test_hand_unigram_level():
    for order in (2, 3):
        m = KneserNey.fit(HAND, 5, order, BOS, EOS)
        assert m.discounts[0] == pytest.approx((1 / 3, 1.0, 3.0), abs=1e-15)
        for w, p in P1.items():
            assert m.unigram[w] == pytest.approx(float(p), abs=1e-15)


def test_hand_order_2():
    # Raw bigram counts (highest order): (<S>,b) 2, (b,</S>) 1, (<S>,a) 2, (a,a) 5, (a,</S>) 3, (b,a) 1
    #   n1..n4 = 2, 2, 1, 0 -> Y = 2/(2+4) = 1/3, D1 = 1 - 2(1/3)(2/2) = 1/3, D2 = 2 - 3(1/3)(1/2) = 3/2,
    #   D3+ = 3 - 4(1/3)(0/1) = 3
    m = KneserNey.fit(HAND, 5, 2, BOS, EOS)
    assert m.discounts[1] == pytest.approx((1 / 3, 1.5, 3.0), abs=1e-15)
    cases = [
        # context a: (a,a) 5, (a,</S>) 3; A = 8, mass = 3 + 3 = 6, gamma = 3/4
        ([BOS, A], A, F(5 - 3, 8) + F(3, 4) * P1[A]),  # 1/4 + 13/120 = 43/120
        ([A], EOS, F(3 - 3, 8) + F(3, 4) * P1[EOS]),  # 28/120 = 7/30
        ([A], B, F(3, 4) * P1[B]),  # unseen bigram: 23/120
        # context b: (b,</S>) 1, (b,a) 1; A = 2, mass = 2/3, gamma = 1/3
        ([B], A, (1 - F(1, 3)) / 2 + F(1, 3) * P1[A]),  # 1/3 + 13/270 = 103/270
        # context <S>: (<S>,a) 2, (<S>,b) 2; A = 4, mass = 3/2 + 3/2 = 3, gamma = 3/4
        ([BOS], B, (2 - F(3, 2)) / 4 + F(3, 4) * P1[B]),  # 1/8 + 23/120 = 19/60
        # context <UNK> never seen: the unigram passes through
        ([UNK], A, P1[A]),
    ]
    assert [float(c[2]) for c in cases] == pytest.approx([43 / 120, 7 / 30, 23 / 120, 103 / 270, 19 / 60, 13 / 90])
    for history, word, p in cases:
        assert math.exp(m.log_prob(history, word)) == pytest.approx(float(p), rel=1e-13)


def test_hand_order_3():
    # Raw trigram counts (highest order): (<S>,b,</S>) 1, (<S>,a,a) 2, (a,a,</S>) 3, (a,a,a) 2, (<S>,b,a) 1,
    # (b,a,a) 1 -> n1..n4 = 3, 2, 1, 0: Y = 3/7, D1 = 1 - 2(3/7)(2/3) = 3/7, D2 = 2 - 3(3/7)(1/2) = 19/14, D3+ = 3
    # Bigram level: <S>-initial bigrams keep raw counts (<S>,a) 2, (<S>,b) 2; the others count left extensions:
    #   (a,a): {<S>, a, b} = 3   (a,</S>): {a} = 1   (b,</S>): {<S>} = 1   (b,a): {<S>} = 1
    #   n1..n4 = 3, 2, 1, 0 -> the same discounts 3/7, 19/14, 3
    m = KneserNey.fit(HAND, 5, 3, BOS, EOS)
    d1, d2 = F(3, 7), F(19, 14)
    assert m.discounts[1] == pytest.approx((3 / 7, 19 / 14, 3.0), abs=1e-15)
    assert m.discounts[2] == pytest.approx((3 / 7, 19 / 14, 3.0), abs=1e-15)
    # p2 in the order-3 model. context a: (a,a) 3, (a,</S>) 1; A = 4, mass = 3 + 3/7 = 24/7, gamma = 6/7
    p2_a_a = F(3 - 3, 4) + F(6, 7) * P1[A]  # 13/105
    p2_eos_a = (1 - d1) / 4 + F(6, 7) * P1[EOS]  # 1/7 + 4/15 = 43/105
    # context b: (b,</S>) 1, (b,a) 1; A = 2, mass = 6/7, gamma = 3/7
    p2_a_b = (1 - d1) / 2 + F(3, 7) * P1[A]  # 2/7 + 13/210 = 73/210
    # context <S> (raw counts): (<S>,a) 2, (<S>,b) 2; A = 4, mass = 2 * 19/14 = 19/7, gamma = 19/28
    p2_a_bos = (2 - d2) / 4 + F(19, 28) * P1[A]  # 9/56 + 247/2520 = 163/630
    assert (p2_a_a, p2_eos_a, p2_a_b, p2_a_bos) == (F(13, 105), F(43, 105), F(73, 210), F(163, 630))
    cases = [
        # context (a,a): (a,a,</S>) 3, (a,a,a) 2; A = 5, mass = 3 + 19/14 = 61/14, gamma = 61/70
        ([A, A], EOS, F(3 - 3, 5) + F(61, 70) * p2_eos_a),  # 61/70 * 43/105 = 2623/7350
        ([BOS, A, A], A, (2 - d2) / 5 + F(61, 70) * p2_a_a),  # 9/70 + 793/7350 = 869/3675
        # context (<S>,b): (<S>,b,</S>) 1, (<S>,b,a) 1; A = 2, mass = 6/7, gamma = 3/7
        ([BOS, B], A, (1 - d1) / 2 + F(3, 7) * p2_a_b),  # 2/7 + 219/1470 = 213/490
        ([B, B], A, p2_a_b),  # context (b,b) never seen: order 2 passes through
        ([BOS], A, p2_a_bos),  # sentence start: the history is one token, order 2 is the highest usable
        ([A], EOS, p2_eos_a),
    ]
    assert [c[2] for c in cases[:3]] == [F(2623, 7350), F(869, 3675), F(213, 490)]
    for history, word, p in cases:
        assert math.exp(m.log_prob(history, word)) == pytest.approx(float(p), rel=1e-13)


def test_discount_formulas():
    # n1..n4 = 10, 4, 2, 1: Y = 10/18 = 5/9, D1 = 1 - 2(5/9)(4/10) = 5/9, D2 = 2 - 3(5/9)(2/4) = 7/6,
    # D3+ = 3 - 4(5/9)(1/2) = 17/9
    assert modified_kn_discounts((10, 4, 2, 1)) == pytest.approx((5 / 9, 7 / 6, 17 / 9), abs=1e-15)
    # Fallbacks: D2 = 2 - 3(5/7)(2/1) < 0 -> 1.0; n3 = 0 -> D3+ undefined -> 1.5; nothing counted -> all three.
    assert modified_kn_discounts((5, 1, 2, 0)) == pytest.approx((5 / 7, 1.0, 3.0))
    assert modified_kn_discounts((5, 1, 0, 0)) == pytest.approx((5 / 7, 2.0, 1.5))
    assert modified_kn_discounts((0, 0, 0, 0)) == (0.5, 1.0, 1.5)
    # n1 = 0: D1 divides by n1 -> 0.5; Y = 0, so D2 = 2 - 0 = 2 and D3+ = 3 - 0 = 3, both at their limit, kept
    assert modified_kn_discounts((0, 3, 1, 1)) == (0.5, 2.0, 3.0)
    # From a corpus: the order-1 model counts targets raw. "a b c c d d d e e e e" + </S>:
    #   a, b, </S> once, c twice, d three times, e four times -> n1..n4 = 3, 1, 1, 1
    #   Y = 3/5, D1 = 1 - 2(3/5)(1/3) = 3/5, D2 = 2 - 3(3/5)(1/1) = 1/5, D3+ = 3 - 4(3/5)(1/1) = 3/5
    words = [3, 4, 5, 5, 6, 6, 6, 7, 7, 7, 7]
    m = KneserNey.fit([np.array(words)], 8, 1, BOS, EOS)
    assert m.discounts == [pytest.approx((3 / 5, 1 / 5, 3 / 5), abs=1e-15)]


# ---- structure -------------------------------------------------------------------------------------------------
def test_order_1_is_the_interpolated_unigram():
    sentences = _corpus(1)
    v = 12
    counts = np.bincount(np.concatenate(sentences), minlength=v).astype(float)
    counts[EOS] += len(sentences)
    d = np.array((0.0, *modified_kn_discounts([(counts == j).sum() for j in (1, 2, 3, 4)])))
    disc = d[np.minimum(counts, 3).astype(int)]
    expected = (counts - disc) / counts.sum() + disc.sum() / counts.sum() / v
    m = KneserNey.fit(sentences, v, 1, BOS, EOS)
    np.testing.assert_allclose(m.unigram, expected, rtol=1e-14)
    np.testing.assert_allclose(m.distribution([BOS, 5, 6]), expected, rtol=1e-14)  # order 1 ignores the history
    total, n = m.score(sentences[:5])
    targets = np.concatenate([np.append(s, EOS) for s in sentences[:5]])
    assert n == len(targets) and total == pytest.approx(np.log(expected[targets]).sum(), rel=1e-13)


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_distributions_sum_to_one(direction):
    v = 12
    sentences = _corpus(2, vocab_size=v)
    for order in range(1, 6):
        m = KneserNey.fit(sentences, v, order, BOS, EOS, direction)
        seen = [m.start_id, *(sentences[0][::-1] if direction == "backward" else sentences[0])][:4]
        for history in ([m.start_id], seen, seen[1:], [11, 11, 10, 11], [UNK, m.end_id], []):
            p = m.distribution(history)
            assert p.shape == (v,) and (p > 0).all()
            assert abs(p.sum() - 1) < 1e-9, (order, history)
            one_by_one = np.exp([m.log_prob(history, w) for w in range(v)])
            np.testing.assert_allclose(one_by_one, p, rtol=1e-12)


@pytest.mark.parametrize("order", [1, 2, 3, 4, 5])
def test_matches_the_naive_definition(order):
    v = 10
    train, test = _corpus(3, n=30, vocab_size=v), _corpus(4, n=8, vocab_size=v)
    for direction, start, end in (("forward", BOS, EOS), ("backward", EOS, BOS)):
        reading = [s[::-1] for s in train] if direction == "backward" else train
        prob, discounts = _naive_kn(reading, v, order, start, end)
        m = KneserNey.fit(train, v, order, BOS, EOS, direction)
        assert m.start_id == start and m.end_id == end
        np.testing.assert_allclose(np.array(m.discounts), np.array(discounts), rtol=1e-14)
        expected = []
        for s in test:
            seq = [start, *(s[::-1] if direction == "backward" else s), end]
            expected.append(sum(math.log(prob(seq[:i], seq[i])) for i in range(1, len(seq))))
        np.testing.assert_allclose(m.sentence_log_probs(test), expected, rtol=1e-12)
        total, n = m.score(test)
        assert n == sum(len(s) + 1 for s in test) and total == pytest.approx(sum(expected), rel=1e-12)
        for history in ([start, 5, 6, 7], [start, 5, 6], [5, 6], [9, 9, 9, 9], [start], []):
            assert m.log_prob(history, 5) == pytest.approx(math.log(prob(list(history), 5)), rel=1e-12)


def test_forward_and_backward_unigram_perplexities_are_equal():
    train, test = _corpus(5), _corpus(6, n=10)
    forward = KneserNey.fit(train, 12, 1, BOS, EOS, "forward").perplexity(test)
    backward = KneserNey.fit(train, 12, 1, BOS, EOS, "backward").perplexity(test)
    assert forward == pytest.approx(backward, rel=1e-13)


def test_order_9():
    train = _corpus(7, n=60, max_len=20)
    m = KneserNey.fit(train, 12, 9, BOS, EOS)
    assert len(m.discounts) == 9
    assert abs(m.distribution([BOS, *train[0][:12]]).sum() - 1) < 1e-9
    assert m.perplexity(train) < KneserNey.fit(train, 12, 3, BOS, EOS).perplexity(train)  # memorises its data


@pytest.mark.parametrize("order", [0, 10, -1, 2.5, True, "3"])
def test_bad_order_raises(order):
    with pytest.raises(ElmoError, match=r"^Kneser-Ney order must be an integer from 1 to 9, got") as e:
        KneserNey.fit(HAND, 5, order, BOS, EOS)
    assert "\n" not in str(e.value)


def test_bad_ids_and_direction_raise():
    with pytest.raises(ElmoError, match="word id 7 is outside the vocabulary"):
        KneserNey.fit([np.array([3, 7])], 5, 2, BOS, EOS)
    m = KneserNey.fit(HAND, 5, 2, BOS, EOS)
    with pytest.raises(ElmoError, match="word id 5 is outside"):
        m.log_prob([BOS], 5)
    with pytest.raises(ElmoError, match="direction"):
        KneserNey.fit(HAND, 5, 2, BOS, EOS, "sideways")


def test_exclude_and_helper():
    vocab = Vocabulary(["<S>", "</S>", "<UNK>"] + [f"w{i}" for i in range(9)])
    train, test = _corpus(8), _corpus(9, n=10)
    r = kneser_ney_perplexity(train, test, vocab, 3)
    fwd = KneserNey.fit(train, 12, 3, BOS, EOS)
    bwd = KneserNey.fit(train, 12, 3, BOS, EOS, "backward")
    assert r.tokens == sum(len(s) + 1 for s in test)
    assert r.forward_perplexity == pytest.approx(fwd.perplexity(test), rel=1e-13)
    assert r.backward_perplexity == pytest.approx(bwd.perplexity(test), rel=1e-13)
    assert r.average_perplexity == pytest.approx((fwd.perplexity(test) + bwd.perplexity(test)) / 2, rel=1e-13)
    assert fwd.perplexity(test) != pytest.approx(bwd.perplexity(test), rel=1e-3)  # so the average is not either
    total, n = fwd.score(test, exclude=UNK)
    unks = sum(int((s == UNK).sum()) for s in test)
    assert unks > 0 and n == r.tokens - unks
    per_target = np.concatenate([[fwd.log_prob([BOS, *s[:i]], w) for i, w in enumerate([*s, EOS])] for s in test])
    targets = np.concatenate([np.append(s, EOS) for s in test])
    assert total == pytest.approx(per_target[targets != UNK].sum(), rel=1e-12)
    r_ex = kneser_ney_perplexity(train, test, vocab, 3, exclude_unk=True)
    assert r_ex.tokens == n and r_ex.forward_perplexity == pytest.approx(math.exp(-total / n))


def test_does_not_import_torch():
    code = "import sys, elmo_cli.kneser_ney; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
