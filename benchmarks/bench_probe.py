"""What `--preset auto` measures before it chooses: training tokens/s of each shape of its ladder, in fp32 and (where
this CPU or GPU computes bf16 natively) in bf16, as its probe runs them (`train.measure_throughput`: a fresh model,
two warm-up steps, then training steps for SECONDS), on 2 threads, with 1,024 sampled negatives, at 32 rows (the
`laptop` recipe's, which auto trains at) and at 64 and 128 (what more rows buy in tokens/s on this CPU; what they
cost in quality at equal time is not measured here: an hour per cell).

    python -m benchmarks.bench_probe [--corpus austen] [--seconds 20] [--repeats 3] [--threads 2] [--rows 32 64 128]
    python -m benchmarks.bench_probe --trace 24 [--compiled] [--corpus sotu] [--label NAME]
    python -m benchmarks.bench_probe --validation [--corpus sotu] [--rows 32] [--label NAME]

``--validation`` also times, REPEATS times per shape, one validation of the corpus's held-out shards as `train`
makes it (`train.validation_perplexity`: full softmax, fp32, eager, 64 rows) on a fresh model, and its tokens/s
over the shape's fp32 training rate: what `auto`'s rule 9 counts a validation's seconds by
(`auto.VALIDATION_OVER_TRAINING`).

``--trace SECONDS`` measures instead how a probe's rate settles: each shape and dtype at 32 rows trains SECONDS
once, as the probe does, and the record keeps the tokens/s of each 2-second interval, the rate a probe of
`auto.PROBE_SECONDS`'s longest (6 s) would report, and the rate of the steps after it (what the run goes on at). ``--compiled`` traces the compiled step too where
rule 8 probes it (a bf16 step: `auto.COMPILE_DTYPES`), after the eager one; like `auto`'s probe it is timed after
6 s of untimed steps (`train.measure_throughput`'s warm-up of a compiled step; traces before 2026-12-04 timed it
from its third step).

Each (shape, dtype, rows) is measured REPEATS times, in alternating order, with min and median kept; the bf16/fp32
ratio per shape
is the one `auto` compares with its 1.15x bar, and the larger shape's rate over the smaller's says how many passes
it gives up. The corpus is one of `benchmarks.corpora` (split and shards made once under bench-out/). Results:
benchmarks/results/probe-DATE.json with the machine and load: on a CPU other work slows the probe, which is what
makes a short probe fragile.
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

from benchmarks.corpora import probe_arguments, probe_corpus
from benchmarks.results import Recording
from elmo_cli import auto, machine
from elmo_cli.model import BiLM
from elmo_cli.train import measure_throughput, open_shards, validation_perplexity


def main(argv: list[str] | None = None) -> None:
    parser = probe_arguments(__doc__.split("\n")[0], seconds=20.0, repeats=3)
    parser.add_argument("--rows", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--trace", type=float, default=0.0, help="seconds of one traced probe per shape and dtype")
    parser.add_argument("--validation", action="store_true", help="time a validation of the held-out shards too")
    parser.add_argument("--compiled", action="store_true",
                        help="with --trace: also trace the compiled step where rule 8 probes it (a bf16 step)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    info, data, base, negatives = probe_corpus(args)
    dtypes = ("fp32", "bf16") if machine.cpu_bf16() else ("fp32",)
    command = " ".join(["python -m benchmarks.bench_probe", *argv])
    if args.trace > 0:
        return trace_probes(data, base, negatives, dtypes, args, command)
    with Recording("probe", command, args.threads, args.label) as rec:
        cells = [(shape, dtype, rows) for shape in auto.LADDER for dtype in dtypes for rows in args.rows]
        rates: dict[tuple[str, str, int], list[float]] = {}
        validations: dict[str, list[tuple[float, float]]] = {}  # shape -> (seconds, tokens/s) of each validation
        heldout = open_shards(args.out / args.corpus / "heldout") if args.validation else None
        for repeat in range(args.repeats):
            for shape, dtype, rows in (cells if repeat % 2 == 0 else cells[::-1]):
                config = auto._config(base, shape, dtype, negatives, args.threads).with_training(device="cpu",
                                                                                                 batch_size=rows)
                rates.setdefault((shape.name, dtype, rows), []).append(measure_throughput(config, data, args.seconds))
            for shape in (auto.LADDER if heldout is not None else ()):
                validations.setdefault(shape.name, []).append(time_validation(shape, data, heldout, base))
        rec.figures = {"corpus": args.corpus, "train_tokens": info["train_tokens"], "seconds": args.seconds,
                       "negatives": negatives, "bf16_native": "bf16" in dtypes, "torch_threads": torch.get_num_threads()}
        median = {cell: statistics.median(r) for cell, r in rates.items()}
        for (name, dtype, rows), r in rates.items():
            key = f"{name} {dtype}" + ("" if rows == 32 else f" {rows} rows")
            rec.figures[key] = {"tokens_per_s_median": round(median[(name, dtype, rows)]),
                                "tokens_per_s_min": round(min(r)), "runs": [round(x) for x in r]}
        small = auto.LADDER[0].name
        for dtype in dtypes:
            for larger in (s.name for s in auto.LADDER[1:]) if 32 in args.rows else ():
                rec.figures[f"{larger} over {small}, {dtype}"] = round(median[(larger, dtype, 32)] /
                                                                      median[(small, dtype, 32)], 2)
            for s in auto.LADDER:
                for rows in args.rows:
                    if rows != 32 and 32 in args.rows:
                        rec.figures[f"{s.name} {dtype} {rows} over 32 rows"] = round(
                            median[(s.name, dtype, rows)] / median[(s.name, dtype, 32)], 2)
        for name, runs in validations.items():
            seconds = statistics.median(t for t, _ in runs)
            rate = statistics.median(r for _, r in runs)
            rec.figures[f"{name} validation"] = {"seconds_median": round(seconds, 1), "tokens_per_s_median": round(rate),
                                                 "heldout_tokens": heldout.total_tokens,
                                                 "runs": [round(r) for _, r in runs]}
            if 32 in args.rows:
                rec.figures[f"{name} validation over fp32 training"] = round(rate / median[(name, "fp32", 32)], 2)
        if "bf16" in dtypes and 32 in args.rows:
            for s in auto.LADDER:
                rec.figures[f"{s.name} bf16 over fp32"] = round(median[(s.name, "bf16", 32)] /
                                                                median[(s.name, "fp32", 32)], 2)
        for key, value in rec.figures.items():
            print(f"{key}: {value}")


def time_validation(shape, data, heldout, base) -> tuple[float, float]:
    """(seconds, held-out tokens/s) of one validation of a fresh `shape` model, as a run makes it."""
    model = BiLM(shape.model, vocab_size=len(data.vocab))
    batch = max(base.training.batch_size, 64)  # train.validate's rows
    start = time.monotonic()
    validation_perplexity(model, heldout, batch, torch.device("cpu"))
    seconds = time.monotonic() - start
    return seconds, heldout.total_tokens / seconds


def trace_probes(data, base, negatives: int, dtypes, args, command: str) -> None:
    """``--trace``: one probe of ``args.trace`` seconds per shape and dtype, its rate by 2-second interval."""
    with Recording("probe", command, args.threads, args.label) as rec:
        rec.figures = {"corpus": args.corpus, "trace_seconds": args.trace, "negatives": negatives, "rows": 32,
                       "torch_threads": args.threads}
        probe_s = auto.PROBE_SECONDS[1]
        steps = [(shape, dtype, compiled) for shape in auto.LADDER for dtype in dtypes
                 for compiled in ((False, True) if args.compiled and dtype in auto.COMPILE_DTYPES else (False,))]
        for shape, dtype, compiled in steps:
            config = auto._config(base, shape, dtype, negatives, args.threads).with_training(device="cpu",
                                                                                            compile=compiled)
            trace: list[tuple[float, int]] = []
            measure_throughput(config, data, args.trace, trace=trace, warm=probe_s)  # a compiled step: as auto's

            def rate(t0: float, t1: float) -> float | None:
                inside = [(t, n) for t, n in [(0.0, 0), *trace] if t0 <= t <= t1]
                if len(inside) < 2:
                    return None
                return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])
            bins = [rate(t, t + 2.0) for t in range(0, int(args.trace), 2)]
            key = f"{shape.name} {dtype}" + (" compiled" if compiled else "")
            rec.figures[key] = {
                "tokens_per_s_by_2s": [None if r is None else round(r) for r in bins],
                "probe_6s": round(rate(0.0, probe_s) or 0), "after_6s": round(rate(probe_s, args.trace) or 0),
                "steps": len(trace)}
            print(f"{key}: {rec.figures[key]}", flush=True)


if __name__ == "__main__":
    main()
