"""Training a task model: read the data, cache the biLM's layers once, train, keep the best epoch on dev.

    train_task(settings) -> TrainResult          one model, written to settings.output
    (compare.py runs `fit` once per ELMo arm on shared `TaskData` and one `LayerCache`)

The loop is plain: Adam, batches of shuffled sentences (seeded), the kind's loss (`TaskKind.loss`: cross-entropy
over real tokens for tagging, over texts for classification), the dev metric after every epoch, and a copy of the
weights of the best epoch. Seconds per epoch and the biLM's seconds within them are logged, so the layer cache's
effect can be measured
(``--no-cache`` runs the biLM on every batch of every epoch).
"""
from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from elmo_cli.loading import resolve_device
from elmo_cli.model_files import ModelFiles, model_files
from elmo_cli.tasks import formats
from elmo_cli.tasks.crf import count_violations
from elmo_cli.tasks.features import LayerCache
from elmo_cli.tasks.kinds import TaskKind, get_kind
from elmo_cli.tasks.metrics import detect_span_scheme, primary, primary_name
from elmo_cli.tasks.model import TaskConfig, TaskModel, build_words
from elmo_cli.tasks.predict import evaluate_examples, fill_cache
from elmo_cli.tasks.store import build_elmo, save_task, tuned_bilm
from elmo_cli.tasks.vectors import read_vectors
from vocab.errors import ElmoError


def elmo_arm(layers: str, bilm: bool, embeddings: bool, no_elmo: bool) -> tuple[str, str]:
    """The ELMo arm of a task from what was given: exactly one of a biLM (or a file of its layers, ``embeddings``)
    and ``no_elmo``; ``layers`` (``--layers``) picks the arm: all -> (mix, all), top -> (top, all), "1,2" ->
    (mix, "1,2"); without ELMo ("none", "all").

    # Returns
    ``(elmo, elmo_layers)`` for `TrainSettings`.
    """
    from elmo_cli.layers import LayerSelection

    if (bilm or embeddings) == no_elmo:
        raise ElmoError("give exactly one of --model MODEL (or --embeddings F.hdf5) and --no-elmo")
    if no_elmo:
        return "none", "all"
    select = LayerSelection.parse(layers)
    if select.mode == "top":
        return "top", "all"
    if select.mode == "indices":
        return "mix", ",".join(map(str, select.indices))
    if select.mode != "all":
        raise ElmoError(f"--layers {layers!r}: the task learns its own mix; use all, top or layer indices such as 1,2")
    return "mix", "all"


@dataclass
class TrainSettings:
    kind: str
    train_path: Path
    dev_path: Path
    output: Path | None = None
    model_dir: "Path | ModelFiles | None" = None  # the biLM; None = no ELMo (unless `embeddings` holds every sentence)
    embeddings: Path | None = None  # a dump-embeddings --layers all file read before running the biLM
    elmo: str = "mix"  # none | top | mix
    elmo_layers: str = "all"  # the layers the input mix uses: all or indices such as "1,2"
    elmo_output: bool = False
    layer_norm: bool = False
    epochs: int = 50  # an upper bound: training stops earlier when dev stops improving (`patience`)
    patience: int = 5  # stop after this many epochs without a better dev metric (0: run every epoch)
    max_time: float | None = None  # seconds for the whole run
    batch_size: int = 64
    lr: float = 1e-3
    seed: int = 0
    word_vectors: Path | None = None
    min_count: int = 1
    word_dim: int = 100
    hidden_dim: int = 128
    label_column: str = "upos"
    fmt: str = "auto"
    max_length: int = 200
    cache: bool = True
    cache_dtype: str = "float32"
    cache_max_mb: int = 2048
    device: str = "auto"
    errors: str = "strict"  # invalid UTF-8 in the data files: strict (stop) | replace
    crf: bool = False  # tagging: a CRF head with exact Viterbi decoding
    char_cnn: bool = False  # word features from characters too (every arm of --compare)
    fine_tune_bilm: bool = False  # the biLM trains with the task (no layer cache)
    bilm_lr: float = 1e-4  # its Adam learning rate (the task's is `lr`)
    unfreeze_after: int = 0  # epochs with the biLM frozen before it trains


