"""Reading and writing the labelled files of a task model (torch-free).

Tagging, one token per line, a blank line between sentences:

    CoNLL      token first, label last, whitespace or tab columns; ``-DOCSTART-`` lines are skipped
               ``EU B-ORG`` / ``rejects  VBZ  B-VP  O``
    CoNLL-U    10 tab columns, ``#`` comments; multiword ranges (``1-2``) and empty nodes (``1.1``) are skipped;
               the label is the column named by ``label_column`` (upos, xpos, deprel, ...; default upos)

Classification, one text per line:

    TSV        ``label<TAB>text``, the text tokenized by the task's tokenizer (whitespace or the biLM's)

Which kind reads which format, and how, is the kind's (`kinds.TaskKind.read`, ``formats``); `read_examples` and
`read_unlabelled` ask the kind named by ``--kind``. Prediction input is also plain text, one sentence per line.
Every reader returns `Example`s whose ``where`` is ``file:line`` of the sentence's first line, so a later error can
name it; bad input raises `ElmoError` naming the file and line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from vocab.errors import ElmoError
from vocab.text import read_lines

CONLLU_COLUMNS = ("id", "form", "lemma", "upos", "xpos", "feats", "head", "deprel", "deps", "misc")
DOCSTART = "-DOCSTART-"
_CONLLU_ID = re.compile(r"^\d+(-\d+|\.\d+)?$")

Tokenize = Callable[[str], list[str]]


@dataclass
class Example:
    """One sentence: its tokens and, for tagging, one label per token; for classification, one label.

    ``labels`` is None for unlabelled input (prediction). ``where`` is ``file:line`` of its first line.
    """

    tokens: list[str]
    labels: list[str] | str | None
    where: str = ""
    pieces: list[int] = field(default_factory=list)  # set by `split_long`: lengths of the pieces, else empty


def whitespace(line: str) -> list[str]:
    """``whitespace(" a  b ") -> ["a", "b"]``"""
    return line.split()


# ---- format detection -----------------------------------------------------------------------------------------------
def _first_lines(path: str | Path, n: int = 50, errors: str = "strict") -> list[str]:
    out = []
    for _, _, text in read_lines([path], errors):
        if text.strip():
            out.append(text)
            if len(out) >= n:
                break
    return out


def detect_format(path: str | Path, kind: str, errors: str = "strict") -> str:
    """The format of a labelled file, as the kind named `kind` detects it (`kinds.TaskKind.detect_format`)."""
    from elmo_cli.tasks.kinds import get_kind

    return get_kind(kind).detect_format(path, errors)


def detect_tagging_format(path: str | Path, errors: str = "strict") -> str:
    """``conllu`` when a file's first lines are ``#`` comments or 10 tab columns with a numeric ID, else ``conll``."""
    for line in _first_lines(path, errors=errors):
        if line.startswith("#"):
            return "conllu"
        cols = line.split("\t")
        return "conllu" if len(cols) == 10 and _CONLLU_ID.match(cols[0]) else "conll"
    return "conll"


def detect_predict_format(path: str | Path, kind: str, errors: str = "strict") -> str:
    """Prediction input, as the kind named `kind` detects it (`kinds.TaskKind.detect_predict_format`): ``conllu``
    as above; ``tsv`` for classification lines with one tab; tagging's as `detect_tagged_predict_format`; else
    ``text`` (one sentence per line)."""
    from elmo_cli.tasks.kinds import get_kind

    return get_kind(kind).detect_predict_format(path, errors)


def detect_tagged_predict_format(path: str | Path, errors: str = "strict") -> str:
    """Tagging's prediction input: ``conllu`` as above; ``conll`` when every non-blank line has a tab (token TAB
    label) or the file has blank lines between blocks of several lines, all of the same 2-10 columns; else
    ``text``."""
    lines = _first_lines(path, errors=errors)
    if not lines:
        return "text"
    if detect_tagging_format(path, errors) == "conllu":
        return "conllu"
    if all(line.count("\t") >= 1 for line in lines):
        return "conll"
    blocks = [b for _, b in zip(range(20), _blocks(path, comments=False, errors=errors))]
    widths = {len(line.split()) for line in lines}
    multi_line = len(blocks) > 1 and any(len(b) > 1 for b in blocks)
    return "conll" if multi_line and len(widths) == 1 and 2 <= min(widths) <= 10 else "text"


