"""Training the biLM: `train(config, data_dir, run_dir, ...)`, bilm-tf's recipe (bilm-tf's) in PyTorch.

One step: the next (B, T) window of every persistent stream (`elmo_cli.data`) through the token encoder and both
LSTM stacks (states carried, detached, from the previous step), the sampled softmax loss of each direction (own
negatives per direction), their mean, backward, global gradient-norm clip (sparse softmax gradients included),
the optimizer (bilm-tf's Adagrad, or Adam/AdamW) at the scheduled learning rate (`lr_factor`). Under ``torchrun``
the same step runs in DistributedDataParallel, each process on its own rows; only rank 0 writes. The run
directory is always a loadable model directory (options.json, weights.hdf5, softmax.hdf5, vocab.txt, chars.json,
spm.model when used; with a validation set, those of the best validation so far) plus config.json,
metrics.jsonl, baseline.json (the Kneser-Ney reference) and checkpoints/. `_train` is a straight loop over the
helpers above it; the checkpoint payload is built and restored by `elmo_cli.checkpoint`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import signal
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.swa_utils import AveragedModel

from elmo_cli.bilm_format import save_model_dir
from elmo_cli.model_files import ModelFiles
from elmo_cli.checkpoint import (build_payload, latest_checkpoint, list_checkpoints, load_checkpoint, rank_state,
                                 restore_rank, save_checkpoint)
from elmo_cli.data import LMBatch, SentenceStreams, steps_per_epoch
from elmo_cli.distributed import Dist, all_gather_rows, init_distributed, leaves_process_group
from elmo_cli.evaluate import evaluate
from elmo_cli import compiled
from elmo_cli.graphed import StepStacks, reason_not
from elmo_cli.loading import LoadedModel, init_from as init_from_model, model_architecture, resolve_device, set_threads
from elmo_cli.model.bilm import BiLM
from elmo_cli.model import lstm
from elmo_cli.model.encoder import DistinctTokens
from elmo_cli.model.lstm import State
from elmo_cli.model.softmax import log_uniform_sample
from elmo_cli import row_updates
from elmo_cli.plot import CURVES_FILE, plot_runs, read_metrics
from elmo_cli.presets import AUTO, build_config, load_config
from elmo_cli.train_config import RunConfig, TrainingConfig, read_config_file, save_config
from vocab.errors import ElmoError
from vocab.text import atomic_write_bytes, read_json
from vocab.shards import ShardDataset

if TYPE_CHECKING:  # auto imports train's helpers; train names its Choice only in annotations
    from elmo_cli.auto import Choice

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"


# ---- reporting --------------------------------------------------------------------------------------------------
@dataclass
class StepInfo:
    """What `on_step` receives after every optimizer step (rank 0 only)."""

    step: int
    total_steps: int  # the run's length; under --max-time, the steps the remaining time allows at the recent rate
    epoch: float  # epochs done, from the manifest's token count
    loss: float  # this step's sampled-softmax loss (mean of both directions)
    tokens_per_s: float  # training tokens (per direction, all processes) per second, recent average
    elapsed: float  # training seconds of this invocation
    eta: float  # seconds to total_steps at the recent rate
    event: str = ""  # "", "checkpoint", "validation", "resumed"
    validation: dict | None = None
    lr: float = 0.0  # the learning rate of this step
    baseline: dict | None = None  # the Kneser-Ney reference on the validation set, when computed
    best: dict | None = None  # the best validation so far


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    total_steps: int
    stopped: str  # "finished", "max_steps", "max_time", "signal", "patience"
    train_loss: float  # sampled-softmax loss, mean over the last log interval
    tokens_per_s: float
    elapsed: float
    checkpoint: Path | None
    validation: dict | None = None
    resumed_from: int = 0
    world_size: int = 1
    notes: list[str] = field(default_factory=list)
    baseline: dict | None = None
    best: dict | None = None
    train_tokens: int = 0  # the shards' words (the manifest's total_tokens)
    run_seconds: float = 0.0  # training seconds of every invocation of the run (a resumed run's earlier parts too)
    epochs: float = 0.0  # passes over the shards made by the last step
    mean_tokens_per_s: float = 0.0  # this invocation's tokens over its training time (validations left out)
    read: dict | None = None  # `auto`'s read of the run's own rate after its first minute (rule 11), where it read


# ---- the loss module (what DDP wraps) -----------------------------------------------------------------------------
class BiLMLoss(nn.Module):
    """``forward`` = both directions' sampled-softmax losses, so DistributedDataParallel sees the whole step."""

    def __init__(self, bilm: BiLM):
        super().__init__()
        self.bilm = bilm

    def forward(self, fwd_chars: torch.Tensor, bwd_chars: torch.Tensor, fwd_targets: torch.Tensor,
                bwd_targets: torch.Tensor, states: tuple, negatives: tuple[torch.Tensor, torch.Tensor],
                tries: tuple[int, int], starts: torch.Tensor | None = None, stacks=None,
                tokens: DistinctTokens | None = None) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """
        # Parameters
        fwd_chars, bwd_chars : `(B, T, W)` prediction-form ids; fwd_targets, bwd_targets : `(B, T)`.
        states : carried `(forward, backward)` LSTM states or `(None, None)`.
        negatives : each direction's sampled ids `(S,)`; tries : their draw counts.
        starts : `(B, T)` bool, sentence starts where the states are zeroed, or None to carry them through (bilm-tf).
        stacks : what runs `BiLM.lm_stacks`, None for itself (`BiLM.lm_hidden`; the trainer's `StepStacks`).
        tokens : the distinct tokens of both streams' chars, found on the host (`DistinctTokens.of`), or None.

        # Returns
        forward loss, backward loss (scalars), the new states.
        """
        f_top, b_top, new_states = self.bilm.lm_hidden(fwd_chars, bwd_chars, states, starts, stacks, tokens)
        P = f_top.shape[-1]
        softmax = self.bilm.softmax
        f_loss, b_loss = softmax.sampled_losses([
            (f_top.reshape(-1, P), fwd_targets.reshape(-1), negatives[0], tries[0]),
            (b_top.reshape(-1, P), bwd_targets.reshape(-1), negatives[1], tries[1])])
        return f_loss, b_loss, new_states


# ---- helpers ----------------------------------------------------------------------------------------------------
def clip_grad_norm(parameters: list[nn.Parameter], max_norm: float) -> float:
    """Global gradient-norm clip over dense and sparse gradients (TF's clip_by_global_norm); returns the norm.

    Sparse gradients are coalesced first (duplicate rows summed), so the norm is that of the dense equivalent. On a
    GPU the dense gradients' norms and the scaling are multi-tensor operations (a few kernels, not a few per
    parameter: the same norm, summed in another order).
    """
    squares, dense = [], []
    for p in parameters:
        g = p.grad
        if g is None:
            continue
        if g.is_sparse:
            g = g.coalesce()
            p.grad = g
            squares.append(g._values().float().pow(2).sum())
        elif g.device.type == "cuda" and g.dtype == torch.float32:
            dense.append(g)
        else:
            squares.append(g.float().pow(2).sum())
    if dense:
        squares.append(torch.stack(torch._foreach_norm(dense)).pow(2).sum())
    if not squares:
        return 0.0
    total = float(torch.stack(squares).sum().sqrt())
    if max_norm > 0 and math.isfinite(total) and total > max_norm:
        scale = max_norm / total
        if dense:
            torch._foreach_mul_(dense, scale)
        done = {id(g) for g in dense}
        for p in parameters:
            if p.grad is not None and id(p.grad) not in done:
                p.grad.mul_(scale)
    return total