@dataclass
class TaskData:
    train: list[formats.Example]  # split into pieces of at most max_length tokens
    dev: list[formats.Example]  # as read (prediction splits and re-joins)
    labels: tuple[str, ...]
    warnings: list[str] = field(default_factory=list)


@dataclass
class TrainResult:
    model: TaskModel
    metrics: dict  # what metrics.json holds
    warnings: list[str]


def load_embedder(model_dir: "Path | ModelFiles | None", device: str = "auto"):
    """The biLM as an `Embedder`, or None; a directory without weights is an ElmoError naming the file."""
    if model_dir is None:
        return None
    from elmo_cli.embed import Embedder

    return Embedder(model_dir, device=device)


def read_data(s: TrainSettings, tokenize: formats.Tokenize = formats.whitespace) -> TaskData:
    """Train and dev examples, the label set (from train), and warnings: split sentences, dev-only labels."""
    train = formats.read_examples(s.train_path, s.kind, s.fmt, s.label_column, tokenize, s.errors)
    dev = formats.read_examples(s.dev_path, s.kind, s.fmt, s.label_column, tokenize, s.errors)
    warnings = []
    pieces, n_split = formats.split_long(train, s.max_length)
    _, n_dev_split = formats.split_long(dev, s.max_length)
    for n, path in ((n_split, s.train_path), (n_dev_split, s.dev_path)):
        if n:
            warnings.append(f"{path}: {n} sentence(s) longer than --max-length {s.max_length} split into pieces")
    if s.crf:
        if not get_kind(s.kind).per_token:
            raise ElmoError("--crf is a tagging head: use it with --kind tagging (or another per-token kind)")
        scheme = detect_span_scheme([ex.labels for ex in train])
        bad = count_violations([ex.labels for ex in train], scheme)
        if bad:
            warnings.append(f"{s.train_path}: {bad} sentence(s) have label transitions that {scheme} forbids "
                            f"(trained on as they are; the CRF never predicts them)")
    kind = get_kind(s.kind)
    labels = _labels(kind, train)
    dev_only = sorted(_labels(kind, dev) - set(labels))
    if dev_only:
        warnings.append(f"{s.dev_path}: label(s) {', '.join(dev_only[:10])} absent from {s.train_path} "
                        f"(never predicted, counted wrong)")
    return TaskData(pieces, dev, tuple(sorted(labels)), warnings)


def _labels(kind: TaskKind, examples: list[formats.Example]) -> set[str]:
    return {lab for ex in examples for lab in kind.labels_of(ex.labels)}


def task_config(s: TrainSettings, data: TaskData, tokenizer: str) -> TaskConfig:
    words, counts = build_words([ex.tokens for ex in data.train], s.min_count)
    scheme = detect_span_scheme([ex.labels for ex in data.train]) if s.crf else None
    return TaskConfig(kind=s.kind, labels=data.labels, words=words, word_counts=counts, word_dim=s.word_dim,
                      hidden_dim=s.hidden_dim, elmo=s.elmo, elmo_layers=s.elmo_layers,
                      elmo_output=s.elmo_output, layer_norm=s.layer_norm,
                      label_column=s.label_column, max_length=s.max_length, tokenizer=tokenizer,
                      crf=s.crf, span_scheme=scheme, char_cnn=s.char_cnn,
                      fine_tune_bilm=s.fine_tune_bilm and (s.elmo != "none" or s.elmo_output),
                      **_bilm_record(s.model_dir))


def _bilm_record(model) -> dict:
    """What config.json records of the biLM: its directory, or its options and weights files (absolute)."""
    if model is None:
        return {}
    files = model_files(model)
    if files.directory is not None:
        return {"elmo_model": str(files.directory.resolve())}
    return {"elmo_model": str(files.options.resolve()), "elmo_weights": str(files.weights.resolve())}


def init_word_vectors(model: TaskModel, path: Path) -> str:
    """Copy the vectors of `path` into the word embedding (its dim must be the model's); returns a summary."""
    dim, found = read_vectors(path, set(model.config.words))
    if dim != model.config.word_dim:
        raise ElmoError(f"{path}: vectors have {dim} dimensions but the word embedding has {model.config.word_dim}")
    with torch.no_grad():
        for word, vec in found.items():
            model.embed.weight[model.index[word]] = torch.from_numpy(vec)
    return f"{path}: {len(found):,} of {len(model.config.words) - 2:,} training words initialised"


