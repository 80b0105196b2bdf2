"""The projected, clipped LSTM cell of bilm-tf against an independent float64 implementation."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from elmo_cli.model import lstm
from elmo_cli.model.lstm import ClippedLSTMFunction, ProjectedLSTMLayer


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def reference_layer(x, W0, B, WP, cell_clip, proj_clip, h, c):
    """bilm-tf's cell in float64, TensorFlow orientation: z = [x_t ; h] @ W0 + B, gates i, j, f, o, forget bias +1.

    Returns outputs (B, T, P), final h, final c, and every clipped-or-not cell/projection value seen.
    """
    H = WP.shape[0]
    outs, cells, projs = [], [], []
    for t in range(x.shape[1]):
        z = np.concatenate([x[:, t], h], axis=1) @ W0 + B
        i, j, f, o = z[:, :H], z[:, H:2 * H], z[:, 2 * H:3 * H], z[:, 3 * H:]
        c = _sigmoid(f + 1.0) * c + _sigmoid(i) * np.tanh(j)
        if cell_clip:
            c = np.clip(c, -cell_clip, cell_clip)
        h = (_sigmoid(o) * np.tanh(c)) @ WP
        if proj_clip:
            h = np.clip(h, -proj_clip, proj_clip)
        outs.append(h)
        cells.append(c)
        projs.append(h)
    return np.stack(outs, 1), h, c, np.stack(cells), np.stack(projs)


def _layer(D=6, H=10, P=5, cell_clip=None, proj_clip=None, scale=1.0, seed=0) -> ProjectedLSTMLayer:
    torch.manual_seed(seed)
    layer = ProjectedLSTMLayer(D, H, P, cell_clip, proj_clip)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, scale)
    return layer


def _tf_arrays(layer: ProjectedLSTMLayer):
    W0 = torch.cat([layer.input_weight, layer.recurrent_weight], 1).t().double().detach().numpy()
    return W0, layer.bias.double().detach().numpy(), layer.projection_weight.t().double().detach().numpy()


def test_clipped_cell_matches_float64_reference_with_clipping_triggered():
    cell_clip, proj_clip = 0.8, 0.6
    layer = _layer(cell_clip=cell_clip, proj_clip=proj_clip, scale=1.5)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, 6, generator=g)
    h0, c0 = torch.randn(3, 5, generator=g) * 0.3, torch.randn(3, 10, generator=g) * 0.3
    out, (h, c) = layer(x, (h0, c0))
    ref_out, ref_h, ref_c, cells, projs = reference_layer(x.double().numpy(), *_tf_arrays(layer), cell_clip,
                                                          proj_clip, h0.double().numpy(), c0.double().numpy())
    # The test is only meaningful if both clips actually bind somewhere, and not everywhere.
    assert 0 < np.mean(np.abs(cells) == cell_clip) < 0.9
    assert 0 < np.mean(np.abs(projs) == proj_clip) < 0.9
    np.testing.assert_allclose(out.detach().numpy(), ref_out, atol=2e-5)
    np.testing.assert_allclose(h.detach().numpy(), ref_h, atol=2e-5)
    np.testing.assert_allclose(c.detach().numpy(), ref_c, atol=2e-5)


def test_fused_path_equals_loop_without_clipping():
    layer = _layer(scale=0.5)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 6, 6, generator=g, requires_grad=True)
    state = (torch.randn(4, 5, generator=g), torch.randn(4, 10, generator=g))
    out_f, (h_f, c_f) = layer(x, state)  # no clip, no mask: torch.lstm
    (out_f.sum() + h_f.sum() + c_f.sum()).backward()
    grads_f = [p.grad.clone() for p in layer.parameters()] + [x.grad.clone()]
    layer.zero_grad()
    x.grad = None
    out_l, (h_l, c_l) = layer(x, state, mask=torch.ones(4, 6, dtype=torch.bool))  # a mask forces the loop
    (out_l.sum() + h_l.sum() + c_l.sum()).backward()
    grads_l = [p.grad for p in layer.parameters()] + [x.grad]
    torch.testing.assert_close(out_f, out_l, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(c_f, c_l, atol=1e-6, rtol=1e-5)
    for a, b in zip(grads_f, grads_l):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    # and both equal the float64 reference
    ref_out, *_ = reference_layer(x.detach().double().numpy(), *_tf_arrays(layer), None, None,
                                  state[0].double().numpy(), state[1].double().numpy())
    np.testing.assert_allclose(out_f.detach().numpy(), ref_out, atol=2e-6)


def test_mask_carries_state_through_padding():
    layer = _layer(cell_clip=3.0, proj_clip=3.0, scale=0.5)
    x = torch.randn(2, 5, 6)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    _, (h, c) = layer(x, None, mask)
    _, (h3, c3) = layer(x[1:, :3], None)
    torch.testing.assert_close(h[1:], h3)
    torch.testing.assert_close(c[1:], c3)


def test_kernel_equals_plain_loop_on_clipped_models_with_ragged_lengths():
    """`BiLSTMKernel` (gate-major, in place, tanh via sigmoid, shrinking rows) and the layers' plain loop share one
    cell (`lstm_cell`); on random clipped models with ragged lengths they agree within 1e-6."""
    from elmo_cli.config import LSTMConfig
    from elmo_cli.model.lstm import BiLSTMKernel, LSTMStack, reverse_padded

    for seed, (H, P, n_layers) in enumerate([(9, 6, 2), (16, 8, 3), (12, 12, 1)]):
        torch.manual_seed(seed)
        config = LSTMConfig(dim=H, projection_dim=P, n_layers=n_layers, cell_clip=0.7, proj_clip=0.5)
        stacks = LSTMStack(config), LSTMStack(config)
        with torch.no_grad():
            for p in [*stacks[0].parameters(), *stacks[1].parameters()]:
                p.normal_(0.0, 0.5)
        B, T = 5, 9
        lengths = torch.tensor([9, 3, 6, 2, 7])
        x = torch.randn(B, T, P)
        start, end = torch.randn(P), torch.randn(P)
        for b, n in enumerate(lengths.tolist()):
            x[b, 0], x[b, n - 1] = start, end  # <S> .. </S>: the kernel's shared first step is used too
        with torch.no_grad():
            got = BiLSTMKernel(*stacks)(x, lengths)  # (L+1, B, T, 2P)
            mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
            fwd, _ = stacks[0](x, mask=mask)  # a mask forces the plain loop
            bwd, _ = stacks[1](reverse_padded(x, lengths), mask=mask)
        clipped = 0
        for k in range(n_layers):
            want = torch.cat([fwd[k], reverse_padded(bwd[k], lengths)], dim=-1)
            clipped += int((want.abs() == 0.5).sum()) if k == 0 else 0
            for b, n in enumerate(lengths.tolist()):
                torch.testing.assert_close(got[k + 1, b, 1 : n - 1], want[b, 1 : n - 1], atol=1e-6, rtol=0)
        assert clipped > 0  # the projection clip binds somewhere


def test_bf16_autocast_casts_the_recurrent_weights_once_a_window_not_once_a_step(monkeypatch):
    # Training under `--dtype bf16` runs the layer's time loop inside torch.autocast. Autocast caches the casts of
    # leaf parameters only, so the loop's transposed weights used to be cast at each of the T steps (and their
    # gradients cast back at each): 2T copies of the largest tensors of the step. Now 2, with the same forward.
    from torch.utils._python_dispatch import TorchDispatchMode

    from elmo_cli.model import lstm

    class Casts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.shapes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default:
                self.shapes.append(tuple(args[0].shape))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    layer = ProjectedLSTMLayer(16, 32, 8, cell_clip=3.0, proj_clip=3.0)
    x, reset = torch.randn(4, 10, 16), torch.zeros(4, 10, dtype=torch.bool)
    reset[1, 4] = True

    def run():
        layer.zero_grad()
        with Casts() as casts:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out, (h, c) = layer(x, reset=reset)
            (out.float().square().sum() + c.sum()).backward()
        rec, proj = tuple(layer.recurrent_weight.t().shape), tuple(layer.projection_weight.t().shape)
        counts = (casts.shapes.count(rec), casts.shapes.count(proj))
        return out.detach(), [p.grad.clone() for p in layer.parameters()], counts

    out, grads, counts = run()
    assert counts == (2, 2)  # each weight: one cast to bf16 before the loop, its gradient's one cast back
    monkeypatch.setattr(lstm, "autocast_once", lambda device_type, *weights: weights)  # autocast's per-step casts
    per_step_out, per_step_grads, per_step_counts = run()
    assert per_step_counts == (20, 20)
    assert out.dtype == torch.bfloat16 and torch.equal(out, per_step_out)
    for g, ref in zip(grads, per_step_grads):  # the T step gradients summed in bf16 before the one cast back
        assert torch.allclose(g, ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
    # without autocast the weights are not cast
    with Casts() as casts:
        layer(x, reset=reset)[0].sum().backward()
    assert casts.shapes == [tuple(reset.shape)]  # the reset mask's bool -> float, nothing else


def _run_layer(layer, x, state, reset, by_hand: bool):
    """Outputs, final state and every gradient (x, the parameters, the state) of one training-mode call."""
    layer.hand_gradient = by_hand
    layer.zero_grad(set_to_none=True)
    leaves = [x] + ([] if state is None else list(state))
    for t in leaves:
        t.grad = None
    out, (h, c) = layer(x, state, None, reset)
    g = torch.Generator().manual_seed(5)
    # a loss that reads every output, the final h and the final c, with weights that differ by position
    loss = (out * torch.randn(out.shape, generator=g, dtype=out.dtype)).sum() + (h * 0.7).sum() + (c * 0.3).sum()
    loss.backward()
    return [out.detach(), h.detach(), c.detach()] + [t.grad for t in leaves] + [p.grad for p in layer.parameters()]


@pytest.mark.parametrize("clips", [(0.5, 0.3), (3.0, 3.0), (None, 3.0), (3.0, None), (None, None)])
@pytest.mark.parametrize("with_reset", [True, False])
@pytest.mark.parametrize("with_state", [True, False])
def test_the_hand_written_gradient_equals_autograd_over_the_loop(clips, with_reset, with_state, monkeypatch):
    """The training step's layer on a CPU (`ClippedLSTMFunction`) against autograd over the layer's own loop, in
    float64: the same outputs and final state, the same gradients of the input, the state and all four weights."""
    layer = _layer(D=6, H=10, P=5, cell_clip=clips[0], proj_clip=clips[1], scale=0.8).double().train()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 9, 6, generator=g, dtype=torch.float64, requires_grad=True)
    state = None
    if with_state:
        state = tuple(torch.randn(3, n, generator=g, dtype=torch.float64, requires_grad=True) for n in (5, 10))
    reset = None
    if with_reset:
        reset = torch.zeros(3, 9, dtype=torch.bool)
        reset[0, 3] = reset[1, 0] = reset[2, 5] = reset[2, 6] = True
    calls = []
    apply = ClippedLSTMFunction.apply
    monkeypatch.setattr(ClippedLSTMFunction, "apply", lambda *a: calls.append(1) or apply(*a))
    hand = _run_layer(layer, x, state, reset, by_hand=True)
    loop = _run_layer(layer, x, state, reset, by_hand=False)
    # without clips, reset or mask the layer is torch's fused LSTM either way
    assert len(calls) == (0 if clips == (None, None) and not with_reset else 1)
    if clips[0] == 0.5:  # the clips bind: their gradients (zero where clipped) are part of what is checked
        with torch.no_grad():
            cells = [lstm._loop_forward(x, layer.input_weight, layer.gate_bias, *layer.zero_state(3),
                                        layer.recurrent_weight, layer.projection_weight, None, *clips)[3][k]
                     for k in (5, 8)]  # the cells and projections before their clips
        assert 0.05 < (cells[0].abs() > 0.5).double().mean() < 0.95
        assert 0.05 < (cells[1].abs() > 0.3).double().mean() < 0.95
    for a, b in zip(hand, loop):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_the_hand_written_gradient_passes_gradcheck():
    """Against finite differences, not autograd: x, the state, the four weights, with both clips binding."""
    torch.manual_seed(0)
    H, P, D, B, T = 4, 3, 5, 2, 6
    args = [torch.randn(B, T, D), torch.randn(4 * H, D), torch.randn(4 * H), torch.randn(B, P) * 0.5,
            torch.randn(B, H) * 0.5, torch.randn(4 * H, P), torch.randn(P, H)]
    args = [a.double().requires_grad_() for a in args]
    keep = torch.ones(B, T, dtype=torch.float64)
    keep[1, 2] = 0.0

    def f(*a):
        out, h, c = ClippedLSTMFunction.apply(*a, keep, 0.6, 0.4)
        return out, h, c

    out, _, _ = f(*args)
    assert 0 < (out.abs() == 0.4).double().mean() < 0.9  # the projection clip binds somewhere, not everywhere
    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-6)


def test_the_hand_written_gradient_in_float32_at_the_auto_shape():
    """The shape the step trains on a CPU (LSTM 512/128 with bilm-tf's clips, 32 rows, 20 steps): the gradients of
    both paths within float32 rounding of each other."""
    layer = ProjectedLSTMLayer(128, 512, 128, cell_clip=3.0, proj_clip=3.0).train()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(32, 20, 128, generator=g, requires_grad=True)
    state = tuple((torch.randn(32, n, generator=g) * 0.5).requires_grad_() for n in (128, 512))
    reset = torch.rand(32, 20, generator=g) < 0.05
    hand = _run_layer(layer, x, state, reset, by_hand=True)
    loop = _run_layer(layer, x, state, reset, by_hand=False)
    torch.testing.assert_close(hand[0], loop[0], rtol=0, atol=0)  # the forward: the same operations
    for a, b in zip(hand[3:], loop[3:]):
        scale = b.abs().max().item()
        assert (a - b).abs().max().item() <= 1e-5 * scale


def test_the_hand_written_gradient_runs_only_in_a_training_step_on_a_cpu_in_fp32(monkeypatch):
    calls = []
    apply = ClippedLSTMFunction.apply
    monkeypatch.setattr(ClippedLSTMFunction, "apply", lambda *a: calls.append(1) or apply(*a))
    layer = _layer(cell_clip=3.0, proj_clip=3.0).train()
    x = torch.randn(2, 4, 6)
    layer(x)
    assert len(calls) == 1
    with torch.no_grad():
        layer(x)  # validation in training mode
    layer.eval()
    layer(x)
    layer.train()
    layer(x, mask=torch.ones(2, 4, dtype=torch.bool))  # carried states over padding: the loop
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer(x)  # bf16 autocast: the loop, casting its weights once (above)
    layer.hand_gradient = False  # as `elmo_cli.compiled` sets it for its compiled loops
    layer(x)
    assert len(calls) == 1


def _loop_and_gradients(layer, x, state, keep, clips, dtype, cells, loss):
    """`ClippedLSTMFunction` over `layer`'s weights (the given compute dtype and cells), then `loss(out, h, c)`
    backwards: the outputs, the final state, and the gradients of x, the state and the parameters."""
    leaves = [x, *state, *layer.parameters()]
    for t in leaves:
        t.grad = None
    out, h, c = ClippedLSTMFunction.apply(x, layer.input_weight, layer.gate_bias, *state, layer.recurrent_weight,
                                          layer.projection_weight, keep, *clips, dtype, cells)
    loss(out, h, c).backward()
    return [out.detach(), h.detach(), c.detach()] + [t.grad for t in leaves]


@pytest.mark.parametrize("clips", [(0.5, 0.3), (3.0, None), (None, 3.0)])
@pytest.mark.parametrize("with_reset", [True, False])
def test_the_gpu_loop_equals_the_cpu_loop(clips, with_reset):
    """`ClippedLSTMFunction` with `GpuCells` (a GPU's training loop: four kernels a step once compiled) computes the
    CPU loop's outputs, final state and gradients, here on the CPU in float64: the same function to rounding."""
    layer = _layer(D=6, H=10, P=5, cell_clip=clips[0], proj_clip=clips[1], scale=0.8).double().train()
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 9, 6, generator=g, dtype=torch.float64, requires_grad=True)
    state = tuple(torch.randn(3, n, generator=g, dtype=torch.float64, requires_grad=True) for n in (5, 10))
    keep = None
    if with_reset:
        keep = torch.ones(3, 9, dtype=torch.float64)
        keep[0, 3] = keep[1, 0] = keep[2, 5] = keep[2, 6] = 0.0
    def loss(out, h, c):
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=out.dtype)
        return (out * w).sum() + (h * 0.7).sum() + (c * 0.3).sum()

    got = [_loop_and_gradients(layer, x, state, keep, clips, None, cells, loss) for cells in (None, lstm.GpuCells)]
    for a, b in zip(*got):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_the_gpu_loop_in_bf16_keeps_float32_states_and_gradients():
    """With products in bf16 (``train --dtype bf16`` on a GPU) the outputs, states and every gradient come back in
    their inputs' float32, within bf16's rounding of the float32 loop's (largest difference over largest value)."""
    layer = ProjectedLSTMLayer(16, 32, 16, cell_clip=3.0, proj_clip=3.0).train()
    g = torch.Generator().manual_seed(6)
    x = torch.randn(4, 7, 16, generator=g, requires_grad=True)
    state = tuple(torch.randn(4, n, generator=g).requires_grad_() for n in (16, 32))
    keep = (torch.rand(4, 7, generator=g) > 0.2).float()
    got = [_loop_and_gradients(layer, x, state, keep, (3.0, 3.0), dtype, lstm.GpuCells,
                               lambda out, h, c: out.square().sum() + h.sum() + c.sum())
           for dtype in (None, torch.bfloat16)]
    for a, b in zip(*got):
        assert a.dtype == b.dtype == torch.float32
        assert 0 < (a - b).abs().max() <= 2e-2 * b.abs().max()
