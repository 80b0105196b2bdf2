"""Task kinds as objects: what a task reads, predicts, is trained on, writes and is scored by.

A kind is one class; the registry maps its name (``kind`` in a task's config.json and task.json) to it, and the
rest of elmo_cli.tasks asks the kind instead of branching on the name:

    formats            the labelled formats it reads (``--format``), e.g. ``("conll", "conllu")``
    per_token          True: scores per token `(B, T, C)`; False: one pooled score row per sentence `(B, C)`
    accuracy_name      how the metrics table names ``accuracy`` ("token accuracy", "accuracy")
    detect_format(path, errors) -> str                   the format of a labelled file (one of ``formats``)
    detect_predict_format(path, errors) -> str           the format of prediction input (a default is given)
    read(path, fmt, label_column, tokenize, errors, unlabelled) -> list[Example]   (a default reads the standard
                                                         formats: conll, conllu, tsv, text)
    labels_of(labels) -> list[str]                       an example's labels as a flat list (the label set)
    targets(batch, label_index, T) -> int64 `(B, T)` (-100 at padding) or `(B,)`
    pool(h, mask) -> `(B, T, D)` or `(B, D)`             the BiLSTM's outputs to what the linear head scores
    loss(logits, targets, mask, crf) -> scalar           the training loss (crf: the CRF head or None)
    piece(row, n) -> one piece's output of its batch row (a row of `(B, T, ...)` cut to its n tokens, or `(C,)`)
    join(labels, parts) -> an example's prediction from its pieces' outputs (label ids or log-probabilities)
    write(examples, guess) -> str                        the prediction file's text
    metrics(gold, guess) -> dict                         at least ``accuracy``, ``macro_f1`` and ``n``

A new kind subclasses `TaskKind` (or a built-in kind) and is registered with `register_kind` (also a decorator);
a class that lacks a required method is refused there with one line naming what is missing. Torch is imported
only inside the methods that need it, so ``formats`` stays torch-free.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from elmo_cli.tasks import formats
from elmo_cli.tasks.formats import Example, Tokenize
from elmo_cli.tasks.metrics import classification_metrics, tagging_metrics
from vocab.errors import ElmoError

if TYPE_CHECKING:
    import torch

REQUIRED = ("detect_format", "read", "labels_of", "targets", "pool", "loss", "piece", "join", "write", "metrics")
ATTRIBUTES = ("name", "formats", "per_token")


class TaskKind(ABC):
    """The interface of a task kind (see the module docstring); `read` and `detect_predict_format` have defaults."""

    name: str
    formats: tuple[str, ...]
    per_token: bool
    accuracy_name: str = "accuracy"

    def detect_predict_format(self, path: str | Path, errors: str = "strict") -> str:
        """``conllu`` for a CoNLL-U looking file, else ``tsv`` when every line has one tab and the kind reads tsv,
        else ``text``."""
        lines = formats._first_lines(path, errors=errors)
        if not lines:
            return "text"
        if formats.detect_tagging_format(path, errors) == "conllu":
            return "conllu"
        return "tsv" if "tsv" in self.formats and all(line.count("\t") == 1 for line in lines) else "text"

    def read(self, path: str | Path, fmt: str, label_column: str = "upos", tokenize: Tokenize = formats.whitespace,
             errors: str = "strict", unlabelled: bool = False) -> list[Example]:
        """The examples of a file in one of the standard formats (conll, conllu, tsv; text when `unlabelled`)."""
        return formats.read_format(path, fmt, label_column, tokenize, unlabelled, errors)

    @abstractmethod
    def detect_format(self, path: str | Path, errors: str = "strict") -> str: ...

    @abstractmethod
    def labels_of(self, labels) -> list[str]: ...

    @abstractmethod
    def targets(self, batch: list[Example], label_index: dict[str, int], T: int) -> "torch.Tensor": ...

    @abstractmethod
    def pool(self, h: "torch.Tensor", mask: "torch.Tensor") -> "torch.Tensor": ...

    @abstractmethod
    def loss(self, logits: "torch.Tensor", targets: "torch.Tensor", mask: "torch.Tensor",
             crf=None) -> "torch.Tensor": ...

    @abstractmethod
    def piece(self, row, n: int): ...

    @abstractmethod
    def join(self, labels, parts: list[np.ndarray]): ...

    @abstractmethod
    def write(self, examples: list[Example], guess: list) -> str: ...

    @abstractmethod
    def metrics(self, gold: list, guess: list) -> dict: ...


class TaggingKind(TaskKind):
    """One label per token: CoNLL or CoNLL-U in, token TAB label out, token accuracy and conlleval span F1."""

    name, formats, per_token, accuracy_name = "tagging", ("conll", "conllu"), True, "token accuracy"

    def detect_format(self, path: str | Path, errors: str = "strict") -> str:
        return formats.detect_tagging_format(path, errors)

    def detect_predict_format(self, path: str | Path, errors: str = "strict") -> str:
        return formats.detect_tagged_predict_format(path, errors)

    def labels_of(self, labels: list[str]) -> list[str]:
        return list(labels)

    def targets(self, batch: list[Example], label_index: dict[str, int], T: int) -> "torch.Tensor":
        """int64 `(B, T)`: label ids, -100 at padding (ignored by the loss)."""
        import torch

        target = torch.full((len(batch), T), -100, dtype=torch.long)
        for b, ex in enumerate(batch):
            target[b, : len(ex.labels)] = torch.tensor([label_index[lab] for lab in ex.labels])
        return target

    def pool(self, h: "torch.Tensor", mask: "torch.Tensor") -> "torch.Tensor":
        """Per-token scores: `(B, T, D)` unchanged."""
        return h

    def loss(self, logits: "torch.Tensor", targets: "torch.Tensor", mask: "torch.Tensor", crf=None) -> "torch.Tensor":
        """Cross-entropy over real tokens; with a CRF the sentences' negative log-likelihood per token.

        # Parameters
        logits : `(B, T, C)`; targets : int64 `(B, T)`, -100 at padding; mask : bool `(B, T)`.
        """
        import torch

        if crf is not None:
            return crf.neg_log_likelihood(logits, targets.clamp(min=0), mask).sum() / mask.sum()
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def piece(self, row, n: int):
        """`(T, C)` log-probabilities or `(T,)` label ids of one row, cut to the piece's `n` tokens."""
        return row[:n]

    def join(self, labels, parts: list[np.ndarray]) -> list[str]:
        """The pieces' labels in order (label ids as they are, log-probabilities by argmax)."""
        return [labels[i] for part in parts for i in (part if part.ndim == 1 else part.argmax(-1)).tolist()]

    def write(self, examples: list[Example], guess: list) -> str:
        return formats.format_tagged([(ex.tokens, labels) for ex, labels in zip(examples, guess)])

    def metrics(self, gold: list, guess: list) -> dict:
        return tagging_metrics(gold, guess)


