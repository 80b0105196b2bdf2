"""A torch-free interpolated modified Kneser-Ney n-gram language model: the count-based baseline for a biLM.

`KneserNey.fit` counts a corpus of word-id sentences (ids of the model vocabulary, unknown words already
``<UNK>``) into an order-N model; `KneserNey.score` / `KneserNey.perplexity` score sentences on exactly the
targets `elmo_cli.evaluate` scores, and `kneser_ney_perplexity` fits and scores both directions in one call.

What is predicted. A direction reads each sentence from its start, with no context carried across sentences:

    forward   reads ``<S> w1 .. wn``    predicts ``w1 .. wn </S>``
    backward  reads ``</S> wn .. w1``   predicts ``wn .. w1 <S>``     (the biLM's reversed encoding)

Every target is counted (``<UNK>`` and the end symbol included), so a sentence has n + 1 targets. The
prediction space is the whole vocabulary ``0 .. V-1``: the start symbol of a direction is never a target there,
but it keeps its share of the uniform mass, so ``sum over all V ids of p(w | h) = 1`` for every history.

The estimate (Chen & Goodman 1998, "An empirical study of smoothing techniques", interpolated modified KN).
For order k, context h (k-1 words, h' = h without its first word) and count a(h w)::

    p_k(w | h) = (a(h w) - D_k(a(h w))) / A(h)  +  gamma(h) * p_{k-1}(w | h')
    gamma(h)   = (D_k1 N1(h .) + D_k2 N2(h .) + D_k3+ N3+(h .)) / A(h)       A(h) = sum over w of a(h w)
    p_0(w)     = 1 / V                                                      (the unigram is interpolated with it)

- a(.) is the raw count at the highest order N and for n-grams that start with the start symbol (they cannot be
  extended to the left; as KenLM and SRILM do); for every other lower-order n-gram it is the continuation count,
  the number of distinct words seen immediately to its left.
- The three discounts of order k come from that order's count-of-counts n1..n4 of a(.)::

      Y = n1 / (n1 + 2 n2)    D1 = 1 - 2 Y n2/n1    D2 = 2 - 3 Y n3/n2    D3+ = 3 - 4 Y n4/n3

  Fallback: a discount that is undefined (a zero denominator) or falls outside ``(0, j]`` (Dj must not exceed
  the smallest count it discounts, or probabilities would go negative, and must be positive, or the lower order
  would get no mass) is replaced by KenLM's ``--discount_fallback`` value: D1 = 0.5, D2 = 1.0, D3+ = 1.5.
  This happens only on tiny or degenerate corpora (e.g. no n-gram seen exactly once), and every probability
  stays positive.
- A context never seen at order k (A(h) = 0) passes the lower order through: gamma = 1, p_k = p_{k-1}. Near the
  start of a sentence the history is shorter than N - 1 and the highest usable order is its length + 1.

Storage. Order-k n-gram types are numbered densely: the type of ``(h, w)`` is the index of
``key = type(h) * V + w`` in that order's sorted unique keys (the type of a unigram is its word id), so an
n-gram of any length is one int64 and all counting is `np.unique` / `np.bincount` / `np.searchsorted`; the types
of one context are contiguous. 1M training tokens at order 5 fit in seconds and a few hundred MB
(``python -m benchmarks.bench_kn``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from vocab.errors import ElmoError

if TYPE_CHECKING:
    from vocab.vocabulary import Vocabulary

MAX_ORDER = 9
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)  # KenLM's --discount_fallback: D1, D2, D3+
DIRECTIONS = ("forward", "backward")


def modified_kn_discounts(count_of_counts: Sequence[int]) -> tuple[float, float, float]:
    """The three discounts (D1, D2, D3+) of one order from its count-of-counts.

    # Parameters
    count_of_counts : `Sequence[int]`, ``(n1, n2, n3, n4)``: how many n-grams of the order have count 1, 2, 3, 4.

    # Returns
    `tuple[float, float, float]`. Chen & Goodman's closed form; a discount that is undefined or outside
    ``(0, j]`` is replaced by its `FALLBACK_DISCOUNTS` value (see the module docstring).
    """
    n1, n2, n3, n4 = (int(n) for n in count_of_counts)
    y = n1 / (n1 + 2 * n2) if n1 + 2 * n2 > 0 else None
    formulas = (
        (n1 > 0, lambda: 1 - 2 * y * n2 / n1),
        (n2 > 0, lambda: 2 - 3 * y * n3 / n2),
        (n3 > 0, lambda: 3 - 4 * y * n4 / n3),
    )
    out = []
    for j, ((defined, formula), fallback) in enumerate(zip(formulas, FALLBACK_DISCOUNTS), start=1):
        d = formula() if defined and y is not None else math.nan
        out.append(d if 0 < d <= j else fallback)
    return out[0], out[1], out[2]


def check_order(order: int) -> int:
    """``order`` if it is an int in ``1 .. MAX_ORDER``, else ElmoError."""
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or not 1 <= order <= MAX_ORDER:
        raise ElmoError(f"Kneser-Ney order must be an integer from 1 to {MAX_ORDER}, got {order!r}")
    return int(order)


def _padded(sentences: Iterable[np.ndarray], start_id: int, end_id: int, reverse: bool, vocab_size: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenate sentences as ``start, words.., end`` each, in reading order.

    # Returns
    tokens : `np.ndarray`, ``(L,)`` int64, L = sum of (n + 2).
    pos : `np.ndarray`, ``(L,)`` int64, the index of each token inside its padded sentence (0 = the start symbol).
    sentence : `np.ndarray`, ``(L,)`` int64, the index of the sentence each token belongs to.
    """
    words = [np.asarray(s, dtype=np.int64).reshape(-1) for s in sentences]
    if reverse:
        words = [w[::-1] for w in words]
    lengths = np.fromiter((len(w) + 2 for w in words), dtype=np.int64, count=len(words))
    offsets = np.zeros(len(words), dtype=np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    total = int(lengths.sum())
    tokens = np.empty(total, dtype=np.int64)
    is_word = np.ones(total, dtype=bool)
    is_word[offsets] = False
    is_word[offsets + lengths - 1] = False
    tokens[offsets] = start_id
    tokens[offsets + lengths - 1] = end_id
    if words:
        flat = np.concatenate(words)
        if flat.size and (flat.min() < 0 or flat.max() >= vocab_size):
            bad = int(flat.min()) if flat.min() < 0 else int(flat.max())
            raise ElmoError(f"word id {bad} is outside the vocabulary (0 .. {vocab_size - 1})")
        tokens[is_word] = flat
    sentence = np.repeat(np.arange(len(words), dtype=np.int64), lengths)
    pos = np.arange(total, dtype=np.int64) - np.repeat(offsets, lengths)
    return tokens, pos, sentence


def _lookup(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Index of each key in ``sorted_keys``, shape of ``keys``; -1 where absent or where the key is negative."""
    if len(sorted_keys) == 0:
        return np.full(keys.shape, -1, dtype=np.int64)
    idx = np.searchsorted(sorted_keys, keys)
    clipped = np.minimum(idx, len(sorted_keys) - 1)
    found = (keys >= 0) & (idx < len(sorted_keys)) & (sorted_keys[clipped] == keys)
    return np.where(found, idx, -1)


def _previous(types: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """``types[i - 1]`` at every position i that is not a sentence start, -1 at sentence starts."""
    prev = np.empty_like(types)
    prev[0] = -1
    prev[1:] = types[:-1]
    prev[pos == 0] = -1
    return prev


@dataclass
class _Counts:
    """The n-gram types of one order k >= 2 seen in training; T = number of types."""

    keys: np.ndarray  # (T,) int64, sorted unique: type of the (k-1)-gram prefix * V + last word
    raw: np.ndarray  # (T,) int64, occurrences
    suffix: np.ndarray  # (T,) int64, type of the (k-1)-gram suffix (the n-gram without its first word)
    starts: np.ndarray  # (T,) bool, the n-gram begins with the start symbol


@dataclass
class _Order:
    """One order k >= 2 of a fitted model. T = number of k-gram types, C = number of (k-1)-gram types."""

    keys: np.ndarray  # (T,) int64, sorted: type of the context * V + word
    own: np.ndarray  # (T,) float64, (a - D(a)) / A(context)
    gamma: np.ndarray  # (C,) float64, the lower order's weight in each context (1 for a context never seen)
    discounts: tuple[float, float, float]


def _count_types(tokens: np.ndarray, pos: np.ndarray, order: int, vocab_size: int, start_id: int
                 ) -> tuple[np.ndarray, list[_Counts]]:
    """Raw unigram counts of the targets, ``(V,)``, and the `_Counts` of orders 2 .. N.

    The k-grams are the windows of k tokens inside one padded sentence; the type of the window ending at
    position i is found from the type of the (k-1)-window ending at i - 1 and ``tokens[i]``.
    """
    v = vocab_size
    raw1 = np.bincount(tokens[pos >= 1], minlength=v).astype(np.int64)
    starts = np.arange(v) == start_id
    types = tokens  # the unigram type is the word id
    out = []
    for _ in range(2, order + 1):
        prev = _previous(types, pos)
        valid = prev >= 0
        keys, inverse, raw = np.unique(prev[valid] * v + tokens[valid], return_inverse=True, return_counts=True)
        inverse = inverse.reshape(-1)
        suffix = np.empty(len(keys), dtype=np.int64)
        suffix[inverse] = types[valid]  # the (k-1)-window ending at the same position
        starts = starts[keys // v]
        out.append(_Counts(keys, raw.astype(np.int64), suffix, starts))
        types = np.full(len(tokens), -1, dtype=np.int64)
        types[valid] = inverse
    return raw1, out


def _count_of_counts(a: np.ndarray) -> tuple[int, int, int, int]:
    """(n1, n2, n3, n4): how many entries of ``a`` are 1, 2, 3, 4."""
    small = np.bincount(a[(a >= 1) & (a <= 4)], minlength=5)
    return int(small[1]), int(small[2]), int(small[3]), int(small[4])


def _adjusted(raw: np.ndarray, starts: np.ndarray, higher: _Counts | None) -> np.ndarray:
    """The counts an order uses: raw at the highest order and for start-symbol n-grams, else continuation counts."""
    if higher is None:
        return raw
    a = np.bincount(higher.suffix, minlength=len(raw)).astype(np.int64)
    a[starts] = raw[starts]
    return a


def _discounted(a: np.ndarray) -> tuple[np.ndarray, tuple[float, float, float]]:
    """``D(a)`` for every count (0 for a = 0) and the order's discounts."""
    d = modified_kn_discounts(_count_of_counts(a))
    return np.array((0.0,) + d)[np.minimum(a, 3)], d


def _estimate(raw1: np.ndarray, counts: list[_Counts], vocab_size: int, start_id: int
              ) -> tuple[np.ndarray, tuple[float, float, float], list[_Order]]:
    """Adjusted counts, discounts and the interpolation weights of every order (see the module docstring)."""
    v = vocab_size
    a1 = _adjusted(raw1, np.arange(v) == start_id, counts[0] if counts else None)
    disc1, d1 = _discounted(a1)
    total = float(a1.sum())
    unigram = (a1 - disc1) / total + float(disc1.sum()) / total / v
    orders = []
    for k, c in enumerate(counts, start=2):
        a = _adjusted(c.raw, c.starts, counts[k - 1] if k - 1 < len(counts) else None)
        disc, d = _discounted(a)
        ctx = c.keys // v
        n_contexts = v if k == 2 else len(counts[k - 3].keys)
        total = np.bincount(ctx, weights=a, minlength=n_contexts)
        mass = np.bincount(ctx, weights=disc, minlength=n_contexts)
        seen = total > 0
        gamma = np.ones(n_contexts)
        gamma[seen] = mass[seen] / total[seen]
        orders.append(_Order(c.keys, (a - disc) / total[ctx], gamma, d))
    return unigram, d1, orders


@dataclass
class KneserNeyPerplexity:
    """Both directions of one order on one test set; ``tokens`` = targets per direction."""

    order: int
    tokens: int
    forward_logprob: float  # natural-log sum over the forward targets
    backward_logprob: float
    train_words: int = 0  # words of the training text the model was counted from

    @property
    def forward_perplexity(self) -> float:
        return math.exp(-self.forward_logprob / self.tokens)

    @property
    def backward_perplexity(self) -> float:
        return math.exp(-self.backward_logprob / self.tokens)

    @property
    def average_perplexity(self) -> float:
        """(forward + backward) / 2, as `elmo_cli.evaluate.EvalResult.average_perplexity`."""
        return (self.forward_perplexity + self.backward_perplexity) / 2


class KneserNey:
    """An interpolated modified Kneser-Ney model of one direction; build it with `KneserNey.fit`.

    Attributes: ``order``; ``vocab_size``; ``direction``; ``start_id`` / ``end_id``, the boundary symbols in
    reading order (``<S>`` / ``</S>`` forward, swapped backward); ``discounts[k - 1]`` = (D1, D2, D3+) of order
    k; ``unigram``, p_1 over the whole vocabulary, shape ``(V,)``.
    """

    def __init__(self, order: int, vocab_size: int, direction: str, start_id: int, end_id: int,
                 unigram: np.ndarray, unigram_discounts: tuple[float, float, float], orders: list[_Order]):
        self.order = order
        self.vocab_size = vocab_size
        self.direction = direction
        self.start_id = start_id
        self.end_id = end_id
        self.unigram = unigram
        self._orders = orders  # orders 2 .. N
        self.discounts = [unigram_discounts] + [o.discounts for o in orders]

    def __repr__(self) -> str:
        return f"KneserNey(order={self.order}, vocab_size={self.vocab_size}, direction={self.direction!r})"

    @classmethod
    def fit(cls, sentences: Iterable[np.ndarray], vocab_size: int, order: int, bos_id: int, eos_id: int,
            direction: str = "forward") -> "KneserNey":
        """Count sentences into a model of one order and direction.

        # Parameters
        sentences : `Iterable[np.ndarray]`, each ``(n,)`` int word ids in ``0 .. vocab_size-1`` in natural
            (left-to-right) order whatever the direction; iterated once.
        vocab_size : `int`, V, the size of the prediction space.
        order : `int`, N in ``1 .. 9`` (ElmoError otherwise).
        bos_id, eos_id : `int`, the ids of ``<S>`` and ``</S>`` (``Vocabulary.bos_id`` / ``Vocabulary.eos_id``).
        direction : `str`, optional (default = `"forward"`). ``"backward"`` reads every sentence reversed from
            ``</S>`` and predicts ``<S>`` last.

        # Returns
        `KneserNey`.
        """
        order = check_order(order)
        if direction not in DIRECTIONS:
            raise ElmoError(f"Kneser-Ney direction must be 'forward' or 'backward', got {direction!r}")
        if not (0 <= bos_id < vocab_size and 0 <= eos_id < vocab_size) or bos_id == eos_id:
            raise ElmoError(f"<S> id {bos_id} and </S> id {eos_id} must be two different ids below the vocabulary "
                            f"size {vocab_size}")
        start_id, end_id = (bos_id, eos_id) if direction == "forward" else (eos_id, bos_id)
        tokens, pos, _ = _padded(sentences, start_id, end_id, direction == "backward", vocab_size)
        if len(tokens) == 0:
            raise ElmoError("Kneser-Ney: no sentences to count")
        raw1, counts = _count_types(tokens, pos, order, vocab_size, start_id)
        unigram, d1, orders = _estimate(raw1, counts, vocab_size, start_id)
        return cls(order, vocab_size, direction, start_id, end_id, unigram, d1, orders)

    def _walk(self, tokens: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """p(tokens[i] | the tokens before i in its sentence) at every position, shape ``(L,)``, and the context
        type of each order 2..N at the last position (-1: unseen or history too short)."""
        v = self.vocab_size
        p = self.unigram[tokens]
        types, last = tokens, []
        for o in self._orders:
            ctx = _previous(types, pos)
            last.append(int(ctx[-1]))
            types = _lookup(o.keys, np.where(ctx >= 0, ctx * v + tokens, -1))
            has, found = ctx >= 0, types >= 0
            p[has] *= o.gamma[ctx[has]]
            p[found] += o.own[types[found]]
        return p, last

    def _fragment(self, history: Sequence[int], word: int) -> tuple[np.ndarray, np.ndarray]:
        """The last N - 1 history ids + ``word`` as one sentence fragment (tokens, pos), ids checked."""
        hist = list(history)[max(len(history) - (self.order - 1), 0):] if self.order > 1 else []
        tokens = np.array([*hist, word], dtype=np.int64)
        bad = tokens[(tokens < 0) | (tokens >= self.vocab_size)]
        if bad.size:
            raise ElmoError(f"word id {int(bad[0])} is outside the vocabulary (0 .. {self.vocab_size - 1})")
        return tokens, np.arange(len(tokens), dtype=np.int64)

    def log_prob(self, history: Sequence[int], word: int) -> float:
        """Natural log of p(word | history).

        # Parameters
        history : `Sequence[int]`, the preceding ids in the direction's reading order (forward ``[<S>, w1, ..]``,
            backward ``[</S>, wn, ..]``); only the last N - 1 are used. Begin it with the start symbol to score
            the beginning of a sentence; without it, it is a fragment from inside one.
        word : `int`, the target id.
        """
        p, _ = self._walk(*self._fragment(history, word))
        return math.log(p[-1])

    def distribution(self, history: Sequence[int]) -> np.ndarray:
        """p(w | history) for every id w, shape ``(V,)``; sums to 1. ``history`` as in `log_prob`."""
        _, contexts = self._walk(*self._fragment(history, 0))
        v = self.vocab_size
        p = self.unigram.copy()
        for ctx, o in zip(contexts, self._orders):
            if ctx < 0:
                continue
            lo, hi = np.searchsorted(o.keys, [ctx * v, (ctx + 1) * v])
            p *= o.gamma[ctx]
            p[o.keys[lo:hi] - ctx * v] += o.own[lo:hi]
        return p

    def sentence_log_probs(self, sentences: Iterable[np.ndarray], exclude: int | None = None) -> np.ndarray:
        """Sum of the natural-log probabilities of each sentence's n + 1 targets, shape ``(S,)``.

        # Parameters
        sentences : `Iterable[np.ndarray]`, each ``(n,)`` word ids in natural order (reversed here if backward).
        exclude : `int | None`, optional (default = `None`) drop targets with this id (``<UNK>`` for
            ``exclude_unk``); the distribution is not renormalised.
        """
        tokens, pos, sentence = _padded(sentences, self.start_id, self.end_id, self.direction == "backward",
                                        self.vocab_size)
        if len(tokens) == 0:
            return np.zeros(0)
        p, _ = self._walk(tokens, pos)
        target = pos >= 1
        if exclude is not None:
            target &= tokens != exclude
        return np.bincount(sentence[target], weights=np.log(p[target]), minlength=int(sentence[-1]) + 1)

    def score(self, sentences: Iterable[np.ndarray], exclude: int | None = None) -> tuple[float, int]:
        """(sum of natural-log probabilities of all targets, number of targets); arguments as
        `sentence_log_probs`. A sentence of n words has n + 1 targets, fewer with ``exclude``."""
        tokens, pos, _ = _padded(sentences, self.start_id, self.end_id, self.direction == "backward",
                                 self.vocab_size)
        if len(tokens) == 0:
            return 0.0, 0
        p, _ = self._walk(tokens, pos)
        target = pos >= 1
        if exclude is not None:
            target &= tokens != exclude
        return float(np.log(p[target]).sum()), int(target.sum())

    def perplexity(self, sentences: Iterable[np.ndarray], exclude: int | None = None) -> float:
        """exp(-score / targets); ElmoError when there is nothing to score."""
        total, n = self.score(sentences, exclude)
        if n == 0:
            raise ElmoError("Kneser-Ney perplexity: no targets to score")
        return math.exp(-total / n)


def kneser_ney_perplexity(train: Iterable[np.ndarray], test: Iterable[np.ndarray], vocab: "Vocabulary",
                          order: int, exclude_unk: bool = False) -> KneserNeyPerplexity:
    """Fit forward and backward models of one order on ``train`` and score ``test`` with both.

    # Parameters
    train, test : `Iterable[np.ndarray]`, sentences of word ids ``(n,)`` in natural order (e.g.
        ``vocab.encode(line.split())``).
    vocab : `Vocabulary`, the model vocabulary: V = ``len(vocab)``, ``bos_id``, ``eos_id``, ``unk_id``.
    order : `int`, N in ``1 .. 9``.
    exclude_unk : `bool`, optional (default = `False`) drop ``<UNK>`` targets, as ``evaluate --exclude-unk``.

    # Returns
    `KneserNeyPerplexity`, whose ``average_perplexity`` is defined as `elmo_cli.evaluate`'s.
    """
    order = check_order(order)
    train, test = list(train), list(test)
    exclude = vocab.unk_id if exclude_unk else None
    sums = []
    for direction in DIRECTIONS:
        model = KneserNey.fit(train, len(vocab), order, vocab.bos_id, vocab.eos_id, direction)
        sums.append(model.score(test, exclude))
    if sums[0][1] == 0:
        raise ElmoError("Kneser-Ney perplexity: no targets to score")
    return KneserNeyPerplexity(order, sums[0][1], sums[0][0], sums[1][0])