def make_cache(s: TrainSettings, embedder) -> LayerCache | None:
    if s.fine_tune_bilm or (not s.cache and s.embeddings is None):  # a biLM that trains cannot be cached
        return None
    return LayerCache(embedder, s.cache_dtype, s.cache_max_mb << 20, s.embeddings)


def build_model(s: TrainSettings, data: TaskData, embedder, cache: LayerCache | None, tokenizer: str
                ) -> tuple[TaskModel, list[str]]:
    """A fresh model for the settings' arm, seeded with ``s.seed``; notes about word vectors, if any."""
    seed_everything(s.seed)
    config = task_config(s, data, tokenizer)
    notes = []
    if s.word_vectors is not None:
        dim, _ = read_vectors(s.word_vectors, set())
        config = replace(config, word_dim=dim)
    elmo_in, elmo_out = build_elmo(config, embedder, cache)
    model = TaskModel(config, elmo_in, elmo_out, tuned_bilm(config, embedder)).to(resolve_device(s.device))
    if s.word_vectors is not None:
        notes.append(init_word_vectors(model, s.word_vectors))
    return model, notes


def _loss(model: TaskModel, batch: list[formats.Example], label_index: dict[str, int]) -> torch.Tensor:
    """The kind's loss (`TaskKind.loss`) of one batch against its targets (`TaskKind.targets`)."""
    logits, mask = model([ex.tokens for ex in batch])  # (B, T, C) or (B, C); (B, T)
    target = model.kind.targets(batch, label_index, mask.shape[1]).to(logits.device)  # (B, T) or (B,)
    return model.kind.loss(logits, target, mask, model.crf)


def fit(model: TaskModel, s: TrainSettings, data: TaskData,
        on_epoch: Callable[[dict], None] | None = None) -> dict:
    """Train `model` in place; it ends with the weights of its best dev epoch. Returns metrics.json's dict."""
    if s.epochs < 1:
        raise ElmoError(f"--epochs must be at least 1, got {s.epochs}")
    if s.patience < 0:
        raise ElmoError(f"--patience must be 0 (off) or more, got {s.patience}")
    rng = random.Random(s.seed)
    bilm = list(model.bilm.parameters()) if model.bilm is not None else []
    tuned = {id(p) for p in bilm}
    groups = [{"params": [p for p in model.parameters() if p.requires_grad and id(p) not in tuned], "lr": s.lr}]
    opt = torch.optim.Adam(groups + ([{"params": bilm, "lr": s.bilm_lr}] if bilm else []))
    label_index = {lab: k for k, lab in enumerate(model.config.labels)}
    elmo = model.elmo_in or model.elmo_out
    cache = elmo.cache if elmo is not None else None
    fill = _fill_seconds(model, cache, data)
    best, best_state, history, start, stopped = None, None, [], time.perf_counter(), "epochs"
    for epoch in range(1, s.epochs + 1):
        if model.bilm is not None:  # frozen for the first `unfreeze_after` epochs (no graph through it then)
            model.bilm.requires_grad_(epoch > s.unfreeze_after)
        t0, cpu0, bilm0 = time.perf_counter(), time.process_time(), _bilm_seconds(model)
        loss = _train_epoch(model, opt, data.train, s.batch_size, rng, label_index)
        seconds, (bilm1, bilm_cpu1) = time.perf_counter() - t0, _bilm_seconds(model)
        cpu = time.process_time() - cpu0  # CPU seconds of all threads: steadier than wall time on a shared machine
        t1 = time.perf_counter()
        dev = evaluate_examples(model, data.dev)
        row = {"epoch": epoch, "train_loss": loss, "dev": dev, "seconds": seconds, "cpu_seconds": cpu,
               "bilm_seconds": bilm1 - bilm0[0], "bilm_cpu_seconds": bilm_cpu1 - bilm0[1],
               "dev_seconds": time.perf_counter() - t1, "peak_rss_mb": _peak_rss_mb()}
        history.append(row)
        if best is None or primary(dev) > primary(best["dev"]):
            best, best_state = row, copy.deepcopy(model.state_dict())
        if on_epoch is not None:
            on_epoch(row)
        if s.patience and epoch - best["epoch"] >= s.patience:
            stopped = "patience"
            break
        if s.max_time is not None and time.perf_counter() - start > s.max_time:
            stopped = "max_time"
            break
    model.load_state_dict(best_state)
    return {"best_epoch": best["epoch"], "epochs_run": len(history), "stopped": stopped,
            "metric": primary_name(best["dev"]), "dev": best["dev"],
            "history": history, "cache_fill_seconds": fill[0], "cache_fill_cpu_seconds": fill[1],
            "cached_sentences": len(cache) if cache else 0,
            "seed": s.seed, "train": str(s.train_path), "dev_path": str(s.dev_path)}


