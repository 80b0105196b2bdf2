"""The task model: word embeddings [+ ELMo] -> BiLSTM -> [+ ELMo] -> per-token softmax or max-pool + linear.

Shape letters: B batch rows, T timesteps, E word-embedding dim, 2P ELMo width, H BiLSTM hidden size per direction,
C number of labels.

    x_k     = [word_k ; ELMo_k]                      (B, T, E [+ 2P])   ELMo at the input (arms top, mix)
    h_k     = BiLSTM(x)                              (B, T, 2H)
    out_k   = [h_k ; ELMo'_k]                        (B, T, 2H [+ 2P])  with elmo_output, a second mix
    tagging        logits = Linear(dropout(out_k))                     (B, T, C)
    classification logits = Linear(dropout(max_k out_k))               (B, C)

The word embedding covers training words seen at least ``min_count`` times plus ``<PAD>`` (0) and ``<UNK>`` (1);
during training a word is replaced by ``<UNK>`` with probability ``alpha / (alpha + count)`` (word dropout), so the
model learns an ``<UNK>`` vector for the test set's unseen words.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from elmo_cli.tasks.crf import CRF
from elmo_cli.tasks.features import ElmoFeatures
from vocab.errors import ElmoError

PAD, UNK = "<PAD>", "<UNK>"
ARMS = ("none", "top", "mix")


@dataclass(frozen=True)
class TaskConfig:
    kind: str = "tagging"  # tagging | classification
    labels: tuple[str, ...] = ()
    words: tuple[str, ...] = (PAD, UNK)  # the embedding rows, in order
    word_counts: tuple[int, ...] = (0, 0)  # training count of each row (word dropout)
    word_dim: int = 100  # 100 = the GloVe 6B/100d size; a --word-vectors file sets it
    hidden_dim: int = 128  # H per direction
    elmo: str = "mix"  # none | top | mix: ELMo at the input
    elmo_layers: str = "all"  # the layers a mix uses: all, or biLM layer indices such as "1,2" (0 = token layer)
    elmo_output: bool = False  # a second mix at the BiLSTM's output (the paper's [h_k; ELMo_k])
    layer_norm: bool = False
    elmo_dropout: float = 0.5  # the paper's taggers
    dropout: float = 0.3  # on word embeddings and BiLSTM outputs
    word_dropout_alpha: float = 0.25
    label_column: str = "upos"  # the CoNLL-U column read as the label
    max_length: int = 200  # longer sentences are split into pieces of this many tokens
    tokenizer: str = "whitespace"  # whitespace | bilm (the biLM's SentencePiece model, via Embedder.tokenize)
    fine_tune_bilm: bool = False  # the biLM trains with the task; its tuned weights are in weights.pt (bilm.*)
    char_cnn: bool = False  # word features from the word's characters too (`CharCNN`), as the paper's baselines had
    crf: bool = False  # tagging: a linear-chain CRF head (Viterbi decoding) instead of per-token softmax
    span_scheme: str | None = None  # BIO | IOB1 | BIOES: the transitions the CRF may decode (None: all)
    elmo_model: str | None = None  # the biLM: its directory, or its options.json file (then elmo_weights), absolute
    elmo_weights: str | None = None  # the weights file beside an options.json elmo_model (published models)

    def bilm_files(self, source: str = "config.json"):
        """The recorded biLM as `ModelFiles`; ElmoError naming `source` when it has moved."""
        from elmo_cli.bilm_format import ModelFiles, resolve_model_files

        if self.elmo_model is None:
            raise ElmoError(f"{source}: the task model records no biLM")
        try:
            if self.elmo_weights is None:
                return resolve_model_files(Path(self.elmo_model), None, None)
            return resolve_model_files(None, Path(self.elmo_model), Path(self.elmo_weights))
        except ElmoError as e:
            raise ElmoError(f"{source}: its biLM {self.elmo_model} cannot be loaded any more ({e}); restore it "
                            f"(or give --embeddings)") from None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, source: str = "config.json") -> "TaskConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ElmoError(f"{source}: unknown task config key(s) {', '.join(unknown)}")
        d = dict(d)
        for key in ("labels", "words", "word_counts"):
            if key in d:
                d[key] = tuple(d[key])
        return cls(**d)

    @property
    def uses_elmo(self) -> bool:
        return self.elmo != "none" or self.elmo_output


def build_words(sentences: list[list[str]], min_count: int = 1) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``<PAD>``, ``<UNK>``, then the words seen at least `min_count` times by descending count (ties: text).

    ``build_words([["a", "b", "a"]]) -> (("<PAD>", "<UNK>", "a", "b"), (0, 0, 2, 1))``
    """
    counts = Counter(t for s in sentences for t in s)
    kept = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    return (PAD, UNK, *kept), (0, 0, *(counts[w] for w in kept))


