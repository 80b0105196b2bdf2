"""The bidirectional language model: token encoder + forward and backward LSTM stacks (+ the shared softmax).

The one tensor-level forward of a biLM lives here, for every caller (dump-embeddings and `Embedder`, `evaluate`,
fine-tuning in a task, the exported graph): `add_boundaries` puts ``<S>``/``</S>`` around each row, `directions`
gives what each direction reads (the backward one each row reversed within its length, `reverse_padded`),
`bilm_layers` runs both stacks and stacks the layers, `lm_tops` gives the language model's top states for
scoring. Shape letters: see `elmo_cli.model`.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from elmo_cli.config import ModelConfig
from elmo_cli.model.encoder import DistinctTokens, TokenEncoder
from elmo_cli.model.lstm import BiLSTMKernel, Dropout, LSTMStack, State, reverse_padded
from elmo_cli.model.softmax import SharedSoftmax

Stacks = tuple[LSTMStack, LSTMStack]  # (forward, backward)


def to_model_chars(raw: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Raw character ids (docs/formats.md, Character ids) -> prediction form (+1, 0 = no token), as int64 torch."""
    t = torch.as_tensor(np.asarray(raw, dtype=np.int64)) if isinstance(raw, np.ndarray) else raw.long()
    return t + 1


def add_boundaries(x: torch.Tensor, lengths: torch.Tensor, bos: torch.Tensor, eos: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``<S> w1 .. wn </S>`` in every row of a padded batch: the one place boundaries go around a tensor batch
    (no data-dependent sizes, so the exported graph uses it too).

    # Parameters
    x : `(B, T, ...)`, row b's items at positions ``0 .. lengths[b]-1``, zeros after (prediction-form char ids
        `(B, T, W)`, or vocabulary ids `(B, T)`).
    lengths : `(B,)`.
    bos, eos : the boundary items, broadcastable to ``x[0, 0]`` (char rows `(W,)`, or scalars).

    # Returns
    `(B, T+2, ...)` with ``bos`` at 0 and ``eos`` at ``lengths[b] + 1``, zeros after; the new lengths `(B,)` (+2).
    """
    B, T = x.shape[:2]
    extra = [1] * (x.dim() - 2)
    pos = torch.arange(T + 2, device=x.device).view(1, T + 2, *extra)  # (1, T+2, 1...)
    out = F.pad(x, [0, 0] * len(extra) + [1, 1])  # (B, T+2, ...)
    out = torch.where(pos == 0, bos.to(x.dtype), out)
    out = torch.where(pos == (lengths + 1).view(B, 1, *extra), eos.to(x.dtype), out)
    return out, lengths + 2


def directions(x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What the two directions read: the forward stack ``x`` `(B, T, ...)` as it is, the backward stack each row
    reversed within its length (``</S> wn .. w1 <S>``, the padding left in place). The backward stack's outputs
    come back to sentence order with `reverse_padded` again."""
    return x, reverse_padded(x, lengths)


def run_stacks(stacks: Stacks, streams: tuple[torch.Tensor, torch.Tensor], states: tuple | None = None,
               mask: torch.Tensor | None = None, reset: torch.Tensor | None = None, scan: bool = False
               ) -> tuple[list[torch.Tensor], list[torch.Tensor], tuple]:
    """Both stacks over their inputs `(B, T, P)` each (`directions`).

    # Parameters
    states : the carried ``(forward, backward)`` states (per-layer lists or None), or None for zeros.
    mask, reset : optional bool `(B, T)`, see `ProjectedLSTMLayer.forward`.
    scan : each layer as a graph-level ``scan`` (`LSTMStack.forward_scan`: export; zero state, no mask).

    # Returns
    L forward outputs and L backward outputs `(B, T, P)` (each in its stream's order), the new
    ``(forward, backward)`` states (None with `scan`).
    """
    if scan:
        return stacks[0].forward_scan(streams[0]), stacks[1].forward_scan(streams[1]), None
    f_states, b_states = states if states is not None else (None, None)
    fwd, f_new = stacks[0](streams[0], f_states, mask, reset)
    bwd, b_new = stacks[1](streams[1], b_states, mask, reset)
    return fwd, bwd, (f_new, b_new)


