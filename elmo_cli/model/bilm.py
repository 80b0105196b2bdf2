"""The bidirectional language model: token encoder + forward and backward LSTM stacks (+ the shared softmax)."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from elmo_cli.config import ModelConfig
from elmo_cli.model.encoder import TokenEncoder
from elmo_cli.model.lstm import LSTMStack, State, reverse_padded
from elmo_cli.model.softmax import SharedSoftmax


def to_model_chars(raw: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Raw character ids (docs/formats.md, Character ids) -> prediction form (+1, 0 = no token), as int64 torch."""
    t = torch.as_tensor(np.asarray(raw, dtype=np.int64)) if isinstance(raw, np.ndarray) else raw.long()
    return t + 1


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
        self.output_dropout = nn.Dropout(dropout)
        self.softmax = SharedSoftmax(vocab_size, P, sparse=sparse_softmax) if vocab_size else None

    @property
    def n_layers(self) -> int:
        """L + 1 output layers."""
        return self.config.lstm.n_layers + 1

    # ---- prediction ---------------------------------------------------------------------------------------------
    def embed(self, chars: torch.Tensor, lengths: torch.Tensor, states: tuple | None = None,
              token_embeddings: torch.Tensor | None = None, chunk_size: int = 4096
              ) -> tuple[torch.Tensor, tuple]:
        """Contextual representations of a padded batch of sentences (boundaries included).

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
        mask = None
        if states is not None:
            T = chars.shape[1]
            mask = torch.arange(T, device=chars.device).unsqueeze(0) < lengths.to(chars.device).unsqueeze(1)
        f_states, b_states = states if states is not None else (None, None)
        fwd, f_new = self.forward_lstm(x, f_states, mask)
        bwd_rev, b_new = self.backward_lstm(reverse_padded(x, lengths), b_states, mask)
        bwd = [reverse_padded(o, lengths) for o in bwd_rev]
        layers = [torch.cat([x, x], dim=-1)] + [torch.cat([f, b], dim=-1) for f, b in zip(fwd, bwd)]
        return torch.stack(layers), (f_new, b_new)

    # ---- language modelling -------------------------------------------------------------------------------------
    def lm_hidden(self, fwd_chars: torch.Tensor, bwd_chars: torch.Tensor,
                  states: tuple[list[State] | None, list[State] | None] = (None, None),
                  starts: torch.Tensor | None = None,
                  ) -> tuple[torch.Tensor, torch.Tensor, tuple[list[State], list[State]]]:
        """Top-layer outputs of both directions over two streams (the backward stream already reversed).

        # Parameters
        fwd_chars, bwd_chars : prediction-form ids, shape `(B, T, W)` each.
        states : the carried `(forward, backward)` states, or None for zeros.
        starts : optional bool `(B, T)`, True where a sentence starts in both streams (they run in lockstep): the
            states are zeroed there, so every sentence is modelled from zero state as it is embedded and scored.

        # Returns
        forward top `(B, T, P)`, backward top `(B, T, P)` (output dropout applied in training), new states.
        """
        B = fwd_chars.shape[0]
        both = self.encoder.forward_distinct(torch.cat([fwd_chars, bwd_chars], dim=0))  # (2B, T, P)
        f_out, f_states = self.forward_lstm(both[:B], states[0], reset=starts)
        b_out, b_states = self.backward_lstm(both[B:], states[1], reset=starts)
        return self.output_dropout(f_out[-1]), self.output_dropout(b_out[-1]), (f_states, b_states)
