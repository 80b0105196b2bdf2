"""The token vocabulary (docs/formats.md, Vocabulary) and `build_vocab`, which makes one from a corpus.

File format (bilm-tf's): UTF-8, one token per line, id = 0-based line index, ``<S>``, ``</S>``, ``<UNK>`` first,
then tokens by descending corpus count. Ties are broken by the token's UTF-8 bytes ascending, so the same
corpus always gives the same file::

    corpus "b a b c a b"  ->  <S> </S> <UNK> b a c

`build_vocab` also writes ``<output>.counts.tsv`` (``token<TAB>count``: every vocabulary line in id order, then
the types that were cut, in the same order) and returns `VocabStats` for the CLI to print.

With ``sentencepiece=True`` it trains a SentencePiece model on raw text instead and writes it beside the
vocabulary as ``<output stem>.spm.model`` (``vocab.txt`` -> ``vocab.spm.model``); the vocabulary then lists the
model's pieces in id order (the specials are pieces 0, 1, 2, so piece id == vocabulary id).
"""
from __future__ import annotations

import hashlib
import io
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from vocab.chars import BOS_TOKEN, EOS_TOKEN, MAX_CHARS, UNK_TOKEN
from vocab.errors import ElmoError
from vocab.text import atomic_write_bytes, read_lines

SPECIALS = (BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)


def spm_path_for(vocab_path: str | Path) -> Path:
    """Where the SentencePiece model of a vocabulary file lives: ``dir/vocab.txt`` -> ``dir/vocab.spm.model``."""
    vocab_path = Path(vocab_path)
    return vocab_path.with_name(vocab_path.stem + ".spm.model")


def _check_token(token: str) -> str | None:
    """Why a vocabulary line cannot be a token, or None."""
    if not token:
        return "empty line"
    if token.split() != [token]:
        return f"token {token!r} contains whitespace, which tokenization can never produce"
    return None


class Vocabulary:
    """Tokens and their ids; ``id_of`` maps unknown tokens to ``<UNK>``.

    ``Vocabulary(["<S>", "</S>", "<UNK>", "the"]).encode(["the", "cat"]) -> array([3, 2], dtype=int32)``
    """

    def __init__(self, tokens: list[str], *, source: str = "vocabulary"):
        index: dict[str, int] = {}
        for i, tok in enumerate(tokens):
            problem = _check_token(tok)
            if problem:
                raise ElmoError(f"{source}:{i + 1}: {problem}")
            if tok in index:
                raise ElmoError(f"{source}:{i + 1}: duplicate token {tok!r} (first on line {index[tok] + 1})")
            index[tok] = i
        missing = [s for s in SPECIALS if s not in index]
        if missing:
            raise ElmoError(
                f"{source}:1: missing special token(s) {', '.join(missing)}; a vocabulary must contain "
                f"<S>, </S> and <UNK> (by convention on lines 1-3)"
            )
        self.tokens = list(tokens)
        self._index = index
        self.bos_id = index[BOS_TOKEN]
        self.eos_id = index[EOS_TOKEN]
        self.unk_id = index[UNK_TOKEN]
        self._sha256: str | None = None

    @classmethod
    def load(cls, path: str | Path) -> "Vocabulary":
        """Read a vocabulary file; ElmoError names file and line of an empty line, duplicate or missing special."""
        path = Path(path)
        if not path.is_file():
            raise ElmoError(f"{path}: vocabulary file not found")
        tokens = [line for _, _, line in read_lines([str(path)])]
        if not tokens:
            raise ElmoError(f"{path}: vocabulary file is empty")
        return cls(tokens, source=str(path))

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: str) -> bool:
        return token in self._index

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} tokens)"

    def id_of(self, token: str) -> int:
        return self._index.get(token, self.unk_id)

    def encode(self, tokens: list[str]) -> np.ndarray:
        """Ids of tokens, unknown -> ``unk_id``; shape ``(n,)``, int32."""
        get, unk = self._index.get, self.unk_id
        return np.fromiter((get(t, unk) for t in tokens), dtype=np.int32, count=len(tokens))

    def to_bytes(self) -> bytes:
        """The canonical file content: ``"\\n".join(tokens) + "\\n"`` in UTF-8."""
        return ("\n".join(self.tokens) + "\n").encode("utf-8")

    @property
    def sha256(self) -> str:
        """Hex sha256 of the canonical file content (so CRLF/BOM variants of one vocabulary agree)."""
        if self._sha256 is None:
            self._sha256 = hashlib.sha256(self.to_bytes()).hexdigest()
        return self._sha256

    def save(self, path: str | Path) -> None:
        """Write the canonical file atomically."""
        atomic_write_bytes(path, self.to_bytes())


