"""ELMoForManyLangs' published models, read as they are unzipped (`vocab.efml` lists the files).

`load_efml` turns a directory into a `BiLM` and its token encoder (`vocab.chars.EfmlChars`): EFML's weights are
rearranged into the weights.hdf5 layout (`elmo_cli.bilm_format`) and loaded by the same code as every other model,
so every command reads them and `export` writes them in elmo-cli's format. What EFML's network is, in elmo-cli's
terms (read from elmoformanylangs 0.0.4's ``frontend.py`` and ``modules/``):

- token embedder ``cnn``: ``Conv1d (count, E, width)`` per filter bank, max over positions, then the activation;
  highway layers ``Linear(F, 2F)`` whose first half is the relu branch and second half the gate ``g``, giving
  ``g * x + (1 - g) * relu(.)`` (elmo-cli's carry gate is ``1 - g``: its weights are the gate's negated);
  ``projection`` reads ``[word embedding ; highway output]``.
- encoder ``elmo``: per direction and layer ``input_linearity (4H, P)`` without bias, ``state_linearity (4H, P)``
  with the bias (forget bias included), gates in the order ``i, f, g, o``; ``state_projection (P, H)``; cell and
  projection clipping; a residual from layer 2 on. elmo-cli's cell reads ``i, j(=g), f, o`` and adds the forget
  bias of 1 itself, so the blocks are reordered and 1 taken off the forget bias.
- the output layers: the token embedding twice, then each layer forward | backward (``sents2elmo(...,
  output_layer=-2)``), the same stacking as elmo-cli's.

The ``.pkl`` files are read with ``torch.load(weights_only=True)``: a state dict of tensors loads, pickled code is
refused without being run.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch

from elmo_cli.bilm_format import LSTM_PREFIX, arrays_to_model, expected_shapes
from elmo_cli.config import CharCNNConfig, LSTMConfig, ModelConfig
from elmo_cli.model.bilm import BiLM
from vocab.chars import EfmlChars
from vocab.efml import ENCODER, TOKEN_EMBEDDER, efml_chars, model_config, read_efml_chars, token_settings
from vocab.errors import ElmoError

GATES_TO_IJFO = (0, 2, 1, 3)  # EFML's blocks i, f, g, o -> elmo-cli's i, j(=g), f, o


def read_state_dict(path: Path) -> dict[str, np.ndarray]:
    """A ``.pkl`` state dict as float32 arrays; refused (one line) when it is anything but tensors by name."""
    if not path.is_file():
        raise ElmoError(f"{path}: not found (an ELMoForManyLangs model directory has {path.name})")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, ValueError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ElmoError(f"{path}: not a plain state dict of tensors, refused without running it ({first[:200]})"
                        ) from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in state.items()):
        raise ElmoError(f"{path}: not a state dict (names to tensors) but a {type(state).__name__}")
    return {k: v.detach().to(torch.float32).numpy() for k, v in state.items()}


def efml_config(config: dict, where: str, n_characters: int, n_words: int) -> ModelConfig:
    """elmo-cli's `ModelConfig` of an EFML model config (`n_characters`, `n_words`: prediction-form rows)."""
    try:
        enc, emb = config["encoder"], config["token_embedder"]
        if str(enc["name"]).lower() != "elmo" or str(emb["name"]).lower() != "cnn":
            raise ElmoError(f"{where}: encoder {enc['name']!r} with token_embedder {emb['name']!r}; this reader takes "
                            f"ELMoForManyLangs models with the 'elmo' encoder and the 'cnn' token embedder (every "
                            f"published model)")
        if int(emb["char_dim"]) <= 0:
            raise ElmoError(f"{where}: char_dim 0 (a word-only token embedder); elmo-cli's token encoder reads "
                            f"characters, so this model is not supported")
        word_dim = int(emb.get("word_dim", 0) or 0)
        cfg = ModelConfig(
            char_cnn=CharCNNConfig(
                filters=tuple((int(w), int(n)) for w, n in emb["filters"]), n_highway=int(emb["n_highway"]),
                activation=str(emb["activation"]), embedding_dim=int(emb["char_dim"]), n_characters=n_characters,
                max_characters_per_token=int(emb["max_characters_per_token"]),
                n_words=n_words if word_dim else 0, word_dim=word_dim),
            lstm=LSTMConfig(
                dim=int(enc["dim"]), projection_dim=int(enc["projection_dim"]), n_layers=int(enc["n_layers"]),
                cell_clip=float(enc["cell_clip"]) if enc.get("cell_clip") else None,
                proj_clip=float(enc["proj_clip"]) if enc.get("proj_clip") else None, use_skip_connections=True))
    except KeyError as e:
        raise ElmoError(f"{where}: missing key {e} (an ELMoForManyLangs model config)") from None
    except (TypeError, ValueError) as e:
        raise ElmoError(f"{where}: malformed ELMoForManyLangs model config ({e})") from None
    cfg.validate(where)
    return cfg


