"""The LSTM with projection and clipping of bilm-tf, the residual stack, and the inference kernel.

What lives here: `lstm_cell` (the one cell: the layer's loop, its ``scan`` for export and the kernel all call it),
`ProjectedLSTMLayer` and `LSTMStack` (training, scoring, carried states), `ClippedLSTMFunction` (a training step's
layer on a CPU: the loop with its gradient written by hand), `BiLSTMKernel` (both stacks of a biLM for
stateless inference, the two directions in one batched step loop, weights arranged by `kernel_weights`),
`reverse_padded` (the one reversal of rows within their lengths) and the state helpers. Every recurrence here uses
one gate order, bilm-tf's ``i, j, f, o``.

One step::

    z = [x_t ; h_{t-1}] @ W_0 + B            gates in column order i, j, f, o
    c_t = sigmoid(f + 1) * c_{t-1} + sigmoid(i) * tanh(j),   clipped to [-cell_clip, cell_clip]
    h_t = (sigmoid(o) * tanh(c_t)) @ W_P,                    clipped to [-proj_clip, proj_clip]

The input product of all T steps is one matrix product; only the recurrence runs in the Python loop. Without
clipping and without a mask (training an unclipped model) the layer hands the whole sequence to torch's fused
``torch.lstm`` (proj_size), which computes the same function with torch's own cell. A training step on a CPU runs
the loop as `ClippedLSTMFunction`, whose backward pass is written by hand.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from elmo_cli.config import LSTMConfig

State = tuple[torch.Tensor, torch.Tensor]  # h (B, P), c (B, H)


class Dropout(nn.Dropout):
    """`nn.Dropout` whose mask, on a CPU, is drawn as uniform floats compared with ``p``; elsewhere `nn.Dropout`.

    Why: torch's CPU ``bernoulli_`` draws a (32, 20, 128) mask in about 0.85 ms on 2 threads, ``rand`` in about
    0.27 ms, and a training step of LSTM 512/128 draws six (`benchmarks/bench_step.py`). The same distribution: each
    element kept with probability ``1 - p`` and scaled by ``1 / (1 - p)``; the numbers come from the same generator,
    so a seeded run is reproducible and a resumed one exact. On a GPU `nn.Dropout`'s kernel runs as before (and in
    the captured CUDA graphs).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0 or self.p == 1.0 or x.device.type != "cpu":
            return super().forward(x)
        # float32 draws whatever x's dtype: bf16's 8-bit mantissa would round p
        keep = torch.rand(x.shape, device=x.device) >= self.p
        return x * keep.to(x.dtype).mul_(1.0 / (1.0 - self.p))


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each row's first `lengths[b]` steps, leaving the padding in place.

    ``x`` shape `(B, T, ...)`, ``lengths`` `(B,)`. Applying it twice is the identity.
    """
    B, T = x.shape[:2]
    idx = reversed_positions(lengths.to(x.device), T)  # (B, T)
    return x.gather(1, idx.view(B, T, *([1] * (x.dim() - 2))).expand_as(x))


def reversed_positions(lengths: torch.Tensor, T: int) -> torch.Tensor:
    """``(B, T)``: position t of row b read backwards, ``lengths[b] - 1 - t`` inside the row, t in the padding."""
    t = torch.arange(T, device=lengths.device).unsqueeze(0)  # (1, T)
    L = lengths.unsqueeze(1)  # (B, 1)
    return torch.where(t < L, L - 1 - t, t)


def fit_states(states: list[State] | None, batch_size: int) -> list[State] | None:
    """Carried per-layer states resized to `batch_size` rows: row b continues row b, a shorter batch drops the
    last rows, a longer one starts its extra rows from zero."""
    def fit(t: torch.Tensor) -> torch.Tensor:
        if t.shape[0] >= batch_size:
            return t[:batch_size]
        return torch.cat([t, t.new_zeros(batch_size - t.shape[0], *t.shape[1:])])

    return None if states is None else [(fit(h), fit(c)) for h, c in states]


def zero_states(stacks: tuple["LSTMStack", "LSTMStack"], batch_size: int, device: torch.device) -> tuple:
    """All-zero `(forward, backward)` states for two stacks, the start of the carried-state mode."""
    return tuple([layer.zero_state(batch_size, device) for layer in stack.layers] for stack in stacks)


def fit_both(states: tuple, batch_size: int) -> tuple:
    """`fit_states` applied to both directions of carried `(forward, backward)` states."""
    return tuple(fit_states(direction, batch_size) for direction in states)


def autocast_once(device_type: str, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`weights` cast to autocast's dtype when autocast is on for `device_type` (else as given), once, before a time
    loop uses them at every step. Autocast caches its casts of leaf parameters only; the loop's transposed views
    are not leaves, so each step's product would cast them again, and its backward cast their gradients back: for
    a window of T steps, 2T copies of every recurrent and projection weight instead of 2. The T gradients are then
    summed in autocast's dtype before their one cast back, as autocast's own cache does for a reused parameter."""
    if not torch.is_autocast_enabled(device_type):
        return weights
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(w.to(dtype) for w in weights)