@dataclass
class VocabStats:
    """What `build_vocab` saw and kept. ``tokens`` are running tokens; ``types`` distinct ones."""

    output: Path
    lines: int = 0  # non-blank lines (sentences)
    blank_lines: int = 0
    tokens: int = 0
    types: int = 0
    vocab_size: int = 0  # lines of the vocabulary file, specials included
    kept_types: int = 0  # corpus types in the vocabulary
    covered_tokens: int = 0  # running tokens whose type is in the vocabulary
    truncated_tokens: int = 0  # running tokens longer than max_chars - 2 UTF-8 bytes
    truncated_types: int = 0
    projection_dim: int = 512
    counts_path: Path | None = None
    spm_model_path: Path | None = None
    files: list[str] = field(default_factory=list)

    @property
    def coverage(self) -> float:
        return self.covered_tokens / self.tokens if self.tokens else 0.0

    @property
    def oov_rate(self) -> float:
        return 1.0 - self.coverage if self.tokens else 0.0

    @property
    def softmax_bytes(self) -> int:
        """Softmax weights + bias in float32: ``V * (P + 1) * 4``."""
        return self.vocab_size * (self.projection_dim + 1) * 4

    @property
    def softmax_mb(self) -> float:
        return self.softmax_bytes / 1e6


def rank_counts(counts: dict[str, int]) -> list[tuple[str, int]]:
    """Descending count, ties by UTF-8 bytes ascending: ``{"b": 2, "a": 2, "c": 5} -> [c, a, b]``."""
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].encode("utf-8", "surrogatepass")))


def _sentences(paths, errors: str, stats: VocabStats) -> Iterator[str]:
    """Non-blank lines; counts lines and blank lines into ``stats``."""
    for _, _, line in read_lines(paths, errors):
        if line.split():
            stats.lines += 1
            yield line
        else:
            stats.blank_lines += 1


def _empty_error(files: list[str], stats: VocabStats) -> ElmoError:
    return ElmoError(f"{', '.join(files)}: corpus is empty ({stats.blank_lines} blank lines, no tokens)")


def build_vocab(
    corpus: list[str | Path] | str | Path,
    output: str | Path,
    *,
    min_count: int = 1,
    max_size: int | None = None,
    projection_dim: int = 512,
    max_chars: int = MAX_CHARS,
    errors: str = "strict",
    on_line: Callable[[int], None] | None = None,
) -> VocabStats:
    """Count whitespace tokens of a corpus and write the vocabulary + counts file.

    # Parameters
    corpus : files, globs, ``-``, ``.gz``; one sentence per line.
    output : the vocabulary path; the counts go to ``<output>.counts.tsv``.
    min_count : `int`, optional, (default = `1`) drop types seen fewer times.
    max_size : `int | None`, optional, (default = `None`) at most this many vocabulary lines, specials included.
    projection_dim : `int`, only for the softmax size in the stats.

    # Returns
    `VocabStats`. Memory grows with the number of distinct types only.
    """
    if min_count < 1:
        raise ElmoError(f"--min-count must be at least 1, got {min_count}")
    if max_size is not None and max_size < len(SPECIALS):
        raise ElmoError(f"--max-size must be at least {len(SPECIALS)} (the specials), got {max_size}")
    output = Path(output)
    from vocab.text import expand_paths

    files = expand_paths(corpus)
    stats = VocabStats(output=output, projection_dim=projection_dim, files=files)
    counts: Counter[str] = Counter()
    for n, line in enumerate(_sentences(files, errors, stats), 1):
        counts.update(line.split())
        if on_line is not None and n % 10000 == 0:
            on_line(n)
    if not counts:
        raise _empty_error(files, stats)
    output.parent.mkdir(parents=True, exist_ok=True)
    ranked = rank_counts(counts)
    kept = [(t, c) for t, c in ranked if c >= min_count and t not in SPECIALS]
    if max_size is not None:
        kept = kept[: max_size - len(SPECIALS)]
    vocab = Vocabulary(list(SPECIALS) + [t for t, _ in kept], source=str(output))
    _fill_stats(stats, counts, vocab, max_chars)
    stats.counts_path = _write_counts(output, vocab, ranked)
    vocab.save(output)
    return stats


def _fill_stats(stats: VocabStats, counts: Counter, vocab: Vocabulary, max_chars: int) -> None:
    stats.tokens = sum(counts.values())
    stats.types = len(counts)
    stats.vocab_size = len(vocab)
    stats.kept_types = sum(1 for t in counts if t in vocab)
    stats.covered_tokens = sum(c for t, c in counts.items() if t in vocab)
    limit = max_chars - 2
    long = [c for t, c in counts.items() if len(t) * 4 > limit and len(t.encode("utf-8", "ignore")) > limit]
    stats.truncated_types = len(long)
    stats.truncated_tokens = sum(long)


