"""`elmo-cli evaluate`: the test perplexity of a biLM, full softmax, both directions (spec §7).

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

`unigram_model` / `unigram_perplexity` give the baseline a biLM must beat: an add-one smoothed unigram over the
model vocabulary estimated from the training corpus, scored on the same targets.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from elmo_cli.loading import LoadedModel, length_sorted_batches, pad_char_batch
from elmo_cli.model.bilm import reverse_padded
from elmo_cli.model.lstm import fit_states
from elmo_cli.model.softmax import SharedSoftmax
from vocab.chars import BOS_TOKEN, EOS_TOKEN
from vocab.errors import ElmoError
from vocab.text import STDIN, atomic_writer, expand_paths, read_lines
from vocab.tokenize import TextEncoder
from vocab.vocabulary import Vocabulary

_LOGITS_BUDGET = 1 << 24  # floats of full-softmax logits held at once: 64 MB in float32
_POOL_BATCHES = 32  # stateless: sentences are sorted by length within pools of this many batches


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
        return math.exp(-self.forward_logprob / self.tokens)

    @property
    def backward_perplexity(self) -> float:
        return math.exp(-self.backward_logprob / self.tokens)

    @property
    def average_perplexity(self) -> float:
        """(forward + backward) / 2: what the ELMo paper reports (39.7 on the 1B Word Benchmark)."""
        return (self.forward_perplexity + self.backward_perplexity) / 2

    @property
    def mean_loss_perplexity(self) -> float:
        """exp of the mean loss over both directions = the geometric mean of the two perplexities."""
        return math.exp(-(self.forward_logprob + self.backward_logprob) / (2 * self.tokens))

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in ("oov_rate", "forward_perplexity", "backward_perplexity", "average_perplexity",
                     "mean_loss_perplexity", "tokens_per_second"):
            d[name] = getattr(self, name)
        return d


@dataclass
class _Line:
    """One input line (or stored shard sentence); ``ids``/``chars`` are None for a blank line."""

    index: int
    source: str
    ids: np.ndarray | None  # int32 (n,)
    chars: np.ndarray | None  # raw char ids (n, W)


# ---- input ---------------------------------------------------------------------------------------------------
def _count_lines(path: str) -> int | None:
    """Lines of a plain file (for the progress total); None for stdin and .gz."""
    if path == STDIN or path.endswith(".gz"):
        return None
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def _open_shards(directory: Path, text: TextEncoder):
    from vocab.shards import ShardDataset

    data = ShardDataset(directory)
    data.check_vocab(text.vocab)
    if data.chars.to_json() != text.chars.to_json():
        raise ElmoError(f"{directory}: shards use character settings {data.chars.to_json()} but the model uses "
                        f"{text.chars.to_json()}; re-shard with the model's vocabulary directory")
    return data


def _groups(inputs: list[str | Path]) -> list[tuple[str, list[str]]]:
    """Consecutive text paths grouped (``("text", [...])``), each directory alone (``("shards", [dir])``)."""
    if not inputs:
        raise ElmoError("no input given: pass text files (or - for stdin) or a shard directory")
    groups: list[tuple[str, list[str]]] = []
    for p in map(str, inputs):
        if p != STDIN and Path(p).is_dir():
            groups.append(("shards", [p]))
        elif groups and groups[-1][0] == "text":
            groups[-1][1].append(p)
        else:
            groups.append(("text", [p]))
    return groups


def _iter_lines(groups, text: TextEncoder, errors: str, shards: dict) -> Iterator[_Line]:
    """Every input line as a `_Line`, indexed from 0 across all inputs."""
    index = 0
    vocab = text.vocab
    for kind, paths in groups:
        if kind == "shards":
            data = shards[paths[0]]
            for i, (ids, chars) in enumerate(data.iter_sentences()):
                src = f"{paths[0]}#{i}"
                yield _Line(index, src, ids, chars) if len(ids) else _Line(index, src, None, None)
                index += 1
            continue
        for path, lineno, line in read_lines(paths, errors):
            tokens = text.tokenize(line) if line and not line.isspace() else []
            if tokens:
                yield _Line(index, f"{path}:{lineno}", vocab.encode(tokens), text.chars.encode_tokens(tokens))
            else:
                yield _Line(index, f"{path}:{lineno}", None, None)
            index += 1


def _prepare_inputs(inputs, text: TextEncoder) -> tuple[list, dict, int | None]:
    """Groups, opened shard datasets and the total line count (None when unknown)."""
    groups = _groups(inputs)
    shards: dict = {}
    total: int | None = 0
    for kind, paths in groups:
        if kind == "shards":
            shards[paths[0]] = _open_shards(Path(paths[0]), text)
            total = None if total is None else total + shards[paths[0]].num_sentences
        else:
            for p in expand_paths(paths):
                n = _count_lines(p)
                total = None if total is None or n is None else total + n
    return groups, shards, total


# ---- scoring -------------------------------------------------------------------------------------------------
def _check_model(loaded: LoadedModel) -> tuple[SharedSoftmax, Vocabulary]:
    where = loaded.directory or "this model"
    softmax = loaded.model.softmax
    if softmax is None:
        raise ElmoError(f"{where}: the model has no softmax weights (softmax.hdf5), so it cannot score text; "
                        f"published bilm-tf files do not include them. Train a softmax on top of it with "
                        f"`elmo-cli train --init-from MODEL_DIR ...`, then evaluate the run directory")
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


def _score_batch(loaded: LoadedModel, softmax: SharedSoftmax, lines: list[_Line], boundary_rows: np.ndarray,
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
    bos, eos = boundary_rows[0:1], boundary_rows[1:2]
    rows = [np.concatenate([bos, ln.chars.astype(boundary_rows.dtype), eos]) for ln in lines]  # each (n+2, W)
    chars, lengths = pad_char_batch(rows, device)  # (B, T, W), (B,)
    T = chars.shape[1]
    ids = torch.zeros(B, T, dtype=torch.long)
    for b, ln in enumerate(lines):
        n = len(ln.ids)
        ids[b, 0], ids[b, 1 : n + 1], ids[b, n + 1] = vocab.bos_id, torch.from_numpy(ln.ids.astype(np.int64)), vocab.eos_id
    ids = ids.to(device)

    x = model.encoder.forward_distinct(chars, 4096)  # (B, T, P)
    # Forward reads <S> w1..wn and predicts w1..wn </S>; backward reads </S> wn..w1 and predicts wn..w1 <S>.
    fwd_in, bwd_in = x[:, : T - 1], reverse_padded(x, lengths)[:, : T - 1]  # (B, T-1, P) each
    fwd_tg, bwd_tg = ids[:, 1:], reverse_padded(ids, lengths)[:, 1:]  # (B, T-1) each
    valid = torch.arange(T - 1, device=device).unsqueeze(0) < (lengths - 1).unsqueeze(1)  # (B, T-1)
    mask = valid if states is not None else None  # padding must not advance a carried state
    f_states, b_states = states if states is not None else (None, None)
    f_out, f_new = model.forward_lstm(fwd_in, fit_states(f_states, B), mask)
    b_out, b_new = model.backward_lstm(bwd_in, fit_states(b_states, B), mask)

    row = torch.arange(B, device=device).unsqueeze(1).expand(B, T - 1)[valid]  # (N,)
    h = torch.cat([f_out[-1][valid], b_out[-1][valid]])  # (2N, P)
    targets = torch.cat([fwd_tg[valid], bwd_tg[valid]])  # (2N,)
    rows_both = torch.cat([row, row + B])  # backward rows offset by B
    if exclude_unk:
        keep = targets != vocab.unk_id
        h, targets, rows_both = h[keep], targets[keep], rows_both[keep]
    lp = chunked_log_probs(softmax, h, targets, chunk_size).double().cpu()
    sums = torch.zeros(2 * B, dtype=torch.float64).index_add_(0, rows_both.cpu(), lp)
    counts = torch.bincount(rows_both.cpu(), minlength=2 * B)[:B]
    return sums[:B].numpy(), sums[B:].numpy(), counts.numpy(), (f_new, b_new) if states is not None else None


def _pools(lines: Iterator[_Line], size: int) -> Iterator[list[_Line]]:
    """Lists of consecutive lines holding ``size`` non-blank ones each (the last fewer); blanks ride along."""
    pool: list[_Line] = []
    have = 0
    for ln in lines:
        pool.append(ln)
        if ln.ids is not None:
            have += 1
            if have == size:
                yield pool
                pool, have = [], 0
    if pool:
        yield pool


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
    text = loaded.text
    groups, shards, total = _prepare_inputs(inputs, text)
    boundary_rows = text.chars.encode_tokens([BOS_TOKEN, EOS_TOKEN])  # (2, W)
    progress = on_progress or (lambda done, total: None)
    model = loaded.model
    was_training = model.training
    model.eval()  # no dropout
    start = time.perf_counter()
    totals = dict(sentences=0, blank_lines=0, words=0, oov_words=0, tokens=0, excluded_unk=0)
    fwd_total = bwd_total = 0.0
    states: tuple | None = (None, None) if stateful else None
    writer = atomic_writer(per_sentence_path) if per_sentence_path is not None else None
    out = writer.__enter__() if writer is not None else None
    done = 0
    try:
        with torch.inference_mode():
            for pool in _pools(_iter_lines(groups, text, errors, shards), _POOL_BATCHES * batch_size):
                scored = [ln for ln in pool if ln.ids is not None]
                if stateful:  # input order: row b of each batch continues row b of the previous one
                    batches = [scored[i : i + batch_size] for i in range(0, len(scored), batch_size)]
                else:
                    batches = [[scored[k] for k in b]
                               for b in length_sorted_batches([len(ln.ids) for ln in scored], batch_size)]
                results: dict[int, tuple[float, float, int]] = {}
                for batch in batches:
                    f, b, n, states = _score_batch(loaded, softmax, batch, boundary_rows, vocab, exclude_unk,
                                                   softmax_chunk, states)
                    for r, ln in enumerate(batch):
                        results[ln.index] = (float(f[r]), float(b[r]), int(n[r]))
                for ln in pool:
                    if ln.ids is None:
                        totals["blank_lines"] += 1
                        rec = {"index": ln.index, "source": ln.source, "words": 0, "tokens": 0,
                               "forward_logprob": None, "backward_logprob": None}
                    else:
                        f, b, n = results[ln.index]
                        unk = int(np.count_nonzero(ln.ids == vocab.unk_id))
                        totals["sentences"] += 1
                        totals["words"] += len(ln.ids)
                        totals["oov_words"] += unk
                        totals["tokens"] += n
                        totals["excluded_unk"] += unk if exclude_unk else 0
                        fwd_total += f
                        bwd_total += b
                        rec = {"index": ln.index, "source": ln.source, "words": len(ln.ids), "tokens": n,
                               "forward_logprob": f, "backward_logprob": b}
                    if out is not None:
                        out.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))
                done += len(pool)
                progress(done, total)
        if totals["tokens"] == 0:
            what = "every target is <UNK> and --exclude-unk drops them" if totals["sentences"] else \
                f"no sentences ({totals['blank_lines']} blank lines)"
            raise ElmoError(f"{', '.join(map(str, inputs))}: nothing to score: {what}")
    except BaseException as e:
        if writer is not None:
            writer.__exit__(type(e), e, e.__traceback__)
        raise
    finally:
        model.train(was_training)
    if writer is not None:
        writer.__exit__(None, None, None)
    return EvalResult(**totals, forward_logprob=fwd_total, backward_logprob=bwd_total, exclude_unk=exclude_unk,
                      stateful=stateful, vocab_size=len(vocab), seconds=time.perf_counter() - start)


# ---- the unigram baseline ------------------------------------------------------------------------------------
@dataclass
class UnigramModel:
    """Add-one smoothed unigram over the model vocabulary: ``P(id) = (count(id) + 1) / (N + V)``.

    ``counts`` (V,) int64: each training word under its vocabulary id (unknown words as ``<UNK>``) and the
    boundary target once per sentence under ``</S>``; N = counts.sum() = words + sentences. This is the forward
    distribution; the backward one swaps ``<S>`` and ``</S>`` and gives the same perplexity on any text, so one
    number serves both directions.
    """

    counts: np.ndarray
    sentences: int

    def log_probs(self) -> np.ndarray:
        """Natural-log probability of each vocabulary id, float64 (V,)."""
        return np.log(self.counts + 1.0) - math.log(self.counts.sum() + len(self.counts))


@dataclass
class UnigramResult:
    perplexity: float
    tokens: int  # targets scored (the same definition as EvalResult.tokens)
    train_tokens: int  # N of the unigram model


def unigram_model(train_inputs: list[str | Path], text: TextEncoder, errors: str = "strict") -> UnigramModel:
    """Count a training corpus (text files or shard directories) into a `UnigramModel` over ``text.vocab``."""
    if text.vocab is None:
        raise ElmoError("the unigram baseline needs the model's vocab.txt")
    vocab = text.vocab
    groups, shards, _ = _prepare_inputs(train_inputs, text)
    counts = np.zeros(len(vocab), dtype=np.int64)
    sentences = 0
    pending: list[np.ndarray] = []
    have = 0
    for ln in _iter_lines(groups, text, errors, shards):
        if ln.ids is None:
            continue
        sentences += 1
        pending.append(ln.ids)
        have += len(ln.ids)
        if have >= 1 << 20:  # one O(V) bincount per million words, not per sentence
            counts += np.bincount(np.concatenate(pending), minlength=len(vocab))
            pending, have = [], 0
    if pending:
        counts += np.bincount(np.concatenate(pending), minlength=len(vocab))
    if sentences == 0:
        raise ElmoError(f"{', '.join(map(str, train_inputs))}: no sentences to estimate the unigram baseline from")
    counts[vocab.eos_id] += sentences
    return UnigramModel(counts, sentences)


def unigram_perplexity(unigram: UnigramModel, inputs: list[str | Path], text: TextEncoder,
                       exclude_unk: bool = False, errors: str = "strict") -> UnigramResult:
    """The unigram's perplexity on the targets `evaluate` scores (words + one ``</S>`` per sentence)."""
    vocab = text.vocab
    if vocab is None or len(vocab) != len(unigram.counts):
        raise ElmoError("the unigram baseline was counted over a different vocabulary than the model's")
    logp = unigram.log_probs()
    groups, shards, _ = _prepare_inputs(inputs, text)
    total, tokens = 0.0, 0
    for ln in _iter_lines(groups, text, errors, shards):
        if ln.ids is None:
            continue
        ids = ln.ids[ln.ids != vocab.unk_id] if exclude_unk else ln.ids
        total += float(logp[ids].sum()) + logp[vocab.eos_id]
        tokens += len(ids) + 1
    if tokens == 0:
        raise ElmoError(f"{', '.join(map(str, inputs))}: nothing to score with the unigram baseline")
    return UnigramResult(math.exp(-total / tokens), tokens, int(unigram.counts.sum()))
