"""The named recipes of `elmo-cli train --preset NAME`: one table, model shape and training recipe per name.

`--help` of `train` is generated from `PRESETS` (each entry's ``about``), and `build_config` merges a user's
partial config over the chosen entry, so adding a preset edits this file only.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elmo_cli.config import PUBLISHED_FILTERS, CharCNNConfig, LSTMConfig, ModelConfig
from elmo_cli.train_config import RunConfig, TrainingConfig, merge_config, read_config_file
from vocab.errors import ElmoError

DEFAULT_PRESET = "tiny"


@dataclass(frozen=True)
class Preset:
    config: RunConfig
    about: str  # one line for --help


def _shape(dim: int, proj: int, cnn: CharCNNConfig) -> ModelConfig:
    return ModelConfig(char_cnn=cnn, lstm=LSTMConfig(dim=dim, projection_dim=proj, n_layers=2, cell_clip=3.0,
                                                     proj_clip=3.0))


# Small filters keep the char CNN (the CPU bottleneck) cheap: the CPU shapes' character encoder.
SMALL_CNN = CharCNNConfig(filters=((1, 32), (2, 32), (3, 64), (4, 128)), n_highway=1)

# Every model shape a preset or `--preset auto` trains, by name: the CPU shapes (the small char CNN) and bilm-tf's
# published ones (its 2,048-filter CNN; `small`, `medium`, `original`). `768/192` is the middle rung measured for
# auto's ladder and left off it (docs/auto.md); `bench_quality --shape 768/192` trains it.
MODEL_SHAPES: dict[str, ModelConfig] = {
    "512/128": _shape(512, 128, SMALL_CNN),
    "768/192": _shape(768, 192, SMALL_CNN),
    "1024/256": _shape(1024, 256, SMALL_CNN),
    "small": _shape(1024, 128, CharCNNConfig(filters=PUBLISHED_FILTERS, n_highway=1)),
    "medium": _shape(2048, 256, CharCNNConfig(filters=PUBLISHED_FILTERS, n_highway=1)),
    "original": _shape(4096, 512, CharCNNConfig(filters=PUBLISHED_FILTERS, n_highway=2)),
}


# The demo: about 3 minutes on 2 quiet CPU cores over examples/austen_train.txt (205k tokens, 8k-word vocabulary).
# Small filters keep the char CNN (the CPU bottleneck) cheap. Batch 32 (not 128) gives 4x more updates in the same
# time, which matters more than batch size this early in training; 1024 negatives (not 8192) because 8192 would be
# the whole vocabulary (then the "sampled" loss is just the full softmax, 5x the softmax work per step); dropout is
# kept. lr 0.6, not 0.2: Adagrad with initial accumulator 1 takes tiny steps while gradients are small, and the demo
# has 640 steps, not bilm-tf's hundreds of thousands. Chosen on the demo (held-out full-softmax perplexity,
# forward/backward, after 640 steps, measured with states carried across sentences): 5,116-word vocabulary:
# lr 0.2 -> 244/272, 0.6 -> 198/205, 1.0 -> 154/218; 8,154-word vocabulary: 0.6 -> 283/290, 1.0 -> 262/673 (the
# backward direction degraded); 2.0 diverged. With the per-sentence state reset, `make demo` (lr 0.6) ends at
# 281/290, stateless, against 511 for an add-one unigram model of the training text.
_TINY = RunConfig(
    model=MODEL_SHAPES["512/128"],
    training=TrainingConfig(batch_size=32, unroll_steps=20, lr=0.6, n_negative_samples=1024, epochs=2.0,
                            checkpoint_every=200, validation_every=160, log_every=10),
)

# Laptop: corpora of 0.5-10M tokens on a CPU, trained to a time budget (`--max-time`; by default one hour, or 40
# epochs if that comes first). The tiny shape with Adam, a short warmup and a cosine decay laid over the budget.
# Chosen by measurement (benchmarks/bench_quality.py's split of the Austen corpus: 780,554 training tokens, every
# 10th chapter held out, 9,946-word vocabulary, KN5 79.96, KN3 81.37; full-softmax held-out average perplexity).
# The machine was shared (load 4-9 on 2 cores), so each candidate got a budget of 4 CPU-minutes on 1 thread (the
# --max-time clock of `train` read as process time by a driver script), not wall time, and was validated once at
# the end; tokens per CPU-second in brackets (they vary by ~15% between identical runs on that machine):
#   tiny as it is (Adagrad 0.6, 1,024 sampled negatives, batch 32)       259.4 (1,414)
#   Adam 2e-3, full softmax                                              182.3 (907)
#   Adam 2e-3, 1,024 sampled negatives                                   121.5 (1,657)
#   Adam 2e-3, 2,048 sampled negatives                                   135.8 (1,437)
#   Adam 3e-3, 1,024 sampled negatives, batch 64                         135.8 (1,874)
#   Adam 4e-3, 1,024 sampled negatives                                   104.1 (1,668)
#   the same (this preset) with 6 CPU-minutes: 1,142 steps, 0.94 epoch     86.2 (1,870), biLM/KN5 1.078
#   the same with 10 CPU-minutes: 1,741 steps, 1.43 epochs                 73.4 (1,769), biLM/KN5 0.919
# (all Adam runs: cosine to 0, warmup 0.03, batch 32 unless stated, dropout 0.1; every run the tiny shape). The
# full softmax costs nearly 2x per token for no gain at a fixed budget, 2,048 negatives lose to 1,024, batch 32
# beats 64 (more updates), lr 4e-3 beats 2e-3. Dropout is 0.3, not the 0.1 of those short runs: a 2-hour budget on 2
# cores passes a 1M-token corpus about 25 times, and 0.1 is light for that many epochs of a model this size (not
# compared head to head at 2 hours). `python -m benchmarks.bench_quality` (2 quiet cores, wall clock, this preset as
# it is, --max-time 2h) measured held-out average perplexity 71.5 at 15 minutes, 61.2 at 30, 53.0 at 60 and 48.9 at
# 120: biLM/KN5 0.894, 0.766, 0.663, 0.612 (benchmarks/results/laptop-austen-2h.json), within the targets this
# recipe was chosen against (`TARGETS["laptop"]` in benchmarks/bench_quality.py).
_LAPTOP = RunConfig(
    model=_TINY.model,
    training=TrainingConfig(batch_size=32, unroll_steps=20, optimizer="adam", lr=4e-3, lr_schedule="cosine",
                            warmup=0.03, n_negative_samples=1024, dropout=0.3, epochs=40.0, max_time=3600.0,
                            validation_minutes=10.0, checkpoint_every=1000),
)

PRESETS: dict[str, Preset] = {
    "tiny": Preset(_TINY, "512-cell LSTMs, P 128, small char CNN, bilm-tf's Adagrad: a quick pipeline check"),
    "laptop": Preset(_LAPTOP, "tiny's shape, Adam + cosine over --max-time (default 1h): the CPU recipe, 0.5-10M "
                              "tokens"),
    "small": Preset(RunConfig(MODEL_SHAPES["small"]), "bilm-tf's 2x1024_128_2048cnn_1xhighway, bilm-tf's recipe"),
    "medium": Preset(RunConfig(MODEL_SHAPES["medium"]), "bilm-tf's 2x2048_256_2048cnn_1xhighway, bilm-tf's recipe"),
    "original": Preset(RunConfig(MODEL_SHAPES["original"]), "the paper's 2x4096_512_2048cnn_2xhighway, bilm-tf's "
                                                           "recipe"),
}

AUTO = "auto"  # not a table entry: `elmo_cli.auto` chooses the shape and recipe for the corpus, budget and machine
AUTO_ABOUT = ("measures this machine, then picks shape, dtype and dropout for the corpus and the budget "
              "(--max-time, --epochs or --max-steps, required); laptop's recipe otherwise")
PRESETS_HELP = f"Recipe: {', '.join(PRESETS)} or {AUTO} (default {DEFAULT_PRESET}; the table above)."


def _length(t: TrainingConfig) -> str:
    if t.max_time:
        return f"{t.max_time / 3600:g} h or {t.epochs:g} ep"
    return f"{t.max_steps:,} steps" if t.max_steps else f"{t.epochs:g} epochs"


def presets_table() -> str:
    """The presets as a fixed-width table for `train --help`: shape, optimizer, lr, batch, dropout, length, use."""
    rows = [("preset", "LSTM/proj", "char CNN", "optimizer", "lr", "batch", "drop", "length")]
    for name, p in PRESETS.items():
        m, t = p.config.model, p.config.training
        sched = "" if t.lr_schedule == "constant" else f"+{t.lr_schedule}"
        rows.append((name, f"{m.lstm.dim}/{m.lstm.projection_dim}",
                     f"{m.char_cnn.n_filters} x{m.char_cnn.n_highway}hw", f"{t.optimizer}{sched}", f"{t.lr:g}",
                     str(t.batch_size), f"{t.dropout:g}", _length(t)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines += [f"{name}: {p.about}" for name, p in PRESETS.items()] + [f"{AUTO}: {AUTO_ABOUT}"]
    return "\b\n" + "\n".join(lines)


def preset_config(name: str) -> RunConfig:
    if name not in PRESETS:
        raise ElmoError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)} or {AUTO}")
    return PRESETS[name].config


def build_config(user: dict[str, Any] | None = None, preset: str = DEFAULT_PRESET, source: str = "config"
                 ) -> RunConfig:
    """The preset's configuration with the user's (partial) dict merged over it; every key checked."""
    return merge_config(preset_config(preset), user, source)


def load_config(path: Path | None = None, preset: str | None = None) -> RunConfig:
    """Read a config JSON file (partial; the rest from `preset`, default ``tiny``)."""
    user = read_config_file(Path(path)) if path is not None else None
    return build_config(user, preset or DEFAULT_PRESET, source=str(path) if path else "config")
