"""bilm-tf's model files, both ways: ``options.json`` + ``weights.hdf5`` (docs/formats.md), and our ``softmax.hdf5``.

weights.hdf5 layout (all float32, TensorFlow orientation ``y = x @ W``, no attributes):

    char_embed                                            (n_characters - 1, E)   no padding row
    word_embed                                            (n_words - 1, D)        only a model that embeds words
    CNN/W_cnn_{i}, CNN/b_cnn_{i}                          (1, width_i, E, count_i), (count_i,)
    CNN_high_{k}/W_carry, W_transform, b_carry, b_transform   (F, F), (F,)
    CNN_proj/W_proj, CNN_proj/b_proj                      (F, P), (P,)    (D + F, P) with word_embed: words first
    RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/W_0         (P + P, 4H)   rows [input ; recurrent h], gates i j f o
    RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/B           (4H,)         forget bias +1 NOT included
    RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/W_P_0       (H, P)

softmax.hdf5 (elmo-cli's, since bilm-tf never stored the softmax): ``W (V, P)``, ``b (V,)`` float32.
"""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import torch

from elmo_cli.config import ModelConfig, load_options
from elmo_cli.model.bilm import BiLM
from vocab.errors import ElmoError
from vocab.text import atomic_write_bytes, publish, temporary_path

LSTM_PREFIX = "RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/"


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy()


