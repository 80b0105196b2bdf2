"""The LSTM layers' time loops compiled by `torch.compile` on a CPU (``training.compile``, ``train --compile``).

Why: on a CPU a training step of the small shapes is mostly the LSTM layers' 20-step loops, forward and backward,
each step a dozen small elementwise operations around two matrix products. Inductor compiles a layer's whole loop
(`ProjectedLSTMLayer.forward` at the run's fixed batch shape) into C++ kernels that fuse each step's elementwise
work: measured 1.36x the eager step for LSTM 512/128 and 1.16x for 1024/256 on 2 AMD Zen 1 cores
(`python -m benchmarks.bench_compile`, docs/auto.md), after about 2 minutes of compiling in a fresh process. The
model is unchanged; the compiled kernels round differently (training losses within 1.4e-5 of eager over 10 steps).
The compiled loop's gradient is autograd's; the eager step's loop has its gradient written by hand
(`lstm.ClippedLSTMFunction`), which left compiling 1.12x on an Intel Xeon and nothing under AVX2 caps
(`python -m benchmarks.bench_step`).

Only the training step's layers run compiled (in training mode, with gradients): validation, evaluation and
inference stay eager, so their numbers are the eager model's. One compiled function serves every layer and every
model of the process, so `--preset auto`'s probe of the compiled step (`auto.choose`) pays the compilation once and
the run reuses it. It needs a C++ compiler (Inductor's); where there is none, or a compilation fails, the run goes on
with the eager step and says so once (`_Trainer.step`).

What Inductor compiled stays on disk (`use_cache_dir`: the user's cache folder, not torch's default under /tmp, which
a reboot or a tmp cleaner empties), so a later process on the machine compiles the same step from it: the first
call took 104.2 s in a process with an empty cache and 6.3 s in the next one, LSTM 512/128 on 2 AMD Zen 3 cores
(`python -m benchmarks.bench_compile`, docs/auto.md).
"""
from __future__ import annotations

import os
import traceback
import types
from pathlib import Path

import torch
from torch import nn

from elmo_cli.model import lstm
from elmo_cli.model.lstm import ProjectedLSTMLayer

_COMPILED = None  # torch.compile(ProjectedLSTMLayer.forward), made on first use: one cache for the process


def reason_not(device: torch.device, enabled: bool) -> str | None:
    """Why the layers will not be compiled: None when they will, "" when there is nothing to say (not asked, or
    not a CPU), else the note the run prints."""
    if not enabled or device.type != "cpu":
        return ""
    from elmo_cli.machine import cxx_compiler

    if cxx_compiler() is None:
        return "--compile: no C++ compiler found (torch.compile's Inductor needs one: g++ or clang++, or $CXX); " \
               "the eager step runs"
    return None


CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"  # Inductor's own: where it keeps its compiled kernels and graphs


def use_cache_dir(environ=os.environ) -> str | None:
    """Point Inductor's on-disk cache at ``$XDG_CACHE_HOME/elmo-cli/inductor`` (``~/.cache/elmo-cli/inductor``
    without XDG_CACHE_HOME) where `CACHE_VARIABLE` is not set; returns the folder, or None where the user set their
    own or this one cannot be made (then torch's default applies). Read by Inductor at its first compilation."""
    if environ.get(CACHE_VARIABLE):
        return None
    try:
        root = Path(environ["XDG_CACHE_HOME"]) if environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
        folder = root / "elmo-cli" / "inductor"
        folder.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError):  # no home to resolve, or a folder that cannot be made
        return None
    if not os.access(folder, os.W_OK):
        return None
    environ[CACHE_VARIABLE] = str(folder)
    return str(folder)


def _forward(self: ProjectedLSTMLayer, x, state=None, mask=None, reset=None):
    """`ProjectedLSTMLayer.forward`, compiled in a training step (training mode, gradients on), else eager."""
    if self.training and torch.is_grad_enabled():
        return _COMPILED(self, x, state, mask, reset)
    return ProjectedLSTMLayer.forward(self, x, state, mask, reset)