def bilm_layers(stacks: Stacks, x: torch.Tensor, lengths: torch.Tensor, states: tuple | None = None,
                scan: bool = False, kernel: BiLSTMKernel | None = None,
                distinct: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, tuple | None]:
    """The biLM's layers from token embeddings: the one forward behind `BiLM.embed`, the dump and the export.

    # Parameters
    stacks : the `(forward, backward)` LSTM stacks.
    x : token embeddings `(B, T, P)`, each row ``<S> w1 .. wn </S>`` then padding; lengths : `(B,)` (n + 2).
    states : None (zero state) or the carried ``(forward, backward)`` states; padding then leaves them untouched.
    scan : the export form (`run_stacks`). kernel : a `BiLSTMKernel` of these stacks, the fast stateless path
        (used when `states` is None); distinct : its optional ``(emb (U, P), idx (B, T))`` with ``x == emb[idx]``.

    # Returns
    layers `(L+1, B, T, 2P)` (the token layer twice, then each LSTM layer forward | backward; undefined beyond each
    row's length, and with `kernel` also at positions 0 and length-1), and the new states (None when stateless
    through `kernel` or `scan`).
    """
    if kernel is not None and states is None:
        return kernel(x, lengths, distinct), None
    mask = None
    if states is not None:
        mask = torch.arange(x.shape[1], device=x.device).unsqueeze(0) < lengths.to(x.device).unsqueeze(1)
    fwd, bwd, new = run_stacks(stacks, directions(x, lengths), states, mask, scan=scan)
    layers = [torch.cat([x, x], dim=-1)]
    layers += [torch.cat([f, reverse_padded(b, lengths)], dim=-1) for f, b in zip(fwd, bwd)]
    return torch.stack(layers), new


