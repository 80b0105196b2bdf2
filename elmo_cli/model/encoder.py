"""Token encoder (bilm-tf's): characters -> CNN -> max-pool -> activation -> highway -> projection."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from elmo_cli.config import CharCNNConfig


def exporting() -> bool:
    """Whether `torch.export` is tracing (torch < 2.5 has no ``torch.compiler.is_exporting``: never)."""
    is_exporting = getattr(torch.compiler, "is_exporting", None)
    return bool(is_exporting is not None and is_exporting())


_ROW_WEIGHTS: dict[tuple[int, torch.device], torch.Tensor] = {}


def distinct_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct rows of an integer matrix and where each row went: ``distinct[inverse]`` equals `rows`.

    Why: ``torch.unique(dim=0)`` sorts rows by comparing them one pair at a time (a select and an ``equal`` per
    comparison); for a training batch's (1,280, 50) character ids that is about 2 ms on 2 threads, a key per row and a
    1-D unique about 0.2 ms (`benchmarks/bench_step.py`). Each row gets a 64-bit key (a fixed weighted sum of its
    ids), and the result is checked row for row: should two different rows share a key, ``torch.unique(dim=0)``
    answers instead, so the result is exact whatever the keys. The rows come out in key order, not in ``unique``'s
    lexicographic order; each row's value is the same. Under `torch.export` (ONNX) the graph keeps
    ``unique(dim=0)``, which has no data-dependent branch.

    # Parameters
    rows : shape `(N, W)`, an integer dtype.

    # Returns
    distinct : shape `(U, W)`; inverse : shape `(N,)` int64.
    """
    if exporting() or torch.jit.is_tracing() or rows.shape[0] == 0:
        return torch.unique(rows, dim=0, return_inverse=True)
    W = rows.shape[1]
    weights = _ROW_WEIGHTS.get((W, rows.device))
    if weights is None:
        # fixed odd weights below 2^47, the same in every process: a row of character ids (below 2^10) sums
        # without overflow; a word-id column may wrap, which changes keys, not the checked result
        g = torch.Generator().manual_seed(W)
        weights = (torch.randint(0, 2**46, (W,), generator=g, dtype=torch.long) * 2 + 1).to(rows.device)
        _ROW_WEIGHTS[(W, rows.device)] = weights
    keys = (rows.long() * weights).sum(dim=1)  # (N,)
    distinct_keys, inverse = torch.unique(keys, return_inverse=True)  # (U,), (N,)
    U = distinct_keys.shape[0]
    first = torch.full((U,), rows.shape[0], dtype=torch.long, device=rows.device)
    first.scatter_reduce_(0, inverse, torch.arange(rows.shape[0], device=rows.device), "amin")  # (U,)
    distinct = rows[first]  # (U, W)
    if not torch.equal(distinct[inverse], rows):  # two rows shared a key
        return torch.unique(rows, dim=0, return_inverse=True)
    return distinct, inverse


def trimmed_positions(chars: torch.Tensor) -> torch.Tensor:
    """How many character positions of `chars` `(N, W)` differ from some token's trailing padding: ``W`` minus the
    longest suffix of columns in which every token equals its own last column, as a 0-d tensor (see
    `TokenEncoder.forward`, which computes up to one more position than this)."""
    W = chars.shape[1]
    varying = ((chars != chars[:, -1:]).sum(dim=0) > 0).long()  # (W,) 1 where a token differs from its end
    return (varying * torch.arange(1, W + 1, device=chars.device)).amax(dim=0)


@dataclass
class DistinctTokens:
    """A batch's distinct token rows, found before its step (on the host, where the batch is made): a GPU step
    then has nothing to wait for before the encoder (`distinct_rows` and the trimmed width each read a result).

    rows : `(U, W)` the distinct rows; inverse : `(N,)` int64, ``rows[inverse]`` is the batch's tokens in order;
    n_pos : the positions the encoder computes (`TokenEncoder.forward`'s trim).
    """

    rows: torch.Tensor
    inverse: torch.Tensor
    n_pos: int

    @classmethod
    def of(cls, chars: torch.Tensor, char_columns: int) -> "DistinctTokens":
        """The distinct tokens of `chars` `(..., W)` (prediction-form ids), whose first `char_columns` columns are
        characters (the encoder's ``max_characters_per_token``; a word id may follow)."""
        flat = chars.reshape(-1, chars.shape[-1])
        rows, inverse = distinct_rows(flat)
        return cls(rows, inverse, min(int(trimmed_positions(rows[:, :char_columns])) + 1, char_columns))

    def to(self, device: torch.device, non_blocking: bool = False) -> "DistinctTokens":
        return DistinctTokens(self.rows.to(device, non_blocking=non_blocking),
                              self.inverse.to(device, non_blocking=non_blocking), self.n_pos)

    def pin_memory(self) -> "DistinctTokens":
        return DistinctTokens(self.rows.pin_memory(), self.inverse.pin_memory(), self.n_pos)