def _peak_rss_mb() -> float:
    """This process's peak resident memory so far, MB (Linux reports kB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _fill_seconds(model: TaskModel, cache: LayerCache | None, data: TaskData) -> tuple[float, float]:
    """Fill the layer cache with the train and dev sentences now (the biLM's one run); its wall and CPU seconds."""
    if cache is None:
        return 0.0, 0.0
    wall, cpu = cache.bilm_seconds, cache.bilm_cpu_seconds
    dev_pieces, _ = formats.split_long(data.dev, model.config.max_length)
    fill_cache(model, [ex.tokens for ex in data.train] + [ex.tokens for ex in dev_pieces])
    return cache.bilm_seconds - wall, cache.bilm_cpu_seconds - cpu


def _bilm_seconds(model: TaskModel) -> tuple[float, float]:
    """Wall and CPU seconds spent in the biLM so far (by the cache, or by ElmoFeatures without one)."""
    elmo = model.elmo_in or model.elmo_out
    if elmo is None:
        return 0.0, 0.0
    timer = elmo.cache if elmo.cache is not None else elmo
    return timer.bilm_seconds, timer.bilm_cpu_seconds


def _train_epoch(model: TaskModel, opt: torch.optim.Optimizer, examples: list[formats.Example], batch_size: int,
                 rng: random.Random, label_index: dict[str, int]) -> float:
    """One pass in a seeded random order; returns the mean batch loss."""
    model.train()
    order = list(range(len(examples)))
    rng.shuffle(order)
    total, n = 0.0, 0
    for s in range(0, len(order), batch_size):
        batch = [examples[k] for k in order[s : s + batch_size]]
        loss = _loss(model, batch, label_index)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        total, n = total + loss.item(), n + 1
    return total / max(n, 1)


def tokenizer_of(embedder) -> tuple[formats.Tokenize, str]:
    """The biLM's tokenizer (its SentencePiece model, else whitespace) when there is a biLM, else whitespace."""
    return (embedder.tokenize, "bilm") if embedder is not None else (formats.whitespace, "whitespace")


def check_settings(s: TrainSettings) -> None:
    """Options that cannot go together, each refused in one line naming them."""
    if s.fine_tune_bilm:
        if s.elmo == "none" and not s.elmo_output:
            raise ElmoError("--fine-tune-bilm needs ELMo: it cannot go with --no-elmo")
        if s.embeddings is not None:
            raise ElmoError("--fine-tune-bilm trains the biLM, so precomputed --embeddings cannot stand in for it; "
                            "give --model")
        if s.model_dir is None:
            raise ElmoError("--fine-tune-bilm needs the biLM: give --model")
    if s.unfreeze_after and not s.fine_tune_bilm:
        raise ElmoError("--unfreeze-after only applies with --fine-tune-bilm")


def train_task(s: TrainSettings, on_epoch: Callable[[dict], None] | None = None) -> TrainResult:
    """Read the data, train one model, write ``s.output``; see the module docstring."""
    check_settings(s)
    if s.elmo != "none" or s.elmo_output:
        if s.model_dir is None and s.embeddings is None:
            raise ElmoError("give the biLM with --model ELMO_DIR (or --embeddings F.hdf5), or train without "
                            "ELMo with --no-elmo")
    embedder = load_embedder(s.model_dir, s.device) if s.elmo != "none" or s.elmo_output else None
    tokenize, tokenizer = tokenizer_of(embedder)
    data = read_data(s, tokenize)
    cache = make_cache(s, embedder) if s.elmo != "none" or s.elmo_output else None
    try:
        model, notes = build_model(s, data, embedder, cache, tokenizer)
        metrics = fit(model, s, data, on_epoch)
    finally:
        if cache is not None:
            cache.close()
    if s.output is not None:
        save_task(s.output, model, metrics)
    return TrainResult(model, metrics, data.warnings + notes)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
