"""ScalarMix (the paper's equation 1): ``gamma * sum_k softmax(w)_k * layer_k``, optionally layer-normalising each layer."""
from __future__ import annotations

import torch
from torch import nn

from vocab.errors import ElmoError


class ScalarMix(nn.Module):
    """A learned, softmax-normalised weighted sum of the biLM's L+1 layers, scaled by gamma.

    # Parameters
    n_layers : `int`, the number of layers to mix (L + 1 for a biLM's full output).
    initial_weights : `list[float]`, optional, (default = all 0, i.e. a plain average)
    gamma : `float`, optional, (default = `1.0`)
    layer_norm : `bool`, optional, (default = `False`): normalise each layer over all unmasked elements (mean and
        variance over every unmasked position and feature, no affine parameters) before mixing.
    trainable : `bool`, optional, (default = `True`)
    """

    def __init__(self, n_layers: int, initial_weights: list[float] | None = None, gamma: float = 1.0,
                 layer_norm: bool = False, trainable: bool = True):
        super().__init__()
        if initial_weights is None:
            initial_weights = [0.0] * n_layers
        if len(initial_weights) != n_layers:
            raise ElmoError(f"ScalarMix: {len(initial_weights)} initial weights given for {n_layers} layers")
        self.n_layers, self.layer_norm = n_layers, layer_norm
        self.weights = nn.Parameter(torch.tensor(initial_weights, dtype=torch.float32), requires_grad=trainable)
        self.gamma = nn.Parameter(torch.tensor([gamma], dtype=torch.float32), requires_grad=trainable)

    def forward(self, layers: torch.Tensor | list[torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
        """
        # Parameters
        layers : shape `(L+1, B, T, D)` or a list of L+1 tensors `(B, T, D)` (any leading shape works).
        mask : bool `(B, T)`, needed only with layer_norm (defaults to all positions).

        # Returns
        shape `(B, T, D)`.
        """
        if isinstance(layers, (list, tuple)):
            layers = torch.stack(list(layers))
        if layers.shape[0] != self.n_layers:
            raise ElmoError(f"ScalarMix: got {layers.shape[0]} layers, built for {self.n_layers}")
        s = torch.softmax(self.weights, dim=0).to(layers.dtype)
        if self.layer_norm:
            if mask is None:
                mask = torch.ones(layers.shape[1:-1], dtype=torch.bool, device=layers.device)
            m = mask.unsqueeze(-1).to(layers.dtype)  # (B, T, 1)
            n = m.sum() * layers.shape[-1]
            mean = (layers * m).sum(dim=tuple(range(1, layers.dim())), keepdim=True) / n
            var = (((layers - mean) * m) ** 2).sum(dim=tuple(range(1, layers.dim())), keepdim=True) / n
            layers = (layers - mean) / torch.sqrt(var + 1e-12)
        return self.gamma * torch.einsum("l,l...->...", s, layers)
