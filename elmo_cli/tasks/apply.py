"""Using a trained task directory: `evaluate_file` (metrics on a labelled file) and `predict_file` (labels for
raw text or a CoNLL file, written atomically).

The biLM is loaded from the files recorded in the task's config.json (``elmo_model``, ``elmo_weights``) when the model uses ELMo
or its tokenizer is the biLM's; ``embeddings`` (a dump-embeddings ``--layers all`` file) is read first if given.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from elmo_cli.tasks import formats
from elmo_cli.tasks.features import LayerCache
from elmo_cli.tasks.kinds import TaskKind
from elmo_cli.tasks.model import TaskModel
from elmo_cli.tasks.predict import evaluate_examples, predict_examples
from elmo_cli.tasks.store import load_task, read_config
from elmo_cli.tasks.train import load_embedder
from vocab.errors import ElmoError
from vocab.text import atomic_writer


@dataclass
class LoadedTask:
    model: TaskModel
    tokenize: formats.Tokenize
    cache: LayerCache | None

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()


def open_task(task_dir: Path, embeddings: Path | None = None, device: str = "auto") -> LoadedTask:
    """The task model with its biLM (and a layer cache) ready; close() it when done."""
    config = read_config(task_dir)
    embedder = None
    if config.tokenizer == "bilm" or (config.uses_elmo and embeddings is None):
        embedder = load_embedder(config.bilm_files(str(Path(task_dir) / "config.json")), device)
    if config.fine_tune_bilm and embeddings is not None:
        raise ElmoError(f"{Path(task_dir) / 'config.json'}: this task model fine-tuned its biLM, so --embeddings (the "
                        f"frozen biLM's layers) do not apply; leave it out")
    cache = LayerCache(embedder, precomputed=embeddings) if config.uses_elmo and not config.fine_tune_bilm else None
    model = load_task(task_dir, embedder, cache, device)
    tokenize = embedder.tokenize if config.tokenizer == "bilm" else formats.whitespace
    return LoadedTask(model, tokenize, cache)


def evaluate_file(task_dir: Path, test_path: Path, fmt: str = "auto", embeddings: Path | None = None,
                  batch_size: int = 64, device: str = "auto", errors: str = "strict") -> dict:
    """The task's metrics on a labelled file (see `predict.evaluate_examples`), plus how many sentences were split."""
    task = open_task(task_dir, embeddings, device)
    try:
        cfg = task.model.config
        examples = formats.read_examples(test_path, cfg.kind, fmt, cfg.label_column, task.tokenize, errors)
        metrics = evaluate_examples(task.model, examples, batch_size)
        metrics["split_sentences"] = formats.split_long(examples, cfg.max_length)[1]
        metrics["kind"] = cfg.kind
        return metrics
    finally:
        task.close()


def predict_file(task_dir: Path, input_path: Path, output_path: Path, fmt: str = "auto",
                 embeddings: Path | None = None, batch_size: int = 64, device: str = "auto",
                 errors: str = "strict") -> dict:
    """Label every sentence of `input_path`; write the kind's prediction file (`write_predictions`). Returns counts
    (sentences, tokens, sentences split)."""
    task = open_task(task_dir, embeddings, device)
    try:
        cfg = task.model.config
        examples = formats.read_unlabelled(input_path, cfg.kind, fmt, cfg.label_column, task.tokenize, errors)
        guess = predict_examples(task.model, examples, batch_size)
    finally:
        task.close()
    return write_predictions(output_path, cfg.task_kind, examples, guess, cfg.max_length)


def write_predictions(output_path: Path, kind: TaskKind, examples: list[formats.Example], guess: list,
                      max_length: int) -> dict:
    """Write the kind's prediction file (`TaskKind.write`: CoNLL token TAB label for tagging, TSV label TAB text
    for classification) atomically; returns counts (sentences, tokens, sentences split)."""
    text = kind.write(examples, guess)
    with atomic_writer(output_path) as f:
        f.write(text.encode("utf-8"))
    return {"sentences": len(examples), "tokens": sum(len(ex.tokens) for ex in examples),
            "split_sentences": formats.split_long(examples, max_length)[1], "output": str(output_path)}
