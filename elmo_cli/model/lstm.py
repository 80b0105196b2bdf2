"""The LSTM with projection and clipping of spec §5.3, and the residual stack of §5.4.

One step::

    z = [x_t ; h_{t-1}] @ W_0 + B            gates in column order i, j, f, o
    c_t = sigmoid(f + 1) * c_{t-1} + sigmoid(i) * tanh(j),   clipped to [-cell_clip, cell_clip]
    h_t = (sigmoid(o) * tanh(c_t)) @ W_P,                    clipped to [-proj_clip, proj_clip]

The input product of all T steps is one matrix product; only the recurrence runs in the Python loop. Without
clipping and without a mask the layer hands the whole sequence to torch's fused ``torch.lstm`` (proj_size), which
computes the same function.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from elmo_cli.config import LSTMConfig

State = tuple[torch.Tensor, torch.Tensor]  # h (B, P), c (B, H)


def fit_states(states: list[State] | None, batch_size: int) -> list[State] | None:
    """Carried per-layer states resized to `batch_size` rows: row b continues row b, a shorter batch drops the
    last rows, a longer one starts its extra rows from zero."""
    def fit(t: torch.Tensor) -> torch.Tensor:
        if t.shape[0] >= batch_size:
            return t[:batch_size]
        return torch.cat([t, t.new_zeros(batch_size - t.shape[0], *t.shape[1:])])

    return None if states is None else [(fit(h), fit(c)) for h, c in states]


class ProjectedLSTMLayer(nn.Module):
    """One LSTM layer with a projection of its output.

    Parameters (torch orientation, ``y = x @ W.T``): ``input_weight (4H, D)``, ``bias (4H,)``,
    ``recurrent_weight (4H, P)``, ``projection_weight (P, H)``. bilm-tf's ``W_0`` is
    ``cat([input_weight, recurrent_weight], 1).T`` and ``W_P_0`` is ``projection_weight.T``.
    """

    def __init__(self, input_dim: int, dim: int, projection_dim: int, cell_clip: float | None = None,
                 proj_clip: float | None = None):
        super().__init__()
        self.dim, self.projection_dim = dim, projection_dim
        self.cell_clip, self.proj_clip = cell_clip, proj_clip
        self.input_weight = nn.Parameter(torch.empty(4 * dim, input_dim))
        self.recurrent_weight = nn.Parameter(torch.empty(4 * dim, projection_dim))
        self.bias = nn.Parameter(torch.zeros(4 * dim))
        self.projection_weight = nn.Parameter(torch.empty(projection_dim, dim))
        for w in (self.input_weight, self.recurrent_weight, self.projection_weight):
            nn.init.xavier_uniform_(w)
        # The forget bias of +1 is added at run time and never baked into `bias` (spec §4).
        forget = torch.zeros(4 * dim)
        forget[2 * dim : 3 * dim] = 1.0
        self.register_buffer("forget_bias", forget, persistent=False)

    def zero_state(self, batch_size: int, device=None, dtype=None) -> State:
        device = device or self.bias.device
        dtype = dtype or self.bias.dtype
        return (torch.zeros(batch_size, self.projection_dim, device=device, dtype=dtype),
                torch.zeros(batch_size, self.dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, state: State | None = None, mask: torch.Tensor | None = None,
                reset: torch.Tensor | None = None) -> tuple[torch.Tensor, State]:
        """
        # Parameters
        x : shape `(B, T, D)`.
        state : `(h (B, P), c (B, H))`, zeros when None.
        mask : optional bool `(B, T)`; where False the state is carried through unchanged (right padding), so the
            returned state is the one after each row's last valid step.
        reset : optional bool `(B, T)`; where True the state is zeroed before that step (a sentence starts there).

        # Returns
        outputs `(B, T, P)` (undefined where mask is False) and the final state.
        """
        B, T, _ = x.shape
        if state is None:
            state = self.zero_state(B, x.device, x.dtype)
        if self.cell_clip is None and self.proj_clip is None and mask is None and reset is None:
            return self._fused(x, state)
        H = self.dim
        xw = F.linear(x, self.input_weight, self.bias + self.forget_bias)  # (B, T, 4H)
        h, c = state
        w_rec, w_proj = self.recurrent_weight.t(), self.projection_weight.t()
        outputs = []
        steps_mask = mask.unsqueeze(-1).unbind(1) if mask is not None else [None] * T
        steps_keep = (~reset).unsqueeze(-1).to(x.dtype).unbind(1) if reset is not None else [None] * T  # (B, 1)
        # unbind, not xw[:, t]: indexing makes autograd build a full-size zero gradient per step.
        for xw_t, m_t, keep_t in zip(xw.unbind(1), steps_mask, steps_keep):
            if keep_t is not None:
                h, c = h * keep_t, c * keep_t
            z = torch.addmm(xw_t, h, w_rec)  # (B, 4H)
            i, j, f, o = z.split(H, dim=1)
            c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(j)
            if self.cell_clip is not None:
                c_new = c_new.clamp(-self.cell_clip, self.cell_clip)
            h_new = (torch.sigmoid(o) * torch.tanh(c_new)) @ w_proj  # (B, P)
            if self.proj_clip is not None:
                h_new = h_new.clamp(-self.proj_clip, self.proj_clip)
            if m_t is not None:
                h_new, c_new = torch.where(m_t, h_new, h), torch.where(m_t, c_new, c)
            h, c = h_new, c_new
            outputs.append(h_new)
        return torch.stack(outputs, dim=1), (h, c)

    def _fused(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """torch's fused LSTM; its gate order is i, f, g(=j), o, so rows are permuted and the forget bias folded."""
        H = self.dim
        perm = torch.cat([torch.arange(0, H), torch.arange(2 * H, 3 * H), torch.arange(H, 2 * H),
                          torch.arange(3 * H, 4 * H)]).to(x.device)
        bias = (self.bias + self.forget_bias)[perm]
        params = [self.input_weight[perm], self.recurrent_weight[perm], bias, torch.zeros_like(bias),
                  self.projection_weight]
        h0, c0 = state
        out, h_n, c_n = torch.lstm(x, (h0.unsqueeze(0), c0.unsqueeze(0)), params, True, 1, 0.0, self.training,
                                   False, True)
        return out, (h_n[0], c_n[0])