class _MovingAverage:
    """`AveragedModel`'s ``multi_avg_fn``: an exponential moving average over `horizon` steps (set by the trainer
    before each update). Early updates average over fewer steps (at most ``(1 + n) / (10 + n)`` of the old
    average after n updates, as TF's ExponentialMovingAverage), so the average keeps up while the weights move fast.
    """

    def __init__(self):
        self.horizon = 1.0

    def __call__(self, averaged: list[torch.Tensor], current: list[torch.Tensor], n_averaged) -> None:
        n = float(n_averaged)
        decay = min(1.0 - 1.0 / max(self.horizon, 1.0), (1.0 + n) / (10.0 + n))
        torch._foreach_lerp_(averaged, current, 1.0 - decay)


def _detach(states: tuple) -> tuple[list[State], list[State]]:
    return tuple([(h.detach(), c.detach()) for h, c in direction] for direction in states)


def _check_run_dir(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ElmoError(f"{run_dir}: output directory is not writable ({e.strerror or e})") from None


def open_shards(directory: Path, what: str = "--data") -> ShardDataset:
    """ShardDataset with every file's checksum verified; one ElmoError naming the option on failure."""
    try:
        return ShardDataset(directory, verify=True)
    except ElmoError as e:
        raise ElmoError(f"{what}: {e}") from None


def fit_to_data(config: RunConfig, dataset: ShardDataset) -> RunConfig:
    """Set the character table size and token width from the shards' character encoder (and the word table's size
    when the shards carry word ids: an ELMoForManyLangs model's dictionaries, for `--init-from` that model)."""
    chars = dataset.chars
    words = getattr(chars, "words", None)
    if words is not None and not config.model.char_cnn.word_dim:
        raise ElmoError(f"{dataset.directory}: shards made with an ELMoForManyLangs model's word dictionary train "
                        f"only from that model (--init-from its directory)")
    cnn = dataclasses.replace(config.model.char_cnn, n_characters=chars.n_characters + 1,
                              max_characters_per_token=chars.max_chars,
                              n_words=len(words) + 1 if words is not None else 0,
                              word_dim=config.model.char_cnn.word_dim if words is not None else 0)
    model = dataclasses.replace(config.model, char_cnn=cnn)
    model.validate("config")
    return dataclasses.replace(config, model=model)


def resume_config(run_dir: Path) -> RunConfig:
    """The configuration a run was started with (RUN_DIR/config.json); ElmoError when there is nothing to resume."""
    run_dir = Path(run_dir)
    if latest_checkpoint(run_dir) is None:
        raise ElmoError(f"{run_dir}: nothing to resume (no checkpoints/step-*.pt); start the run without --resume")
    path = run_dir / CONFIG_FILE
    user = read_json(path, f"run configuration (the checkpoints of {run_dir} need it)")
    return build_config(user, "tiny", source=str(path))


def resolve_config(run_dir: Path, data_dir: Path, *, preset: str | None = None, config_file: Path | None = None,
                   flags: dict | None = None, validation_dir: Path | None = None, resume: bool = False,
                   fine_tuning: bool = False) -> "tuple[RunConfig, Choice | None]":
    """The configuration a `train` call runs with, from what the user gave, as the command line resolves it.

    - ``preset="auto"``: a new run measures this machine and chooses (`elmo_cli.auto`), a resumed one keeps the
      choice it made (config.json);
    - otherwise a new run is `config_file` over `preset` (default ``tiny``); a resumed one given neither is its own
      config.json; either way `flags` (``TrainingConfig`` fields, None = not given) are laid over it.

    # Returns
    the `RunConfig` and, for a fresh ``auto`` choice, the `elmo_cli.auto.Choice` (its line, its probes), else None.
    """
    flags = flags or {}
    if preset == AUTO and fine_tuning:
        raise ElmoError("--preset auto chooses a shape, --init-from keeps the trained one: use one of them")
    if preset == AUTO and not resume:
        from elmo_cli.auto import auto_config

        return auto_config(data_dir, validation_dir, read_config_file(config_file) if config_file else None, flags)
    if resume and (preset == AUTO or (config_file is None and preset is None)):
        return resume_config(run_dir).with_training(**flags), None
    return load_config(config_file, preset).with_training(**flags), None


RUN_LENGTH_KEYS = ("epochs", "max_steps", "max_time")


def check_resumable(saved: RunConfig, requested: RunConfig, where: Path) -> None:
    """A resumed run must ask for the configuration it was started with (the same command line repeated is
    fine); only its length (`RUN_LENGTH_KEYS`) may change. ElmoError naming the first key that differs."""
    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    old, new = flat(saved.to_dict()), flat(requested.to_dict())
    for key in sorted(set(old) | set(new)):
        if key.startswith("training.") and key.split(".", 1)[1] in RUN_LENGTH_KEYS + ("cuda_graphs", "fuse_lstm", "compile"):
            continue
        if old.get(key) != new.get(key):
            raise ElmoError(f"{where}: cannot resume with {key} = {new.get(key)!r}: the run was started with "
                            f"{old.get(key)!r}; only --epochs, --max-steps and --max-time (and --no-cuda-graphs, "
                            f"--no-fuse-lstm, --compile) may change on resume")


def validation_perplexity(model: BiLM, dataset: ShardDataset, batch_size: int, device: torch.device) -> dict:
    """Full-softmax perplexity of both directions on held-out shards, exactly as `elmo-cli evaluate` computes it
    (stateless: every sentence from zero state, no dropout), so the two numbers can be compared.

    # Returns
    ``{"forward_perplexity", "backward_perplexity", "average_perplexity" (mean of the two, as the paper),
    "tokens"}``.
    """
    result = evaluate(LoadedModel(model, dataset.encoder, None, device), [dataset.directory], batch_size=batch_size)
    return {"forward_perplexity": result.forward_perplexity, "backward_perplexity": result.backward_perplexity,
            "average_perplexity": result.average_perplexity, "tokens": result.tokens}


def _autocast(device: torch.device, dtype: torch.dtype | None, cache: bool = True):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype, cache_enabled=cache)


class _StopFlag:
    """SIGINT/SIGTERM set a flag that the loop reads after each step (then checkpoint and return)."""

    def __init__(self):
        self.signal: int | None = None
        self._old: dict = {}

    def __enter__(self) -> "_StopFlag":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.signal = signum

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop records written after the checkpoint being resumed (they will be written again)."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line).get("step", 0) <= step:
                keep.append(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
    path.write_text("".join(l + "\n" for l in keep), encoding="utf-8")


# ---- the recipe: optimizer, learning rate, baseline -------------------------------------------------------------
def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """`optimizer.load_state_dict(state)`, where `state` may group the same parameters, in the same order,
    otherwise (one group, or `make_optimizer`'s dense and sparse groups: a run resumed on another device)."""
    groups = state["param_groups"]
    if len(groups) != len(optimizer.param_groups):
        flat = [i for g in groups for i in g["params"]]
        sizes = [len(g["params"]) for g in optimizer.param_groups]
        if len(flat) != sum(sizes):
            raise ValueError(f"the checkpoint's optimizer holds {len(flat)} parameters, the model {sum(sizes)}")
        regrouped, start = [], 0
        for n in sizes:
            regrouped.append({**groups[0], "params": flat[start:start + n]})
            start += n
        state = {**state, "param_groups": regrouped}
    optimizer.load_state_dict(state)


def lr_factor(progress: float, tc: TrainingConfig) -> float:
    """The learning rate over ``lr`` at ``progress`` in [0, 1] of the run (see `TrainingConfig.lr_schedule`).

    ``lr_factor(0.5, TrainingConfig(lr_schedule="linear"))`` -> 0.5
    """
    p = min(max(progress, 0.0), 1.0)
    if tc.warmup > 0 and p < tc.warmup:
        return max(p / tc.warmup, 1e-3)
    if tc.lr_schedule == "constant":
        return 1.0
    q = (p - tc.warmup) / (1.0 - tc.warmup)
    decay = 1.0 - q if tc.lr_schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * q))
    return tc.final_lr_ratio + (1.0 - tc.final_lr_ratio) * decay


