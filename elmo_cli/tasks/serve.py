"""`task export --format onnx` and `task predict --onnx`: a whole task model as one ONNX graph, run by onnxruntime.

The exported directory::

    model.onnx    inputs  char_ids int64 (B, T, W) (allennlp batch_to_ids, as for the biLM's export) and
                          word_ids int64 (B, T) (rows of words.txt; 0 = padding, 1 = <UNK> for any other word);
                  outputs label_ids int64 (B, T) for tagging or (B,) for classification, and
                          scores float32 (B, T, C) or (B, C): log-probabilities over labels.txt
    words.txt     the word-embedding rows in order, one per line (row 0 <PAD>, row 1 <UNK>)
    labels.txt    the labels in the order of the scores
    chars.json    the biLM's character encoder; spm.model too when the task tokenizes with it
    task.json     kind, max_length, tokenizer, the unknown and padding word ids, the files' sha256

model.onnx's metadata_props repeat task.json (plus the biLM's options and character map), so `task predict --onnx`
refuses a words.txt or labels.txt that is not the one the graph was exported with. Without ELMo the graph has no
char_ids input.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from torch import nn

from elmo_cli.model.lstm import reverse_padded
from elmo_cli.serve import ServedBiLM, char_batch, example_chars, require_serving, served_bilm, write_onnx
from elmo_cli.tasks import formats
from elmo_cli.tasks.model import TaskModel
from elmo_cli.tasks.predict import join_pieces, length_batches
from vocab.chars import load_chars
from vocab.errors import ElmoError
from vocab.text import check_new_output, publish_dir
from vocab.tokenize import SPM_FILE, TextEncoder

MODEL_FILE, WORDS_FILE, LABELS_FILE, TASK_FILE = "model.onnx", "words.txt", "labels.txt", "task.json"


def bidirectional(lstm: nn.LSTM, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A one-layer bidirectional `nn.LSTM` over right-padded rows, each row's backward pass started at its own last
    step (what `pack_padded_sequence` gives): per direction torch's own ``lstm_cell`` on the module's weights in a
    ``scan`` over time, which exports with a dynamic time axis (the exporter's translation of a whole ``lstm`` call
    fixed the example's shapes in torch 2.13: onnxruntime then failed on any other batch shape).

    # Parameters
    x : `(B, T, D)`; mask : bool `(B, T)`, True at each row's first steps.

    # Returns
    `(B, T, 2H)`, zero at padding.
    """
    from torch._higher_order_ops.scan import scan

    B, H = x.shape[0], lstm.hidden_size
    lengths = mask.sum(dim=1)  # (B,)
    zero = x.new_zeros(B, H)
    out = []
    for suffix, inp in (("", x), ("_reverse", reverse_padded(x, lengths))):
        w_ih, w_hh, b_ih, b_hh = (getattr(lstm, f"{name}_l0{suffix}")
                                  for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))

        def combine(state, x_t, w_ih=w_ih, w_hh=w_hh, b_ih=b_ih, b_hh=b_hh):
            h, c = torch.lstm_cell(x_t, state, w_ih, w_hh, b_ih, b_hh)  # (B, H) each
            return (h, c), h.clone()

        y = scan(combine, (zero, zero.clone()), inp.transpose(0, 1))[1].transpose(0, 1)  # (B, T, H)
        out.append(y if not suffix else reverse_padded(y, lengths))
    return torch.cat(out, dim=-1) * mask.unsqueeze(-1).to(x.dtype)


