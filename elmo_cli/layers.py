"""Which of the biLM's L+1 layers a user gets, and in what form: one `LayerSelection` type.

    LayerSelection.parse("all")                       -> (L+1, n, 2P), every layer as is
    LayerSelection.parse("top")                       -> (n, 2P), the top LSTM layer
    LayerSelection.parse("average")                   -> (n, 2P), the mean of the L+1 layers
    LayerSelection.parse("0,2")                       -> (2, n, 2P), the listed layers (0 = token layer)
    LayerSelection.parse(mix="0.2,0.3,0.5", gamma=1)  -> (n, 2P), gamma * sum_k w_k * layer_k (weights as given)

`dump-embeddings` (`--layers`, `--mix`, `--gamma`, whose help is generated from `MODES_HELP`), the HDF5 writer and
`Embedder.embed_sentences(layers=...)` all take it. Adding a mode means editing this file only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vocab.errors import ElmoError

MODES = {
    "all": "(L+1, n, 2P) every layer",
    "top": "(n, 2P) the top LSTM layer",
    "average": "(n, 2P) the mean of the L+1 layers",
}
MODES_HELP = " | ".join(f"{name} {what}" for name, what in MODES.items()) + \
    " | comma-separated layer indices, e.g. 1,2 (k, n, 2P); 0 is the token layer."


@dataclass(frozen=True)
class LayerSelection:
    """What to keep of a sentence's `(L+1, n, 2P)` layers.

    # Parameters
    mode : ``all``, ``top``, ``average``, ``indices`` or ``mix``.
    indices : the layers kept, with mode ``indices``.
    weights : the L+1 mixing weights, with mode ``mix`` (used as given, not softmax-normalised).
    gamma : the scale of ``mix``.
    """

    mode: str = "all"
    indices: tuple[int, ...] = ()
    weights: tuple[float, ...] = ()
    gamma: float = 1.0

    @classmethod
    def parse(cls, layers: str = "all", mix: str | None = None, gamma: float = 1.0) -> "LayerSelection":
        """From the command line's ``--layers`` and ``--mix W0,W1,..`` (``--mix`` replaces ``--layers``)."""
        if mix is not None:
            if layers != "all":
                raise ElmoError("--mix replaces --layers; give one of them")
            try:
                weights = tuple(float(w) for w in mix.split(","))
            except ValueError:
                raise ElmoError(f"--mix {mix!r}: expected comma-separated numbers, e.g. 0.2,0.3,0.5") from None
            return cls("mix", weights=weights, gamma=gamma)
        if layers in MODES:
            return cls(layers)
        try:
            indices = tuple(int(k) for k in layers.split(","))
        except ValueError:
            raise ElmoError(f"--layers {layers!r}: expected {', '.join(MODES)} or layer indices such as 1,2") \
                from None
        if len(set(indices)) != len(indices) or min(indices) < 0:
            raise ElmoError(f"--layers {layers!r}: layer indices must be distinct and >= 0")
        return cls("indices", indices=indices)

    def check(self, n_layers: int) -> None:
        """ElmoError when the selection does not fit a model with ``n_layers`` (L+1) layers."""
        if self.mode == "mix" and len(self.weights) != n_layers:
            raise ElmoError(f"--mix has {len(self.weights)} weights but this model has {n_layers} layers (L+1)")
        if self.mode == "indices" and max(self.indices) >= n_layers:
            raise ElmoError(f"--layers {','.join(map(str, self.indices))}: this model has layers 0..{n_layers - 1}")

    def shape(self, n_layers: int, n_tokens: int, dim: int) -> tuple[int, ...]:
        """The shape of one sentence's output: ``LayerSelection("all").shape(3, 7, 1024) -> (3, 7, 1024)``."""
        if self.mode == "all":
            return (n_layers, n_tokens, dim)
        if self.mode == "indices":
            return (len(self.indices), n_tokens, dim)
        return (n_tokens, dim)

    def reduce_batch(self, layers: torch.Tensor) -> torch.Tensor:
        """A batch's layers `(L+1, B, T, 2P)` -> `(B, *shape)` with the token axis T, on the layers' device (a
        GPU reduces before its output is copied back: the average is a third of the bytes of ``all``). Sentence
        b's array of `shape` is ``out[b, ..., 1 : n_b + 1, :]`` (`line`)."""
        if self.mode == "mix":
            w = torch.tensor(self.weights, dtype=layers.dtype, device=layers.device)
            return self.gamma * torch.tensordot(w, layers, dims=1)
        if self.mode == "top":
            return layers[-1]
        if self.mode == "average":
            return layers.mean(dim=0)
        if self.mode == "indices":
            return layers[list(self.indices)].transpose(0, 1)
        return layers.transpose(0, 1)

    @staticmethod
    def line(reduced, b: int, n: int):
        """Sentence b's array (its n tokens, the ``<S>`` position dropped) from `reduce_batch`'s output, as a
        numpy array or tensor of `shape`."""
        return reduced[b, ..., 1 : n + 1, :]

    def settings(self) -> dict:
        """What a resumed dump must match."""
        return {"layers": self.mode, "indices": list(self.indices) or None,
                "mix": list(self.weights) if self.mode == "mix" else None,
                "gamma": self.gamma if self.mode == "mix" else None}