def make_optimizer(params: list[nn.Parameter], tc: TrainingConfig, sparse: list[nn.Parameter] = ()
                   ) -> torch.optim.Optimizer:
    """The run's optimizer over `params` (on their device). Adam(W) on a CPU is torch's fused kernel: one pass over
    each parameter instead of the default multi-tensor (foreach) update's dozen, about 2 ms against 11 ms a step for
    LSTM 512/128 with a 15k-word softmax on 2 threads (`benchmarks/bench_step.py`); the same update, rounded a
    little differently. Elsewhere torch's default.

    `sparse`: the last parameters of `params` whose gradients are sparse (the softmax on a GPU), given Adagrad
    group of their own. torch's Adagrad updates a group holding a sparse gradient one parameter at a time, a
    handful of kernels each; the dense group then takes its multi-tensor update, a handful in all (the same
    arithmetic). Its state dict has two groups; `load_optimizer_state` reads one of either layout."""
    if tc.optimizer == "adagrad":
        groups = params
        if sparse:
            n = len(params) - len(sparse)
            assert all(a is b for a, b in zip(params[n:], sparse)), "the sparse parameters come last"
            groups = [{"params": params[:n]}, {"params": params[n:]}]
        return torch.optim.Adagrad(groups, lr=tc.lr, initial_accumulator_value=tc.initial_accumulator)
    fused = True if params and all(p.device.type == "cpu" for p in params) else None
    if tc.optimizer == "adam":
        return torch.optim.Adam(params, lr=tc.lr, weight_decay=tc.weight_decay, fused=fused)
    return torch.optim.AdamW(params, lr=tc.lr, weight_decay=tc.weight_decay, fused=fused)


BASELINE_FILE = "baseline.json"


def kn_baseline(run_dir: Path, dataset: ShardDataset, vdataset: ShardDataset, order: int) -> dict:
    """The order-N Kneser-Ney reference of the training shards on the validation shards, cached in
    ``RUN_DIR/baseline.json`` (keyed by both manifests' checksums and the order)."""
    from elmo_cli.baselines import kneser_ney_baseline

    key = {"order": order, "train": [s["sha256"] for s in dataset.shards],
           "validation": [s["sha256"] for s in vdataset.shards], "vocab": dataset.manifest["vocab_sha256"]}
    path = run_dir / BASELINE_FILE
    if path.is_file():
        try:
            cached = json.loads(path.read_text(encoding="utf-8"))
            if cached.get("key") == key:
                return cached["result"]
        except (json.JSONDecodeError, AttributeError):
            pass
    start = time.monotonic()
    kn = kneser_ney_baseline([dataset.directory], [vdataset.directory], dataset.encoder, order)
    result = {"name": f"kn{order}", "forward_perplexity": kn.forward_perplexity,
              "backward_perplexity": kn.backward_perplexity, "average_perplexity": kn.average_perplexity,
              "tokens": kn.tokens, "seconds": round(time.monotonic() - start, 1)}
    atomic_write_bytes(path, (json.dumps({"key": key, "result": result}, indent=1) + "\n").encode("utf-8"))
    return result


# ---- the run's state and its bookkeeping ---------------------------------------------------------------------------
@dataclass
class _Progress:
    """What a checkpoint carries besides the model, the optimizer and the per-rank states."""

    step: int = 0
    tokens: int = 0
    elapsed_before: float = 0.0  # training seconds of earlier invocations
    best: dict | None = None
    bad_validations: int = 0


class _Meter:
    """Sums between two metrics.jsonl records: loss (both directions), tokens, training time (validations and
    checkpoints left out, so tokens/s and the ETA are the training speed's)."""

    def __init__(self):
        self.reset(time.monotonic())
        self.rate = 0.0
        self.last_mean = float("nan")
        self.trained_tokens, self.trained_seconds = 0, 0.0  # every record's sums, for the invocation's mean rate

    def reset(self, now: float) -> None:
        self.loss, self.fwd, self.bwd, self.steps, self.tokens, self.start = 0.0, 0.0, 0.0, 0, 0, now

    def add(self, f_loss: float, b_loss: float, tokens: int) -> None:
        self.loss += (f_loss + b_loss) / 2
        self.fwd += f_loss
        self.bwd += b_loss
        self.steps += 1
        self.tokens += tokens
        if self.rate == 0.0:
            self.rate = self.tokens / max(time.monotonic() - self.start, 1e-9)

    def exclude(self, seconds: float) -> None:
        """Leave `seconds` (a validation, a checkpoint) out of the tokens/s of the current record."""
        self.start += seconds

    def record(self, step: int, per_epoch: int, tokens_seen: int, grad_norm: float, lr: float, elapsed: float
               ) -> dict:
        now = time.monotonic()
        self.rate = self.tokens / max(now - self.start, 1e-9)
        self.trained_tokens += self.tokens
        self.trained_seconds += now - self.start
        mean = self.last_mean = self.loss / self.steps
        rec = {"kind": "train", "step": step, "epoch": round(step / per_epoch, 4), "tokens": tokens_seen,
               "train_loss_sampled": round(mean, 5), "train_perplexity_sampled": round(math.exp(min(mean, 50.0)), 3),
               "forward_loss_sampled": round(self.fwd / self.steps, 5),
               "backward_loss_sampled": round(self.bwd / self.steps, 5), "grad_norm": round(grad_norm, 4),
               "lr": lr, "tokens_per_s": round(self.rate, 1), "elapsed": round(elapsed, 2)}
        self.reset(now)
        return rec


def _open_data(data_dir: Path, validation_dir: Path | None) -> tuple[ShardDataset, ShardDataset | None]:
    dataset = open_shards(data_dir, "--data")
    if validation_dir is None:
        return dataset, None
    vdataset = open_shards(validation_dir, "--validation")
    try:
        vdataset.check_vocab(dataset.vocab)
    except ElmoError as e:
        raise ElmoError(f"--validation: {e} (the training shards' vocabulary); shard both with one vocabulary")
    if vdataset.chars.to_json() != dataset.chars.to_json():
        raise ElmoError(f"--validation: {validation_dir} uses other characters than {data_dir}")
    return dataset, vdataset


def _checkpoint_to_resume(run_dir: Path, config: RunConfig, world_size: int) -> dict:
    path = latest_checkpoint(run_dir)
    if path is None:
        raise ElmoError(f"{run_dir}: nothing to resume (no checkpoints/step-*.pt); start without --resume")
    ckpt = load_checkpoint(path)
    check_resumable(build_config(json.loads(ckpt["config"]), "tiny", source=str(path)), config, path)
    if len(ckpt["ranks"]) != world_size:
        raise ElmoError(f"{path}: checkpoint was written by {len(ckpt['ranks'])} processes; resume with the "
                        f"same number (this run has {world_size})")
    return ckpt


def _total_steps(tc: TrainingConfig, per_epoch: int) -> int:
    """--max-steps, when given, is the run's length in steps (instead of --epochs)."""
    return tc.max_steps if tc.max_steps else max(1, math.ceil(tc.epochs * per_epoch))