class ServedTask(nn.Module):
    """`TaskModel.forward` (eval mode) on id tensors instead of token lists, the biLM inside (`ServedBiLM`).

    # Parameters
    model : `TaskModel`, its embedding, mixes, BiLSTM and head used as they are.
    bilm : `ServedBiLM`, optional: the frozen biLM, when the task uses ELMo.
    """

    def __init__(self, model: TaskModel, bilm: ServedBiLM | None):
        super().__init__()
        self.task, self.bilm = model.eval(), bilm
        self.classify = model.config.kind == "classification"

    def forward(self, char_ids: torch.Tensor | None, word_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """
        # Parameters
        char_ids : `(B, T, W)` prediction-form character ids (None without ELMo); word_ids : `(B, T)`, 0 = padding.

        # Returns
        label ids `(B, T)` (tagging) or `(B,)`, and log-probabilities `(B, T, C)` or `(B, C)`.
        """
        task = self.task
        mask = word_ids != 0  # (B, T)
        x = task.embed(word_ids)  # (B, T, E)
        layers = None
        if self.bilm is not None:
            layers = self.bilm(char_ids)[0].transpose(0, 1)  # (L+1, B, T, 2P)
        if task.elmo_in is not None:
            x = torch.cat([x, task.elmo_in.mix_layers(layers, mask)], dim=-1)  # (B, T, E + 2P)
        h = bidirectional(task.lstm, x, mask)  # (B, T, 2H)
        if task.elmo_out is not None:
            h = torch.cat([h, task.elmo_out.mix_layers(layers, mask)], dim=-1)  # (B, T, 2H + 2P)
        if self.classify:
            h = h.masked_fill(~mask.unsqueeze(-1), float("-inf")).max(dim=1).values  # (B, 2H [+ 2P])
        scores = torch.log_softmax(task.head(h), dim=-1)
        return scores.argmax(dim=-1), scores


class _WithChars(nn.Module):
    """The exported signature with ELMo: ``(char_ids, word_ids)``."""

    def __init__(self, served: ServedTask):
        super().__init__()
        self.served = served

    def forward(self, char_ids: torch.Tensor, word_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.served(char_ids, word_ids)


class _WordsOnly(_WithChars):
    """The exported signature without ELMo: ``(word_ids,)``."""

    def forward(self, word_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        return self.served(None, word_ids)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _lines(items) -> str:
    return "".join(f"{x}\n" for x in items)


def export_task(task_dir: Path, output: Path, fmt: str = "onnx", force: bool = False) -> list[str]:
    """Write the ONNX task directory `output` (see the module docstring), built under a temporary name and renamed
    when complete. Returns the names written."""
    from elmo_cli.tasks.apply import open_task

    if fmt != "onnx":
        raise ElmoError(f"--format {fmt!r}: task export writes onnx only")
    output = Path(output)
    check_new_output(output, force, directory=True)
    if output.exists() and output.is_dir() and not (output / TASK_FILE).is_file() and any(output.iterdir()):
        raise ElmoError(f"{output}: exists and is not an exported task; choose another --output")
    from elmo_cli.tasks.store import read_config

    config = read_config(task_dir)
    unsupported = [flag for flag, used in (("--crf", config.crf), ("--char-cnn", config.char_cnn),
                                           ("--fine-tune-bilm", config.fine_tune_bilm)) if used]
    if unsupported:
        raise ElmoError(f"{task_dir}: trained with {', '.join(unsupported)}, which task export does not write into "
                        f"the graph yet; run it with `elmo-cli task predict --task {task_dir}`")
    require_serving()
    loaded = open_task(task_dir, device="cpu")
    try:
        model = loaded.model.cpu().eval()
        config = model.config
        embedder = (model.elmo_in or model.elmo_out).embedder if config.uses_elmo else None
        text = None
        if config.elmo_model is not None:  # the biLM's character encoder and SentencePiece model
            directory = config.bilm_files(str(Path(task_dir) / "config.json")).directory
            text = TextEncoder.from_dir(directory) if directory is not None else TextEncoder()
        words, labels = _lines(config.words), _lines(config.labels)
        info = {"kind": config.kind, "max_length": config.max_length, "tokenizer": config.tokenizer,
                "padding_word_id": 0, "unknown_word_id": config.words.index("<UNK>"), "n_words": len(config.words),
                "labels": list(config.labels), "words_sha256": _sha256(words), "labels_sha256": _sha256(labels),
                "uses_elmo": config.uses_elmo, "label_column": config.label_column}
        served = ServedTask(model, served_bilm(embedder.loaded) if embedder is not None else None)
        chars = text.chars if text is not None else None
        B, T = torch.export.Dim("batch"), torch.export.Dim("tokens")
        word_example = torch.tensor([[2, 3, 4], [5, 6, 0]], dtype=torch.long).clamp(max=len(config.words) - 1)
        metadata = {"elmo_cli.kind": "task", "elmo_cli.task": json.dumps(info)}
        if embedder is not None:
            module, args = _WithChars(served), (example_chars(chars), word_example)
            names = (["char_ids", "word_ids"], ["label_ids", "scores"])
            dynamic = ({0: B, 1: T}, {0: B, 1: T})
            metadata["elmo_cli.chars"] = json.dumps(chars.to_json())
            metadata["elmo_cli.options"] = json.dumps(embedder.model.config.to_options())
        else:
            module, args = _WordsOnly(served), (word_example,)
            names, dynamic = (["word_ids"], ["label_ids", "scores"]), ({0: B, 1: T},)
        tmp = output.with_name(f".{output.name}.partial-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            write_onnx(module, args, names, dynamic, metadata, tmp / MODEL_FILE)
            (tmp / WORDS_FILE).write_text(words, encoding="utf-8")
            (tmp / LABELS_FILE).write_text(labels, encoding="utf-8")
            (tmp / TASK_FILE).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
            if chars is not None:
                (tmp / "chars.json").write_text(json.dumps(chars.to_json()) + "\n", encoding="utf-8")
            if config.tokenizer == "bilm" and text is not None and text.spm_model is not None:
                (tmp / SPM_FILE).write_bytes(text.spm_model)
            publish_dir(tmp, output)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        loaded.close()
    return sorted(p.name for p in output.iterdir())


class OnnxTask:
    """An exported task directory opened with onnxruntime; checks words.txt and labels.txt against the graph."""

    def __init__(self, directory: Path, threads: int | None = None):
        require_serving()
        import onnx
        import onnxruntime as ort

        directory = Path(directory)
        path = directory / MODEL_FILE
        if not path.is_file():
            raise ElmoError(f"{directory}: no {MODEL_FILE}; write it with elmo-cli task export --format onnx")
        meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
        if meta.get("elmo_cli.kind") != "task":
            raise ElmoError(f"{path}: not an exported task model (elmo-cli task export --format onnx)")
        self.info = json.loads(meta["elmo_cli.task"])
        texts = {}
        for name, key in ((WORDS_FILE, "words_sha256"), (LABELS_FILE, "labels_sha256")):
            file = directory / name
            if not file.is_file():
                raise ElmoError(f"{file}: missing (it is written beside {MODEL_FILE} by task export)")
            texts[name] = file.read_text(encoding="utf-8")
            if _sha256(texts[name]) != self.info[key]:
                raise ElmoError(f"{file}: not the {name} {path} was exported with (a different vocabulary); "
                                f"use the {name} written beside it")
        self.words = texts[WORDS_FILE].splitlines()
        self.labels = texts[LABELS_FILE].splitlines()
        self.index = {w: k for k, w in enumerate(self.words)}
        self.chars = load_chars(json.loads(meta["elmo_cli.chars"])) if "elmo_cli.chars" in meta else None
        spm = directory / SPM_FILE
        self.text = TextEncoder(chars=self.chars, spm_model=spm.read_bytes() if spm.is_file() else None)
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]

    def tokenize(self, line: str) -> list[str]:
        return self.text.tokenize(line) if self.info["tokenizer"] == "bilm" else formats.whitespace(line)

    def run(self, sentences: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
        """label ids and log-probabilities of one batch of non-empty token lists."""
        T = max(len(s) for s in sentences)
        unk = self.info["unknown_word_id"]
        word_ids = np.zeros((len(sentences), T), dtype=np.int64)
        for b, s in enumerate(sentences):
            word_ids[b, : len(s)] = [self.index.get(t, unk) for t in s]
        feed = {"word_ids": word_ids}
        if "char_ids" in self.inputs:
            feed["char_ids"] = char_batch(self.chars, sentences)
        label_ids, scores = self.session.run(["label_ids", "scores"], feed)
        return label_ids, scores

    def predict(self, examples: list[formats.Example], batch_size: int = 64) -> list:
        """Labels as `predict.predict_examples` gives them (long sentences split into pieces and joined)."""
        max_length, kind = self.info["max_length"], self.info["kind"]
        pieces = [p.tokens for p in formats.split_long(examples, max_length)[0]]
        out: list = [None] * len(pieces)
        for batch in length_batches([len(p) for p in pieces], batch_size):
            _, scores = self.run([pieces[k] for k in batch])
            for b, k in enumerate(batch):
                out[k] = scores[b, : len(pieces[k])] if kind == "tagging" else scores[b]
        return join_pieces(kind, self.labels, max_length, examples, out)


def predict_file_onnx(directory: Path, input_path: Path, output_path: Path, fmt: str = "auto",
                      batch_size: int = 64, threads: int | None = None, errors: str = "strict") -> dict:
    """`task predict --onnx`: `apply.predict_file` with the exported graph in onnxruntime (no torch model)."""
    from elmo_cli.tasks.apply import write_predictions

    task = OnnxTask(directory, threads)
    kind = task.info["kind"]
    examples = formats.read_unlabelled(input_path, kind, fmt, task.info["label_column"], task.tokenize, errors)
    return write_predictions(output_path, kind, examples, task.predict(examples, batch_size), task.info["max_length"])