def lstm_cell(z: torch.Tensor, c: torch.Tensor | None, w_proj: torch.Tensor, cell_clip: float | None,
              proj_clip: float | None, fast: bool = False, mm=torch.matmul) -> State:
    """One step of the module docstring from its gate pre-activations: the one cell of this module, used by the
    layer's loop (`ProjectedLSTMLayer.step`), its ``scan`` (export) and `BiLSTMKernel`.

    # Parameters
    z : ``x_t @ W_in + h_{t-1} @ W_rec + B`` with the forget bias folded in, the four gates ``i, j, f, o`` along
        axis -3, shape `(..., 4, n, H)`.
    c : the previous cell `(..., n, H)`, or None for the zero state (then ``c_t = sigmoid(i) * tanh(j)``).
    w_proj : the projection `(..., H, P)`, ``projection_weight.t()``.
    fast : the kernel's arithmetic: ``z``'s ``j`` block stored doubled, tanh computed as ``2 * sigmoid(2x) - 1``,
        ``z`` overwritten and ``c`` updated in place (no autograd). False: out of place, torch's tanh.
    mm : the projection's product (the kernel passes its compute-dtype product).

    # Returns
    ``(h (..., n, P), c (..., n, H))``, both clipped when the clips are set.
    """
    if fast:
        i, j, f, o = z.sigmoid_().unbind(-3)
        j.mul_(2).sub_(1)  # tanh(j) from the doubled j
        c = i.mul_(j) if c is None else c.mul_(f).addcmul_(i, j)
        if cell_clip is not None:
            c.clamp_(-cell_clip, cell_clip)
        h = mm(torch.mul(c, 2).sigmoid_().mul_(2).sub_(1).mul_(o), w_proj)  # (o * tanh(c)) @ W_P
        return (h.clamp_(-proj_clip, proj_clip) if proj_clip is not None else h), c
    i, j, f, o = z.unbind(-3)
    c = torch.sigmoid(i) * torch.tanh(j) if c is None else torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(j)
    if cell_clip is not None:
        c = c.clamp(-cell_clip, cell_clip)
    h = mm(torch.sigmoid(o) * torch.tanh(c), w_proj)
    return (h.clamp(-proj_clip, proj_clip) if proj_clip is not None else h), c


class ClippedLSTMFunction(torch.autograd.Function):
    """A layer's whole time loop, input product included, in `lstm_cell`'s arithmetic with the state zeroed where a
    sentence starts, and with its gradient written by hand: the training step's LSTM on a CPU and on a GPU
    (`ProjectedLSTMLayer.forward`, `ProjectedLSTMLayer.by_hand`).

    Why: autograd records each step's dozen operations and replays them backwards one by one, and each step's
    backward makes its own small weight-gradient products, 32 rows deep. Here the backward pass runs seven
    operations a step (two products and five elementwise); what does not depend on the gradient through time is
    computed for all T steps at once before the loop, and the weight gradients of all T steps are products after
    it, ``T * B`` rows deep. The forward computes the loop's function with the loop's operations, time-major; the
    gradients agree with autograd's over the loop to rounding (`tests/test_lstm.py`).

    On a GPU (`cells` given, `GpuCells`) each step is four kernels forward and four backward: two products and
    two elementwise functions, which `elmo_cli.compiled.fuse_gpu_cells` compiles into one kernel each (a launch,
    not arithmetic, is what a GPU waits on here: docs/gpu.md). There the products run in `compute_dtype` (bf16
    under ``train --dtype bf16``'s autocast, the function turning autocast off and casting its weights once a
    window) while the gates, cells and states stay float32.

    # Parameters
    x : the layer's input `(B, T, D)`.
    w_in : ``input_weight`` `(4H, D)`; bias : the gate bias with the forget bias folded in, `(4H,)`.
    h0, c0 : the state, `(B, P)` and `(B, H)`.
    w_rec : ``recurrent_weight`` `(4H, P)`; w_proj : ``projection_weight`` `(P, H)`.
    keep : None, or `(B, T)` floats: 0 where the state is zeroed before the step (a sentence starts there), else 1.
    cell_clip, proj_clip : the clips, or None.
    compute_dtype : the products' dtype with `cells` (None: float32); cells : None (the CPU loop) or `GpuCells`.

    # Returns
    outputs `(B, T, P)`, the final ``h (B, P)`` and ``c (B, H)`` (float32 with `cells`).
    """

    @staticmethod
    def forward(ctx, x, w_in, bias, h0, c0, w_rec, w_proj, keep, cell_clip, proj_clip, compute_dtype=None,
                cells=None):
        if cells is None:
            out, h, c, saved = _loop_forward(x, w_in, bias, h0, c0, w_rec, w_proj, keep, cell_clip, proj_clip)
        else:
            with torch.autocast(x.device.type, enabled=False):
                cd = compute_dtype or (torch.float64 if x.dtype == torch.float64 else torch.float32)
                out, h, c, saved = _cells_forward(x, w_in, bias, h0, c0, w_rec, w_proj, keep, cell_clip, proj_clip,
                                                  cd, cells)
        ctx.save_for_backward(w_in, w_rec, w_proj, *saved)
        ctx.clips = cell_clip, proj_clip
        ctx.cells = cells
        ctx.dtypes = x.dtype, h0.dtype, c0.dtype
        return out, h, c

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out, d_h, d_c):
        w_in, w_rec, w_proj, *saved = ctx.saved_tensors
        grads = _loop_backward(d_out, d_h, d_c, w_in, w_rec, w_proj, saved, *ctx.clips, ctx.needs_input_grad[0],
                               ctx.cells)
        if ctx.cells is not None:  # each gradient in its input's dtype (the products ran in the compute dtype)
            dtypes = (ctx.dtypes[0], w_in.dtype, w_in.dtype, ctx.dtypes[1], ctx.dtypes[2], w_rec.dtype, w_proj.dtype)
            grads = tuple(None if g is None else g.to(d) for g, d in zip(grads, dtypes))
        return (*grads, None, None, None, None, None)


