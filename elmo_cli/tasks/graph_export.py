"""`task export --format onnx` and `task predict --onnx`: a whole task model as one ONNX graph, run by onnxruntime.

Every task model exports (plain, `--crf`, `--char-cnn`, `--fine-tune-bilm`, any mix): the graph (`TaskGraph`) runs
`TaskModel.scores` and `TaskModel.label_ids`, the code `task train` and `task predict` run, with the biLM inside as
`elmo_cli.graph_export.BiLMGraph` (a `--fine-tune-bilm` model's own tuned copy). The exported directory::

    model.onnx    inputs, in this order, those the model uses:
                    char_ids   int64 (B, T, W)  the biLM's characters (allennlp batch_to_ids, as for the biLM's
                                                export; chars.json); only with ELMo
                    word_ids   int64 (B, T)     rows of words.txt; 0 = padding, 1 = <UNK> for any other word
                    word_chars int64 (B, T, 24) only with --char-cnn: the task's own character CNN's ids, a
                                                separate input (not derived from char_ids): the same rule in
                                                UTF-8 bytes whatever the biLM's chars.json says, words cut at 22
                                                bytes (begin-of-word 259, byte + 1, end-of-word 260, then 261)
                  outputs label_ids int64 (B, T) for tagging or (B,) for classification: lines of labels.txt; with
                                  --crf the Viterbi path decoded inside the graph (the transitions the span scheme
                                  forbids excluded), 0 at padding
                          scores float32 (B, T, C) or (B, C): log-probabilities over labels.txt (with --crf the
                                 log-softmax of the CRF's emissions, per token; the labels are label_ids)
    words.txt     the word-embedding rows in order, one per line (row 0 <PAD>, row 1 <UNK>)
    labels.txt    the labels in the order of the scores
    chars.json    the biLM's character encoder; spm.model too when the task tokenizes with it
    task.json     kind, max_length, tokenizer, the unknown and padding word ids, the files' sha256, the inputs and
                  outputs by name, crf / char_cnn / fine_tune_bilm, the decoding

model.onnx's metadata_props repeat task.json (plus the biLM's options and character map), so `task predict --onnx`
refuses a words.txt or labels.txt that is not the one the graph was exported with. Before the directory gets its
final name, onnxruntime runs it on a few sentences made of the model's words (`check_graph`): an export whose labels
differ from the PyTorch model's is refused and leaves nothing.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import torch
from torch import nn

from elmo_cli.inputs import length_sorted_batches
from elmo_cli.loading import model_text
from elmo_cli.graph_export import BiLMGraph, char_batch, example_chars, require_serving, bilm_graph, write_onnx
from elmo_cli.tasks import formats
from elmo_cli.tasks.kinds import get_kind
from elmo_cli.tasks.model import CHAR_CNN_WIDTH, TaskModel, encode_batch
from elmo_cli.tasks.predict import join_pieces, predict_examples
from vocab.chars import load_chars
from vocab.errors import ElmoError
from vocab.text import check_new_output, publish_dir, temporary_path
from vocab.tokenize import SPM_FILE, TextEncoder

MODEL_FILE, WORDS_FILE, LABELS_FILE, TASK_FILE = "model.onnx", "words.txt", "labels.txt", "task.json"


class TaskGraph(nn.Module):
    """The exported graph: `TaskModel.scores` and `TaskModel.label_ids` (eval mode; the code `task train` and
    `task predict` run) on the graph's inputs, the biLM inside as `BiLMGraph` (the task's fine-tuned copy when
    it has one).

    # Parameters
    model : `TaskModel`, used as it is.
    bilm : `BiLMGraph`, optional: the biLM, when the task uses ELMo.
    """

    def __init__(self, model: TaskModel, bilm: BiLMGraph | None):
        super().__init__()
        self.task, self.bilm = model.eval(), bilm
        self.names = ((["char_ids"] if bilm is not None else []) + ["word_ids"] +
                      (["word_chars"] if model.char_cnn is not None else []))

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """
        # Parameters
        inputs : the tensors named by ``self.names``: char_ids `(B, T, W)` prediction-form character ids (with
            ELMo), word_ids `(B, T)` (0 = padding), word_chars `(B, T, 24)` (with a character CNN).

        # Returns
        label ids `(B, T)` (tagging; with a CRF its Viterbi path, 0 at padding) or `(B,)`, and log-probabilities
        `(B, T, C)` or `(B, C)` (with a CRF: the log-softmax of its emissions).
        """
        feed = dict(zip(self.names, inputs))
        word_ids = feed["word_ids"]
        layers = self.bilm(feed["char_ids"])[0].transpose(0, 1) if self.bilm is not None else None  # (L+1, B, T, 2P)
        logits = self.task.scores(word_ids, feed.get("word_chars"), layers)  # (B, T, C) or (B, C)
        return self.task.label_ids(logits, word_ids != 0), torch.log_softmax(logits, dim=-1)


def _graph(model: TaskModel, embedder, chars) -> tuple[TaskGraph, tuple, dict]:
    """The module to export, its example inputs and the dynamic axes, per input named in ``module.names``."""
    bilm = None
    if embedder is not None:  # the task's own fine-tuned copy of the biLM, else the frozen one
        loaded = embedder.loaded if model.bilm is None else dataclasses.replace(embedder.loaded, model=model.bilm)
        bilm = bilm_graph(loaded)
    module = TaskGraph(model, bilm)
    sentences = [["The", "cat", "sat"], ["A", "dog"]]
    ids = {k: torch.from_numpy(v) for k, v in encode_batch(sentences, model.index, model.char_cnn is not None).items()}
    if embedder is not None:
        ids["char_ids"] = example_chars(chars)
    B, T = torch.export.Dim("batch"), torch.export.Dim("tokens")
    return module, tuple(ids[n] for n in module.names), (tuple({0: B, 1: T} for _ in module.names),)  # *inputs


def check_graph(directory: Path, model: TaskModel, source: Path) -> None:
    """ElmoError unless the exported graph under `directory` gives `model`'s labels on a few sentences made of its
    words (one unknown to it, and long)."""
    words = list(model.config.words[2:]) or ["x"]
    sentences = [[words[(7 * k + i) % len(words)] for i in range(n)] for k, n in enumerate((1, 2, 3, 5, 8, 13))]
    examples = [formats.Example(s, None) for s in sentences + [["Ünknöwn-" + "x" * 30, *words[:2]]]]
    want, got = predict_examples(model, examples), OnnxTask(directory).predict(examples)
    bad = sum(w != g for w, g in zip(want, got))
    if bad:
        raise ElmoError(f"{source}: the exported graph gives labels other than the PyTorch model's on {bad} of "
                        f"{len(examples)} check sentences; nothing written (run it with `elmo-cli task predict "
                        f"--task {source}`)")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _lines(items) -> str:
    return "".join(f"{x}\n" for x in items)


def _task_info(model: TaskModel, words: str, labels: str) -> dict:
    """task.json (and the graph's metadata): what a reader needs besides the graph."""
    config = model.config
    inputs = ((["char_ids"] if config.uses_elmo else []) + ["word_ids"] + (["word_chars"] if config.char_cnn else []))
    return {"kind": config.kind, "max_length": config.max_length, "tokenizer": config.tokenizer,
            "padding_word_id": 0, "unknown_word_id": config.words.index("<UNK>"), "n_words": len(config.words),
            "labels": list(config.labels), "words_sha256": _sha256(words), "labels_sha256": _sha256(labels),
            "uses_elmo": config.uses_elmo, "label_column": config.label_column, "inputs": inputs,
            "outputs": ["label_ids", "scores"], "crf": config.crf, "char_cnn": config.char_cnn,
            "fine_tune_bilm": config.fine_tune_bilm, "decoding": "crf viterbi in the graph" if config.crf else "argmax",
            **({"word_chars_width": CHAR_CNN_WIDTH} if config.char_cnn else {})}


def export_task(task_dir: Path, output: Path, fmt: str = "onnx", force: bool = False) -> list[str]:
    """Write the ONNX task directory `output` (see the module docstring), built under a temporary name, checked
    against the PyTorch model (`check_graph`) and renamed when complete. Returns the names written."""
    from elmo_cli.tasks.apply import open_task
    from elmo_cli.tasks.store import read_config

    if fmt != "onnx":
        raise ElmoError(f"--format {fmt!r}: task export writes onnx only")
    output = Path(output)
    check_new_output(output, force, directory=True)
    if output.exists() and output.is_dir() and not (output / TASK_FILE).is_file() and any(output.iterdir()):
        raise ElmoError(f"{output}: exists and is not an exported task; choose another --output")
    read_config(task_dir)  # an older or broken task directory is refused before the serving check
    require_serving()
    loaded = open_task(task_dir, device="cpu")
    try:
        model = loaded.model.cpu().eval()
        config = model.config
        embedder = (model.elmo_in or model.elmo_out).embedder if config.uses_elmo else None
        text = None
        if config.elmo_model is not None:  # the biLM's character encoder and SentencePiece model
            text = model_text(config.bilm_files(str(Path(task_dir) / "config.json")))
        words, labels = _lines(config.words), _lines(config.labels)
        info = _task_info(model, words, labels)
        chars = text.chars if text is not None else None
        module, args, dynamic = _graph(model, embedder, chars)
        metadata = {"elmo_cli.kind": "task", "elmo_cli.task": json.dumps(info)}
        if embedder is not None:
            metadata["elmo_cli.chars"] = json.dumps(chars.to_json())
            metadata["elmo_cli.options"] = json.dumps(embedder.model.config.to_options())
        tmp = temporary_path(output)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            try:
                write_onnx(module, args, (module.names, info["outputs"]), dynamic, metadata, tmp / MODEL_FILE)
            except Exception as e:  # the exporter's own messages run to many lines
                first = (str(e).strip().splitlines() or [""])[0][:200]
                raise ElmoError(f"{task_dir}: torch could not export its graph ({type(e).__name__}: {first})") from None
            (tmp / WORDS_FILE).write_text(words, encoding="utf-8")
            (tmp / LABELS_FILE).write_text(labels, encoding="utf-8")
            (tmp / TASK_FILE).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
            if chars is not None:
                (tmp / "chars.json").write_text(json.dumps(chars.to_json()) + "\n", encoding="utf-8")
            if config.tokenizer == "bilm" and text is not None and text.spm_model is not None:
                (tmp / SPM_FILE).write_bytes(text.spm_model)
            check_graph(tmp, model, Path(task_dir))
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
        """label ids `(B, T)` or `(B,)` and log-probabilities `(B, T, C)` or `(B, C)` of one batch of non-empty
        token lists."""
        feed = encode_batch(sentences, self.index, "word_chars" in self.inputs)  # word_ids [, word_chars]
        if "char_ids" in self.inputs:
            feed["char_ids"] = char_batch(self.chars, sentences)
        label_ids, scores = self.session.run(["label_ids", "scores"], feed)
        return label_ids, scores

    def predict(self, examples: list[formats.Example], batch_size: int = 64) -> list:
        """Labels as `predict.predict_examples` gives them (long sentences split into pieces and joined)."""
        max_length, kind = self.info["max_length"], get_kind(self.info["kind"])
        pieces = [p.tokens for p in formats.split_long(examples, max_length)[0]]
        out: list = [None] * len(pieces)
        for batch in length_sorted_batches([len(p) for p in pieces], batch_size):
            label_ids, scores = self.run([pieces[k] for k in batch])
            for b, k in enumerate(batch):  # a tagging piece: the graph's label ids (with a CRF its Viterbi path)
                out[k] = kind.piece(label_ids[b] if kind.per_token else scores[b], len(pieces[k]))
        return join_pieces(kind, self.labels, max_length, examples, out)


def predict_file_onnx(directory: Path, input_path: Path, output_path: Path, fmt: str = "auto",
                      batch_size: int = 64, threads: int | None = None, errors: str = "strict") -> dict:
    """`task predict --onnx`: `apply.predict_file` with the exported graph in onnxruntime (no torch model)."""
    from elmo_cli.tasks.apply import write_predictions

    task = OnnxTask(directory, threads)
    kind = task.info["kind"]
    examples = formats.read_unlabelled(input_path, kind, fmt, task.info["label_column"], task.tokenize, errors)
    guess = task.predict(examples, batch_size)
    return write_predictions(output_path, get_kind(kind), examples, guess, task.info["max_length"])
