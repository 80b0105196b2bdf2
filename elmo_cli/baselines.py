"""The references a biLM is measured against, scored on the same targets as `elmo_cli.evaluate`: torch-free.

- `UnigramModel`: add-one smoothed unigram over the model vocabulary, counted from the training text.
- Kneser-Ney: `elmo_cli.kneser_ney`, built here from the same sentences.

Every model here takes already-read sentences (`elmo_cli.inputs`), uses the model's vocabulary and ``<UNK>``
mapping, and counts one boundary target per sentence and direction, as `evaluate` does.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from elmo_cli.inputs import Inputs
from vocab.errors import ElmoError
from vocab.text import expand_paths
from vocab.tokenize import TextEncoder

if TYPE_CHECKING:
    from elmo_cli.kneser_ney import KneserNeyPerplexity


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
    counts = np.zeros(len(vocab), dtype=np.int64)
    sentences = 0
    pending: list[np.ndarray] = []
    have = 0
    for ln in Inputs(train_inputs, text, errors).lines():
        if ln.blank:
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
    total, tokens = 0.0, 0
    for ln in Inputs(inputs, text, errors).lines():
        if ln.blank:
            continue
        ids = ln.ids[ln.ids != vocab.unk_id] if exclude_unk else ln.ids
        total += float(logp[ids].sum()) + logp[vocab.eos_id]
        tokens += len(ids) + 1
    if tokens == 0:
        raise ElmoError(f"{', '.join(map(str, inputs))}: nothing to score with the unigram baseline")
    return UnigramResult(math.exp(-total / tokens), tokens, int(unigram.counts.sum()))


def _sentences(inputs: list[str | Path], text: TextEncoder, errors: str) -> list[np.ndarray]:
    return [ln.ids for ln in Inputs(inputs, text, errors).lines() if not ln.blank]


def kneser_ney_baseline(train_inputs: list[str | Path], inputs: list[str | Path], text: TextEncoder, order: int = 5,
                        exclude_unk: bool = False, errors: str = "strict") -> "KneserNeyPerplexity":
    """Interpolated modified Kneser-Ney of ``order``, counted from ``train_inputs`` (text or shard directories)
    over the model vocabulary, scored in both directions on ``inputs`` with `evaluate`'s targets."""
    from elmo_cli.kneser_ney import check_order, kneser_ney_perplexity

    check_order(order)
    if text.vocab is None:
        raise ElmoError("the Kneser-Ney baseline needs the model's vocab.txt")
    train = _sentences(train_inputs, text, errors)
    if not train:
        raise ElmoError(f"{', '.join(map(str, train_inputs))}: no sentences to estimate the Kneser-Ney baseline from")
    result = kneser_ney_perplexity(train, _sentences(inputs, text, errors), text.vocab, order, exclude_unk)
    return dataclasses.replace(result, train_words=sum(len(s) for s in train))


BASELINES = ("kn", "unigram")  # the n-gram references `evaluate --baseline` scores beside the biLM


def check_baseline_args(kinds: list[str], train: list[str], order: int) -> None:
    """Refuse bad --baseline/--baseline-train/--kn-order before the model is loaded."""
    bad = sorted(set(kinds) - set(BASELINES))
    if bad:
        raise ElmoError(f"--baseline {bad[0]!r}: expected kn or unigram")
    if kinds and not train:
        raise ElmoError(f"--baseline {kinds[0]} needs --baseline-train TRAIN (the text or shards the model was "
                        f"trained on)")
    if train and not kinds:
        raise ElmoError("--baseline-train is given but no --baseline (kn, unigram)")
    if not 1 <= order <= 9:
        raise ElmoError(f"--kn-order must be between 1 and 9, got {order}")
    for path in train:
        if path != "-" and not Path(path).is_dir() and not expand_paths([path]):
            raise ElmoError(f"{path}: --baseline-train file not found")


def score_baselines(kinds: list[str], train: list[str], order: int, data: list[str], text: TextEncoder,
                    exclude_unk: bool, errors: str) -> dict[str, dict]:
    """The requested n-gram references of ``train`` scored on ``data``: ``{"kn5": {...}, "unigram": {...}}``."""
    out: dict[str, dict] = {}
    for kind in dict.fromkeys(kinds):
        if kind == "kn":
            kn = kneser_ney_baseline(train, data, text, order, exclude_unk, errors)
            out[f"kn{order}"] = {"forward_perplexity": kn.forward_perplexity,
                                 "backward_perplexity": kn.backward_perplexity,
                                 "average_perplexity": kn.average_perplexity, "tokens": kn.tokens,
                                 "train_words": kn.train_words}
        else:
            uni = unigram_perplexity(unigram_model(train, text, errors), data, text, exclude_unk,
                                     errors)
            out["unigram"] = {"forward_perplexity": uni.perplexity, "backward_perplexity": uni.perplexity,
                              "average_perplexity": uni.perplexity, "tokens": uni.tokens}
    return out