def lm_tops(stacks: Stacks, x: torch.Tensor, lengths: torch.Tensor, states: tuple | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """The language model's top states for scoring sentences: the forward stack reads ``<S> w1 .. wn`` (predicting
    ``w1 .. wn </S>``), the backward one ``</S> wn .. w1`` (predicting ``wn .. w1 <S>``); the last token of each
    direction is only a target, so it is not read and a carried state stops before it.

    # Parameters
    x : token embeddings `(B, T, P)`, rows ``<S> w1 .. wn </S>`` then padding; lengths : `(B,)` (n + 2).
    states : the carried ``(forward, backward)`` states (each fitted to B rows), or None for zeros.

    # Returns
    forward top `(B, T-1, P)` in sentence order, backward top `(B, T-1, P)` in its reversed order (step t of row b
    predicts ``reverse_padded(targets)[b, t + 1]``), valid at steps ``< lengths - 1``; the new states.
    """
    T = x.shape[1]
    streams = tuple(s[:, : T - 1] for s in directions(x, lengths))  # (B, T-1, P) each
    mask = None  # padding must not advance a carried state
    if states is not None:
        mask = torch.arange(T - 1, device=x.device).unsqueeze(0) < (lengths - 1).unsqueeze(1)
    fwd, bwd, new = run_stacks(stacks, streams, states, mask)
    return fwd[-1], bwd[-1], new


class BiLM(nn.Module):
    """ELMo's biLM, as bilm-tf builds it. The softmax is optional: a model read from bilm-tf weights has none.

    # Parameters
    config : `ModelConfig`
    vocab_size : `int`, optional: build the shared softmax over this many words.
    dropout : `float`, (default = `0.0`): bilm-tf's placement, on each LSTM layer's input and on the top output.
    """

    def __init__(self, config: ModelConfig, vocab_size: int | None = None, dropout: float = 0.0,
                 sparse_softmax: bool = False):
        super().__init__()
        config.validate()
        self.config = config
        P = config.lstm.projection_dim
        self.encoder = TokenEncoder(config.char_cnn, P)
        self.forward_lstm = LSTMStack(config.lstm, dropout)
        self.backward_lstm = LSTMStack(config.lstm, dropout)
        self.output_dropout = Dropout(dropout)
        self.softmax = SharedSoftmax(vocab_size, P, sparse=sparse_softmax) if vocab_size else None

    @property
    def n_layers(self) -> int:
        """L + 1 output layers."""
        return self.config.lstm.n_layers + 1

    # ---- prediction ---------------------------------------------------------------------------------------------
    def embed(self, chars: torch.Tensor, lengths: torch.Tensor, states: tuple | None = None,
              token_embeddings: torch.Tensor | None = None, chunk_size: int = 4096
              ) -> tuple[torch.Tensor, tuple]:
        """Contextual representations of a padded batch of sentences (boundaries included): the character encoder
        once per distinct token, then `bilm_layers` (the loop; callers pass the kernel to `bilm_layers` directly).

        # Parameters
        chars : prediction-form ids, shape `(B, T, W)`: each row `<S> w1 .. wn </S>` then padding (all 0).
        lengths : `(B,)` valid steps per row (n + 2).
        states : None (every sentence from zero state, the default) or the `(forward, backward)` states of a
            previous call (bilm-tf's carried-state behaviour); then padding steps leave the state untouched.
        token_embeddings : optional precomputed encoder output `(B, T, P)` (token cache); skips the char CNN.

        # Returns
        layers `(L+1, B, T, 2P)` (undefined beyond each row's length) and the final `(forward, backward)` states.
        """
        x = token_embeddings if token_embeddings is not None else self.encoder.forward_distinct(chars, chunk_size)
        return bilm_layers(self.stacks, x, lengths.to(x.device), states)

    @property
    def stacks(self) -> Stacks:
        """``(forward_lstm, backward_lstm)``."""
        return self.forward_lstm, self.backward_lstm

    # ---- language modelling -------------------------------------------------------------------------------------
    def lm_hidden(self, fwd_chars: torch.Tensor, bwd_chars: torch.Tensor,
                  states: tuple[list[State] | None, list[State] | None] = (None, None),
                  starts: torch.Tensor | None = None, stacks=None, tokens: DistinctTokens | None = None,
                  ) -> tuple[torch.Tensor, torch.Tensor, tuple[list[State], list[State]]]:
        """Top-layer outputs of both directions over two streams (the backward stream already reversed).

        # Parameters
        fwd_chars, bwd_chars : prediction-form ids, shape `(B, T, W)` each.
        states : the carried `(forward, backward)` states, or None for zeros.
        starts : optional bool `(B, T)`, True where a sentence starts in both streams (they run in lockstep): the
            states are zeroed there, so every sentence is modelled from zero state as it is embedded and scored.
        stacks : what runs `lm_stacks` (its arguments and results), None for `lm_stacks` itself: the training
            step passes its CUDA-graph replay of it (`elmo_cli.graphed`).
        tokens : the distinct tokens of ``cat([fwd_chars, bwd_chars])``, found before the step
            (`DistinctTokens.of`, moved to the device), or None to find them here.

        # Returns
        forward top `(B, T, P)`, backward top `(B, T, P)` (output dropout applied in training), new states.
        """
        B = fwd_chars.shape[0]
        if tokens is None:
            both = self.encoder.forward_distinct(torch.cat([fwd_chars, bwd_chars], dim=0))  # (2B, T, P)
        else:
            both = self.encoder.embed_tokens(tokens).reshape(2 * B, fwd_chars.shape[1], -1)  # (2B, T, P)
        return (stacks or self.lm_stacks)(both[:B], both[B:], states, starts)

    def lm_stacks(self, fwd_x: torch.Tensor, bwd_x: torch.Tensor,
                  states: tuple[list[State] | None, list[State] | None] = (None, None),
                  starts: torch.Tensor | None = None,
                  ) -> tuple[torch.Tensor, torch.Tensor, tuple[list[State], list[State]]]:
        """`lm_hidden` after the token encoder: both stacks over token embeddings `(B, T, P)` each, then the output
        dropout. Returns the two tops `(B, T, P)` and the new states."""
        f_out, b_out, new_states = run_stacks(self.stacks, (fwd_x, bwd_x), states, reset=starts)
        return self.output_dropout(f_out[-1]), self.output_dropout(b_out[-1]), new_states