def _loop_forward(x, w_in, bias, h0, c0, w_rec, w_proj, keep, cell_clip, proj_clip):
    """`ClippedLSTMFunction`'s forward (its arguments): outputs `(B, T, P)`, the final ``h``, ``c`` and what the
    backward pass reads, time-major: the input rows `(T * B, D)`, keep `(T, B, 1)` or None, the gates after their
    activations `(T, B, 4, H)`, each step's input cell `(T, B, H)` and output `(T, B, P)` after the reset, its
    cell before the clip, tanh of the clipped cell and ``o * tanh(c)`` `(T, B, H)`, its projection before the
    clip `(T, B, P)`."""
    B, T, D = x.shape
    G, P = w_in.shape[0], w_proj.shape[0]
    H = G // 4
    x_tm = x.transpose(0, 1).reshape(T * B, D)  # time-major rows
    # the input product of every step; each step then adds its recurrent product and, in place, makes its
    # gates sigmoid(i), tanh(j), sigmoid(f), sigmoid(o)
    acts = torch.addmm(bias, x_tm, w_in.t()).view(T, B, 4, H)
    keep_tm = None if keep is None else keep.t().unsqueeze(-1)  # (T, B, 1)
    # c_in, h_in: each step's state after the reset; c_raw, h_raw: the new cell and projection before their
    # clips; m: o * tanh(c)
    c_in, h_in, c_raw, tanh_c, m, h_raw, out = [x.new_empty(T, B, n) for n in (H, P, H, H, H, P, P)]
    w_rec_t, w_proj_t = w_rec.t(), w_proj.t()
    h, c = h0, c0
    for t in range(T):
        if keep_tm is not None:
            h, c = torch.mul(h, keep_tm[t], out=h_in[t]), torch.mul(c, keep_tm[t], out=c_in[t])
        else:
            h_in[t].copy_(h)
            c_in[t].copy_(c)
        z = acts[t].view(B, G).addmm_(h, w_rec_t).view(B, 4, H)
        i, j, f, o = z.unbind(1)
        i.sigmoid_(), j.tanh_(), f.sigmoid_(), o.sigmoid_()
        c = torch.mul(f, c, out=c_raw[t]).add_(i * j)
        if cell_clip is not None:
            c = c.clamp(-cell_clip, cell_clip)
        h = torch.mm(torch.mul(o, torch.tanh(c, out=tanh_c[t]), out=m[t]), w_proj_t, out=h_raw[t])
        h = torch.clamp(h, -proj_clip, proj_clip, out=out[t]) if proj_clip is not None else out[t].copy_(h)
    return out.transpose(0, 1).contiguous(), h.clone(), c.clone(), (x_tm, keep_tm, acts, c_in, h_in, c_raw,
                                                                      tanh_c, m, h_raw)


def _loop_backward(d_out, d_h, d_c, w_in, w_rec, w_proj, saved, cell_clip, proj_clip, need_x, cells=None):
    """`ClippedLSTMFunction`'s backward: from the gradients at the outputs `(B, T, P)` and the final ``h``, ``c``
    (each may be None), the gradients of ``x`` (None unless `need_x`), ``w_in``, ``bias``, ``h0``, ``c0``,
    ``w_rec`` and ``w_proj``; `saved` as `_loop_forward` (or, with `cells`, `_cells_forward`) returned it."""
    x_tm, keep_tm, acts, c_in, h_in, c_raw, tanh_c, m, h_raw = saved
    T, B, _, H = acts.shape
    G, P = 4 * H, w_proj.shape[0]
    i, j, f, o = acts.unbind(2)  # (T, B, H) each
    one = acts.new_ones(())
    # What does not depend on the gradient through time, for all T steps at once. With u the gradient at a
    # step's (clipped) cell and dm at its o * tanh(c), the gate pre-activations' gradients are u * F[:, :, k]
    # for i, j, f (k = 0, 1, 2) and dm * F[:, :, 3] for o.
    F_ = torch.empty_like(acts)
    torch.addcmul(i, i, i, value=-1, out=F_[:, :, 0]).mul_(j)  # i (1 - i) j
    torch.addcmul(one, j, j, value=-1, out=F_[:, :, 1]).mul_(i)  # (1 - j^2) i
    fo = acts[:, :, 2:]
    torch.addcmul(fo, fo, fo, value=-1, out=F_[:, :, 2:])  # f and o: s (1 - s)
    F_[:, :, 2].mul_(c_in)
    F_[:, :, 3].mul_(tanh_c)
    f_back = f  # the cell's gradient to the step before: through f, the cell clip and the reset
    if cell_clip is not None:
        c_pass = c_raw.abs().le_(cell_clip)  # 1 where the clip let the cell through (clamp's gradient)
        F_[:, :, :3].mul_(c_pass.unsqueeze(2))
        f_back = f * c_pass
    if keep_tm is not None:
        f_back = f_back * keep_tm
    E = torch.addcmul(one, tanh_c, tanh_c, value=-1).mul_(o)  # from o * tanh(c) to c
    # h_back[t]: from the input state of step t + 1 to the projection of step t (its reset, then its clip)
    g_out = d_out.transpose(0, 1).to(acts.dtype) if d_out is not None else acts.new_zeros(T, B, P)
    h_back = None if keep_tm is None else torch.cat([keep_tm[1:], keep_tm.new_ones(1, B, 1)])
    if proj_clip is not None:
        h_pass = h_raw.abs().le_(proj_clip)
        g_out = g_out * h_pass
        h_back = h_pass if h_back is None else h_pass.mul_(h_back)
    u = d_c if d_c is not None else acts.new_zeros(B, H)
    carry = None if d_h is None else (d_h * h_back[T - 1] if proj_clip is not None else d_h)
    if cells is not None:
        return _cells_backward(g_out, carry, u, F_, E, f_back, h_back, w_in, w_rec, w_proj, saved, need_x, cells)
    g_h = acts.new_empty(T, B, P)  # the gradient at each step's projection (before its clip)
    d_z = acts.new_empty(T, B, 4, H)  # ... at each step's gate pre-activations
    for t in range(T - 1, -1, -1):
        g = torch.add(g_out[t], carry, out=g_h[t]) if carry is not None else g_h[t].copy_(g_out[t])
        dm = torch.mm(g, w_proj)  # (B, H)
        u = torch.addcmul(u, dm, E[t])
        torch.mul(u.unsqueeze(1), F_[t, :, :3], out=d_z[t, :, :3])
        torch.mul(dm, F_[t, :, 3], out=d_z[t, :, 3])
        dh_in = torch.mm(d_z[t].view(B, G), w_rec)  # (B, P), at step t's input state
        u = u * f_back[t]
        if t > 0:
            carry = dh_in * h_back[t - 1] if h_back is not None else dh_in
    d_z2 = d_z.view(T * B, G)
    d_x = torch.mm(d_z2, w_in).view(T, B, -1).transpose(0, 1) if need_x else None
    d_w_in = torch.mm(d_z2.t(), x_tm)
    d_bias = d_z2.sum(0)
    d_w_rec = torch.mm(d_z2.t(), h_in.view(T * B, P))
    d_w_proj = torch.mm(g_h.view(T * B, P).t(), m.view(T * B, H))
    d_h0 = dh_in * keep_tm[0] if keep_tm is not None else dh_in
    return d_x, d_w_in, d_bias, d_h0, u, d_w_rec, d_w_proj