# ---- what a biLM/KN5 ratio means --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reference:
    """One measured run: held-out average perplexity over KN5 of the same training text (docs/auto.md)."""

    corpus: str
    train_tokens: int
    minutes: float
    preset: str
    ratio: float
    machine: str = ""  # the CPU's vector units where they set the choice: "AVX2", "AVX-512", "AVX-512 BF16"
    record: str = ""  # the file under benchmarks/results/ that holds the run (tests/test_auto.py checks the ratio)


# Each a run of `train --preset PRESET --max-time MINUTES --threads 2` on 2 threads of an AMD EPYC: Zen 3 (AVX2) or
# Zen 4/Zen 5 (AVX-512 with BF16, where auto trains its larger shapes in bf16), annealed at its own budget and scored
# at its best validation, as `python -m benchmarks.bench_quality` runs it; the record named is that run's. Where one
# CPU kind was measured on two machines, the faster one's (Zen 5) is kept. The `austen-0.2M` hour of `auto` is the
# run under the present pass cap (15.1 passes at that size), 2026-12-05, and the KJV's hour of `auto` the run under
# the present rule (64 rows where bf16 is kept, 2026-12-06: `1024/256`; 0.628 at 32 rows, `512/128` to its cap, in
# the same command); its quarter hour is the pair of one command under rule 3's step (2026-12-06).
# "AVX-512": AVX-512 without bf16 instructions (an Intel Xeon of family 6 model 207 whose virtual machine shows
# neither AVX512-BF16 nor AMX), where every shape trains in fp32.
AVX2, AVX512, BF16 = "AVX2", "AVX-512", "AVX-512 BF16"
AUTO_RUNS, LAPTOP_60M, LAPTOP_2H = ("auto-2026-11-25.jsonl", "laptop-austen-60m.json", "laptop-austen-2h.json")
HELDOUT_XEON, HELDOUT_ZEN1 = "heldout-2026-11-28.jsonl", "heldout-2026-11-29.jsonl"
ZEN5_0P45 = "quality-0p45-zen5-15m-2026-12-07.json"
ZEN5_0P2_NOW = "quality-0p2-now-zen5-15m-2026-12-07.json"
REFERENCES = (
    Reference("Austen", 205_391, 15, "laptop", 0.721, BF16, AUTO_RUNS),
    Reference("Austen", 205_391, 15, "auto", 0.722, BF16, AUTO_RUNS),
    Reference("Austen", 205_391, 60, "auto", 0.699, BF16, "quality-austen02-zen5-auto-60m-2026-12-05.json"),
    Reference("Austen", 205_391, 60, "laptop", 0.740, BF16, AUTO_RUNS),
    Reference("Austen", 780_554, 15, "auto", 0.664, BF16, AUTO_RUNS),
    Reference("Austen", 780_554, 15, "laptop", 0.705, BF16, AUTO_RUNS),
    Reference("Austen", 780_554, 60, "laptop", 0.634, AVX2, LAPTOP_60M),
    Reference("Austen", 780_554, 60, "auto", 0.658, AVX2, AUTO_RUNS),
    Reference("Austen", 780_554, 120, "laptop", 0.612, AVX2, LAPTOP_2H),
    Reference("Austen", 780_554, 120, "auto", 0.569, BF16, AUTO_RUNS),
    Reference("Austen", 780_554, 120, "laptop", 0.613, BF16, AUTO_RUNS),
    Reference("the KJV", 825_573, 15, "laptop", 0.986, AVX2, AUTO_RUNS),
    Reference("the KJV", 825_573, 15, "auto", 0.911, AVX2, AUTO_RUNS),
    Reference("the KJV", 825_573, 15, "laptop", 0.740, BF16, "quality-kjv-zen5-rule3-15m-2026-12-06.json"),
    Reference("the KJV", 825_573, 15, "auto", 0.697, BF16, "quality-kjv-zen5-rule3-15m-2026-12-06.json"),
    Reference("the KJV", 825_573, 60, "auto", 0.582, BF16, "quality-kjv-zen5-rows-60m-2026-12-06.json"),
    Reference("the KJV", 825_573, 60, "laptop", 0.642, BF16, AUTO_RUNS),
    Reference("the KJV", 825_573, 60, "laptop", 0.692, AVX2, AUTO_RUNS),
    Reference("the KJV", 825_573, 120, "auto", 0.578, BF16, AUTO_RUNS),
    Reference("the KJV", 825_573, 120, "laptop", 0.624, BF16, AUTO_RUNS),
    Reference("Austen and the KJV", 1_606_127, 15, "auto", 0.746, BF16, AUTO_RUNS),
    Reference("Austen and the KJV", 1_606_127, 15, "laptop", 0.829, BF16, AUTO_RUNS),
    Reference("Austen and the KJV", 1_606_127, 60, "auto", 0.604, BF16, AUTO_RUNS),
    Reference("Austen and the KJV", 1_606_127, 60, "laptop", 0.633, BF16, AUTO_RUNS),
    Reference("Austen and the KJV", 1_606_127, 120, "auto", 0.570, BF16, AUTO_RUNS),
    Reference("Austen and the KJV", 1_606_127, 120, "laptop", 0.589, BF16, AUTO_RUNS),
    Reference("classical Chinese", 32_233, 15, "auto", 0.982, BF16, AUTO_RUNS),
    Reference("classical Chinese", 32_233, 15, "laptop", 1.005, BF16, AUTO_RUNS),
    # The held-out corpora (`make corpora`), on 2 cores of a Zen 1 (AVX2): the addresses on the present step (the
    # LSTM's gradient by hand), the two one after the other; the poems on that step under rule 9, the same.
    Reference("State of the Union addresses", 915_556, 60, "auto", 0.688, AVX2, HELDOUT_ZEN1),
    Reference("State of the Union addresses", 915_556, 60, "laptop", 0.729, AVX2, HELDOUT_ZEN1),
    Reference("Tang poems (SentencePiece)", 1_050_948, 60, "auto", 0.541, AVX2,
              "quality-tang-zen1-rule9-60m-2026-12-02.json"),
    Reference("Tang poems (SentencePiece)", 1_050_948, 60, "laptop", 0.598, AVX2,
              "quality-tang-zen1-laptop-60m-2026-12-02.json"),
    # ... and the 2 hours on the poems there, on the present step, the two one after the other (`auto` chose
    # `laptop`'s recipe: `512/128` at 13 passes, dropout 0.3).
    Reference("Tang poems (SentencePiece)", 1_050_948, 120, "auto", 0.516, AVX2, HELDOUT_ZEN1),
    Reference("Tang poems (SentencePiece)", 1_050_948, 120, "laptop", 0.517, AVX2, HELDOUT_ZEN1),
    # ... and half an hour on each corpus there, on the same step, each corpus's two one after the other (`auto`
    # took `512/128` at about 3 passes, dropout 0.1).
    Reference("Tang poems (SentencePiece)", 1_050_948, 30, "auto", 0.646, AVX2, HELDOUT_ZEN1),
    Reference("Tang poems (SentencePiece)", 1_050_948, 30, "laptop", 0.711, AVX2, HELDOUT_ZEN1),
    Reference("State of the Union addresses", 915_556, 30, "auto", 0.787, AVX2, HELDOUT_ZEN1),
    Reference("State of the Union addresses", 915_556, 30, "laptop", 0.874, AVX2, HELDOUT_ZEN1),
    # The addresses on 2 cores of an Intel Xeon (family 6 model 207) showing AVX-512 without bf16 instructions:
    # `auto` and `laptop` on the present code (eager, the LSTM's gradient by hand, 20 passes), one after the other.
    Reference("State of the Union addresses", 915_556, 60, "auto", 0.625, AVX512, HELDOUT_XEON),
    Reference("State of the Union addresses", 915_556, 60, "laptop", 0.625, AVX512, HELDOUT_XEON),
    # ... and `auto`'s 2 hours there under the present rules 1 and 4: `512/128` to its 31.9-pass cap, no decay.
    Reference("State of the Union addresses", 915_556, 120, "auto", 0.626, AVX512, HELDOUT_XEON),
    # ... and half an hour on the poems there, on the compiled step of that day (`512/128`, dropout 0.3).
    Reference("Tang poems (SentencePiece)", 1_050_948, 30, "auto", 0.571, AVX512, HELDOUT_XEON),
    Reference("Tang poems (SentencePiece)", 1_050_948, 30, "laptop", 0.613, AVX512, HELDOUT_XEON),
    # The addresses on 2 cores of a Zen 5 (AVX-512 with AVX512-BF16; the faster of the two such CPUs measured):
    # `auto` under the present rule (2026-12-06: `512/128` in bf16 compiled at 64 rows, to the 31.9-pass cap; 0.608
    # at 32 rows in the same command, 0.609 on 2026-12-04), and `laptop` from the pair of 2026-12-04 (`512/128` in
    # fp32, 22.9 passes).
    Reference("State of the Union addresses", 915_556, 60, "auto", 0.603, BF16,
              "quality-sotu-zen5-rows-60m-2026-12-06.json"),
    Reference("State of the Union addresses", 915_556, 60, "laptop", 0.621, BF16,
              "quality-sotu-zen5-pair-60m-now-2026-12-04.json"),
    # ... and the poems there, the same (`auto` `512/128` in bf16 compiled, 30.0 passes; `laptop` 19.7 in fp32).
    Reference("Tang poems (SentencePiece)", 1_050_948, 60, "auto", 0.471, BF16,
              "quality-tang-zen5-pair-60m-2026-12-05.json"),
    Reference("Tang poems (SentencePiece)", 1_050_948, 60, "laptop", 0.476, BF16,
              "quality-tang-zen5-pair-60m-2026-12-05.json"),
    # ... and their half hour there, the same (`auto` 13.3 passes in bf16 compiled; `laptop` 10.1 in fp32).
    Reference("Tang poems (SentencePiece)", 1_050_948, 30, "auto", 0.518, BF16,
              "quality-tang-zen5-pair-30m-2026-12-05.json"),
    Reference("Tang poems (SentencePiece)", 1_050_948, 30, "laptop", 0.545, BF16,
              "quality-tang-zen5-pair-30m-2026-12-05.json"),
    # ... and their quarter hour there, under rule 3's step as it is now (`auto` 8.7 passes in bf16 compiled at 64
    # rows, dropout 0.1; `laptop` 5.7 in fp32).
    Reference("Tang poems (SentencePiece)", 1_050_948, 15, "auto", 0.505, BF16,
              "quality-tang-zen5-rule3-15m-2026-12-06.json"),
    Reference("Tang poems (SentencePiece)", 1_050_948, 15, "laptop", 0.621, BF16,
              "quality-tang-zen5-rule3-15m-2026-12-06.json"),
    # ... and the addresses' quarter hour there, the same, right after 2 other corpora's (`auto` 9.8 passes in bf16
    # at 64 rows, dropout 0.1; `laptop` 6.3 in fp32).
    Reference("State of the Union addresses", 915_556, 15, "auto", 0.681, BF16,
              "quality-heldout-zen5-15m-2026-12-06.json"),
    Reference("State of the Union addresses", 915_556, 15, "laptop", 0.760, BF16,
              "quality-heldout-zen5-15m-2026-12-06.json"),
    # ... and their half hour there, the same (`auto` 21.0 passes in bf16 compiled at 64 rows, dropout 0.3;
    # `laptop` 11.7 in fp32).
    Reference("State of the Union addresses", 915_556, 30, "auto", 0.620, BF16,
              "quality-sotu-zen5-rule3-30m-2026-12-06.json"),
    Reference("State of the Union addresses", 915_556, 30, "laptop", 0.672, BF16,
              "quality-sotu-zen5-rule3-30m-2026-12-06.json"),
    # ... and their quarter hour on 45% of the addresses' training lines (`bench_quality --train-share 0.45`), the
    # one pair between 0.2M and 0.75M tokens (`auto` 19.9 passes in bf16 at 64 rows, dropout 0.3, to near its pass
    # cap; `laptop` 13.8 in fp32).
    Reference("State of the Union addresses (45% of the lines)", 412_363, 15, "auto", 0.671, BF16,
              "quality-sotu-0p45-zen5-15m-2026-12-07.json"),
    Reference("State of the Union addresses (45% of the lines)", 412_363, 15, "laptop", 0.686, BF16,
              "quality-sotu-0p45-zen5-15m-2026-12-07.json"),
    # ... and the same cut of the two Bibles and the poems there, the same day (`auto` in bf16 at 64 rows, dropout
    # 0.3: 19.5 passes over the WEB's and 14.3 over the poems', with Adam; to the 19.4-pass cap over the Spanish,
    # with decay; `laptop` in fp32).
    Reference("the World English Bible (45% of the lines)", 433_170, 15, "auto", 0.657, BF16, ZEN5_0P45),
    Reference("the World English Bible (45% of the lines)", 433_170, 15, "laptop", 0.670, BF16, ZEN5_0P45),
    Reference("the Spanish Reina-Valera Bible (45% of the lines)", 337_445, 15, "auto", 0.639, BF16, ZEN5_0P45),
    Reference("the Spanish Reina-Valera Bible (45% of the lines)", 337_445, 15, "laptop", 0.650, BF16, ZEN5_0P45),
    Reference("Tang poems (SentencePiece, 45% of the lines)", 465_556, 15, "auto", 0.518, BF16,
              "quality-tang-0p45-zen5-15m-2026-12-07.json"),
    Reference("Tang poems (SentencePiece, 45% of the lines)", 465_556, 15, "laptop", 0.537, BF16,
              "quality-tang-0p45-zen5-15m-2026-12-07.json"),
    # ... and 20% of the WEB's, the addresses' and the Spanish Bible's training lines, `auto` under the rule of
    # f2d3f88 (512/128 in bf16 at 32 rows to the pass cap, the larger shape not weighed on so little text),
    # `laptop` in fp32 the same day.
    Reference("the World English Bible (20% of the lines)", 191_581, 15, "auto", 0.692, BF16, ZEN5_0P2_NOW),
    Reference("the World English Bible (20% of the lines)", 191_581, 15, "laptop", 0.723, BF16,
              "quality-web-0p2-zen5-15m-2026-12-07.jsonl"),
    Reference("State of the Union addresses (20% of the lines)", 182_217, 15, "auto", 0.738, BF16, ZEN5_0P2_NOW),
    Reference("State of the Union addresses (20% of the lines)", 182_217, 15, "laptop", 0.787, BF16,
              "quality-0p2-zen5-15m-2026-12-07.json"),
    Reference("the Spanish Reina-Valera Bible (20% of the lines)", 149_185, 15, "auto", 0.690, BF16,
              "quality-rv1909-0p2-now-zen5-15m-2026-12-07.json"),
    Reference("the Spanish Reina-Valera Bible (20% of the lines)", 149_185, 15, "laptop", 0.796, BF16,
              "quality-0p2-zen5-15m-2026-12-07.json"),
)
IN_LINE = 0.02  # ratios this close to a measured one are "in line with" it


