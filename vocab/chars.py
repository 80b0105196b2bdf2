"""Character ids of tokens (docs/formats.md, Character ids).

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

import json
from pathlib import Path

import numpy as np

from vocab.errors import ElmoError

BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"
UNK_TOKEN = "<UNK>"
MAX_CHARS = 50
N_BYTES = 256
CHAR_DTYPE = np.uint16  # raw ids fit in 16 bits in both modes


class _CharEncoder:
    """What both modes share: the five specials after ``n_base`` ordinary ids, the row layout, a token cache.

    Subclasses set ``mode``, ``n_base`` and ``base_ids``.
    """

    mode = ""
    bos_token, eos_token = BOS_TOKEN, EOS_TOKEN  # the literal tokens that encode as the sentence-boundary rows
    row_dtype = CHAR_DTYPE

    def __init__(self, max_chars: int, n_base: int):
        if max_chars < 3:
            raise ElmoError(f"max_characters_per_token must be at least 3, got {max_chars}")
        self.max_chars = max_chars
        self.n_base = n_base
        self._cache: dict[str, np.ndarray] = {}
        self._init_rows()

    def _init_rows(self) -> None:
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

    @property
    def row_width(self) -> int:
        """Ids in one token's row: ``max_chars`` (an encoder with a word table adds the word id, `EfmlChars`)."""
        return self.max_chars

    def _special_row(self, char: int) -> np.ndarray:
        row = np.full(self.max_chars, self.pad_char, dtype=CHAR_DTYPE)
        row[0], row[1], row[2] = self.bow_char, char, self.eow_char
        row.flags.writeable = False
        return row

    def base_ids(self, token: str) -> list[int]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_base={self.n_base}, max_chars={self.max_chars})"

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_cache"] = {}  # don't ship the cache to worker processes
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_rows()

    def char_row(self, token: str) -> np.ndarray:
        """The character ids of one token, shape ``(max_chars,)``: the boundary rows for `bos_token` and
        `eos_token`, else ``[bow, c_1 .. c_k, eow, pad ...]`` with ``k <= max_chars - 2``."""
        if token == self.bos_token:
            return self._bos_row
        if token == self.eos_token:
            return self._eos_row
        kept = self.base_ids(token)[: self.max_chars - 2]
        row = np.full(self.max_chars, self.pad_char, dtype=CHAR_DTYPE)
        row[0] = self.bow_char
        row[1 : 1 + len(kept)] = kept
        row[1 + len(kept)] = self.eow_char
        return row

    def encode(self, token: str) -> np.ndarray:
        """Raw ids of one token, shape ``(row_width,)`` (read-only: rows are cached and shared)."""
        row = self._cache.get(token)
        if row is not None:
            return row
        row = self.char_row(token)
        if row.flags.writeable:
            row.flags.writeable = False  # cached rows are shared between calls
        if len(self._cache) < 1_000_000:
            self._cache[token] = row
        return row

    def encode_tokens(self, tokens: list[str]) -> np.ndarray:
        """Raw ids of a token list, shape ``(n, row_width)``."""
        if not tokens:
            return np.zeros((0, self.row_width), dtype=self.row_dtype)
        return np.stack([self.encode(t) for t in tokens])


class ByteChars(_CharEncoder):
    """UTF-8 byte characters, identical to bilm-tf and allennlp.

    ``ByteChars().encode("The")[:6] -> [258, 84, 104, 101, 259, 260]``
    """

    mode = "bytes"

    def __init__(self, max_chars: int = MAX_CHARS):
        super().__init__(max_chars, N_BYTES)

    def base_ids(self, token: str) -> list[int]:
        """The ordinary character ids of a token, before truncation."""
        # "ignore" as allennlp: a lone surrogate (never produced by decoding valid UTF-8) contributes no bytes.
        return list(token.encode("utf-8", "ignore"))

    def to_json(self) -> dict:
        return {"mode": self.mode, "max_characters_per_token": self.max_chars}


class CodepointChars(_CharEncoder):
    """Unicode code points as characters, from a table built on the corpus (for scripts where bytes cut a character).

    ``characters`` lists the kept code points; character ``characters[i]`` has id ``i`` and every other code point
    the one fallback id ``len(characters)`` ("other character"). So ``n_base = len(characters) + 1`` and the five
    specials follow as in byte mode. At most ``max_chars - 2`` code points of a token are kept.

    ``CodepointChars(["北", "京"]).encode("北京东")[:6] -> [5, 0, 1, 2, 6, 7]`` (fallback 2, specials 3..7)
    """

    mode = "codepoint"

    def __init__(self, characters: list[str], max_chars: int = MAX_CHARS):
        for c in characters:
            if len(c) != 1:
                raise ElmoError(f"character table entries must be single code points, got {c!r}")
        if len(set(characters)) != len(characters):
            raise ElmoError("character table holds a code point twice")
        if len(characters) + 1 + 5 > np.iinfo(CHAR_DTYPE).max + 1:
            raise ElmoError(f"character table too large ({len(characters)}); at most 65,530 code points fit in 16 bits")
        self.characters = list(characters)
        self._index = {c: i for i, c in enumerate(self.characters)}
        self.fallback_char = len(self.characters)
        super().__init__(max_chars, len(self.characters) + 1)

    @classmethod
    def build(cls, counts: dict[str, int], max_chars_vocab: int = 2000, max_chars: int = MAX_CHARS) -> "CodepointChars":
        """Keep the ``max_chars_vocab`` most frequent code points; ties by code point ascending.

        ``build({"a": 5, "b": 5, "c": 9}, 2).characters -> ["c", "a"]``
        """
        if max_chars_vocab < 1:
            raise ElmoError(f"--max-chars-vocab must be at least 1, got {max_chars_vocab}")
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], ord(kv[0])))
        return cls([c for c, _ in ranked[:max_chars_vocab]], max_chars)

    def base_ids(self, token: str) -> list[int]:
        index, fallback = self._index, self.fallback_char
        return [index.get(c, fallback) for c in token]

    def to_json(self) -> dict:
        return {"mode": self.mode, "max_characters_per_token": self.max_chars, "characters": "".join(self.characters)}


