"""Character ids of tokens (spec §2).

A *character encoder* maps a token to a row of ``max_chars`` raw ids. Both modes share one layout, with
``n_base`` ordinary character ids followed by five specials::

    0 .. n_base-1   ordinary characters (bytes: the UTF-8 bytes, n_base = 256)
    n_base + 0      begin-of-sentence char   (256 in byte mode)
    n_base + 1      end-of-sentence char     (257)
    n_base + 2      begin-of-word            (258)
    n_base + 3      end-of-word              (259)
    n_base + 4      padding                  (260)

so ``n_characters = n_base + 5`` raw ids (261 in byte mode), and the model's table has one more row because
prediction-time ids are shifted by +1 with 0 meaning "no token" (262 in byte mode).

Byte mode is bilm-tf/allennlp's: ``thhhhh`` at width 5 -> ``[258, 116, 104, 104, 259]``; at most
``max_chars - 2`` bytes are kept (a multibyte character may be cut); the literal tokens ``<S>``/``</S>``
encode as the sentence-boundary rows ``[258, 256, 259, 260, ...]`` / ``[258, 257, 259, 260, ...]``.
"""
from __future__ import annotations

import numpy as np

from vocab.errors import ElmoError

BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"
UNK_TOKEN = "<UNK>"
MAX_CHARS = 50
N_BYTES = 256
CHAR_DTYPE = np.uint16  # raw ids fit in 16 bits in both modes


class ByteChars:
    """UTF-8 byte characters, identical to bilm-tf and allennlp.

    ``ByteChars().encode("The")[:6] -> [258, 84, 104, 101, 259, 260]``
    """

    mode = "bytes"

    def __init__(self, max_chars: int = MAX_CHARS):
        if max_chars < 3:
            raise ElmoError(f"max_characters_per_token must be at least 3, got {max_chars}")
        self.max_chars = max_chars
        self.n_base = N_BYTES
        self._cache: dict[str, np.ndarray] = {}
        self._bos_row = self._special_row(self.bos_char)
        self._eos_row = self._special_row(self.eos_char)

    # The five specials follow the ordinary ids.
    @property
    def bos_char(self) -> int:
        return self.n_base

    @property
    def eos_char(self) -> int:
        return self.n_base + 1

    @property
    def bow_char(self) -> int:
        return self.n_base + 2

    @property
    def eow_char(self) -> int:
        return self.n_base + 3

    @property
    def pad_char(self) -> int:
        return self.n_base + 4

    @property
    def n_characters(self) -> int:
        """Raw ids in use (261 in byte mode); the model's table has this + 1 rows."""
        return self.n_base + 5

    def _special_row(self, char: int) -> np.ndarray:
        row = np.full(self.max_chars, self.pad_char, dtype=CHAR_DTYPE)
        row[0], row[1], row[2] = self.bow_char, char, self.eow_char
        return row

    def base_ids(self, token: str) -> list[int]:
        """The ordinary character ids of a token, before truncation."""
        return list(token.encode("utf-8", "surrogatepass"))

    def encode(self, token: str) -> np.ndarray:
        """Raw ids of one token, shape ``(max_chars,)``, dtype uint16."""
        row = self._cache.get(token)
        if row is not None:
            return row
        if token == BOS_TOKEN:
            row = self._bos_row
        elif token == EOS_TOKEN:
            row = self._eos_row
        else:
            kept = self.base_ids(token)[: self.max_chars - 2]
            row = np.full(self.max_chars, self.pad_char, dtype=CHAR_DTYPE)
            row[0] = self.bow_char
            row[1 : 1 + len(kept)] = kept
            row[1 + len(kept)] = self.eow_char
        if len(self._cache) < 1_000_000:
            self._cache[token] = row
        return row

    def encode_tokens(self, tokens: list[str]) -> np.ndarray:
        """Raw ids of a token list, shape ``(n, max_chars)``."""
        if not tokens:
            return np.zeros((0, self.max_chars), dtype=CHAR_DTYPE)
        return np.stack([self.encode(t) for t in tokens])

    def to_json(self) -> dict:
        return {"mode": self.mode, "max_characters_per_token": self.max_chars}