def cell_forward(xw_t, rec, c, keep_t, cell_clip: float | None, m_dtype: torch.dtype):
    """A step's elementwise work after its recurrent product, in ``xw_t``'s dtype (`_cells_forward`).

    # Parameters
    xw_t : the input product with the bias `(B, 4H)`; rec : ``h_in @ W_rec`` `(B, 4H)`, in the compute dtype.
    c : the cell before the reset `(B, H)`; keep_t : `(B, 1)` (0 where a sentence starts) or None.
    m_dtype : the dtype of ``o * tanh(c)``, the projection's operand.

    # Returns
    the gates after their activations `(B, 4, H)`, the cell after the reset, before and after its clip, tanh of
    the clipped cell `(B, H)` each, and ``o * tanh(c)`` `(B, H)` in `m_dtype`.
    """
    c_in = c * keep_t if keep_t is not None else c
    z = (xw_t + rec.to(xw_t.dtype)).view(xw_t.shape[0], 4, -1)
    i, j, f, o = torch.sigmoid(z[:, 0]), torch.tanh(z[:, 1]), torch.sigmoid(z[:, 2]), torch.sigmoid(z[:, 3])
    c_raw = f * c_in + i * j
    c_new = c_raw.clamp(-cell_clip, cell_clip) if cell_clip is not None else c_raw
    tanh_c = torch.tanh(c_new)
    return torch.stack([i, j, f, o], 1), c_in, c_raw, c_new, tanh_c, (o * tanh_c).to(m_dtype)


def cell_project(h_raw, keep_next, proj_clip: float | None, h_dtype: torch.dtype, out_dtype: torch.dtype):
    """A step's projection `(B, P)` clipped (the step's output, in `out_dtype`) and, reset for the next step
    (``keep_next`` `(B, 1)` or None), the next step's input state in `h_dtype`."""
    out = h_raw.to(out_dtype)
    out = out.clamp(-proj_clip, proj_clip) if proj_clip is not None else out
    return out, (out * keep_next if keep_next is not None else out).to(h_dtype)


def cell_backward(dm, u, E_t, F_t, f_back_t, d_dtype: torch.dtype):
    """A step's elementwise gradient (`_cells_backward`): from the gradient ``dm`` `(B, H)` at ``o * tanh(c)`` and
    ``u`` `(B, H)` at the clipped cell from the steps after, the gate pre-activations' gradient `(B, 4, H)` in
    `d_dtype` and the cell gradient carried to the step before (in ``u``'s dtype)."""
    dm = dm.to(u.dtype)
    u = u + dm * E_t
    d_z = torch.cat([u.unsqueeze(1) * F_t[:, :3], (dm * F_t[:, 3]).unsqueeze(1)], 1)
    return d_z.to(d_dtype), u * f_back_t


def cell_carry(g_out_t, dh_in, h_back_t, g_dtype: torch.dtype):
    """The gradient at step t's projection `(B, P)` in `g_dtype`: the outputs' own plus the next step's gradient
    at its input state ``dh_in`` through the reset and the clip (``h_back_t`` `(B, 1 or P)`, or None)."""
    carried = dh_in.to(g_out_t.dtype)
    carried = carried * h_back_t if h_back_t is not None else carried
    return (g_out_t + carried).to(g_dtype)


