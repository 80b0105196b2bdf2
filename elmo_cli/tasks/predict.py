"""Running a task model on examples: predicted labels, and the metrics of `evaluate`.

Sentences longer than the model's ``max_length`` are cut into pieces (as in training), run as separate rows, and
put back together: a tagging sentence gets its pieces' labels in order, a classification text the label with the
highest mean log-probability over its pieces. Batches group sentences of similar length.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import torch

from elmo_cli.inputs import length_sorted_batches
from elmo_cli.tasks.formats import Example, piece_counts, split_long
from elmo_cli.tasks.kinds import TaskKind
from elmo_cli.tasks.model import TaskModel


def fill_cache(model: TaskModel, sentences: list[list[str]]) -> None:
    """Run the biLM once over every sentence not in the model's layer cache (if it has one)."""
    elmo = model.elmo_in or model.elmo_out
    if elmo is not None and elmo.cache is not None:
        elmo.cache.fill(sentences)


@torch.no_grad()
def piece_outputs(model: TaskModel, pieces: list[list[str]], batch_size: int = 64) -> list[torch.Tensor]:
    """Per piece, as `TaskKind.piece` cuts its row: tagging log-probabilities `(n, C)` (with a CRF: the Viterbi
    path's label ids `(n,)`), classification `(C,)`; the model is put in eval mode."""
    model.eval()
    fill_cache(model, pieces)
    out: list[torch.Tensor | None] = [None] * len(pieces)
    for batch in length_sorted_batches([len(p) for p in pieces], batch_size):
        logits, mask = model([pieces[k] for k in batch])  # (B, T, C) or (B, C)
        if model.crf is not None:
            for k, path in zip(batch, model.crf.decode(logits.float(), mask)):
                out[k] = torch.tensor(path, dtype=torch.long)
            continue
        logp = torch.log_softmax(logits.float(), dim=-1).cpu()
        for b, k in enumerate(batch):
            out[k] = model.kind.piece(logp[b], len(pieces[k]))  # (n, C) per token, or (C,)
    return out  # type: ignore[return-value]


def predict_examples(model: TaskModel, examples: list[Example], batch_size: int = 64) -> list:
    """Predicted labels: a list of labels per sentence (tagging) or one label per text (classification)."""
    pieces, _ = split_long(examples, model.config.max_length)
    outputs = piece_outputs(model, [p.tokens for p in pieces], batch_size)
    return join_pieces(model.kind, model.config.labels, model.config.max_length, examples, outputs)


def join_pieces(kind: TaskKind, labels: tuple[str, ...] | list[str], max_length: int, examples: list[Example],
                outputs: list) -> list:
    """Labels per example from its pieces' outputs (torch or numpy, as `piece_outputs` gives them), joined by
    `TaskKind.join`: a tagging sentence its pieces' labels in order, a text the label of the highest mean over its
    pieces."""
    result, k = [], 0
    for n in piece_counts(examples, max_length):
        result.append(kind.join(labels, [np.asarray(p) for p in outputs[k : k + n]]))
        k += n
    return result


def evaluate_examples(model: TaskModel, examples: list[Example], batch_size: int = 64) -> dict:
    """The kind's metrics (`TaskKind.metrics`: `tagging_metrics`, `classification_metrics`) of the model on labelled
    examples, plus
    ``unknown_labels``: the gold labels the model never saw in training and how often they occur (always
    counted wrong)."""
    guess = predict_examples(model, examples, batch_size)
    gold = [ex.labels for ex in examples]
    known = set(model.config.labels)
    metrics = model.kind.metrics(gold, guess)
    unknown = Counter(lab for g in gold for lab in model.kind.labels_of(g) if lab not in known)
    metrics["unknown_labels"] = dict(sorted(unknown.items()))
    return metrics
