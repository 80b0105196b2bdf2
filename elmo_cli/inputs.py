"""Inference inputs: text files and shard directories read with their sources, and batching for prediction.

What lives here, written once for `evaluate`, `dump-embeddings`, `Embedder` and the task models:
- `count_lines`: the progress total of a file.
- `Line` / `read_inputs`: every input line (text, tokenized with the model's tokenizer, or a stored shard
  sentence) with its 0-based index and its source ``file:line``.
- `length_sorted_batches` (stateless: rows of similar length together) and `input_order_batches` (stateful:
  row b continues row b of the previous batch).
- `char_ids_batch`: token lists (or raw character ids) into one padded prediction-form batch, boundaries added:
  the one home of character-id batches (the one function here that needs torch, imported inside it, so the
  torch-free baselines can read inputs).
"""
from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from vocab.errors import ElmoError
from vocab.text import STDIN, expand_paths, read_lines
from vocab.tokenize import TextEncoder

if TYPE_CHECKING:
    import torch


def count_lines(path: str | Path) -> int | None:
    """Lines in a plain or .gz file, a last line without a newline included; None for standard input."""
    path = str(path)
    if path == STDIN:
        return None
    n, last = 0, b"\n"
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                n += block.count(b"\n")
                last = block[-1:]
    except OSError:
        return None
    return n + (last != b"\n")


@dataclass
class Line:
    """One input line (or stored shard sentence); ``tokens``/``ids``/``chars`` are None for a blank line."""

    index: int  # 0-based over all inputs
    source: str  # "file:lineno" or "shard_dir#k"
    text: str | None  # the raw line (None for a shard sentence)
    tokens: list[str] | None
    ids: np.ndarray | None  # int32 (n,) vocabulary ids, when the model has a vocabulary
    chars: np.ndarray | None  # raw char ids (n, W)

    @property
    def blank(self) -> bool:
        return self.chars is None


def _groups(inputs: Sequence[str | Path]) -> list[tuple[str, list[str]]]:
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


def _open_shards(directory: Path, text: TextEncoder):
    from vocab.shards import ShardDataset

    data = ShardDataset(directory)
    data.check_vocab(text.vocab)
    if data.chars.to_json() != text.chars.to_json():
        raise ElmoError(f"{directory}: shards use character settings {data.chars.to_json()} but the model uses "
                        f"{text.chars.to_json()}; re-shard with the model's vocabulary directory")
    return data


class Inputs:
    """Text files and shard directories as one sequence of `Line`s, with the total line count when known.

    ``Inputs(["test.txt", "heldout/"], text).lines()`` yields every line of test.txt, then every stored sentence.
    Shard directories must be encoded with ``text``'s vocabulary and characters (checked when opened).
    """

    def __init__(self, inputs: Sequence[str | Path], text: TextEncoder, errors: str = "strict"):
        self.inputs = [str(p) for p in inputs]
        self.text, self.errors = text, errors
        self.groups = _groups(inputs)
        self.shards: dict = {}
        total: int | None = 0
        for kind, paths in self.groups:
            if kind == "shards":
                if text.vocab is None:
                    raise ElmoError(f"{paths[0]}: shard directories need a model with a vocab.txt")
                self.shards[paths[0]] = _open_shards(Path(paths[0]), text)
                total = None if total is None else total + self.shards[paths[0]].num_sentences
            else:
                for p in expand_paths(paths):
                    n = count_lines(p)
                    total = None if total is None or n is None else total + n
        self.total = total

    def lines(self) -> Iterator[Line]:
        """Every input line as a `Line`, indexed from 0 across all inputs."""
        index = 0
        text, vocab = self.text, self.text.vocab
        for kind, paths in self.groups:
            if kind == "shards":
                for i, (ids, chars) in enumerate(self.shards[paths[0]].iter_sentences()):
                    src = f"{paths[0]}#{i}"
                    yield Line(index, src, None, None, ids, chars) if len(ids) else \
                        Line(index, src, None, None, None, None)
                    index += 1
                continue
            for path, lineno, line in read_lines(paths, self.errors):
                tokens = text.tokenize(line) if line and not line.isspace() else []
                src = f"{path}:{lineno}"
                if tokens:
                    ids = vocab.encode(tokens) if vocab is not None else None
                    yield Line(index, src, line, tokens, ids, text.chars.encode_tokens(tokens))
                else:
                    yield Line(index, src, line, [], None, None)
                index += 1


