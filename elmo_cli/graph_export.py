"""`export --format onnx|torch-export`: the biLM as one graph, from allennlp's character ids to every layer.

`BiLMGraph` wraps a loaded `BiLM` (its own modules and weights, nothing copied) in a forward that export can
trace with dynamic batch and token axes:

    char_ids  int64 (B, T, W)        allennlp's ``batch_to_ids``: raw ids (docs/formats.md, Character ids) + 1,
                                     all-zero rows = padding
    layers    float32 (B, L+1, T, 2P)   the token layer and each biLSTM layer, stateless (dump-embeddings --layers all)
    mask      bool (B, T)            True at the sentence's tokens

The graph is the biLM's one forward (`elmo_cli.model.bilm`): it adds ``<S>``/``</S>`` itself (`add_boundaries`), runs
the character CNN once per distinct token of the batch, over the character positions up to the batch's longest
token (both sizes the graph keeps dynamic), and each LSTM layer as a ``scan`` over time
(`ProjectedLSTMLayer.forward_scan`). The backward stacks read each row reversed within its own length
(`directions`), so every sentence starts its backward pass at its own last token and padding never reaches a
sentence's vectors.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from elmo_cli.inputs import char_ids_batch
from elmo_cli.loading import LoadedModel, load_model
from elmo_cli.model.bilm import BiLM, add_boundaries, bilm_layers, to_model_chars
from vocab.errors import ElmoError
from vocab.text import check_new_output, publish, temporary_path


class BiLMGraph(nn.Module):
    """The exportable forward of a biLM (see the module docstring): `add_boundaries`, the character encoder once per
    distinct token, `bilm_layers` with each LSTM layer as a ``scan``.

    # Parameters
    model : `BiLM`, its encoder and both LSTM stacks are used as they are (not its softmax).
    bos, eos : prediction-form character rows `(W,)` of ``<S>`` and ``</S>`` (the model's character encoder's).
    """

    def __init__(self, model: BiLM, bos: torch.Tensor, eos: torch.Tensor):
        super().__init__()
        self.encoder = model.encoder
        self.forward_lstm = model.forward_lstm
        self.backward_lstm = model.backward_lstm
        self.register_buffer("bos", bos.long().view(-1), persistent=False)  # (W,)
        self.register_buffer("eos", eos.long().view(-1), persistent=False)

    def forward(self, char_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """
        # Parameters
        char_ids : `torch.LongTensor`, shape `(B, T, W)`, prediction-form ids; a sentence's tokens first, then rows
            of zeros.

        # Returns
        layers `(B, L+1, T, 2P)` (zero at padding) and mask `(B, T)` bool.
        """
        B, T, W = char_ids.shape
        mask = (char_ids > 0).any(dim=-1)  # (B, T)
        chars, lengths = add_boundaries(char_ids, mask.sum(dim=1), self.bos, self.eos)  # (B, T+2, W), (B,)
        # Each distinct token once (the padding row among them, once), over the windows up to the batch's longest
        # token: a batch's distinct tokens are far fewer than its B * (T+2) positions, and the character CNN's
        # activations are the graph's peak.
        x = self.encoder.forward_distinct(chars)  # (B, T+2, P)
        layers, _ = bilm_layers((self.forward_lstm, self.backward_lstm), x, lengths, scan=True)  # (L+1, B, T+2, 2P)
        out = layers.transpose(0, 1)[:, :, 1 : T + 1]  # (B, L+1, T, 2P)
        return out * mask.view(B, 1, T, 1).to(out.dtype), mask


# ---- writing the files ----------------------------------------------------------------------------------------------
FORMATS = ("dir", "onnx", "torch-export")
SERVE_EXTRA = 'pip install -e ".[serve]"'
FORMAT_VERSION = "1"
# What a reader of the file needs to know, stored with it (ONNX metadata_props, .pt2 extra files).
CHAR_RULE = ("char_ids[b, t] = the token's character ids + 1 (allennlp batch_to_ids): begin-of-word 259, the "
             "token's first W-2 UTF-8 bytes each + 1, end-of-word 260, then 261 up to W; rows of zeros are padding "
             "after the sentence; no <S>/</S> (the graph adds them). chars.json: mode codepoint replaces bytes by "
             "its table's ids; mode efml (an ELMoForManyLangs model) by its dictionary's, and a row then ends "
             "with the token's word id + 1 (W + 1 columns).")


def require_serving(onnx: bool = True) -> None:
    """ElmoError naming the extra to install when what ONNX export and serving need is missing."""
    import importlib.util

    names = ("onnx", "onnxscript", "onnxruntime") if onnx else ()
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if missing:
        raise ElmoError(f"ONNX export and serving need {', '.join(missing)}, not installed here: {SERVE_EXTRA}")
    if not hasattr(torch, "export"):
        raise ElmoError(f"torch {torch.__version__} has no torch.export; install torch >= 2.6")


def char_batch(chars, sentences: list[list[str]]) -> np.ndarray:
    """allennlp's ``batch_to_ids``: prediction-form ids `(B, T, W)` int64 of token lists, zero rows as padding
    (`elmo_cli.inputs.char_ids_batch` without boundaries, as numpy).

    ``char_batch(ByteChars(), [["a"]])[0, 0, :4] -> [259, 98, 260, 261]``
    """
    return char_ids_batch(chars, sentences, boundaries=False)[0].numpy()


def bilm_graph(loaded: LoadedModel) -> BiLMGraph:
    """`BiLMGraph` of a loaded model, in eval mode on the CPU, with its character encoder's boundary rows."""
    chars = loaded.text.chars
    bos, eos = to_model_chars(chars.encode_tokens([chars.bos_token, chars.eos_token]))  # (W,) each
    return BiLMGraph(loaded.model.cpu().eval(), bos, eos).eval()