class GpuCells:
    """The four elementwise functions of `ClippedLSTMFunction`'s loop on a GPU, eager as written here;
    `elmo_cli.compiled.fuse_gpu_cells` gives their compiled twins (one kernel each)."""

    forward = staticmethod(cell_forward)
    project = staticmethod(cell_project)
    backward = staticmethod(cell_backward)
    carry = staticmethod(cell_carry)


# What `ClippedLSTMFunction` runs a GPU step's elementwise work with: `GpuCells`, or the compiled twins that
# `elmo_cli.compiled.fuse_gpu_cells` puts here.
GPU_CELLS = GpuCells


def _cells_forward(x, w_in, bias, h0, c0, w_rec, w_proj, keep, cell_clip, proj_clip, cd, cells):
    """`_loop_forward` with the step's elementwise work in `cells` and the products in dtype `cd`: per step the
    recurrent product, ``cells.forward``, the projection, ``cells.project``. Returns what `_loop_forward` does;
    the gates, cells and states float32 (float64 for a float64 `x`), the products' operands (``h_in``, ``m``) and
    ``h_raw`` in `cd`."""
    B, T, D = x.shape
    sd = torch.float64 if x.dtype == torch.float64 else torch.float32  # the states' dtype
    x_tm = x.transpose(0, 1).reshape(T * B, D).to(cd)
    if cd == sd:
        xw = torch.addmm(bias.to(sd), x_tm, w_in.to(sd).t())
    else:
        xw = torch.mm(x_tm, w_in.to(cd).t()).to(sd).add_(bias.to(sd))
    xw = xw.view(T, B, -1)
    w_rec_t, w_proj_t = w_rec.to(cd).t(), w_proj.to(cd).t()
    keep_tm = None if keep is None else keep.t().unsqueeze(-1).to(sd)  # (T, B, 1)
    h = h0.to(sd)
    h_in = (h * keep_tm[0] if keep_tm is not None else h).to(cd)
    c = c0.to(sd)
    saved = [[] for _ in range(8)]  # acts, c_in, h_in, c_raw, tanh_c, m, h_raw, out
    for t in range(T):
        acts, c_in, c_raw, c, tanh_c, m = cells.forward(xw[t], torch.mm(h_in, w_rec_t), c,
                                                        None if keep_tm is None else keep_tm[t], cell_clip, cd)
        h_raw = torch.mm(m, w_proj_t)
        keep_next = None if keep_tm is None or t + 1 == T else keep_tm[t + 1]
        out_t, h_next = cells.project(h_raw, keep_next, proj_clip, cd, sd)
        for k, v in enumerate((acts, c_in, h_in, c_raw, tanh_c, m, h_raw, out_t)):
            saved[k].append(v)
        h_in = h_next
    acts, c_in, h_in, c_raw, tanh_c, m, h_raw, out = (torch.stack(v) for v in saved)
    return (out.transpose(0, 1).contiguous(), out[-1].clone(), c.clone(),
            (x_tm, keep_tm, acts, c_in, h_in, c_raw, tanh_c, m, h_raw))


