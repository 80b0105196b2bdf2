"""The training step's LSTM stacks replayed as CUDA graphs, on by default on a GPU (``training.cuda_graphs``).

Why: a step of the biLM runs each LSTM layer as a loop over the window's time steps, both directions, forward and
backward: over six thousand operations a step, 95% of them in the stacks (`benchmarks.bench_launches`). On a GPU
their launches, not their arithmetic, can set the pace (docs/gpu.md).
`GraphedStacks` captures `BiLM.lm_stacks` (both stacks and the output dropout, everything between the token
encoder and the softmax) once, forward and backward, with `torch.cuda.make_graphed_callables`; every later step
copies its inputs into the captured buffers and replays two graphs. The model is unchanged: the same kernels in
the same order on the same values, so a replayed step gives the eager step's numbers (the GPU's atomic sums
aside). The encoder (a distinct-token step whose size changes with every batch) and the sampled softmax (its
sparse gradients) stay eager around it.

What a capture needs, and the trainer checks before trying (`reason_not`): a CUDA device and states to start
from (the first step of a run has none: it runs eagerly and gives the states, and their dtypes, the graph is
captured with). Under torchrun the graphs hold no collective: the replayed backward hands each LSTM parameter's
gradient to autograd as one node, and DistributedDataParallel's hooks all-reduce it from there, outside the graph
(the partial-network capture of torch's CUDA-graph notes). Dropout's random numbers come from the CUDA
generator inside the graph; the generator's state is put back after the capture's warm-up, so a run stopped and
resumed replays the same masks as one that was not.
"""
from __future__ import annotations

import gc
from typing import Callable

import torch
from torch import nn

from elmo_cli.model.bilm import BiLM
from elmo_cli.model.lstm import State


def reason_not(device: torch.device, enabled: bool) -> str | None:
    """Why the steps will not be captured: None when they will be tried, "" when there is nothing to say (the CPU,
    or --no-cuda-graphs)."""
    if not enabled or device.type != "cuda":
        return ""
    return None


def _flatten(states: tuple[list[State], list[State]]) -> list[torch.Tensor]:
    return [t for direction in states for h, c in direction for t in (h, c)]


def _unflatten(flat, n_layers: int) -> tuple[list[State], list[State]]:
    pairs = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
    return pairs[:n_layers], pairs[n_layers:]