class LSTMStack(nn.Module):
    """L projected LSTM layers for one direction; residual connection from layer 1 on (spec §5.4).

    Dropout (training only) is applied to each layer's input, inside the residual: ``out_l = cell_l(drop(in)) + in``,
    as bilm-tf's DropoutWrapper inside its ResidualWrapper.
    """

    def __init__(self, config: LSTMConfig, dropout: float = 0.0):
        super().__init__()
        P = config.projection_dim
        self.residual = config.use_skip_connections
        self.layers = nn.ModuleList([
            ProjectedLSTMLayer(P, config.dim, P, config.cell_clip, config.proj_clip) for _ in range(config.n_layers)
        ])
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, states: list[State] | None = None, mask: torch.Tensor | None = None,
                reset: torch.Tensor | None = None) -> tuple[list[torch.Tensor], list[State]]:
        """
        # Parameters
        x : token embeddings, shape `(B, T, P)`.
        states : one `(h, c)` per layer, or None for zeros.
        mask, reset : optional bool `(B, T)`, see `ProjectedLSTMLayer.forward`.

        # Returns
        a list of L outputs of shape `(B, T, P)` and the list of final states.
        """
        outputs, new_states = [], []
        for l, layer in enumerate(self.layers):
            out, st = layer(self.dropout(x), None if states is None else states[l], mask, reset)
            if l > 0 and self.residual:
                out = out + x
            outputs.append(out)
            new_states.append(st)
            x = out
        return outputs, new_states