def bilm_metadata(loaded: LoadedModel) -> dict[str, str]:
    """The strings stored with an exported biLM: the character map (chars.json), the options, the interface."""
    P2 = loaded.model.config.output_dim
    return {
        "elmo_cli.kind": "bilm",
        "elmo_cli.format_version": FORMAT_VERSION,
        "elmo_cli.chars": json.dumps(loaded.text.chars.to_json()),
        "elmo_cli.options": json.dumps(loaded.model.config.to_options()),
        "elmo_cli.inputs": f"char_ids int64 (batch, tokens, {loaded.text.chars.row_width})",
        "elmo_cli.outputs": f"layers float32 (batch, {loaded.model.n_layers}, tokens, {P2}); mask bool (batch, tokens)",
        "elmo_cli.char_rule": CHAR_RULE,
    }


def example_chars(chars, B: int = 2, T: int = 3) -> torch.Tensor:
    """A traced example `(B, T, W)`: real tokens, the last row shorter (so padding is seen); contiguous."""
    words = [["The", "cat", "sat"], ["A", "dog"]] + [["x"]] * max(0, B - 2)
    return torch.from_numpy(np.ascontiguousarray(char_batch(chars, [w[:T] for w in words[:B]])))


@contextlib.contextmanager
def _quiet():
    """The exporter's progress lines (stdout), warnings and log records (optional torchvision ops) held back."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def write_onnx(module: nn.Module, args: tuple, names: tuple[list[str], list[str]], dynamic: tuple,
               metadata: dict[str, str], path: Path) -> None:
    """`torch.onnx.export` (the dynamo exporter: `torch.export` then ONNX; the ``scan`` loops become ONNX
    ``Scan``), the metadata added as metadata_props, one self-contained file written to `path`."""
    import onnx

    with torch.no_grad(), _quiet():
        program = torch.onnx.export(module, args, dynamo=True, input_names=names[0], output_names=names[1],
                                    dynamic_shapes=dynamic, external_data=False, verbose=False)
    proto = program.model_proto
    for key, value in metadata.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save_model(proto, str(path))


def write_pt2(module: nn.Module, args: tuple, dynamic: tuple, metadata: dict[str, str], path: Path) -> None:
    """`torch.export.export` saved with `torch.export.save`; the metadata as extra files (one per key)."""
    with torch.no_grad():
        program = torch.export.export(module, args, dynamic_shapes=dynamic)
    torch.export.save(program, str(path), extra_files=dict(metadata))


def read_metadata(path: Path) -> dict[str, str]:
    """The elmo_cli.* metadata of an exported .onnx or .pt2 file."""
    path = Path(path)
    if path.suffix == ".pt2":
        extra = {k: "" for k in METADATA_KEYS}
        torch.export.load(str(path), extra_files=extra)
        return {k: v for k, v in extra.items() if v}
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return {p.key: p.value for p in proto.metadata_props}


METADATA_KEYS = ("elmo_cli.kind", "elmo_cli.format_version", "elmo_cli.chars", "elmo_cli.options",
                 "elmo_cli.inputs", "elmo_cli.outputs", "elmo_cli.char_rule")


def export_bilm(output: Path, fmt: str, model_dir: Path | None = None, options: Path | None = None,
                weights: Path | None = None, force: bool = False) -> Path:
    """`elmo-cli export --format onnx|torch-export`: the biLM as one file at `output`, written under a temporary
    name and renamed when complete."""
    if fmt not in ("onnx", "torch-export"):
        raise ElmoError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    output = Path(output)
    check_new_output(output, force)
    require_serving(onnx=fmt == "onnx")
    loaded = load_model(model_dir, options, weights, "cpu")
    module = bilm_graph(loaded)
    example = (example_chars(loaded.text.chars),)
    dynamic = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("tokens")},)
    tmp = temporary_path(output)
    try:
        if fmt == "onnx":
            write_onnx(module, example, (["char_ids"], ["layers", "mask"]), dynamic, bilm_metadata(loaded), tmp)
        else:
            write_pt2(module, example, dynamic, bilm_metadata(loaded), tmp)
        publish(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)
    return output