def compile_layers(model: nn.Module) -> None:
    """Run every `ProjectedLSTMLayer` of `model` compiled in its training steps (in place; the parameters and the
    state dict are unchanged)."""
    global _COMPILED
    if _COMPILED is None:
        use_cache_dir()
        _COMPILED = torch.compile(ProjectedLSTMLayer.forward, dynamic=False)
    for layer in model.modules():
        if isinstance(layer, ProjectedLSTMLayer):
            layer.forward = types.MethodType(_forward, layer)
            layer.hand_gradient = False  # autograd over the compiled loop, not `lstm.ClippedLSTMFunction`


def eager_layers(model: nn.Module) -> None:
    """Undo `compile_layers`: every layer of `model` eager again."""
    for layer in model.modules():
        if isinstance(layer, ProjectedLSTMLayer) and "forward" in layer.__dict__:
            del layer.forward
            layer.hand_gradient = True


_MACHINERY = ("torch._dynamo", "torch._inductor", "torch._functorch")


def is_compile_failure(error: BaseException) -> bool:
    """Whether `error` may have come from torch.compile's machinery (Dynamo, AOTAutograd, Inductor, the C++
    compiler): an exception of theirs, or one raised inside their code (a Python that Dynamo does not support raises
    a plain RuntimeError there), anywhere in its chain. An error of the model raised inside compiled code counts
    too; the eager step then raises it again."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if type(error).__module__.startswith(_MACHINERY):
            return True
        frames = traceback.extract_tb(error.__traceback__)
        if any(f"/{m.replace('.', '/')}/" in frame.filename.replace("\\", "/") for frame in frames
               for m in _MACHINERY):
            return True
        error = error.__cause__ or error.__context__
    return False


class FusedGpuCells:
    """`lstm.GpuCells` compiled: each of the four elementwise functions of a GPU step (`lstm.ClippedLSTMFunction`)
    one kernel (Inductor's Triton), instead of about a dozen launches each. Compiled at their first call, outside
    any CUDA-graph capture (the capture's warm-up calls them first); where a compilation fails, every later call
    runs `lstm.GpuCells` (the same function, eager) and `note` is told once."""

    # Compilations each function may need in a process: dtypes (fp32, bf16) x the optional arguments (a reset, the
    # next step's) x shapes (one, then one with dynamic sizes) x runs; Dynamo's default limit is 8.
    RECOMPILES = 64

    def __init__(self, note=None):
        use_cache_dir()
        self.note = note
        self.failed = False
        config = torch._dynamo.config
        for limit in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                      "accumulated_cache_size_limit"):
            if hasattr(config, limit):
                setattr(config, limit, max(getattr(config, limit), self.RECOMPILES))
        self._fns = {name: torch.compile(getattr(lstm.GpuCells, name), fullgraph=True)
                     for name in ("forward", "project", "backward", "carry")}

    def _call(self, name: str, *args):
        if not self.failed:
            try:
                # one global state for every call (forward under the step's autocast, backward outside it, the
                # autocast cache on or off): Dynamo guards on it, and would compile again for each
                with torch.autocast(args[0].device.type, enabled=False, cache_enabled=False):
                    return self._fns[name](*args)
            except Exception as error:  # noqa: BLE001 - any failure of the compiler: the eager cells continue
                if not is_compile_failure(error):
                    raise
                self.failed = True
                text = str(error).strip().splitlines()
                if self.note is not None:
                    self.note(f"fused LSTM cells: torch.compile failed ({type(error).__name__}: "
                              f"{text[0][:160] if text else ''}); the unfused cells run (--no-fuse-lstm skips "
                              f"the attempt)")
        return getattr(lstm.GpuCells, name)(*args)

    def forward(self, *args):
        return self._call("forward", *args)

    def project(self, *args):
        return self._call("project", *args)

    def backward(self, *args):
        return self._call("backward", *args)

    def carry(self, *args):
        return self._call("carry", *args)


def fuse_gpu_cells(enabled: bool, note=None) -> None:
    """A GPU training step's LSTM cells compiled (`FusedGpuCells`) when `enabled`, else eager (`lstm.GpuCells`):
    set for the process, by each run that trains on a GPU."""
    lstm.GPU_CELLS = FusedGpuCells(note) if enabled else lstm.GpuCells
