"""Training the biLM: `train(config, data_dir, run_dir, ...)`, bilm-tf's recipe (spec §7) in PyTorch.

One step: the next (B, T) window of every persistent stream (`elmo_cli.data`) through the token encoder and both
LSTM stacks (states carried, detached, from the previous step), the sampled softmax loss of each direction (own
negatives per direction), their mean, backward, global gradient-norm clip (sparse softmax gradients included),
Adagrad. Under ``torchrun`` the same step runs in DistributedDataParallel, each process on its own rows; only rank
0 writes. The run directory is always a loadable model directory (options.json, weights.hdf5, softmax.hdf5,
vocab.txt, chars.json, spm.model when used) plus config.json, metrics.jsonl and checkpoints/.
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
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from elmo_cli.bilm_format import save_model_dir
from elmo_cli.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from elmo_cli.data import IGNORE, LMBatch, SentenceStreams, steps_per_epoch
from elmo_cli.distributed import init_distributed
from elmo_cli.evaluate import evaluate
from elmo_cli.loading import LoadedModel, init_from as init_from_model, model_architecture, resolve_device
from elmo_cli.model.bilm import BiLM
from elmo_cli.model.lstm import State
from elmo_cli.model.softmax import log_uniform_sample
from elmo_cli.presets import build_config
from elmo_cli.train_config import RunConfig, save_config
from vocab.errors import ElmoError
from vocab.text import read_json
from vocab.shards import ShardDataset
from vocab.tokenize import TextEncoder

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"


# ---- reporting --------------------------------------------------------------------------------------------------
@dataclass
class StepInfo:
    """What `on_step` receives after every optimizer step (rank 0 only)."""

    step: int
    total_steps: int
    epoch: float  # epochs done, from the manifest's token count
    loss: float  # this step's sampled-softmax loss (mean of both directions)
    tokens_per_s: float  # training tokens (per direction, all processes) per second, recent average
    elapsed: float  # training seconds of this invocation
    eta: float  # seconds to total_steps at the recent rate
    event: str = ""  # "", "checkpoint", "validation", "resumed"
    validation: dict | None = None


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    total_steps: int
    stopped: str  # "finished", "max_steps", "max_time", "signal"
    train_loss: float  # sampled-softmax loss, mean over the last log interval
    tokens_per_s: float
    elapsed: float
    checkpoint: Path | None
    validation: dict | None = None
    resumed_from: int = 0
    world_size: int = 1
    notes: list[str] = field(default_factory=list)




# ---- the loss module (what DDP wraps) -----------------------------------------------------------------------------
class BiLMLoss(nn.Module):
    """``forward`` = both directions' sampled-softmax losses, so DistributedDataParallel sees the whole step."""

    def __init__(self, bilm: BiLM):
        super().__init__()
        self.bilm = bilm

    def forward(self, fwd_chars: torch.Tensor, bwd_chars: torch.Tensor, fwd_targets: torch.Tensor,
                bwd_targets: torch.Tensor, states: tuple, negatives: tuple[torch.Tensor, torch.Tensor],
                tries: tuple[int, int], starts: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """
        # Parameters
        fwd_chars, bwd_chars : `(B, T, W)` prediction-form ids; fwd_targets, bwd_targets : `(B, T)`.
        states : carried `(forward, backward)` LSTM states or `(None, None)`.
        negatives : each direction's sampled ids `(S,)`; tries : their draw counts.
        starts : `(B, T)` bool, sentence starts where the states are zeroed, or None to carry them through (bilm-tf).

        # Returns
        forward loss, backward loss (scalars), the new states.
        """
        f_top, b_top, new_states = self.bilm.lm_hidden(fwd_chars, bwd_chars, states, starts)
        P = f_top.shape[-1]
        softmax = self.bilm.softmax
        f_loss = softmax.sampled_loss(f_top.reshape(-1, P), fwd_targets.reshape(-1), negatives[0], tries[0])
        b_loss = softmax.sampled_loss(b_top.reshape(-1, P), bwd_targets.reshape(-1), negatives[1], tries[1])
        return f_loss, b_loss, new_states


# ---- helpers ----------------------------------------------------------------------------------------------------
def clip_grad_norm(parameters: list[nn.Parameter], max_norm: float) -> float:
    """Global gradient-norm clip over dense and sparse gradients (TF's clip_by_global_norm); returns the norm.

    Sparse gradients are coalesced first (duplicate rows summed), so the norm is that of the dense equivalent.
    """
    squares = []
    for p in parameters:
        g = p.grad
        if g is None:
            continue
        if g.is_sparse:
            g = g.coalesce()
            p.grad = g
            squares.append(g._values().float().pow(2).sum())
        else:
            squares.append(g.float().pow(2).sum())
    if not squares:
        return 0.0
    total = float(torch.stack(squares).sum().sqrt())
    if max_norm > 0 and math.isfinite(total) and total > max_norm:
        scale = max_norm / total
        for p in parameters:
            if p.grad is not None:
                p.grad.mul_(scale)
    return total


def _flatten_states(states: tuple) -> list[torch.Tensor]:
    return [t.detach().cpu() for direction in states for h, c in direction for t in (h, c)]


def _unflatten_states(flat: list[torch.Tensor], n_layers: int, device: torch.device) -> tuple:
    it = iter(t.to(device) for t in flat)
    return tuple([(next(it), next(it)) for _ in range(n_layers)] for _ in range(2))


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
    """Set the character table size and token width from the shards' character encoder."""
    chars = dataset.chars
    cnn = dataclasses.replace(config.model.char_cnn, n_characters=chars.n_characters + 1,
                              max_characters_per_token=chars.max_chars)
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


def _autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


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


# ---- the entry point --------------------------------------------------------------------------------------------
def train(config: RunConfig, data_dir: Path, run_dir: Path, *, validation_dir: Path | None = None,
          resume: bool = False, init_from: Path | None = None, reset_softmax: bool = False,
          on_step: Callable[[StepInfo], None] | None = None) -> TrainResult:
    """Train (or resume training) a biLM on shards; see the module docstring.

    # Parameters
    config : `RunConfig`; its char table size is taken from the shards. On resume, pass `resume_config(run_dir)`
        with any overrides (the model and the batch shape must equal the checkpoint's).
    data_dir : a shard directory (`elmo-cli shard`); checksums are verified.
    run_dir : where the model directory, config.json, metrics.jsonl and checkpoints/ go.
    validation_dir : optional shards encoded with the same vocabulary: full-softmax perplexity every
        ``validation_every`` steps and at the end.
    resume : continue exactly from the newest checkpoint in run_dir.
    init_from : a model directory to start from (fine-tuning); reset_softmax re-initialises its softmax.
    on_step : called on rank 0 after every step with a `StepInfo`.

    # Returns
    `TrainResult` (rank 0's view).
    """
    threads = torch.get_num_threads()
    try:
        if config.training.threads:
            torch.set_num_threads(config.training.threads)
        with warnings.catch_warnings():
            # torch warns that it skips invariant checks on the sparse softmax gradients Adagrad builds; expected.
            warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
            return _train(config, Path(data_dir), Path(run_dir), validation_dir, resume, init_from, reset_softmax,
                          on_step)
    finally:
        torch.set_num_threads(threads)


def _train(config: RunConfig, data_dir: Path, run_dir: Path, validation_dir: Path | None, resume: bool,
           init_from: Path | None, reset_softmax: bool, on_step: Callable[[StepInfo], None] | None) -> TrainResult:
    tc = config.training
    ddp, device = init_distributed(resolve_device(tc.device))
    autocast_dtype = torch.bfloat16 if tc.dtype == "bf16" else None
    if autocast_dtype is not None and device.type == "cpu" and not torch.backends.mkldnn.is_available():
        raise ElmoError("--dtype bf16 on CPU needs a torch build with oneDNN; use --dtype fp32")

    dataset = open_shards(data_dir, "--data")
    vdataset = None
    if validation_dir is not None:
        vdataset = open_shards(validation_dir, "--validation")
        try:
            vdataset.check_vocab(dataset.vocab)
        except ElmoError as e:
            raise ElmoError(f"--validation: {e} (the training shards' vocabulary); shard both with one vocabulary")
        if vdataset.chars.to_json() != dataset.chars.to_json():
            raise ElmoError(f"--validation: {validation_dir} uses other characters than {data_dir}")
    if init_from is not None and not resume:
        # Fine-tuning keeps the trained network's shape: the architecture comes from MODEL_DIR/options.json.
        config = dataclasses.replace(config, model=model_architecture(Path(init_from)))
    config = fit_to_data(config, dataset)

    if ddp.main:
        _check_run_dir(run_dir)
    ckpt = None
    if resume:
        path = latest_checkpoint(run_dir)
        if path is None:
            raise ElmoError(f"{run_dir}: nothing to resume (no checkpoints/step-*.pt); start without --resume")
        ckpt = load_checkpoint(path)
        saved = build_config(json.loads(ckpt["config"]), "tiny", source=str(path))
        if saved.model != config.model:
            raise ElmoError(f"{path}: the model configuration differs from the checkpoint's; resume with the run's "
                            f"own config.json (drop --config/--preset)")
        if (saved.training.batch_size, saved.training.unroll_steps) != (tc.batch_size, tc.unroll_steps):
            raise ElmoError(f"{path}: checkpoint has batch size {saved.training.batch_size} and unroll "
                            f"{saved.training.unroll_steps}; this run asks for {tc.batch_size} and {tc.unroll_steps}")
        if len(ckpt["ranks"]) != ddp.world_size:
            raise ElmoError(f"{path}: checkpoint was written by {len(ckpt['ranks'])} processes; resume with the "
                            f"same number (this run has {ddp.world_size})")
    elif list_checkpoints(run_dir):
        raise ElmoError(f"{run_dir}: already holds a run (checkpoints/); pass --resume to continue it or choose "
                        f"another --output")

    # Model, identical on every rank (DDP also broadcasts rank 0's parameters).
    V = len(dataset.vocab)
    torch.manual_seed(tc.seed)
    # DDP's reducer cannot all-reduce sparse gradients, so the softmax gradient is dense under torchrun.
    sparse = tc.sparse_softmax and not ddp.enabled
    model = BiLM(config.model, vocab_size=V, dropout=tc.dropout, sparse_softmax=sparse)
    notes: list[str] = []
    if init_from is not None and ckpt is None:
        notes += init_from_model(model, Path(init_from), dataset.encoder, reset_softmax)
    model.to(device)
    loss_module = BiLMLoss(model)
    if ddp.enabled:
        wrapped: nn.Module = nn.parallel.DistributedDataParallel(
            loss_module, device_ids=[device.index] if device.type == "cuda" else None)
    else:
        wrapped = loss_module
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adagrad(params, lr=tc.lr, initial_accumulator_value=tc.initial_accumulator)

    B, T = tc.batch_size, tc.unroll_steps
    streams = SentenceStreams(dataset, range(ddp.rank * B, (ddp.rank + 1) * B), ddp.world_size * B, seed=tc.seed)
    per_epoch = steps_per_epoch(dataset.total_tokens, B, T, ddp.world_size)
    # --max-steps, when given, is the run's length in steps (instead of --epochs).
    total_steps = tc.max_steps if tc.max_steps else max(1, math.ceil(tc.epochs * per_epoch))
    sampler = torch.Generator().manual_seed(tc.seed * 1_000_003 + ddp.rank + 1)
    torch.manual_seed(tc.seed * 7919 + ddp.rank)  # dropout
    states: tuple = (None, None)
    step, tokens_seen, elapsed_before = 0, 0, 0.0

    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        mine = ckpt["ranks"][ddp.rank]
        torch.set_rng_state(mine["torch_rng"])
        sampler.set_state(mine["sampler_rng"])
        if mine.get("cuda_rng") is not None and device.type == "cuda":
            torch.cuda.set_rng_state(mine["cuda_rng"], device)
        streams.load_state(mine["data"].numpy())
        if mine["states"]:
            states = _unflatten_states(mine["states"], config.model.lstm.n_layers, device)
        step, tokens_seen, elapsed_before = int(ckpt["step"]), int(ckpt["tokens"]), float(ckpt["elapsed"])
        if ddp.main:
            _truncate_metrics(run_dir / METRICS_FILE, step)
    resumed_from = step

    metrics_path = run_dir / METRICS_FILE

    def log(record: dict) -> None:
        if ddp.main:
            with open(metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def write_model_dir() -> None:
        save_model_dir(model, run_dir)
        dataset.encoder.save_to(run_dir)
        save_config(config, run_dir / CONFIG_FILE)

    def checkpoint(elapsed: float) -> Path | None:
        mine = {"torch_rng": torch.get_rng_state(), "sampler_rng": sampler.get_state(),
                "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
                "data": torch.from_numpy(streams.state()),
                "states": _flatten_states(states) if states[0] is not None else []}
        if ddp.enabled:
            gathered: list = [None] * ddp.world_size
            dist.all_gather_object(gathered, mine)
        else:
            gathered = [mine]
        if not ddp.main:
            return None
        write_model_dir()
        payload = {"config": json.dumps(config.to_dict()), "model": model.state_dict(),
                   "optimizer": optimizer.state_dict(), "ranks": gathered, "tokens": tokens_seen,
                   "elapsed": elapsed}
        return save_checkpoint(run_dir, step, payload, keep=tc.keep_checkpoints)

    def validate() -> dict | None:
        if vdataset is None or not ddp.main:
            return None
        result = validation_perplexity(model, vdataset, max(B, 64), device)
        log({"kind": "validation", "step": step, **{k: round(v, 4) if isinstance(v, float) else v
                                                      for k, v in result.items()}, "softmax": "full"})
        return result

    if ddp.main:
        write_model_dir()  # the run directory is a loadable model from the start
    model.train()
    last_ckpt_path: Path | None = latest_checkpoint(run_dir) if ckpt is not None else None
    last_ckpt_step, last_ckpt_time = step, time.monotonic()
    interval_loss, interval_steps, interval_tokens, interval_start = 0.0, 0, 0, time.monotonic()
    interval_fb = [0.0, 0.0]
    recent_rate, last_mean, validation = 0.0, float("nan"), None
    start = time.monotonic()
    stopped = "finished" if step < total_steps else "max_steps"
    V_neg = tc.n_negative_samples

    with _StopFlag() as stop:
        while step < total_steps:
            batch: LMBatch = streams.next_batch(T).to(device)
            negatives, tries = [], []
            for _ in range(2):
                ids, n_tries = log_uniform_sample(V_neg, V, sampler)
                negatives.append(ids.to(device))
                tries.append(n_tries)
            with _autocast(device, autocast_dtype):
                f_loss, b_loss, new_states = wrapped(batch.fwd_chars, batch.bwd_chars, batch.fwd_targets,
                                                     batch.bwd_targets, states, tuple(negatives), tuple(tries),
                                                     batch.starts if tc.reset_state_per_sentence else None)
                loss = (f_loss + b_loss) / 2
            loss_value = float(loss.detach())
            direction_losses = (float(f_loss.detach()), float(b_loss.detach()))
            if not math.isfinite(loss_value):
                raise ElmoError(f"the training loss became {loss_value} at step {step + 1}; stopped without "
                                f"writing. The last good checkpoint is "
                                f"{last_ckpt_path or 'none (no checkpoint yet)'}; try a lower --lr")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = clip_grad_norm(params, tc.clip_norm)
            if not math.isfinite(grad_norm):
                raise ElmoError(f"the gradient norm became {grad_norm} at step {step + 1}; stopped without "
                                f"writing. The last good checkpoint is "
                                f"{last_ckpt_path or 'none (no checkpoint yet)'}; try a lower --lr")
            optimizer.step()
            states = _detach(new_states)
            step += 1
            n_tok = batch.n_tokens * ddp.world_size
            tokens_seen += n_tok
            interval_loss += loss_value
            interval_fb[0] += direction_losses[0]
            interval_fb[1] += direction_losses[1]
            interval_steps += 1
            interval_tokens += n_tok
            now = time.monotonic()
            elapsed = now - start

            stop_now = stop.signal is not None or bool(tc.max_time and elapsed >= tc.max_time)
            due_by_time = bool(tc.checkpoint_minutes and now - last_ckpt_time >= 60 * tc.checkpoint_minutes)
            if ddp.enabled:  # every process must take the same decisions: stop, and checkpoint by the clock
                flags = torch.tensor([float(stop_now), float(due_by_time)], device=device)
                dist.all_reduce(flags, op=dist.ReduceOp.MAX)
                stop_now, due_by_time = bool(flags[0].item()), bool(flags[1].item())

            event, vresult = "", None
            if step % tc.log_every == 0 or step == total_steps or stop_now:
                rate = interval_tokens / max(now - interval_start, 1e-9)
                recent_rate = rate
                mean_loss = interval_loss / interval_steps
                log({"kind": "train", "step": step, "epoch": round(step / per_epoch, 4), "tokens": tokens_seen,
                     "train_loss_sampled": round(mean_loss, 5),
                     "train_perplexity_sampled": round(math.exp(min(mean_loss, 50.0)), 3),
                     "forward_loss_sampled": round(interval_fb[0] / interval_steps, 5),
                     "backward_loss_sampled": round(interval_fb[1] / interval_steps, 5),
                     "grad_norm": round(grad_norm, 4), "tokens_per_s": round(rate, 1),
                     "elapsed": round(elapsed_before + elapsed, 2)})
                last_mean = mean_loss
                interval_loss, interval_steps, interval_tokens, interval_start = 0.0, 0, 0, now
                interval_fb = [0.0, 0.0]
            elif recent_rate == 0.0:
                recent_rate = interval_tokens / max(now - interval_start, 1e-9)
            if tc.validation_every and step % tc.validation_every == 0 and step < total_steps:
                vresult = validation = validate()
                event = "validation"
            due = bool(tc.checkpoint_every and step - last_ckpt_step >= tc.checkpoint_every) or due_by_time
            if (due or stop_now) and step < total_steps:
                last_ckpt_path = checkpoint(elapsed_before + elapsed)
                last_ckpt_step, last_ckpt_time = step, time.monotonic()
                event = event or "checkpoint"
            if on_step is not None and ddp.main:
                eta = (total_steps - step) * B * T * ddp.world_size / max(recent_rate, 1e-9)
                on_step(StepInfo(step, total_steps, step / per_epoch, loss_value, recent_rate, elapsed, eta,
                                 event, vresult))
            if stop_now:
                stopped = "signal" if stop.signal is not None else "max_time"
                break

    elapsed = time.monotonic() - start
    if step > last_ckpt_step or last_ckpt_path is None:
        last_ckpt_path = checkpoint(elapsed_before + elapsed)
    if stopped in ("finished", "max_time") and step > resumed_from and vdataset is not None:
        validation = validate()
    if ddp.enabled:
        dist.barrier()
    return TrainResult(run_dir=run_dir, step=step, total_steps=total_steps, stopped=stopped,
                       train_loss=last_mean, tokens_per_s=recent_rate, elapsed=elapsed, checkpoint=last_ckpt_path,
                       validation=validation, resumed_from=resumed_from, world_size=ddp.world_size, notes=notes)