def model_to_arrays(model: BiLM) -> dict[str, np.ndarray]:
    """Every weights.hdf5 dataset of a model, keyed by its HDF5 path."""
    enc = model.encoder
    out: dict[str, np.ndarray] = {"char_embed": _np(enc.char_embedding.weight[1:])}
    if enc.word_embedding is not None:
        out["word_embed"] = _np(enc.word_embedding.weight[1:])
    for i, (kern, bias) in enumerate(zip(enc.kernels, enc.biases)):
        out[f"CNN/W_cnn_{i}"] = _np(kern).reshape(1, *kern.shape)
        out[f"CNN/b_cnn_{i}"] = _np(bias)
    for k, hw in enumerate(enc.highways):
        out[f"CNN_high_{k}/W_carry"] = _np(hw.carry.weight.t())
        out[f"CNN_high_{k}/b_carry"] = _np(hw.carry.bias)
        out[f"CNN_high_{k}/W_transform"] = _np(hw.transform.weight.t())
        out[f"CNN_high_{k}/b_transform"] = _np(hw.transform.bias)
    out["CNN_proj/W_proj"] = _np(enc.projection.weight.t())
    out["CNN_proj/b_proj"] = _np(enc.projection.bias)
    for d, stack in enumerate((model.forward_lstm, model.backward_lstm)):
        for l, layer in enumerate(stack.layers):
            p = LSTM_PREFIX.format(d=d, l=l)
            out[p + "W_0"] = _np(torch.cat([layer.input_weight, layer.recurrent_weight], dim=1).t())
            out[p + "B"] = _np(layer.bias)
            out[p + "W_P_0"] = _np(layer.projection_weight.t())
    return out


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every dataset a weights.hdf5 for `config` must hold."""
    c, l = config.char_cnn, config.lstm
    E, F, P, H = c.embedding_dim, c.n_filters, l.projection_dim, l.dim
    shapes: dict[str, tuple[int, ...]] = {"char_embed": (c.n_characters - 1, E)}
    if c.word_dim:
        shapes["word_embed"] = (c.n_words - 1, c.word_dim)
    for i, (w, n) in enumerate(c.filters):
        shapes[f"CNN/W_cnn_{i}"] = (1, w, E, n)
        shapes[f"CNN/b_cnn_{i}"] = (n,)
    for k in range(c.n_highway):
        for g in ("carry", "transform"):
            shapes[f"CNN_high_{k}/W_{g}"] = (F, F)
            shapes[f"CNN_high_{k}/b_{g}"] = (F,)
    shapes["CNN_proj/W_proj"] = (c.word_dim + F, P)
    shapes["CNN_proj/b_proj"] = (P,)
    for d in range(2):
        for layer in range(l.n_layers):
            p = LSTM_PREFIX.format(d=d, l=layer)
            shapes[p + "W_0"] = (2 * P, 4 * H)
            shapes[p + "B"] = (4 * H,)
            shapes[p + "W_P_0"] = (H, P)
    return shapes


def _read_checked(path: Path, config: ModelConfig) -> dict[str, np.ndarray]:
    """Read all expected datasets; one ElmoError listing every missing or mis-shaped dataset."""
    if not path.is_file():
        raise ElmoError(f"{path}: weights file not found")
    want = expected_shapes(config)
    arrays: dict[str, np.ndarray] = {}
    problems: list[str] = []
    try:
        with h5py.File(path, "r") as f:
            for name, shape in want.items():
                if name not in f:
                    problems.append(f"{name} missing (expected {shape})")
                    continue
                a = f[name][...]
                if name == "char_embed" and a.shape[0] == shape[0] + 1 and a.shape[1:] == shape[1:]:
                    a = a[1:]  # a file that already carries the padding row
                if tuple(a.shape) != shape:
                    problems.append(f"{name} has shape {tuple(a.shape)}, options.json implies {shape}")
                    continue
                arrays[name] = a.astype(np.float32, copy=False)
    except OSError as e:
        raise ElmoError(f"{path}: not a readable HDF5 file ({e})")
    if problems:
        raise ElmoError(f"{path}: weights do not match the options ({len(problems)} datasets): "
                        + "; ".join(problems))
    return arrays


@torch.no_grad()
def arrays_to_model(model: BiLM, arrays: dict[str, np.ndarray]) -> None:
    """Copy weights.hdf5 arrays (as from `model_to_arrays`) into a model of the matching config."""
    def t(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a))

    enc = model.encoder
    enc.char_embedding.weight[0].zero_()
    enc.char_embedding.weight[1:].copy_(t(arrays["char_embed"]))
    if enc.word_embedding is not None:
        enc.word_embedding.weight[0].zero_()
        enc.word_embedding.weight[1:].copy_(t(arrays["word_embed"]))
    for i, (kern, bias) in enumerate(zip(enc.kernels, enc.biases)):
        kern.copy_(t(arrays[f"CNN/W_cnn_{i}"][0]))
        bias.copy_(t(arrays[f"CNN/b_cnn_{i}"]))
    for k, hw in enumerate(enc.highways):
        hw.carry.weight.copy_(t(arrays[f"CNN_high_{k}/W_carry"]).t())
        hw.carry.bias.copy_(t(arrays[f"CNN_high_{k}/b_carry"]))
        hw.transform.weight.copy_(t(arrays[f"CNN_high_{k}/W_transform"]).t())
        hw.transform.bias.copy_(t(arrays[f"CNN_high_{k}/b_transform"]))
    enc.projection.weight.copy_(t(arrays["CNN_proj/W_proj"]).t())
    enc.projection.bias.copy_(t(arrays["CNN_proj/b_proj"]))
    P = model.config.lstm.projection_dim
    for d, stack in enumerate((model.forward_lstm, model.backward_lstm)):
        for l, layer in enumerate(stack.layers):
            p = LSTM_PREFIX.format(d=d, l=l)
            w0 = t(arrays[p + "W_0"]).t()  # (4H, 2P)
            layer.input_weight.copy_(w0[:, :P])
            layer.recurrent_weight.copy_(w0[:, P:])
            layer.bias.copy_(t(arrays[p + "B"]))
            layer.projection_weight.copy_(t(arrays[p + "W_P_0"]).t())


def load_bilm(options_path: Path, weights_path: Path, softmax_path: Path | None = None) -> BiLM:
    """Build a BiLM from bilm-tf files (and our softmax.hdf5 when given and present)."""
    config = load_options(Path(options_path))
    arrays = _read_checked(Path(weights_path), config)
    softmax = None
    if softmax_path is not None and Path(softmax_path).is_file():
        softmax = read_softmax(Path(softmax_path), config.lstm.projection_dim)
    model = BiLM(config, vocab_size=None if softmax is None else softmax[0].shape[0])
    arrays_to_model(model, arrays)
    if softmax is not None:
        with torch.no_grad():
            model.softmax.weight.copy_(torch.from_numpy(softmax[0]))
            model.softmax.bias.copy_(torch.from_numpy(softmax[1]))
    model.eval()
    return model


def read_softmax(path: Path, projection_dim: int) -> tuple[np.ndarray, np.ndarray]:
    try:
        with h5py.File(path, "r") as f:
            if "W" not in f or "b" not in f:
                raise ElmoError(f"{path}: softmax file must hold datasets 'W' (V, P) and 'b' (V,)")
            W, b = f["W"][...].astype(np.float32), f["b"][...].astype(np.float32)
    except OSError as e:
        raise ElmoError(f"{path}: not a readable HDF5 file ({e})")
    if W.ndim != 2 or W.shape[1] != projection_dim or b.shape != (W.shape[0],):
        raise ElmoError(f"{path}: softmax W has shape {W.shape} and b {b.shape}; expected (V, {projection_dim}) "
                        f"and (V,)")
    return W, b


def _atomic_h5(path: Path, fill) -> None:
    tmp = temporary_path(path)
    with h5py.File(tmp, "w") as f:
        fill(f)
    publish(tmp, path)


def write_weights(model: BiLM, path: Path) -> None:
    """Write weights.hdf5 in bilm-tf's layout (atomically: temporary name, fsync, rename)."""
    arrays = model_to_arrays(model)

    def fill(f: h5py.File) -> None:
        for name, a in arrays.items():
            f.create_dataset(name, data=a)

    _atomic_h5(Path(path), fill)


def write_softmax(model: BiLM, path: Path) -> None:
    if model.softmax is None:
        raise ElmoError("this model has no softmax weights to write")

    def fill(f: h5py.File) -> None:
        f.create_dataset("W", data=_np(model.softmax.weight))
        f.create_dataset("b", data=_np(model.softmax.bias))

    _atomic_h5(Path(path), fill)


def write_options(config: ModelConfig, path: Path, extra: dict | None = None) -> None:
    """Prediction-form options.json (n_characters 262 in byte mode); `extra` adds training keys at top level."""
    options = config.to_options()
    if extra:
        options.update(extra)
    atomic_write_bytes(path, (json.dumps(options, indent=2) + "\n").encode("utf-8"))


def save_model_dir(model: BiLM, directory: Path) -> None:
    """options.json + weights.hdf5 (+ softmax.hdf5 when the model has one) into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_options(model.config, directory / "options.json")
    write_weights(model, directory / "weights.hdf5")
    if model.softmax is not None:
        write_softmax(model, directory / "softmax.hdf5")
