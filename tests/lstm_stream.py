"""bilm-tf's carried LSTM state, computed here independently: bilm-tf's LSTM stack in float64 numpy, straight from the
weights.hdf5 arrays, one batch row's stream of sentences at a time.

What the carried-state modes promise (elmo_cli/dump.py, elmo_cli/evaluate.py): batch row b continues row b of the
previous batch, so in input order sentence i runs in row ``i % batch_size`` and starts from the final states of
sentence ``i - batch_size``, in each direction separately (the backward stack from the state it had after reading
that earlier sentence backwards). Here that is a plain loop over each row's sentences, with no padding and no
batching: what the implementation does with padded batches must come out the same.
"""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

PREFIX = "RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/"

State = tuple[np.ndarray, np.ndarray]  # h (P,), c (H,)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class Float64BiLSTM:
    """Both LSTM stacks of a weights.hdf5, float64. ``options``: the lstm section of options.json."""

    def __init__(self, weights: Path, lstm_options: dict):
        with h5py.File(weights) as f:
            self.arrays = {name: f[name][...].astype(np.float64) for d in (0, 1)
                           for l in range(lstm_options["n_layers"]) for name in
                           (PREFIX.format(d=d, l=l) + k for k in ("W_0", "B", "W_P_0"))}
        self.n_layers = lstm_options["n_layers"]
        self.H, self.P = lstm_options["dim"], lstm_options["projection_dim"]
        self.cell_clip = lstm_options.get("cell_clip") or None
        self.proj_clip = lstm_options.get("proj_clip") or None
        self.residual = lstm_options.get("use_skip_connections", False)

    def zero_states(self) -> list[State]:
        return [(np.zeros(self.P), np.zeros(self.H)) for _ in range(self.n_layers)]

    def run(self, d: int, xs: np.ndarray, states: list[State]) -> tuple[list[np.ndarray], list[State]]:
        """Direction `d` (0 forward, 1 backward) over ``xs (T, P)`` in the given order, from `states` (one ``(h, c)``
        per layer). Returns each layer's outputs ``(T, P)`` and the states after the last step."""
        outputs, new_states, inp = [], [], xs
        for l in range(self.n_layers):
            p = PREFIX.format(d=d, l=l)
            W0, B, WP = self.arrays[p + "W_0"], self.arrays[p + "B"], self.arrays[p + "W_P_0"]
            h, c = states[l]
            out = []
            for x in inp:
                i, j, f, o = np.split(np.concatenate([x, h]) @ W0 + B, 4)
                c = _sigmoid(f + 1.0) * c + _sigmoid(i) * np.tanh(j)
                if self.cell_clip:
                    c = np.clip(c, -self.cell_clip, self.cell_clip)
                h = (_sigmoid(o) * np.tanh(c)) @ WP
                if self.proj_clip:
                    h = np.clip(h, -self.proj_clip, self.proj_clip)
                out.append(h)
            out = np.stack(out) if out else np.zeros((0, self.P))
            if l > 0 and self.residual:
                out = out + inp
            outputs.append(out)
            new_states.append((h, c))
            inp = out
        return outputs, new_states


def row_streams(n: int, batch_size: int) -> list[list[int]]:
    """The sentences each batch row carries state through, in order: row b holds b, b + batch_size, ..."""
    return [list(range(b, n, batch_size)) for b in range(min(batch_size, n))]
