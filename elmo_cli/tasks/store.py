"""The task directory, written atomically (built under a temporary name beside it, then renamed):

    config.json    `TaskConfig` (kind, labels, vocabulary, sizes, which ELMo arm, the biLM directory)
    weights.pt     the task model's state dict (plain tensors; the frozen biLM is not in it), loaded weights_only
    labels.txt     the label set, one per line (the order of the output layer)
    mix.json       the learned ELMo mixes: softmax-normalised weights over the L+1 layers and gamma, per mix
    metrics.json   per-epoch loss, dev metrics and seconds; the best epoch (the weights kept) and its dev metrics

A directory that exists is replaced only when it is a task directory (has config.json and weights.pt) or empty.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import torch

from elmo_cli.loading import resolve_device
from elmo_cli.tasks.features import ElmoFeatures, LayerCache
from elmo_cli.tasks.model import TaskConfig, TaskModel
from vocab.errors import ElmoError
from vocab.text import publish_dir, read_json, temporary_path

FORMAT_VERSION = 1


def save_task(directory: Path, model: TaskModel, metrics: dict) -> None:
    """Write the task directory; on any error nothing is left but what was there before."""
    directory = Path(directory)
    if directory.exists() and not _replaceable(directory):
        raise ElmoError(f"{directory}: exists and is not a task directory; choose another --output")
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(directory)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        config = model.config.to_dict()
        _write(tmp / "config.json", json.dumps({"format_version": FORMAT_VERSION, **config}, indent=1) + "\n")
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, tmp / "weights.pt")
        _write(tmp / "labels.txt", "".join(f"{label}\n" for label in model.config.labels))
        _write(tmp / "mix.json", json.dumps(model.mix_summary(), indent=1) + "\n")
        _write(tmp / "metrics.json", json.dumps(metrics, indent=1) + "\n")
        publish_dir(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _replaceable(directory: Path) -> bool:
    if not directory.is_dir():
        return False
    names = {p.name for p in directory.iterdir()}
    return not names or {"config.json", "weights.pt"} <= names


def read_config(directory: Path) -> TaskConfig:
    directory = Path(directory)
    if not (directory / "config.json").is_file() or not (directory / "weights.pt").is_file():
        raise ElmoError(f"{directory}: not a task directory (needs config.json and weights.pt from "
                        f"`elmo-cli task train`)")
    raw = read_json(directory / "config.json", "task config")
    if not isinstance(raw, dict) or raw.pop("format_version", None) != FORMAT_VERSION:
        raise ElmoError(f"{directory / 'config.json'}: not a task config of format version {FORMAT_VERSION}")
    return TaskConfig.from_dict(raw, str(directory / "config.json"))


def load_task(directory: Path, embedder=None, cache: LayerCache | None = None, device: str = "auto"
              ) -> TaskModel:
    """Rebuild the task model of a task directory, in eval mode. With ELMo, `embedder` (or a `cache` holding
    every sentence) supplies the biLM; the caller loads it from ``config.elmo_model``. A fine-tuned model takes
    its tuned biLM weights from weights.pt."""
    config = read_config(directory)
    elmo_in, elmo_out = build_elmo(config, embedder, cache)
    model = TaskModel(config, elmo_in, elmo_out, tuned_bilm(config, embedder))
    try:
        state = torch.load(Path(directory) / "weights.pt", map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except (RuntimeError, OSError, EOFError) as e:
        raise ElmoError(f"{Path(directory) / 'weights.pt'}: cannot load the task weights ({str(e)[:200]})") from None
    return model.to(resolve_device(device)).eval()


def tuned_bilm(config: TaskConfig, embedder):
    """For a fine-tuning task model: its own copy of the embedder's biLM (float32), to train or to load the tuned
    weights into; else None."""
    if not config.fine_tune_bilm:
        return None
    if embedder is None:
        raise ElmoError("this task model fine-tunes its biLM: give the biLM with --model (precomputed --embeddings "
                        "hold the frozen biLM's layers)")
    return copy.deepcopy(embedder.model).float().requires_grad_(True)


def build_elmo(config: TaskConfig, embedder, cache: LayerCache | None
               ) -> tuple[ElmoFeatures | None, ElmoFeatures | None]:
    """The ElmoFeatures the config asks for (input: arm top or mix; output: a mix), sharing one embedder and cache."""
    if config.uses_elmo and embedder is None and cache is None:
        raise ElmoError("this task model uses ELMo: give the biLM (--model) or --embeddings")
    kw = {"dropout": config.elmo_dropout, "layer_norm": config.layer_norm}
    layers = "top" if config.elmo == "top" else config.elmo_layers
    elmo_in = ElmoFeatures(embedder, cache, layers, **kw) if config.elmo != "none" else None
    elmo_out = ElmoFeatures(embedder, cache, "all", **kw) if config.elmo_output else None
    return elmo_in, elmo_out
