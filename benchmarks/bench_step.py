"""What a CPU training step of `auto`'s LSTM 512/128 (or `--shape 1024/256`) spends outside its matrix products,
and what five changes to it buy, each measured beside what it replaced in one run.

    python -m benchmarks.bench_step [--corpus sotu] [--shape 512/128] [--seconds 10] [--repeats 3] [--threads 2]

A profile of the step (`torch.profiler`, 20 steps, 32 rows, 1,024 sampled negatives, compiled LSTM loops, the
`sotu` vocabulary of 15,182 words) found four costs that are not the model's arithmetic:

- ``dropout``: torch's CPU ``bernoulli_`` drawing each dropout mask, six a step (`model.lstm.Dropout` now draws
  uniform floats and compares);
- ``distinct``: ``torch.unique(dim=0)`` over the step's character ids, which compares rows one pair at a time
  (`model.encoder.distinct_rows` keys each row);
- ``softmax lookups``: four lookups of softmax rows a step, each of whose backward writes a gradient the size of the
  whole softmax (`SharedSoftmax.sampled_losses` gathers once);
- ``adam``: torch's default multi-tensor Adam on a CPU (`train.make_optimizer` takes the fused kernel).

A profile of the eager step after them found a fifth: autograd over the LSTM layers' loops, a dozen recorded
operations a step replayed one by one, with a weight-gradient product 32 rows deep at every step
(`model.lstm.ClippedLSTMFunction` writes the loop's gradient by hand).

Each part is timed alone (milliseconds per call, median of REPEATS x 50 calls, the old way and the new alternating),
on the step's own shapes, and then the whole step as the probe measures it (`train.measure_throughput`: tokens/s),
REPEATS times each, alternating, in three ways: ``before`` (the four old ways and autograd's loop), ``autograd``
(the four new ways, autograd's loop) and ``now``; compiled, the loops are autograd's either way, so ``before``
against ``now``. All run with the same model and data; their losses differ only by rounding and by the dropout
masks' random numbers. Results: benchmarks/results/step-DATE.json (``--label``: step-LABEL-DATE.json).
"""
from __future__ import annotations

import statistics
import sys
import time
from contextlib import contextmanager

import torch
from torch import nn

from benchmarks.corpora import probe_arguments, probe_corpus
from benchmarks.results import Recording
from elmo_cli import auto, train as train_module
from elmo_cli.model import encoder as encoder_module
from elmo_cli.model.lstm import Dropout, ProjectedLSTMLayer
from elmo_cli.model.softmax import SharedSoftmax, log_uniform_sample
from elmo_cli.train import measure_throughput

NEW_MAKE_OPTIMIZER = train_module.make_optimizer
NEW_DISTINCT = encoder_module.distinct_rows
NEW_DROPOUT = Dropout.forward
NEW_LOSSES = SharedSoftmax.sampled_losses
NEW_BY_HAND = ProjectedLSTMLayer.by_hand
WAYS = {"before": (True, False), "autograd": (False, False), "now": (False, True)}  # (the four old ways, by hand)


def old_make_optimizer(params, tc):
    if tc.optimizer == "adam":
        return torch.optim.Adam(params, lr=tc.lr, weight_decay=tc.weight_decay)
    if tc.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=tc.lr, weight_decay=tc.weight_decay)
    return NEW_MAKE_OPTIMIZER(params, tc)


def old_distinct(rows: torch.Tensor):
    return torch.unique(rows, dim=0, return_inverse=True)


def old_losses(self: SharedSoftmax, parts):
    """A lookup of rows for each targets and each negatives, as before."""
    out = []
    for h, targets, sampled, num_tries in parts:
        w_true, b_true = self._rows(targets)
        w_neg, b_neg = self._rows(sampled)
        out.append(self._loss(h, targets, w_true, b_true, sampled, w_neg, b_neg, num_tries))
    return out


@contextmanager
def old_ways(on: bool):
    """The four old ways in place of the new (when `on`)."""
    if on:
        train_module.make_optimizer = old_make_optimizer
        encoder_module.distinct_rows = old_distinct
        Dropout.forward = nn.Dropout.forward
        SharedSoftmax.sampled_losses = old_losses
    try:
        yield
    finally:
        train_module.make_optimizer = NEW_MAKE_OPTIMIZER
        encoder_module.distinct_rows = NEW_DISTINCT
        Dropout.forward = NEW_DROPOUT
        SharedSoftmax.sampled_losses = NEW_LOSSES


@contextmanager
def way(name: str):
    """The step as it was `before`, with the four new ways but `autograd` over the LSTM loops, or as it is `now`."""
    old_four, by_hand = WAYS[name]
    if not by_hand:
        ProjectedLSTMLayer.by_hand = lambda self, x, mask: False
    try:
        with old_ways(old_four):
            yield
    finally:
        ProjectedLSTMLayer.by_hand = NEW_BY_HAND