# ---- readers --------------------------------------------------------------------------------------------------------
def _blocks(path: str | Path, comments: bool, errors: str = "strict") -> Iterator[list[tuple[int, str]]]:
    """Blocks of non-blank ``(line_number, text)`` separated by blank lines; ``#`` lines dropped if `comments`."""
    block: list[tuple[int, str]] = []
    for _, lineno, text in read_lines([path], errors):
        if not text.strip():
            if block:
                yield block
            block = []
        elif not (comments and text.startswith("#")):  # a CoNLL-U token line starts with its ID, never '#'
            block.append((lineno, text))
    if block:
        yield block


def read_conll(path: str | Path, unlabelled: bool = False, errors: str = "strict") -> list[Example]:
    """CoNLL: ``token ... label`` per line (``token`` alone when ``unlabelled``); ``-DOCSTART-`` skipped."""
    out = []
    for block in _blocks(path, comments=False, errors=errors):
        tokens, labels = [], []
        for lineno, text in block:
            cols = text.split()
            if cols[0] == DOCSTART:
                continue
            if len(cols) < 2 and not unlabelled:
                raise ElmoError(f"{path}:{lineno}: expected at least 2 columns (token ... label), got 1: {text!r}")
            tokens.append(cols[0])
            labels.append(cols[-1])
        if tokens:
            out.append(Example(tokens, None if unlabelled else labels, f"{path}:{block[0][0]}"))
    return out


def read_conllu(path: str | Path, label_column: str = "upos", unlabelled: bool = False,
                errors: str = "strict") -> list[Example]:
    """CoNLL-U: the FORM column and the ``label_column`` (a column name: upos, xpos, deprel, ...)."""
    column = label_column.lower()
    if column not in CONLLU_COLUMNS:
        raise ElmoError(f"--label-column {label_column!r}: not a CoNLL-U column; use one of "
                        f"{', '.join(CONLLU_COLUMNS)}")
    k = CONLLU_COLUMNS.index(column)
    out = []
    for block in _blocks(path, comments=True, errors=errors):
        tokens, labels = [], []
        for lineno, text in block:
            cols = text.split("\t")
            if len(cols) != 10:
                raise ElmoError(f"{path}:{lineno}: a CoNLL-U line has 10 tab-separated columns, got {len(cols)}; "
                                f"use --format conll for whitespace columns")
            if not _CONLLU_ID.match(cols[0]):
                raise ElmoError(f"{path}:{lineno}: bad CoNLL-U ID {cols[0]!r} (expected 1, 2, ... or 1-2 or 1.1)")
            if "-" in cols[0] or "." in cols[0]:
                continue  # multiword range or empty node: not a syntactic word
            tokens.append(cols[1])
            labels.append(cols[k])
        if tokens:
            out.append(Example(tokens, None if unlabelled else labels, f"{path}:{block[0][0]}"))
    return out


def read_tsv(path: str | Path, tokenize: Tokenize = whitespace, unlabelled: bool = False,
             errors: str = "strict") -> list[Example]:
    """``label<TAB>text`` per line (blank lines skipped); the text is tokenized with `tokenize`."""
    out = []
    for _, lineno, text in read_lines([path], errors):
        if not text.strip():
            continue
        label, tab, rest = text.partition("\t")
        if not tab or not label.strip():
            raise ElmoError(f"{path}:{lineno}: expected label<TAB>text, got one column: {text[:60]!r}")
        tokens = tokenize(rest)
        if not tokens:
            raise ElmoError(f"{path}:{lineno}: empty text after the label {label!r}")
        out.append(Example(tokens, None if unlabelled else label.strip(), f"{path}:{lineno}"))
    return out


def read_text(path: str | Path, tokenize: Tokenize = whitespace, errors: str = "strict") -> list[Example]:
    """One sentence per line, blank lines skipped; unlabelled."""
    return [Example(tokenize(text), None, f"{path}:{lineno}")
            for _, lineno, text in read_lines([path], errors) if text.strip()]


def read_format(path: str | Path, fmt: str, label_column: str = "upos", tokenize: Tokenize = whitespace,
                unlabelled: bool = False, errors: str = "strict") -> list[Example]:
    """The examples of a file in a standard format: conll, conllu, tsv, or (unlabelled) text."""
    if fmt == "tsv":
        return read_tsv(path, tokenize, unlabelled=unlabelled, errors=errors)
    if fmt == "conllu":
        return read_conllu(path, label_column, unlabelled=unlabelled, errors=errors)
    if fmt == "conll":
        return read_conll(path, unlabelled=unlabelled, errors=errors)
    if fmt == "text" and unlabelled:
        return read_text(path, tokenize, errors)
    raise ElmoError(f"{path}: no reader for --format {fmt}")


