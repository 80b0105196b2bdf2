"""`TextEncoder`: how a shard or model directory turns a line of text into tokens, token ids and character ids.

A directory that carries text processing holds up to three files (fixed names, so any directory can be read):

    vocab.txt    the vocabulary (docs/formats.md, Vocabulary), optional for pure embedding
    chars.json   the character encoder (`vocab.chars.load_chars`); absent means byte mode, 50 chars per token
    spm.model    a SentencePiece model; present means lines are split into its pieces instead of on whitespace

``TextEncoder.from_dir("shards/").tokenize("Hello world") -> ["Hello", "world"]`` (no spm.model)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from vocab.chars import ByteChars, CodepointChars, read_chars, save_chars
from vocab.errors import ElmoError
from vocab.text import atomic_write_bytes
from vocab.vocabulary import Vocabulary, spm_path_for

VOCAB_FILE = "vocab.txt"
CHARS_FILE = "chars.json"
SPM_FILE = "spm.model"


class TextEncoder:
    """Tokenizer (whitespace or SentencePiece) + vocabulary + character encoder."""

    def __init__(
        self,
        vocab: Vocabulary | None = None,
        chars: ByteChars | CodepointChars | None = None,
        spm_model: bytes | None = None,
    ):
        self.vocab = vocab
        self.chars = chars if chars is not None else ByteChars()
        self.spm_model = spm_model
        self._sp = None
        if spm_model is not None:
            self._sp = _load_spm(spm_model, "SentencePiece model")

    @classmethod
    def from_dir(cls, directory: str | Path) -> "TextEncoder":
        """Read ``vocab.txt``, ``chars.json`` and ``spm.model`` from a directory, each if present."""
        directory = Path(directory)
        if not directory.is_dir():
            raise ElmoError(f"{directory}: no such directory")
        vocab = Vocabulary.load(directory / VOCAB_FILE) if (directory / VOCAB_FILE).exists() else None
        chars = read_chars(directory / CHARS_FILE) if (directory / CHARS_FILE).exists() else ByteChars()
        spm_model = (directory / SPM_FILE).read_bytes() if (directory / SPM_FILE).exists() else None
        if spm_model is not None:
            _load_spm(spm_model, str(directory / SPM_FILE))
        return cls(vocab, chars, spm_model)

    @classmethod
    def from_vocab_file(cls, vocab_path: str | Path, chars: ByteChars | CodepointChars | None = None) -> "TextEncoder":
        """A vocabulary file plus, when it exists, its SentencePiece model ``<stem>.spm.model`` beside it."""
        vocab_path = Path(vocab_path)
        if vocab_path.is_dir():
            enc = cls.from_dir(vocab_path)
            if enc.vocab is None:
                raise ElmoError(f"{vocab_path}: directory holds no {VOCAB_FILE}")
            return enc if chars is None else cls(enc.vocab, chars, enc.spm_model)
        vocab = Vocabulary.load(vocab_path)
        spm_path = spm_path_for(vocab_path)
        spm_model = spm_path.read_bytes() if spm_path.exists() else None
        if spm_model is not None:
            sp_pieces = _load_spm(spm_model, str(spm_path)).get_piece_size()
            if sp_pieces != len(vocab):
                raise ElmoError(f"{spm_path}: has {sp_pieces} pieces but {vocab_path} has {len(vocab)} lines")
        return cls(vocab, chars, spm_model)

    @property
    def tokenizer(self) -> str:
        return "sentencepiece" if self._sp is not None else "whitespace"

    def tokenize(self, line: str) -> list[str]:
        """SentencePiece pieces when a model is present, else ``line.split()`` (as bilm-tf and allennlp)."""
        if self._sp is not None:
            return self._sp.encode(line, out_type=str)
        return line.split()

    def encode_tokens(self, tokens: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids (int32 ``(n,)``, needs a vocabulary) and raw char ids (uint16 ``(n, max_chars)``)."""
        if self.vocab is None:
            raise ElmoError("no vocabulary: this directory has no vocab.txt")
        return self.vocab.encode(tokens), self.chars.encode_tokens(tokens)

    def save_to(self, directory: str | Path) -> None:
        """Write vocab.txt (if any), chars.json and spm.model (if any) into ``directory`` (created if needed)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self.vocab is not None:
            self.vocab.save(directory / VOCAB_FILE)
        save_chars(self.chars, directory / CHARS_FILE)
        if self.spm_model is not None:
            atomic_write_bytes(directory / SPM_FILE, self.spm_model)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_sp"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self.spm_model is not None:
            self._sp = _load_spm(self.spm_model, "SentencePiece model")


def _load_spm(model: bytes, name: str):
    import sentencepiece as spm

    try:
        return spm.SentencePieceProcessor(model_proto=model)
    except (RuntimeError, OSError) as e:
        raise ElmoError(f"{name}: not a valid SentencePiece model ({str(e).splitlines()[0] if str(e) else e})") from None
