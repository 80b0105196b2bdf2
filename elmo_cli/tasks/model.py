"""The task model: word embeddings [+ ELMo] -> BiLSTM -> [+ ELMo] -> per-token softmax or max-pool + linear.

Shape letters: B batch rows, T timesteps, E word-embedding dim, 2P ELMo width, H BiLSTM hidden size per direction,
C number of labels.

    x_k     = [word_k ; ELMo_k]                      (B, T, E [+ 2P])   ELMo at the input (arms top, mix)
    h_k     = BiLSTM(x)                              (B, T, 2H)
    out_k   = [h_k ; ELMo'_k]                        (B, T, 2H [+ 2P])  with elmo_output, a second mix
    tagging        logits = Linear(dropout(out_k))                     (B, T, C)
    classification logits = Linear(dropout(max_k out_k))               (B, C)

One forward for every use: `encode_batch` turns token lists into id tensors (the only place that does), and
`TaskModel.scores` runs the model on them plus the biLM's layers; `TaskModel.forward` (training, `task predict`)
calls it with the layer cache's or the fine-tuned biLM's layers, and the exported graph (`tasks/graph_export.py`) with
`BiLMGraph`'s. `TaskModel.label_ids` turns its logits into labels (argmax, or the CRF's `viterbi`). With
``char_cnn`` the word side is ``[word_k ; CharCNN(chars_k)]`` (B, T, E + 50); with ``crf`` the logits are the
CRF's emission scores. Loops over time (the export's BiLSTM, Viterbi) go through `time_loop`.

The word embedding covers training words seen at least ``min_count`` times plus ``<PAD>`` (0) and ``<UNK>`` (1);
during training a word is replaced by ``<UNK>`` with probability ``alpha / (alpha + count)`` (word dropout), so the
model learns an ``<UNK>`` vector for the test set's unseen words.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
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
    kind: str = "tagging"  # the name of a registered `kinds.TaskKind`: tagging | classification | ...
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
        from elmo_cli.model_files import resolve_model_files

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
    def task_kind(self):
        """The registered `kinds.TaskKind` named by ``kind``."""
        from elmo_cli.tasks.kinds import get_kind

        return get_kind(self.kind)

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


CHAR_CNN_WIDTH = 24  # `CharCNN`'s characters per word: begin-of-word, 22 UTF-8 bytes, end-of-word


def exporting() -> bool:
    """True while torch.export traces the model (`task export`): loops over time then become ``scan`` ops, which
    export with a dynamic time axis; in eager mode they are plain Python loops (an eager ``scan`` compiles per
    shape, seconds a call)."""
    return torch.compiler.is_exporting()


def time_loop(step, state, xs):
    """``state, y_t = step(state, x_t)`` over the first axis of `xs` (a tensor or a tuple of tensors), the outputs
    stacked on a new first axis: torch's ``scan`` while exporting, else a Python loop; the same `step` either way."""
    if exporting():
        from torch._higher_order_ops.scan import scan

        return scan(step, state, xs)
    from torch.utils._pytree import tree_leaves, tree_map

    ys = []
    for t in range(tree_leaves(xs)[0].shape[0]):
        state, y = step(state, tree_map(lambda x: x[t], xs))
        ys.append(y)
    return state, tree_map(lambda *parts: torch.stack(parts), *ys)


def encode_batch(sentences: list[list[str]], index: dict[str, int], char_cnn: bool = False
                 ) -> dict[str, np.ndarray]:
    """The task core's id inputs of B non-empty token lists, the one place token lists become them (`TaskModel`
    and `task predict --onnx`).

    # Returns
    ``word_ids`` int64 `(B, T)`: rows of the word embedding, 0 = padding, 1 = ``<UNK>`` for any other word; with
    `char_cnn` also ``word_chars`` int64 `(B, T, 24)`: each word's UTF-8 bytes by allennlp's ``batch_to_ids`` rule
    (begin-of-word 259, the first 22 bytes each + 1, end-of-word 260, then 261), zero rows at padding.
    """
    from elmo_cli.inputs import char_ids_batch
    from vocab.chars import ByteChars

    T = max(1, max(len(s) for s in sentences))
    words = np.zeros((len(sentences), T), dtype=np.int64)
    for b, s in enumerate(sentences):
        words[b, : len(s)] = [index.get(t, 1) for t in s]
    if not char_cnn:
        return {"word_ids": words}
    chars = char_ids_batch(ByteChars(CHAR_CNN_WIDTH), sentences, boundaries=False)[0].numpy()  # (B, T, 24)
    return {"word_ids": words, "word_chars": chars}