def read_examples(path: str | Path, kind: str, fmt: str = "auto", label_column: str = "upos",
                  tokenize: Tokenize = whitespace, errors: str = "strict") -> list[Example]:
    """The labelled examples of a training, dev or test file, read by the kind named `kind` in one of the formats
    it reads; an empty file is an ElmoError."""
    from elmo_cli.tasks.kinds import all_formats, formats_read, get_kind

    task_kind = get_kind(kind)
    if fmt != "auto" and fmt not in all_formats():
        raise ElmoError(f"--format {fmt!r}: use one of {', '.join(('auto', *all_formats()))}")
    if not Path(path).is_file():
        raise ElmoError(f"{path}: no such file")
    fmt = task_kind.detect_format(path, errors) if fmt == "auto" else fmt
    if fmt not in task_kind.formats:
        raise ElmoError(f"{path}: --format {fmt} does not fit --kind {kind} ({formats_read()})")
    examples = task_kind.read(path, fmt, label_column, tokenize, errors)
    if not examples:
        raise ElmoError(f"{path}: no sentences in this file (empty, or only comments and blank lines)")
    return examples


def read_unlabelled(path: str | Path, kind: str, fmt: str = "auto", label_column: str = "upos",
                    tokenize: Tokenize = whitespace, errors: str = "strict") -> list[Example]:
    """Prediction input: text lines, or a file in a format some kind reads, its labels ignored."""
    from elmo_cli.tasks.kinds import all_formats, get_kind

    task_kind = get_kind(kind)
    allowed = ("auto", "text", *all_formats())
    if fmt not in allowed:
        raise ElmoError(f"--format {fmt!r}: use one of {', '.join(allowed)}")
    if not Path(path).is_file():
        raise ElmoError(f"{path}: no such file")
    fmt = task_kind.detect_predict_format(path, errors) if fmt == "auto" else fmt
    examples = task_kind.read(path, fmt, label_column, tokenize, errors, unlabelled=True)
    if not examples:
        raise ElmoError(f"{path}: no sentences in this file")
    return examples


# ---- long sentences -------------------------------------------------------------------------------------------------
def split_long(examples: list[Example], max_length: int) -> tuple[list[Example], int]:
    """Cut every sentence longer than `max_length` into consecutive pieces of at most `max_length` tokens.

    A tagging piece keeps its labels; a classification piece keeps the text's label. Returns the pieces (each
    remembers ``where``) and the number of sentences that were split.

    ``split_long([Example(list("abcde"), list("xxyyz"))], 2) -> pieces abc.. as [ab, cd, e], 1``
    """
    if max_length < 1:
        raise ElmoError(f"--max-length must be at least 1, got {max_length}")
    out, n_split = [], 0
    for ex in examples:
        n = len(ex.tokens)
        if n <= max_length:
            out.append(ex)
            continue
        n_split += 1
        for s in range(0, n, max_length):
            labels = ex.labels[s : s + max_length] if isinstance(ex.labels, list) else ex.labels
            out.append(Example(ex.tokens[s : s + max_length], labels, ex.where))
    return out, n_split


def piece_counts(examples: list[Example], max_length: int) -> list[int]:
    """How many pieces `split_long` makes of each example: ``ceil(n / max_length)``, at least 1."""
    return [max(1, -(-len(ex.tokens) // max_length)) for ex in examples]


# ---- writers --------------------------------------------------------------------------------------------------------
def format_tagged(sentences: list[tuple[list[str], list[str]]]) -> str:
    """``[(["a", "b"], ["X", "Y"])] -> "a\\tX\\nb\\tY\\n\\n"`` (token TAB label, blank line after each sentence)."""
    return "".join("".join(f"{t}\t{lab}\n" for t, lab in zip(toks, labs)) + "\n" for toks, labs in sentences)


def format_classified(rows: list[tuple[str, list[str]]]) -> str:
    """``[("pos", ["good", "film"])] -> "pos\\tgood film\\n"``"""
    return "".join(f"{label}\t{' '.join(tokens)}\n" for label, tokens in rows)