TOKENS_PER_ROW = 64  # a batch holds at most batch_size * 64 padded tokens: long sentences come fewer per batch


def length_sorted_batches(lengths: list[int], batch_size: int, max_tokens: int | None = None) -> list[list[int]]:
    """Positions grouped into batches of similar length, longest first: at most `batch_size` rows, and at most
    `max_tokens` padded tokens (rows x (longest + 2), at least one row; default ``batch_size * TOKENS_PER_ROW``), so
    a batch of very long sentences costs no more memory than a full batch of ordinary ones.

    ``length_sorted_batches([3, 9, 1, 8], 2) -> [[1, 3], [0, 2]]``
    """
    max_tokens = batch_size * TOKENS_PER_ROW if max_tokens is None else max_tokens
    order = sorted(range(len(lengths)), key=lambda k: -lengths[k])
    batches: list[list[int]] = []
    s = 0
    while s < len(order):
        rows = max(1, min(batch_size, max_tokens // (lengths[order[s]] + 2)))  # the first row is the longest
        batches.append(order[s : s + rows])
        s += rows
    return batches


def input_order_batches(n: int, batch_size: int) -> list[list[int]]:
    """Positions in input order, ``batch_size`` at a time (the carried-state modes).

    ``input_order_batches(5, 2) -> [[0, 1], [2, 3], [4]]``
    """
    return [list(range(s, min(s + batch_size, n))) for s in range(0, n, batch_size)]


def char_ids_batch(chars, sentences: Sequence[Sequence[str] | np.ndarray], boundaries: bool = True,
                   device="cpu") -> tuple["torch.Tensor", "torch.Tensor"]:
    """The one home of character-id batches: token lists into the padded prediction-form batch the model reads.

    # Parameters
    chars : the model's character encoder (`vocab.chars`).
    sentences : B token lists, or raw character-id arrays `(n_b, W)` (a stored shard sentence's), without
        ``<S>``/``</S>``.
    boundaries : add ``<S>`` and ``</S>`` around every row (`elmo_cli.model.bilm.add_boundaries`); False gives
        allennlp's ``batch_to_ids`` form, the input of the exported graph.

    # Returns
    ids `(B, T, W)` int64, raw + 1 (`to_model_chars`) with all-zero rows as padding, ``T = max n_b + 2`` (at least
    1 without boundaries), and lengths `(B,)` (n_b + 2 with boundaries).

    ``char_ids_batch(ByteChars(), [["a"]], boundaries=False)[0][0, 0, :4] -> [259, 98, 260, 261]``
    """
    import torch  # torch only inside: the baselines read inputs without it

    from elmo_cli.model.bilm import add_boundaries, to_model_chars

    rows = [s if isinstance(s, np.ndarray) else chars.encode_tokens(list(s)) for s in sentences]
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    T = max([len(r) for r in rows] + [0 if boundaries else 1])
    ids = torch.zeros(len(rows), T, chars.row_width, dtype=torch.long)
    if int(lengths.sum()):
        ids[torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)] = to_model_chars(np.concatenate(rows))
    if boundaries:
        bos, eos = to_model_chars(chars.encode_tokens([chars.bos_token, chars.eos_token]))  # (W,) each
        ids, lengths = add_boundaries(ids, lengths, bos, eos)
    return ids.to(device), lengths.to(device)