class ClassificationKind(TaskKind):
    """One label per sentence: TSV label TAB text in and out, max-pooled scores, accuracy and macro-F1."""

    name, formats, per_token = "classification", ("tsv",), False

    def detect_format(self, path: str | Path, errors: str = "strict") -> str:
        return "tsv"

    def labels_of(self, labels: str) -> list[str]:
        return [labels]

    def targets(self, batch: list[Example], label_index: dict[str, int], T: int) -> "torch.Tensor":
        """int64 `(B,)`: each text's label id."""
        import torch

        return torch.tensor([label_index[ex.labels] for ex in batch])

    def pool(self, h: "torch.Tensor", mask: "torch.Tensor") -> "torch.Tensor":
        """Max over the real tokens: `(B, T, D)` -> `(B, D)`."""
        return h.masked_fill(~mask.unsqueeze(-1), float("-inf")).max(dim=1).values

    def loss(self, logits: "torch.Tensor", targets: "torch.Tensor", mask: "torch.Tensor", crf=None) -> "torch.Tensor":
        """Cross-entropy of logits `(B, C)` against targets `(B,)`."""
        import torch

        return torch.nn.functional.cross_entropy(logits, targets)

    def piece(self, row, n: int):
        """The row's `(C,)` log-probabilities."""
        return row

    def join(self, labels, parts: list[np.ndarray]) -> str:
        """The label of the highest mean log-probability over the pieces."""
        return labels[int(np.stack(parts).mean(0).argmax())]

    def write(self, examples: list[Example], guess: list) -> str:
        return formats.format_classified([(label, ex.tokens) for ex, label in zip(examples, guess)])

    def metrics(self, gold: list, guess: list) -> dict:
        return classification_metrics(gold, guess)


_KINDS: dict[str, TaskKind] = {}


def register_kind(cls: type) -> type:
    """Register a kind class under its ``name`` (a later one of the same name replaces it); returns the class, so
    it works as a decorator. ElmoError, one line, naming the required methods or attributes it lacks."""
    missing = [m for m in REQUIRED
               if not callable(getattr(cls, m, None)) or getattr(getattr(cls, m), "__isabstractmethod__", False)]
    missing_attrs = [a for a in ATTRIBUTES if not hasattr(cls, a)]
    if missing or missing_attrs:
        what = (["method(s) " + ", ".join(missing)] if missing else []) + (
            ["attribute(s) " + ", ".join(missing_attrs)] if missing_attrs else [])
        raise ElmoError(f"task kind {getattr(cls, '__name__', cls)!r} cannot be registered: it lacks "
                        f"{' and '.join(what)}")
    _KINDS[cls.name] = cls()
    return cls


def get_kind(name: str) -> TaskKind:
    """The registered kind named `name`; ElmoError naming the registered ones otherwise."""
    kind = _KINDS.get(name)
    if kind is None:
        raise ElmoError(f"--kind {name!r}: use one of {', '.join(_KINDS)}")
    return kind


def kind_names() -> tuple[str, ...]:
    return tuple(_KINDS)


def all_formats() -> tuple[str, ...]:
    """Every labelled format some registered kind reads, in registration order."""
    return tuple(dict.fromkeys(f for kind in _KINDS.values() for f in kind.formats))


def formats_read() -> str:
    """``"tagging reads conll or conllu, classification reads tsv"`` (for error messages)."""
    return ", ".join(f"{k.name} reads {' or '.join(k.formats)}" for k in _KINDS.values())


register_kind(TaggingKind)
register_kind(ClassificationKind)