class EfmlChars(CodepointChars):
    """ELMoForManyLangs' character and word dictionaries (``char.dic``, ``word.dic``) as one token encoder.

    The characters are `CodepointChars`' with the dictionary's characters in its id order, its ``<oov>`` as the
    fallback, its ``<bos>``/``<eos>`` as the boundary characters, and its own begin/end-of-word assignment: its code
    (``frontend.create_one_batch``) puts the ``<eow>`` entry's id first in every row and the ``<bow>`` entry's id
    after the last character, so `bow_char` holds ``<eow>``'s row and `eow_char` ``<bow>``'s (`vocab.efml`
    arranges the rows). The literal tokens ``<bos>``/``<eos>`` are the sentence boundaries.

    A model that embeds words too has `words` (``word.dic``'s entries by id, ``""`` for an id no entry reaches):
    a token's row then ends with one more id, its word's (of the token cut to ``max_chars - 2`` characters, as
    EFML looks it up), or ``<oov>``'s. ``EfmlChars(["a"], 5, ["<oov>", "<pad>", "a"]).encode("a")`` ->
    ``[4, 0, 5, 6, 6, 2]`` (``bow`` 4, ``a`` 0, ``eow`` 5, ``pad`` 6, then word ``a``, 2).
    """

    mode = "efml"
    bos_token, eos_token = "<bos>", "<eos>"

    def __init__(self, characters: list[str], max_chars: int = MAX_CHARS, words: list[str] | None = None):
        self.words = list(words) if words is not None else None
        if self.words is not None:
            self._word_index = {w: i for i, w in enumerate(self.words) if w}
            if "<oov>" not in self._word_index:
                raise ElmoError("the word dictionary has no <oov> entry")
            self.word_fallback = self._word_index["<oov>"]
        super().__init__(characters, max_chars)

    @property
    def row_dtype(self):
        return np.int32 if self.words is not None else CHAR_DTYPE

    @property
    def row_width(self) -> int:
        return self.max_chars + (self.words is not None)

    def char_row(self, token: str) -> np.ndarray:
        row = super().char_row(token)
        if self.words is None:
            return row
        key = token if token in (self.bos_token, self.eos_token) else token[: self.max_chars - 2]
        return np.append(row.astype(np.int32), np.int32(self._word_index.get(key, self.word_fallback)))

    def to_json(self) -> dict:
        out = super().to_json()
        if self.words is not None:
            out["words"] = self.words
        return out


def load_chars(obj: dict) -> ByteChars | CodepointChars | EfmlChars:
    """The character encoder described by a ``to_json()`` dict (as stored in ``chars.json``)."""
    if not isinstance(obj, dict):
        raise ElmoError(f"character settings must be a JSON object, got {type(obj).__name__}")
    mode = obj.get("mode", "bytes")
    max_chars = obj.get("max_characters_per_token", MAX_CHARS)
    if not isinstance(max_chars, int):
        raise ElmoError(f"max_characters_per_token must be an integer, got {max_chars!r}")
    if mode == "bytes":
        return ByteChars(max_chars)
    if mode in ("codepoint", "efml"):
        chars = obj.get("characters")
        if not isinstance(chars, str):
            raise ElmoError(f"{mode} character settings lack the 'characters' string")
        if mode == "codepoint":
            return CodepointChars(list(chars), max_chars)
        words = obj.get("words")
        if words is not None and not (isinstance(words, list) and all(isinstance(w, str) for w in words)):
            raise ElmoError("efml character settings: 'words' must be a list of strings")
        return EfmlChars(list(chars), max_chars, words)
    raise ElmoError(f"unknown character mode {mode!r}; expected 'bytes', 'codepoint' or 'efml'")


def save_chars(chars: ByteChars | CodepointChars, path: str | Path) -> None:
    """Write ``chars.json`` atomically."""
    from vocab.text import atomic_write_bytes

    atomic_write_bytes(path, (json.dumps(chars.to_json(), ensure_ascii=False, indent=1) + "\n").encode("utf-8"))


def read_chars(path: str | Path) -> ByteChars | CodepointChars:
    """Read a ``chars.json`` file."""
    from vocab.text import read_json

    path = Path(path)
    obj = read_json(path, "character settings file (chars.json)")
    try:
        return load_chars(obj)
    except ElmoError as e:
        raise ElmoError(f"{path}: {e}") from None
