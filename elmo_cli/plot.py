"""Training curves from ``RUN/metrics.jsonl``: `read_metrics` and `plot_runs` (matplotlib, Agg backend).

One figure, four panels, every run given drawn in each (one colour per run):
    sampled training loss (smoothed) against steps     held-out perplexity (full softmax) against steps
    held-out perplexity against training minutes       training tokens per second against steps
The Kneser-Ney reference of a run (its ``baseline`` record) is a dashed line of the run's colour in both
perplexity panels. `train` redraws ``RUN/curves.png`` at each validation; ``elmo-cli plot`` draws any runs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vocab.errors import ElmoError
from vocab.text import atomic_writer

METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"


@dataclass
class RunMetrics:
    name: str
    train: list[dict] = field(default_factory=list)
    validation: list[dict] = field(default_factory=list)
    baseline: dict | None = None


def run_minutes(run_dir: str | Path | None) -> float | None:
    """Training minutes of a run directory (every invocation, from its metrics.jsonl), or None when `run_dir` is not
    a run directory (an export, bilm-tf files): how long the model behind a score trained."""
    if run_dir is None or not (Path(run_dir) / METRICS_FILE).is_file():
        return None
    try:
        run = read_metrics(run_dir)
    except ElmoError:
        return None
    return max(r.get("elapsed", 0.0) for r in run.train + run.validation) / 60


def read_metrics(run_dir: str | Path) -> RunMetrics:
    """The records of ``RUN/metrics.jsonl`` by kind (a line cut by a kill is skipped)."""
    run_dir = Path(run_dir)
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise ElmoError(f"{run_dir}: no {METRICS_FILE}; give a run directory written by `elmo-cli train`")
    run = RunMetrics(run_dir.resolve().name)
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = rec.get("kind")
        if kind == "train":
            run.train.append(rec)
        elif kind == "validation":
            run.validation.append(rec)
        elif kind == "baseline":
            run.baseline = rec
    if not run.train:
        raise ElmoError(f"{path}: no training records yet")
    return run


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` records (shorter at the start)."""
    if window <= 1 or len(values) < 2:
        return values
    c = np.cumsum(np.insert(values, 0, 0.0))
    k = np.minimum(np.arange(1, len(values) + 1), window)
    return (c[1:] - c[np.arange(1, len(values) + 1) - k]) / k


def label_perplexity_axis(ax) -> None:
    """Plain-number labels (60, 70, 80, not 6x10^1) on a log-scale perplexity axis. Within a decade a log axis ticks
    only at 1-9 x 10^k, so a run that falls from 142 to 77 would show 80, 90 and 100 and nothing above: there the
    ticks are evenly spaced plain numbers (80, 90, ... 140)."""
    from matplotlib.ticker import LogFormatter, MaxNLocator, NullLocator, ScalarFormatter

    low, high = ax.get_ylim()
    if 0 < low and high / low < 10:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=8))
        ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def plot_runs(runs: list[RunMetrics], output: str | Path) -> Path:
    """Draw `runs` into one PNG at ``output`` (written under a temporary name, then renamed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8), constrained_layout=True)
    (loss_ax, ppl_ax), (time_ax, rate_ax) = axes
    for k, run in enumerate(runs):
        color = f"C{k % 10}"
        steps = np.array([r["step"] for r in run.train])
        loss = np.array([r["train_loss_sampled"] for r in run.train])
        loss_ax.plot(steps, _smooth(loss, max(1, len(loss) // 50)), color=color, label=run.name)
        rate_ax.plot(steps, [r["tokens_per_s"] for r in run.train], color=color, label=run.name)
        if run.validation:
            v_steps = [r["step"] for r in run.validation]
            v_ppl = [r["average_perplexity"] for r in run.validation]
            ppl_ax.plot(v_steps, v_ppl, "o-", color=color, label=f"{run.name} biLM")
            minutes = [r.get("elapsed", np.nan) / 60 for r in run.validation]
            time_ax.plot(minutes, v_ppl, "o-", color=color, label=f"{run.name} biLM")
        if run.baseline is not None:
            label = f"{run.name} {run.baseline['name'].upper()} {run.baseline['average_perplexity']:.1f}"
            for ax in (ppl_ax, time_ax):
                ax.axhline(run.baseline["average_perplexity"], color=color, linestyle="--", label=label)
    loss_ax.set(title="training loss (sampled softmax, smoothed)", xlabel="step", ylabel="loss (nats)")
    ppl_ax.set(title="held-out perplexity (full softmax, average of both directions)", xlabel="step",
               ylabel="perplexity", yscale="log")
    time_ax.set(title="held-out perplexity against training time", xlabel="minutes", ylabel="perplexity",
                yscale="log")
    rate_ax.set(title="training speed", xlabel="step", ylabel="tokens / s")
    rate_ax.set_ylim(bottom=0)
    time_ax.set_xlim(left=0)  # from the start of training: the first validation comes minutes in
    for ax in (ppl_ax, time_ax):
        label_perplexity_axis(ax)
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    output = Path(output)
    with atomic_writer(output) as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
    return output
