"""Loading a model for prediction, and turning token lists into padded character batches.

Every command that takes a model accepts a model directory (a run directory or an `export` output:
options.json, weights.hdf5, optional softmax.hdf5, vocab.txt, chars.json, spm.model) or the two bilm-tf files
`--options F --weights F` in which the published ELMo models are distributed.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from elmo_cli.bilm_format import load_bilm, resolve_model_files
from elmo_cli.model.bilm import BiLM
from vocab.chars import ByteChars
from vocab.errors import ElmoError
from vocab.tokenize import TextEncoder


@dataclass
class LoadedModel:
    model: BiLM  # in eval mode, on `device`
    text: TextEncoder  # tokenizer, vocabulary (may be None) and character encoder
    directory: Path | None  # the model directory, when given as one
    device: torch.device


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ElmoError(f"--device {device}: CUDA is not available on this machine (use --device cpu)")
    try:
        return torch.device(device)
    except RuntimeError:
        raise ElmoError(f"--device {device!r}: not a torch device (cpu, cuda, cuda:1, ...)") from None


def load_model(model_dir: Path | None = None, options: Path | None = None, weights: Path | None = None,
               device: str | None = "cpu") -> LoadedModel:
    """Load a model directory or bilm-tf `options` + `weights` files for prediction."""
    options_path, weights_path, softmax_path = resolve_model_files(model_dir, options, weights)
    model = load_bilm(options_path, weights_path, softmax_path)
    text = TextEncoder.from_dir(model_dir) if model_dir is not None else TextEncoder(chars=ByteChars())
    want = text.chars.n_characters + 1
    have = model.config.char_cnn.n_characters
    if want != have:
        raise ElmoError(f"{options_path}: n_characters is {have} but the character encoder "
                        f"({text.chars.mode}) needs {want}")
    dev = resolve_device(device)
    model.to(dev)
    if text.vocab is not None and model.softmax is not None and len(text.vocab) != model.softmax.vocab_size:
        raise ElmoError(f"{softmax_path}: softmax has {model.softmax.vocab_size} rows but the vocabulary has "
                        f"{len(text.vocab)} words")
    return LoadedModel(model, text, Path(model_dir) if model_dir is not None else None, dev)


def pad_char_batch(rows: list[np.ndarray], device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Stack raw char-id arrays of different lengths into one prediction-form batch.

    # Parameters
    rows : list of B arrays, each `(T_b, W)` raw ids (boundaries already included).

    # Returns
    chars `(B, T, W)` int64 with raw + 1 and 0 as padding, and lengths `(B,)`.
    """
    B = len(rows)
    T = max(r.shape[0] for r in rows)
    W = rows[0].shape[1]
    out = np.zeros((B, T, W), dtype=np.int64)
    for b, r in enumerate(rows):
        out[b, : r.shape[0]] = r.astype(np.int64) + 1
    lengths = torch.tensor([r.shape[0] for r in rows], dtype=torch.long)
    return torch.from_numpy(out).to(device), lengths.to(device)


def length_sorted_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Positions grouped into batches of similar length, longest first.

    ``length_sorted_batches([3, 9, 1, 8], 2) -> [[1, 3], [0, 2]]``
    """
    order = sorted(range(len(lengths)), key=lambda k: -lengths[k])
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