NEAR = 2.0  # a reference within this factor of the run's corpus size and of its budget is "close"


def _when(r: Reference) -> str:
    length = f"{r.minutes:g} min" if r.minutes < 120 else f"{r.minutes / 60:g} h"
    return f"{length} of --preset {r.preset} ({r.ratio:.2f}x{', ' + r.machine if r.machine else ''})"


def _nearest(values, target: float) -> float:
    return min(values, key=lambda v: abs(math.log(v / target)))


def place_ratio(ratio: float, train_tokens: int, minutes: float | None = None,
                references: tuple[Reference, ...] = REFERENCES) -> str:
    """One line placing a biLM/KN5 ratio against the measured runs like it: the corpus nearest in size and, when
    the run's training time is known, the budget nearest to it; it says so when none is within `NEAR` times.

    ``place_ratio(0.63, 800_000, 60)`` -> ``"0.630x KN5: in line with 60 min of --preset laptop (0.63x, AVX2) on
    0.78M tokens of Austen on 2 CPU threads"``
    """
    head = f"{ratio:.3f}x KN5"
    if ratio >= 1.0:
        return (f"{head}: the biLM does not yet predict this text better than a 5-gram Kneser-Ney model of its "
                f"training text; train longer or on more text")
    if not references or train_tokens <= 0:
        return head
    size = _nearest({r.train_tokens for r in references}, train_tokens)
    rows = [r for r in references if r.train_tokens == size]
    far = []
    if not 1 / NEAR <= size / train_tokens <= NEAR:
        far.append(f"{train_tokens / 1e6:.2f}M tokens")
    if minutes:
        budget = _nearest({r.minutes for r in rows}, minutes)
        rows = [r for r in rows if r.minutes == budget]
        if not 1 / NEAR <= budget / minutes <= NEAR:
            far.append(f"{minutes:.0f} min")
    rows.sort(key=lambda r: r.ratio, reverse=True)  # worst first
    close = [r for r in rows if abs(r.ratio - ratio) <= IN_LINE]
    if close:
        where = "in line with " + _when(min(close, key=lambda r: abs(r.ratio - ratio)))
    elif ratio < rows[-1].ratio:
        where = "better than " + _when(rows[-1])
    elif ratio > rows[0].ratio:
        where = "short of " + _when(rows[0])
    else:
        above = next(r for r in rows if r.ratio < ratio)
        below = [r for r in rows if r.ratio > ratio][-1]
        where = f"between {_when(below)} and {_when(above)}"
    line = f"{head}: {where} on {size / 1e6:.2f}M tokens of {rows[0].corpus} on 2 CPU threads"
    if far:
        line += f" (no run near this one's {' and '.join(far)} was measured: the nearest is shown)"
    return line
