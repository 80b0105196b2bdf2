"""Pre-trained word vectors (GloVe or word2vec text format) for a task model's word embedding (torch-free).

    GloVe      ``word v1 v2 ... vD`` per line
    word2vec   the same, after a header line ``N D``

Only the rows of words in the task's vocabulary are kept, so a multi-GB file costs one pass and little memory.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from vocab.errors import ElmoError
from vocab.text import read_lines


def read_vectors(path: str | Path, words: set[str]) -> tuple[int, dict[str, np.ndarray]]:
    """The dimension D of the file and the float32 `(D,)` vector of each of `words` found in it.

    A line whose number of values differs from the first line's is an ElmoError naming file and line.
    """
    if not Path(path).is_file():
        raise ElmoError(f"{path}: --word-vectors file not found")
    dim, found = None, {}
    for _, lineno, text in read_lines([path], errors="replace"):
        cols = text.rstrip().split(" ")
        if not text.strip():
            continue
        if lineno == 1 and len(cols) == 2 and all(c.isdigit() for c in cols):
            continue  # word2vec header "N D"
        if dim is None:
            dim = len(cols) - 1
            if dim < 1:
                raise ElmoError(f"{path}:{lineno}: expected 'word v1 ... vD' (GloVe or word2vec text format)")
        if len(cols) - 1 != dim:
            raise ElmoError(f"{path}:{lineno}: {len(cols) - 1} values, but the first vector has {dim}")
        if cols[0] in words and cols[0] not in found:
            try:
                found[cols[0]] = np.asarray(cols[1:], dtype=np.float32)
            except ValueError:
                raise ElmoError(f"{path}:{lineno}: a value is not a number") from None
    if dim is None:
        raise ElmoError(f"{path}: no vectors in this file")
    return dim, found
