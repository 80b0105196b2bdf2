"""The training configuration: one JSON file, a superset of bilm-tf's options.json.

    {"lstm": {...}, "char_cnn": {...},      # as in options.json (docs/formats.md, options.json); any subset, the rest from the preset
     "training": {"batch_size": 128, ...}}  # TrainingConfig fields; any subset

bilm-tf's own top-level training keys (``dropout``, ``n_epochs``, ``batch_size``, ``unroll_steps``,
``n_negative_samples_batch``, ``all_clip_norm_val``) are accepted too, so a bilm-tf options.json works as a config;
its bookkeeping keys (``n_train_tokens``, ``n_tokens_vocab``, ...) are ignored. Any other key is an error that lists
the valid ones. The effective configuration is written to ``RUN_DIR/config.json`` (`RunConfig.to_dict`).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elmo_cli.config import TRAINING_OPTION_KEYS, ModelConfig
from vocab.errors import ElmoError
from vocab.text import atomic_write_bytes, read_json


OPTIMIZERS = ("adagrad", "adam", "adamw")
LR_SCHEDULES = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class TrainingConfig:
    """Optimisation and bookkeeping. Defaults are bilm-tf's (train_elmo.py, training.py)."""

    batch_size: int = 128  # rows per process; bilm-tf's batch_size per GPU
    unroll_steps: int = 20  # T, truncated-BPTT window
    optimizer: str = "adagrad"  # adagrad (bilm-tf) | adam | adamw
    lr: float = 0.2  # the peak learning rate (bilm-tf's Adagrad: 0.2)
    initial_accumulator: float = 1.0  # Adagrad's initial_accumulator_value
    weight_decay: float = 0.0  # adamw's decoupled weight decay (adam: L2 in the gradient); not with adagrad
    # Learning rate over the run: `warmup` (fraction of the run) rises linearly from 0, then `lr_schedule`
    # constant | linear | cosine decays to `final_lr_ratio * lr` at the end. The run's progress is steps done over
    # the run's steps, or, with max_time, the larger of that and the training time over max_time: a run given a
    # time budget ends annealed.
    lr_schedule: str = "constant"
    warmup: float = 0.0
    final_lr_ratio: float = 0.0
    clip_norm: float = 10.0  # global gradient-norm clip (all_clip_norm_val)
    # Weight averaging: when > 0, validation, the model files and the end of the run use an exponential moving
    # average of the weights over the last `average` of the run's steps (a fraction: 0.03 = the last 3%); the
    # checkpoints keep the trained weights and the average both. 0 = the trained weights themselves.
    average: float = 0.0
    dropout: float = 0.1
    # Zero the LSTM states where each sentence starts. bilm-tf carried them from one sentence into the next, so its
    # models almost never saw a zero state, yet allennlp and elmo-cli embed and score every sentence from zero
    # state. Resetting trains the model for the way it is used; false gives bilm-tf's behaviour exactly.
    reset_state_per_sentence: bool = True
    n_negative_samples: int = 8192  # per direction and step; >= vocabulary size means the full softmax
    epochs: float = 10.0  # epochs of the manifest's token count: steps = epochs * total_tokens / (B * T * ranks)
    max_steps: int = 0  # when > 0, the run length in steps (instead of `epochs`)
    max_time: float = 0.0  # seconds of training of the whole run (resumed parts included); 0 = no limit
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "fp32"  # fp32 | bf16 (autocast)
    sparse_softmax: bool = True  # softmax gradients touch only the rows a batch used (single process)
    # On a GPU, one process: the LSTM stacks of every step after the first replayed from CUDA graphs
    # (elmo_cli.graphed; the same arithmetic, far fewer launches). No effect on the CPU.
    cuda_graphs: bool = True
    # On a GPU: each LSTM step's elementwise work compiled into one kernel (elmo_cli.compiled.fuse_gpu_cells; Triton,
    # which torch's CUDA builds carry), instead of a dozen launches. No effect on the CPU.
    fuse_lstm: bool = True
    # On a CPU: the LSTM layers' time loops of each training step compiled by torch.compile (elmo_cli.compiled;
    # needs a C++ compiler, about 2 minutes of compiling once a process). `--preset auto` probes it.
    compile: bool = False
    log_every: int = 10  # steps per metrics.jsonl record
    checkpoint_every: int = 500  # steps; 0 = only by time and at the end
    checkpoint_minutes: float = 30.0  # also checkpoint after this many minutes; 0 = off
    keep_checkpoints: int = 3
    # With a validation set: full-softmax validation every `validation_every` steps (0 = 20 times over the run's
    # steps) and every `validation_minutes` of training (0 = a twentieth of max_time but at least 5 minutes, else 15
    # minutes), and at the
    # end. The model files of the run directory are those of the best validation so far (`keep_best`); the
    # checkpoints keep the latest state. `patience` > 0 stops after that many validations without improvement.
    validation_every: int = 0
    validation_minutes: float = 0.0
    keep_best: bool = True
    patience: int = 0
    baseline: bool = True  # with a validation set: an order-`baseline_order` Kneser-Ney reference, computed once
    baseline_order: int = 5
    threads: int = 0  # torch intra-op threads on CPU; 0 = torch's default

    def validate(self, source: str = "config") -> None:
        positive = ("batch_size", "unroll_steps", "n_negative_samples", "log_every", "keep_checkpoints")
        for name in positive:
            if getattr(self, name) < 1:
                raise ElmoError(f"{source}: training.{name} must be at least 1, got {getattr(self, name)}")
        for name in ("lr", "epochs"):
            if not getattr(self, name) > 0:
                raise ElmoError(f"{source}: training.{name} must be positive, got {getattr(self, name)}")
        nonneg = ("initial_accumulator", "clip_norm", "max_steps", "max_time", "checkpoint_every",
                  "checkpoint_minutes", "validation_every", "validation_minutes", "threads", "weight_decay",
                  "warmup", "final_lr_ratio", "patience")
        for name in nonneg:
            if getattr(self, name) < 0:
                raise ElmoError(f"{source}: training.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ElmoError(f"{source}: training.dropout must be in [0, 1), got {self.dropout}")
        choices = {"optimizer": OPTIMIZERS, "lr_schedule": LR_SCHEDULES}
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise ElmoError(f"{source}: training.{name} must be one of {', '.join(valid)}, got "
                                f"{getattr(self, name)!r}")
        if not 0.0 <= self.average < 1.0:
            raise ElmoError(f"{source}: training.average must be in [0, 1) (a fraction of the run), got "
                            f"{self.average}")
        if self.warmup >= 1.0 or self.final_lr_ratio > 1.0:
            raise ElmoError(f"{source}: training.warmup must be below 1 and training.final_lr_ratio at most 1")
        if self.weight_decay and self.optimizer == "adagrad":
            raise ElmoError(f"{source}: training.weight_decay applies to adam and adamw, not adagrad")
        if not 1 <= self.baseline_order <= 9:
            raise ElmoError(f"{source}: training.baseline_order must be between 1 and 9, got {self.baseline_order}")
        if self.dtype not in ("fp32", "bf16"):
            raise ElmoError(f"{source}: training.dtype must be 'fp32' or 'bf16', got {self.dtype!r}")


# bilm-tf's top-level option names -> TrainingConfig fields.
BILM_TF_TRAINING_KEYS = {
    "dropout": "dropout", "n_epochs": "epochs", "batch_size": "batch_size", "unroll_steps": "unroll_steps",
    "n_negative_samples_batch": "n_negative_samples", "all_clip_norm_val": "clip_norm",
}

@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig
    training: TrainingConfig = field(default_factory=TrainingConfig)

    def to_dict(self) -> dict[str, Any]:
        d = self.model.to_options()
        d["training"] = dataclasses.asdict(self.training)
        return d

    def with_training(self, **overrides: Any) -> "RunConfig":
        """Apply the non-None overrides (CLI flags) to the training section."""
        given = {k: v for k, v in overrides.items() if v is not None}
        unknown = sorted(set(given) - {f.name for f in dataclasses.fields(TrainingConfig)})
        if unknown:
            raise ElmoError(f"unknown training option(s) {', '.join(unknown)}")
        training = dataclasses.replace(self.training, **given)
        training.validate("command line")
        return dataclasses.replace(self, training=training)


def parse_duration(text: str | None) -> float | None:
    """A command line's time budget in seconds: ``"90" / "90s" -> 90.0``, ``"5m" -> 300.0``, ``"2h" -> 7200.0``."""
    if text is None:
        return None
    units = {"s": 1, "m": 60, "h": 3600}
    t = text.strip().lower()
    try:
        return float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise ElmoError(f"--max-time {text!r}: expected seconds or a number with s, m or h (e.g. 90m)") from None


def _valid_keys_error(path: str, key: str, valid: list[str]) -> ElmoError:
    where = f"{path}.{key}" if path else key
    return ElmoError(f"unknown config key {where!r}; valid keys{' in ' + path if path else ''}: {', '.join(valid)}")


def _merge(base: dict, new: dict, path: str, source: str) -> dict:
    """Deep-merge `new` into a copy of `base`, refusing keys `base` does not have."""
    out = dict(base)
    for key, value in new.items():
        if key not in base:
            raise ElmoError(f"{source}: " + str(_valid_keys_error(path, key, sorted(base))))
        if isinstance(base[key], dict):
            if not isinstance(value, dict):
                raise ElmoError(f"{source}: {path + '.' if path else ''}{key} must be an object")
            out[key] = _merge(base[key], value, f"{path}.{key}" if path else key, source)
        else:
            out[key] = value
    return out


def _coerce_training(d: dict, source: str) -> TrainingConfig:
    kwargs = {}
    for f in dataclasses.fields(TrainingConfig):
        value = d[f.name]
        default = f.default
        try:
            if isinstance(default, bool):
                if not isinstance(value, bool):
                    raise TypeError("expected true or false")
            elif isinstance(default, int):
                if isinstance(value, bool) or float(value) != int(value):
                    raise TypeError("expected an integer")
                value = int(value)
            elif isinstance(default, float):
                if isinstance(value, bool):
                    raise TypeError("expected a number")
                value = float(value)
            elif isinstance(default, str):
                if not isinstance(value, str):
                    raise TypeError("expected a string")
        except (TypeError, ValueError) as e:
            raise ElmoError(f"{source}: training.{f.name}: {value!r} is not valid ({e})") from None
        kwargs[f.name] = value
    cfg = TrainingConfig(**kwargs)
    cfg.validate(source)
    return cfg


def merge_config(base: RunConfig, user: dict[str, Any] | None, source: str = "config") -> RunConfig:
    """``base`` (a preset) with the user's (partial) config dict merged over it; every key checked."""
    base_dict = base.to_dict()
    user = dict(user or {})
    if not isinstance(user, dict):
        raise ElmoError(f"{source}: the config must be a JSON object")
    # bilm-tf's flat training keys: map the meaningful ones, drop the bookkeeping ones.
    flat = {}
    for key in list(user):
        if key in BILM_TF_TRAINING_KEYS:
            flat[BILM_TF_TRAINING_KEYS[key]] = user.pop(key)
        elif key in TRAINING_OPTION_KEYS:
            user.pop(key)
    if flat:
        user["training"] = {**flat, **user.get("training", {})}
    merged = _merge(base_dict, user, "", source)
    training = _coerce_training(merged.pop("training"), source)
    model = ModelConfig.from_options(merged, source=source)
    return RunConfig(model=model, training=training)


def read_config_file(path: Path) -> dict[str, Any]:
    """A config JSON file as a dict (partial configs are merged over a preset by `elmo_cli.presets`)."""
    user = read_json(path, "config file")
    if not isinstance(user, dict):
        raise ElmoError(f"{path}: the config must be a JSON object")
    return user


def save_config(config: RunConfig, path: Path) -> None:
    atomic_write_bytes(path, (json.dumps(config.to_dict(), indent=2) + "\n").encode("utf-8"))