def _cells_backward(g_out, carry, u, F_, E, f_back, h_back, w_in, w_rec, w_proj, saved, need_x, cells):
    """`_loop_backward`'s loop and weight gradients with `cells` (its terms computed by `_loop_backward`): per step
    the product to ``dm``, ``cells.backward``, the product to the input state, ``cells.carry``."""
    x_tm, keep_tm, acts, c_in, h_in, c_raw, tanh_c, m, h_raw = saved
    T, B, _, H = acts.shape
    cd = h_in.dtype
    w_rec_c, w_proj_c = w_rec.to(cd), w_proj.to(cd)
    g = cells.carry(g_out[T - 1], carry, None, cd) if carry is not None else g_out[T - 1].to(cd)
    g_h, d_z = [None] * T, [None] * T
    for t in range(T - 1, -1, -1):
        g_h[t] = g
        d_z[t], u = cells.backward(torch.mm(g, w_proj_c), u, E[t], F_[t], f_back[t], cd)
        dh_in = torch.mm(d_z[t].view(B, 4 * H), w_rec_c)  # (B, P), at step t's input state
        if t > 0:
            g = cells.carry(g_out[t - 1], dh_in, None if h_back is None else h_back[t - 1], cd)
    d_z2 = torch.stack(d_z).view(T * B, 4 * H)
    g_h2 = torch.stack(g_h).view(T * B, -1)
    d_x = torch.mm(d_z2, w_in.to(cd)).view(T, B, -1).transpose(0, 1) if need_x else None
    d_w_in = torch.mm(d_z2.t(), x_tm)
    d_bias = d_z2.sum(0, dtype=acts.dtype)
    d_w_rec = torch.mm(d_z2.t(), h_in.view(T * B, -1))
    d_w_proj = torch.mm(g_h2.t(), m.view(T * B, H))
    d_h0 = dh_in.to(acts.dtype) * keep_tm[0] if keep_tm is not None else dh_in
    return d_x, d_w_in, d_bias, d_h0, u, d_w_rec, d_w_proj

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
        # The forget bias of +1 is added at run time and never baked into `bias` (docs/formats.md, weights.hdf5).
        forget = torch.zeros(4 * dim)
        forget[2 * dim : 3 * dim] = 1.0
        self.register_buffer("forget_bias", forget, persistent=False)
        self.hand_gradient = True  # training on a CPU runs `ClippedLSTMFunction`; False: autograd over the loop

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
        h, c = state
        if self.by_hand(x, mask):
            keep = None if reset is None else (~reset).to(x.dtype)
            cells, dtype = None, None
            if x.device.type != "cpu":
                cells = GPU_CELLS
                if torch.is_autocast_enabled(x.device.type):
                    dtype = torch.get_autocast_dtype(x.device.type)
            out, h, c = ClippedLSTMFunction.apply(x, self.input_weight, self.gate_bias, h, c, self.recurrent_weight,
                                                  self.projection_weight, keep, self.cell_clip, self.proj_clip,
                                                  dtype, cells)
            return out, (h, c)
        xw = self.input_product(x)  # (B, T, 4H)
        w_rec, w_proj = autocast_once(x.device.type, self.recurrent_weight.t(), self.projection_weight.t())
        outputs = []
        steps_mask = mask.unsqueeze(-1).unbind(1) if mask is not None else [None] * T
        steps_keep = (~reset).unsqueeze(-1).to(x.dtype).unbind(1) if reset is not None else [None] * T  # (B, 1)
        # unbind, not xw[:, t]: indexing makes autograd build a full-size zero gradient per step.
        for xw_t, m_t, keep_t in zip(xw.unbind(1), steps_mask, steps_keep):
            if keep_t is not None:
                h, c = h * keep_t, c * keep_t
            h_new, c_new = self.step(xw_t, h, c, w_rec, w_proj)
            if m_t is not None:
                h_new, c_new = torch.where(m_t, h_new, h), torch.where(m_t, c_new, c)
            h, c = h_new, c_new
            outputs.append(h_new)
        return torch.stack(outputs, dim=1), (h, c)

    def by_hand(self, x: torch.Tensor, mask: torch.Tensor | None) -> bool:
        """Whether `forward`'s loop runs as `ClippedLSTMFunction`: in a training step (not compiled, no mask) on a
        CPU without autocast, or on a CUDA GPU with or without it (there with `GPU_CELLS`), unless `hand_gradient`
        is off (`elmo_cli.compiled` turns it off for its compiled CPU loops)."""
        if not (self.hand_gradient and mask is None and self.training and torch.is_grad_enabled()
                and not torch.compiler.is_compiling()):
            return False
        if x.device.type == "cpu":
            return not torch.is_autocast_enabled("cpu")
        return x.device.type == "cuda"

    def input_product(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W_in + B`` plus the forget bias, every step at once: `(..., D)` -> `(..., 4H)`."""
        return F.linear(x, self.input_weight, self.gate_bias)

    @property
    def gate_bias(self) -> torch.Tensor:
        """``B`` with the forget bias of +1 folded in, `(4H,)` in gate order ``i, j, f, o``."""
        return self.bias + self.forget_bias

    def step(self, xw_t: torch.Tensor, h: torch.Tensor, c: torch.Tensor, w_rec: torch.Tensor,
             w_proj: torch.Tensor) -> State:
        """One step (`lstm_cell`) from its input product ``xw_t (B, 4H)`` and state ``h (B, P)``, ``c (B, H)``, with
        ``w_rec = recurrent_weight.t()`` `(P, 4H)` and ``w_proj = projection_weight.t()`` `(H, P)`.

        # Returns
        the new ``(h (B, P), c (B, H))``.
        """
        z = torch.addmm(xw_t, h, w_rec)  # (B, 4H)
        h_new, c_new = lstm_cell(z.view(-1, 4, 1, self.dim), c.unsqueeze(1), w_proj, self.cell_clip, self.proj_clip)
        return h_new.squeeze(1), c_new.squeeze(1)

    def forward_scan(self, x: torch.Tensor) -> torch.Tensor:
        """The layer from zero state as one graph-level loop (torch's ``scan`` higher-order op), so that
        `torch.export` and the ONNX exporter keep the time axis dynamic (an ONNX ``Scan``) instead of unrolling
        the Python loop of `forward` at the example's length. Same function as ``forward(x)[0]``.

        # Parameters
        x : shape `(B, T, D)`; steps after a row's end only change that row's outputs after its end.

        # Returns
        outputs `(B, T, P)`.
        """
        from torch._higher_order_ops.scan import scan

        B = x.shape[0]
        xw = self.input_product(x).transpose(0, 1)  # (T, B, 4H)
        w_rec, w_proj = self.recurrent_weight.t(), self.projection_weight.t()

        def combine(state: State, xw_t: torch.Tensor) -> tuple[State, torch.Tensor]:
            h, c = self.step(xw_t, state[0], state[1], w_rec, w_proj)
            return (h, c), h.clone()  # scan's outputs must not alias its carry

        _, out = scan(combine, self.zero_state(B, x.device, x.dtype), xw)  # (T, B, P)
        return out.transpose(0, 1)

    def _fused(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """torch's fused LSTM; its gate order is i, f, g(=j), o, so rows are permuted and the forget bias folded."""
        H = self.dim
        perm = torch.cat([torch.arange(0, H), torch.arange(2 * H, 3 * H), torch.arange(H, 2 * H),
                          torch.arange(3 * H, 4 * H)]).to(x.device)
        bias = self.gate_bias[perm]
        params = [self.input_weight[perm], self.recurrent_weight[perm], bias, torch.zeros_like(bias),
                  self.projection_weight]
        h0, c0 = state
        out, h_n, c_n = torch.lstm(x, (h0.unsqueeze(0), c0.unsqueeze(0)), params, True, 1, 0.0, self.training,
                                   False, True)
        return out, (h_n[0], c_n[0])


class LSTMStack(nn.Module):
    """L projected LSTM layers for one direction; residual connection from layer 1 on (bilm-tf's).

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
        self.dropout = Dropout(dropout)

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


    def forward_scan(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Stateless inference with each layer's `ProjectedLSTMLayer.forward_scan` (a dynamic time axis under
        `torch.export` and ONNX): ``x`` `(B, T, P)` -> L outputs `(B, T, P)`, the residual as in `forward`."""
        outputs = []
        for l, layer in enumerate(self.layers):
            out = layer.forward_scan(x)
            if l > 0 and self.residual:
                out = out + x
            outputs.append(out)
            x = out
        return outputs


def kernel_weights(forward: LSTMStack, backward: LSTMStack, compute_dtype: torch.dtype | None = None) -> list[tuple]:
    """Both stacks' weights arranged for `BiLSTMKernel`, one tuple per layer: gate-major input weights
    `(2, 4, P, H)`, the gate bias `(2, 4, 1, H)` (fp32), recurrent weights `(8, P, H)` (direction-major, then gate)
    and projections `(2, H, P)`; the ``j`` gate's weights and bias doubled (tanh(x) = 2 sigmoid(2x) - 1, exact);
    the products' weights in `compute_dtype` when given."""
    H = forward.layers[0].dim

    def gate_major(w: torch.Tensor) -> torch.Tensor:  # (4H, D) per direction -> (4, D, H)
        return w.view(4, H, -1).transpose(1, 2)

    cast = (lambda t: t.to(compute_dtype)) if compute_dtype is not None else (lambda t: t)
    layers = []
    with torch.no_grad():
        for both in zip(forward.layers, backward.layers):
            w_in = torch.stack([gate_major(l.input_weight) for l in both])  # (2, 4, P, H)
            bias = torch.stack([l.gate_bias.view(4, 1, H) for l in both])  # (2, 4, 1, H)
            w_rec = torch.stack([gate_major(l.recurrent_weight) for l in both])  # (2, 4, P, H)
            for w in (w_in, bias, w_rec):
                w[:, 1] *= 2  # the j gate doubled: tanh(x) = 2 sigmoid(2x) - 1
            layers.append((
                cast(w_in), bias, cast(w_rec.reshape(8, -1, H)),  # (8, P, H)
                cast(torch.stack([l.projection_weight.t() for l in both]).contiguous()),  # (2, H, P)
            ))
    return layers


class BiLSTMKernel:
    """Both LSTM stacks of a biLM for stateless inference, the two directions computed together.

    Exact fp32 (the same function as `LSTMStack` from zero state), arranged for speed:
    - rows sorted by length and time-major, so step t runs only on the rows still inside their sentence (the
      active batch shrinks as sentences end; no step is spent on padding or on a row's final boundary token,
      whose output nothing keeps);
    - gate-major weights: the four gate blocks (``i, j, f, o``, the layer's order) of both directions as one
      batched product of eight ``(P, H)`` matrices per step, and the input product of all steps likewise before
      the loop (for the first layer once per distinct token, then gathered);
    - each step works in place on its slice of the input product;
    - the step from zero state on the shared first token (``<S>`` forwards, ``</S>`` backwards) is computed on one
      row and broadcast, and so is the next step's recurrent product;
    - tanh as ``2 * sigmoid(2x) - 1`` (torch's CPU tanh costs three sigmoids), with the ``j`` gate's weights and
      bias stored doubled (exact: a power of two); this moves results by about 1e-7.
    ``compute_dtype=torch.bfloat16`` runs the matrix products in bf16 (states and elementwise work stay fp32):
    approximate by design, for CPUs with AVX512-BF16/AMX and for GPUs.
    """

    def __init__(self, forward: LSTMStack, backward: LSTMStack, compute_dtype: torch.dtype | None = None):
        first = forward.layers[0]
        self.H = first.dim
        self.residual = forward.residual
        self.cell_clip, self.proj_clip = first.cell_clip, first.proj_clip
        self.dtype = compute_dtype
        self._buffer: torch.Tensor | None = None
        self.layers = kernel_weights(forward, backward, compute_dtype)

    def _workspace(self, numel: int, device: torch.device) -> torch.Tensor:
        """The input products of a batch, `numel` floats, in one buffer kept for the next batch: the largest
        allocation of a batch is made once, not once per layer and batch, so a long dump's resident memory stays
        that of its largest batch (fresh buffers of varying sizes fragment the heap and it grows with the input)."""
        if self._buffer is None or self._buffer.numel() < numel or self._buffer.device != device:
            self._buffer = None
            self._buffer = torch.empty(numel, device=device)
        return self._buffer[:numel]

    def _mm(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``a @ b`` in the compute dtype, the result in fp32 (written into `out` when given)."""
        if self.dtype is None:
            return torch.matmul(a, b, out=out)
        result = torch.matmul(a.to(self.dtype), b).float()
        return result if out is None else out.copy_(result)

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, lengths: torch.Tensor,
                 distinct: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """
        # Parameters
        x : token embeddings `(B, T, P)`, each row ``<S> .. </S>`` then padding; lengths : `(B,)`.
        distinct : optional ``(emb (U, P), idx (B, T))`` with ``x == emb[idx]``: the first layer's input product
            is then computed once per distinct token and gathered (a sentence batch repeats most tokens).

        # Returns
        layers `(L+1, B, T, 2P)` as the stacks give them at positions 1 .. length-2 of each row (undefined
        elsewhere).
        """
        B, T, P = x.shape
        L = len(self.layers)
        order = torch.argsort(lengths, descending=True, stable=True)
        lengths_s = lengths[order]
        x_s = x[order]
        # Rows active at step t (sorted): those whose next input still feeds a kept output, t < length - 1.
        active = (lengths_s.unsqueeze(0) - 1 > torch.arange(T, device=x.device).unsqueeze(1)).sum(1).tolist()
        inp = torch.stack([x_s, reverse_padded(x_s, lengths_s)]).transpose(1, 2).contiguous()  # (2, T, B, P)
        # Every row starts from zero state; when every row also starts with the same token in both directions
        # (``<S>`` forwards, ``</S>`` backwards), the first step's states are the same in all rows at every layer.
        same_start = bool((inp[:, 0] == inp[:, 0, :1]).all())
        idx_tm = None
        if distinct is not None:
            idx_s = distinct[1][order]
            idx_tm = torch.stack([idx_s, reverse_padded(idx_s, lengths_s)]).transpose(1, 2).reshape(2, T * B)
        # Output rows in input order: sorted row r goes to row order[r]; the backward direction's step t of row r
        # is position lengths[r] - 1 - t (padding positions map to themselves and are left undefined).
        result = x.new_empty(L + 1, B, T, 2, P)
        result[0] = x.unsqueeze(2)
        t_idx = torch.arange(T, device=x.device).unsqueeze(0)  # (1, T)
        row = torch.arange(B, device=x.device).unsqueeze(1)
        rev = reversed_positions(lengths_s, T)  # (B, T)
        gather = torch.stack([t_idx * B + row, rev * B + row])  # (2, B, T): step-major source of (row, position)
        xw = self._workspace(2 * 4 * T * B * self.H, x.device).view(2, 4, T * B, self.H)
        for k, (w_in, bias, w_rec, w_proj) in enumerate(self.layers):
            if k == 0 and distinct is not None:
                xw_u = self._mm(distinct[0].unsqueeze(0).unsqueeze(0), w_in).add_(bias)  # (2, 4, U, H)
                for d in range(2):
                    for g in range(4):
                        torch.index_select(xw_u[d, g], 0, idx_tm[d], out=xw[d, g])
                del xw_u
            elif self.dtype is None:  # one product per direction and gate, the bias added by the product
                for d in range(2):
                    for g in range(4):
                        torch.addmm(bias[d, g], inp[d].view(T * B, P), w_in[d, g], out=xw[d, g])
            else:
                self._mm(inp.view(2, 1, T * B, P), w_in, out=xw).add_(bias)
            out = self._recur(xw.view(2, 4, T, B, self.H), w_rec, w_proj, active, same_start)  # (2, T, B, P)
            if self.residual and k > 0:
                out += inp
            flat = out.view(2, T * B, P)
            for d in range(2):
                result[k + 1, order, :, d] = flat[d][gather[d]]
            inp = out
        return result.view(L + 1, B, T, 2 * P)

    def _recur(self, xw: torch.Tensor, w_rec: torch.Tensor, w_proj: torch.Tensor, active: list[int],
               same_start: bool = False) -> torch.Tensor:
        """The step loop over ``xw (2, 4, T, B, H)``, in place on each step's slice (not needed afterwards).
        ``same_start``: every row's first input is the same, so step 0 is computed on one row and broadcast, and
        step 1's recurrent product (of that one state) on one row too.

        # Returns
        outputs `(2, T, B, P)`, zero where a row is not active.
        """
        _, _, T, B, H = xw.shape
        P = w_proj.shape[-1]
        out = xw.new_zeros(2, T, B, P)
        h = xw.new_zeros(2, B, P)
        c = xw.new_zeros(2, B, H)
        start, h_first = 0, None
        if same_start and T > 1 and active[0] > 0:  # from zero state: no recurrent product, c = i * j
            h_first, c1 = self._cell(xw[:, :, 0, :1].clone(), None, w_proj)  # (2, 1, H), (2, 1, P)
            c.copy_(c1.expand(2, B, H))
            out[:, 0, : active[0]] = h_first
            start = 1
        for t in range(start, T):
            n = active[t]
            if n == 0:
                break
            z = xw[:, :, t, :n]  # (2, 4, n, H)
            if h_first is not None and t == 1:  # every row's state is h_first: one row's product, broadcast
                z.view(8, n, H).add_(self._mm(h_first.expand(2, 4, P).reshape(8, 1, P), w_rec))
            else:
                h_rep = h[:, :n].unsqueeze(1).expand(2, 4, n, P).reshape(8, n, P)
                if self.dtype is None:
                    z.view(8, n, H).baddbmm_(h_rep, w_rec)
                else:
                    z.view(8, n, H).add_(self._mm(h_rep, w_rec))
            h, c = self._cell(z, c[:, :n], w_proj)
            out[:, t, :n] = h
        return out

    def _cell(self, z: torch.Tensor, c: torch.Tensor | None, w_proj: torch.Tensor) -> State:
        """`lstm_cell` in the kernel's arithmetic: ``z (2, 4, n, H)`` (j doubled; overwritten), ``c (2, n, H)``
        (updated in place; None for zero) -> ``h (2, n, P)``, ``c``."""
        return lstm_cell(z, c, w_proj, self.cell_clip, self.proj_clip, fast=True, mm=self._mm)