def _validation_due(tc: TrainingConfig, step: int, total_steps: int, seconds_since: float,
                    clock_leads: bool = False) -> bool:
    """Validate now? Every `validation_every` steps (0: a twentieth of the run's steps) and every
    `validation_minutes`. `clock_leads`: --max-time, not the steps, will end the run; then the default step
    cadence (a twentieth of a length the run will not reach) is left out and the clock alone paces validation."""
    every = tc.validation_every or max(1, total_steps // 20)
    minutes = tc.validation_minutes or (max(tc.max_time / 20 / 60, 5.0) if tc.max_time else 15.0)
    by_steps = step % every == 0 and (bool(tc.validation_every) or not clock_leads)
    return by_steps or seconds_since >= 60 * minutes


def _improved(best: dict | None, result: dict) -> bool:
    return best is None or result["average_perplexity"] < best["average_perplexity"]


# ---- the entry point --------------------------------------------------------------------------------------------
@leaves_process_group()
def train(config: RunConfig, data_dir: Path, run_dir: Path, *, validation_dir: Path | None = None,
          resume: bool = False, init_from: "Path | ModelFiles | None" = None, reset_softmax: bool = False,
          on_step: Callable[[StepInfo], None] | None = None, chosen: dict | None = None) -> TrainResult:
    """Train (or resume training) a biLM on shards; see the module docstring.

    # Parameters
    config : `RunConfig`; its char table size is taken from the shards. On resume it must equal the run's own
        configuration but for the run length (`check_resumable`): pass `resume_config(run_dir)` with any
        overrides, or the configuration the run was started with.
    data_dir : a shard directory (`elmo-cli shard`); checksums are verified.
    run_dir : where the model directory, config.json, metrics.jsonl and checkpoints/ go.
    validation_dir : optional shards encoded with the same vocabulary: full-softmax perplexity periodically
        (`TrainingConfig.validation_every`) and at the end, beside a Kneser-Ney reference.
    resume : continue exactly from the newest checkpoint in run_dir.
    init_from : the model to start from (fine-tuning): a model directory, an options.json path or `ModelFiles`
        (`model_files.model_files`); reset_softmax re-initialises its softmax.
    on_step : called on rank 0 after every step with a `StepInfo`.
    chosen : how the configuration was chosen (``auto.Choice.record()``): a new run's metrics.jsonl opens with it
        as ``{"kind": "auto", "step": 0, ...}``.

    # Returns
    `TrainResult` (rank 0's view).
    """
    if reset_softmax and init_from is None:
        raise ElmoError("--reset-softmax only applies with --init-from MODEL")
    with _training_process(config.training.threads):
        return _train(config, Path(data_dir), Path(run_dir), validation_dir, resume, init_from, reset_softmax,
                      on_step, chosen)


@contextlib.contextmanager
def _training_process(threads: int):
    """The run's torch threads (restored after) and the expected warnings silenced."""
    saved = torch.get_num_threads()
    try:
        set_threads(threads or None)
        with warnings.catch_warnings():
            # torch warns that it skips invariant checks on the sparse softmax gradients Adagrad builds; expected.
            warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
            # Under torchrun, DistributedDataParallel warns that the width-1 filter bank's kernel `(1, E, n)` has
            # a gradient whose stride on its size-one axis is not the parameter's: the same values in the same
            # order, which it copies into its bucket (E x n floats) instead of taking as the bucket's view.
            warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
            yield
    finally:
        torch.set_num_threads(saved)


class _RunFiles:
    """What a run keeps in its directory, written by rank 0 only (on other ranks every method does nothing):
    metrics.jsonl, the model files (options.json, weights.hdf5, softmax.hdf5, the vocabulary, config.json),
    checkpoints/ and curves.png."""

    def __init__(self, run_dir: Path, config: RunConfig, encoder, main: bool):
        self.run_dir, self.config, self.encoder, self.main = run_dir, config, encoder, main

    def log(self, record: dict) -> None:
        if self.main:
            with open(self.run_dir / METRICS_FILE, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def write_model(self, model: BiLM) -> None:
        if self.main:
            save_model_dir(model, self.run_dir)
            self.encoder.save_to(self.run_dir)
            save_config(self.config, self.run_dir / CONFIG_FILE)

    def save_checkpoint(self, step: int, payload: dict, keep: int) -> Path | None:
        return save_checkpoint(self.run_dir, step, payload, keep=keep) if self.main else None

    def plot(self) -> None:
        if self.main:
            plot_runs([read_metrics(self.run_dir)], self.run_dir / CURVES_FILE)


class _TrainState:
    """The model and what a checkpoint restores with it: optimizer, weight average, the data streams, the sampler's
    RNG and the carried LSTM states. Identical on every rank at the start (DDP also broadcasts rank 0's
    parameters)."""

    def __init__(self, config: RunConfig, dataset: ShardDataset, ddp, device: torch.device, run_dir: Path | None,
                 init_from: "Path | ModelFiles | None", reset_softmax: bool):
        tc, B = config.training, config.training.batch_size
        self.V = len(dataset.vocab)
        torch.manual_seed(tc.seed)
        # Adam(W) cannot take sparse gradients: then the softmax gradient is dense.
        sparse = tc.sparse_softmax and tc.optimizer == "adagrad"
        self.model = model = BiLM(config.model, vocab_size=self.V, dropout=tc.dropout, sparse_softmax=sparse)
        self.notes = init_from_model(model, init_from, dataset.encoder, reset_softmax) \
            if init_from is not None and not list_checkpoints(run_dir) else []
        model.to(device)
        loss = BiLMLoss(model)
        self.distributed = ddp.enabled
        if ddp.enabled and sparse:
            # DDP would all-reduce the whole softmax's gradient; the step all-gathers the rows it touched instead
            # (`_Trainer.step`, `distributed.all_gather_rows`), so DDP leaves the softmax alone, and its starting
            # weights are rank 0's, as DDP makes the others'.
            nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
                loss, ["bilm.softmax.weight", "bilm.softmax.bias"])
            for param in (model.softmax.weight, model.softmax.bias):
                dist.broadcast(param.data, 0)
        self.wrapped: nn.Module = nn.parallel.DistributedDataParallel(
            loss, device_ids=[device.index] if device.type == "cuda" else None) if ddp.enabled else loss
        self.params = [p for p in model.parameters() if p.requires_grad]
        # On a GPU the sparse softmax gets an Adagrad group of its own (`make_optimizer`).
        split = [model.softmax.weight, model.softmax.bias] if sparse and device.type == "cuda" else []
        self.optimizer = make_optimizer(self.params, tc, split)
        # With training.average, the weights that are validated and written: a moving average of the trained ones.
        self.averaged = AveragedModel(model, multi_avg_fn=_MovingAverage()) if tc.average > 0 else None
        self.streams = SentenceStreams(dataset, range(ddp.rank * B, (ddp.rank + 1) * B), ddp.world_size * B,
                                       seed=tc.seed)
        self.per_epoch = steps_per_epoch(dataset.total_tokens, B, tc.unroll_steps, ddp.world_size)
        self.total_steps = _total_steps(tc, self.per_epoch)
        self.sampler = torch.Generator().manual_seed(tc.seed * 1_000_003 + ddp.rank + 1)
        torch.manual_seed(tc.seed * 7919 + ddp.rank)  # dropout
        self.states: tuple = (None, None)
        # On a GPU the LSTM stacks replay as CUDA graphs (elmo_cli.graphed); None: the eager step (`BiLM.lm_hidden`).
        self.graphs_off = reason_not(device, tc.cuda_graphs)
        self.stacks = StepStacks(model, self.notes.append) if self.graphs_off is None else None
        # On a GPU: each LSTM step's elementwise work in one compiled kernel (elmo_cli.compiled.fuse_gpu_cells).
        if device.type == "cuda":
            compiled.fuse_gpu_cells(tc.fuse_lstm, self.notes.append)
        # On a CPU with training.compile: the LSTM layers' loops compiled (elmo_cli.compiled); False: eager.
        self.compile_off = compiled.reason_not(device, tc.compile)
        self.compiled = self.compile_off is None
        if self.compiled:
            compiled.compile_layers(model)
        self.queued = False
        self.queue_step(device.type == "cuda")

    def queue_step(self, on: bool) -> None:
        """Whether a step queues all its work before reading a result (on a GPU; `elmo_cli.row_updates`): the
        losses and gradient norm read once at its end, the clip's scale computed on the device, and the sparse
        softmax updated from its gathered rows (`SharedSoftmax.row_grads`, `row_updates.adagrad_rows_`) instead
        of a sparse gradient. The same arithmetic either way; a CPU step reads as it goes (nothing waits there).
        Under torchrun the sparse softmax is always updated from its rows, every process's gathered together."""
        self.queued = on
        self.model.softmax.row_grads = (on or self.distributed) and self.model.softmax.sparse

    def switch_optimizer(self, tc: TrainingConfig) -> None:
        """Adam to AdamW with `tc.weight_decay` or back (`auto`'s rule 11), keeping each parameter's moments and
        step count: the two update alike but for the decoupled decay."""
        moments = self.optimizer.state_dict()
        self.optimizer = make_optimizer(self.params, tc)
        self.optimizer.load_state_dict(moments)
        for group in self.optimizer.param_groups:
            group["weight_decay"] = tc.weight_decay
            if "decoupled_weight_decay" in group:  # torch >= 2.7: AdamW is Adam with this flag
                group["decoupled_weight_decay"] = tc.optimizer == "adamw"

    @property
    def result_model(self) -> BiLM:
        """The weights the run validates and writes: the moving average (training.average) or the trained ones."""
        return self.averaged.module if self.averaged is not None else self.model

    def restore(self, ckpt: dict, rank: int, device: torch.device) -> None:
        """Everything but the run's progress, as the checkpoint `ckpt` holds it for process `rank`."""
        self.model.load_state_dict(ckpt["model"])
        if self.averaged is not None:
            if ckpt.get("average") is None:
                raise ElmoError("the checkpoint holds no weight average (training.average); resume without it")
            self.averaged.load_state_dict(ckpt["average"])
        load_optimizer_state(self.optimizer, ckpt["optimizer"])
        data_state, self.states = restore_rank(ckpt["ranks"][rank], self.sampler, device,
                                               self.model.config.lstm.n_layers)
        self.streams.load_state(data_state)


class _Trainer:
    """One training run: its data, its `_TrainState` (model, optimizer, streams, RNGs, carried states), its
    `_RunFiles` and its progress.

    Built once (`__init__`: fresh, fine-tuned or resumed); `step` is one optimizer step, `checkpoint` and
    `validate` the run's two kinds of writes; `_decide` makes the processes agree; `_train` drives it.
    """

    _prefetched: tuple | None = None  # the next step's inputs, made by a queued step (`_prefetch`)
    _before_prefetch: tuple | None = None  # the data position and sampler state from before them
    reread: dict | None = None  # `auto`'s rule 11 facts until the run has read its own rate (`read_own_rate`)
    read: dict | None = None  # what that read found

    def __init__(self, config: RunConfig, data_dir: Path, run_dir: Path, validation_dir: Path | None,
                 resume: bool, init_from: "Path | ModelFiles | None", reset_softmax: bool, chosen: dict | None = None):
        tc = config.training
        self.ddp, self.device = init_distributed(resolve_device(tc.device))
        self.autocast = torch.bfloat16 if tc.dtype == "bf16" else None
        if self.autocast is not None and self.device.type == "cpu" and not torch.backends.mkldnn.is_available():
            raise ElmoError("--dtype bf16 on CPU needs a torch build with oneDNN; use --dtype fp32")
        self.dataset, self.vdataset = _open_data(data_dir, validation_dir)
        if init_from is not None:  # fine-tuning keeps the trained network's shape
            config = dataclasses.replace(config, model=model_architecture(init_from))
        self.config = config = fit_to_data(config, self.dataset)
        self.tc, self.run_dir = tc, run_dir
        self.files = _RunFiles(run_dir, config, self.dataset.encoder, self.ddp.main)
        ckpt = _checkpoint_to_resume(run_dir, config, self.ddp.world_size) if resume else None
        if ckpt is None and list_checkpoints(run_dir):
            raise ElmoError(f"{run_dir}: already holds a run (checkpoints/); pass --resume to continue it or "
                            f"choose another --output")
        self.state = _TrainState(config, self.dataset, self.ddp, self.device, run_dir, init_from, reset_softmax)
        if _checks_memory(self.device):  # before anything is written
            check_step_fits(self.state, config, self.device, self.autocast, self.ddp)
        if self.ddp.main:
            _check_run_dir(run_dir)
        if self.state.stacks is not None:
            self.state.stacks.note = self._note
        if isinstance(lstm.GPU_CELLS, compiled.FusedGpuCells):
            lstm.GPU_CELLS.note = self._note
        elif self.state.graphs_off and self.ddp.main:
            self.state.notes.append(self.state.graphs_off)
        if self.state.compile_off and self.ddp.main:
            self.state.notes.append(self.state.compile_off)
        self.progress = _Progress()
        if ckpt is not None:
            self.state.restore(ckpt, self.ddp.rank, self.device)
            self.progress = _Progress(int(ckpt["step"]), int(ckpt["tokens"]), float(ckpt["elapsed"]),
                                      ckpt.get("best"), int(ckpt.get("bad_validations", 0)))
            if self.ddp.main:
                _truncate_metrics(run_dir / METRICS_FILE, self.progress.step)
        if ckpt is None and chosen:
            self.files.log({"kind": "auto", "step": 0, **chosen})
        # `auto`'s rule 11: a fresh run on one CPU process reads its own rate after its first minute
        self.reread = (chosen or {}).get("reread") if (ckpt is None and not self.ddp.enabled
                                                        and self.device.type == "cpu") else None
        self.keep_best = self.vdataset is not None and tc.keep_best
        self.baseline = None
        if self.vdataset is not None and tc.baseline and self.ddp.main:
            self.baseline = kn_baseline(run_dir, self.dataset, self.vdataset, tc.baseline_order)
            if ckpt is None:
                self.files.log({"kind": "baseline", "step": 0, **self.baseline})
        if ckpt is None or not self.keep_best:
            self.files.write_model(self.result_model)  # the run directory is a loadable model from the start
        self.last_checkpoint: Path | None = latest_checkpoint(run_dir) if ckpt is not None else None
        self.start = time.monotonic()

    @classmethod
    def bare(cls, config: RunConfig, dataset: ShardDataset, ddp: Dist = Dist()) -> "_Trainer":
        """A trainer that writes nothing (no run directory, no validation): for timing steps. `ddp`: its place in a
        process group already joined (by default one process, unwrapped); on a GPU it takes the current one."""
        self = cls.__new__(cls)
        self.tc, self.run_dir, self.dataset, self.vdataset = config.training, None, dataset, None
        self.ddp, self.device = ddp, resolve_device(config.training.device)
        if ddp.enabled and self.device.type == "cuda":
            self.device = torch.device("cuda", torch.cuda.current_device())  # DDP's device_ids need its index
        self.autocast = torch.bfloat16 if config.training.dtype == "bf16" else None
        self.config = fit_to_data(config, dataset)
        self.state = _TrainState(self.config, dataset, self.ddp, self.device, None, None, False)
        self.progress, self.last_checkpoint, self.start = _Progress(), None, time.monotonic()
        return self

    @property
    def result_model(self) -> BiLM:
        return self.state.result_model

    # ---- writes ---------------------------------------------------------------------------------------------------
    def _note(self, text: str) -> None:
        """Something the run should say once (the end of `train` prints it; metrics.jsonl keeps it at its step)."""
        step = self.progress.step + 1
        self.state.notes.append(f"step {step:,}: {text}")
        self.files.log({"kind": "note", "step": step, "text": text})

    def elapsed(self) -> float:
        """Training seconds of the whole run so far (resumed parts included)."""
        return self.progress.elapsed_before + time.monotonic() - self.start

    def checkpoint(self) -> Path | None:
        sampler, data = self._data_state()
        mine = rank_state(sampler, self.device, data, self.state.states)
        gathered: list = [mine]
        if self.ddp.enabled:
            gathered = [None] * self.ddp.world_size
            dist.all_gather_object(gathered, mine)
        if not self.ddp.main:
            return None
        if not self.keep_best:
            self.files.write_model(self.result_model)
        run = self.progress
        payload = build_payload(json.dumps(self.config.to_dict()), self.state.model, self.state.optimizer, gathered, run.tokens,
                                self.elapsed(), run.best, run.bad_validations,
                                self.state.averaged.state_dict() if self.state.averaged is not None else None)
        self.last_checkpoint = self.files.save_checkpoint(run.step, payload, self.tc.keep_checkpoints)
        return self.last_checkpoint

    def validate(self) -> dict | None:
        """Full-softmax validation (rank 0); the model files follow the best one. Returns the result."""
        if self.vdataset is None or not self.ddp.main:
            return None
        run, baseline = self.progress, self.baseline
        result = validation_perplexity(self.result_model, self.vdataset, max(self.tc.batch_size, 64), self.device)
        improved = _improved(run.best, result)
        if improved:
            run.best, run.bad_validations = {"step": run.step, **result}, 0
            if self.keep_best:
                self.files.write_model(self.result_model)
        else:
            run.bad_validations += 1
        reference = {"baseline": baseline["name"],
                     "baseline_average_perplexity": round(baseline["average_perplexity"], 4)} if baseline else {}
        self.files.log({"kind": "validation", "step": run.step, "elapsed": round(self.elapsed(), 2),
                  **{k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()},
                  "softmax": "full", "weights": "average" if self.state.averaged is not None else "trained",
                  "best": improved, **reference})
        self.files.plot()
        return result

    def fractions_done(self) -> tuple[float, float]:
        """The run's progress by its steps and by the clock (0 without --max-time); the larger one is the schedule's."""
        tc = self.tc
        return self.progress.step / self.state.total_steps, self.elapsed() / tc.max_time if tc.max_time else 0.0

    def read_own_rate(self, tokens_per_s: float) -> bool:
        """`auto`'s rule 11, once: the passes the run now expects at its own rate (`tokens_per_s`, its training so
        far), and what rules 3, 4, 5 and 9 give them (`auto.read_own_rate`). Where that is another dropout, weight
        decay or run length (the pass cap reached, or no longer), the run trains with it from the next step, a
        checkpoint is saved and config.json rewritten, so a resumed run keeps it. Returns whether anything changed
        (the checkpoint was saved)."""
        from elmo_cli.auto import read_own_rate

        plan, self.reread = self.reread, None
        tc = self.tc
        read = read_own_rate(plan, self.progress.tokens, tokens_per_s, tc.max_time - self.elapsed())
        changes: dict = {}
        said = []
        if read.dropout != tc.dropout:
            changes["dropout"] = read.dropout
            said.append(f"dropout {read.dropout:g} from here, not {tc.dropout:g} (rule 3)")
        if read.weight_decay != tc.weight_decay and tc.optimizer in ("adam", "adamw"):
            changes.update(optimizer="adamw" if read.weight_decay else "adam", weight_decay=read.weight_decay)
            said.append(f"AdamW decay {read.weight_decay:g} from here (rule 4)" if read.weight_decay else
                        f"Adam from here, not AdamW decay {tc.weight_decay:g} (rule 4)")
        validates = plan["validation_seconds"] > 0 and self.vdataset is not None
        if validates and not plan["cadence_given"] and read.validation_minutes != tc.validation_minutes:
            changes["validation_minutes"] = read.validation_minutes
        if read.capped != plan["capped"]:
            changes["epochs"] = read.epochs
            cap_steps = math.ceil(read.epochs * self.state.per_epoch)
            if validates:
                changes["validation_every"] = math.ceil(cap_steps / read.cap_validations) if read.capped else 0
            said.append(f"it stops after its cap of {read.epochs:g} passes (rule 5)" if read.capped else
                        f"the clock ends it, not the cap of {plan['cap']:g} passes (rule 5)")
        elif read.epochs != plan["epochs"]:  # lengthened: the probe's length would end it before its clock
            changes["epochs"] = read.epochs
            said.append(f"the clock ends it, not {plan['epochs']:g} passes")
        self.read = {"step": self.progress.step, "tokens_per_s": round(tokens_per_s, 1),
                     "sustained": plan["sustained"], "expected_epochs": round(read.passes, 2),
                     "probe_expected_epochs": plan["expected_epochs"], "dropout": read.dropout,
                     "dropout_before": tc.dropout, "weight_decay": read.weight_decay,
                     "weight_decay_before": tc.weight_decay, "capped": read.capped,
                     "validation_seconds": round(read.validation_seconds, 1), **changes}
        self.files.log({"kind": "auto-read", **self.read})
        if not changes:
            return False
        self.config = dataclasses.replace(self.config, training=dataclasses.replace(tc, **changes))
        self.files.config = self.config  # the model files written from here carry it too
        self.tc = self.config.training
        if "dropout" in changes:
            for module in self.state.model.modules():
                if isinstance(module, nn.Dropout):
                    module.p = read.dropout
        if "optimizer" in changes:
            self.state.switch_optimizer(self.tc)
        if "epochs" in changes:
            self.state.total_steps = _total_steps(self.tc, self.state.per_epoch)
        self.checkpoint()  # first: a resume reads the newest checkpoint's configuration against config.json
        if self.ddp.main:
            save_config(self.config, self.run_dir / CONFIG_FILE)
        if said:
            self._note(f"auto read the run's first {plan['after_seconds']:g} s: {tokens_per_s:,.0f} tokens/s x "
                       f"{plan['sustained']:g} sustained = {read.passes:.1f} passes expected, not the probe's "
                       f"{plan['expected_epochs']:.1f}: {'; '.join(said)}")
        return True

    # ---- one step -----------------------------------------------------------------------------------------------
    def _inputs(self) -> tuple[LMBatch, DistinctTokens, list[torch.Tensor], list[int]]:
        """The next step's batch, its distinct tokens and each direction's negatives with their draw counts, made on
        the host and on the step's device (on a GPU from page-locked memory: queued, not waited for); made by
        the step before when it was queued (`_prefetch`)."""
        if self._prefetched is not None:
            inputs, self._prefetched, self._before_prefetch = self._prefetched, None, None
            return inputs
        tc, state = self.tc, self.state
        batch = state.streams.next_batch(tc.unroll_steps)
        tokens = DistinctTokens.of(batch.chars, state.model.config.char_cnn.max_characters_per_token)
        negatives, tries = [], []
        for _ in range(2):
            ids, n_tries = log_uniform_sample(tc.n_negative_samples, state.V, state.sampler)
            negatives.append(ids)
            tries.append(n_tries)
        if self.device.type == "cuda":
            batch, tokens = batch.pin_memory(), tokens.pin_memory()
            negatives = [ids.pin_memory() for ids in negatives]
        return (batch.to(self.device), tokens.to(self.device, non_blocking=True),
                [ids.to(self.device, non_blocking=True) for ids in negatives], tries)

    def _prefetch(self) -> None:
        """Make the next step's inputs now, while the GPU still runs this step's queued work; a checkpoint taken
        before that step saves the data position and sampler state from before them (`_data_state`)."""
        self._before_prefetch = (self.state.streams.state(), self.state.sampler.get_state())
        self._prefetched = self._inputs()

    def _data_state(self) -> tuple[torch.Generator, "np.ndarray"]:
        """The sampler and data position the next step starts from (before any inputs made ahead of it)."""
        if self._before_prefetch is None:
            return self.state.sampler, self.state.streams.state()
        data, sampler_state = self._before_prefetch
        sampler = torch.Generator()
        sampler.set_state(sampler_state)
        return sampler, data

    def _softmax_rows(self) -> list[tuple[nn.Parameter, row_updates.RowGrads]]:
        """The softmax's weight and bias gradients as the rows the step gathered (`SharedSoftmax.row_grads`),
        summed per id; under torchrun, every process's rows (`distributed.all_gather_rows`), averaged."""
        softmax = self.state.model.softmax
        ids, w_rows, b_rows = softmax.gathered
        softmax.gathered = None
        grads = torch.cat([w_rows.grad, b_rows.grad.unsqueeze(1)], dim=1)  # (M, P + 1)
        if self.ddp.enabled:
            ids, grads = all_gather_rows(ids, grads, self.ddp.world_size)
        both = row_updates.summed_rows(ids, grads)
        return [(softmax.weight, dataclasses.replace(both, summed=both.summed[:, :-1])),
                (softmax.bias, dataclasses.replace(both, summed=both.summed[:, -1]))]

    def step(self) -> tuple[float, float, float, int, float]:
        """One optimizer step at the scheduled learning rate.

        # Returns
        forward and backward sampled losses, the gradient norm, the step's tokens (all processes) and the lr.
        """
        tc, run = self.tc, self.progress
        fraction = max(self.fractions_done())
        lr = tc.lr * lr_factor(fraction, tc)
        for group in self.state.optimizer.param_groups:
            group["lr"] = lr
        state, queued = self.state, self.state.queued
        batch, tokens, negatives, tries = self._inputs()
        stacks = state.stacks

        def forward_backward() -> tuple:
            """The two losses (read, or on the device when the step is queued) and the new states."""
            with _autocast(self.device, self.autocast, cache=stacks is None):  # a capture cannot use its cache
                f_loss, b_loss, new_states = state.wrapped(
                    batch.fwd_chars, batch.bwd_chars, batch.fwd_targets, batch.bwd_targets, state.states,
                    tuple(negatives), tuple(tries), batch.starts if tc.reset_state_per_sentence else None,
                    stacks=stacks, tokens=tokens)
                loss = (f_loss + b_loss) / 2
            state.optimizer.zero_grad(set_to_none=True)
            loss.backward()  # queued before the losses are read, so that a GPU is not left waiting meanwhile
            if queued:
                return f_loss.detach(), b_loss.detach(), new_states
            f_val, b_val = torch.stack([f_loss.detach(), b_loss.detach()]).float().tolist()
            _check_finite("training loss", (f_val + b_val) / 2, run.step, self.last_checkpoint)
            return f_val, b_val, new_states

        try:
            f_loss, b_loss, new_states = forward_backward()
        except Exception as error:  # a compilation that fails (its first step): the same step again, eagerly
            if not (state.compiled and compiled.is_compile_failure(error)):
                raise
            compiled.eager_layers(state.model)
            state.compiled = False
            text = str(error).strip().splitlines()
            note = f"--compile: torch.compile failed ({type(error).__name__}: {text[0][:160] if text else ''}); " \
                   f"the eager step runs"
            (self._note if self.run_dir is not None else state.notes.append)(note)
            f_loss, b_loss, new_states = forward_backward()
        rows = self._softmax_rows() if state.model.softmax.row_grads else []
        if queued or rows:
            dense = [p.grad for p in state.params if p.grad is not None]
            norm = row_updates.clip_(dense, [r.summed for _, r in rows], tc.clip_norm)
            if not queued:
                grad_norm = float(norm)
                _check_finite("gradient norm", grad_norm, run.step, self.last_checkpoint)
            state.optimizer.step()
            for param, r in rows:
                row_updates.adagrad_rows_(state.optimizer, param, r)
        else:
            grad_norm = clip_grad_norm(state.params, tc.clip_norm)
            _check_finite("gradient norm", grad_norm, run.step, self.last_checkpoint)
            state.optimizer.step()
        if state.averaged is not None:  # horizon: the last `average` of the run's steps (as the schedule sees them)
            state.averaged.multi_avg_fn.horizon = tc.average * (run.step + 1) / fraction if fraction > 0 else 1.0
            state.averaged.update_parameters(state.model)
        if queued:  # the step's one wait: its losses and norm (a non-finite one stops the run, as on a CPU)
            self._prefetch()
            f_val, b_val, grad_norm = torch.stack([f_loss.float(), b_loss.float(), norm.float()]).tolist()
            _check_finite("training loss", (f_val + b_val) / 2, run.step, self.last_checkpoint)
            _check_finite("gradient norm", grad_norm, run.step, self.last_checkpoint)
        else:
            f_val, b_val = f_loss, b_loss
        state.states = _detach(new_states)
        tokens = batch.n_tokens * self.ddp.world_size
        run.step += 1
        run.tokens += tokens
        return f_val, b_val, grad_norm, tokens, lr


def _checks_memory(device: torch.device) -> bool:
    return device.type == "cuda"


def rows_that_fit(rows: int, fits: Callable[[int], bool]) -> int:
    """The most batch rows below `rows` for which `fits` is true, to within an eighth (halving until one fits, then
    bisecting); 0 when not even one row does."""
    hi, lo = rows, rows // 2
    while lo >= 1 and not fits(lo):
        hi, lo = lo, lo // 2
    if lo < 1:
        return 0
    while hi - lo > max(1, lo // 8):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def step_fits(state: "_TrainState", config: RunConfig, device: torch.device, autocast: torch.dtype | None,
              rows: int) -> bool:
    """Whether a training step of `rows` rows fits in the device's memory: one forward and backward of the loss
    on rows of distinct random tokens (the encoder's worst case), beside the optimizer's state for every
    parameter. Leaves the model, its gradients and the RNGs as they were."""
    tc, cnn = config.training, config.model.char_cnn
    T, W = tc.unroll_steps, cnn.max_characters_per_token
    chars = torch.randint(1, cnn.n_characters, (2, rows, T, W), generator=torch.Generator().manual_seed(0))
    targets = torch.zeros(rows, T, dtype=torch.long)
    negatives = torch.arange(min(tc.n_negative_samples, state.V))
    rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()
    per_param = 1 if tc.optimizer == "adagrad" else 2
    try:
        optimizer_state = [torch.empty_like(p) for p in state.params for _ in range(per_param)]
        chars, targets, negatives = chars.to(device), targets.to(device), negatives.to(device)
        with _autocast(device, autocast):
            f_loss, b_loss, _ = BiLMLoss(state.model)(chars[0], chars[1], targets, targets, (None, None),
                                                      (negatives, negatives), (-1, -1))
        ((f_loss + b_loss) / 2).backward()
        del optimizer_state
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        for p in state.params:
            p.grad = None
        state.model.softmax.gathered = None  # the rows a queued step gathers (SharedSoftmax.row_grads)
        if device.type == "cuda":
            torch.cuda.set_rng_state(rng, device)
            torch.cuda.empty_cache()
        else:
            torch.set_rng_state(rng)


def check_step_fits(state: "_TrainState", config: RunConfig, device: torch.device, autocast: torch.dtype | None,
                    ddp: Dist = Dist()) -> None:
    """ElmoError naming the batch rows that fit, when a step at `config`'s rows does not fit in the device. Under
    torchrun every process tries its own device (the unwrapped model: no all-reduce) and the processes agree after
    each try, so all of them ask the same sizes and stop with the same line: the rows that fit on every GPU."""

    def fits(rows: int) -> bool:
        return not _any_process(ddp, device, not step_fits(state, config, device, autocast, rows))[0]

    B = config.training.batch_size
    if fits(B):
        return
    n = rows_that_fit(B, fits)
    where = _memory_of(device)
    if n == 0:
        raise ElmoError(f"--batch-size {B}: not even one row of a training step of this model fits in {where}; "
                        f"choose a smaller model (nothing was written)")
    raise ElmoError(f"--batch-size {B}: a training step of this model does not fit in {where}; {n} rows do: give "
                    f"--batch-size {n} (nothing was written)")


def _memory_of(device: torch.device) -> str:
    if device.type != "cuda":
        return f"the memory of the {device.type} device"
    free, total = torch.cuda.mem_get_info(device)
    return f"the {total / 2 ** 30:.0f} GiB of {torch.cuda.get_device_name(device)} ({free / 2 ** 30:.0f} GiB free)"


def _decide(tr: _Trainer, stop: _StopFlag, last_ckpt: tuple[int, float], last_validation: float
            ) -> tuple[bool, bool, bool]:
    """Stop now, checkpoint by the clock, validate now: the same decisions on every process."""
    tc, now = tr.tc, time.monotonic()
    stop_now = stop.signal is not None or bool(tc.max_time and tr.elapsed() >= tc.max_time)
    by_time = bool(tc.checkpoint_minutes and now - last_ckpt[1] >= 60 * tc.checkpoint_minutes)
    by_steps, by_clock = tr.fractions_done()
    clock_leads = by_clock > by_steps
    validate = tr.vdataset is not None and \
        _validation_due(tc, tr.progress.step, tr.state.total_steps, now - last_validation, clock_leads)
    return _any_process(tr.ddp, tr.device, stop_now, by_time, validate)


def _train(config: RunConfig, data_dir: Path, run_dir: Path, validation_dir: Path | None, resume: bool,
           init_from: "Path | ModelFiles | None", reset_softmax: bool, on_step: Callable[[StepInfo], None] | None,
           chosen: dict | None = None) -> TrainResult:
    tr = _Trainer(config, data_dir, run_dir, validation_dir, resume, init_from, reset_softmax, chosen)
    tc, run, total = tr.tc, tr.progress, tr.state.total_steps
    resumed_from = run.step
    tr.state.model.train()
    last_ckpt, last_validation = (run.step, time.monotonic()), time.monotonic()
    meter, validation = _Meter(), None
    stopped = "finished" if run.step < total else "max_steps"
    tr.start = time.monotonic()  # the training clock
    with _StopFlag() as stop:
        while run.step < total:
            f_val, b_val, grad_norm, tokens, lr = tr.step()
            meter.add(f_val, b_val, tokens)
            stop_now, ckpt_by_time, validate = _decide(tr, stop, last_ckpt, last_validation)
            event, vresult = "", None
            if run.step % tc.log_every == 0 or run.step == total or stop_now:
                tr.files.log(meter.record(run.step, tr.state.per_epoch, run.tokens, grad_norm, lr, tr.elapsed()))
                if (tr.reread is not None and meter.trained_seconds >= tr.reread["after_seconds"]
                        and run.step < total and not stop_now):
                    began = time.monotonic()
                    if tr.read_own_rate(meter.trained_tokens / max(meter.trained_seconds, 1e-9)):
                        last_ckpt, event = (run.step, time.monotonic()), "checkpoint"
                        tc, total = tr.tc, tr.state.total_steps  # rule 11 may have moved the run's length
                    meter.exclude(time.monotonic() - began)
            if validate and run.step < total and not stop_now:
                began = time.monotonic()
                vresult = validation = tr.validate()
                last_validation, event = time.monotonic(), "validation"
                meter.exclude(last_validation - began)
                if _agree(tr.ddp, tr.device, bool(tc.patience and run.bad_validations >= tc.patience)):
                    stopped, stop_now = "patience", True
            due = bool(tc.checkpoint_every and run.step - last_ckpt[0] >= tc.checkpoint_every) or ckpt_by_time
            if (due or stop_now) and run.step < total:
                began = time.monotonic()
                tr.checkpoint()
                last_ckpt, event = (run.step, time.monotonic()), event or "checkpoint"
                meter.exclude(last_ckpt[1] - began)
            if on_step is not None and tr.ddp.main:
                steps_per_s = max(meter.rate, 1e-9) / (tc.batch_size * tc.unroll_steps * tr.ddp.world_size)
                eta, expected = (total - run.step) / steps_per_s, total
                if tc.max_time and tc.max_time - tr.elapsed() < eta:  # the time budget ends the run first
                    eta = max(0.0, tc.max_time - tr.elapsed())
                    expected = min(total, run.step + math.ceil(eta * steps_per_s))
                on_step(StepInfo(run.step, expected, run.step / tr.state.per_epoch, (f_val + b_val) / 2, meter.rate,
                                 time.monotonic() - tr.start, eta, event, vresult, lr, tr.baseline, run.best))
            if stop_now:
                if stopped != "patience":
                    stopped = "signal" if stop.signal is not None else "max_time"
                break
    if stopped in ("finished", "max_time") and run.step > resumed_from and tr.vdataset is not None:
        validation = tr.validate()
    if run.step > last_ckpt[0] or tr.last_checkpoint is None:
        tr.checkpoint()
    if tr.ddp.enabled:
        dist.barrier()
    return TrainResult(run_dir=run_dir, step=run.step, total_steps=total, stopped=stopped,
                       train_loss=meter.last_mean, tokens_per_s=meter.rate, elapsed=time.monotonic() - tr.start,
                       run_seconds=tr.elapsed(),
                       checkpoint=tr.last_checkpoint, validation=validation, resumed_from=resumed_from,
                       world_size=tr.ddp.world_size, notes=tr.state.notes, baseline=tr.baseline, best=run.best,
                       train_tokens=tr.dataset.total_tokens, epochs=run.step / tr.state.per_epoch,
                       mean_tokens_per_s=meter.trained_tokens / max(meter.trained_seconds, 1e-9), read=tr.read)


def measure_throughput(config: RunConfig, dataset: ShardDataset, seconds: float, notes: list[str] | None = None,
                       trace: list[tuple[float, int]] | None = None, warm: float | None = None) -> float:
    """Training tokens per second (per direction) of `config` on `dataset` in this process, on its device and
    threads: a fresh model, two warm-up steps, then real training steps for about `seconds` (at least three).
    A step with its LSTM loops compiled on a CPU (`training.compile`) warms up for `warm` seconds more (default
    `seconds`) before it is timed: after its compilation the first seconds of a process's compiled step run slow
    (the `512/128` bf16 step on 2 Zen 5 cores, traced twice: 6,879 and 7,861 tokens/s in its first 2 s, 8,603 and
    9,038 after its first 6; docs/auto.md, rule 8). Writes nothing; the global RNGs are reseeded by the run that
    follows, as every run reseeds them. `notes`, if given, receives what the steps said (on a GPU:
    that the CUDA graphs started, or why they fell back); `trace` ``(seconds since the timing began, tokens so
    far)`` after each timed step (on a CPU: a GPU's steps are not waited for one by one)."""
    with _training_process(config.training.threads):
        probe = _Trainer.bare(config, dataset)
        probe.state.total_steps = 1_000_000  # the learning rate stays in its warmup, as at a run's start
        for _ in range(2):
            probe.step()
        if probe.state.compiled:
            start, warm = time.monotonic(), seconds if warm is None else warm
            while time.monotonic() - start < warm:
                probe.step()
        _synchronize(probe.device)
        tokens, steps, start = 0, 0, time.monotonic()
        while steps < 3 or time.monotonic() - start < seconds:
            tokens += probe.step()[3]
            steps += 1
            if trace is not None:
                trace.append((time.monotonic() - start, tokens))
        _synchronize(probe.device)
        rate = tokens / (time.monotonic() - start)
        if notes is not None:
            notes.extend(probe.state.notes)
        return rate


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _agree(ddp, device: torch.device, flag: bool) -> bool:
    """Rank 0's decision, the same on every process."""
    if not ddp.enabled:
        return flag
    t = torch.tensor([float(flag)], device=device)
    dist.broadcast(t, src=0)
    return bool(t.item())


def _any_process(ddp, device: torch.device, *flags: bool) -> tuple[bool, ...]:
    """Each flag True on every process when it is True on any (one all-reduce); as given in a single process."""
    if not ddp.enabled:
        return flags
    t = torch.tensor([float(f) for f in flags], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return tuple(bool(x) for x in t.tolist())


def _check_finite(what: str, value: float, step: int, last_ckpt_path: Path | None) -> None:
    if not math.isfinite(value):
        raise ElmoError(f"the {what} became {value} at step {step + 1}; stopped without writing. The last good "
                        f"checkpoint is {last_ckpt_path or 'none (no checkpoint yet)'}; try a lower --lr")