def per_call_ms(fn, calls: int = 50) -> float:
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def parts(config, data, repeats: int) -> dict:
    """Each part, the old way and the new, on one batch's shapes of `config` over `data`'s vocabulary."""
    tc = config.training
    B, T, P = tc.batch_size, tc.unroll_steps, config.model.lstm.projection_dim
    V = len(data.vocab)
    trainer = train_module._Trainer.bare(config, data)  # the model and the data streams a run starts with
    batch = trainer.state.streams.next_batch(T)
    chars = torch.cat([batch.fwd_chars, batch.bwd_chars]).reshape(-1, batch.fwd_chars.shape[-1])  # (2 B T, W)
    x = torch.randn(B, T, P)
    g = torch.Generator().manual_seed(0)
    softmax = SharedSoftmax(V, P)
    targets = [torch.randint(0, V, (B * T,)) for _ in range(2)]
    negatives = [log_uniform_sample(tc.n_negative_samples, V, g) for _ in range(2)]
    hs = [torch.randn(B * T, P, requires_grad=True) for _ in range(2)]
    losses_args = [(hs[k], targets[k], negatives[k][0], negatives[k][1]) for k in range(2)]

    def lookups(fn):
        def run():
            softmax.zero_grad(set_to_none=True)
            sum(fn(softmax, losses_args)).backward()
        return run

    params = trainer.state.params
    for p in params:
        p.grad = torch.randn_like(p)
    adams = {"old": old_make_optimizer(params, tc), "new": NEW_MAKE_OPTIMIZER(params, tc)}
    old_drop, new_drop = nn.Dropout(tc.dropout), Dropout(tc.dropout)
    layer = trainer.state.model.forward_lstm.layers[0]
    xs = torch.randn(B, T, P, requires_grad=True)
    starts = batch.starts  # (B, T): where sentences start, as the step resets its states

    def lstm_layer(by_hand: bool):
        def run():
            with way("now" if by_hand else "autograd"):
                out, (h, c) = layer(xs, layer.zero_state(B), None, starts)
                out.sum().backward()
        return run
    cases = {
        "dropout (B, T, P) mask": (lambda: old_drop(x), lambda: new_drop(x)),
        "distinct rows of the step's characters": (lambda: old_distinct(chars), lambda: NEW_DISTINCT(chars)),
        "softmax lookups, forward and backward of both directions": (lookups(old_losses), lookups(NEW_LOSSES)),
        "adam step over the model": (adams["old"].step, adams["new"].step),
        "one LSTM layer's 20 steps, forward and backward (autograd; by hand)": (lstm_layer(False), lstm_layer(True)),
    }
    out = {}
    for name, (old, new) in cases.items():
        runs = {"old": [], "new": []}
        for r in range(repeats):
            for arm in (("old", "new") if r % 2 == 0 else ("new", "old")):
                runs[arm].append(per_call_ms(old if arm == "old" else new))
        med = {arm: statistics.median(v) for arm, v in runs.items()}
        out[name] = {"old_ms": round(med["old"], 3), "new_ms": round(med["new"], 3),
                     "saved_ms": round(med["old"] - med["new"], 3)}
        print(f"{name}: {out[name]}", flush=True)
    out["distinct_rows"] = {"rows": chars.shape[0], "distinct": int(NEW_DISTINCT(chars)[0].shape[0])}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = probe_arguments(__doc__.split("\n")[0], seconds=10.0, repeats=3)
    parser.add_argument("--shape", default="512/128", choices=[s.name.split()[-1] for s in auto.LADDER],
                        help="the LSTM shape of `auto`'s ladder whose step is timed")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    _, data, base, negatives = probe_corpus(args)
    shape = next(s for s in auto.LADDER if s.name.endswith(args.shape))
    config = auto._config(base, shape, "fp32", negatives, args.threads).with_training(device="cpu")
    command = " ".join(["python -m benchmarks.bench_step", *argv])
    with Recording("step", command, args.threads, args.label) as rec:
        torch.set_num_threads(args.threads)
        rec.figures = {"corpus": args.corpus, "shape": shape.name, "rows": config.training.batch_size,
                       "negatives": negatives, "vocabulary": len(data.vocab), "dropout": config.training.dropout,
                       "seconds": args.seconds, "repeats": args.repeats, "torch_threads": args.threads}
        rec.figures["parts"] = parts(config, data, args.repeats)
        rec.save()
        for compiled in (False, True):
            run_config = config.with_training(compile=compiled)
            measure_throughput(run_config, data, 1.0)  # warm-up (and, compiled, the compilation)
            names = ["before", "now"] if compiled else list(WAYS)
            rates: dict[str, list[float]] = {name: [] for name in names}
            for r in range(args.repeats):
                for name in names[r % len(names):] + names[: r % len(names)]:
                    with way(name):
                        rates[name].append(measure_throughput(run_config, data, args.seconds))
            med = {name: statistics.median(v) for name, v in rates.items()}
            key = "step_compiled" if compiled else "step_eager"
            rec.figures[key] = {f"{name}_tokens_per_s_median": round(med[name]) for name in names}
            rec.figures[key].update({f"{name}_runs": [round(v) for v in rates[name]] for name in names})
            rec.figures[key]["now_over_before"] = round(med["now"] / med["before"], 3)
            if not compiled:
                rec.figures[key]["now_over_autograd"] = round(med["now"] / med["autograd"], 3)
            print(f"{key}: {rec.figures[key]}", flush=True)
            rec.save()


if __name__ == "__main__":
    main()
