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
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from vocab.errors import ElmoError
from vocab.text import publish

FORMAT_VERSION = 1
CHECKPOINT_DIR = "checkpoints"
_NAME = re.compile(r"^step-(\d{8,})\.pt$")


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
    tmp = path.with_name(path.name + ".tmp")
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