def _gates(a: np.ndarray, H: int) -> np.ndarray:
    """Rows (or entries) in four blocks of H reordered from EFML's gate order to elmo-cli's."""
    return np.concatenate([a[g * H:(g + 1) * H] for g in GATES_TO_IJFO])


def efml_arrays(config: ModelConfig, embedder: dict[str, np.ndarray], encoder: dict[str, np.ndarray],
                char_rows: list[int]) -> dict[str, np.ndarray]:
    """EFML's two state dicts as weights.hdf5 arrays (TensorFlow orientation ``y = x @ W``) for `config`."""
    c, H = config.char_cnn, config.lstm.dim
    F = c.n_filters
    out = {"char_embed": embedder["char_emb_layer.embedding.weight"][char_rows]}
    if c.word_dim:
        out["word_embed"] = embedder["word_emb_layer.embedding.weight"]
    for i in range(len(c.filters)):
        out[f"CNN/W_cnn_{i}"] = embedder[f"convolutions.{i}.weight"].transpose(2, 1, 0)[None]  # (1, w, E, n)
        out[f"CNN/b_cnn_{i}"] = embedder[f"convolutions.{i}.bias"]
    for k in range(c.n_highway):
        w, b = embedder[f"highways._layers.{k}.weight"], embedder[f"highways._layers.{k}.bias"]  # (2F, F), (2F,)
        out[f"CNN_high_{k}/W_transform"], out[f"CNN_high_{k}/b_transform"] = w[:F].T, b[:F]
        out[f"CNN_high_{k}/W_carry"], out[f"CNN_high_{k}/b_carry"] = -w[F:].T, -b[F:]
    out["CNN_proj/W_proj"], out["CNN_proj/b_proj"] = embedder["projection.weight"].T, embedder["projection.bias"]
    for d, name in enumerate(("forward", "backward")):
        for layer in range(config.lstm.n_layers):
            src, dst = f"{name}_layer_{layer}.", LSTM_PREFIX.format(d=d, l=layer)
            w_in = _gates(encoder[src + "input_linearity.weight"], H)  # (4H, P)
            w_rec = _gates(encoder[src + "state_linearity.weight"], H)  # (4H, P)
            bias = _gates(encoder[src + "state_linearity.bias"], H).copy()
            bias[2 * H:3 * H] -= 1.0  # elmo-cli adds the forget bias at run time
            out[dst + "W_0"] = np.concatenate([w_in, w_rec], axis=1).T
            out[dst + "B"] = bias
            out[dst + "W_P_0"] = encoder[src + "state_projection.weight"].T
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def _expected_pkl_shapes(config: ModelConfig) -> tuple[dict, dict]:
    c, l = config.char_cnn, config.lstm
    E, F, P, H = c.embedding_dim, c.n_filters, l.projection_dim, l.dim
    emb = {f"convolutions.{i}.weight": (n, E, w) for i, (w, n) in enumerate(c.filters)}
    emb.update({f"convolutions.{i}.bias": (n,) for i, (_, n) in enumerate(c.filters)})
    for k in range(c.n_highway):
        emb[f"highways._layers.{k}.weight"], emb[f"highways._layers.{k}.bias"] = (2 * F, F), (2 * F,)
    emb["projection.weight"], emb["projection.bias"] = (P, c.word_dim + F), (P,)
    enc = {}
    for name in ("forward", "backward"):
        for layer in range(l.n_layers):
            p = f"{name}_layer_{layer}."
            enc[p + "input_linearity.weight"], enc[p + "state_linearity.weight"] = (4 * H, P), (4 * H, P)
            enc[p + "state_linearity.bias"], enc[p + "state_projection.weight"] = (4 * H,), (P, H)
    return emb, enc