def _write_counts(output: Path, vocab: Vocabulary, ranked: list[tuple[str, int]]) -> Path:
    counts = dict(ranked)
    path = output.with_name(output.name + ".counts.tsv")
    buf = io.StringIO()
    for tok in vocab.tokens:
        buf.write(f"{tok}\t{counts.get(tok, 0)}\n")
    for tok, c in ranked:
        if tok not in vocab:
            buf.write(f"{tok}\t{c}\n")
    atomic_write_bytes(path, buf.getvalue().encode("utf-8"))
    return path


# SentencePiece's options that elmo-cli fixes: ids 0-2 are <S>, </S>, <UNK> as in every elmo-cli vocabulary, one
# thread and a shuffled sample so the model is the same on every run.
SPM_FIXED_OPTIONS = dict(shuffle_input_sentence=True, num_threads=1, max_sentence_length=1 << 16, bos_id=0, eos_id=1,
                         unk_id=2, pad_id=-1, bos_piece=BOS_TOKEN, eos_piece=EOS_TOKEN, unk_piece=UNK_TOKEN,
                         hard_vocab_limit=False, minloglevel=2)


def _spm_error(where: str | Path, msg: str, vocab_size: int, character_coverage: float) -> ElmoError:
    """SentencePiece's training error as one line that points at elmo-cli's options."""
    if "smaller than required_chars" in msg:  # point at our options, not SentencePiece's own flags
        need = msg.split(" vs ")[-1].split(".")[0] if " vs " in msg else "more"
        return ElmoError(f"{where}: --vocab-size {vocab_size} is smaller than the {need} distinct characters "
                         f"SentencePiece must keep; raise --vocab-size or lower --character-coverage "
                         f"(now {character_coverage})")
    return ElmoError(f"{where}: SentencePiece training failed: {msg}")


def train_sentencepiece(
    corpus: list[str | Path] | str | Path,
    output: str | Path,
    *,
    vocab_size: int,
    model_type: str = "unigram",
    character_coverage: float = 0.9995,
    input_sentence_size: int = 1_000_000,
    seed: int = 0,
    projection_dim: int = 512,
    max_chars: int = MAX_CHARS,
    errors: str = "strict",
) -> VocabStats:
    """Train SentencePiece on raw text; write ``<stem>.spm.model`` and the piece vocabulary at ``output``.

    Training reads the corpus through an iterator (memory bounded; at most ``input_sentence_size`` lines are
    sampled, with a fixed seed and one thread so the model is the same on every run). A second pass encodes the
    corpus with the new model for the statistics.
    """
    import sentencepiece as spm

    if model_type not in ("unigram", "bpe"):
        raise ElmoError(f"unknown --model-type {model_type!r}; expected unigram or bpe")
    if vocab_size <= len(SPECIALS):
        raise ElmoError(f"--vocab-size must be larger than {len(SPECIALS)}, got {vocab_size}")
    output = Path(output)
    from vocab.text import expand_paths

    files = expand_paths(corpus)
    if "-" in files:
        raise ElmoError("-: SentencePiece training reads the corpus twice; give a file instead of standard input")
    stats = VocabStats(output=output, projection_dim=projection_dim, files=files)
    first = next(_sentences(files, errors, VocabStats(output=output)), None)
    if first is None:
        list(_sentences(files, errors, stats))
        raise _empty_error(files, stats)

    model = io.BytesIO()
    spm.set_random_generator_seed(seed)
    options = dict(vocab_size=vocab_size, model_type=model_type, character_coverage=character_coverage,
                   input_sentence_size=input_sentence_size, **SPM_FIXED_OPTIONS)
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=_sentences(files, errors, VocabStats(output=output)),
                                       model_writer=model, **options)
    except RuntimeError as e:
        raise _spm_error(files[0], str(e).splitlines()[0], vocab_size, character_coverage) from None
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    vocab = Vocabulary([sp.id_to_piece(i) for i in range(sp.get_piece_size())], source=str(output))
    assert vocab.tokens[:3] == list(SPECIALS), vocab.tokens[:3]

    counts: Counter[str] = Counter()
    for line in _sentences(files, errors, stats):
        counts.update(sp.encode(line, out_type=str))
    _fill_stats(stats, counts, vocab, max_chars)
    output.parent.mkdir(parents=True, exist_ok=True)
    stats.spm_model_path = spm_path_for(output)
    atomic_write_bytes(stats.spm_model_path, model.getvalue())
    stats.counts_path = _write_counts(output, vocab, rank_counts(counts))
    vocab.save(output)
    return stats