class CharCNN(nn.Module):
    """Word features from the word's characters: UTF-8 bytes (bilm-tf's ids, words cut at 22 bytes) -> a 30-wide
    embedding -> 50 filters of width 3 -> max over the word -> tanh. The character half of the BiLSTM-CNN taggers
    (Ma and Hovy 2016) that ELMo's paper used as baselines; `(B, T, 24)` character ids (`encode_batch`'s
    ``word_chars``) in, `(B, T, 50)` out, 0 at padding."""

    def __init__(self, char_dim: int = 30, filters: int = 50, width: int = 3, max_chars: int = CHAR_CNN_WIDTH):
        super().__init__()
        from vocab.chars import ByteChars

        self.chars = ByteChars(max_chars)
        self.embed = nn.Embedding(self.chars.n_characters + 1, char_dim, padding_idx=0)
        self.conv = nn.Conv1d(char_dim, filters, width, padding=width // 2)
        self.dim = filters

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """
        # Parameters
        ids : int64 `(B, T, W)`, 0 = no character (a padding word is all 0).

        # Returns
        `(B, T, 50)`, 0 at padding words.
        """
        B, T, W = ids.shape
        x = self.embed(ids).reshape(B * T, W, -1).transpose(1, 2)  # (B*T, C, W)
        h = torch.tanh(self.conv(x).amax(dim=2))  # (B*T, F)
        return h.view(B, T, -1) * (ids[:, :, 0] != 0).unsqueeze(-1).to(h.dtype)


def bidirectional(lstm: nn.LSTM, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A one-layer bidirectional `nn.LSTM` over right-padded rows, each row's backward pass started at its own last
    step (what `pack_padded_sequence` gives): per direction torch's own ``lstm_cell`` on the module's weights in a
    ``scan`` over time, which exports with a dynamic time axis (the exporter's translation of a whole ``lstm`` call
    fixed the example's shapes in torch 2.13: onnxruntime then failed on any other batch shape).

    # Parameters
    x : `(B, T, D)`; mask : bool `(B, T)`, True at each row's first steps.

    # Returns
    `(B, T, 2H)`, zero at padding.
    """
    from elmo_cli.model.lstm import reverse_padded

    B, H = x.shape[0], lstm.hidden_size
    lengths = mask.sum(dim=1)  # (B,)
    zero = x.new_zeros(B, H)
    out = []
    for suffix, inp in (("", x), ("_reverse", reverse_padded(x, lengths))):
        w_ih, w_hh, b_ih, b_hh = (getattr(lstm, f"{name}_l0{suffix}")
                                  for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))

        def combine(state, x_t, w_ih=w_ih, w_hh=w_hh, b_ih=b_ih, b_hh=b_hh):
            h, c = torch.lstm_cell(x_t, state, w_ih, w_hh, b_ih, b_hh)  # (B, H) each
            return (h, c), h.clone()

        y = time_loop(combine, (zero, zero.clone()), inp.transpose(0, 1))[1].transpose(0, 1)  # (B, T, H)
        out.append(y if not suffix else reverse_padded(y, lengths))
    return torch.cat(out, dim=-1) * mask.unsqueeze(-1).to(x.dtype)


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
        self.kind = config.task_kind  # pooling (`TaskKind.pool`) and, elsewhere, targets, loss, reading, writing
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
            if not self.kind.per_token:
                raise ValueError("a CRF head is for per-token kinds (tagging)")
            self.crf = CRF(len(config.labels))
            self.crf.constrain(config.labels, config.span_scheme)
        self.register_buffer("counts", torch.tensor(config.word_counts, dtype=torch.float32), persistent=False)

    def inputs(self, sentences: list[list[str]]) -> dict[str, torch.Tensor]:
        """`encode_batch`'s ids as tensors on the model's device: ``word_ids`` `(B, T)` [and ``word_chars``
        `(B, T, 24)` with a character CNN]."""
        device = self.embed.weight.device
        arrays = encode_batch(sentences, self.index, self.char_cnn is not None)
        return {k: torch.from_numpy(v).to(device) for k, v in arrays.items()}

    def _word_dropout(self, ids: torch.Tensor) -> torch.Tensor:
        alpha = self.config.word_dropout_alpha
        if not self.training or alpha <= 0:
            return ids
        p = alpha / (alpha + self.counts[ids])  # (B, T); padding and <UNK> have count 0 -> p = 1, harmless
        drop = (torch.rand_like(p) < p) & (ids > 1)
        return ids.masked_fill(drop, 1)

    def forward(self, sentences: list[list[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """`scores` of token lists: their ids (`inputs`, word dropout when training) and the biLM's layers (the
        layer cache, or the biLM being fine-tuned).

        # Parameters
        sentences : B token lists, each non-empty.

        # Returns
        logits `(B, T, C)` for tagging (the CRF's emissions when it has one) or `(B, C)` for classification, and
        the bool mask `(B, T)`.
        """
        ids = self.inputs(sentences)
        word_ids = self._word_dropout(ids["word_ids"])  # (B, T)
        layers = None
        if self.config.uses_elmo:
            layers = (self.elmo_in or self.elmo_out).biLM_layers(sentences)[0]  # (L+1, B, T, 2P)
            layers = layers.to(self.embed.weight.device)
        return self.scores(word_ids, ids.get("word_chars"), layers), word_ids != 0

    def scores(self, word_ids: torch.Tensor, word_chars: torch.Tensor | None = None,
               layers: torch.Tensor | None = None) -> torch.Tensor:
        """The task model on tensors, the one forward `task train`, `task predict` and the exported graph run.

        # Parameters
        word_ids : int64 `(B, T)`, 0 = padding (the mask is ``word_ids != 0``).
        word_chars : int64 `(B, T, 24)`, with a character CNN (`encode_batch`).
        layers : `(L+1, B, T, 2P)`, the biLM's layers (zero at padding), with ELMo.

        # Returns
        logits `(B, T, C)` for a per-token kind such as tagging (the CRF's emissions when it has one) or `(B, C)`
        for a pooled kind such as classification (`TaskKind.pool`).
        """
        mask = word_ids != 0  # (B, T)
        x = self.dropout(self.embed(word_ids))  # (B, T, E)
        if self.char_cnn is not None:
            x = torch.cat([x, self.dropout(self.char_cnn(word_chars))], dim=-1)  # (B, T, E + 50)
        if self.elmo_in is not None:
            x = torch.cat([x, self.elmo_in.mix_layers(layers, mask)], dim=-1)  # (B, T, E [+ 50] + 2P)
        if exporting():
            h = bidirectional(self.lstm, x, mask)  # (B, T, 2H)
        else:
            packed = pack_padded_sequence(x, mask.sum(1).cpu(), batch_first=True, enforce_sorted=False)
            h = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=x.shape[1])[0]
        h = self.dropout(h)
        if self.elmo_out is not None:  # ELMo' has its own dropout
            h = torch.cat([h, self.elmo_out.mix_layers(layers, mask)], dim=-1)  # (B, T, 2H + 2P)
        return self.head(self.kind.pool(h, mask))  # pooled by the kind: (B, T, 2H [+ 2P]) or (B, 2H [+ 2P])

    def label_ids(self, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The predicted label ids of `scores`' logits: `(B, T)` (the CRF's Viterbi path when it has one;
        padding positions mean nothing) or `(B,)`."""
        if self.crf is not None:
            return self.crf.viterbi(logits, mask)
        return logits.argmax(dim=-1)

    def mix_summary(self) -> dict:
        """``{"input": {...}, "output": {...}}`` of the ELMo mixes present (weights softmax-normalised, gamma)."""
        out = {}
        if self.elmo_in is not None:
            out["input"] = self.elmo_in.mix_summary()
        if self.elmo_out is not None:
            out["output"] = self.elmo_out.mix_summary()
        return out
