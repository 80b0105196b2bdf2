"""The optimizer's half of a GPU training step with nothing for the host to wait on.

Why: on a GPU the host queues work and the GPU runs it; every result the host reads (a loss, the gradient norm,
the size of a sparse gradient) makes it wait until the GPU has caught up, and the GPU then idles while the host
queues the next work. The eager step read such results a dozen times a step (docs/gpu.md). This module holds what
lets the step's second half run without one:

- `summed_rows`: the softmax's gradient as rows of a fixed count, one per id the step gathered (its targets and
  negatives, `SharedSoftmax.row_grads`), summed per distinct id after a sort, where a sparse gradient's
  ``coalesce`` has to read how many distinct ids there are;
- `adagrad_rows_`: Adagrad's sparse update (torch's arithmetic: ``sum += g**2``, ``w -= lr * g / (sqrt(sum) +
  eps)`` on the touched rows) applied from those rows, keeping its state where torch's `Adagrad` keeps it (a
  checkpoint is the same either way);
- `clip_` : the global-norm clip (TF's ``clip_by_global_norm``) with the norm and the scale left on the device.

The step reads its losses and norm once, at its end (`elmo_cli.train._Trainer.step`). Under torchrun, on a GPU or a
CPU, the sparse softmax is always updated this way, from every process's rows (`distributed.all_gather_rows`):
DistributedDataParallel could only all-reduce the whole softmax's gradient.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowGrads:
    """A gathered parameter's gradient, summed per distinct row.

    ids : `(M,)` the gathered ids, sorted; segment : `(M,)` for each, the index of its distinct id (0 .. U-1);
    summed : `(M, ...)` row ``k < U`` is the gradient of the k-th distinct id (all its gathers summed), the rest 0.
    """

    ids: torch.Tensor
    segment: torch.Tensor
    summed: torch.Tensor


def summed_rows(ids: torch.Tensor, grads: torch.Tensor) -> RowGrads:
    """Sum the gradients of rows gathered more than once, in an order fixed by the ids (torch lists
    ``index_add_`` on a GPU and ``index_put_(accumulate=True)`` on a CPU as not deterministic), so that torchrun's
    processes, summing the same gathered rows, make the same update.

    # Parameters
    ids : `(M,)` int64, the rows gathered (any order, repeats allowed); grads : `(M, ...)` each gather's gradient.

    # Returns
    `RowGrads`, all of fixed size M: nothing depends on how many ids are distinct.
    """
    ids, order = ids.sort()
    first = torch.ones_like(ids, dtype=torch.bool)
    first[1:] = ids[1:] != ids[:-1]
    segment = first.long().cumsum(0) - 1  # (M,)
    if grads.is_cuda:  # index_add_'s atomic sums would differ from run to run, and between torchrun's processes
        summed = torch.zeros_like(grads).index_put_((segment,), grads[order], accumulate=True)
    else:  # on a CPU index_add_ is the one that sums in a fixed order
        summed = torch.zeros_like(grads).index_add_(0, segment, grads[order])
    return RowGrads(ids, segment, summed)


def _adagrad_state(optimizer: torch.optim.Adagrad, param: torch.nn.Parameter) -> dict:
    """torch's Adagrad state of `param`, made as torch makes it on its first step."""
    state = optimizer.state[param]
    if len(state) == 0:
        scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
        state["step"] = torch.tensor(0.0, dtype=scalar)
        state["sum"] = torch.full_like(param, optimizer.defaults["initial_accumulator_value"],
                                       memory_format=torch.preserve_format)
    return state


@torch.no_grad()
def adagrad_rows_(optimizer: torch.optim.Adagrad, param: torch.nn.Parameter, rows: RowGrads) -> None:
    """Adagrad's update of the rows of `param` (`(V, ...)`) that `rows` names, as torch's `Adagrad` makes it from
    the equivalent sparse gradient: ``sum[r] += g_r**2``, ``param[r] -= clr * g_r / (sqrt(sum[r]) + eps)``.

    Every gather of an id computes its row's new values from the same summed gradient, so the writes of repeated
    ids are the same values (whichever lands last). The parameter must be in one of `optimizer`'s groups, with no
    weight decay, and hold no gradient of its own (`optimizer.step` then leaves it alone).
    """
    group = next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))
    if group["weight_decay"] or group["maximize"]:
        raise ValueError("adagrad_rows_ takes Adagrad without weight decay or maximize")
    state = _adagrad_state(optimizer, param)
    state["step"] += 1
    clr = group["lr"] / (1 + (float(state["step"]) - 1) * group["lr_decay"])
    g = rows.summed[rows.segment]  # (M, ...) each gather's summed gradient
    total = state["sum"][rows.ids].addcmul_(g, g)  # (M, ...)
    new = param[rows.ids].add_(g / total.sqrt().add_(group["eps"]), alpha=-clr)
    state["sum"][rows.ids] = total
    param[rows.ids] = new


@torch.no_grad()
def clip_(dense: list[torch.Tensor], rows: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients `dense` (whole) and `rows` (`RowGrads.summed`) in place so that their global norm is at
    most `max_norm` (no limit when 0); return the norm before clipping, a 0-d float32 tensor on their device.

    The scale is ``max_norm / max(norm, max_norm)``: 1.0 (every value unchanged) unless the norm is over."""
    grads = dense + rows
    if not grads:
        return torch.zeros(())
    norms = torch._foreach_norm([g if g.dtype == torch.float32 else g.float() for g in grads])
    total = torch.stack(norms).pow(2).sum().sqrt()
    if max_norm > 0:
        torch._foreach_mul_(grads, max_norm / total.clamp(min=max_norm))
    return total