class Highway(nn.Module):
    """``c = sigmoid(x W_c + b_c)``, ``t = relu(x W_t + b_t)``, ``x = c * t + (1 - c) * x`` (always relu)."""

    def __init__(self, dim: int):
        super().__init__()
        self.carry = nn.Linear(dim, dim)
        self.transform = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        carry = torch.sigmoid(self.carry(x))
        return carry * F.relu(self.transform(x)) + (1.0 - carry) * x


class TokenEncoder(nn.Module):
    """Character-level token encoder.

    All filter banks run as ONE matrix product over unfolded character windows: every bank is zero-padded to the
    widest filter (kmax taps), so the windows ``(N, W, E * kmax)`` multiply a ``(E * kmax, F)`` kernel assembled
    from the per-bank parameters on each call (so the padded taps carry no parameters and get no gradient).
    Positions where a narrower bank's window would run past the token are masked before the max. This is the same
    cross-correlation as bilm-tf's ``conv2d`` and allennlp's ``Conv1d`` (no kernel flip), at matmul speed.

    Parameters: ``char_embedding (n_characters, E)`` with row 0 fixed at zero, ``kernels[i] (width_i, E, count_i)``
    (bilm-tf's ``W_cnn_i`` without its leading 1), ``biases[i] (count_i,)``, ``highways``, ``projection (F -> P)``.
    A model that embeds words too (``config.word_dim`` D > 0, ELMoForManyLangs') has ``word_embedding
    (n_words, D)`` (row 0 zero), reads the word id from the last column of each token row, and projects
    ``[word embedding ; highway output]`` (``projection (D + F -> P)``).
    """

    def __init__(self, config: CharCNNConfig, projection_dim: int):
        super().__init__()
        self.config = config
        E, W = config.embedding_dim, config.max_characters_per_token
        self.char_embedding = nn.Embedding(config.n_characters, E, padding_idx=0)
        self.kernels = nn.ParameterList(
            [nn.Parameter(torch.empty(w, E, n).uniform_(-0.05, 0.05)) for w, n in config.filters]
        )
        self.biases = nn.ParameterList([nn.Parameter(torch.zeros(n)) for _, n in config.filters])
        F_ = config.n_filters
        self.highways = nn.ModuleList([Highway(F_) for _ in range(config.n_highway)])
        self.word_embedding = (nn.Embedding(config.n_words, config.word_dim, padding_idx=0) if config.word_dim
                               else None)
        self.projection = nn.Linear(config.word_dim + F_, projection_dim)
        for hw in self.highways:  # bilm-tf starts highways carrying the input through (negative carry bias)
            nn.init.constant_(hw.carry.bias, -2.0)
        self.kmax = config.max_width
        # invalid[p, f] is True where filter bank of column f, placed at position p, would extend past position W-1.
        widths = torch.cat([torch.full((n,), w) for w, n in config.filters])
        positions = torch.arange(W).unsqueeze(1)
        self.register_buffer("invalid", positions > (W - widths).unsqueeze(0), persistent=False)  # (W, F)

    @property
    def output_dim(self) -> int:
        return self.projection.out_features

    def kernel_matrix(self) -> torch.Tensor:
        """The combined kernel, shape ``(E * kmax, F)``; row ``e * kmax + k`` is tap k of embedding channel e."""
        E = self.config.embedding_dim
        cols = []
        for kern in self.kernels:  # (w, E, n)
            padded = F.pad(kern, (0, 0, 0, 0, 0, self.kmax - kern.shape[0]))  # (kmax, E, n)
            cols.append(padded.permute(1, 0, 2).reshape(E * self.kmax, kern.shape[2]))
        return torch.cat(cols, dim=1)

    def forward(self, chars: torch.Tensor, trim: bool = True, n_pos: int | None = None) -> torch.Tensor:
        """
        # Parameters
        chars : `torch.LongTensor`, shape `(N, W)` (`(N, W + 1)` with a word embedding: the word id last),
            prediction-form ids (0 = padding).
        trim : `bool`, optional, (default = `True`): skip the windows that read only trailing padding (see below;
            the same values); under `torch.export` the number of windows is a graph-level size (dynamic in the
            exported graph). False computes all W positions.
        n_pos : `int`, optional: the trimmed positions, already known (`DistinctTokens.n_pos`); not computed again.

        # Returns
        `torch.Tensor`, shape `(N, P)`: one embedding per token.
        """
        words = None
        if self.word_embedding is not None:
            chars, words = chars[:, : self.config.max_characters_per_token], chars[:, -1]
        N, W = chars.shape
        # Positions from `n_pos - 1` on read only each token's trailing padding (every token's columns there equal
        # its last column), so all those windows give the same value: computing up to the first of them gives
        # the same max. For English text this cuts the 50 positions to ~15-20.
        known = n_pos is not None
        if not known:
            n_pos = W
        if trim and not known:
            last = trimmed_positions(chars)  # W - the constant suffix
            if exporting():  # a graph-level size: torch.export and ONNX keep it dynamic
                n_pos = (last + 1).clamp(max=W).item()
                torch._check(n_pos >= 1)
                torch._check(n_pos <= W)
            else:
                n_pos = min(int(last) + 1, W)
        n_chars = min(n_pos + self.kmax - 1, W)
        x = self.char_embedding(chars[:, :n_chars])  # (N, n_chars, E)
        x = F.pad(x, (0, 0, 0, n_pos + self.kmax - 1 - n_chars))  # (N, n_pos + kmax - 1, E)
        windows = x.unfold(1, self.kmax, 1).reshape(N, n_pos, x.shape[2] * self.kmax)  # (N, n_pos, E * kmax)
        conv = windows @ self.kernel_matrix()  # (N, n_pos, F)
        if exporting() or n_pos > W - self.kmax + 1:  # only tokens near W characters reach
            conv = conv.masked_fill(self.invalid[:n_pos], float("-inf"))  # positions a narrower bank lacks
        # Training takes max: its backward routes each gradient to one position instead of masking all W x F.
        # Without gradients amax gives the same values 20x faster (no indices; measured on (256, 14, 2048)).
        pooled = conv.max(dim=1).values if torch.is_grad_enabled() else conv.amax(dim=1)
        pooled = pooled + torch.cat(list(self.biases))  # (N, F)
        h = F.relu(pooled) if self.config.activation == "relu" else torch.tanh(pooled)
        for hw in self.highways:
            h = hw(h)
        if words is not None:
            h = torch.cat([self.word_embedding(words), h], dim=1)  # (N, D + F)
        return self.projection(h)  # (N, P)

    def embed_tokens(self, tokens: DistinctTokens) -> torch.Tensor:
        """`forward_distinct` of a batch whose distinct tokens were found before (`DistinctTokens.of`, moved to
        the encoder's device): the same values, nothing read back from the device.

        # Returns
        shape `(N, P)`, the batch's tokens in order.
        """
        return F.embedding(tokens.inverse, self(tokens.rows, n_pos=tokens.n_pos))

    def forward_distinct(self, chars: torch.Tensor, chunk_size: int | None = None, trim: bool = True
                         ) -> torch.Tensor:
        """Encode every distinct token once and scatter back.

        # Parameters
        chars : shape `(..., W)` (`(..., W + 1)` with a word embedding), prediction-form ids. chunk_size bounds
        memory under no_grad (distinct tokens per encoder call). trim : see `forward`; False (and no chunk_size) has no data-dependent Python, for export.

        # Returns
        shape `(..., P)`.
        """
        lead, W = chars.shape[:-1], chars.shape[-1]
        distinct, inverse = distinct_rows(chars.reshape(-1, W))  # (U, W), (N,)
        if chunk_size and distinct.shape[0] > chunk_size and not torch.is_grad_enabled():
            emb = torch.cat([self(part, trim) for part in distinct.split(chunk_size)])
        else:
            emb = self(distinct, trim)  # (U, P)
        # F.embedding, not emb[inverse]: indexing's backward is index_put_(accumulate=True), whose CPU kernel adds
        # repeated rows with unordered atomic float adds when threads > 1 (training then is not bit-reproducible);
        # embedding's backward sums each row in a fixed order.
        return F.embedding(inverse, emb).reshape(*lead, -1)