class _FlatStacks(nn.Module):
    """`BiLM.lm_stacks` over flat tensor arguments ``(fwd_x, bwd_x, [starts], h, c, ...)``, as a graph capture
    takes them. Its parameters are the two stacks' (the encoder and softmax are not inputs of the graph)."""

    def __init__(self, bilm: BiLM, with_starts: bool):
        super().__init__()
        self.forward_lstm, self.backward_lstm = bilm.forward_lstm, bilm.backward_lstm
        self.output_dropout = bilm.output_dropout
        self._bilm = [bilm]  # a plain reference: the encoder's and softmax's parameters are not graph inputs
        self.with_starts = with_starts
        self.n_layers = bilm.config.lstm.n_layers

    def forward(self, fwd_x: torch.Tensor, bwd_x: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
        starts, flat = (rest[0], rest[1:]) if self.with_starts else (None, rest)
        f_top, b_top, new = self._bilm[0].lm_stacks(fwd_x, bwd_x, _unflatten(flat, self.n_layers), starts)
        return (f_top, b_top, *_flatten(new))


def _end_failed_capture(device: torch.device) -> None:
    """Leave the CUDA generator as a failed capture found it. A capture that fails leaves torch's generator in
    capture mode, and every later random draw outside a capture, the eager step's dropout, then fails ("Offset
    increment outside graph capture encountered unexpectedly", torch 2.11). A small capture that draws from the
    generator and completes takes it out of that mode; the graph is never replayed, so no draw is used up."""
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            torch.rand(1, device=device)
        del graph
    except Exception:  # noqa: BLE001 - nothing more to do: the eager step's own error will name it
        pass


class GraphedStacks:
    """`BiLM.lm_stacks` (its arguments, its results) replayed from CUDA graphs captured on the given tensors.

    # Parameters
    bilm : the model being trained (in training mode, on the GPU).
    fwd_x, bwd_x : token embeddings `(B, T, P)` of a real step (their shape and dtype are the graph's).
    states : the carried states of that step, `(forward, backward)` lists of `(h (B, P), c (B, H))`.
    starts : bool `(B, T)` or None, as every step of the run will pass it.

    Call it under the autocast the steps use, with autocast's cache off (a capture cannot use it).
    """

    def __init__(self, bilm: BiLM, fwd_x: torch.Tensor, bwd_x: torch.Tensor,
                 states: tuple[list[State], list[State]], starts: torch.Tensor | None, warmup: int = 3):
        self.n_layers = bilm.config.lstm.n_layers
        self.with_starts = starts is not None
        module = _FlatStacks(bilm, self.with_starts).train(bilm.training)
        sample = (fwd_x.detach().clone().requires_grad_(), bwd_x.detach().clone().requires_grad_(),
                  *([starts.clone()] if starts is not None else []), *(t.detach().clone() for t in _flatten(states)))
        device = fwd_x.device
        rng = torch.cuda.get_rng_state(device)
        # Garbage collected during a capture can hold an earlier run's graphs (a trainer is a reference cycle);
        # destroying a graph while another is captured invalidates the capture (seen on an H200, torch 2.11, in
        # `--preset auto`'s probes one after another). So: collect first, and not at all while capturing.
        gc.collect()
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._replay = torch.cuda.make_graphed_callables(module, sample, num_warmup_iters=warmup)
        except Exception:
            _end_failed_capture(device)
            raise
        finally:
            if collecting:
                gc.enable()
            torch.cuda.set_rng_state(rng, device)  # the warm-up's dropout draws are not the run's

    def __call__(self, fwd_x: torch.Tensor, bwd_x: torch.Tensor, states: tuple, starts: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor, tuple[list[State], list[State]]]:
        if (starts is not None) != self.with_starts:
            raise ValueError("the graph was captured with" + ("" if self.with_starts else "out") + " sentence starts")
        out = self._replay(fwd_x, bwd_x, *([starts] if starts is not None else []), *_flatten(states))
        return out[0], out[1], _unflatten(out[2:], self.n_layers)


class StepStacks:
    """What the training step runs `BiLM.lm_stacks` with on a GPU: eagerly while there are no states to capture
    from (a run's first step), then from CUDA graphs (`GraphedStacks`), captured at the first step that has
    them; eagerly again, for the rest of the run, if a capture or a replay fails. `note(text)` is called once when
    the graphs start and once if they fail."""

    def __init__(self, bilm: BiLM, note: Callable[[str], None]):
        self.bilm, self.note = bilm, note
        self.graphed = None
        self.failed = False

    def __call__(self, fwd_x: torch.Tensor, bwd_x: torch.Tensor, states: tuple, starts: torch.Tensor | None):
        if self.failed or states[0] is None:
            return self.bilm.lm_stacks(fwd_x, bwd_x, states, starts)
        try:
            if self.graphed is None:
                self.graphed = GraphedStacks(self.bilm, fwd_x, bwd_x, states, starts)
                self.note("CUDA graphs: the LSTM stacks run as captured graphs from this step")
            return self.graphed(fwd_x, bwd_x, states, starts)
        except Exception as e:  # noqa: BLE001 - any failure of capture or replay: the eager step continues
            self.failed, self.graphed = True, None
            self.note(f"CUDA graphs: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} - the eager "
                      f"step continues (--no-cuda-graphs skips the attempt)")
            return self.bilm.lm_stacks(fwd_x, bwd_x, states, starts)
