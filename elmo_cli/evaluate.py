"""`elmo-cli evaluate`: the test perplexity of a biLM, full softmax, both directions (bilm-tf's).

What is scored. Each non-blank input line ``w1 .. wn`` is one sentence. The forward model reads ``<S> w1 .. wn``
and predicts the targets ``w1 .. wn </S>``; the backward model reads ``</S> wn .. w1`` and predicts
``wn .. w1 <S>`` (bilm-tf's reversed encoding). So every sentence has n + 1 targets per direction, and

    tokens                 = sum over sentences of (n + 1)        the boundary target is counted, as bilm-tf does
    forward_perplexity     = exp(-sum forward log P / tokens)
    backward_perplexity    = exp(-sum backward log P / tokens)
    average_perplexity     = (forward + backward) / 2              the paper's 39.7 is this number
    mean_loss_perplexity   = exp(mean of both directions' losses) = sqrt(forward * backward)
    oov_rate               = words mapped to <UNK> / words          (words = sum of n; boundaries excluded)

With ``exclude_unk`` the ``<UNK>`` targets are dropped from both the sum of log-probabilities and ``tokens``
(the distribution is not renormalised: the model still spends probability on ``<UNK>``). Log-probabilities are
natural logs of the full softmax, computed in vocabulary chunks of ``softmax_chunk`` rows and blocks of target
rows, so the logits held at once are at most ``_LOGITS_BUDGET`` floats whatever the vocabulary size.

Stateless (the default): every sentence starts from zero LSTM state, so its score does not depend on its
neighbours, the batch size or the input order; sentences are sorted by length inside pools of
``_POOL_BATCHES * batch_size`` for speed and the order is restored for the per-sentence output. ``stateful=True``
reproduces bilm-tf's carried state instead: sentences stay in input order, sentence ``i`` sits in batch row
``i % batch_size`` and starts from the final state of sentence ``i - batch_size`` (as bilm-tf's per-row sentence
streams), so its score then depends on the batch size.

Per-sentence output (JSON lines, one per input line, in input order, written atomically)::

    {"index": 0, "source": "test.txt:1", "words": 5, "tokens": 6, "forward_logprob": -21.3, "backward_logprob": -20.9}

``index`` counts input lines (text) and stored sentences (shard directories) over all inputs, from 0; blank
lines keep their line with ``"tokens": 0`` and null log-probabilities. The ``tokens`` and log-probabilities of
all lines add up to the corpus totals.

Inputs are read by `elmo_cli.inputs`; the n-gram references scored on the same targets are in
`elmo_cli.baselines`.
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from elmo_cli.inputs import Inputs, Line, char_ids_batch, input_order_batches, length_sorted_batches
from elmo_cli.loading import LoadedModel
from elmo_cli.model.bilm import add_boundaries, directions, lm_tops
from elmo_cli.model.lstm import fit_states
from elmo_cli.model.softmax import SharedSoftmax
from vocab.errors import ElmoError
from vocab.text import atomic_writer
from vocab.vocabulary import Vocabulary

_LOGITS_BUDGET = 1 << 24  # floats of full-softmax logits held at once: 64 MB in float32
_POOL_BATCHES = 32  # stateless: sentences are sorted by length within pools of this many batches


def _exp(x: float) -> float:
    """exp, but infinity past float range (a diverged model's perplexity) instead of OverflowError."""
    return math.exp(x) if x < 709.0 else math.inf


@dataclass
class EvalResult:
    """Corpus totals of an evaluation; the perplexities are properties (see the module docstring)."""

    sentences: int  # scored (non-blank) sentences
    blank_lines: int  # skipped
    words: int  # running words, boundaries excluded
    oov_words: int  # words that are <UNK> in the model vocabulary
    tokens: int  # targets scored per direction (words + one boundary per sentence, minus excluded <UNK>)
    excluded_unk: int  # <UNK> targets dropped per direction (only with exclude_unk)
    forward_logprob: float  # sum of natural-log probabilities of the forward targets
    backward_logprob: float
    exclude_unk: bool
    stateful: bool
    vocab_size: int
    seconds: float

    @property
    def oov_rate(self) -> float:
        return self.oov_words / self.words if self.words else 0.0

    @property
    def forward_perplexity(self) -> float:
        return _exp(-self.forward_logprob / self.tokens)

    @property
    def backward_perplexity(self) -> float:
        return _exp(-self.backward_logprob / self.tokens)

    @property
    def average_perplexity(self) -> float:
        """(forward + backward) / 2: what the ELMo paper reports (39.7 on the 1B Word Benchmark)."""
        return (self.forward_perplexity + self.backward_perplexity) / 2

    @property
    def mean_loss_perplexity(self) -> float:
        """exp of the mean loss over both directions = the geometric mean of the two perplexities."""
        return _exp(-(self.forward_logprob + self.backward_logprob) / (2 * self.tokens))

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in ("oov_rate", "forward_perplexity", "backward_perplexity", "average_perplexity",
                     "mean_loss_perplexity", "tokens_per_second"):
            d[name] = getattr(self, name)
        return d


# ---- scoring -------------------------------------------------------------------------------------------------
def _check_model(loaded: LoadedModel) -> tuple[SharedSoftmax, Vocabulary]:
    where = loaded.source
    softmax = loaded.model.softmax
    if softmax is None:
        raise ElmoError(f"{where}: the model has no softmax weights (softmax.hdf5), so it cannot score text; "
                        f"the published bilm-tf and ELMoForManyLangs files do not include them. Train a softmax on "
                        f"top of it with "
                        f"`elmo-cli train --init-from {where} --data SHARDS --output RUN`, then evaluate RUN")
    vocab = loaded.text.vocab
    if vocab is None:
        raise ElmoError(f"{where}: no vocab.txt; evaluation needs the vocabulary the softmax was trained with")
    if len(vocab) != softmax.vocab_size:
        raise ElmoError(f"{where}: softmax has {softmax.vocab_size} rows but vocab.txt has {len(vocab)} words")
    return softmax, vocab


def chunked_log_probs(softmax: SharedSoftmax, h: torch.Tensor, targets: torch.Tensor, chunk_size: int
                      ) -> torch.Tensor:
    """Full-softmax log P(target | h) with at most ``_LOGITS_BUDGET`` logits alive at once.

    # Parameters
    h : shape `(N, P)`; targets : shape `(N,)` int64; chunk_size : vocabulary rows per chunk.

    # Returns
    shape `(N,)` float32.
    """
    chunk = max(1, min(chunk_size, softmax.vocab_size))
    rows = max(1, _LOGITS_BUDGET // chunk)
    out = [softmax.log_probs(h[i : i + rows], targets[i : i + rows], chunk) for i in range(0, h.shape[0], rows)]
    return torch.cat(out) if out else h.new_zeros(0)


def _score_batch(loaded: LoadedModel, softmax: SharedSoftmax, lines: list[Line],
                 vocab: Vocabulary, exclude_unk: bool, chunk_size: int, states: tuple | None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple | None]:
    """Sum of forward and backward log-probabilities and the scored targets of each sentence of a batch.

    ``states`` None: zero initial state (stateless); else the carried ``(forward, backward)`` states, each a list
    of per-layer ``(h, c)`` or None.

    # Returns
    forward `(B,)`, backward `(B,)` float64 sums, scored targets per direction `(B,)` int64, the new states.
    """
    model, device = loaded.model, loaded.device
    B = len(lines)
    chars, lengths = char_ids_batch(loaded.text.chars, [ln.chars for ln in lines], device=device)  # (B, T, W)
    n = lengths - 2
    words = torch.zeros(B, int(n.max()), dtype=torch.long)
    for b, ln in enumerate(lines):
        words[b, : len(ln.ids)] = torch.from_numpy(ln.ids.astype(np.int64))
    ids, _ = add_boundaries(words.to(device), n, torch.tensor(vocab.bos_id), torch.tensor(vocab.eos_id))  # (B, T)
    T = chars.shape[1]

    x = model.encoder.forward_distinct(chars, 4096)  # (B, T, P)
    # Forward reads <S> w1..wn and predicts w1..wn </S>; backward reads </S> wn..w1 and predicts wn..w1 <S>.
    carried = (fit_states(states[0], B), fit_states(states[1], B)) if states is not None else None
    f_top, b_top, (f_new, b_new) = lm_tops(model.stacks, x, lengths, carried)  # (B, T-1, P) each
    fwd_tg, bwd_tg = (t[:, 1:] for t in directions(ids, lengths))  # (B, T-1) each
    valid = torch.arange(T - 1, device=device).unsqueeze(0) < (lengths - 1).unsqueeze(1)  # (B, T-1)

    row = torch.arange(B, device=device).unsqueeze(1).expand(B, T - 1)[valid]  # (N,)
    h = torch.cat([f_top[valid], b_top[valid]])  # (2N, P)
    targets = torch.cat([fwd_tg[valid], bwd_tg[valid]])  # (2N,)
    rows_both = torch.cat([row, row + B])  # backward rows offset by B
    if exclude_unk:
        keep = targets != vocab.unk_id
        h, targets, rows_both = h[keep], targets[keep], rows_both[keep]
    lp = chunked_log_probs(softmax, h, targets, chunk_size).double().cpu()
    sums = torch.zeros(2 * B, dtype=torch.float64).index_add_(0, rows_both.cpu(), lp)
    counts = torch.bincount(rows_both.cpu(), minlength=2 * B)[:B]
    return sums[:B].numpy(), sums[B:].numpy(), counts.numpy(), (f_new, b_new) if states is not None else None


def _pools(lines: Iterator[Line], size: int) -> Iterator[list[Line]]:
    """Lists of consecutive lines holding ``size`` non-blank ones each (the last fewer); blanks ride along."""
    pool: list[Line] = []
    have = 0
    for ln in lines:
        pool.append(ln)
        if not ln.blank:
            have += 1
            if have == size:
                yield pool
                pool, have = [], 0
    if pool:
        yield pool


def _pool_batches(pool: list[Line], batch_size: int, stateful: bool) -> list[list[Line]]:
    """The non-blank lines of a pool in batches: by length (stateless), or in input order (stateful: row b of each
    batch continues row b of the previous one)."""
    scored = [ln for ln in pool if not ln.blank]
    if stateful:
        return [[scored[k] for k in b] for b in input_order_batches(len(scored), batch_size)]
    return [[scored[k] for k in b] for b in length_sorted_batches([len(ln.ids) for ln in scored], batch_size)]


def evaluate(
    loaded: LoadedModel,
    inputs: list[str | Path],
    *,
    batch_size: int = 64,
    exclude_unk: bool = False,
    stateful: bool = False,
    per_sentence_path: str | Path | None = None,
    softmax_chunk: int = 32768,
    errors: str = "strict",
    on_progress: Callable[[int, int | None], None] | None = None,
) -> EvalResult:
    """Score text files or shard directories with the model's full softmax in both directions.

    # Parameters
    loaded : `LoadedModel` with a softmax and a vocabulary (a run directory or an export with softmax.hdf5).
    inputs : text files (globs, ``-``, ``.gz``; tokenized with the model's own tokenizer) and/or shard directories
        encoded with the model's vocabulary.
    batch_size : `int`, (default = `64`) sentences per batch.
    exclude_unk : drop ``<UNK>`` targets from the log-probability sums and from ``tokens``.
    stateful : carry LSTM state between batches as bilm-tf did (see the module docstring).
    per_sentence_path : write one JSON line per input line there (atomically).
    softmax_chunk : vocabulary rows per softmax chunk (memory, not results).
    on_progress : called as ``on_progress(lines_done, total_lines_or_None)`` after each pool.

    # Returns
    `EvalResult`.
    """
    if batch_size < 1:
        raise ElmoError(f"--batch-size must be at least 1, got {batch_size}")
    if softmax_chunk < 1:
        raise ElmoError(f"softmax chunk must be at least 1, got {softmax_chunk}")
    softmax, vocab = _check_model(loaded)
    source = Inputs(inputs, loaded.text, errors)
    progress = on_progress or (lambda done, total: None)
    model = loaded.model
    was_training = model.training
    model.eval()  # no dropout
    start = time.perf_counter()
    totals = _Totals(vocab.unk_id, exclude_unk)
    states: tuple | None = (None, None) if stateful else None
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(atomic_writer(per_sentence_path)) if per_sentence_path is not None else None
        try:
            with torch.inference_mode():
                for pool in _pools(source.lines(), _POOL_BATCHES * batch_size):
                    results: dict[int, tuple[float, float, int]] = {}
                    for batch in _pool_batches(pool, batch_size, stateful):
                        f, b, n, states = _score_batch(loaded, softmax, batch, vocab, exclude_unk,
                                                       softmax_chunk, states)
                        for r, ln in enumerate(batch):
                            results[ln.index] = (float(f[r]), float(b[r]), int(n[r]))
                    for ln in pool:
                        rec = totals.add(ln, results.get(ln.index))
                        if out is not None:
                            out.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))
                    totals.lines += len(pool)
                    progress(totals.lines, source.total)
        finally:
            model.train(was_training)
        if totals.tokens == 0:
            what = "every target is <UNK> and --exclude-unk drops them" if totals.sentences else \
                f"no sentences ({totals.blank_lines} blank lines)"
            raise ElmoError(f"{', '.join(map(str, inputs))}: nothing to score: {what}")
    return EvalResult(totals.sentences, totals.blank_lines, totals.words, totals.oov_words, totals.tokens,
                      totals.excluded_unk, totals.forward, totals.backward, exclude_unk=exclude_unk,
                      stateful=stateful, vocab_size=len(vocab), seconds=time.perf_counter() - start)


class _Totals:
    """Corpus totals of an evaluation, added up line by line."""

    def __init__(self, unk_id: int, exclude_unk: bool):
        self.unk_id, self.exclude_unk = unk_id, exclude_unk
        self.sentences = self.blank_lines = self.words = self.oov_words = self.tokens = self.excluded_unk = 0
        self.lines = 0
        self.forward = self.backward = 0.0

    def add(self, ln: Line, scores: tuple[float, float, int] | None) -> dict:
        """Count one line (``scores``: its forward and backward log-probabilities and targets, None if blank);
        returns its per-sentence record."""
        if scores is None:
            self.blank_lines += 1
            return {"index": ln.index, "source": ln.source, "words": 0, "tokens": 0,
                    "forward_logprob": None, "backward_logprob": None}
        f, b, n = scores
        unk = int(np.count_nonzero(ln.ids == self.unk_id))
        self.sentences += 1
        self.words += len(ln.ids)
        self.oov_words += unk
        self.tokens += n
        self.excluded_unk += unk if self.exclude_unk else 0
        self.forward += f
        self.backward += b
        return {"index": ln.index, "source": ln.source, "words": len(ln.ids), "tokens": n,
                "forward_logprob": f, "backward_logprob": b}