class CharCNN(nn.Module):
    """Word features from the word's characters: UTF-8 bytes (bilm-tf's ids, words cut at 22 bytes) -> a 30-wide
    embedding -> 50 filters of width 3 -> max over the word -> tanh. The character half of the BiLSTM-CNN taggers
    (Ma and Hovy 2016) that ELMo's paper used as baselines; `(B, T)` words in, `(B, T, 50)` out, 0 at padding."""

    def __init__(self, char_dim: int = 30, filters: int = 50, width: int = 3, max_chars: int = 24):
        super().__init__()
        from vocab.chars import ByteChars

        self.chars = ByteChars(max_chars)
        self.embed = nn.Embedding(self.chars.n_characters + 1, char_dim, padding_idx=0)
        self.conv = nn.Conv1d(char_dim, filters, width, padding=width // 2)
        self.dim = filters

    def forward(self, sentences: list[list[str]]) -> torch.Tensor:
        T, W = max(1, max(len(s) for s in sentences)), self.chars.max_chars
        ids = torch.zeros(len(sentences), T, W, dtype=torch.long)  # 0: no word
        for b, s in enumerate(sentences):
            if s:
                ids[b, : len(s)] = torch.from_numpy(self.chars.encode_tokens(s).astype("int64")) + 1
        x = self.embed(ids.to(self.embed.weight.device)).flatten(0, 1).transpose(1, 2)  # (B*T, C, W)
        h = torch.tanh(self.conv(x).amax(dim=2))  # (B*T, F)
        return h.view(len(sentences), T, -1) * (ids[:, :, 0] != 0).unsqueeze(-1).to(h)


class TaskModel(nn.Module):
    """Tagger or sentence classifier over word embeddings and (optionally) ELMo; see the module docstring."""

    def __init__(self, config: TaskConfig, elmo_in: ElmoFeatures | None = None,
                 elmo_out: ElmoFeatures | None = None, bilm: nn.Module | None = None):
        super().__init__()
        if (config.elmo != "none") != (elmo_in is not None) or config.elmo_output != (elmo_out is not None):
            raise ValueError("ElmoFeatures given do not match config.elmo / config.elmo_output")
        if config.fine_tune_bilm != (bilm is not None):
            raise ValueError("a biLM to fine-tune is given exactly when config.fine_tune_bilm")
        self.bilm = bilm  # fine-tuning: the biLM is part of this model (trained, saved in weights.pt)
        for features in (elmo_in, elmo_out):
            if bilm is not None and features is not None:
                features.tune(bilm)
        self.config = config
        self.index = {w: k for k, w in enumerate(config.words)}
        self.embed = nn.Embedding(len(config.words), config.word_dim, padding_idx=0)
        self.elmo_in, self.elmo_out = elmo_in, elmo_out
        elmo_dim = (elmo_in or elmo_out).dim if config.uses_elmo else 0
        self.char_cnn = CharCNN() if config.char_cnn else None
        char_dim = self.char_cnn.dim if self.char_cnn is not None else 0
        in_dim = config.word_dim + char_dim + (elmo_dim if elmo_in is not None else 0)
        self.lstm = nn.LSTM(in_dim, config.hidden_dim, batch_first=True, bidirectional=True)
        out_dim = 2 * config.hidden_dim + (elmo_dim if elmo_out is not None else 0)
        self.dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(out_dim, len(config.labels))
        self.crf = None
        if config.crf:
            if config.kind != "tagging":
                raise ValueError("a CRF head is for tagging")
            self.crf = CRF(len(config.labels))
            self.crf.constrain(config.labels, config.span_scheme)
        self.register_buffer("counts", torch.tensor(config.word_counts, dtype=torch.float32), persistent=False)

    def word_ids(self, sentences: list[list[str]]) -> torch.Tensor:
        """`(B, T)` int64 row ids, 0 at padding, 1 for words outside the embedding."""
        T = max(1, max(len(s) for s in sentences))
        ids = torch.zeros(len(sentences), T, dtype=torch.long)
        for b, s in enumerate(sentences):
            ids[b, : len(s)] = torch.tensor([self.index.get(t, 1) for t in s], dtype=torch.long)
        return ids.to(self.embed.weight.device)

    def _word_dropout(self, ids: torch.Tensor) -> torch.Tensor:
        alpha = self.config.word_dropout_alpha
        if not self.training or alpha <= 0:
            return ids
        p = alpha / (alpha + self.counts[ids])  # (B, T); padding and <UNK> have count 0 -> p = 1, harmless
        drop = (torch.rand_like(p) < p) & (ids > 1)
        return ids.masked_fill(drop, 1)

    def forward(self, sentences: list[list[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """
        # Parameters
        sentences : B token lists, each non-empty.

        # Returns
        logits `(B, T, C)` for tagging (the CRF's emissions when it has one) or `(B, C)` for classification, and
        the bool mask `(B, T)`.
        """
        ids = self._word_dropout(self.word_ids(sentences))  # (B, T)
        mask = ids != 0
        x = self.dropout(self.embed(ids))  # (B, T, E)
        if self.char_cnn is not None:
            x = torch.cat([x, self.dropout(self.char_cnn(sentences))], dim=-1)  # (B, T, E + 50)
        layers = lmask = None
        if self.config.uses_elmo:
            layers, lmask = (self.elmo_in or self.elmo_out).biLM_layers(sentences)  # (L+1, B, T, 2P), (B, T)
        if self.elmo_in is not None:
            x = torch.cat([x, self.elmo_in(sentences, layers, lmask)[0]], dim=-1)  # (B, T, E + 2P)
        lengths = mask.sum(1).cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        h, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=x.shape[1])  # (B, T, 2H)
        h = self.dropout(h)
        if self.elmo_out is not None:  # ELMo' has its own dropout
            h = torch.cat([h, self.elmo_out(sentences, layers, lmask)[0]], dim=-1)  # (B, T, 2H + 2P)
        if self.config.kind == "classification":
            h = h.masked_fill(~mask.unsqueeze(-1), float("-inf")).max(dim=1).values  # (B, 2H [+ 2P])
        return self.head(h), mask

    def mix_summary(self) -> dict:
        """``{"input": {...}, "output": {...}}`` of the ELMo mixes present (weights softmax-normalised, gamma)."""
        out = {}
        if self.elmo_in is not None:
            out["input"] = self.elmo_in.mix_summary()
        if self.elmo_out is not None:
            out["output"] = self.elmo_out.mix_summary()
        return out
