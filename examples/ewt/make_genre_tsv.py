"""Derive the genre-classification TSVs of examples/ewt from the UD English EWT CoNLL-U files.

    python examples/ewt/make_genre_tsv.py      # writes genre-dev.tsv and genre-test.tsv beside this script

Each sentence becomes one line ``genre<TAB>text``: the genre is the prefix of its ``# sent_id`` before the first
``-`` (answers, email, newsgroup, reviews, weblog); the text is the sentence's word forms (multiword ranges and
empty nodes skipped) joined by single spaces, so it splits into exactly the tokens the CoNLL-U file has (and
that the biLM was trained on), not the untokenized ``# text``. Sentences keep their file order. Standard
library only; the output is byte-identical on every run.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def sentences(path: Path):
    """Yield (sent_id, tokens) per sentence of a CoNLL-U file."""
    sent_id, tokens = None, []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# sent_id"):
            sent_id = line.split("=", 1)[1].strip()
        elif line.startswith("#"):
            continue
        elif not line.strip():
            if tokens:
                yield sent_id, tokens
            sent_id, tokens = None, []
        else:
            cols = line.split("\t")
            if "-" not in cols[0] and "." not in cols[0]:
                tokens.append(cols[1])
    if tokens:
        yield sent_id, tokens


def convert(conllu: Path, tsv: Path) -> int:
    rows = []
    for sent_id, tokens in sentences(conllu):
        if sent_id is None:
            sys.exit(f"{conllu}: a sentence has no '# sent_id' line")
        rows.append(f"{sent_id.split('-', 1)[0]}\t{' '.join(tokens)}\n")
    tsv.write_text("".join(rows), encoding="utf-8")
    return len(rows)


if __name__ == "__main__":
    for part in ("dev", "test"):
        n = convert(HERE / f"en_ewt-ud-{part}.conllu", HERE / f"genre-{part}.tsv")
        print(f"wrote {HERE / f'genre-{part}.tsv'}: {n} sentences")
