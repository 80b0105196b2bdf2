"""Training checkpoints: ``RUN_DIR/checkpoints/step-00001234.pt``, a plain dict of tensors and plain types.

Written atomically (temporary file, fsync, rename, fsync of the directory) and read with
``torch.load(weights_only=True)``, so loading never unpickles arbitrary objects. RNG states are stored as tensors
(torch's ByteTensors; numpy is not used for randomness in training). The dict::

    format_version  int
    step            int          optimizer steps done
    config          str          the effective RunConfig as JSON
    model           state_dict   the BiLM (softmax included)
    optimizer       state_dict   Adagrad
    ranks           list         one entry per process: {"torch_rng", "sampler_rng", "cuda_rng" (or None),
                                 "data" (rows, 3) int64, "states" [fwd h,c per layer..., bwd ...]}
    tokens          int          training tokens seen (per direction)
    elapsed         float        training seconds so far
    best            dict | None  the best validation so far (its step and perplexities), kept in the model files
    bad_validations int          validations since the best one (for --patience)
    average         state_dict   the AveragedModel of training.average (its module and n_averaged), or None

`rank_state` / `restore_rank` build and restore one process's entry; `build_payload` the whole dict.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import numpy as np

from vocab.errors import ElmoError
from vocab.text import publish, temporary_path

FORMAT_VERSION = 1
CHECKPOINT_DIR = "checkpoints"
_NAME = re.compile(r"^step-(\d{8,})\.pt$")


def rank_state(sampler: torch.Generator, device: torch.device, data: "np.ndarray", states: tuple) -> dict[str, Any]:
    """One process's entry of ``ranks``: its RNG states, data position `(rows, 3)` and carried LSTM states
    (``(forward, backward)`` lists of per-layer ``(h, c)``, or ``(None, None)``)."""
    flat = [t.detach().cpu() for direction in states for h, c in direction for t in (h, c)] \
        if states[0] is not None else []
    return {"torch_rng": torch.get_rng_state(), "sampler_rng": sampler.get_state(),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            "data": torch.from_numpy(data), "states": flat}


def restore_rank(mine: dict[str, Any], sampler: torch.Generator, device: torch.device, n_layers: int
                 ) -> tuple["np.ndarray", tuple]:
    """Set this process's RNG states from its entry; returns its data position and carried LSTM states."""
    torch.set_rng_state(mine["torch_rng"])
    sampler.set_state(mine["sampler_rng"])
    if mine.get("cuda_rng") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(mine["cuda_rng"], device)
    states: tuple = (None, None)
    if mine["states"]:
        it = iter(t.to(device) for t in mine["states"])
        states = tuple([(next(it), next(it)) for _ in range(n_layers)] for _ in range(2))
    return mine["data"].numpy(), states


def build_payload(config_json: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, ranks: list,
                  tokens: int, elapsed: float, best: dict | None, bad_validations: int,
                  average: dict | None = None) -> dict[str, Any]:
    """Everything `save_checkpoint` writes besides format_version and step."""
    return {"config": config_json, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "ranks": ranks, "tokens": tokens, "elapsed": elapsed, "best": best, "bad_validations": bad_validations,
            "average": average}


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / f"step-{step:08d}.pt"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (temporary files of an interrupted write are ignored)."""
    d = Path(run_dir) / CHECKPOINT_DIR
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def save_checkpoint(run_dir: Path, step: int, payload: dict[str, Any], keep: int = 3) -> Path:
    """Write ``payload`` (plus format_version and step) atomically, then delete all but the newest ``keep``."""
    path = checkpoint_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    with open(tmp, "wb") as f:
        torch.save({"format_version": FORMAT_VERSION, "step": step, **payload}, f)
    publish(tmp, path)
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by `save_checkpoint` (tensors and plain types only)."""
    path = Path(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ElmoError(f"{path}: checkpoint not found") from None
    except Exception as e:  # truncated or foreign file: torch raises several types
        raise ElmoError(f"{path}: not a readable checkpoint ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format_version") != FORMAT_VERSION:
        raise ElmoError(f"{path}: not an elmo-cli checkpoint (format_version "
                        f"{ckpt.get('format_version') if isinstance(ckpt, dict) else None}, expected {FORMAT_VERSION})")
    return ckpt


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None
