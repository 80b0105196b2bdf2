"""Loading a model: for prediction (`load_model`), and into a new model for fine-tuning (`init_from`).

Every command that takes a model accepts a model directory (a run directory or an `export` output:
options.json, weights.hdf5, optional softmax.hdf5, vocab.txt, chars.json, spm.model), the path of an options.json
file with its weights beside it (``x_options.json`` + ``x_weights.hdf5``, as the published ELMo models are named)
or given as `--weights F`, the two bilm-tf files `--options F --weights F`, or an ELMoForManyLangs model directory
as it is unzipped (`elmo_cli.efml`); `read_model` is where the formats part (`elmo_cli.model_files`).
Any of these files may be given as an http(s) URL: it is downloaded once into the cache (`elmo_cli.fetch`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from elmo_cli.bilm_format import load_bilm
from elmo_cli.model_files import ModelFiles, model_files
from elmo_cli.config import ModelConfig, load_options
from elmo_cli.efml import efml_architecture, load_efml
from elmo_cli.model.bilm import BiLM
from elmo_cli.model.lstm import BiLSTMKernel
from vocab.chars import ByteChars
from vocab.efml import read_efml_chars
from vocab.errors import ElmoError
from vocab.tokenize import TextEncoder


@dataclass
class LoadedModel:
    model: BiLM  # in eval mode, on `device`
    text: TextEncoder  # tokenizer, vocabulary (may be None) and character encoder
    directory: Path | None  # the model directory, when given as one
    device: torch.device
    source: str = "this model"  # the model as the user gave it (a directory or an options.json), for messages
    _kernels: dict = field(default_factory=dict, repr=False, compare=False)

    def lstm_kernel(self, compute_dtype: torch.dtype | None = None) -> BiLSTMKernel:
        """The LSTMs arranged for stateless inference (`BiLSTMKernel`), made on first use and kept: a loaded
        model is read-only, and arranging `original`'s weights copies 300 MB."""
        if compute_dtype not in self._kernels:
            self._kernels[compute_dtype] = BiLSTMKernel(self.model.forward_lstm, self.model.backward_lstm,
                                                        compute_dtype)
        return self._kernels[compute_dtype]


def resolve_device(device: str | None) -> torch.device:
    """Every command's device rule: ``auto`` (the default) is CUDA when torch sees a GPU, else the CPU."""
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ElmoError(f"--device {device}: CUDA is not available on this machine (torch {torch.__version__}"
                        f"{'' if torch.version.cuda else ', a CPU build'}); use --device cpu or auto")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ElmoError(f"--device {device!r}: not a torch device (auto, cpu, cuda, cuda:1, ...)") from None
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ElmoError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def model_text(files: ModelFiles) -> TextEncoder:
    """A model's text processing (tokenizer, vocabulary, character encoder) without reading its weights."""
    if files.efml:
        return TextEncoder(chars=read_efml_chars(files.directory))
    return TextEncoder.from_dir(files.directory) if files.directory is not None else TextEncoder(chars=ByteChars())


def read_model(files: ModelFiles) -> tuple[BiLM, TextEncoder]:
    """The biLM (eval mode, on the CPU) and its text processing, whatever the model's format."""
    if files.efml:
        net, chars = load_efml(files.directory)
        return net, TextEncoder(chars=chars)
    return load_bilm(files.options, files.weights, files.softmax), model_text(files)


def load_model(model: Path | str | ModelFiles | None = None, options: Path | str | None = None,
               weights: Path | str | None = None, device: str | None = "auto") -> LoadedModel:
    """Load a biLM for prediction: a model directory, an options.json path, or bilm-tf `options` + `weights`
    (each file also as an http(s) URL), or an ELMoForManyLangs directory."""
    files = model_files(model, options, weights)
    net, text = read_model(files)
    want = text.chars.n_characters + 1
    have = net.config.char_cnn.n_characters
    if want != have:
        raise ElmoError(f"{files.options}: n_characters is {have} but the character encoder "
                        f"({text.chars.mode}) needs {want}")
    dev = resolve_device(device)
    net.to(dev)
    if text.vocab is not None and net.softmax is not None and len(text.vocab) != net.softmax.vocab_size:
        raise ElmoError(f"{files.softmax}: softmax has {net.softmax.vocab_size} rows but the vocabulary has "
                        f"{len(text.vocab)} words")
    return LoadedModel(net, text, files.directory, dev, str(files))


def set_threads(threads: int | None) -> None:
    """torch's intra-op CPU threads for this process; None keeps torch's choice."""
    if threads is None:
        return
    if threads < 1:
        raise ElmoError(f"--threads must be at least 1, got {threads}")
    torch.set_num_threads(threads)


def model_architecture(model: Path | ModelFiles) -> ModelConfig:
    """The architecture of a trained model (its options.json): fine-tuning keeps its shape."""
    files = model_files(model)
    return efml_architecture(files.directory) if files.efml else load_options(files.options)


def init_from(model: BiLM, source: Path | ModelFiles, encoder: TextEncoder, reset_softmax: bool) -> list[str]:
    """Copy a trained model's encoder and LSTMs into `model`; map softmax rows of words in both vocabularies."""
    files = model_files(source)
    src, own = read_model(files)
    notes = []
    if own.chars.to_json() != encoder.chars.to_json():
        raise ElmoError(f"{files}: its character encoder ({own.chars.mode}) differs from the shards' "
                        f"({encoder.chars.mode}); shard the fine-tuning text with `elmo-cli shard --chars "
                        f"{files.directory or 'bytes'}`")
    state = {k: v for k, v in src.state_dict().items() if not k.startswith("softmax.")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith("softmax.") for k in missing), (missing, unexpected)
    if reset_softmax or src.softmax is None:
        notes.append("softmax initialised afresh" + ("" if reset_softmax else f" ({files} has no softmax.hdf5)"))
        return notes
    old_vocab, new_vocab = own.vocab, encoder.vocab
    if old_vocab is None:
        raise ElmoError(f"{files}: has softmax.hdf5 but no vocab.txt, so its rows cannot be mapped; "
                        f"pass --reset-softmax")
    old_index = {t: i for i, t in enumerate(old_vocab.tokens)}
    pairs = [(i, old_index[t]) for i, t in enumerate(new_vocab.tokens) if t in old_index]
    new_ids = torch.tensor([p[0] for p in pairs], dtype=torch.long)
    old_ids = torch.tensor([p[1] for p in pairs], dtype=torch.long)
    with torch.no_grad():
        model.softmax.weight[new_ids] = src.softmax.weight[old_ids]
        model.softmax.bias[new_ids] = src.softmax.bias[old_ids]
    notes.append(f"softmax: {len(pairs)} of {len(new_vocab)} words mapped from {files}, "
                 f"{len(new_vocab) - len(pairs)} initialised afresh")
    return notes
