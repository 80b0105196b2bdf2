"""Task metrics (torch-free): accuracy, macro-F1, and conlleval's chunk (span) F1.

Span F1 follows conlleval.pl (CoNLL-2000 shared task script, 2004 version: a label ``B-ORG-X`` has tag ``B`` and
type ``ORG-X``) with the BIOES rules of its common extension: a chunk starts and ends where conlleval's
``startOfChunk`` / ``endOfChunk`` say, a sentence end closes any open chunk, and a chunk is correct when gold and
guess start at the same token, end at the same token and have the same type. The same rules read BIO (IOB2),
IOB1 (``I-X`` after ``O`` or another type opens a chunk) and BIOES, so the scheme is only detected to decide
whether labels are chunk labels at all:

    chunks(["B-PER", "I-PER", "O", "I-LOC"]) -> [(0, 2, "PER"), (3, 4, "LOC")]   # (start, end exclusive, type)
"""
from __future__ import annotations

import re
from collections import Counter

_CHUNK_LABEL = re.compile(r"^[BIES]-.+$")


def split_label(label: str) -> tuple[str, str]:
    """``"B-ORG" -> ("B", "ORG")``, ``"O" -> ("O", "")``, ``"NOUN" -> ("NOUN", "")`` (conlleval's split)."""
    tag, dash, kind = label.partition("-")
    return (tag, kind) if dash else (label, "")


def _end_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    if prev_tag in ("E", "S"):
        return True
    if prev_tag in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev_tag not in ("O", ".") and prev_type != type_


def _start_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    if tag in ("B", "S"):
        return True
    if prev_tag in ("E", "S", "O") and tag in ("E", "I"):
        return True
    return tag not in ("O", ".") and prev_type != type_


def chunks(labels: list[str]) -> list[tuple[int, int, str]]:
    """The chunks of one sentence as ``(start, end exclusive, type)``; the sentence end closes an open chunk.

    ``chunks(["O", "I-X", "I-X", "B-X"]) -> [(1, 3, "X"), (3, 4, "X")]`` (IOB1)
    ``chunks(["S-X", "B-Y", "E-Y"]) -> [(0, 1, "X"), (1, 3, "Y")]`` (BIOES)
    """
    out = []
    start, prev_tag, prev_type = None, "O", ""
    for i, label in enumerate(list(labels) + ["O"]):
        tag, type_ = split_label(label)
        if start is not None and _end_of_chunk(prev_tag, tag, prev_type, type_):
            out.append((start, i, prev_type))
            start = None
        if i < len(labels) and _start_of_chunk(prev_tag, tag, prev_type, type_):
            start = i
        prev_tag, prev_type = tag, type_
    return out


def detect_scheme(labels: set[str] | list[str]) -> str | None:
    """``"BIOES"`` when E-/S- labels occur, ``"BIO"`` for B-/I- labels, None when any label is not ``O`` or
    ``[BIES]-TYPE`` (or all are ``O``): then span F1 is not computed."""
    labels = set(labels)
    if not labels or not all(lab == "O" or _CHUNK_LABEL.match(lab) for lab in labels) or labels == {"O"}:
        return None
    return "BIOES" if any(lab[0] in "ES" for lab in labels if lab != "O") else "BIO"


def detect_span_scheme(sequences: list[list[str]]) -> str | None:
    """The span scheme of gold label sequences, for the CRF's allowed moves: `detect_scheme`'s answer, with BIO
    split into IOB1 (an ``I-X`` opens a chunk somewhere: after ``O``, a sentence start or another type) and BIO
    (IOB2)."""
    scheme = detect_scheme({lab for seq in sequences for lab in seq})
    if scheme != "BIO":
        return scheme
    for seq in sequences:
        prev = "O"
        for lab in seq:
            tag, kind = split_label(lab)
            if tag == "I" and (prev == "O" or split_label(prev)[1] != kind):
                return "IOB1"
            prev = lab
    return "BIO"


def span_f1(gold: list[list[str]], guess: list[list[str]]) -> dict[str, float]:
    """conlleval's overall precision, recall and F1 (in [0, 1]) over sentences, plus the chunk counts.

    ``span_f1([["B-X", "I-X"]], [["B-X", "O"]]) -> precision 0, recall 0, f1 0, 1 gold, 1 found, 0 correct``
    """
    n_gold = n_guess = n_correct = 0
    for g, p in zip(gold, guess, strict=True):
        gc, pc = set(chunks(g)), set(chunks(p))
        n_gold, n_guess, n_correct = n_gold + len(gc), n_guess + len(pc), n_correct + len(gc & pc)
    precision = n_correct / n_guess if n_guess else 0.0
    recall = n_correct / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "gold_chunks": n_gold, "found_chunks": n_guess,
            "correct_chunks": n_correct}


def per_label_f1(gold: list[str], guess: list[str]) -> dict[str, float]:
    """F1 of each label that occurs in gold or guess (token- or sentence-level, flat lists).

    ``per_label_f1(["a", "a", "b"], ["a", "b", "b"]) -> {"a": 0.667, "b": 0.667}`` (rounded here)
    """
    tp, n_gold, n_guess = Counter(), Counter(gold), Counter(guess)
    for g, p in zip(gold, guess, strict=True):
        if g == p:
            tp[g] += 1
    out = {}
    for label in sorted(set(n_gold) | set(n_guess)):
        denom = n_gold[label] + n_guess[label]
        out[label] = 2 * tp[label] / denom if denom else 0.0
    return out


def classification_metrics(gold: list[str], guess: list[str]) -> dict[str, float]:
    """Accuracy and macro-F1 (the mean of `per_label_f1` over the labels of gold and guess)."""
    f1 = per_label_f1(gold, guess)
    correct = sum(g == p for g, p in zip(gold, guess))
    return {"accuracy": correct / len(gold) if gold else 0.0,
            "macro_f1": sum(f1.values()) / len(f1) if f1 else 0.0, "n": len(gold)}


def tagging_metrics(gold: list[list[str]], guess: list[list[str]]) -> dict:
    """Token accuracy, macro-F1 over labels, and span F1 when the gold labels are a chunk scheme."""
    flat_g = [lab for s in gold for lab in s]
    flat_p = [lab for s in guess for lab in s]
    out: dict = classification_metrics(flat_g, flat_p)
    scheme = detect_scheme(set(flat_g))
    out["scheme"] = scheme
    if scheme is not None:
        out["span"] = span_f1(gold, guess)
    return out


def primary(metrics: dict) -> float:
    """The number a task is selected and compared on: span F1 for chunk labels, else accuracy."""
    return metrics["span"]["f1"] if metrics.get("span") else metrics["accuracy"]


def primary_name(metrics: dict) -> str:
    return "span F1" if metrics.get("span") else "accuracy"