def _check(path: Path, state: dict[str, np.ndarray], want: dict[str, tuple], where: str) -> None:
    """One line naming every missing or mis-shaped tensor of a state dict."""
    problems = [f"{k} missing (expected {s})" for k, s in want.items() if k not in state]
    problems += [f"{k} has shape {tuple(state[k].shape)}, {where} implies {s}" for k, s in want.items()
                 if k in state and tuple(state[k].shape) != s]
    if problems:
        raise ElmoError(f"{path}: weights do not match the model config ({len(problems)} tensors): "
                        + "; ".join(problems))


def read_efml(directory: Path) -> tuple[ModelConfig, dict[str, np.ndarray], EfmlChars]:
    """An EFML directory as elmo-cli's config, weights.hdf5 arrays and token encoder (one line per mistake)."""
    directory = Path(directory)
    config, where = model_config(directory)
    embedder = read_state_dict(directory / TOKEN_EMBEDDER)
    encoder = read_state_dict(directory / ENCODER)
    if "char_emb_layer.embedding.weight" not in embedder:
        raise ElmoError(f"{directory / TOKEN_EMBEDDER}: no char_emb_layer.embedding.weight (not an ELMoForManyLangs "
                        f"cnn token embedder)")
    max_chars, word_dim = token_settings(config, directory)
    word_weight = embedder.get("word_emb_layer.embedding.weight")
    if word_dim and word_weight is None:
        raise ElmoError(f"{directory / TOKEN_EMBEDDER}: {where} gives word_dim {word_dim} but there is no "
                        f"word_emb_layer.embedding.weight")
    chars, rows = efml_chars(directory, max_chars,
                             embedder["char_emb_layer.embedding.weight"].shape[0],
                             None if word_weight is None else word_weight.shape[0], with_words=word_dim > 0)
    n_words = len(chars.words) + 1 if chars.words is not None else 0
    cfg = efml_config(config, where, chars.n_characters + 1, n_words)
    want_emb, want_enc = _expected_pkl_shapes(cfg)
    want_emb["char_emb_layer.embedding.weight"] = (embedder["char_emb_layer.embedding.weight"].shape[0],
                                                   cfg.char_cnn.embedding_dim)
    if word_dim:
        want_emb["word_emb_layer.embedding.weight"] = (n_words - 1, word_dim)
    _check(directory / TOKEN_EMBEDDER, embedder, want_emb, where)
    _check(directory / ENCODER, encoder, want_enc, where)
    arrays = efml_arrays(cfg, embedder, encoder, rows)
    assert {k: a.shape for k, a in arrays.items()} == expected_shapes(cfg)
    return cfg, arrays, chars


def efml_architecture(directory: Path) -> ModelConfig:
    """The `ModelConfig` of an EFML directory from its config and dictionaries alone (no weights read): what
    fine-tuning needs to build the model before `load_efml` fills it."""
    config, where = model_config(directory)
    chars = read_efml_chars(directory)
    return efml_config(config, where, chars.n_characters + 1, len(chars.words) + 1 if chars.words is not None else 0)


def load_efml(directory: Path) -> tuple[BiLM, EfmlChars]:
    """A BiLM (eval mode, no softmax: EFML's published models do not include theirs) and its token encoder."""
    config, arrays, chars = read_efml(directory)
    model = BiLM(config)
    arrays_to_model(model, arrays)
    return model.eval(), chars
