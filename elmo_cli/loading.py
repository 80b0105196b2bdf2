"""Loading a model: for prediction (`load_model`), and into a new model for fine-tuning (`init_from`).

Every command that takes a model accepts a model directory (a run directory or an `export` output:
options.json, weights.hdf5, optional softmax.hdf5, vocab.txt, chars.json, spm.model) or the two bilm-tf files
`--options F --weights F` in which the published ELMo models are distributed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from elmo_cli.bilm_format import load_bilm, resolve_model_files
from elmo_cli.config import ModelConfig, load_options
from elmo_cli.model.bilm import BiLM
from elmo_cli.model.lstm import BiLSTMKernel
from vocab.chars import ByteChars
from vocab.errors import ElmoError
from vocab.tokenize import TextEncoder


@dataclass
class LoadedModel:
    model: BiLM  # in eval mode, on `device`
    text: TextEncoder  # tokenizer, vocabulary (may be None) and character encoder
    directory: Path | None  # the model directory, when given as one
    device: torch.device
    _kernels: dict = field(default_factory=dict, repr=False, compare=False)

    def lstm_kernel(self, compute_dtype: torch.dtype | None = None) -> BiLSTMKernel:
        """The LSTMs arranged for stateless inference (`BiLSTMKernel`), made on first use and kept: a loaded
        model is read-only, and arranging `original`'s weights copies 300 MB."""
        if compute_dtype not in self._kernels:
            self._kernels[compute_dtype] = BiLSTMKernel(self.model.forward_lstm, self.model.backward_lstm,
                                                        compute_dtype)
        return self._kernels[compute_dtype]


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


def set_threads(threads: int | None) -> None:
    """torch's intra-op CPU threads for this process; None keeps torch's choice."""
    if threads is None:
        return
    if threads < 1:
        raise ElmoError(f"--threads must be at least 1, got {threads}")
    torch.set_num_threads(threads)


def model_architecture(model_dir: Path) -> ModelConfig:
    """The architecture of a trained model directory (its options.json): fine-tuning keeps its shape."""
    options, _, _ = resolve_model_files(Path(model_dir), None, None)
    return load_options(options)


def init_from(model: BiLM, model_dir: Path, encoder: TextEncoder, reset_softmax: bool) -> list[str]:
    """Copy a trained model's encoder and LSTMs into `model`; map softmax rows of words in both vocabularies."""
    options, weights, softmax_path = resolve_model_files(Path(model_dir), None, None)
    src = load_bilm(options, weights, softmax_path)
    notes = []
    own = TextEncoder.from_dir(model_dir)
    if own.chars.to_json() != encoder.chars.to_json():
        raise ElmoError(f"{model_dir}: its character encoder ({own.chars.mode}) differs from the shards' "
                        f"({encoder.chars.mode}); shard the fine-tuning text with the model's chars.json")
    state = {k: v for k, v in src.state_dict().items() if not k.startswith("softmax.")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith("softmax.") for k in missing), (missing, unexpected)
    if reset_softmax or src.softmax is None:
        notes.append("softmax initialised afresh" + ("" if reset_softmax else f" ({model_dir} has no softmax.hdf5)"))
        return notes
    old_vocab, new_vocab = own.vocab, encoder.vocab
    if old_vocab is None:
        raise ElmoError(f"{model_dir}: has softmax.hdf5 but no vocab.txt, so its rows cannot be mapped; "
                        f"pass --reset-softmax")
    old_index = {t: i for i, t in enumerate(old_vocab.tokens)}
    pairs = [(i, old_index[t]) for i, t in enumerate(new_vocab.tokens) if t in old_index]
    new_ids = torch.tensor([p[0] for p in pairs], dtype=torch.long)
    old_ids = torch.tensor([p[1] for p in pairs], dtype=torch.long)
    with torch.no_grad():
        model.softmax.weight[new_ids] = src.softmax.weight[old_ids]
        model.softmax.bias[new_ids] = src.softmax.bias[old_ids]
    notes.append(f"softmax: {len(pairs)} of {len(new_vocab)} words mapped from {model_dir}, "
                 f"{len(new_vocab) - len(pairs)} initialised afresh")
    return notes
